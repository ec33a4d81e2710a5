#!/bin/bash
# Puts what the GPU machine needs to use libfabric without it installed there into .devbin/fabric/
# (or DEST): Debian's libfabric.so.1 and the libraries it links that the GPU machine may lack
# (lib/), and fi_info (bin/). About 2.7 MB, so it fits the 64 MiB carry beside .devbin/gdx and
# the test binaries of `scripts/device/prepare.sh bins` (`prepare.sh fabric` runs this). The
# `fabric` stage links in only the libraries the system lacks (never shadowing its rdma-core).
# Then, through the device tool: carry [".devbin"], command: bash scripts/device/run.sh fabric
set -euo pipefail
cd "$(dirname "$0")/.."
P=${1:-.devbin/fabric}
X=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$X")"
grep -qx '/.devbin/' "$X" 2>/dev/null || echo '/.devbin/' >>"$X"
rm -rf "$P" && mkdir -p "$P/lib" "$P/bin"
# libfabric.so.1's DT_NEEDED that rdma-core on the GPU machine does not provide (libibverbs,
# librdmacm and libnl are installed there; see shared/reference/gpu-machine.md).
for l in libfabric.so.1 libefa.so.1 libpsm_infinipath.so.1 libpsm2.so.2 libinfinipath.so.4 \
  libnuma.so.1 libatomic.so.1 libuuid.so.1; do
  f=$(ldconfig -p | awk -v l="$l" '$1 == l { print $NF; exit }')
  [ -n "$f" ] || { echo "missing $l (apt-get install libfabric1 libfabric-bin)" >&2; exit 1; }
  cp -L "$f" "$P/lib/"
done
strip --strip-unneeded "$P"/lib/* 2>/dev/null || true
cp -L "$(command -v fi_info)" "$P/bin/"
du -sh "$P"
