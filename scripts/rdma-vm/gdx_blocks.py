"""gdx's block-list row for the RDMA VM bench (scripts/rdma-vm/bench-one.sh), the twin of
peer_mooncake.py's `blocks` row: two processes on rxe0, a pool of 2,048 blocks of 16 KiB per
side (numpy arrays each process registers), 1,000 blocks chosen by a fixed random permutation
(numpy default_rng(1) for the sources, default_rng(2) for the destinations) written as one
transfer, timed over 5 posts (median); then the target's whole pool read back and every written
block and every untouched one compared. Two host ids force the rdma route. Prints one JSON line.
Run with the venv that holds the gdx wheel (scripts/test-python.sh)."""

import json
import os
import subprocess
import sys
import time

import numpy as np

import gdx

BLOCK, POOL, N = 16 << 10, 2048, 1000
SECRET = os.environ.setdefault("GDX_BENCH_SECRET", os.urandom(32).hex())


def agent(name, host):
    os.environ.update(GDX_HOST_ID=host, GDX_TRANSPORTS="tcp,rdma")
    return gdx.Agent(name, secret=SECRET.encode())


def target():
    a = agent("blocks-target", "2")
    pool = np.zeros(POOL * BLOCK, np.uint8)
    region = a.register(pool, name="pool", access="rw")  # registered while it lives
    print(json.dumps({"address": a.address}), flush=True)
    sys.stdin.read()
    del region


def initiator():
    child = subprocess.Popen([sys.executable, __file__, "target"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    hello = json.loads(child.stdout.readline())
    a = agent("blocks-initiator", "1")
    src = np.random.default_rng(7).integers(0, 256, POOL * BLOCK, dtype=np.uint8)
    local = a.register(src, access="none")
    p = a.connect(hello["address"], timeout=60)
    rd = p.region("pool")
    si = np.random.default_rng(1).permutation(POOL)[:N]
    di = np.random.default_rng(2).permutation(POOL)[:N]
    ops = [(local, int(s) * BLOCK, rd, int(d) * BLOCK, BLOCK) for s, d in zip(si, di)]
    res = p.write(ops).wait(timeout=600)
    paths = sorted({r.path for r in res})
    times = []
    for _ in range(5):
        t = time.perf_counter()
        p.write(ops).wait(timeout=600)
        times.append(time.perf_counter() - t)
    back = np.zeros(POOL * BLOCK, np.uint8)
    sink = a.register(back, access="none")
    p.read([(sink, 0, rd, 0, POOL * BLOCK)]).wait(timeout=600)
    expect = np.zeros(POOL * BLOCK, np.uint8).reshape(POOL, BLOCK)
    expect[di] = src.reshape(POOL, BLOCK)[si]
    ok = bool(np.array_equal(back.reshape(POOL, BLOCK), expect))
    child.stdin.close()
    child.wait(timeout=60)
    dt = float(np.median(times))
    print(json.dumps({"row": "blocks", "MBps": N * BLOCK / dt / 1e6, "ms": dt * 1e3,
                      "verified": ok, "paths": paths}))


if __name__ == "__main__":
    target() if sys.argv[1:] == ["target"] else initiator()
