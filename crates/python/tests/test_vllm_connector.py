"""The vLLM connector's parts that need no vLLM (gdx.vllm): options, the layout check, and the
block reader between two agents; the end-to-end test with vLLM is scripts/test-vllm.sh."""

import dataclasses
import subprocess
import sys

import numpy as np
import pytest

import gdx
from gdx.vllm import KvLayout, LayoutMismatch
from gdx.vllm._blocks import BlockReader
from gdx.vllm._worker import options

BB = 4096  # block bytes
N = 16  # blocks per pool


def layout(**kw):
    base = dict(
        block_size=32, dtype="float32", num_kv_heads=2, head_size=32, num_layers=2, tp_size=1,
        tp_rank=0, tensor_layout="(num_blocks, 2, 32, 64) block dim 0", block_bytes=BB,
        num_blocks=N, segments_per_layer=1, layer_names=["l0", "l1"],
        segments=[[["kv", 0, BB]], [["kv", N * BB, BB]]],
    )
    return KvLayout(**{**base, **kw})


def test_importing_gdx_vllm_does_not_import_vllm():
    code = "import sys, gdx.vllm; print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_unknown_options_are_refused_by_name():
    with pytest.raises(gdx.Error, match=r"unknown gdx connector option\(s\) \['lisen'\]"):
        options({"lisen": "127.0.0.1:0"})
    with pytest.raises(gdx.Error, match="load='eager'"):
        options({"load": "eager"})
    assert options({"etcd": "http://x:2379"})["cluster"] == "vllm"


def test_layout_round_trips_through_its_record():
    a = layout()
    raw = a.to_bytes().ljust(1 << 16, b"\0")
    assert KvLayout.from_bytes(raw) == a


def test_layout_mismatch_names_every_field_that_differs():
    here, there = layout(), layout(block_size=64, dtype="bfloat16", num_blocks=99)
    with pytest.raises(LayoutMismatch) as e:
        here.check(there, "prefill-0 at 10.0.0.1:7450")
    msg = str(e.value)
    assert "with prefill-0 at 10.0.0.1:7450" in msg
    assert "block_size 32 here, 64 there" in msg
    assert "dtype 'float32' here, 'bfloat16' there" in msg
    assert "num_blocks" not in msg  # where the blocks lie may differ
    assert isinstance(e.value, gdx.Error)
    here.check(dataclasses.replace(here, num_blocks=7, segments=[]), "x")  # no error


def test_unreadable_layout_record_is_a_layout_mismatch():
    with pytest.raises(LayoutMismatch, match="unreadable"):
        KvLayout.from_bytes(b"not json\0\0")


@pytest.fixture
def pair(secret):
    """A prefill-like agent publishing a 2-layer pool and a decode-like agent reading it."""
    pre = gdx.Agent("pre", secret=secret)
    dec = gdx.Agent("dec", secret=secret)
    src = np.random.default_rng(1).integers(0, 256, 2 * N * BB, dtype=np.uint8)
    published = pre.register(src, name="kv", access="r")  # deregistered when collected
    dst = np.zeros(2 * N * BB, np.uint8)
    local = {"kv": dec.register(dst, name="kv")}
    peer = dec.connect(pre.address)
    yield peer, src, dst, local
    published.close()
    peer.close()
    dec.close()
    pre.close()


def test_block_reader_moves_exactly_the_listed_blocks(pair):
    peer, src, dst, local = pair
    r = BlockReader(peer, layout(), local, layout(), {"kv": peer.region("kv")}, timeout=10)
    pairs = [(3, 0), (4, 1), (5, 2), (9, 7), (0, 15)]  # adjacent runs and scattered blocks
    r.post([s for s, _ in pairs], [d for _, d in pairs]).wait(timeout=10)
    moved = {d for _, d in pairs}
    for layer in range(2):
        for b in range(N):
            got = dst[(layer * N + b) * BB : (layer * N + b + 1) * BB]
            if b in moved:
                s = dict((d, s) for s, d in pairs)[b]
                assert np.array_equal(got, src[(layer * N + s) * BB : (layer * N + s + 1) * BB])
            else:
                assert not got.any(), (layer, b)


def test_block_reader_layer_by_layer(pair):
    peer, src, dst, local = pair
    r = BlockReader(peer, layout(), local, layout(), {"kv": peer.region("kv")}, timeout=10)
    r.post([2], [2], layers=[1]).wait(timeout=10)
    assert np.array_equal(dst[(N + 2) * BB : (N + 3) * BB], src[(N + 2) * BB : (N + 3) * BB])
    assert not dst[: N * BB].any()  # layer 0 untouched


def test_block_reader_refuses_bad_lists_before_any_byte_moves(pair):
    peer, src, dst, local = pair
    r = BlockReader(peer, layout(), local, layout(), {"kv": peer.region("kv")}, timeout=10)
    with pytest.raises(gdx.Error, match="out of range"):
        r.post([1, N], [1, 2])
    with pytest.raises(gdx.Error):
        r.post([1, 2], [3, 3])
    assert not dst.any()
