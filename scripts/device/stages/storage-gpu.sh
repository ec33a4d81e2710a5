#!/usr/bin/env bash
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# Storage <-> GPU on the GPU machine (no Rust there): gdx-storage's GPU tests, `gdx cp` file <-> GPU
# over each path with --verify, and the storage benchmark (every path against read() + cudaMemcpy).
# Binaries come from .devbin/, built here by: PKGS="-p gdx-storage -p gdx-sys -p gdx" bash scripts/device/prepare.sh bins
# The `storage` stage: bash scripts/device/run.sh storage    (about 2 minutes at most; results in $OUT)
#   $OUT/storage-summary.txt   what ran, each exit status, the test result lines
#   $OUT/storage-env.txt       nvidia-fs / cuFile / file system facts
#   $OUT/storage-tests.txt     full test output (GPU tests included)
#   $OUT/storage-cp.txt        gdx cp in text (and any errors); $OUT/storage-cp.json one JSON line per run
#   $OUT/storage-bench.txt     the benchmark table, $OUT/storage-bench.json the same as JSON
#   $OUT/storage-cufile.log    cuFile's own log
set -uo pipefail
OUT=${OUT:-/tmp/gdx-out}
mkdir -p "$OUT"
BIN=${BIN:-.devbin}
case $BIN in /*) ;; *) BIN="$PWD/$BIN" ;; esac
GDX="$BIN/gdx"
export CARGO_BIN_EXE_gdx="$GDX"
export CUFILE_LOGFILE_PATH="$OUT/storage-cufile.log"
SCRATCH=${GDX_STORAGE_SCRATCH:-/tmp/gdx-storage}
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH"
export GDX_TEST_DIR="$SCRATCH" GDX_TEST_GPU=${GDX_TEST_GPU:-0}
GPU=$GDX_TEST_GPU
SUM="$OUT/storage-summary.txt"
START=$SECONDS
log() { echo "== [$((SECONDS - START))s] $*" | tee -a "$SUM"; }

log "date $(date -u +%FT%TZ) host $(hostname) kernel $(uname -r)"
{
  nvidia-smi -L
  echo "--- nvidia-fs: /sys/module/nvidia_fs $( [ -e /sys/module/nvidia_fs ] && echo present || echo absent)"
  grep -E '^nvidia' /proc/modules
  echo "--- libcufile"
  ls -l /usr/local/cuda/targets/*/lib/libcufile* /usr/lib/x86_64-linux-gnu/libcufile* 2>&1
  echo "--- /etc/cufile.json (compat and I/O settings)"
  grep -nE 'allow_compat_mode|use_poll_mode|max_direct_io_size|parallel_io|use_pci_p2pdma|force_compat' /etc/cufile.json 2>&1
  echo "--- scratch file system"
  df -T "$SCRATCH"; findmnt -T "$SCRATCH" 2>&1; lsblk -o NAME,SIZE,ROTA,TYPE,MOUNTPOINT 2>&1
} >"$OUT/storage-env.txt" 2>&1

# The GPU machine is a Firecracker VM without a udev database: cuFile (even in compatibility
# mode) refuses to register a file when udev has no ID_FS_USAGE/ID_FS_TYPE for its block device
# ("udev property not found: ID_FS_USAGE vda" in cuFile's log, then CU_FILE_HANDLE_NOT_REGISTERED).
# A real host has these from udev's blkid rule; here we write the same two properties for the
# scratch file system's device, and say so. GDX_NO_UDEV_FIX=1 skips it (to reproduce the failure).
if [ -z "${GDX_NO_UDEV_FIX:-}" ]; then
  SRC=$(findmnt -no SOURCE -T "$SCRATCH" 2>/dev/null); FSTYPE=$(findmnt -no FSTYPE -T "$SCRATCH" 2>/dev/null)
  MAJMIN=$(lsblk -no MAJ:MIN "$SRC" 2>/dev/null | head -1 | tr -d ' ')
  UDEV=/run/udev/data/b$MAJMIN
  if [ -n "$MAJMIN" ] && ! grep -qs ID_FS_USAGE "$UDEV"; then
    mkdir -p /run/udev/data && printf 'E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=%s\n' "$FSTYPE" >>"$UDEV"
    log "udev had no ID_FS_USAGE for $SRC ($MAJMIN): wrote ID_FS_USAGE=filesystem ID_FS_TYPE=$FSTYPE to $UDEV for cuFile"
  fi
fi

# 1. Tests: storage (GPU and CI), the cuFile bindings in gdx-sys, gdx cp end to end.
log "tests"
for pat in storage_gpu storage_gather_gpu storage_file_host gdx_storage gdx_sys cli_cp; do
  for t in "$BIN"/tests/"$pat"-*; do
    [ -x "$t" ] || continue
    echo "--- $t" >>"$OUT/storage-tests.txt"
    # gdx_sys: only its cuFile unit tests (the rest belongs to gpu-run.sh).
    filter=""; [ "$pat" = gdx_sys ] && filter="cufile"
    timeout 90 "$t" --include-ignored --test-threads=2 $filter >>"$OUT/storage-tests.txt" 2>&1
    log "rc=$? $(basename "$t")"
  done
done
grep -E "^test result|FAILED|panicked| skipped" "$OUT/storage-tests.txt" | tee -a "$SUM"

# 2. gdx cp, file <-> GPU over each path, verified.
if "$GDX" cp --help >/dev/null 2>&1; then
  log "gdx cp"
  SRC="$SCRATCH/cp-src.bin"
  "$GDX" cp host "file:$SRC" --length 128M --sync >>"$OUT/storage-cp.txt" 2>&1
  # One run in text, as a person sees it; then every path both ways as JSON lines.
  timeout 30 "$GDX" cp "file:$SRC" "gpu:$GPU" --verify --quiet >>"$OUT/storage-cp.txt" 2>&1
  log "rc=$? gdx cp file:$SRC gpu:$GPU --verify"
  for path in auto gds file-staged buffered; do
    for args in "file:$SRC gpu:$GPU:3" "gpu:$GPU:5 file:$SCRATCH/cp-out-$path.bin --length 128M"; do
      echo "--- gdx cp $args --verify --path $path --json" >>"$OUT/storage-cp.txt"
      # shellcheck disable=SC2086
      timeout 30 "$GDX" cp $args --verify --path "$path" --json 2>>"$OUT/storage-cp.txt" |
        tr -d '\n' >>"$OUT/storage-cp.json"
      rc=${PIPESTATUS[0]}
      echo >>"$OUT/storage-cp.json"
      log "rc=$rc gdx cp $args --path $path"
    done
  done
  rm -f "$SCRATCH"/cp-*.bin

  # 3. The benchmark: 1 GiB per transfer when the disk writes 256 MiB at 1 GB/s or more,
  # else 256 MiB, so that the whole script stays within about 2 minutes.
  RATE=$("$GDX" cp host "file:$SCRATCH/probe.bin" --length 256M --sync --json 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin).get("gbps") or 0)' 2>/dev/null || echo 0)
  rm -f "$SCRATCH/probe.bin"
  SIZE=$(python3 -c "print('1G' if float('$RATE') >= 1.0 else '256M')" 2>/dev/null || echo 256M)
  log "bench: disk write probe $RATE GB/s -> $SIZE per transfer"
  timeout $((115 - (SECONDS - START) > 20 ? 115 - (SECONDS - START) : 20)) \
    "$GDX" cp --bench "$SCRATCH/bench.bin" --gpu "$GPU" --size "$SIZE" --samples 3 \
    --export-json "$OUT/storage-bench.json" >"$OUT/storage-bench.txt" 2>>"$SUM"
  log "rc=$? gdx cp --bench"
  cat "$OUT/storage-bench.txt" | tee -a "$SUM" >/dev/null
else
  log "skipped gdx cp and the bench: this gdx has no cp subcommand (register cmd::cp in main.rs)"
fi
rm -rf "$SCRATCH"
log "done in $((SECONDS - START)) s"
