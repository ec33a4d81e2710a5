#!/usr/bin/env bash
# Builds the Python package (crates/python, `import gdx`) into a venv and runs its pytest suite.
# Idempotent: reuses the venv and installs only what is missing.
#
#   scripts/test-python.sh                 # venv in target/pyenv, release build, full suite
#   scripts/test-python.sh -k errors -x    # extra arguments go to pytest
#   GDX_PY_WHEEL_ONLY=1 scripts/test-python.sh   # only build the abi3 wheel (target/wheels/)
#
# Environment: PYTHON (the interpreter for the venv, default python3; 3.11 or later),
# GDX_PYENV (the venv, default target/pyenv), GDX_PY_PROFILE (dev|release; default dev for the
# tests, which time nothing and then reuse what `cargo test` built, release for the wheel).
#
# The wheel is abi3 for CPython >= 3.11: the same file installs on 3.11, 3.12 and later, so it can
# be carried to another machine (`pip install target/wheels/gdx-*.whl`).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${GDX_PYENV:-target/pyenv}
if [[ -n "${GDX_PY_WHEEL_ONLY:-}" ]]; then
  PROFILE=${GDX_PY_PROFILE:-release}
else
  PROFILE=${GDX_PY_PROFILE:-dev}
fi

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "test-python: $PYTHON is missing or older than 3.11 (the buffer protocol joined the" \
    "stable ABI in 3.11); set PYTHON=python3.11 or later" >&2
  exit 2
fi
if [[ ! -x "$VENV/bin/python" ]]; then
  "$PYTHON" -m venv "$VENV" || {
    echo "test-python: cannot create a venv; on Debian/Ubuntu: apt-get install python3-venv" >&2
    exit 2
  }
fi
PY="$VENV/bin/python"
"$PY" -c 'import maturin, pytest, numpy, safetensors' 2>/dev/null ||
  "$PY" -m pip install -q --disable-pip-version-check maturin pytest numpy safetensors

# maturin finds the workspace's Cargo.lock and target/; the pyo3 build script must see the venv's
# interpreter, not whatever python3 is first on PATH.
rm -f target/wheels/gdx-*.whl
PYO3_PYTHON="$PWD/$PY" "$VENV/bin/maturin" build --quiet --profile "$PROFILE" \
  -m crates/python/Cargo.toml --interpreter "$PY" --out target/wheels
wheel=$(ls target/wheels/gdx-*.whl)
echo "test-python: built $wheel"
if [[ -n "${GDX_PY_WHEEL_ONLY:-}" ]]; then
  exit 0
fi
"$PY" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$wheel"

# Run from the tests' folder so `import gdx` finds the installed wheel, not the source tree.
cd crates/python/tests
exec "../../../$PY" -m pytest -q -p no:cacheprovider "$@"
