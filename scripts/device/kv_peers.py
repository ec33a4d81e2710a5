#!/usr/bin/env python3
"""Issue 51's peer benchmark on the GPU machine: paged KV-cache blocks and single buffers moved
GPU -> GPU between two processes on one GPU by torch, Mooncake TE (`nvlink_intra`), NIXL (UCX,
`cuda_ipc`) and gdx, in one run, every row's bytes checked.

Rows (CASE.VARIANT; `--list` prints them, kvbench_libs.py says what each variant does):
  blocks16k, blocks128k   1,000 blocks chosen by a fixed random permutation (--seed) out of a
                          pool of 8,192 per side, registered once; one batch per transfer;
                          GB/s of the median batch
  lat4k, lat1m            one buffer: p50 of write + completion
  bw256m                  one buffer of 256 MiB: GB/s of the median

Each library runs in its own pair of processes (a crash costs only its rows, reported with the
error); every destination block is checked equal to its source block and every other block
checked untouched. Writes OUT/kv-peers.json (header, every row) and OUT/kv-peers.md (the tables
and issue 51's acceptance lines); logs of each pair in OUT/logs/. Exit 0 when every selected
row ran and verified, 1 otherwise. Normally started by kv-peers.sh, which installs the carried
wheels first.

    python3 kv_peers.py --out DIR [--quick] [--only gdx,torch-ref] [--iters N] [--seed S]
"""

import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from kvbench_core import Case, Config, GpuMem, common_args, main, passthrough_args  # noqa: E402
from kvbench_libs import Gdx, Mooncake, Nixl, Torch  # noqa: E402
from kvbench_report import best, ratio_check  # noqa: E402

CASES = [
    Case("blocks16k", "blocks", 16 << 10),
    Case("blocks128k", "blocks", 128 << 10),
    Case("lat4k", "lat", 4 << 10),
    Case("lat1m", "lat", 1 << 20),
    Case("bw256m", "bw", 256 << 20),
]
GDX_BLOCKS = ("gdx-blocks", "gdx-write", "gdx-prepared")
MOONCAKE = ("mooncake", "mooncake-arrays")


def blocks_check(case: str, want_gbps: float, ref: tuple, want_ratio: float, what: str):
    def lines(r):
        g = best(r, case, GDX_BLOCKS)
        return [ratio_check(r, f"{what}, gdx GB/s", g, None, want_gbps),
                ratio_check(r, f"{what}, gdx / {ref[0]}", g, best(r, case, ref), want_ratio)]
    return lines


def lat_check(case: str, what: str):
    return lambda r: [ratio_check(r, f"{what} p50, gdx / Mooncake", f"{case}.gdx",
                                  best(r, case, MOONCAKE, "p50_us", False), 1.1, False, "p50_us")]


CHECKS = [
    blocks_check("blocks16k", 100, MOONCAKE, 40, "16 KiB blocks"),
    blocks_check("blocks128k", 150, ("torch-ref",), 0.8, "128 KiB blocks"),
    lat_check("lat4k", "4 KiB"),
    lat_check("lat1m", "1 MiB"),
    lambda r: [ratio_check(r, "256 MiB GB/s, gdx / Mooncake", "bw256m.gdx", "bw256m.mooncake", 1.0)],
]


def gpu_name() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], check=False, capture_output=True, text=True, timeout=30).stdout
        return out.splitlines()[0].strip() if out.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def build(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_args(ap)
    ap.set_defaults(name="kv-peers")
    a = ap.parse_args(argv)
    libs = {lib.name: lib for lib in (Torch(), Mooncake(), Nixl(), Gdx())}
    cfg = Config(a, CASES, libs, GpuMem, os.path.abspath(__file__), passthrough_args(a))
    if a.role == "driver" and not a.list:
        cfg.header_extra = {"gpu": gpu_name(), "title": "kv-peers"}
    return cfg


if __name__ == "__main__":
    c = build()
    sys.exit(main(c, "KV blocks and single buffers, GPU -> GPU, two processes on one GPU", CHECKS) or 0)
