"""GPU memory gdx did not allocate (torch, CuPy, JAX tensors and views into them) moving between
two processes on one GPU: the ipc path, each allocation opened once, nothing left mapped after
the peer goes; host arrays to another process's GPU memory page-locked in place.

Skipped (and counted by conftest's summary) where torch or CUDA is missing; a framework that is
not installed skips its own case by name.
"""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import gdx

from conftest import HERE, Peer, cuda_reason

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(cuda_reason() is not None, reason=str(cuda_reason()))]

MiB = 1 << 20


class GpuPeer(Peer):
    def __init__(self, secret, kind, env=None):
        e = dict(os.environ, GDX_TEST_SECRET=secret.hex())
        # JAX would take most of the GPU at start; the test process needs some too.
        e.update(XLA_PYTHON_CLIENT_PREALLOCATE="false", **(env or {}))
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "_gpu_peer.py"), kind],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=e, text=True,
        )
        line = self.proc.stdout.readline()
        assert line, f"the {kind} peer did not start (rc {self.proc.wait()})"
        hello = json.loads(line)
        self.address, self.pid = hello["address"], hello["pid"]


def need(module):
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"requires {module}")


def pattern(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def torch_src(n, seed):
    import torch

    return torch.from_numpy(pattern(n, seed)).cuda()


@pytest.mark.parametrize("kind", ["torch", "cupy", "gdx"])
def test_foreign_gpu_memory_goes_ipc_and_maps_each_allocation_once(secret, tmp_path, kind):
    if kind in ("cupy", "jax"):
        need(kind)
    peer = GpuPeer(secret, kind)
    try:
        before = gdx.ipc_stats()
        with gdx.Agent("initiator", secret=secret) as a:
            src = torch_src(8 * MiB, 3)
            r = a.register(src, access="none")
            p = a.connect(peer.address, timeout=30)
            rd = p.region("buf")
            res = p.write([(r, 0, rd, 0, 8 * MiB)]).wait(timeout=60)
            assert {x.path for x in res} == {"ipc"}, res[0].reason
            assert np.array_equal(peer.bytes("buf", tmp_path), src.cpu().numpy())
            names = {x.name for x in p.regions()}
            if "view" in names:
                # A view into the same allocation: its own region, the same mapping.
                rv = p.region("view")
                v = torch_src(2 * MiB, 4)
                rv_src = a.register(v, access="none")
                res = p.write([(rv_src, 0, rv, 0, 2 * MiB)]).wait(timeout=60)
                assert {x.path for x in res} == {"ipc"}, res[0].reason
                assert "offset 1048576" in res[0].reason, res[0].reason
                got = peer.bytes("buf", tmp_path)
                assert np.array_equal(got[MiB:3 * MiB], v.cpu().numpy())
                assert np.array_equal(got[:MiB], src.cpu().numpy()[:MiB])
            mid = gdx.ipc_stats()
            assert mid["opened"] - before["opened"] == 1, (before, mid)
            assert mid["live"] - before["live"] == 1, (before, mid)
            p.close()
            after = gdx.ipc_stats()
            assert after["live"] == before["live"], (before, after)
        # The exporter maps nothing of ours.
        assert peer.ask("stats")["opened"] == 0
    finally:
        peer.close()


def test_jax_buffer_is_read_over_ipc(secret):
    need("jax")
    import torch

    peer = GpuPeer(secret, "jax")
    try:
        before = gdx.ipc_stats()
        with gdx.Agent("initiator", secret=secret) as a:
            p = a.connect(peer.address, timeout=30)
            rd = p.region("buf")
            assert rd.access == "r"
            dst = torch.zeros(8 * MiB, dtype=torch.uint8, device="cuda")
            r = a.register(dst, access="none")
            res = p.read([(r, 0, rd, 0, 8 * MiB)]).wait(timeout=60)
            assert {x.path for x in res} == {"ipc"}, res[0].reason
            want = (np.arange(8 * MiB, dtype=np.uint32) % 251).astype(np.uint8)
            assert np.array_equal(dst.cpu().numpy(), want)
            with pytest.raises(gdx.Error):
                p.write([(r, 0, rd, 0, 4096)]).wait(timeout=30)
            # XLA maps its memory piece by piece (VMM): one open per piece the region spans.
            assert gdx.ipc_stats()["opened"] - before["opened"] >= 1
            p.close()
            assert gdx.ipc_stats()["live"] == before["live"]
    finally:
        peer.close()


def test_a_closed_region_leaves_no_mapping(secret):
    peer = GpuPeer(secret, "torch")
    try:
        before = gdx.ipc_stats()
        with gdx.Agent("initiator", secret=secret) as a:
            p = a.connect(peer.address, timeout=30)
            src = torch_src(MiB, 10)
            r = a.register(src, access="none")
            rd = p.region("buf")
            for _ in range(3):  # the first maps it over the socket, the next ones ride the ring
                res = p.write([(r, 0, rd, 0, MiB)]).wait(timeout=60)
                assert {x.path for x in res} == {"ipc"}, res[0].reason
            assert gdx.ipc_stats()["live"] == before["live"] + 1
            peer.ask("close", name="buf")
            with pytest.raises(gdx.Error):
                p.write([(r, 0, rd, 0, MiB)]).wait(timeout=60)
            # The target said the region is gone: its mapping went with it, the peer is still up.
            assert gdx.ipc_stats()["live"] == before["live"]
            assert p.alive
    finally:
        peer.close()


def test_read_from_foreign_gpu_memory(secret, tmp_path):
    import torch

    peer = GpuPeer(secret, "torch")
    try:
        with gdx.Agent("initiator", secret=secret) as a:
            p = a.connect(peer.address, timeout=30)
            src = torch_src(8 * MiB, 5)
            r = a.register(src, access="none")
            p.write([(r, 0, p.region("buf"), 0, 8 * MiB)]).wait(timeout=60)
            dst = torch.zeros(2 * MiB, dtype=torch.uint8, device="cuda")
            rd = a.register(dst, access="none")
            res = p.read([(rd, 0, p.region("view"), 0, 2 * MiB)]).wait(timeout=60)
            assert {x.path for x in res} == {"ipc"}, res[0].reason
            assert torch.equal(dst, src[MiB:3 * MiB])
    finally:
        peer.close()


def test_host_array_to_foreign_gpu_memory_is_one_copy(secret, tmp_path):
    peer = GpuPeer(secret, "torch")
    try:
        with gdx.Agent("initiator", secret=secret) as a:
            p = a.connect(peer.address, timeout=30)
            src = pattern(8 * MiB, 6)
            r = a.register(src, access="none")
            res = p.write([(r, 0, p.region("buf"), 0, 8 * MiB)]).wait(timeout=60)
            assert {x.path for x in res} == {"ipc"}, res[0].reason
            assert "page-locked" in res[0].reason, res[0].reason
            assert np.array_equal(peer.bytes("buf", tmp_path), src)
            back = np.zeros(2 * MiB, np.uint8)
            rb = a.register(back, access="none")
            res = p.read([(rb, 0, p.region("view"), 0, 2 * MiB)]).wait(timeout=60)
            assert {x.path for x in res} == {"ipc"}, res[0].reason
            assert np.array_equal(back, src[MiB:3 * MiB])
            # Closing the regions unlocks their pages; the arrays stay usable.
            r.close()
            rb.close()
            src[:] = 1
    finally:
        peer.close()


def test_expandable_segments_go_ipc_piece_by_piece(secret, tmp_path):
    import torch

    peer = GpuPeer(secret, "torch-expandable", env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    try:
        before = gdx.ipc_stats()
        with gdx.Agent("initiator", secret=secret) as a:
            p = a.connect(peer.address, timeout=30)
            src = torch_src(8 * MiB, 7)
            r = a.register(src, access="none")
            res = p.write([(r, 0, p.region("buf"), 0, 8 * MiB)]).wait(timeout=60)
            assert {x.path for x in res} == {"ipc"}, res[0].reason
            assert "POSIX fds of the VMM allocations" in res[0].reason, res[0].reason
            assert np.array_equal(peer.bytes("buf", tmp_path), src.cpu().numpy())
            v = torch_src(2 * MiB, 8)
            rv = a.register(v, access="none")
            res = p.write([(rv, 0, p.region("view"), 0, 2 * MiB)]).wait(timeout=60)
            assert {x.path for x in res} == {"ipc"}, res[0].reason
            got = peer.bytes("buf", tmp_path)
            assert np.array_equal(got[MiB:3 * MiB], v.cpu().numpy())
            back = torch.zeros(8 * MiB, dtype=torch.uint8, device="cuda")
            rb = a.register(back, access="none")
            p.read([(rb, 0, p.region("buf"), 0, 8 * MiB)]).wait(timeout=60)
            assert np.array_equal(back.cpu().numpy(), got)
            assert gdx.ipc_stats()["live"] > before["live"]
            p.close()
            assert gdx.ipc_stats()["live"] == before["live"]
    finally:
        peer.close()


def test_pool_memory_says_why_it_is_staged(secret, tmp_path):
    # torch's cudaMallocAsync backend: stream-ordered pool memory, which no handle gdx
    # exports can name.
    peer = GpuPeer(secret, "torch", env={"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"})
    try:
        with gdx.Agent("initiator", secret=secret) as a:
            p = a.connect(peer.address, timeout=30)
            src = torch_src(8 * MiB, 9)
            r = a.register(src, access="none")
            res = p.write([(r, 0, p.region("buf"), 0, 8 * MiB)]).wait(timeout=60)
            assert {x.path for x in res} == {"shm-staged"}, res[0].reason
            assert "pool memory" in res[0].reason, res[0].reason
            assert np.array_equal(peer.bytes("buf", tmp_path), src.cpu().numpy())
    finally:
        peer.close()
