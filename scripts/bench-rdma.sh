#!/usr/bin/env bash
# RDMA figures beside perftest, one boot of the Soft-RoCE VM (a benchmark, not a test):
#   bash scripts/bench-rdma.sh
# prints a table of gdx bench --path rdma against ib_write_bw / ib_read_bw / ib_write_lat at 8 B,
# 64 KiB, 1 MiB and 8 MiB, each as a ratio to perftest measured in the same boot, and Mooncake
# Transfer Engine (PyPI) on the same device and sizes, and a block list (1,000 x 16 KiB scattered,
# one batch) by gdx (scripts/rdma-vm/gdx_blocks.py) and by Mooncake in the same boot.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/rdma-vm.sh setup
cargo build --release -p gdx 2>&1 | tail -1
# The peer on the same device: Mooncake Transfer Engine from PyPI, in its own venv.
MCENV=$PWD/target/mcenv
if [[ ! -x $MCENV/bin/python ]] || ! "$MCENV/bin/python" -c 'import mooncake.engine' 2>/dev/null; then
  python3 -m venv "$MCENV"
  "$MCENV/bin/pip" install -q --disable-pip-version-check mooncake-transfer-engine-non-cuda numpy
fi
export MCENV
# The Python package (release) for the block-list row (scripts/rdma-vm/gdx_blocks.py).
GDX_PY_PROFILE=release bash scripts/test-python.sh -q test_rdma.py
export PYENV=$PWD/${GDX_PYENV:-target/pyenv}
GDX=$PWD/target/release/gdx bash scripts/rdma-vm.sh run --timeout 1800 -- bash scripts/rdma-vm/bench-one.sh
