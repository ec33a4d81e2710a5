#!/usr/bin/env python3
"""Paged KV-cache transfer: a prefill process writes KV blocks into a decode process's pool.

Each layer is one batch of ``--blocks`` ops (default 1,000 blocks of 16 KiB) scattered over a
64 MiB pool as a block table says, with a notification per layer; the decode process counts the
notifications and then verifies every block of every layer. The prefill pool is a numpy array
(or a torch CUDA tensor); the decode pool is agent-allocated shared memory (or gdx-allocated
GPU memory viewed as a torch tensor). Prints blocks/s, GB/s (1e9 B/s) and
the path the engine took, with its reason.

    python examples/python/kv_transfer.py                    # numpy on the CPU
    python examples/python/kv_transfer.py --device cuda      # torch CUDA tensors
    python examples/python/kv_transfer.py --rust target/release/examples/kv_batch
                                                             # and the same batches from Rust
                                                             # (cargo build --release -p gdx-bench --example kv_batch)

The script starts the decode process itself (``--role decode``); both share a secret through
GDX_SECRET_FILE.
"""

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import gdx

POOL = 64 << 20


def block_table(n_blocks, pool_blocks, layer, seed=1234):
    """Distinct pool block indices for one layer (what a KV manager's block table holds)."""
    perm = np.random.default_rng(seed).permutation(pool_blocks)
    return perm[layer * n_blocks : (layer + 1) * n_blocks]


def layer_bytes(n_blocks, block, layer):
    return np.random.default_rng(layer).integers(0, 256, n_blocks * block, dtype=np.uint8)


def make_pool(device, nbytes):
    if device == "cuda":
        import torch

        return torch.zeros(nbytes, dtype=torch.uint8, device="cuda")
    return np.zeros(nbytes, np.uint8)


def decode(args):
    agent = gdx.Agent("decode")
    if args.device == "cuda":
        # gdx-allocated GPU memory: its descriptor carries a CUDA IPC handle (the ipc path).
        region = agent.alloc(POOL, name="kv", access="w", device="gpu:0")
        import torch

        pool = torch.as_tensor(region, device="cuda")
        pool.zero_()
        torch.cuda.synchronize()
    else:
        # Agent-allocated shared memory: a same-host writer copies into it once (a registered
        # numpy array would work too, through a bounce buffer: shm-staged).
        region = agent.alloc(POOL, name="kv", access="w")
        pool = np.frombuffer(region.view(), dtype=np.uint8)
    print(json.dumps({"address": agent.address}), flush=True)
    pool_blocks = POOL // args.block
    expect = [layer_bytes(args.blocks, args.block, i) for i in range(args.layers)]
    tables = [block_table(args.blocks, pool_blocks, i) for i in range(args.layers)]
    seen = [0] * args.layers
    for _ in range(args.layers * (args.iters + args.warmup)):
        n = agent.wait_notification(timeout=60)
        seen[int(n.data.decode().split("-")[1])] += 1
    # Every round writes the same bytes, so the final pool shows every layer. Checking once at
    # the end keeps the check's CPU time out of the timed batches (as the Rust example does).
    host = pool.cpu().numpy() if args.device == "cuda" else pool
    verified = 0
    for layer in range(args.layers):
        got = host.reshape(-1, args.block)[tables[layer]]
        if seen[layer] != args.iters + args.warmup or not np.array_equal(got.reshape(-1), expect[layer]):
            print(json.dumps({"error": f"layer {layer}: {seen[layer]} notifications, or blocks differ"}), flush=True)
            sys.exit(1)
        verified += args.blocks
    print(json.dumps({"verified_blocks": verified}), flush=True)


def prefill(args):
    fd, path = tempfile.mkstemp(prefix="gdx-kv-secret-")
    os.write(fd, secrets.token_bytes(32))
    os.close(fd)
    env = dict(os.environ, GDX_SECRET_FILE=path)
    os.environ["GDX_SECRET_FILE"] = path
    child = subprocess.Popen(
        [sys.executable, __file__, "--role", "decode", *shape_args(args)],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        hello = json.loads(child.stdout.readline())
        agent = gdx.Agent("prefill")
        # Prefill's own pool: each layer's KV blocks sit at its own block table's places.
        src_pool = make_pool(args.device, POOL)
        pool_blocks = POOL // args.block
        src_tables = [block_table(args.blocks, pool_blocks, i, seed=99) for i in range(args.layers)]
        host = np.zeros(POOL, np.uint8)
        for i in range(args.layers):
            host.reshape(-1, args.block)[src_tables[i]] = layer_bytes(args.blocks, args.block, i).reshape(
                -1, args.block
            )
        if args.device == "cuda":
            import torch

            src_pool.copy_(torch.from_numpy(host))
            stream = torch.cuda.current_stream()
        else:
            src_pool[:] = host
            stream = None
        local = agent.register(src_pool, name="prefill-kv", access="none")
        peer = agent.connect(hello["address"], timeout=10)
        remote = peer.region("kv")
        dst_tables = [block_table(args.blocks, pool_blocks, i) for i in range(args.layers)]
        b = args.block
        # The batches: built once (as a serving engine would reuse its block tables).
        batches = [
            [(local, int(s) * b, remote, int(d) * b, b) for s, d in zip(src_tables[i], dst_tables[i])]
            for i in range(args.layers)
        ]
        times, build_times = [], []
        first = None
        for it in range(args.warmup + args.iters):
            for i in range(args.layers):
                t0 = time.perf_counter()
                ops = batches[i]
                h = peer.write(ops, notify=f"layer-{i}".encode(), stream=stream)
                t1 = time.perf_counter()
                res = h.wait(timeout=60)
                t2 = time.perf_counter()
                if first is None:
                    first = res[0]
                if it >= args.warmup:
                    times.append(t2 - t0)
                    build_times.append(t1 - t0)
        done = json.loads(child.stdout.readline())
        if "verified_blocks" not in done:
            raise SystemExit(f"decode: {done}")
        med = statistics.median(times)
        out = {
            "side": "python",
            "device": args.device,
            "blocks_per_batch": args.blocks,
            "block_bytes": args.block,
            "batches": len(times),
            "batch_s_median": med,
            "submit_s_median": statistics.median(build_times),
            "blocks_per_s": args.blocks / med,
            "gb_per_s": args.blocks * args.block / med / 1e9,
            "path": first.path,
            "reason": first.reason,
            "verified_blocks": done["verified_blocks"],
        }
        print(
            f"python: {out['blocks_per_s']:,.0f} blocks/s, {out['gb_per_s']:.2f} GB/s "
            f"(median of {len(times)} batches of {args.blocks} x {args.block} B; "
            f"submit {out['submit_s_median'] * 1e6:.0f} us), path {first.path} ({first.reason}); "
            f"decode verified {done['verified_blocks']} blocks"
        )
        if args.json:
            print(json.dumps(out))
        if args.rust:
            compare(args, out)
    finally:
        child.kill()
        child.wait()
        os.unlink(path)


def shape_args(args):
    """The batch shape as command-line arguments (for the decode child and the Rust run)."""
    return [
        "--device", args.device,
        "--blocks", str(args.blocks),
        "--block", str(args.block),
        "--layers", str(args.layers),
        "--iters", str(args.iters),
        "--warmup", str(args.warmup),
    ]


def compare(args, py):
    if args.device != "cpu":
        print("rust: the kv_batch example moves host memory only; compare with --device cpu")
        return
    cmd = [args.rust, *shape_args(args)[2:]]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rust = json.loads(out.strip().splitlines()[-1])
    ratio = py["batch_s_median"] / rust["batch_s_median"]
    over = py["batch_s_median"] - rust["batch_s_median"]
    print(
        f"rust:   {rust['blocks_per_s']:,.0f} blocks/s, {rust['gb_per_s']:.2f} GB/s, path {rust['path']}\n"
        f"python/rust batch time: {ratio:.2f}x; Python overhead {over * 1e6:.0f} us per batch, "
        f"{over / args.blocks * 1e9:.0f} ns per op"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", choices=["prefill", "decode"], default="prefill")
    ap.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto")
    ap.add_argument("--blocks", type=int, default=1000, help="blocks per layer (one batch)")
    ap.add_argument("--block", type=int, default=16 << 10, help="block size in bytes")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--iters", type=int, default=5, help="timed rounds over all layers")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--rust", help="the kv_batch example binary, to run the same batches from Rust")
    ap.add_argument("--json", action="store_true", help="also print the figures as JSON")
    args = ap.parse_args()
    if args.device == "auto":
        try:
            import torch

            args.device = "cuda" if torch.cuda.is_available() and gdx.cuda_available()[0] else "cpu"
        except ImportError:
            args.device = "cpu"
    if args.blocks * args.layers * args.block > POOL:
        ap.error("blocks x layers x block exceeds the 64 MiB pool")
    if args.role == "prefill":
        prefill(args)
    else:
        decode(args)


if __name__ == "__main__":
    main()
