#!/usr/bin/env bash
# The one GPU-machine runner: runs the named stages, in order, on any GPU box, from the
# repository root. What a stage needs is built on this side by scripts/device/prepare.sh and
# carried (nothing is built or downloaded there):
#
#   bash scripts/device/prepare.sh bins                      # .devbin/: gdx, examples, test binaries
#   run(carry=[".devbin"], command="bash scripts/device/run.sh views tests")
#   bash scripts/device/run.sh --list                        # the stages, one line each
#
#   bash scripts/device/run.sh STAGE... [-- ARGS]            # ARGS go to the last stage
#
# Each stage writes under $OUT/STAGE/ (OUT defaults to /tmp/gdx-out); $OUT/summary.txt gets the
# run header (date, host, GPUs, gdx version, commit when known) and each stage's exit status
# and time. With PACK=1, $OUT/results.tgz is refreshed after every stage (so a call cut short
# still brings back what finished) and the stage folders are removed at the end.
# Two-GPU tests (two_gpus_*) are skipped by name on a one-GPU machine, and the summary says so.
. "$(dirname "$0")/env.sh"
HERE=$(cd "$(dirname "$0")" && pwd)
STAGES=$HERE/stages
BIN=$PWD/.devbin
# A binary named by the caller (GDX=...) wins: the latency stage runs here too.
GDX=${GDX:-$BIN/gdx}
ROOT_OUT=$OUT
S=$ROOT_OUT/summary.txt

# name | needs | what it does (the first column is the stage's name).
LIST="views     | .devbin            | nvidia-smi topo, gdx topo (text, JSON, NCCL XML, a capture read back), gdx topo --p2p, gdx doctor (text, JSON)
tests     | .devbin            | every test binary in .devbin/tests with its ignored (GPU) tests
bench     | .devbin            | gdx bench over every GPU path (8 B .. 1 GiB, JSON/CSV/SVG), gdx bench --path file, gdx calibrate
nccl      | .devbin            | gdx nccl run at 1 MiB, 64 MiB and 1 GiB on every GPU
rdma      | .devbin            | gdx bench --path rdma (text and JSON) and the RDMA discovery report (rdma_info)
engine    | .devbin            | the engine GPU bench (gpu_bench) beside torch and raw CUDA, same run
peer      | .devbin            | the Peer GPU bench (peer_gpu_bench): tcp-staged and ipc through a Peer
storage   | .devbin            | gdx-storage GPU tests, gdx cp file <-> GPU per path, the storage bench
latency   | .devbin            | host transport latency beside the same-run floors (GDX_OLD: paired with an older gdx)
fabric    | .devbin (+fabric)  | libfabric providers, probe-fabric, gdx bench --path fabric
stream    | .devbin            | gdx stream: pipeline GPU tests, 4 MiB frames against the pinned ceiling, 4 KiB at 100k/s
mailbox   | .devbin            | mailbox and stream-signal rows beside the copy engine, mailbox_latency, doctor's gpu-async
quick     | .devbin            | a few minutes: the stream stage one frame at a time, short streams, the mailbox floors
paired    | .devbin-paired     | paired host-transport runs of several gdx binaries (paired.py)
ipc       | target/wheels      | Python foreign-GPU tests and bench_ipc.py (torch/numpy memory between processes)
safetensors | .devbin, target/wheels | a 4 GiB safetensors load by safetensors and by gdx, warm and cold
peers     | .peers             | KV blocks between two processes: torch, Mooncake, NIXL and gdx (kv_peers.py)
ckpt      | .peers             | checkpoint loads: gdx beside safetensors, InstantTensor, fastsafetensors, Run:ai (ckpt.py)
all       | .devbin            | views tests storage engine bench rdma, each under its own time limit, with PACK=1"

usage() {
  echo "usage: $0 STAGE... [-- ARGS]   (stages: $(cut -d'|' -f1 <<<"$LIST" | tr -s ' \n' ' '))" >&2
  exit 2
}

# cuFile needs udev's ID_FS_USAGE for the file system's device; the GPU VMs have no udev
# database (see `gdx doctor`'s cufile finding). Written (on a GPU machine only), and said so.
udev_fix() {
  local majmin
  majmin=$(lsblk -no MAJ:MIN "$(findmnt -no SOURCE -T /tmp)" 2>/dev/null | head -1 | tr -d ' ')
  if [ -n "$majmin" ] && ! grep -qs ID_FS_USAGE "/run/udev/data/b$majmin"; then
    mkdir -p /run/udev/data &&
      printf 'E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=%s\n' "$(findmnt -no FSTYPE -T /tmp)" >>"/run/udev/data/b$majmin"
    echo "udev: wrote ID_FS_USAGE for $majmin (cuFile refuses every file without it)" | tee -a "$S"
  fi
}

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')

stage_views() {
  nvidia-smi -L >"$OUT/nvidia-smi.txt" 2>&1
  nvidia-smi topo -m >>"$OUT/nvidia-smi.txt" 2>&1
  nvidia-smi topo -p2p r >>"$OUT/nvidia-smi.txt" 2>&1
  "$GDX" topo >"$OUT/gdx-topo.txt" 2>&1; echo "rc=$?" >>"$OUT/gdx-topo.txt"
  "$GDX" topo --json >"$OUT/gdx-topo.json" 2>>"$OUT/log.txt"
  "$GDX" topo --export-xml - >"$OUT/gdx-topo-nccl.xml" 2>>"$OUT/log.txt"
  "$GDX" topo --capture "$OUT/capture.tar.gz" >>"$OUT/log.txt" 2>&1
  "$GDX" topo --root "$OUT/capture.tar.gz" >"$OUT/gdx-topo-from-capture.txt" 2>&1
  "$GDX" topo --p2p >"$OUT/topo-p2p.txt" 2>&1; echo "rc=$?" >>"$OUT/topo-p2p.txt"
  "$GDX" doctor >"$OUT/doctor.txt" 2>&1; echo "rc=$?" >>"$OUT/doctor.txt"
  "$GDX" doctor --json >"$OUT/doctor.json" 2>>"$OUT/log.txt"
}

stage_tests() {
  local skip=(--skip role_) t # roles run only as children of their tests
  if ((gpus < 2)); then
    skip+=(--skip two_gpus_)
    echo "$gpus GPU(s): two_gpus_* tests skipped by name" | tee -a "$S"
  fi
  for t in "$BIN"/tests/*; do
    [ -x "$t" ] || continue
    echo "--- $t" >>"$OUT/tests.txt"
    GDX_TEST_GPU=${GDX_TEST_GPU:-0} GDX_TEST_GPUS=$gpus GDX_MAILBOX_CHILD="$BIN/mailbox_child" \
      timeout "${TEST_LIMIT:-300}" "$t" --include-ignored --test-threads=1 "${skip[@]}" >>"$OUT/tests.txt" 2>&1
    echo "rc=$? $(basename "$t")" >>"$OUT/log.txt"
  done
  grep -E "^test result|FAILED|panicked" "$OUT/tests.txt" | sort | uniq -c | sort -rn | head -40 >>"$S"
}

stage_bench() {
  GDX=$GDX bash "$STAGES/bench-gpu.sh" "$@"
  timeout 100 "$GDX" bench --path file --size 16MiB:1GiB:x4 --iters 3 --file-dir /tmp \
    --export-json "$OUT/bench-file.json" >"$OUT/bench-file.txt" 2>&1
  echo "bench --path file rc=$?" | tee -a "$OUT/log.txt"
}

stage_nccl() {
  timeout 240 "$GDX" nccl run --size 1MiB,64MiB,1GiB --gpus "$gpus" "$@" >"$OUT/nccl-run.txt" 2>&1
  echo "rc=$?" >>"$OUT/nccl-run.txt"
}

stage_rdma() {
  timeout 60 "$GDX" bench --path rdma >"$OUT/bench-rdma.txt" 2>&1; echo "rc=$?" >>"$OUT/bench-rdma.txt"
  timeout 60 "$GDX" bench --path rdma --json >"$OUT/bench-rdma.json" 2>>"$OUT/log.txt"
  [ -x "$BIN/rdma_info" ] && timeout 30 "$BIN/rdma_info" >"$OUT/rdma-info.txt" 2>&1
}

stage_peer() {
  timeout 180 "$BIN/peer_gpu_bench" "$@" >"$OUT/peer-gpu-bench.txt" 2>&1
  echo "rc=$?" >>"$OUT/peer-gpu-bench.txt"
  grep -h '"key"' "$OUT/peer-gpu-bench.txt" >>"$S"
}

stage_mailbox() {
  timeout 60 "$GDX" bench -p host_to_gpu0_mailbox,gpu0_to_host_mailbox,gpu0_async_signal,gpu0_stream_sync,host_to_gpu0_pinned_ce,gpu0_to_host_pinned_ce \
    -s 8,64,256,1024,2048,4096,8192 --export-json "$OUT/mailbox-bench.json" >"$OUT/mailbox-bench.txt" 2>&1
  echo "mailbox bench rc=$?" | tee -a "$S"
  if [ -x "$BIN/mailbox_latency" ]; then
    timeout 45 "$BIN/mailbox_latency" 20000 >"$OUT/mailbox-latency.txt" 2>&1
    echo "mailbox_latency rc=$?" | tee -a "$S"
  fi
  timeout 60 "$GDX" doctor --verbose >"$OUT/doctor.txt" 2>&1
  grep -iE "gpu-async|mailbox|stream.mem|gdrdrv|probe-" "$OUT/doctor.txt" | head -20 >>"$S"
}

# The stages kept as their own files under stages/ (each documents its outputs at its top).
stage_file() {
  local f=$1
  shift
  GDX=$GDX BIN=$BIN bash "$STAGES/$f" "$@"
}

run_stage() {
  local name=$1
  shift
  case $name in
    views | tests | bench | nccl | rdma | peer | mailbox) "stage_$name" "$@" ;;
    engine) stage_file gpu-engine-bench.sh "$BIN" ;;
    storage) stage_file storage-gpu.sh "$@" ;;
    latency) stage_file latency.sh "$@" ;;
    fabric) stage_file fabric.sh "$@" ;;
    stream) stage_file stream.sh "$@" ;;
    quick) stage_file quick.sh "$@" ;;
    paired) stage_file paired.sh "$@" ;;
    ipc) stage_file bench-ipc.sh "$@" ;;
    safetensors) stage_file bench-safetensors.sh "$@" ;;
    peers) stage_file kv-peers.sh "$@" ;;
    ckpt) stage_file ckpt.sh "$@" ;;
    *) echo "run: no stage '$name'" >&2; usage ;;
  esac
}

# Time limits of `all` (seconds): the device's 10-minute limit per call holds all of them.
declare -A LIMIT=([views]=60 [tests]=170 [storage]=110 [engine]=120 [bench]=150 [rdma]=60)

names=() args=()
while (($#)); do
  case $1 in
    --list) cut -d'|' -f1,3 <<<"$LIST" | sed 's/ *| */  /'; exit 0 ;;
    --) shift; args=("$@"); break ;;
    all) names+=(views tests storage engine bench rdma); PACK=${PACK:-1} ;;
    -*) usage ;;
    *) names+=("$1") ;;
  esac
  shift
done
((${#names[@]})) || usage
for name in "${names[@]}"; do
  grep -q "^$name " <<<"$LIST" || { echo "run: no stage '$name'" >&2; usage; }
done

commit=$(cat "$BIN/COMMIT" 2>/dev/null || git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
echo "== run ${names[*]}: $(date -u +%FT%TZ) host $(hostname) gpus $gpus commit $commit; $("$GDX" --version 2>/dev/null || echo 'no .devbin/gdx')" | tee -a "$S"
nvidia-smi -L >>"$S" 2>&1
# Only where there is a GPU: this changes the machine's /run.
((gpus > 0)) && udev_fix
export CARGO_BIN_EXE_gdx="$GDX"
last=$((${#names[@]} - 1))
for i in "${!names[@]}"; do
  name=${names[$i]}
  stage_args=()
  ((i == last)) && stage_args=("${args[@]}")
  export OUT="$ROOT_OUT/$name" LOG="$ROOT_OUT/$name/log.txt"
  mkdir -p "$OUT"
  t=$SECONDS
  echo "== $name" | tee -a "$S"
  if [ -n "${LIMIT[$name]:-}" ] && [ "${PACK:-}" = 1 ]; then
    # A limit only inside `all`: a stage run on its own gets the call's whole time.
    timeout "${LIMIT[$name]}" bash -c "$(declare -f); $(declare -p BIN GDX STAGES S gpus); run_stage $name" \
      >>"$OUT/stage.log" 2>&1
  else
    run_stage "$name" "${stage_args[@]}" >>"$OUT/stage.log" 2>&1
  fi
  echo "   rc=$? in $((SECONDS - t))s" | tee -a "$S"
  [ "${PACK:-}" = 1 ] && tar czf "$ROOT_OUT/results.tgz" -C "$ROOT_OUT" --exclude=results.tgz . 2>/dev/null
done
if [ "${PACK:-}" = 1 ]; then
  for name in "${names[@]}"; do rm -rf "${ROOT_OUT:?}/$name"; done
fi
ls -la "$ROOT_OUT"
