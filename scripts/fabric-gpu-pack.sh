#!/bin/bash
# Builds target/gpu-fabric/: what the GPU machine needs to run the fabric tests and benchmark
# without libfabric installed there (Debian's libfabric.so.1 and the libraries it links, fi_info,
# the stripped test binaries and benchmark, and run.sh). Then, through the device tool:
#   carry ["target/gpu-fabric"], command: bash target/gpu-fabric/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
P=target/gpu-fabric
rm -rf "$P" && mkdir -p "$P/lib" "$P/bin"
for l in libfabric.so.1 libefa.so.1 libpsm_infinipath.so.1 libpsm2.so.2 libinfinipath.so.4 \
  libnuma.so.1 libatomic.so.1 libuuid.so.1; do
  f=$(ldconfig -p | awk -v l="$l" '$1 == l { print $NF; exit }')
  [ -n "$f" ] || { echo "missing $l (apt-get install libfabric1 libfabric-bin)" >&2; exit 1; }
  cp -L "$f" "$P/lib/"
done
cp -L "$(command -v fi_info)" "$P/bin/"
CARGO_INCREMENTAL=0 cargo build --release -p gdx-engine --example fabric_vs_tcp
strip -o "$P/bin/fabric_vs_tcp" target/release/examples/fabric_vs_tcp
for t in providers tcp_two_process shm_two_process; do
  exe=$(CARGO_INCREMENTAL=0 cargo test -p gdx-fabric --test "$t" --no-run --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
  strip -o "$P/bin/$t" "$exe"
done
cat >"$P/run.sh" <<'RUN'
#!/bin/bash
# On the GPU machine, from the repository root; results also under $OUT.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
G=$PWD/target/gpu-fabric
export LD_LIBRARY_PATH=$G/lib
OUT=${OUT:-/tmp}
{
  echo "== host"; uname -a; head -2 /etc/os-release; nvidia-smi -L
  echo "== system libfabric"; ldconfig -p | grep -i fabric || echo "none"
  echo "== /sys/class/infiniband"; ls /sys/class/infiniband 2>&1
  echo "== carried libfabric"; "$G/bin/fi_info" --version
  echo "== FI_RMA RDM providers"; "$G/bin/fi_info" -c FI_RMA -t FI_EP_RDM 2>&1 | grep -E "provider|fabric|domain" | paste - - - | sort -u
  echo "== FI_HMEM RDM providers"; "$G/bin/fi_info" -c FI_HMEM -t FI_EP_RDM 2>&1 | grep -E "provider|domain" | paste - - | sort -u
  echo "== libcuda references in the carried libfabric"; grep -c libcuda "$G/lib/libfabric.so.1" || true
} 2>&1 | tee "$OUT/env.txt"
cd "$G/bin"
for t in providers tcp_two_process shm_two_process; do
  ./$t --test-threads=1 2>&1 | grep -E "^test |test result|panicked" | tee "$OUT/$t.txt"
done
(umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >/tmp/gdx-fabric-secret)
GDX_SECRET_FILE=/tmp/gdx-fabric-secret timeout 300 ./fabric_vs_tcp 2>&1 | tee "$OUT/fabric_vs_tcp.txt"
RUN
chmod +x "$P/run.sh"
du -sh "$P"
