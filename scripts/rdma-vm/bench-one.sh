#!/usr/bin/env bash
# Inside one RDMA VM (scripts/bench-rdma.sh): perftest and gdx on rxe0, the same sizes, in one
# boot, each gdx figure printed as a ratio to perftest's from this boot. Not a test: figures under
# TCG emulation are only meaningful as ratios.
set -uo pipefail
SIZES=(8 65536 1048576 8388608)
IP=$GDX_VM_SELF_IP
out=${GDX_BENCH_OUT:-/tmp}
perf() { # perf TOOL SIZE ITERS -> the tool's result line
  local tool=$1 size=$2 n=$3
  "$tool" -d rxe0 -x 1 -s "$size" -n "$n" -F >/dev/null 2>&1 &
  local srv=$!
  sleep 1.5
  "$tool" -d rxe0 -x 1 -s "$size" -n "$n" -F "$IP" 2>/dev/null | awk -v s="$size" '$1 == s {print}'
  wait "$srv" 2>/dev/null
}
iters() { case $1 in 8) echo 2000 ;; 65536) echo 1000 ;; 1048576) echo 200 ;; *) echo 40 ;; esac; }

echo "perftest (rdma-core's perftest $(dpkg-query -W -f='${Version}' perftest 2>/dev/null)), rxe0, one boot, accel $GDX_VM_ACCEL"
declare -A WBW RBW
for s in "${SIZES[@]}"; do
  line=$(perf ib_write_bw "$s" "$(iters "$s")"); WBW[$s]=$(awk '{print $4}' <<<"$line")
  line=$(perf ib_read_bw "$s" "$(iters "$s")"); RBW[$s]=$(awk '{print $4}' <<<"$line")
  echo "  ib_write_bw $s B: ${WBW[$s]} MB/s   ib_read_bw: ${RBW[$s]} MB/s"
done
line=$(perf ib_write_lat 8 2000)
LAT=$(awk '{print $6}' <<<"$line") # t_typical, half a round trip
echo "  ib_write_lat 8 B: t_typical ${LAT} us (half a round trip)"

"$GDX" bench --path rdma --size 8,64KiB,1MiB,8MiB --json >"$out/gdx-rdma.json" 2>/dev/null
python3 - "$out/gdx-rdma.json" "$LAT" "${WBW[65536]}" "${WBW[1048576]}" "${WBW[8388608]}" \
  "${RBW[65536]}" "${RBW[1048576]}" "${RBW[8388608]}" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
lat = float(sys.argv[2])
wbw = dict(zip([65536, 1 << 20, 8 << 20], map(float, sys.argv[3:6])))
rbw = dict(zip([65536, 1 << 20, 8 << 20], map(float, sys.argv[6:9])))
rows = {(x["key"], x["size_bytes"]): x for x in r["results"] if x["path"] == "rdma"}
print()
print("| row | gdx | perftest (same boot) | ratio |")
print("|---|---|---|---|")
w8 = rows[("host_to_remote_host_rdma_write", 8)]
print(f"| 8 B write, round trip p50 | {w8['lat_p50_us']:.1f} us | 2 x ib_write_lat t_typical = {2*lat:.1f} us | {w8['lat_p50_us']/(2*lat):.2f}x |")
for key, ref, name in [("host_to_remote_host_rdma_write", wbw, "write"), ("remote_host_to_host_rdma_read", rbw, "read")]:
    for size, mbs in ref.items():
        x = rows[(key, size)]
        g = x["bw_gbps"] * 1000
        v = "verified" if x.get("verified") else "NOT verified"
        print(f"| {size >> 10} KiB {name} | {g:.1f} MB/s ({v}) | ib_{name}_bw {mbs:.1f} MB/s | {g/mbs:.2f}x |")
PY

echo
echo "gdx block list (1,000 x 16 KiB scattered, one transfer; scripts/rdma-vm/gdx_blocks.py), same boot:"
timeout 600 "$PYENV/bin/python" scripts/rdma-vm/gdx_blocks.py 2>/dev/null | grep '^{' >"$out/gdx-blocks.jsonl" ||
  echo "  gdx blocks: did not finish (exit $?)"
echo
echo "Mooncake Transfer Engine ($("$MCENV/bin/pip" show mooncake-transfer-engine-non-cuda 2>/dev/null | awk '/^Version/ {print $2}'), rdma on rxe0, two processes), same boot:"
MC_GID_INDEX=1 MC_WORKERS_PER_CTX=1 timeout 600 "$MCENV/bin/python" scripts/rdma-vm/peer_mooncake.py 2>/dev/null \
  | grep '^{' >"$out/mooncake.jsonl" || echo "  mooncake: did not finish (exit $?)"
python3 - "$out/gdx-rdma.json" "$out/mooncake.jsonl" "$out/gdx-blocks.jsonl" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
blocks = [json.loads(l) for l in open(sys.argv[3]) if l.startswith("{")]
rows = {(x["key"], x["size_bytes"]): x for x in r["results"] if x["path"] == "rdma"}
print("| row | gdx | Mooncake TE | gdx / Mooncake |")
print("|---|---|---|---|")
for line in open(sys.argv[2]):
    m = json.loads(line)
    if m["row"] == "blocks":
        if not blocks:
            print(f"| 1,000 x 16 KiB scattered blocks, one batch | (gdx did not run) | {m['MBps']:.1f} MB/s | |")
            continue
        g = blocks[0]
        v = lambda x: "verified" if x["verified"] else "NOT verified"
        print(f"| 1,000 x 16 KiB scattered blocks, one batch | {g['MBps']:.1f} MB/s ({v(g)}, {'/'.join(g['paths'])}) "
              f"| {m['MBps']:.1f} MB/s ({v(m)}) | {g['MBps']/m['MBps']:.2f}x (acceptance >= 1.5x) |")
    elif "us" in m:
        g = rows[("host_to_remote_host_rdma_write", 8)]["lat_p50_us"]
        print(f"| 8 B write round trip p50 | {g:.1f} us | {m['us']:.1f} us | {m['us']/g:.2f}x faster |")
    else:
        size = int(m["row"].split()[0])
        g = rows[("host_to_remote_host_rdma_write", size)]["bw_gbps"] * 1000
        v = "verified" if m["verified"] else "NOT verified"
        print(f"| {size >> 10} KiB write | {g:.1f} MB/s | {m['MBps']:.1f} MB/s ({v}) | {g/m['MBps']:.2f}x |")
PY
