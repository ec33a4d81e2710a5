#!/usr/bin/env bash
# The `quick` stage of scripts/device/run.sh, a few minutes: the GPU stage one frame at a time,
# the stream pipeline tests, a pinned-copy ceiling, short gdx stream runs (STREAMS: specs
# `frame slots policy fps(0: unpaced) duration [flags]`, `;`-separated; PLOT=1 adds SVGs), then
# the mailbox floors and rows (MAILBOX=0 leaves them out). Results under $OUT; lines in $S.
. "$(dirname "$0")/../env.sh"
BIN=${BIN:-$PWD/.devbin}
GDX=${GDX:-$BIN/gdx}
S=${S:-$OUT/summary.txt} LOG=${LOG:-$OUT/log.txt}
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
[ "${MAILBOX:-1}" = 1 ] || { log "mailbox skipped"; exit 0; }
if [ -x "$BIN/mailbox_latency" ]; then
  timeout 120 "$BIN/mailbox_latency" 5000 >"$OUT/mailbox-latency.txt" 2>&1
  log "mailbox_latency rc=$?"
fi
timeout 60 "$GDX" bench -p host_to_gpu0_mailbox,gpu0_to_host_mailbox,gpu0_async_signal,gpu0_stream_sync,host_to_gpu0_pinned_ce,gpu0_to_host_pinned_ce \
  -s 8,1024,2048 >"$OUT/mailbox-bench.txt" 2>&1
log "mailbox bench rc=$?"
