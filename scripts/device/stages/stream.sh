#!/usr/bin/env bash
# gdx stream on the GPU machine (issue #21), in under 2.5 minutes, one run:
#   1. the GPU pipeline tests (gdx-engine, test target pipeline_gpu) with --include-ignored;
#   2. the pinned H2D ceiling measured now (gdx bench, host_to_gpu<G>_pinned_ce at 4 MiB and
#      64 MiB), then gdx stream with 4 MiB frames for 60 s, and the ratio of the two;
#   3. gdx stream with 4 KiB frames at 100k frames/s for 20 s: p50/p99/p99.9, drops, --plot.
# Needs, from the repo root: .devbin/gdx (release) and the GPU test binary under .devbin/tests/
# (the gdx-engine integration test `pipeline_gpu`, e.g. .devbin/tests/pipeline_gpu-<hash>; any
# file matching pipeline_gpu* is taken).
# Writes to $OUT: log.txt (summary), tests.txt, ceiling.json/.txt, stream-4MiB.json/.err,
# stream-4KiB.json/.err, stream-4KiB-latency.svg, stream-4MiB-latency.svg.
# The `stream` stage: bash scripts/device/run.sh stream   (GPU: GDX_TEST_GPU, default 0)
. "$(dirname "$0")/../env.sh"
GDX=${GDX:-.devbin/gdx}
G=${GDX_TEST_GPU:-0}
export GDX_TEST_GPU=$G

log "date: $(date -u +%FT%TZ) host: $(hostname) gpu: $G"
nvidia-smi -L 2>&1 | tee -a "$OUT/log.txt"
"$GDX" --version 2>&1 | tee -a "$OUT/log.txt"

# 1. GPU tests (~10 s).
t=$(ls .devbin/tests/*pipeline_gpu* 2>/dev/null | head -n 1)
if [ -n "$t" ]; then
  log "tests: $t --include-ignored"
  timeout -k 5 30 "$t" --include-ignored --test-threads=1 >"$OUT/tests.txt" 2>&1
  log "tests rc=$?"
  grep -E "^test |test result" "$OUT/tests.txt" | tee -a "$OUT/log.txt"
else
  log "tests: no .devbin/tests/pipeline_gpu* binary: NOT RUN"
fi

# 2. The pinned H2D ceiling, measured in this run (~10 s), then 4 MiB frames for 60 s.
log "ceiling: gdx bench host_to_gpu${G}_pinned_ce"
timeout -k 5 20 "$GDX" bench --quiet --path "host_to_gpu${G}_pinned_ce" --size 4MiB,64MiB \
  --duration 300ms --export-json "$OUT/ceiling.json" >"$OUT/ceiling.txt" 2>&1
log "bench rc=$?"
log "stream: 4 MiB frames, 60 s, block"
timeout -k 5 70 "$GDX" stream --gpu "$G" --frame 4MiB --slots 16 --policy block --duration 60s \
  --json --plot "$OUT/stream-4MiB-latency.svg" >"$OUT/stream-4MiB.json" 2>"$OUT/stream-4MiB.err"
log "stream 4MiB rc=$?"
tail -n 3 "$OUT/stream-4MiB.err" | tee -a "$OUT/log.txt"

# 3. 4 KiB frames at 100k frames/s for 20 s, drop policy so any loss is counted, not hidden.
log "stream: 4 KiB frames at 100k frames/s, 20 s, drop"
timeout -k 5 27 "$GDX" stream --gpu "$G" --frame 4KiB --fps 100000 --slots 512 --policy drop \
  --duration 20s --json --plot "$OUT/stream-4KiB-latency.svg" \
  >"$OUT/stream-4KiB.json" 2>"$OUT/stream-4KiB.err"
log "stream 4KiB rc=$?"
tail -n 3 "$OUT/stream-4KiB.err" | tee -a "$OUT/log.txt"

# Summary: figures, the ratio to the ceiling, and the acceptance lines of issue #21.
python3 - "$OUT" "$G" <<'PY' 2>&1 | tee -a "$OUT/log.txt"
import json, sys, os
out, g = sys.argv[1], sys.argv[2]
def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except Exception as e:
        print(f"{name}: unreadable ({e})")
        return None
ceil = None
b = load("ceiling.json")
if b:
    rows = [r for r in b.get("results", []) if r.get("bw_gbps")]
    for r in rows:
        print(f"bench {r['key']} {r['size_bytes']} B: {r['bw_gbps']:.2f} GB/s (topology ceiling {r.get('ceiling_gbps')})")
    four = [r["bw_gbps"] for r in rows if r["size_bytes"] == 4 << 20]
    ceil = max([r["bw_gbps"] for r in rows], default=None)
    if four:
        print(f"pinned H2D measured at 4 MiB: {four[0]:.2f} GB/s; best size: {ceil:.2f} GB/s")
for name, label in (("stream-4MiB.json", "4 MiB x 60 s"), ("stream-4KiB.json", "4 KiB @ 100k/s x 20 s")):
    s = load(name)
    if not s:
        continue
    r = s["report"]; l = r.get("latency") or {}
    print(f"{label}: {r['gbps']:.2f} GB/s, {r['frames_per_s']:.0f} frames/s, "
          f"{r['frames_delivered']}/{r['frames_produced']} delivered, drops {r['drops']}, "
          f"p50 {l.get('p50_us', float('nan')):.1f} us p99 {l.get('p99_us', float('nan')):.1f} us "
          f"p99.9 {l.get('p999_us', float('nan')):.1f} us max {l.get('max_us', float('nan')):.1f} us, "
          f"CPU {s.get('cpu_s_per_gb')} s/GB, stage: {r['stage']}")
    if name == "stream-4MiB.json" and ceil:
        ratio = r["gbps"] / ceil
        print(f"  ratio to the pinned H2D ceiling measured in this run: {ratio:.3f} "
              f"({'meets' if ratio >= 0.9 and r['drops'] == 0 else 'MISSES'} >= 0.9x with zero drops)")
    if name == "stream-4KiB.json":
        ok = l.get("p99_us", 1e9) <= 25 and r["drops"] == 0
        print(f"  {'meets' if ok else 'MISSES'} p99 <= 25 us with zero drops")
PY
ls -la "$OUT" | tee -a "$OUT/log.txt"
