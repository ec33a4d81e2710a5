#!/usr/bin/env bash
# Issue #17 figures on the GPU machine (host transports only, no GPU used): 8 B shm/tcp write +
# completion beside the same-run latency floors (fresh and --prepared transfers), the 8 B message rate over shm with --window 64,
# a 1,000 x 4 KiB shm batch beside single-thread memcpy of 4 MiB, and large-transfer bandwidth.
# Each latency block runs 3 times (report the median). Run from the repository root with the
# release binary at .devbin/gdx; everything goes to $OUT; about 90 s in all. With GDX_OLD=<an
# older gdx binary>, the large transfers (and one block of each small figure) also run with
# it, alternating with the new one (the small and window figures too, three pairs each), so
# "unchanged" and "better" are judged within one run (about 90 s more).
. "$(dirname "$0")/../env.sh"
LOG="$OUT/latency-log.txt"
GDX=${GDX:-.devbin/gdx}
GDX_OLD=${GDX_OLD:-}
# Each run gets its own time limit; a failed or timed-out run is logged, the rest still run.
# `WITH=<binary> bench ...` runs another binary (BIN is run.sh's folder of binaries).
bench() {
  local name=$1
  shift
  timeout 25 "${WITH:-$GDX}" bench "$@" >"$OUT/$name.txt" 2>&1
  local rc=$?
  echo "rc=$rc" >>"$OUT/$name.txt"
  log "$name: rc=$rc ($*)"
  grep -E "latency floors|^ +[0-9]+ +[0-9]+ |× the|Mop/s per op|memcpy of the same" "$OUT/$name.txt" \
    | sed "s/^/  [$name] /" >>"$OUT/latency-log.txt"
}
log "date $(date -u +%FT%TZ) host $(hostname) cores $(nproc); $("$GDX" --version 2>&1)"
for i in 1 2 3; do
  bench "small-$i" --path shm,tcp --size 8,4KiB --duration 300ms
done
for i in 1 2 3; do
  bench "prepared-$i" --path shm,tcp --size 8,4KiB --duration 300ms --prepared
done
for i in 1 2 3; do
  bench "window-$i" --path shm --size 8 --window 64 --duration 300ms
done
for i in 1 2 3; do
  bench "memcpy-$i" --path memcpy --size 4MiB --duration 200ms
  bench "batch-$i" --path shm --size 4KiB --batch 1000 --duration 300ms
done
if [ -n "$GDX_OLD" ]; then
  log "old binary: $("$GDX_OLD" --version 2>&1)"
  # Small figures paired too: old then new, three times, so each new figure has an old one
  # measured seconds before it.
  for i in 1 2 3; do
    WITH=$GDX_OLD bench "old-small-$i" --path shm,tcp --size 8,4KiB --duration 300ms
    bench "pair-small-$i" --path shm,tcp --size 8,4KiB --duration 300ms
    WITH=$GDX_OLD bench "old-window-$i" --path shm --size 8 --window 64 --duration 300ms
    bench "pair-window-$i" --path shm --size 8 --window 64 --duration 300ms
  done
  WITH=$GDX_OLD bench old-batch --path shm --size 4KiB --batch 1000 --duration 300ms
  for i in 1 2 3; do
    WITH=$GDX_OLD bench "old-large-$i" --path shm,tcp --size 1MiB,256MiB --duration 500ms
    bench "large-$i" --path shm,tcp --size 1MiB,256MiB --duration 500ms
  done
else
  bench large --path shm,tcp --size 1MiB,256MiB --duration 500ms
fi
log "done"
