"""gdx.load_safetensors / gdx.save_safetensors against the real ``safetensors`` package: its files
load into equal numpy arrays, gdx's files load in it, hostile headers are refused with the reason
before any byte moves, sharded checkpoints load through their index. GPU cases need torch and a
GPU (skipped and counted elsewhere). No test asserts a speed.
"""

import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
import safetensors.numpy as stnp
from safetensors import safe_open

import gdx

from conftest import cuda_reason


def sample():
    rng = np.random.default_rng(45)
    return {
        "embed.weight": rng.standard_normal((257, 33)).astype(np.float32),
        "h.0.attn": rng.standard_normal((3, 5, 7)).astype(np.float16),
        "h.0.bias": rng.standard_normal(1000).astype(np.float64),
        "ids": rng.integers(-(2**40), 2**40, size=99, dtype=np.int64),
        "bytes": rng.integers(0, 255, size=4097, dtype=np.uint8),
        "i8": rng.integers(-128, 127, size=13, dtype=np.int8),
        "u16": rng.integers(0, 65535, size=5, dtype=np.uint16),
        "mask": rng.integers(0, 2, size=17).astype(bool),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }


def assert_same(got, want):
    assert sorted(got) == sorted(want)
    for k, w in want.items():
        g = got[k]
        assert g.dtype == w.dtype, k
        assert g.shape == w.shape, k
        assert np.array_equal(g, w), k


@pytest.mark.parametrize("via", ["auto", "buffered", "file-staged"])
def test_files_written_by_safetensors_load_into_equal_numpy(tmp_path, via):
    p = tmp_path / "model.safetensors"
    stnp.save_file(sample(), str(p), metadata={"format": "np"})
    # Small chunks: every tensor boundary falls inside a chunk somewhere.
    got, reports = gdx.load_safetensors(p, via=via, chunk_bytes=8192, depth=3, return_report=True)
    assert_same(got, stnp.load_file(str(p)))
    (r,) = reports
    assert r["bytes"] == sum(a.nbytes for a in sample().values())
    assert r["page_cache_bytes"] + r["direct_bytes"] >= r["bytes"]
    if via == "buffered":
        assert r["path"] == "buffered" and "asked for" in r["reason"]
    if via == "auto":
        assert "(mincore)" in r["reason"], r["reason"]


def test_files_written_by_gdx_load_in_safetensors(tmp_path):
    p = tmp_path / "gdx.safetensors"
    want = sample()
    r = gdx.save_safetensors(want, p, metadata={"step": 1200})
    assert r["bytes"] == p.stat().st_size
    assert_same(stnp.load_file(str(p)), want)
    with safe_open(str(p), framework="np") as f:
        assert f.metadata() == {"step": "1200"}
    # And back through gdx, big-endian input stored little-endian as the format says.
    be = {"be": np.arange(10, dtype=">i4")}
    gdx.save_safetensors(be, tmp_path / "be.safetensors")
    got = stnp.load_file(str(tmp_path / "be.safetensors"))["be"]
    assert np.array_equal(got, np.arange(10, dtype=np.int32))


def raw_file(path, header, data_len, prefix=None):
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    n = struct.pack("<Q", len(h)) if prefix is None else prefix
    path.write_bytes(n + h + bytes(data_len))
    return path


T = lambda dtype, shape, b, e: {"dtype": dtype, "shape": shape, "data_offsets": [b, e]}  # noqa: E731

HOSTILE = [
    ("overlap", {"a": T("F32", [2], 0, 8), "b": T("F32", [2], 4, 12)}, 12, None, "overlap"),
    ("past-end", {"a": T("F32", [4], 0, 16)}, 8, None, "run past the end of the data"),
    ("huge-count", {"a": T("F32", [2**32, 2**32], 0, 16)}, 16, None, "too large for an array"),
    # No byte, but numpy cannot make the shape: BadCheckpoint, not numpy's ValueError.
    ("zero-by-huge", {"a": T("F32", [0, 2**64 - 1], 0, 0)}, 0, None, "too large for an array"),
    ("100-dims", {"a": T("F32", [1] * 100, 0, 4)}, 4, None, "100 dimensions, more than the 32"),
    ("huge-header", {}, 0, struct.pack("<Q", 2**62), "exceeds the 100000000-byte limit"),
    ("header-past-end", {}, 0, struct.pack("<Q", 4096), "runs past the end of the"),
    ("bad-json", b'{"a": {"dtype": "F32",', 0, None, "not valid JSON"),
    ("wrong-dtype-size", {"a": T("F64", [3], 0, 12)}, 12, None, "needs 24 bytes but data_offsets [0, 12] give 12"),
    ("unknown-dtype", {"a": T("F33", [3], 0, 12)}, 12, None, 'unknown dtype "F33"'),
    ("reversed", {"a": T("U8", [0], 9, 3)}, 12, None, "end before they begin"),
]


@pytest.mark.parametrize("name,header,data_len,prefix,why", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_headers_are_refused_with_the_reason(tmp_path, name, header, data_len, prefix, why):
    p = raw_file(tmp_path / f"{name}.safetensors", header, data_len, prefix)
    with pytest.raises(gdx.BadCheckpoint, match="is not a valid safetensors checkpoint") as e:
        gdx.load_safetensors(p)
    assert why in str(e.value), str(e.value)


def test_a_sharded_checkpoint_loads_through_its_index_in_parallel(tmp_path):
    full = sample()
    names = sorted(full)
    shards = [names[:4], names[4:7], names[7:]]
    weight_map = {}
    for i, part in enumerate(shards):
        f = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        stnp.save_file({k: full[k] for k in part}, str(tmp_path / f))
        weight_map.update({k: f for k in part})
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    seen = []
    got = gdx.load_safetensors(index, parallel=2, progress=lambda d, t: seen.append((d, t)))
    assert_same(got, full)
    total = sum(a.nbytes for a in full.values())
    assert len(seen) == 3 and seen[-1] == (total, total)
    assert_same(gdx.load_safetensors(tmp_path), full)
    # An index that names a shard that lacks the tensor is refused before loading.
    weight_map["ids"] = "model-00001-of-00003.safetensors" if "ids" not in shards[0] else "model-00002-of-00003.safetensors"
    index.write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(gdx.BadCheckpoint, match='weight_map puts "ids"'):
        gdx.load_safetensors(index)


def test_out_and_pool_are_filled_in_place(tmp_path):
    p = tmp_path / "m.safetensors"
    want = sample()
    stnp.save_file(want, str(p))
    out = {"embed.weight": np.zeros((257, 33), np.float32)}
    got = gdx.load_safetensors(p, out=out)
    assert got["embed.weight"] is out["embed.weight"]
    assert np.array_equal(out["embed.weight"], want["embed.weight"])
    pool = np.zeros(1 << 20, np.uint8)
    got = gdx.load_safetensors(p, pool=pool)
    assert_same(got, want)
    assert np.shares_memory(got["h.0.bias"], pool)
    with pytest.raises(gdx.Error, match="out\\['ids'\\] is"):
        gdx.load_safetensors(p, out={"ids": np.zeros(3, np.int64)})
    with pytest.raises(gdx.Error, match="at least"):
        gdx.load_safetensors(p, pool=np.zeros(10, np.uint8))


def test_bfloat16_on_the_cpu_needs_torch(tmp_path):
    p = raw_file(tmp_path / "bf.safetensors", {"w": T("BF16", [2], 0, 4)}, 4)
    with pytest.raises(gdx.Error, match="numpy has no dtype for"):
        gdx.load_safetensors(p)


@pytest.mark.gpu
@pytest.mark.skipif(cuda_reason() is not None, reason=str(cuda_reason()))
def test_gpu_loads_equal_safetensors_torch(tmp_path):
    import torch
    import safetensors.torch as stt

    p = tmp_path / "m.safetensors"
    want = {
        "w": torch.randn(1024, 1024, dtype=torch.bfloat16),
        "b": torch.randn(333, dtype=torch.float32),
        "i": torch.arange(77, dtype=torch.int64),
    }
    stt.save_file(want, str(p))
    ref = stt.load_file(str(p), device="cuda:0")
    for via in ["auto", "buffered", "file-staged"]:
        got, reports = gdx.load_safetensors(p, device="cuda:0", via=via, return_report=True)
        assert sorted(got) == sorted(ref)
        for k in ref:
            assert got[k].device.type == "cuda" and got[k].dtype == ref[k].dtype
            assert torch.equal(got[k], ref[k]), (via, k)
    # gdx writes what safetensors.torch reads, bf16 included.
    gdx.save_safetensors(ref, tmp_path / "g.safetensors")
    back = stt.load_file(str(tmp_path / "g.safetensors"))
    for k in want:
        assert torch.equal(back[k], want[k]), k


def _load_in_child(path, timeout=30):
    """Loads `path` in a child process, bounded in time: a hang is a failed test, not a hung run."""
    code = (
        "import sys, gdx\n"
        "try:\n"
        "    gdx.load_safetensors(sys.argv[1])\n"
        "except gdx.Error as e:\n"
        "    print(type(e).__name__ + ': ' + str(e)); sys.exit(3)\n"
    )
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout + r.stderr


def test_files_that_are_not_files_are_refused_without_hanging(tmp_path):
    # A FIFO as the checkpoint, as a shard, and as the index; an index that is a symlink to
    # /dev/zero (it used to read until memory ran out).
    os.mkfifo(tmp_path / "fifo.safetensors")
    rc, out = _load_in_child(tmp_path / "fifo.safetensors")
    assert rc == 3 and "a FIFO" in out, out
    shards = tmp_path / "sharded"
    shards.mkdir()
    os.mkfifo(shards / "s1.safetensors")
    (shards / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "s1.safetensors"}}))
    rc, out = _load_in_child(shards)
    assert rc == 3 and "a FIFO" in out, out
    os.mkfifo(tmp_path / "fifo.index.json")
    rc, out = _load_in_child(tmp_path / "fifo.index.json")
    assert rc == 3 and "a FIFO" in out, out
    os.symlink("/dev/zero", tmp_path / "zero.index.json")
    rc, out = _load_in_child(tmp_path / "zero.index.json")
    assert rc == 3 and "a character device" in out, out


def test_names_select_tensors_by_glob_on_every_shard(tmp_path):
    full = sample()
    names = sorted(full)
    weight_map = {}
    for i, part in enumerate((names[:5], names[5:])):
        f = f"model-{i + 1:05d}-of-00002.safetensors"
        stnp.save_file({k: full[k] for k in part}, str(tmp_path / f))
        weight_map.update({k: f for k in part})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    got, reports = gdx.load_safetensors(tmp_path, names=["h.0.*", "i?", "scal[a]r"], return_report=True)
    assert sorted(got) == ["h.0.attn", "h.0.bias", "i8", "scalar"]  # "i?" is two letters: not "ids"
    for k, v in got.items():
        assert v.dtype == full[k].dtype and np.array_equal(v, full[k]), k
    # Only the selected tensors' bytes were read.
    assert sum(r["bytes"] for r in reports) == sum(full[k].nbytes for k in got)
    with pytest.raises(gdx.Error, match=r"the pattern 'layers\.\*' matches none of the checkpoint's 10 tensors"):
        gdx.load_safetensors(tmp_path, names="layers.*")
    with pytest.raises(gdx.Error, match="names must be a glob pattern or a list of them"):
        gdx.load_safetensors(tmp_path, names=[3])


def test_a_numpy_state_dict_loads_in_place_and_a_mismatch_is_refused_by_name(tmp_path):
    p = tmp_path / "m.safetensors"
    want = sample()
    stnp.save_file(want, str(p))
    out = {k: np.zeros_like(v) for k, v in want.items() if k != "bytes"}
    ptrs = {k: v.ctypes.data for k, v in out.items()}
    got, reports = gdx.load_safetensors(p, out=out, return_report=True)
    assert_same(got, want)
    for k in out:
        assert got[k] is out[k] and out[k].ctypes.data == ptrs[k], k
    # Each tensor read once, straight into its destination (no pool copy in between).
    assert sum(r["bytes"] for r in reports) == sum(v.nbytes for v in want.values())
    # Every mismatch is named, and nothing was written before the refusal.
    bad = {"ids": np.zeros(99, np.int32), "h.0.attn": np.zeros((5, 3, 7), np.float16),
           "embed.weight": np.zeros((257, 33), np.float32)}
    with pytest.raises(gdx.Error) as e:
        gdx.load_safetensors(p, out=bad)
    msg = str(e.value)
    assert "out['ids'] is (99,) int32 but the checkpoint has (99,) int64" in msg, msg
    assert "out['h.0.attn'] is (5, 3, 7) float16 but the checkpoint has (3, 5, 7) float16" in msg, msg
    assert not bad["embed.weight"].any(), "a refused load wrote bytes"
    ro = np.zeros(13, np.int8)
    ro.flags.writeable = False
    with pytest.raises(gdx.Error, match=r"out\['i8'\] is not contiguous \(or not writable\)"):
        gdx.load_safetensors(p, out={"i8": ro})
