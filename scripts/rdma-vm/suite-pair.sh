#!/usr/bin/env bash
# Inside one of two RDMA VMs joined by a wire (scripts/test-rdma.sh): vm b serves, vm a runs
# the client side. Fails on the first failure, naming the step.
set -uo pipefail
role=$1
fail() { echo "suite-pair($role): FAILED: $*"; exit 1; }
step() { echo; echo "=== $* ==="; }
PORT=7448

if [[ $role == b ]]; then
  # Serve until vm a is done (the harness powers this VM off then).
  exec "$GDX" serve --listen "$GDX_VM_SELF_IP:7447" --rdma-listen "$GDX_VM_SELF_IP:$PORT" \
    --size 64MiB --insecure
fi

# Wait for vm b's listener (its boot runs beside ours).
for ((i = 0; i < 120; i++)); do
  (exec 3<>"/dev/tcp/$GDX_VM_PEER_IP/$PORT") 2>/dev/null && break
  sleep 1
done

step "perftest across the wire (the floor)"
ib_write_bw -d rxe0 -x 1 -s 65536 -n 200 "$GDX_VM_PEER_IP" >/dev/null 2>&1 \
  && echo "perftest server absent in b: expected (b runs gdx serve)" || true

step "gdx bench --path rdma --peer (two hosts), 8 B .. 8 MiB, bytes verified"
"$GDX" bench --path rdma --peer "$GDX_VM_PEER_IP:$PORT" --size 8,64KiB,1MiB,8MiB --json \
  >/tmp/bench.json 2>/tmp/bench.err
rc=$?
tail -5 /tmp/bench.err
python3 - <<'PY' || fail "bench rdma --peer (exit $rc)"
import json
r = json.load(open("/tmp/bench.json"))
rows = [x for x in r["results"] if x.get("path") == "rdma" and "gpu" not in x["key"]]
assert rows, r["cases"]
for key in {x["key"] for x in rows}:
    sizes = sorted(x["size_bytes"] for x in rows if x["key"] == key)
    assert sizes == [8, 65536, 1 << 20, 8 << 20], (key, sizes)
for x in rows:
    assert x.get("verified") is True, x
    print(f'{x["key"]:<34} {x["size_bytes"]:>9} B  {x["bw_gbps"]:.4f} GB/s  p50 {x["lat_p50_us"]:.1f} us  verified')
PY
echo; echo "suite-pair: all passed"
