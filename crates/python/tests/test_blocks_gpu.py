"""Block lists between two processes' GPU memory on one GPU (docs/blocks.md): the ipc ops of a
post move as one batched copy (a kernel launch per ring slot), each destination block checked
against its source and every other block checked untouched; blocks of the copy engine's size
(4 MiB and more) still go one copy each.

The peer (_gpu_peer.py torch) publishes ``buf``: 8 MiB of torch GPU memory, zeroed.
"""

import numpy as np
import pytest

import gdx

from conftest import cuda_reason
from test_foreign_gpu import GpuPeer, pattern

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(cuda_reason() is not None, reason=str(cuda_reason()))]

MiB = 1 << 20


def run(secret, tmp_path, bs, n_moved, seed, op="write"):
    import torch

    n = 8 * MiB // bs
    peer = GpuPeer(secret, "torch")
    try:
        with gdx.Agent("initiator", secret=secret) as a:
            host = pattern(8 * MiB, seed)
            src = torch.from_numpy(host).cuda()
            r = a.register(src, access="rw")
            p = a.connect(peer.address, timeout=30)
            rd = p.region("buf")
            perm = np.random.default_rng(seed).permutation(n)
            sb, db = perm[:n_moved], np.random.default_rng(seed + 1).permutation(n)[:n_moved]
            bt = p.prepare_blocks(gdx.BlockPool([r], n, bs), gdx.BlockPool([rd], n, bs))
            # Twice: the first maps the peer's allocation over the socket, the second goes
            # through the ring; both batch.
            for _ in range(2):
                t = bt.post(sb, db)
                res = t.wait(timeout=60)
                assert {x.path for x in res} == {"ipc"}, res[0].reason
            got = peer.bytes("buf", tmp_path).reshape(n, bs)
            want = host.reshape(n, bs)
            assert np.array_equal(got[db], want[sb])
            assert not np.delete(got, db, axis=0).any()
            return t, p, r, rd
    finally:
        peer.close()


def test_1000_blocks_of_4k_are_batched(secret, tmp_path):
    t, *_ = run(secret, tmp_path, 4096, 1000, 11)
    assert "batched: " in t.explain() and "batched cop" in t.explain(), t.explain()


def test_scattered_16k_blocks_are_batched(secret, tmp_path):
    t, *_ = run(secret, tmp_path, 16 << 10, 300, 12)
    assert "batched cop" in t.explain(), t.explain()


def test_4mib_blocks_go_one_copy_each(secret, tmp_path):
    t, *_ = run(secret, tmp_path, 4 * MiB, 2, 13)
    assert "batched" not in t.explain(), t.explain()


def test_read_blocks_from_the_peer_gpu(secret, tmp_path):
    import torch

    bs, n = 16 << 10, 512
    peer = GpuPeer(secret, "torch")
    try:
        with gdx.Agent("initiator", secret=secret) as a:
            src = torch.from_numpy(pattern(8 * MiB, 14)).cuda()
            r = a.register(src, access="rw")
            p = a.connect(peer.address, timeout=30)
            rd = p.region("buf")
            w = p.prepare_blocks(gdx.BlockPool([r], n, bs), gdx.BlockPool([rd], n, bs))
            w.post(np.arange(n), np.arange(n)).wait(timeout=60)
            back = torch.zeros(8 * MiB, dtype=torch.uint8, device="cuda")
            rb = a.register(back, access="rw")
            rdr = p.prepare_blocks(gdx.BlockPool([rb], n, bs), gdx.BlockPool([rd], n, bs), op="read")
            sb = np.random.default_rng(15).permutation(n)[:200]
            t = rdr.post(sb, np.arange(200))
            t.wait(timeout=60)
            assert "batched cop" in t.explain(), t.explain()
            got = back.cpu().numpy().reshape(n, bs)
            want = src.cpu().numpy().reshape(n, bs)
            assert np.array_equal(got[:200], want[sb])
            assert not got[200:].any()
    finally:
        peer.close()
