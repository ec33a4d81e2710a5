#!/usr/bin/env bash
# Instructions per small shm transfer on the initiator's thread, counted by callgrind: a
# figure that does not move with the VM's load or its slow phases (issue #17; BENCHMARKS.md,
# fifteenth session), for judging a change to the hot path before timing it.
#
#   bash scripts/dev/instr-count.sh [REPO]        # default: this checkout; needs valgrind
#   SHM_LAT_PREPARED=1 bash scripts/dev/instr-count.sh
#
# It copies REPO's crates into a scratch tree and changes two things there, never in REPO:
# rustix uses libc (its own vDSO parser faults under valgrind), and a waiter spins for 5 s
# before it sleeps (valgrind runs one thread at a time, so a 50 µs spin would hand most
# completions to the worker thread and count another path). Spinning is counted too: read the
# named functions' inclusive counts, not the total.
set -euo pipefail
REPO=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
N=${N:-20000}
WORK=${WORK:-/tmp/gdx-instr}
command -v valgrind >/dev/null || { echo "instr-count: needs valgrind (apt-get install valgrind)" >&2; exit 2; }
mkdir -p "$WORK"
rm -rf "$WORK/tree" && mkdir "$WORK/tree"
cp -r "$REPO/crates" "$REPO/Cargo.toml" "$REPO/Cargo.lock" "$WORK/tree/"
cd "$WORK/tree"
sed -i 's/"process", "rand"\]/"process", "rand", "use-libc"]/' crates/engine/Cargo.toml
sed -i 's/const WAIT_SPIN: Duration = Duration::from_micros(50);/const WAIT_SPIN: Duration = Duration::from_secs(5);/' \
  crates/engine/src/transfer/handle.rs
grep -q use-libc crates/engine/Cargo.toml && grep -q 'from_secs(5)' crates/engine/src/transfer/handle.rs ||
  { echo "instr-count: the code moved; update the two edits above" >&2; exit 2; }
CARGO_TARGET_DIR="$WORK/target" cargo build -q --release -p gdx-bench --example shm_lat
rm -f "$WORK"/cg.out*
valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$WORK/cg.out" \
  "$WORK/target/release/examples/shm_lat" 8 "$N" >"$WORK/valgrind.log" 2>&1
callgrind_annotate --inclusive=no --auto=yes "$WORK"/cg.out-01 >"$WORK/annotated.txt" 2>/dev/null
python3 - "$N" "$WORK/annotated.txt" <<'PY'
import re, sys
n = int(sys.argv[1])
calls = {}
for line in open(sys.argv[2]):
    m = re.match(r'\s*([\d,]+)\s+\([^)]*\)\s+=> \S+?:(.*?) \(\d[\d,]*x\)', line)
    if m:
        name = m.group(2).split(' [')[0]
        calls[name] = calls.get(name, 0) + int(m.group(1).replace(',', ''))
print(f"instructions per transfer ({n} transfers of 8 B, inclusive, initiator's thread):")
for key in ['Transfer::write', 'Peer::submit', 'Peer::plan', '>::submit_new',
            'NewTransfer>::into_state', 'XferState>::reset', 'Worker>::post_one',
            'Worker>::stage_op', 'PreparedTransfer::post', 'Worker>::reap', 'Done::finish',
            'XferState::finish_locked']:
    v = sum(c for k, c in calls.items() if key in k)
    if v:
        print(f"  {v / n:8.0f}  {key}")
PY
