"""Two processes, numpy arrays, batches of 1,000 ops: every byte checked after every transfer."""

import numpy as np
import pytest

import gdx

from conftest import Peer

BLOCK = 4096
OPS = 1000


def pattern(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def scatter(n_blocks, seed):
    """OPS distinct block indices out of n_blocks, in random order."""
    return np.random.default_rng(seed).permutation(n_blocks)[:OPS]


@pytest.mark.parametrize("target", ["kv", "pool"])
def test_write_batch_of_1000_then_read_back(agent, peer, tmp_path, target):
    src = pattern(OPS * BLOCK, 1)
    local = agent.register(src, name="src", access="none")
    p = agent.connect(peer.address, timeout=10)
    rd = p.region(target)
    assert rd.nbytes == 4 << 20 and rd.location == "host"
    dst_blocks = scatter(rd.nbytes // BLOCK, 2)
    ops = [(local, i * BLOCK, rd, int(b) * BLOCK, BLOCK) for i, b in enumerate(dst_blocks)]

    h = p.write(ops, notify=b"layer-0")
    results = h.wait(timeout=30)
    assert h.done() and h.status == "completed"
    assert len(results) == OPS and all(r.nbytes == BLOCK for r in results)
    # A borrowed remote array goes cma (one kernel copy) where the kernel allows it; staged
    # otherwise, and the reason says why.
    assert {r.path for r in results} <= {"shm", "cma", "shm-staged"}, results[0]
    assert all("no direct copy" in r.reason for r in results if r.path == "shm-staged"), results[0]
    assert all(r.reason for r in results)
    assert "op 999" in h.explain()
    # The results are a sequence made on demand: indexing both ways, slices, iteration, the
    # end named.
    assert isinstance(results, gdx.OpResults) and "1000 op(s)" in repr(results)
    assert results[-1].nbytes == BLOCK and results[999].path == results[-1].path
    assert [r.nbytes for r in results[998:]] == [BLOCK, BLOCK] and results[5:2] == []
    assert sum(1 for _ in results) == OPS and len(h.results()) == OPS
    with pytest.raises(IndexError, match="op 1000 of a transfer of 1000"):
        results[1000]
    with pytest.raises(IndexError, match="op -1001"):
        results[-1001]
    note = peer.ask("note")
    assert note["sender"] == "initiator" and bytes.fromhex(note["data"]) == b"layer-0"

    remote = peer.bytes(target, tmp_path)
    for i, b in enumerate(dst_blocks):
        assert np.array_equal(remote[b * BLOCK : (b + 1) * BLOCK], src[i * BLOCK : (i + 1) * BLOCK]), i
    untouched = np.setdiff1d(np.arange(rd.nbytes // BLOCK), dst_blocks)
    assert not remote.reshape(-1, BLOCK)[untouched].any()

    # Read the same blocks back into a fresh array, in another order.
    back = np.zeros(OPS * BLOCK, np.uint8)
    sink = agent.register(back, access="none")
    order = np.random.default_rng(3).permutation(OPS)
    ops = [(sink, int(j) * BLOCK, rd, int(dst_blocks[j]) * BLOCK, BLOCK) for j in order]
    results = p.read(ops).wait(timeout=30)
    assert len(results) == OPS and {r.kind for r in results} == {"read"}
    assert np.array_equal(back, src)


def test_tcp_path_when_shm_is_off(secret, tmp_path):
    peer = Peer(secret, env={"GDX_TEST_TRANSPORTS": "tcp"})
    try:
        with gdx.Agent("initiator", secret=secret, transports=["tcp"]) as a:
            p = a.connect(peer.address, timeout=10)
            assert p.transport == "tcp", p.route_reason
            src = bytearray(pattern(OPS * 64, 4).tobytes())
            r = a.register(src, access="none")
            rd = p.region("kv")
            ops = [(r, i * 64, rd, (OPS - 1 - i) * 64, 64) for i in range(OPS)]
            results = p.write(ops).wait(timeout=30)
            assert {x.path for x in results} == {"tcp"}
            remote = peer.bytes("kv", tmp_path)[: OPS * 64].reshape(OPS, 64)
            assert np.array_equal(remote[::-1].reshape(-1), np.frombuffer(src, np.uint8))
    finally:
        peer.close()


def test_rails_carry_a_transfer_and_say_so(secret, tmp_path):
    peer = Peer(secret, env={"GDX_TEST_TRANSPORTS": "tcp"})
    try:
        with gdx.Agent(
            "initiator",
            secret=secret,
            transports=["tcp"],
            nics=["127.0.0.1", "127.0.0.2"],
            tcp_streams=1,
            chunk_bytes=1 << 20,
        ) as a:
            p = a.connect(peer.address, timeout=10)
            assert p.transport == "tcp", p.route_reason
            n = 4 << 20
            src = bytearray(pattern(n, 11).tobytes())
            r = a.register(src, access="none")
            t = p.write([(r, 0, p.region("kv"), 0, n)])
            t.wait(timeout=30)
            assert np.array_equal(peer.bytes("kv", tmp_path)[:n], np.frombuffer(src, np.uint8))
            rails = t.rails()
            assert [x["local"] for x in rails] == ["127.0.0.1", "127.0.0.2"]
            for x in rails:
                assert set(x) == {"local", "remote", "bytes", "state", "cause"}
                assert x["bytes"] > 0, rails
                assert (x["state"], x["cause"]) == ("active", None)
            assert sum(x["bytes"] for x in rails) == n
            assert sum(x["bytes"] for x in p.rails()) == n
            text = t.explain()
            assert "rails: 127.0.0.1 -> " in text and "; 127.0.0.2 -> " in text, text
    finally:
        peer.close()


def test_float_arrays_and_memoryviews_register_as_bytes(agent, peer, tmp_path):
    f = np.arange(1024, dtype=np.float32)
    r = agent.register(f, access="none")
    assert r.nbytes == 4096 and r.location == "host"
    mv = memoryview(bytearray(b"\x5a" * 4096))
    r2 = agent.register(mv, access="none")
    p = agent.connect(peer.address, timeout=10)
    rd = p.region("kv")
    p.write([(r, 0, rd, 0, 4096), (r2, 0, rd, 4096, 4096)]).wait(timeout=10)
    remote = peer.bytes("kv", tmp_path)
    assert np.array_equal(remote[:4096].view(np.float32), f)
    assert (remote[4096:8192] == 0x5A).all()


def test_notification_and_secret_file(secret, tmp_path):
    path = tmp_path / "secret"
    path.write_bytes(secret)
    path.chmod(0o600)
    peer = Peer(env={"GDX_SECRET_FILE": str(path)})
    try:
        with gdx.Agent("initiator", secret=secret) as a:
            p = a.connect(peer.address, timeout=10)
            p.notify(b"hello")
            note = peer.ask("note")
            assert bytes.fromhex(note["data"]) == b"hello"
    finally:
        peer.close()


def test_agent_reads_gdx_secret_file_when_secret_absent(secret, tmp_path, monkeypatch):
    path = tmp_path / "secret"
    path.write_bytes(secret)
    path.chmod(0o600)
    monkeypatch.setenv("GDX_SECRET_FILE", str(path))
    with gdx.Agent("a") as a:
        assert a.secret == secret


def test_prepared_write_posted_again_carries_each_posts_bytes(agent, peer, tmp_path):
    """One prepared batch posted five times, the source rewritten in place before each post:
    the peer holds the last post's bytes; then a prepared read brings them back."""
    n = 16
    src = np.zeros(n * BLOCK, np.uint8)
    local = agent.register(src, access="none")
    p = agent.connect(peer.address, timeout=10)
    rd = p.region("kv")
    blocks = scatter(rd.nbytes // BLOCK, 7)[:n]
    ops = [(local, i * BLOCK, rd, int(b) * BLOCK, BLOCK) for i, b in enumerate(blocks)]
    w = p.prepare_write(ops)
    assert len(w) == n and set(w.paths) <= {"shm", "cma", "shm-staged"}, w.paths
    for k in range(5):
        src[:] = pattern(n * BLOCK, 100 + k)
        results = w.run(timeout=30)
        assert len(results) == n and all(r.status == "completed" for r in results)
        remote = peer.bytes("kv", tmp_path)
        for i, b in enumerate(blocks):
            assert np.array_equal(remote[b * BLOCK : (b + 1) * BLOCK], src[i * BLOCK : (i + 1) * BLOCK]), (k, i)
    # post() returns a Transfer like write()'s.
    h = w.post()
    h.wait(timeout=30)
    assert h.status == "completed"

    back = np.zeros(n * BLOCK, np.uint8)
    sink = agent.register(back, access="none")
    r = p.prepare_read([(sink, i * BLOCK, rd, int(b) * BLOCK, BLOCK) for i, b in enumerate(blocks)])
    for _ in range(2):
        back[:] = 0
        r.run(timeout=30)
        assert np.array_equal(back, src)


def test_prepare_refuses_what_write_refuses(agent, peer):
    local = agent.register(np.zeros(64, np.uint8), access="none")
    p = agent.connect(peer.address, timeout=10)
    rd = p.region("kv")
    with pytest.raises(gdx.OutOfBounds):
        p.prepare_write([(local, 0, rd, rd.nbytes - 8, 64)])
    with pytest.raises(gdx.Error):
        p.prepare_write([])
