#!/usr/bin/env bash
# One GPU-machine session in two calls that fit the device's 10-minute limit each, run from the
# repository root with .devbin/ carried (scripts/device/prepare.sh, scripts/fabric-gpu-pack.sh):
#   bash scripts/device/session.sh tests    every test binary with its GPU (ignored) tests, the host
#                                           latency figures (#17), the libfabric run (#22)
#   bash scripts/device/session.sh gpu      gdx stream (#21), the mailbox / stream-signal rows beside
#                                           the copy engine and a torch reference (#20), gdx doctor
#   bash scripts/device/session.sh quick    a few minutes: the GPU stage one frame at a time, the
#                                           stream pipeline tests, a short gdx stream, the mailbox
#                                           floors and rows
# Results under $OUT (summary.txt first). Two-GPU tests (two_gpus_*) are skipped by name on a
# one-GPU machine and the summary says so.
. "$(dirname "$0")/env.sh"
BIN=$PWD/.devbin
export CARGO_BIN_EXE_gdx="$BIN/gdx" GDX="$BIN/gdx" GDX_TEST_GPU=0
S="$OUT/summary.txt" LOG="$OUT/summary.txt"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
log "part ${1:-?} date $(date -u +%FT%TZ) host $(hostname) cores $(nproc) gpus $gpus; $("$GDX" --version)"
nvidia-smi -L >>"$S" 2>&1
# cuFile needs udev's ID_FS_USAGE for the file system's device; this VM has no udev database
# (see `gdx doctor`'s cufile finding). Written, and said so.
MAJMIN=$(lsblk -no MAJ:MIN "$(findmnt -no SOURCE -T /tmp)" 2>/dev/null | head -1 | tr -d ' ')
if [ -n "$MAJMIN" ] && ! grep -qs ID_FS_USAGE /run/udev/data/b$MAJMIN; then
  mkdir -p /run/udev/data && printf 'E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=%s\n' "$(findmnt -no FSTYPE -T /tmp)" >>/run/udev/data/b$MAJMIN
  log "udev: wrote ID_FS_USAGE for $MAJMIN (cuFile refuses every file without it)"
fi
timed() { local t=$SECONDS; "$@"; log "   ($1 … took $((SECONDS - t)) s)"; }

case "${1:-}" in
tests)
  skip=(--skip role_)  # roles run only as children of their tests
  if ((gpus < 2)); then skip+=(--skip two_gpus_); log "one GPU: two_gpus_* tests skipped by name"; fi
  log "test binaries, ignored (GPU) tests included"
  for t in "$BIN"/tests/*; do
    [ -x "$t" ] || continue
    echo "--- $t" >>"$OUT/tests.txt"
    GDX_TEST_GPUS=$gpus GDX_MAILBOX_CHILD="$BIN/mailbox_child" timeout 120 "$t" --include-ignored \
      --test-threads=1 "${skip[@]}" >>"$OUT/tests.txt" 2>&1
    log "rc=$? $(basename "$t") $(grep -A0 '^test result' "$OUT/tests.txt" | tail -1 | cut -c1-60)"
  done
  grep -E "FAILED|panicked" "$OUT/tests.txt" | head -20 >>"$S"
  log "host latency (#17)"
  OUT="$OUT/latency" timed bash scripts/device/latency.sh >/dev/null 2>&1
  cat "$OUT/latency/latency-log.txt" >>"$S" 2>/dev/null
  [ "${FABRIC:-1}" = 1 ] || { log "libfabric skipped"; log "part tests done"; exit 0; }
  log "libfabric (#22)"
  OUT="$OUT/fabric" timed timeout 150 bash scripts/device/fabric.sh >/dev/null 2>&1
  cat "$OUT/fabric/summary.txt" >>"$S" 2>/dev/null
  ;;
gpu)
  log "gdx stream (#21)"
  OUT="$OUT/stream" timed timeout 170 bash scripts/device/stream.sh >/dev/null 2>&1
  cat "$OUT/stream/log.txt" >>"$S" 2>/dev/null
  log "mailbox and stream signals (#20) beside the copy engine, same run"
  timeout 60 "$GDX" bench -p host_to_gpu0_mailbox,gpu0_to_host_mailbox,gpu0_async_signal,gpu0_stream_sync,host_to_gpu0_pinned_ce,gpu0_to_host_pinned_ce \
    -s 8,64,256,1024,2048,4096,8192 --export-json "$OUT/mailbox-bench.json" >"$OUT/mailbox-bench.txt" 2>&1
  log "mailbox bench rc=$?"
  grep -vE '^\s*$' "$OUT/mailbox-bench.txt" | tail -60 >>"$S"
  if [ -x "$BIN/mailbox_latency" ]; then
    timeout 45 "$BIN/mailbox_latency" 20000 >"$OUT/mailbox-latency.txt" 2>&1
    log "mailbox_latency rc=$?"; head -40 "$OUT/mailbox-latency.txt" >>"$S"
  fi
  if [ -f scripts/device/mailbox_torch_ref.py ]; then
    timeout 40 python3 scripts/device/mailbox_torch_ref.py >"$OUT/torch-ref.txt" 2>&1
    log "torch reference rc=$?"; cat "$OUT/torch-ref.txt" >>"$S"
  fi
  timeout 60 "$GDX" doctor --verbose >"$OUT/doctor.txt" 2>&1
  log "doctor rc=$?"
  grep -iE "gpu-async|mailbox|stream.mem|gdrdrv|probe-" "$OUT/doctor.txt" | head -20 >>"$S"
  ;;
quick)
  T="$OUT/tests.txt"
  lib=$(ls "$BIN"/tests/gdx-engine-gdx_engine 2>/dev/null | head -1)
  if [ -n "$lib" ]; then
    timeout 60 "$lib" --include-ignored --test-threads=1 pipeline::gpu >>"$T" 2>&1
    log "stage one frame at a time rc=$?"
  fi
  t=$(ls "$BIN"/tests/*pipeline_gpu* 2>/dev/null | head -1)
  if [ -n "$t" ]; then
    timeout 90 "$t" --include-ignored --test-threads=1 >>"$T" 2>&1
    log "pipeline_gpu rc=$?"
  fi
  grep -E "^test |panicked|stream stopped|test result" "$T" | cut -c1-300 | head -20 >>"$S"
  timeout 20 "$GDX" bench --quiet --path host_to_gpu0_pinned_ce --size 4KiB,4MiB,64MiB --duration 300ms \
    --export-json "$OUT/ceiling.json" >/dev/null 2>&1
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); [print("ceiling", x["size_bytes"], round(x.get("bw_gbps") or 0, 2), "GB/s p50", x.get("lat_p50_us")) for x in r["results"]]' "$OUT/ceiling.json" >>"$S" 2>&1
  # Each spec: frame slots policy fps(0: unpaced) duration [extra flags]; STREAMS overrides.
  IFS=';' read -ra specs <<<"${STREAMS:-4MiB 16 block 0 10s;4KiB 64 drop 100000 10s;4KiB 64 block 0 5s;1KiB 64 drop 100000 5s}"
  for spec in "${specs[@]}"; do
    set -- $spec
    fps=(); [ "$4" != 0 ] && fps=(--fps "$4")
    plot=(); [ -n "${PLOT:-}" ] && plot=(--plot "$OUT/stream-$1-$3${6:+-ce}.svg")
    GDX_STREAM_PROFILE=1 timeout 90 "$GDX" stream --gpu 0 --frame "$1" --slots "$2" --policy "$3" "${fps[@]}" --duration "$5" "${@:6}" "${plot[@]}" --json \
      >"$OUT/stream.json" 2>"$OUT/stream.err"
    log "stream $spec rc=$?"; grep -E "profile|error|Error" "$OUT/stream.err" | cut -c1-400 >>"$S"
    python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["report"]; print({k: r.get(k) for k in ("stage","frames_delivered","drops","gbps","frames_per_s","latency")})' "$OUT/stream.json" >>"$S" 2>&1
  done
  rm -f "$OUT/stream.json" "$OUT/stream.err" "$OUT/ceiling.json"
  [ "${MAILBOX:-1}" = 1 ] || { log "mailbox skipped"; log "part quick done"; exit 0; }
  if [ -x "$BIN/mailbox_latency" ]; then
    timeout 120 "$BIN/mailbox_latency" 5000 >"$OUT/mailbox-latency.txt" 2>&1
    log "mailbox_latency rc=$?"
  fi
  timeout 60 "$GDX" bench -p host_to_gpu0_mailbox,gpu0_to_host_mailbox,gpu0_async_signal,gpu0_stream_sync,host_to_gpu0_pinned_ce,gpu0_to_host_pinned_ce \
    -s 8,1024,2048 >"$OUT/mailbox-bench.txt" 2>&1
  log "mailbox bench rc=$?"
  ;;
*)
  echo "usage: $0 tests|gpu|quick" >&2
  exit 2
  ;;
esac
log "part $1 done"
