#!/usr/bin/env bash
# Inside one of two RDMA VMs joined by a wire (scripts/test-rdma.sh): vm b serves, vm a runs
# the client side. Fails on the first failure, naming the step.
set -uo pipefail
role=$1
fail() { echo "suite-pair($role): FAILED: $*"; exit 1; }
step() { echo; echo "=== $* ==="; }
PORT=7448

# A clean wire is a lossless one, as RoCE wants (PFC on real fabrics): under TCG a guest's
# softirq can fall behind a burst of a 1 MiB write's ~1,000 packets, past the default input
# backlog (1,000 per CPU). Both ends take bursts; the rows print this end's backlog drops
# (rxe's retries on a clean wire remain when the emulated requester stalls past its timer).
sysctl -qw net.core.netdev_max_backlog=65536 || fail "raising net.core.netdev_max_backlog"
# Packets the guest's input queues dropped (the second column of each CPU's softnet_stat).
backlog_drops() {
  python3 -c 'print(sum(int(l.split()[1], 16) for l in open("/proc/net/softnet_stat")))'
}

if [[ $role == b ]]; then
  # Power off when vm a asks (the "peer VM powered off" fault); otherwise serve until vm a is
  # done (the harness powers this VM off then).
  (while [[ ! -e $GDX_VM_RUN/poweroff-b ]]; do sleep 0.2; done; echo o >/proc/sysrq-trigger) &
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
# Under TCG a guest can stall past rxe's retry timer, and the requester then retransmits on a
# clean wire: rxe counts that as a retry (`completer_retry_err`, kind retransmission), with no
# packet lost. A lost packet shows as a sequence error (kind out-of-sequence), and the 2 % loss
# fault below must move counters. So here retransmissions alone are printed, not failed; any
# other loss or congestion kind fails the row.
drops0=$(backlog_drops)
"$GDX" bench --path rdma --peer "$GDX_VM_PEER_IP:$PORT" --size 8,64KiB,1MiB,8MiB --json \
  >/tmp/bench.json 2>/tmp/bench.err
rc=$?
echo "input-backlog drops here during the rows: $(($(backlog_drops) - drops0))"
tail -5 /tmp/bench.err
python3 - <<'PY' || fail "bench rdma --peer (exit $rc)"
import json
r = json.load(open("/tmp/bench.json"))
rows = [x for x in r["results"] if x.get("path") == "rdma" and "gpu" not in x["key"]]
assert rows, r["cases"]
for key in {x["key"] for x in rows}:
    sizes = sorted(x["size_bytes"] for x in rows if x["key"] == key)
    assert sizes == [8, 65536, 1 << 20, 8 << 20], (key, sizes)
retries = 0
for x in rows:
    assert x.get("verified") is True, x
    print(f'{x["key"]:<34} {x["size_bytes"]:>9} B  {x["bw_gbps"]:.4f} GB/s  p50 {x["lat_p50_us"]:.1f} us  verified')
    # The NIC's counters were read around every row.
    c = x.get("nic_counters")
    assert c and c["device"] == "rxe0" and c["read"] > 0, x
    other = [m for m in c["moved"] if m["kind"] != "retransmission"]
    if other:
        raise SystemExit(f"loss counted on a clean wire: {x['key']} {x['size_bytes']} {c}")
    retries += sum(m["delta"] for m in c["moved"])
if retries:
    print(f"clean wire: {retries} timer retransmission(s) (a stalled emulated end), no other "
          "loss or congestion counter moved")
else:
    print("clean wire: no loss or congestion counter moved in any row")
PY
# A fault run: completes with every byte verified, or fails naming a cause; never hangs (the
# rdma wait is on progress, 30 s) and never reports success for bytes that did not land.
fault_run() { # fault_run NAME EXPECT(pass|either|fail) -- bench args
  local name=$1 expect=$2; shift 3
  local t0=$SECONDS
  timeout 300 "$GDX" bench --path rdma --peer "$GDX_VM_PEER_IP:$PORT" --json "$@" \
    >/tmp/fault.json 2>/tmp/fault.err
  local rc=$? took=$((SECONDS - t0))
  ((rc == 124)) && fail "$name: gdx bench hung (killed after 300 s)"
  python3 - "$name" "$expect" "$rc" "$took" <<'PY' || fail "$name"
import json, sys
name, expect, rc, took = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
r = json.load(open("/tmp/fault.json"))
cases = [c for c in r["cases"] if "gpu" not in c["key"]]
rows = [x for x in r["results"] if "gpu" not in x["key"]]
failed = [c for c in cases if c["status"] not in ("passed", "waived")]
for x in rows:
    # A row is only written for a size that completed: its bytes must have verified.
    assert x.get("verified") is True, (name, x)
for c in failed:
    why = c.get("reason") or ""
    assert why.strip(), (name, "a failure must name its cause", c)
    print(f"{name}: {c['key']} failed after {took} s: {why[:300]}")
if expect == "pass":
    assert not failed and rc == 0, (name, rc, failed)
if expect == "fail":
    assert failed and rc != 0, (name, "success reported for a peer that is gone", rc)
print(f"{name}: exit {rc} after {took} s, {len(rows)} verified row(s), {len(failed)} failed case(s)")
PY
}

step "fault: 2 % packet loss on the wire (RC retransmits: every byte lands)"
tc qdisc add dev eth0 root netem loss 2%
fault_run loss-2pct pass -- --size 64KiB,1MiB
tc qdisc del dev eth0 root
python3 - <<'PY' || fail "loss-2pct: the rows do not show the loss in the NIC's counters"
import json
rows = [x for x in json.load(open("/tmp/fault.json"))["results"] if "gpu" not in x["key"]]
assert rows
moved = {}
for x in rows:
    c = x.get("nic_counters")
    assert c and c["read"] > 0, x
    for m in c["moved"]:
        if m["kind"] in ("retransmission", "out-of-sequence", "timeout"):
            moved[m["counter"]] = moved.get(m["counter"], 0) + m["delta"]
assert moved, ("2 % loss moved no retransmission-type counter", [x.get("nic_counters") for x in rows])
print("loss-2pct: counters moved:", ", ".join(f"{k} +{v}" for k, v in sorted(moved.items())))
PY

step "fault: the link goes down mid-transfer, then up again"
(sleep 4; ip link set eth0 down; sleep 3; ip link set eth0 up) &
fault_run link-down either -- --size 1MiB,8MiB --duration 3s
wait
for ((i = 0; i < 50; i++)); do rdma link show rxe0/1 | grep -q ACTIVE && break; sleep 0.2; done
step "after the link came back: a fresh run passes"
fault_run link-back pass -- --size 64KiB

step "fault: the peer VM is powered off"
(sleep 3; touch "$GDX_VM_RUN/poweroff-b") &
fault_run peer-off fail -- --size 8MiB --duration 30s
wait

echo; echo "suite-pair: all passed"
