"""Tests of the KV-block benchmark's machinery that need no GPU and no peer library: row
selection, the block lists, the byte checks (they must catch a wrong block and a write outside
the list), UCX's protocol table as the NIXL rows read it, and the wheel trimmer on shared
libraries compiled here.

    python3 -m pytest -q scripts/device/test_kvbench.py      # needs numpy and pytest; cc for the trimmer
"""

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kvbench_core as core  # noqa: E402
import trim_wheel  # noqa: E402
from kvbench_libs import ucx_put_configs  # noqa: E402

KEYS = ["blocks16k.torch-ref", "blocks16k.gdx-write", "blocks16k.gdx-blocks", "lat4k.gdx", "lat4k.nixl-repost"]


def test_select_by_case_library_glob_and_prefix():
    assert core.select(KEYS, None) == KEYS
    assert core.select(KEYS, "gdx") == ["blocks16k.gdx-write", "blocks16k.gdx-blocks", "lat4k.gdx"]
    assert core.select(KEYS, "lat4k") == ["lat4k.gdx", "lat4k.nixl-repost"]
    assert core.select(KEYS, "*.gdx-b*,torch-ref") == ["blocks16k.torch-ref", "blocks16k.gdx-blocks"]
    with pytest.raises(ValueError, match="selects no row"):
        core.select(KEYS, "mooncake")


def test_block_lists_are_fixed_distinct_and_in_range():
    si, di = core.block_lists(51)
    si2, di2 = core.block_lists(51)
    assert (si == si2).all() and (di == di2).all()
    assert len(set(si.tolist())) == len(si) == core.BATCH_BLOCKS
    assert len(set(di.tolist())) == len(di) == core.BATCH_BLOCKS
    assert 0 <= min(si.min(), di.min()) and max(si.max(), di.max()) < core.POOL_BLOCKS
    assert (core.block_lists(52)[0] != si).any()


def written_pool(block: int, seed: int):
    """A destination pool as a correct transfer leaves it."""
    si, di = core.block_lists(seed)
    dst = core.HostMem(core.POOL_BLOCKS * block)
    src = core.HostMem.pattern(core.POOL_BLOCKS * block, seed).reshape(core.POOL_BLOCKS, block)
    dst.obj.reshape(core.POOL_BLOCKS, block)[di] = src[si]
    return dst, si, di


def test_block_check_passes_a_correct_pool_and_names_a_wrong_block():
    dst, si, di = written_pool(64, 7)
    assert dst.check_blocks(7, 64, si, di) is None
    dst.obj[int(di[10]) * 64 + 3] ^= 0xFF
    err = dst.check_blocks(7, 64, si, di)
    assert err and f"dst[{int(di[10])}]" in err


def test_block_check_catches_a_write_outside_the_list():
    dst, si, di = written_pool(64, 7)
    outside = next(b for b in range(core.POOL_BLOCKS) if b not in set(di.tolist()))
    dst.obj[outside * 64] = 1
    err = dst.check_blocks(7, 64, si, di)
    assert err and f"first block {outside}" in err


def test_prefix_check_catches_a_changed_byte_and_a_write_past_the_end():
    m = core.HostMem(4096)
    m.obj[:1000] = core.HostMem.pattern(4096, 3)[:1000]
    assert m.check_prefix(3, 1000) is None
    m.obj[1500] = 9
    assert "past the 1000" in m.check_prefix(3, 1000)
    m.obj[1500] = 0
    m.obj[10] ^= 1
    assert "first at 10" in m.check_prefix(3, 1000)


# UCX_PROTO_INFO=y output of two NIXL agents (UCX 1.20, this machine): the initiator's table
# towards the target, its table with itself, and an active-message table that is not a put.
UCX_LOG = """\
[1796642715.692180] [vm:11110:0]   +--------+-------------+-----------------------------------+
[1796642715.692180] [vm:11110:0]   | kv-target self cfg#0                                     |
[1796642715.692180] [vm:11110:0]   | remote memory write by ucp_put* from host memory to host |
[1796642715.692180] [vm:11110:0]   +--------+-------------+-----------------------------------+
[1796642715.692180] [vm:11110:0]   | Range  | Description |              Config               |
[1796642715.692180] [vm:11110:0]   +--------+-------------+-----------------------------------+
[1796642715.692180] [vm:11110:0]   | 0..inf | zero-copy   | posix/memory                      |
[1796642715.692180] [vm:11110:0]   +--------+-------------+-----------------------------------+
[1796642716.702996] [vm:11070:0]   +------------+--------------------+---------------+
[1796642716.702996] [vm:11070:0]   | kv-initiator intra-node cfg#1                   |
[1796642716.702996] [vm:11070:0]   | active message by ucp_am_send* from host memory |
[1796642716.702996] [vm:11070:0]   +------------+--------------------+---------------+
[1796642716.702996] [vm:11070:0]   |   Range    |    Description     |    Config     |
[1796642716.702996] [vm:11070:0]   +------------+--------------------+---------------+
[1796642716.702996] [vm:11070:0]   |          0 | short              | tcp/lo        |
[1796642716.702996] [vm:11070:0]   +------------+--------------------+---------------+
[1796642716.747292] [vm:11070:0]   +--------+-------------+-----------------------------------+
[1796642716.747292] [vm:11070:0]   | kv-initiator intra-node cfg#1                            |
[1796642716.747292] [vm:11070:0]   | remote memory write by ucp_put* from host memory to host |
[1796642716.747292] [vm:11070:0]   +--------+-------------+-----------------------------------+
[1796642716.747292] [vm:11070:0]   | Range  | Description |              Config               |
[1796642716.747292] [vm:11070:0]   +--------+-------------+-----------------------------------+
[1796642716.747292] [vm:11070:0]   | 0..inf | zero-copy   | cma/memory                        |
[1796642716.747292] [vm:11070:0]   +--------+-------------+-----------------------------------+
"""


def test_ucx_put_configs_reads_the_put_between_the_agents_only():
    assert ucx_put_configs(UCX_LOG) == ["cma/memory (0..inf zero-copy)"]
    assert ucx_put_configs("no tables here\n") == []


@pytest.mark.skipif(shutil.which("cc") is None or shutil.which("readelf") is None,
                    reason="requires cc and readelf to build the test libraries")
def test_trim_keeps_what_the_entry_point_loads_and_rewrites_record(tmp_path):
    def lib(name, needs=()):
        c = tmp_path / f"{name}.c"
        c.write_text(f"int {name.replace('.', '_')}(void) {{ return 0; }}\n")
        out = tmp_path / name
        # --no-as-needed: the linker would otherwise drop a library nothing here calls.
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(out), str(c), f"-Wl,-soname,{name}", "-Wl,--no-as-needed",
                        *[str(tmp_path / n) for n in needs]], check=True)
        return out.read_bytes()

    files = {
        "pkg/__init__.py": b"",
        "pkg.libs/libdep.so.1": lib("libdep.so.1"),
        "pkg/engine.so": lib("engine.so", ["libdep.so.1"]),
        "pkg/unused.so": lib("unused.so"),
        "pkg/big.bin": b"x" * 1000,
        "pkg-1.0.dist-info/METADATA": b"Name: pkg\n",
        "pkg-1.0.dist-info/RECORD": b"",
    }
    src, dst = tmp_path / "pkg-1.0-py3-none-any.whl", tmp_path / "out" / "pkg-1.0-py3-none-any.whl"
    dst.parent.mkdir()
    with zipfile.ZipFile(src, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    r = trim_wheel.trim(str(src), str(dst), ["pkg/__init__.py", "pkg/engine.so"], [])
    with zipfile.ZipFile(dst) as z:
        names = set(z.namelist())
        record = z.read("pkg-1.0.dist-info/RECORD").decode()
    assert names == {"pkg/__init__.py", "pkg/engine.so", "pkg.libs/libdep.so.1", "pkg-1.0.dist-info/METADATA",
                     "pkg-1.0.dist-info/RECORD"}
    assert "pkg/unused.so" not in record and "pkg.libs/libdep.so.1,sha256=" in record
    assert "libdep.so.1" not in r["from_system"] and "libc.so.6" in r["from_system"]
    with pytest.raises(SystemExit, match="no file matches"):
        trim_wheel.trim(str(src), str(tmp_path / "x.whl"), ["pkg/renamed.so"], [])
