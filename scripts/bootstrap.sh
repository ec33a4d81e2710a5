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
# libclang: bindgen dlopens `libclang.so` or `libclang-N.so*` (clang-sys's search), never
# `libclang-cpp.so*` (the C++ API, which Debian installs with llvm and which bindgen cannot use).
# Ask for exactly what bindgen loads; a broader glob once decided libclang was present on a
# machine that only had libclang-cpp14, and bindgen then panicked.
have_libclang() {
  if [[ -n "${LIBCLANG_PATH:-}" ]] && compgen -G "${LIBCLANG_PATH}/libclang*.so*" >/dev/null; then
    ls "${LIBCLANG_PATH}"/libclang*.so* 2>/dev/null | grep -qv 'libclang-cpp' && return 0
  fi
  ldconfig -p 2>/dev/null | awk '{print $1}' | grep -Eq '^libclang(-[0-9.]+)?\.so(\.[0-9.]+)?$' && return 0
  ls /usr/lib/llvm-*/lib/ 2>/dev/null | grep -Eq '^libclang(-[0-9.]+)?\.so(\.[0-9.]+)?$' && return 0
  return 1
}
have_libclang || need+=(libclang-dev)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
# Not needed to build: gdx loads libibverbs at run time. Installed so the tests exercise the
# real library with zero devices, which is what GPU servers without an RDMA NIC look like.
ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1' || need+=(libibverbs1 ibverbs-providers)
# Not needed to build either: gdx-cluster's tests start a real etcd (Debian's etcd-server) on a
# loopback port, so they exercise real leases and watches.
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
# The TLS tests make throwaway certificates with the openssl command.
command -v openssl >/dev/null 2>&1 || need+=(openssl)
# Needed to build: etcd-client's build script compiles etcd's .proto files with protoc.
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
# Same for libfabric (loaded at run time by gdx-fabric): its tcp provider on loopback runs the
# fabric RMA tests for real; fi_info (libfabric-bin) is what doctor's advice points to.
ldconfig -p 2>/dev/null | grep -q 'libfabric\.so\.1' || need+=(libfabric1 libfabric-bin)

if ((${#need[@]})); then
  source "$(dirname "${BASH_SOURCE[0]}")/lib/apt.sh"
  apt_install bootstrap "${need[@]}" || exit 1
fi

cargo build --release --workspace "$@"
