#!/usr/bin/env bash
# Regenerate the committed PTX from its .cu: crates/sys/kernels/gdx_kernels.ptx (mailbox, stream
# memory operations) and crates/stream/kernels/stream_checksum.ptx (`gdx stream`'s kernel).
#
# gdx never runs nvcc at build time: the PTX is committed and loaded with cuModuleLoadData at
# run time (the driver JIT-compiles it for the GPU it finds). This script fetches nvcc 13.0 from
# PyPI (NVIDIA's wheels; no CUDA install needed), unpacks it into a cache directory and compiles.
# The target is compute_75 so the PTX loads on every GPU from Turing on (the H200 is sm_90); PTX
# ISA 9.0 (CUDA 13.0) needs a 13.0 driver or newer.
#
#   scripts/gen-ptx.sh            # regenerate in place
#   scripts/gen-ptx.sh --check    # regenerate into a temp file and fail if it differs (CI drift check)
#
# GDX_NVCC_CACHE (default ~/.cache/gdx-nvcc13) holds the unpacked wheels between runs.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
sources=("$root/crates/sys/kernels/gdx_kernels.cu" "$root/crates/stream/kernels/stream_checksum.cu")
cache="${GDX_NVCC_CACHE:-$HOME/.cache/gdx-nvcc13}"
nvcc="$cache/nvidia/cu13/bin/nvcc"

if [ ! -x "$nvcc" ]; then
  mkdir -p "$cache/wheels"
  python3 -m pip download --no-deps --dest "$cache/wheels" \
    'nvidia-cuda-nvcc==13.0.*' 'nvidia-cuda-crt==13.0.*' \
    'nvidia-cuda-runtime==13.0.*' 'nvidia-nvvm==13.0.*'
  for w in "$cache"/wheels/*.whl; do
    (cd "$cache" && python3 -m zipfile -e "$w" .)
  done
  chmod +x "$cache"/nvidia/cu13/bin/* "$cache"/nvidia/cu13/nvvm/bin/* 2>/dev/null || true
fi

status=0
for src in "${sources[@]}"; do
  out="${src%.cu}.ptx"
  target="$out"
  if [ "${1:-}" = "--check" ]; then
    target="$(mktemp --suffix=.ptx)"
  fi
  PATH="$cache/nvidia/cu13/bin:$PATH" nvcc -ptx -arch=compute_75 "$src" -o "$target"
  if [ "$target" != "$out" ]; then
    if ! diff -q "$out" "$target" >/dev/null; then
      echo "$(basename "$out") is stale: run scripts/gen-ptx.sh and commit the result" >&2
      diff -u "$out" "$target" | head -40 >&2
      status=1
    else
      echo "$(basename "$out") matches $(basename "$src")"
    fi
    rm -f "$target"
  fi
done
exit $status
