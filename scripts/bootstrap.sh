#!/usr/bin/env bash
# Install what building gdx needs on a fresh Debian/Ubuntu machine that has only rustup, then
# build. Idempotent: installs only what is missing.
#
#   rdma-mummy-sys (under sideway) builds rdma-core's headers with cmake and runs bindgen,
#   which needs libclang. Nothing vendor-specific (CUDA, NVML, libibverbs) is needed at build
#   time: gdx loads those libraries at run time and reports them as unavailable if absent.
set -euo pipefail

need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v cc >/dev/null 2>&1 || need+=(build-essential)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
# libclang: bindgen looks for libclang.so*; the -dev package provides the unversioned link.
if ! ldconfig -p 2>/dev/null | grep -q 'libclang\(-[0-9.]*\)\?\.so' &&
   ! ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1; then
  need+=(libclang-dev)
fi
command -v ip >/dev/null 2>&1 || need+=(iproute2)
# Not needed to build: gdx loads libibverbs at run time. Installed so the tests exercise the
# real library with zero devices, which is what GPU servers without an RDMA NIC look like.
ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1' || need+=(libibverbs1 ibverbs-providers)

if ((${#need[@]})); then
  echo "bootstrap: installing ${need[*]}" >&2
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

cargo build --release --workspace "$@"
