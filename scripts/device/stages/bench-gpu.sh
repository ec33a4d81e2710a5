#!/usr/bin/env bash
# gdx bench (every GPU path, 8 B … 1 GiB) and gdx calibrate on the GPU machine, in under
# 3 minutes. Needs .devbin/gdx built here by `scripts/device/prepare.sh bins` (carried).
# Writes to $OUT: h200x2.json, h200x2.csv, h200x2.svg (the sweep), bench.txt (the printed
# tables), bench.err (stderr), calibration.json + calibrate.txt (gdx calibrate), log.txt.
# The `bench` stage: bash scripts/device/run.sh bench
. "$(dirname "$0")/../env.sh"
GDX=${GDX:-.devbin/gdx}

log "date: $(date -u +%FT%TZ) host: $(hostname) kernel: $(uname -r)"
nvidia-smi -L 2>&1 | tee -a "$OUT/log.txt"
"$GDX" bench --list >"$OUT/bench-list.txt" 2>&1

# The sweep. Export files are rewritten after every case, so a timeout keeps what finished.
log "gdx bench (GPU paths)"
start=$(date +%s)
timeout -k 5 130 "$GDX" bench --quiet \
  --path pinned-ce,pageable-ce,p2p,staged,ipc \
  --size 8:1GiB --duration 100ms --max-samples 200 \
  --export-json "$OUT/h200x2.json" --export-csv "$OUT/h200x2.csv" --plot "$OUT/h200x2.svg" \
  >"$OUT/bench.txt" 2>"$OUT/bench.err"
log "gdx bench rc=$? in $(( $(date +%s) - start )) s"
tail -n 3 "$OUT/bench.txt" | tee -a "$OUT/log.txt"

# Crossovers for the planner (p2p vs staged per pair, shm vs tcp), in the engine's format.
log "gdx calibrate"
start=$(date +%s)
timeout -k 5 45 "$GDX" calibrate --quiet -o "$OUT/calibration.json" --duration 40ms \
  >"$OUT/calibrate.txt" 2>&1
log "gdx calibrate rc=$? in $(( $(date +%s) - start )) s"
"$GDX" calibrate --show -o "$OUT/calibration.json" >>"$OUT/calibrate.txt" 2>&1
head -n 20 "$OUT/calibrate.txt" | tee -a "$OUT/log.txt"
ls -la "$OUT" | tee -a "$OUT/log.txt"
