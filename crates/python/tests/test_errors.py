"""Each exception type provoked for real, against a second process."""

import os
import secrets
import signal
import threading

import numpy as np
import pytest

import gdx
from gdx import _gdx

from conftest import Peer, cuda_reason


def test_hierarchy():
    for cls in (
        gdx.PeerLost,
        gdx.Timeout,
        gdx.AccessDenied,
        gdx.OutOfBounds,
        gdx.NotFound,
        gdx.Unavailable,
        gdx.StrictViolation,
    ):
        assert issubclass(cls, gdx.Error) and cls is not gdx.Error
    assert issubclass(gdx.Error, Exception)
    # The typed fields exist on every instance, None when not set.
    e = gdx.PeerLost("x")
    assert e.errno is None and e.region is None and e.path is None
    assert gdx.AccessDenied("x").kind is None


def test_wrong_region_name_is_not_found(agent, peer):
    p = agent.connect(peer.address, timeout=10)
    with pytest.raises(gdx.NotFound, match="nope") as ei:
        p.region("nope")
    assert ei.value.name == "nope"
    # The peer publishes its regions ("kv", "pool", ...): the name is wrong, not early.
    assert ei.value.published >= 2


def test_out_of_bounds_checked_locally_and_by_the_target(agent, peer):
    p = agent.connect(peer.address, timeout=10)
    rd = p.region("kv")
    src = agent.register(np.ones(8192, np.uint8), access="none")
    # Past the end of the descriptor: refused before anything is sent.
    with pytest.raises(gdx.OutOfBounds):
        p.write([(src, 0, rd, rd.nbytes - 100, 4096)]).wait(timeout=10)
    # Past the end of the local region.
    with pytest.raises(gdx.OutOfBounds):
        p.write([(src, 8000, rd, 0, 4096)]).wait(timeout=10)
    # A descriptor that lies about the length: the target's own check refuses it.
    big = _gdx._forge_len(rd, rd.nbytes * 2)
    with pytest.raises(gdx.OutOfBounds):
        p.write([(src, 0, big, rd.nbytes + 4096, 4096)]).wait(timeout=10)


def test_read_only_region_refuses_writes(agent, peer):
    p = agent.connect(peer.address, timeout=10)
    ro = p.region("ro")
    assert ro.access == "r"
    src = agent.register(np.ones(4096, np.uint8), access="none")
    with pytest.raises(gdx.AccessDenied, match="read-only") as ei:
        p.write([(src, 0, ro, 0, 4096)]).wait(timeout=10)
    assert isinstance(ei.value.region, int), vars(ei.value)
    # Reading it is allowed, and gives the pattern the peer put there.
    back = np.zeros(4096, np.uint8)
    dst = agent.register(back, access="none")
    p.read([(dst, 0, ro, 0, 4096)]).wait(timeout=10)
    assert np.array_equal(back, np.random.default_rng(7).integers(0, 256, 1 << 20, dtype=np.uint8)[:4096])


def test_forged_key_is_access_denied(agent, peer):
    p = agent.connect(peer.address, timeout=10)
    forged = _gdx._forge_key(p.region("kv"))
    src = agent.register(np.ones(4096, np.uint8), access="none")
    with pytest.raises(gdx.AccessDenied, match="bad key"):
        p.write([(src, 0, forged, 0, 4096)]).wait(timeout=10)


def test_read_into_read_only_memory_is_refused(agent, peer):
    p = agent.connect(peer.address, timeout=10)
    rd = p.region("kv")
    r = agent.register(b"\0" * 4096, access="none")  # bytes: a read-only buffer
    with pytest.raises(gdx.AccessDenied, match="read-only"):
        p.read([(r, 0, rd, 0, 4096)])
    with pytest.raises(gdx.Error, match="read-only"):
        agent.register(b"\0" * 4096, access="rw")


def test_wrong_secret_is_access_denied(peer):
    with gdx.Agent("intruder", secret=secrets.token_bytes(32)) as a:
        with pytest.raises(gdx.AccessDenied) as ei:
            a.connect(peer.address, timeout=10)
    assert ei.value.kind == "proof", ei.value


def test_missing_secret_is_access_denied(peer):
    # No secret= and no GDX_SECRET_FILE: this process's own secret, which the peer lacks.
    os.environ.pop("GDX_SECRET_FILE", None)
    with gdx.Agent("stranger") as a:
        with pytest.raises(gdx.AccessDenied):
            a.connect(peer.address, timeout=10)


def test_peer_stopped_then_killed_mid_wait(agent, peer):
    p = agent.connect(peer.address, timeout=10)
    rd = p.region("kv")
    src = agent.register(np.ones(1 << 20, np.uint8), access="none")
    peer.stop()  # it cannot answer: the transfer stays pending
    h = p.write([(src, 0, rd, 0, 1 << 20)], notify=b"x")
    with pytest.raises(gdx.Timeout):
        h.wait(timeout=0.3)
    assert not h.done()
    killer = threading.Timer(0.3, peer.kill)  # SIGKILL while the wait below is running
    killer.start()
    try:
        with pytest.raises(gdx.PeerLost):
            h.wait(timeout=30)
    finally:
        killer.join()
    assert h.done() and h.status.startswith("failed")
    with pytest.raises(gdx.PeerLost) as ei:
        h.raise_for_status()
    # The OS error number when a socket call saw the loss, else None.
    assert ei.value.errno is None or isinstance(ei.value.errno, int), ei.value.errno


def test_unavailable_names_the_library():
    if cuda_reason() is None:
        pytest.skip("CUDA works here: Unavailable is provoked on machines without it")
    ok, why = gdx.cuda_available()
    if ok:
        pytest.skip("gdx can load CUDA here")

    class FakeCudaArray:
        __cuda_array_interface__ = {
            "data": (0x7F0000000000, False),
            "shape": (1024,),
            "typestr": "|u1",
            "version": 3,
        }

    with gdx.Agent("a") as a:
        with pytest.raises(gdx.Unavailable, match="(?i)cuda"):
            a.register(FakeCudaArray())


def test_bad_arguments_are_gdx_errors(agent):
    with pytest.raises(gdx.Error, match="access"):
        agent.register(bytearray(16), access="rwx")
    with pytest.raises(gdx.Error, match="contiguous"):
        agent.register(np.zeros((64, 64), np.uint8)[:, ::2])
    with pytest.raises(gdx.Error, match="empty"):
        agent.register(bytearray())
    with pytest.raises(gdx.Error, match="timeout"):
        agent.wait_notification(timeout=-1)
    with pytest.raises(gdx.Error, match="timeout"):
        agent.wait_notification(timeout=float("inf"))
    keep = agent.register(bytearray(16), name="x")  # noqa: F841 (must stay open)
    second = bytearray(16)
    with pytest.raises(gdx.Error, match="already published"):
        agent.register(second, name="x")
    second.extend(b"!")  # the failed registration released its buffer export


def test_connect_to_a_stopped_peer_times_out(agent, peer):
    peer.stop()  # the kernel still accepts the connection; nobody answers the handshake
    with pytest.raises(gdx.Timeout):
        agent.connect(peer.address, timeout=0.5)


def test_ctrl_c_interrupts_a_transfer_wait(agent, peer):
    p = agent.connect(peer.address, timeout=10)
    rd = p.region("kv")
    # 64 KiB: above the shm ring's inline size, so the submission is queued to the connection's
    # worker and `write` returns at once; a small inline op on an idle connection may run on the
    # submitting thread itself (the latency fast path), and then the wait has nothing to wait for.
    n = 64 << 10
    src = agent.register(np.ones(n, np.uint8), access="none")
    peer.stop()
    h = p.write([(src, 0, rd, 0, n)], notify=b"x")
    t = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
    t.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            h.wait(timeout=60)
    finally:
        t.join()
    assert not h.done()  # interrupting the wait does not cancel or fail the transfer


def test_huge_timeouts_are_clamped_not_a_panic(agent, peer):
    # `now + 1e19 s` overflowed a deadline: pyo3's PanicException instead of a gdx answer.
    p = agent.connect(peer.address, timeout=1e19)
    rd = p.region("kv")
    src = agent.register(np.full(4096, 0x5A, np.uint8), access="none")
    p.write([(src, 0, rd, 0, 4096)]).wait(timeout=1e19)
    back = np.zeros(4096, np.uint8)
    dst = agent.register(back, access="none")
    p.read([(dst, 0, rd, 0, 4096)]).wait(timeout=1e300)
    assert (back == 0x5A).all()
