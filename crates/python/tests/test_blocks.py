"""Block lists between two processes (docs/blocks.md): pools of several layers with K and V
apart, scattered/adjacent/reversed lists, per-layer posts with the request id on the last,
1 and 100,000 blocks, refusals by name; every destination block checked and every other
block checked untouched, over shm and over tcp.

The other process publishes ``pool`` (4 MiB, agent-allocated) and ``kv`` (4 MiB, a numpy
array it registered): the remote pool is 2 layers x 2 segments (K, V) of 32 blocks of 16 KiB,
back to back; the local pool keeps each layer's K and V interleaved (stride 2 blocks), so
local runs never merge and remote ones do.
"""

import numpy as np
import pytest

import gdx

from conftest import Peer

BS = 16 << 10
N = 32
LAYERS, SEGS = 2, 2


def pattern(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def local_pool(agent, arr):
    r = agent.register(arr, access="rw")
    layers = []
    for l in range(LAYERS):
        base = l * SEGS * N * BS
        layers.append([(r, base + s * BS, SEGS * BS) for s in range(SEGS)])
    return r, gdx.BlockPool(layers, num_blocks=N, block_bytes=BS)


def remote_pool(rd):
    layers = [
        [(rd, (l * SEGS + s) * N * BS, BS) for s in range(SEGS)] for l in range(LAYERS)
    ]
    return gdx.BlockPool(layers, num_blocks=N, block_bytes=BS)


def local_block(arr, l, s, b):
    at = l * SEGS * N * BS + s * BS + b * SEGS * BS
    return arr[at : at + BS]


def remote_block(buf, l, s, b):
    at = ((l * SEGS + s) * N + b) * BS
    return buf[at : at + BS]


def check(arr, remote, pairs, layers):
    """Each moved block equals its source; every other remote block is zero."""
    moved = set()
    for l in layers:
        for s in range(SEGS):
            for src, dst in pairs:
                assert np.array_equal(remote_block(remote, l, s, dst), local_block(arr, l, s, src)), (l, s, src, dst)
                moved.add((l, s, dst))
    for l in range(LAYERS):
        for s in range(SEGS):
            for b in range(N):
                if (l, s, b) not in moved:
                    assert not remote_block(remote, l, s, b).any(), ("touched", l, s, b)


@pytest.fixture(params=["pool", "kv"])
def target(request):
    return request.param


LISTS = {
    "scattered": ([5, 17, 2, 30, 9], [11, 0, 29, 4, 22]),
    "adjacent": ([3, 4, 5, 6], [20, 21, 22, 23]),
    "reversed": ([9, 8, 7, 6], [1, 2, 3, 4]),
    "one": ([31], [0]),
}


@pytest.mark.parametrize("shape", sorted(LISTS))
def test_block_list_write_every_layer(agent, peer, tmp_path, target, shape):
    arr = pattern(LAYERS * SEGS * N * BS, 1)
    _, lp = local_pool(agent, arr)
    p = agent.connect(peer.address, timeout=10)
    rp = remote_pool(p.region(target))
    assert (rp.num_layers, rp.segments, rp.num_blocks, rp.block_bytes) == (LAYERS, SEGS, N, BS)
    bt = p.prepare_blocks(lp, rp)
    src, dst = LISTS[shape]
    t = bt.post(np.array(src), dst, notify=b"req-7")
    t.wait(timeout=30)
    assert t.status == "completed"
    # Remote runs merge only where both sides are back to back: the local side never is.
    assert len(t) == len(src) * LAYERS * SEGS
    # A borrowed pool reached by `cma` is copied under the peer's standing lease: no round trip.
    if "cma" in {r.path for r in t.results()}:
        assert "standing lease" in t.explain(), t.explain()
    note = peer.ask("note")
    assert bytes.fromhex(note["data"]) == b"req-7"
    check(arr, peer.bytes(target, tmp_path), list(zip(src, dst)), range(LAYERS))


def test_layer_by_layer_with_the_request_id_on_the_last(agent, peer, tmp_path):
    arr = pattern(LAYERS * SEGS * N * BS, 2)
    _, lp = local_pool(agent, arr)
    p = agent.connect(peer.address, timeout=10)
    bt = p.prepare_blocks(lp, remote_pool(p.region("pool")))
    src, dst = [1, 2, 3], [7, 8, 9]
    first = bt.post(src, dst, layers=0)
    first.wait(timeout=30)
    # Layer 0 landed, layer 1 not yet: the sender sees each layer complete.
    check(arr, peer.bytes("pool", tmp_path), list(zip(src, dst)), [0])
    bt.post(src, dst, layers=range(1, 2), notify=b"req-9").wait(timeout=30)
    assert bytes.fromhex(peer.ask("note")["data"]) == b"req-9"
    check(arr, peer.bytes("pool", tmp_path), list(zip(src, dst)), [0, 1])


def test_read_blocks_back(agent, peer):
    p = agent.connect(peer.address, timeout=10)
    peer.ask("fill", name="pool", seed=5)
    remote = pattern(4 << 20, 5)
    arr = np.zeros(LAYERS * SEGS * N * BS, np.uint8)
    _, lp = local_pool(agent, arr)
    bt = p.prepare_blocks(lp, remote_pool(p.region("pool")), op="read")
    src, dst = [30, 0, 12], [4, 5, 6]  # remote blocks -> local blocks
    bt.post(src, dst).wait(timeout=30)
    for l in range(LAYERS):
        for s in range(SEGS):
            for r, loc in zip(src, dst):
                assert np.array_equal(local_block(arr, l, s, loc), remote_block(remote, l, s, r))
            for b in set(range(N)) - set(dst):
                assert not local_block(arr, l, s, b).any()


def test_100000_blocks(agent, peer, tmp_path):
    """100,000 blocks of 16 B in one post, a random permutation of the destination."""
    n, bs = 100_000, 16
    arr = pattern(n * bs, 3)
    r = agent.register(arr, access="r")
    p = agent.connect(peer.address, timeout=10)
    rd = p.region("pool")
    bt = p.prepare_blocks(gdx.BlockPool([r], n, bs), gdx.BlockPool([rd], n, bs))
    dst = np.random.default_rng(4).permutation(n)
    t = bt.post(np.arange(n), dst)
    t.wait(timeout=120)
    # Pairs back to back on both sides merge into one op.
    assert len(t) == n - int(np.count_nonzero(np.diff(dst) == 1))
    remote = peer.bytes("pool", tmp_path)
    got = remote[: n * bs].reshape(n, bs)
    assert np.array_equal(got[dst], arr.reshape(n, bs))
    assert not remote[n * bs :].any()


def test_bad_lists_are_refused_by_name_and_move_nothing(agent, peer, tmp_path):
    arr = pattern(LAYERS * SEGS * N * BS, 6)
    _, lp = local_pool(agent, arr)
    p = agent.connect(peer.address, timeout=10)
    bt = p.prepare_blocks(lp, remote_pool(p.region("pool")))
    with pytest.raises(gdx.Error, match=r"src\[1\] = 32 is out of range: the pool has 32 blocks"):
        bt.post([0, 32], [1, 2])
    with pytest.raises(gdx.Error, match=r"dst\[2\] = 4 is given twice \(first at dst\[0\]\)"):
        bt.post([1, 2, 3], [4, 5, 4])
    with pytest.raises(gdx.Error, match="3 source blocks and 2 destination blocks"):
        bt.post([1, 2, 3], [4, 5])
    with pytest.raises(gdx.Error, match="layers 2..3: the pools have 2 layers"):
        bt.post([1], [2], layers=2)
    with pytest.raises(gdx.Error, match="consecutive layers"):
        bt.post([1], [2], layers=[0, 2])
    with pytest.raises(gdx.Error, match="non-negative block ids"):
        bt.post([-1], [2])
    assert not peer.bytes("pool", tmp_path).any()


def test_pools_that_do_not_match_are_refused(agent, peer):
    arr = pattern(LAYERS * SEGS * N * BS, 7)
    r, lp = local_pool(agent, arr)
    p = agent.connect(peer.address, timeout=10)
    rd = p.region("pool")
    with pytest.raises(gdx.Error, match="block sizes differ: 16384 B here, 8192 B at the peer"):
        p.prepare_blocks(lp, gdx.BlockPool([[rd, rd]] * 2, num_blocks=N, block_bytes=BS // 2))
    with pytest.raises(gdx.Error, match=r"layouts differ: 2 layers × 2 segments here, 1 × 2"):
        p.prepare_blocks(lp, gdx.BlockPool([[rd, (rd, N * BS, BS)]], num_blocks=N, block_bytes=BS))
    with pytest.raises(gdx.Error, match="need 1048576 B; the region has 4194304 B|the region has"):
        gdx.BlockPool([(rd, 4 << 20, BS)], num_blocks=N, block_bytes=BS)
    with pytest.raises(gdx.Error, match="stride 4096 B is under the block size"):
        gdx.BlockPool([(r, 0, 4096)], num_blocks=N, block_bytes=BS)
    with pytest.raises(gdx.Error, match="never mixes local and remote"):
        gdx.BlockPool([[r, rd]], num_blocks=N, block_bytes=BS)
    with pytest.raises(gdx.Error, match="the remote pool is built from local regions"):
        p.prepare_blocks(lp, lp)
    with pytest.raises(gdx.Error, match="not writable by peers"):
        ro = p.region("ro")
        p.prepare_blocks(gdx.BlockPool([r], 64, BS), gdx.BlockPool([ro], 64, BS))


def test_blocks_over_tcp(secret, tmp_path):
    peer = Peer(secret, env={"GDX_TEST_TRANSPORTS": "tcp"})
    try:
        agent = gdx.Agent("initiator", secret=secret, transports=["tcp"])
        arr = pattern(LAYERS * SEGS * N * BS, 8)
        _, lp = local_pool(agent, arr)
        p = agent.connect(peer.address, timeout=10)
        assert p.transport == "tcp"
        bt = p.prepare_blocks(lp, remote_pool(p.region("kv")))
        src, dst = [0, 1, 2, 20, 11], [3, 4, 5, 31, 30]
        bt.post(src, dst, notify=b"req-tcp").wait(timeout=30)
        assert bytes.fromhex(peer.ask("note")["data"]) == b"req-tcp"
        check(arr, peer.bytes("kv", tmp_path), list(zip(src, dst)), range(LAYERS))
    finally:
        peer.close()
