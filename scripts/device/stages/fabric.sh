#!/usr/bin/env bash
# The fabric part of the GPU-machine run (issue #22), from the repository root, in under two
# minutes: the libfabric providers there (fi_info and gdx's own listing, with FI_HMEM per
# provider), `gdx topo` (EFA marking), the probe-fabric probe, and `gdx bench --path fabric`
# host <-> host and GPU memory (or the reason FI_HMEM is not offered) beside gdx's tcp transport.
# Needs .devbin/gdx and .devbin/fabric (`scripts/device/prepare.sh bins fabric`):
#   carry [".devbin"], command: bash scripts/device/run.sh fabric
# Everything lands under $OUT; summary.txt first.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/gdx-fabric-out}
mkdir -p "$OUT"
GDX=${GDX:-$PWD/.devbin/gdx}
F=$PWD/.devbin/fabric
S="$OUT/summary.txt"
: >"$S"
step() {
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1
  echo "== $name: rc=$? in $(( $(date +%s) - t0 ))s (limit ${limit}s)" >>"$S"
}
# Carried libraries only where the system has none of that name.
L=$(mktemp -d)
for f in "$F"/lib/*; do
  n=$(basename "$f")
  ldconfig -p | grep -q "^[[:space:]]*$n " || ln -s "$f" "$L/$n"
done
export LD_LIBRARY_PATH=$L${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
{
  echo "date: $(date -u +%FT%TZ)"; uname -r; head -2 /etc/os-release; nvidia-smi -L
  echo "system libfabric: $(ldconfig -p | grep -c 'libfabric.so.1 ') entries"
  echo "carried and linked in (the system lacks them): $(ls "$L" | tr '\n' ' ')"
  echo "/sys/class/infiniband: $(ls /sys/class/infiniband 2>&1 | tr '\n' ' ')"
  echo "libcuda references in the libfabric used: $(grep -c libcuda "$(readlink -f "$L/libfabric.so.1" 2>/dev/null || ldconfig -p | awk '$1=="libfabric.so.1"{print $NF; exit}')" 2>/dev/null)"
} >"$OUT/env.txt" 2>&1
step fi_info 8 bash -c "'$F/bin/fi_info' --version; echo '-- FI_RMA RDM'; '$F/bin/fi_info' -c FI_RMA -t FI_EP_RDM | grep -E 'provider|fabric|domain' | paste - - - | sort -u; echo '-- FI_HMEM RDM'; '$F/bin/fi_info' -c FI_HMEM -t FI_EP_RDM | grep -E 'provider|fabric|domain' | paste - - - | sort -u"
step topo 8 "$GDX" topo
# doctor: the fabric check (providers, HMEM, MR mode per entry) and probe-fabric.
step doctor 30 "$GDX" doctor -v
SIZES=8,4KiB,1MiB,1GiB
step bench-fabric-tcp 50 "$GDX" bench --path fabric --provider tcp --size "$SIZES" \
  --duration 100ms --export-json "$OUT/bench-fabric-tcp.json"
step bench-fabric-auto 12 "$GDX" bench --path fabric --size 8,1MiB --duration 100ms \
  --export-json "$OUT/bench-fabric-auto.json"
step bench-fabric-shm 12 "$GDX" bench --path fabric --provider shm \
  --size 8,1MiB --duration 100ms --export-json "$OUT/bench-fabric-shm.json"
{
  echo "-- providers"; grep -vE '^(==|--)' "$OUT/fi_info.txt" | head -20
  echo "-- doctor"; grep -E '^(PASS|WARN|FAIL|SKIP) +(fabric|probe-fabric)' "$OUT/doctor.txt"
  echo "-- topo EFA"; grep -c EFA "$OUT/topo.txt"
  for b in tcp auto shm; do
    echo "-- bench fabric $b"
    grep -E 'note: fabric cases|waived|WAIVED|^ +[0-9]+ +[0-9]+ |^[a-z0-9_]+ \[|passed,' "$OUT/bench-fabric-$b.txt"
  done
} >>"$S" 2>&1
rm -rf "$L"
cat "$S"
