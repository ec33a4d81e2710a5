"""Lifetimes: a region keeps its object alive, close() deregisters, closed regions raise,
views keep regions open; and the GIL is released while waiting."""

import gc
import os
import signal
import threading
import weakref

import numpy as np
import pytest

import gdx


def test_region_keeps_the_array_alive_until_closed(agent):
    arr = np.zeros(4096, np.uint8)
    ref = weakref.ref(arr)
    r = agent.register(arr, name="kept")
    del arr
    gc.collect()
    assert ref() is not None, "the array was freed while registered"
    assert r.obj is ref()
    r.close()
    gc.collect()
    assert ref() is None, "close() did not let go of the array"
    assert r.closed


def test_garbage_collection_deregisters(agent):
    arr = np.zeros(4096, np.uint8)
    ref = weakref.ref(arr)
    agent.register(arr, name="gc-me")  # the Region is dropped at once
    del arr
    gc.collect()
    assert ref() is None
    assert [d.name for d in agent.published()] == []
    agent.register(bytearray(8), name="gc-me").close()  # the name is free again


def test_close_deregisters_for_peers(agent, peer, tmp_path):
    p = agent.connect(peer.address, timeout=10)
    rd = p.region("kv")
    src = agent.register(np.full(4096, 3, np.uint8), access="none")
    p.write([(src, 0, rd, 0, 4096)]).wait(timeout=10)
    peer.ask("close", name="kv")
    with pytest.raises(gdx.NotFound):
        p.write([(src, 0, rd, 4096, 4096)]).wait(timeout=10)
    with pytest.raises(gdx.NotFound):
        p.region("kv")


def test_closed_region_raises_and_published_forgets_it(agent, peer):
    r = agent.register(np.zeros(4096, np.uint8), name="local")
    assert [d.name for d in agent.published()] == ["local"]
    r.close()
    r.close()  # idempotent
    assert agent.published() == []
    assert r.nbytes == 4096 and "closed" in repr(r)
    with pytest.raises(gdx.Error, match="closed"):
        r.view()
    with pytest.raises(gdx.Error, match="closed"):
        r.desc()
    p = agent.connect(peer.address, timeout=10)
    with pytest.raises(gdx.Error, match="closed"):
        p.write([(r, 0, p.region("kv"), 0, 4096)])


def test_context_manager_closes(agent):
    with agent.register(bytearray(64), name="cm") as r:
        assert not r.closed
    assert r.closed and agent.published() == []


def test_registered_bytearray_cannot_be_resized(agent):
    b = bytearray(4096)
    r = agent.register(b)
    with pytest.raises(BufferError):
        b.extend(b"more")
    r.close()
    b.extend(b"more")  # released with the region
    assert len(b) == 4100


def test_alloc_view_keeps_region_open(agent):
    buf = agent.alloc(1 << 16, name="inbox")
    assert buf.nbytes == 1 << 16 and buf.obj is None
    v = buf.view()
    a = np.frombuffer(v, dtype=np.uint8)
    assert not a.any()  # zeroed
    a[:4] = [1, 2, 3, 4]
    assert bytes(buf.view()[:4]) == b"\x01\x02\x03\x04"
    with pytest.raises(BufferError, match="view"):
        buf.close()
    del a
    v.release()
    gc.collect()
    buf.close()
    with pytest.raises(gdx.Error, match="closed"):
        buf.view()


def test_wait_releases_the_gil(agent):
    counted = []
    stop = threading.Event()

    def count():
        while not stop.is_set():
            counted.append(1)

    t = threading.Thread(target=count)
    t.start()
    n0 = len(counted)
    with pytest.raises(gdx.Timeout):
        agent.wait_notification(timeout=0.5)
    n1 = len(counted)
    stop.set()
    t.join()
    assert n1 > n0, "no other Python thread ran during the wait"


def test_ctrl_c_interrupts_a_wait(agent):
    t = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
    t.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            agent.wait_notification(timeout=60)
    finally:
        t.join()


def test_closed_agent_raises(secret):
    a = gdx.Agent("short", secret=secret)
    a.close()
    with pytest.raises(gdx.Error, match="closed"):
        a.register(bytearray(8))
    assert "closed" in repr(a)
