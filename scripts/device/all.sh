#!/usr/bin/env bash
# The one consolidated GPU-machine run: topo/doctor/tests, storage, engine GPU bench, gdx bench,
# RDMA discovery. Built here by `bash scripts/device/prepare.sh`; run there with carry [".devbin"].
# Everything lands in $OUT/results.tgz (the device tool returns at most 8 files) plus summary.txt.
. "$(dirname "$0")/env.sh"
FINAL_OUT=$OUT
export OUT="$FINAL_OUT/work"
mkdir -p "$OUT"
step() {
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  echo "== $name (limit ${limit}s)" | tee -a "$FINAL_OUT/summary.txt"
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "   rc=$rc in $(( $(date +%s) - t0 ))s" | tee -a "$FINAL_OUT/summary.txt"
  # Re-pack after every step, so a run cut short still brings back what finished.
  tar czf "$FINAL_OUT/results.tgz" -C "$OUT" . 2>/dev/null
}
step topo-doctor-tests 170 bash scripts/device/gpu-run.sh
[ -f scripts/device/storage-gpu.sh ] && step storage 110 bash scripts/device/storage-gpu.sh
[ -f scripts/device/gpu-engine-bench.sh ] && step engine-bench 120 bash scripts/device/gpu-engine-bench.sh .devbin
[ -f scripts/device/bench-gpu.sh ] && step bench 150 bash scripts/device/bench-gpu.sh
if [ -x .devbin/rdma_info ]; then step rdma-info 15 .devbin/rdma_info; fi
grep -hE "^test result|FAILED|panicked" "$OUT"/*.txt "$OUT"/*.log 2>/dev/null | sort | uniq -c | sort -rn | head -40 >>"$FINAL_OUT/summary.txt"
tar czf "$FINAL_OUT/results.tgz" -C "$OUT" . && rm -rf "$OUT"
ls -la "$FINAL_OUT"
