#!/usr/bin/env bash
# Host→host benchmark of gdx-engine (gdx-bench's bench_host example): iperf3 single stream on
# loopback, then tcp and shm through the engine at the same size, in one run on one machine. Usage: scripts/bench-host.sh [SIZE] [ITERS]
# Needs iperf3 (apt-get install -y iperf3). Results are for BENCHMARKS.md: paste the whole output.
set -euo pipefail
SIZE=${1:-1073741824}
ITERS=${2:-5}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target-engine}
cd "$ROOT"
cargo build -q --release -p gdx-bench --example bench_host
echo "== machine: $(uname -srm), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "== commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
if command -v iperf3 >/dev/null; then
  PORT=5299
  iperf3 -s -p $PORT -1 >/dev/null 2>&1 &
  SERVER=$!
  sleep 0.5
  BPS=$(iperf3 -c 127.0.0.1 -p $PORT -t 5 -J | python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"])')
  wait $SERVER || true
  IPERF=$(python3 -c "print(f'{$BPS/8e9:.2f}')")
  echo "== iperf3 -c 127.0.0.1 -t 5 (single stream): $IPERF GB/s"
else
  IPERF=""
  echo "== iperf3 not installed: apt-get install -y iperf3"
fi
echo "== $CARGO_TARGET_DIR/release/examples/bench_host $SIZE $ITERS (GDX_TCP_STREAMS=${GDX_TCP_STREAMS:-2})"
OUT=$("$CARGO_TARGET_DIR/release/examples/bench_host" "$SIZE" "$ITERS")
echo "$OUT"
if [ -n "$IPERF" ]; then
  echo "$OUT" | awk -v ip="$IPERF" '/^tcp (write|read) .* owned/ { printf "== %s %s %s: %.2fx iperf3 single stream\n", $1, $2, $3, $(NF-1)/ip }'
fi
