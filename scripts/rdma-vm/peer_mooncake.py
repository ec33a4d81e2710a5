"""Mooncake Transfer Engine (PyPI mooncake-transfer-engine-non-cuda) on rxe0, two processes in one
VM, the same sizes as gdx's rdma bench: 8 B write round trip, and write bandwidth at 64 KiB,
1 MiB, 8 MiB (batches of synchronous writes), every size's bytes read back and compared; and
the block list of gdx_blocks.py: 1,000 of 2,048 blocks of 16 KiB (sources numpy
default_rng(1), destinations default_rng(2)) as one batch, median of 5, the target's blocks
read back and every written and untouched block compared.
Run by scripts/rdma-vm/bench-one.sh (MC_GID_INDEX=1, MC_WORKERS_PER_CTX=1). Prints one JSON line
per row."""

import json
import os
import subprocess
import sys
import time

import numpy as np
from mooncake.engine import TransferEngine

IP = os.environ.get("GDX_VM_SELF_IP", "192.0.2.1")
LEN = 8 << 20
BLOCK, POOL, N = 16 << 10, 2048, 1000


def engine():
    te = TransferEngine()
    rc = te.initialize(IP, "P2PHANDSHAKE", "rdma", "rxe0")
    assert rc == 0, f"mooncake initialize: {rc}"
    return te


def target():
    te = engine()
    buf = np.zeros(POOL * BLOCK, np.uint8)
    assert te.register_memory(buf.ctypes.data, buf.nbytes) == 0
    print(json.dumps({"addr": f"{IP}:{te.get_rpc_port()}", "ptr": buf.ctypes.data}), flush=True)
    sys.stdin.read()


def initiator():
    child = subprocess.Popen([sys.executable, __file__, "target"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    hello = json.loads(child.stdout.readline())
    te = engine()
    src = np.random.default_rng(1).integers(0, 256, POOL * BLOCK, dtype=np.uint8)
    back = np.zeros(POOL * BLOCK, np.uint8)
    for b in (src, back):
        assert te.register_memory(b.ctypes.data, b.nbytes) == 0
    peer, rptr = hello["addr"], hello["ptr"]
    out = []
    # 8 B: one synchronous write each, post to completion.
    for _ in range(20):
        te.transfer_sync_write(peer, src.ctypes.data, rptr, 8)
    lat = []
    for _ in range(500):
        t = time.perf_counter()
        assert te.transfer_sync_write(peer, src.ctypes.data, rptr, 8) == 0
        lat.append(time.perf_counter() - t)
    out.append({"row": "8 B write round trip p50", "us": float(np.median(lat)) * 1e6})
    for size, n in ((65536, 200), (1 << 20, 40), (8 << 20, 6)):
        ptrs = [src.ctypes.data] * n
        rps = [rptr] * n
        lens = [size] * n
        te.batch_transfer_sync_write(peer, ptrs[:2], rps[:2], lens[:2])
        t = time.perf_counter()
        rc = te.batch_transfer_sync_write(peer, ptrs, rps, lens)
        dt = time.perf_counter() - t
        assert rc == 0, rc
        back[:size] = 0
        assert te.transfer_sync_read(peer, back.ctypes.data, rptr, size) == 0
        ok = bool(np.array_equal(back[:size], src[:size]))
        out.append({"row": f"{size} B write", "MBps": size * n / dt / 1e6, "verified": ok})
    out.append(blocks(te, peer, src, back, rptr))
    child.stdin.close()
    child.wait(timeout=30)
    for r in out:
        print(json.dumps(r))


def blocks(te, peer, src, back, rptr):
    """1,000 scattered 16 KiB blocks as one batch; the pool's earlier rows wrote only its first
    8 MiB, so it is read back before and the untouched blocks compared against that."""
    assert te.transfer_sync_read(peer, back.ctypes.data, rptr, back.nbytes) == 0
    expect = back.copy().reshape(POOL, BLOCK)
    si = np.random.default_rng(1).permutation(POOL)[:N]
    di = np.random.default_rng(2).permutation(POOL)[:N]
    ptrs = [src.ctypes.data + int(s) * BLOCK for s in si]
    rps = [rptr + int(d) * BLOCK for d in di]
    lens = [BLOCK] * N
    assert te.batch_transfer_sync_write(peer, ptrs, rps, lens) == 0
    times = []
    for _ in range(5):
        t = time.perf_counter()
        assert te.batch_transfer_sync_write(peer, ptrs, rps, lens) == 0
        times.append(time.perf_counter() - t)
    back[:] = 0
    assert te.transfer_sync_read(peer, back.ctypes.data, rptr, back.nbytes) == 0
    expect[di] = src.reshape(POOL, BLOCK)[si]
    ok = bool(np.array_equal(back.reshape(POOL, BLOCK), expect))
    dt = float(np.median(times))
    return {"row": "blocks", "MBps": N * BLOCK / dt / 1e6, "ms": dt * 1e3, "verified": ok}


if __name__ == "__main__":
    target() if sys.argv[1:] == ["target"] else initiator()
