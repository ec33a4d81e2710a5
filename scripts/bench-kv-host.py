#!/usr/bin/env python3
"""Issue 51's host-memory rows: KV blocks offloaded to host memory, moved between two processes
of one host by NIXL (UCX, `cma` where ptrace allows it), Mooncake TE (tcp) and gdx, beside a
single-thread memcpy of the same blocks in one process (the floor) and the kernel's process_vm_writev
of them alone, in one run, bytes checked.

The pools are numpy arrays each process allocates and registers itself (memory the framework
owns, not gdx's): 8,192 blocks of 16 KiB per side; 1,000 blocks chosen by a fixed random
permutation (--seed) move as one batch. Single buffers: p50 of write + completion at 8 B, 4 KiB
and 1 MiB. Same machinery as scripts/device/kv_peers.py (kvbench_core.py); rows with `--list`.
Writes OUT/kv-host.json and OUT/kv-host.md, logs in OUT/logs/; exit 0 when every selected row
ran and verified. Usually run through scripts/bench-kv-host.sh (venv with nixl and gdx).

    python3 scripts/bench-kv-host.py --out DIR [--quick] [--only ROWS]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "device"))

from kvbench_core import Case, Config, HostMem, common_args, main, passthrough_args  # noqa: E402
from kvbench_libs import Gdx, Memcpy, MooncakeTcp, Nixl  # noqa: E402
from kvbench_report import best, ratio_check  # noqa: E402

CASES = [
    Case("blocks16k", "blocks", 16 << 10),
    Case("lat8", "lat", 8),
    Case("lat4k", "lat", 4 << 10),
    Case("lat1m", "lat", 1 << 20),
]


GDX_BLOCKS = ("gdx-blocks", "gdx-write", "gdx-prepared")
NIXL = ("nixl", "nixl-repost")


def checks(r):
    g = best(r, "blocks16k", GDX_BLOCKS)
    return [
        ratio_check(r, "16 KiB blocks, gdx / NIXL", g, best(r, "blocks16k", NIXL), 3),
        ratio_check(r, "16 KiB blocks, gdx / memcpy of the same blocks", g, "blocks16k.memcpy-blocks", 0.5),
        ratio_check(r, "16 KiB blocks, gdx / one contiguous memcpy of as many bytes (for reference)", g,
                    "blocks16k.memcpy", 0.5),
        ratio_check(r, "16 KiB blocks, gdx / the kernel's process_vm_writev alone (for reference)", g,
                    "blocks16k.memcpy-cma", 0.9),
        ratio_check(r, "4 KiB p50, gdx / NIXL", "lat4k.gdx", best(r, "lat4k", NIXL, "p50_us", False), 1.2, False,
                    "p50_us"),
    ]


CHECKS = [checks]


def build(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_args(ap)
    ap.set_defaults(name="kv-host")
    a = ap.parse_args(argv)
    libs = {lib.name: lib for lib in (Nixl(), MooncakeTcp(), Gdx(), Memcpy())}
    return Config(a, CASES, libs, HostMem, os.path.abspath(__file__), passthrough_args(a))


if __name__ == "__main__":
    c = build()
    sys.exit(main(c, "KV blocks and single buffers in host memory, two processes on one host", CHECKS) or 0)
