"""The Python binding over rdma: two processes on a real verbs device. No machine of the project
has an RDMA NIC, so this runs inside the Soft-RoCE VM (scripts/test-rdma.sh sets
GDX_REQUIRE_RDMA=1 there, which turns the skip into a failure) and is skipped elsewhere."""

import os

import numpy as np
import pytest

import gdx

from conftest import Peer

BLOCK = 4096


def rdma_device():
    try:
        return sorted(os.listdir("/sys/class/infiniband"))
    except OSError:
        return []


pytestmark = pytest.mark.skipif(
    not rdma_device() and os.environ.get("GDX_REQUIRE_RDMA") != "1",
    reason="requires an RDMA device (run inside scripts/rdma-vm.sh: scripts/test-rdma.sh)",
)


def pattern(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def test_writes_and_reads_go_rdma_between_two_processes(secret, tmp_path, monkeypatch):
    assert rdma_device(), "GDX_REQUIRE_RDMA=1 but this machine has no RDMA device"
    # Different host ids: the route goes "between hosts", where rdma is the fast path.
    peer = Peer(secret, env={"GDX_TEST_TRANSPORTS": "rdma,tcp", "GDX_HOST_ID": "b0b"})
    try:
        monkeypatch.setenv("GDX_HOST_ID", "a11ce")
        with gdx.Agent("initiator", secret=secret, transports=["rdma", "tcp"], strict=True) as a:
            p = a.connect(peer.address, timeout=30)
            assert p.transport == "rdma", p.route_reason
            n = 256
            src = pattern(n * BLOCK, 11)
            local = a.register(src, access="none")
            rd = p.region("kv")
            ops = [(local, i * BLOCK, rd, (n - 1 - i) * BLOCK, BLOCK) for i in range(n)]
            h = p.write(ops, notify=b"rdma-done")
            results = h.wait(timeout=120)
            assert {r.path for r in results} == {"rdma"}, results[0]
            note = peer.ask("note")
            assert bytes.fromhex(note["data"]) == b"rdma-done"
            remote = peer.bytes("kv", tmp_path)[: n * BLOCK].reshape(n, BLOCK)
            assert np.array_equal(remote[::-1].reshape(-1), src)
            back = np.zeros(n * BLOCK, np.uint8)
            sink = a.register(back, access="none")
            results = p.read([(sink, 0, rd, 0, n * BLOCK)]).wait(timeout=120)
            assert {r.path for r in results} == {"rdma"}
            assert np.array_equal(back, remote.reshape(-1))
    finally:
        peer.close()
