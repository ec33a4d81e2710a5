"""``Transfer.cancel()`` (issue 54): a transfer to a stopped peer is cancelled without waiting
for the I/O timeout; it raises ``gdx.Cancelled`` by name, ``wait()`` afterwards says the same,
its buffer can be closed and freed at once, and after the peer resumes a transfer's bytes land
(verified in the other process). Over shm and tcp, for a plain write and a block post; and a
cancel of a finished transfer returns its results.
"""

import json
import signal

import numpy as np
import pytest

import gdx

MiB = 1 << 20


def pattern(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


@pytest.fixture(params=["shm", "tcp"])
def transport(request):
    return request.param


def connect(secret, peer, transport):
    """An initiator that reaches ``peer`` over ``transport`` (tcp: shm left out)."""
    kw = {"transports": ["tcp"]} if transport == "tcp" else {}
    a = gdx.Agent("initiator", listen="127.0.0.1:0", secret=secret, **kw)
    p = a.connect(peer.address, timeout=10)
    assert p.transport == transport, p.route_reason
    return a, p


def check_cancelled(h):
    with pytest.raises(gdx.Cancelled):
        h.cancel()
    with pytest.raises(gdx.Cancelled, match="cancelled"):
        h.wait(timeout=10)
    with pytest.raises(gdx.Cancelled):
        h.cancel()  # twice is fine
    assert h.done() and h.status == "failed: cancelled"
    assert all(r.status == "failed: cancelled" for r in h.results()), h.explain()


def resume_and_verify(secret, peer, transport, a, p, tmp_path):
    """The peer runs again: a write over the same peer (tcp: the stream drops the cancelled
    transfer's late reply first) or, over shm, whose connection the cancel closed, a new
    one; its bytes land. It goes past the cancelled write's range: over tcp a chunk already
    handed to the kernel may still land when the peer resumes (docs/engine.md), and it may come
    over the other data stream, after this write."""
    peer.kill(signal.SIGCONT)
    if transport == "shm":
        p = a.connect(peer.address, timeout=10)
    src = pattern(4096, 9)
    r = a.register(src, access="none")
    at = 3 * MiB
    p.write([(r, 0, p.region("kv"), at, 4096)]).wait(timeout=30)
    assert np.array_equal(peer.bytes("kv", tmp_path)[at : at + 4096], src)


def no_notification(peer):
    """True when the peer receives no notification within 300 ms."""
    peer.proc.stdin.write(json.dumps({"cmd": "note", "timeout": 0.3}) + "\n")
    peer.proc.stdin.flush()
    out = json.loads(peer.proc.stdout.readline())
    return not out["ok"] and out["error"].startswith("Timeout")


def test_a_write_to_a_stopped_peer_is_cancelled(secret, peer, transport, tmp_path):
    a, p = connect(secret, peer, transport)
    with a:
        buf = pattern(MiB, 5)
        src = a.register(buf, access="none")
        rd = p.region("kv")
        peer.stop()  # nothing answers: the transfer stays pending (its deadline: a minute)
        h = p.write([(src, 0, rd, 0, MiB)], notify=b"x", timeout=60)
        with pytest.raises(gdx.Timeout):
            h.wait(timeout=0.2)
        check_cancelled(h)
        # Nothing reads the buffer any more: it can be closed and freed now.
        src.close()
        del buf
        resume_and_verify(secret, peer, transport, a, p, tmp_path)
        assert no_notification(peer), "a cancelled transfer's notification arrived"


def test_a_block_post_to_a_stopped_peer_is_cancelled(secret, peer, transport, tmp_path):
    a, p = connect(secret, peer, transport)
    with a:
        n, bs = 64, 16 << 10
        buf = pattern(n * bs, 6)
        r = a.register(buf, access="r")
        bt = p.prepare_blocks(gdx.BlockPool([r], n, bs), gdx.BlockPool([p.region("pool")], n, bs))
        peer.stop()
        h = bt.post(np.arange(n), np.arange(n)[::-1], notify=b"blocks")
        check_cancelled(h)
        r.close()
        del buf
        resume_and_verify(secret, peer, transport, a, p, tmp_path)
        assert no_notification(peer), "a cancelled block post's notification arrived"


def test_cancel_of_a_finished_transfer_returns_its_results(agent, peer, tmp_path):
    p = agent.connect(peer.address, timeout=10)
    src = pattern(4096, 7)
    r = agent.register(src, access="none")
    h = p.write([(r, 0, p.region("kv"), 0, 4096)])
    h.wait(timeout=30)
    res = h.cancel()
    assert [x.status for x in res] == ["completed"]
    assert [x.status for x in h.cancel()] == ["completed"]
    assert h.status == "completed"
    assert np.array_equal(peer.bytes("kv", tmp_path)[:4096], src)
