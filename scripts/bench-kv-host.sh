#!/usr/bin/env bash
# Issue 51's host-memory rows on this machine (no GPU needed): a venv with NIXL, Mooncake TE and
# gdx's wheel, then scripts/bench-kv-host.py (KV blocks and single buffers in numpy memory, moved
# between two processes by each library beside a memcpy floor, bytes checked).
#
#   bash scripts/bench-kv-host.sh [--gdx-wheel WHL] [bench-kv-host.py options: --quick, --only ROWS]
#
# WHL defaults to target/wheels/gdx-*.whl, built first when missing (GDX_PY_WHEEL_ONLY=1
# scripts/test-python.sh). Environment: PYTHON (3.11 or later; default python3), GDX_KV_VENV (the
# venv, default target/kv-host-venv), OUT (results, default target/kv-host: kv-host.md, kv-host.json,
# logs/). The peers are their PyPI CUDA 13 builds: where no CUDA driver is installed, their
# libcuda.so.1 is a stub built here whose every function returns CUDA_ERROR_NO_DEVICE (100), and
# libcudart.so.13 comes from the nvidia-cuda-runtime wheel; neither is used on host memory.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${GDX_KV_VENV:-target/kv-host-venv}
OUT=${OUT:-target/kv-host}
GDX_WHEEL=
if [[ ${1:-} == --gdx-wheel ]]; then
  GDX_WHEEL=$2
  shift 2
fi
if [[ -z $GDX_WHEEL ]]; then
  ls target/wheels/gdx-*.whl >/dev/null 2>&1 || GDX_PY_WHEEL_ONLY=1 bash scripts/test-python.sh
  GDX_WHEEL=$(ls target/wheels/gdx-*.whl | head -1)
fi
[[ -x $VENV/bin/python ]] || "$PYTHON" -m venv "$VENV"
PY=$VENV/bin/python
# --no-deps: nixl's meta package requires torch and both CUDA builds; the host rows need neither.
"$PY" -c 'import numpy, nixl_cu13, mooncake.engine' 2>/dev/null ||
  "$PY" -m pip install -q --disable-pip-version-check --no-deps numpy nixl==1.5.1 nixl-cu13==1.5.1 \
    mooncake-transfer-engine-cuda13==0.3.14 'nvidia-cuda-runtime==13.*'
"$PY" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall "$GDX_WHEEL"

SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
LIBS=$(dirname "$(ls "$SITE"/nvidia/*/lib/libcudart.so.13 | head -1)")
if ! grep -qE '^[[:space:]]+libcuda\.so\.1 ' <<<"$(ldconfig -p 2>/dev/null || true)"; then
  STUB=$VENV/stub-libcuda
  if [[ ! -f $STUB/libcuda.so.1 ]]; then
    mkdir -p "$STUB"
    # Every driver function the peers' libraries link against, each returning 100.
    nm -D --undefined-only "$SITE"/mooncake/*.so "$SITE"/nixl_cu13.libs/ucx/*.so* 2>/dev/null |
      awk '{print $2}' | grep -E '^cu[A-Z]' | sed 's/@.*//' | sort -u |
      awk '{print "int " $1 "(void) { return 100; }"}' >"$STUB/stub.c"
    cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$STUB/libcuda.so.1" "$STUB/stub.c"
  fi
  LIBS=$LIBS:$STUB
fi
export LD_LIBRARY_PATH="$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$OUT"
GDX_COMMIT=${GDX_COMMIT:-$(git rev-parse --short=12 HEAD)} "$PY" scripts/bench-kv-host.py --out "$OUT" "$@"
