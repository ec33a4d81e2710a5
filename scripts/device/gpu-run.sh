#!/usr/bin/env bash
# Run on the GPU machine (no Rust there): everything under .devbin/ was built on the CI-class
# machine by scripts/device/prepare.sh. Results go to $OUT (the device tool brings them back).
# Usage there: bash scripts/device/gpu-run.sh
. "$(dirname "$0")/env.sh"
BIN=.devbin
export CARGO_BIN_EXE_gdx="$PWD/$BIN/gdx"

log "date: $(date -u +%FT%TZ) host: $(hostname) kernel: $(uname -r)"
nvidia-smi -L 2>&1 | tee -a "$OUT/log.txt"
log "nvidia-smi topo -m"
nvidia-smi topo -m >"$OUT/nvidia-smi-topo.txt" 2>&1
log "nvidia-smi topo -p2p r"
nvidia-smi topo -p2p r >>"$OUT/nvidia-smi-topo.txt" 2>&1
log "gdx topo"
"$BIN/gdx" topo >"$OUT/gdx-topo.txt" 2>&1; echo "rc=$?" >>"$OUT/gdx-topo.txt"
"$BIN/gdx" topo --json >"$OUT/gdx-topo.json" 2>>"$OUT/log.txt"
"$BIN/gdx" topo --export-xml - >"$OUT/gdx-topo-nccl.xml" 2>>"$OUT/log.txt"
"$BIN/gdx" topo --capture "$OUT/h200x2-capture.tar.gz" >>"$OUT/log.txt" 2>&1
"$BIN/gdx" topo --root "$OUT/h200x2-capture.tar.gz" >"$OUT/gdx-topo-from-capture.txt" 2>&1
if "$BIN/gdx" doctor --help >/dev/null 2>&1; then
  log "gdx doctor"
  "$BIN/gdx" doctor >"$OUT/gdx-doctor.txt" 2>&1; echo "rc=$?" >>"$OUT/gdx-doctor.txt"
  "$BIN/gdx" doctor --json >"$OUT/gdx-doctor.json" 2>>"$OUT/log.txt"
fi
log "test binaries (GPU tests included)"
for t in "$BIN"/tests/*; do
  [ -x "$t" ] || continue
  echo "--- $t" >>"$OUT/tests.txt"
  GDX_TEST_GPU=0 "$t" --include-ignored >>"$OUT/tests.txt" 2>&1; echo "rc=$? $t" | tee -a "$OUT/log.txt"
done
grep -E "^test result|FAILED|panicked" "$OUT/tests.txt" | tee -a "$OUT/log.txt"
