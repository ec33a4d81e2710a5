#!/usr/bin/env bash
# Paired host-transport runs of several gdx binaries on one machine (scripts/device/paired.py):
# the release binary against builds that each drop one latency heuristic, and against an older
# release. The binaries are built here and carried xz-compressed (six fit the 64 MiB carry):
#   .devbin-paired/gdx-<name>.xz, gdx-base.xz first (the reference)
#   run(carry=[".devbin-paired"], command="bash scripts/device/run.sh paired")
# Results: $OUT/rows/paired.txt (shm and tcp, 8 B to 64 MiB) and $OUT/window/paired.txt (8 B
# over shm with 64 in flight), ROUNDS rounds each (default 6).
. "$(dirname "$0")/../env.sh"
D=$(mktemp -d /tmp/gdx-paired.XXXX)
bins=()
for f in .devbin-paired/gdx-base.xz .devbin-paired/gdx-*.xz; do
  n=$(basename "$f" .xz)
  [ -x "$D/$n" ] && continue
  xz -dc "$f" >"$D/$n" && chmod +x "$D/$n"
  bins+=("${n#gdx-}=$D/$n")
done
log "paired: ${bins[*]}; host $(hostname) cores $(nproc)"
python3 "$(dirname "$0")/../paired.py" --rounds "${ROUNDS:-6}" --out "$OUT/rows" "${bins[@]}" 2>"$OUT/rows.err"
log "rows rc=$?"
python3 "$(dirname "$0")/../paired.py" --rounds "${ROUNDS:-6}" --out "$OUT/window" "${bins[@]}" \
  -- --path shm --size 8 --window 64 --duration 300ms 2>"$OUT/window.err"
log "window rc=$?"
rm -rf "$D"
