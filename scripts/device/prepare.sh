#!/usr/bin/env bash
# Build the release binary and every test binary here, and copy them into .devbin/ (ignored by
# git through .git/info/exclude) so a device run can carry them: run(carry=[".devbin"]).
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.devbin/' .git/info/exclude 2>/dev/null || echo '/.devbin/' >>.git/info/exclude
rm -rf .devbin && mkdir -p .devbin/tests
cargo build --release -p gdx
cp target/release/gdx .devbin/
# Examples the device scripts run: the engine GPU benches (gdx-bench examples) and the RDMA
# discovery report.
cargo build --release -p gdx-bench --example gpu_bench --example peer_gpu_bench \
  -p gdx-rdma --example rdma_info
cp target/release/examples/{gpu_bench,peer_gpu_bench,rdma_info} .devbin/
PKGS=${PKGS:---workspace}
cargo test $PKGS --release --no-run --message-format=json 2>/dev/null |
  python3 scripts/device/test-bins.py
strip .devbin/gdx .devbin/gpu_bench .devbin/peer_gpu_bench .devbin/rdma_info .devbin/tests/* \
  2>/dev/null || true
du -sh .devbin
