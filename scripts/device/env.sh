# shellcheck shell=bash
# What every device script starts with (source it: `. "$(dirname "$0")/env.sh"`): unset
# variables and failed pipes are errors (a failed step is not: the scripts log it and go on),
# NCCL, PyTorch and NVSHMEM stay off NVLink multicast (the device machines lend none), and the
# results folder $OUT (default /tmp/gdx-out) exists. `log` appends a `== ` line to $LOG
# (default $OUT/log.txt) and prints it.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/gdx-out}
mkdir -p "$OUT"
log() { echo "== $*" | tee -a "${LOG:-$OUT/log.txt}"; }
# `step NAME SECONDS COMMAND...`: run COMMAND under a time limit with its output in $W/NAME.log,
# note its exit status and time in $S, and refresh the archive $TGZ of $W (so a run that is cut
# short still brings back what it did). For the scripts that set W, S and TGZ.
step() {
  local n=$1 l=$2
  shift 2
  local t=$SECONDS
  echo "== $n" | tee -a "$S"
  timeout "$l" "$@" >"$W/$n.log" 2>&1
  echo "   rc=$? in $((SECONDS - t))s" | tee -a "$S"
  tar czf "$TGZ" -C "$W" .
}
