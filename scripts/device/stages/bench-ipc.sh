#!/usr/bin/env bash
# Issue 44's tests and benchmark on the GPU machine: the Python GPU tests for foreign GPU memory
# (test_foreign_gpu.py, test_cuda.py), then bench_ipc.py (torch/numpy/Agent.alloc memory moved
# between two processes on one GPU beside torch's IPC copy_ and pinned copies, same run).
#
# Built here (no Rust there), then carried:
#   GDX_PY_WHEEL_ONLY=1 bash scripts/test-python.sh           # target/wheels/gdx-*.whl (abi3)
#   run(carry=["target/wheels"], command="bash scripts/device/run.sh ipc")
# Results: $OUT/bench-ipc-tests.txt, $OUT/bench-ipc.txt, $OUT/bench-ipc.jsonl.
. "$(dirname "$0")/../env.sh"
PYLIB=$(mktemp -d /tmp/gdx-pylib.XXXX)
wheel=$(ls target/wheels/gdx-*.whl 2>/dev/null | head -1)
if [ -z "$wheel" ]; then
  echo "bench-ipc: needs target/wheels/gdx-*.whl carried (see the top of this script)" >&2
  exit 2
fi
python3 -m zipfile -e "$wheel" "$PYLIB"
export PYTHONPATH="$PYLIB${PYTHONPATH:+:$PYTHONPATH}"
(cd crates/python/tests && python3 -m pytest -q -p no:cacheprovider test_foreign_gpu.py test_cuda.py -rs) \
  >"$OUT/bench-ipc-tests.txt" 2>&1
log "python GPU tests: rc=$? ($(tail -1 "$OUT/bench-ipc-tests.txt"))"
python3 "$(dirname "$0")/../bench_ipc.py" --out "$OUT" "$@" 2>&1 | tee "$OUT/bench-ipc.txt"
rc=${PIPESTATUS[0]}
rm -rf "$PYLIB"
exit "$rc"
