#!/usr/bin/env bash
# One device run that re-verifies the GPU paths: every GPU test binary with its ignored (GPU) tests
# included, `gdx nccl run` with its log explained, the bench's GPU rows and the doctor/topo views.
# Run on the GPU machine from the repository root, with .devbin/ carried (scripts/device/prepare.sh
# with PKGS and TESTS set, see BENCHMARKS.md). Results go to $OUT.
#
# Two-GPU tests are named two_gpus_*: on a one-GPU machine they are skipped by name and the log
# says so (they fail, naming what is missing, if asked for there).
. "$(dirname "$0")/env.sh"
BIN=.devbin
export CARGO_BIN_EXE_gdx="$PWD/$BIN/gdx"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
log "date $(date -u +%FT%TZ) host $(hostname) gpus $gpus; $("$BIN/gdx" --version)"
nvidia-smi -L >>"$OUT/log.txt" 2>&1
# cuFile needs udev's ID_FS_USAGE for the file system's device; this VM has no udev database
# (see scripts/device/storage-gpu.sh and `gdx doctor`'s cufile finding). Written, and said so.
MAJMIN=$(lsblk -no MAJ:MIN "$(findmnt -no SOURCE -T /tmp)" 2>/dev/null | head -1 | tr -d ' ')
if [ -n "$MAJMIN" ] && ! grep -qs ID_FS_USAGE /run/udev/data/b$MAJMIN; then
  mkdir -p /run/udev/data && printf 'E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=%s\n' "$(findmnt -no FSTYPE -T /tmp)" >>/run/udev/data/b$MAJMIN
  log "udev: wrote ID_FS_USAGE for $MAJMIN (cuFile refuses every file without it)"
fi
skip=(--skip role_)  # roles run only as children of their tests
if ((gpus < 2)); then
  skip+=(--skip two_gpus_)
  log "one GPU: two_gpus_* tests skipped by name"
fi
log "test binaries, ignored (GPU) tests included"
for t in "$BIN"/tests/*; do
  [ -x "$t" ] || continue
  echo "--- $t" >>"$OUT/tests.txt"
  GDX_TEST_GPU=0 GDX_TEST_GPUS=$gpus timeout 300 "$t" --include-ignored "${skip[@]}" \
    >>"$OUT/tests.txt" 2>&1
  echo "rc=$? $(basename "$t")" | tee -a "$OUT/log.txt"
done
grep -E "^test result|FAILED|panicked" "$OUT/tests.txt" >>"$OUT/log.txt"
log "gdx nccl run"
timeout 240 "$BIN/gdx" nccl run --size 1MiB,64MiB,1GiB --gpus "$gpus" >"$OUT/nccl-run.txt" 2>&1
echo "rc=$?" >>"$OUT/nccl-run.txt"
log "gdx bench (GPU rows)"
timeout 180 "$BIN/gdx" bench --size 8,1MiB,256MiB --duration 100ms >"$OUT/bench.txt" 2>&1
echo "rc=$?" >>"$OUT/bench.txt"
log "gdx doctor, gdx topo --p2p"
"$BIN/gdx" doctor >"$OUT/doctor.txt" 2>&1; echo "rc=$?" >>"$OUT/doctor.txt"
"$BIN/gdx" topo --p2p >"$OUT/topo-p2p.txt" 2>&1; echo "rc=$?" >>"$OUT/topo-p2p.txt"
log "done"
