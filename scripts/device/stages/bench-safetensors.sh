#!/usr/bin/env bash
# Issue 45's benchmark on the GPU machine: a 4 GiB safetensors file (256 x 16 MiB) loaded to GPU 0
# by safetensors.torch.load_file and by gdx (gdx.load_safetensors, gdx cp on each path), warm and
# cold, in one run, each figure with its ratio to safetensors, then the issue's checks
# (scripts/device/bench_safetensors.py says what each row is).
#
# Built here (no Rust there), then carried:
#   PKGS="-p gdx" bash scripts/device/prepare.sh bins         # .devbin/gdx (release)
#   GDX_PY_WHEEL_ONLY=1 bash scripts/test-python.sh           # target/wheels/gdx-*.whl (abi3)
#   run(carry=[".devbin", "target/wheels"], command="bash scripts/device/run.sh safetensors")
# The GPU machine has torch and safetensors; the wheel is unpacked beside $OUT, not installed.
# Results: $OUT/bench-safetensors.txt (the table) and $OUT/bench-safetensors.jsonl (one row a line).
# GDX_BENCH_DIR: the scratch folder (default /tmp/gdx-st-bench; it must be on a disk, not tmpfs,
# for the cold rows to mean anything). Extra arguments go to bench_safetensors.py (--reps N ...).
. "$(dirname "$0")/../env.sh"
BIN=${BIN:-.devbin}
DIR=${GDX_BENCH_DIR:-/tmp/gdx-st-bench}
PYLIB=$(mktemp -d /tmp/gdx-pylib.XXXX)
wheel=$(ls target/wheels/gdx-*.whl 2>/dev/null | head -1)
if [ -z "$wheel" ] || [ ! -x "$BIN/gdx" ]; then
  echo "bench-safetensors: needs $BIN/gdx and target/wheels/gdx-*.whl carried (see the top of this script)" >&2
  exit 2
fi
python3 -m zipfile -e "$wheel" "$PYLIB"
log "bench-safetensors: $(nvidia-smi -L | head -1); wheel $(basename "$wheel"); scratch $DIR"
# First the loader's correctness on this GPU: the Python checkpoint tests, GPU case included
# (gdx's tensors equal safetensors.torch's, bf16 too), where pytest is installed.
if python3 -c 'import pytest' 2>/dev/null; then
  (cd crates/python/tests && PYTHONPATH="$PYLIB" python3 -m pytest -q -p no:cacheprovider test_safetensors.py) \
    >"$OUT/bench-safetensors-tests.txt" 2>&1
  log "test_safetensors.py: rc=$? ($(tail -1 "$OUT/bench-safetensors-tests.txt"))"
else
  log "test_safetensors.py: not run (no pytest here)"
fi
PYTHONPATH="$PYLIB${PYTHONPATH:+:$PYTHONPATH}" python3 "$(dirname "$0")/../bench_safetensors.py" \
  --gdx "$BIN/gdx" --dir "$DIR" --out "$OUT" "$@" 2>&1 | tee "$OUT/bench-safetensors.txt"
rc=${PIPESTATUS[0]}
rm -rf "$PYLIB"
exit "$rc"
