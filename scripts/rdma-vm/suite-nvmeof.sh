#!/usr/bin/env bash
# NVMe over Fabrics between the two RDMA VMs (scripts/test-rdma.sh, part nvmeof): vm b exports
# a 256 MiB RAM disk (brd) through nvmet-rdma on rxe0, port 4420; vm a connects with nvme-cli,
# makes ext4 on the namespace and runs gdx topo, doctor, cp (both ways, verified) and a bench
# row beside `dd iflag=direct` in the same boot; then vm b powers off mid-copy and gdx cp must
# fail by name, with the kernel's default timeouts (ctrl_loss_tmo 600 s), within 90 s.
# Fails on the first failure, naming the step. Run alone: GDX_RDMA_SUITE=nvmeof.
set -uo pipefail
role=$1
fail() { echo "suite-nvmeof($role): FAILED: $*"; exit 1; }
step() { echo; echo "=== $(date +%T) $* ==="; }
NQN=nqn.2026-12.io.gdx:ram0
PORT=4420

mountpoint -q /sys/kernel/config || mount -t configfs configfs /sys/kernel/config

if [[ $role == b ]]; then
  (while [[ ! -e $GDX_VM_RUN/poweroff-b ]]; do sleep 0.2; done; echo o >/proc/sysrq-trigger) &
  for m in "brd rd_nr=1 rd_size=262144" nvmet nvmet-rdma; do
    # shellcheck disable=SC2086
    modprobe $m || fail "modprobe $m"
  done
  S=/sys/kernel/config/nvmet/subsystems/$NQN
  P=/sys/kernel/config/nvmet/ports/1
  mkdir -p "$S/namespaces/1" "$P" || fail "nvmet configfs"
  echo 1 >"$S/attr_allow_any_host"
  echo -n /dev/ram0 >"$S/namespaces/1/device_path"
  echo 1 >"$S/namespaces/1/enable" || fail "enabling the namespace"
  echo rdma >"$P/addr_trtype"
  echo ipv4 >"$P/addr_adrfam"
  echo "$GDX_VM_SELF_IP" >"$P/addr_traddr"
  echo "$PORT" >"$P/addr_trsvcid"
  ln -s "$S" "$P/subsystems/$NQN" || fail "linking the subsystem to the port"
  echo "nvmet: $NQN on rdma $GDX_VM_SELF_IP:$PORT (/dev/ram0)"
  touch "$GDX_VM_RUN/target-ready"
  # Serve until vm a is done (the harness powers this VM off) or asks for the power-off.
  while :; do sleep 60; done
fi

for m in nvme-rdma ext4; do modprobe "$m" || fail "modprobe $m"; done
for ((i = 0; i < 300; i++)); do [[ -e $GDX_VM_RUN/target-ready ]] && break; sleep 0.5; done
[[ -e $GDX_VM_RUN/target-ready ]] || fail "vm b's target did not come up"

step "nvme connect -t rdma to vm b"
nvme connect -t rdma -a "$GDX_VM_PEER_IP" -s "$PORT" -n "$NQN" || fail "nvme connect"
for ((i = 0; i < 100; i++)); do [[ -b /dev/nvme0n1 ]] && break; sleep 0.2; done
[[ -b /dev/nvme0n1 ]] || fail "no /dev/nvme0n1 after connecting"
for f in transport address state ctrl_loss_tmo fast_io_fail_tmo; do
  echo "  /sys/class/nvme/nvme0/$f: $(cat /sys/class/nvme/nvme0/$f)"
done
rdma res show cm_id | grep nvme_rdma | head -3

step "gdx topo lists the namespace with transport rdma and its rxe device"
"$GDX" topo --json >/tmp/topo.json || fail "gdx topo --json"
"$GDX" topo | sed -n '/NVMe over Fabrics/,$p'
python3 - <<'PY' || fail "topo's nvmeof entry"
import json
c = json.load(open("/tmp/topo.json"))["nvmeof"]
assert len(c) == 1, c
c = c[0]
assert c["transport"] == "rdma" and c["state"] == "live", c
assert "nvme0n1" in c["namespaces"], c
assert c["carrier"]["rdma_device"] == "rxe0" and c["carrier"]["netdev"] == "eth0", c
print("topo:", c["fabric_path"])
print("  carrier evidence:", "; ".join(c["carrier"]["evidence"]))
PY

step "gdx doctor: the NVMe-oF checks pass (warnings say what the defaults mean)"
"$GDX" doctor --no-probe --color never >/tmp/doctor.txt 2>&1
grep -E "nvmeof|roce-" /tmp/doctor.txt
grep -Eq "^PASS +nvmeof-state +.*nvme0" /tmp/doctor.txt || fail "nvmeof-state did not pass"
grep -Eq "^FAIL +nvmeof" /tmp/doctor.txt && fail "an nvmeof check failed"
grep -Eq "^WARN +nvmeof-timeouts .*600 s" /tmp/doctor.txt || fail "nvmeof-timeouts does not name the 600 s wait"

step "ext4 on the namespace; gdx cp both ways, verified, the fabric path in the report"
mkfs.ext4 -q -F /dev/nvme0n1 || fail "mkfs.ext4"
mkdir -p /mnt/nvmf && mount /dev/nvme0n1 /mnt/nvmf || fail "mount"
check_cp() { # check_cp NAME: the JSON report in /tmp/cp.json
  python3 - "$1" <<'PY'
import json, sys
r = json.load(open("/tmp/cp.json"))
assert r["verify"]["ok"] is True, r
f = r["fabric"]
assert f and f[0]["transport"] == "rdma" and f[0]["rdma_device"] == "rxe0", f
print(f'{sys.argv[1]}: {r["bytes"]} B, path {r["path"]}, {f[0]["path"]}, verified')
PY
}
"$GDX" cp host file:/mnt/nvmf/w.bin --length 32MiB --verify --json >/tmp/cp.json || fail "gdx cp host -> nvmf"
check_cp "write" || fail "the write's report"
dd if=/dev/urandom of=/mnt/nvmf/r.bin bs=1M count=48 oflag=direct status=none || fail "dd a source file"
sync; echo 3 >/proc/sys/vm/drop_caches
"$GDX" cp file:/mnt/nvmf/r.bin host --verify --json >/tmp/cp.json || fail "gdx cp nvmf -> host"
check_cp "read" || fail "the read's report"
"$GDX" cp file:/mnt/nvmf/r.bin host --verify | grep -E "path|fabric"

step "bench: gdx's O_DIRECT read row beside dd iflag=direct, same boot"
# dd, gdx bench, dd, gdx bench, dd: a loaded host moves TCG's speed by 2x within a minute, so
# the two alternate and medians are compared. Each gdx run takes 3 samples (its first sample
# also faults in the fresh host buffer) and reports their median.
dd_rate() { dd if=/mnt/nvmf/r.bin of=/dev/null bs=16M count=2 iflag=direct 2>&1 | awk '/copied/ {print $(NF-1), $NF}'; }
dds=("$(dd_rate)")
for r in 1 2; do
  "$GDX" bench --path file --file-dir /mnt/nvmf --size 32MiB --min-samples 3 --max-samples 3 --json \
    >"/tmp/bench-file-$r.json" 2>/tmp/bench-file.err || { tail -5 /tmp/bench-file.err; fail "gdx bench --path file"; }
  dds+=("$(dd_rate)")
done
python3 - "${dds[@]}" <<'PY' || fail "bench row vs dd"
import json, statistics, sys
unit = {"B/s": 1, "kB/s": 1e3, "MB/s": 1e6, "GB/s": 1e9}
dd = [float(a.split()[0]) * unit[a.split()[1]] for a in sys.argv[1:]]
g = []
for r in (1, 2):
    rows = [x for x in json.load(open(f"/tmp/bench-file-{r}.json"))["results"] if x["key"].startswith("file_to_host")]
    assert rows, "no file_to_host row"
    g.append(rows[0]["bw_gbps"] * 1e9)
ratio = statistics.median(g) / statistics.median(dd)
print("gdx file_to_host_file_staged:", ", ".join(f"{x/1e6:.1f}" for x in g), "MB/s;",
      "dd iflag=direct:", ", ".join(f"{x/1e6:.1f}" for x in dd), f"MB/s; ratio of medians {ratio:.2f}")
assert 0.8 <= ratio <= 1.25, ratio
PY

step "the target goes away mid-copy (kernel defaults): gdx cp fails by name within 90 s"
# The RAM disk holds 256 MiB: make room, then a file well past the 32 MiB read below.
find /mnt/nvmf -maxdepth 1 -type f -delete
dd if=/dev/urandom of=/mnt/nvmf/big.bin bs=1M count=128 oflag=direct status=none || fail "dd the big file"
sync; echo 3 >/proc/sys/vm/drop_caches
t0=$SECONDS
"$GDX" cp file:/mnt/nvmf/big.bin host >/tmp/gone.out 2>/tmp/gone.err &
cp_pid=$!
# Mid-copy: power vm b off once the copy worker has read 32 MiB (two of its 16 MiB chunks).
for ((i = 0; i < 600; i++)); do
  w=$(pgrep -P "$cp_pid" | head -1)
  got=$(awk '/^rchar/ {print $2}' "/proc/${w:-0}/io" 2>/dev/null)
  ((${got:-0} >= 32 << 20)) && break
  sleep 0.1
done
echo "the copy worker (pid ${w:-?}) has read ${got:-0} bytes: powering vm b off"
touch "$GDX_VM_RUN/poweroff-b"
while kill -0 "$cp_pid" 2>/dev/null && ((SECONDS - t0 < 120)); do sleep 1; done
kill -0 "$cp_pid" 2>/dev/null && fail "gdx cp still running after $((SECONDS - t0)) s"
wait "$cp_pid"; rc=$?
took=$((SECONDS - t0))
cat /tmp/gone.err
echo "gdx cp: exit $rc after $took s; controller state now: $(cat /sys/class/nvme/nvme0/state 2>/dev/null)"
((rc == 1)) || fail "gdx cp exited $rc, expected 1"
((took <= 90)) || fail "gdx cp took $took s (more than 90)"
grep -q "the device stopped answering" /tmp/gone.err || fail "no named cause"
grep -Eq "after [1-9][0-9]* bytes" /tmp/gone.err || fail "the copy had not started when the target went away"
grep -q "nvme0 over rdma via rxe0" /tmp/gone.err || fail "the cause does not name the fabric path"

echo; echo "suite-nvmeof: all passed"
