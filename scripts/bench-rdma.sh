#!/usr/bin/env bash
# RDMA figures beside perftest, one boot of the Soft-RoCE VM (a benchmark, not a test):
#   bash scripts/bench-rdma.sh
# prints a table of gdx bench --path rdma against ib_write_bw / ib_read_bw / ib_write_lat at 8 B,
# 64 KiB, 1 MiB and 8 MiB, each as a ratio to perftest measured in the same boot.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/rdma-vm.sh setup
cargo build --release -p gdx 2>&1 | tail -1
GDX=$PWD/target/release/gdx bash scripts/rdma-vm.sh run --timeout 1800 -- bash scripts/rdma-vm/bench-one.sh
