#!/usr/bin/env bash
# Inside one RDMA VM (scripts/test-rdma.sh): every RDMA test on rxe0. Fails on the first
# failure, naming the step.
set -uo pipefail
fail() { echo "suite-one: FAILED: $*"; exit 1; }
step() { echo; echo "=== $* ==="; }

step "gdx-rdma hardware tests (the GPU one skipped by name: no GPU in the VM)"
"$RDMA_HW" --ignored --test-threads=1 --skip gpu_memory || fail "gdx-rdma hardware tests"

step "bench's rdma test"
"$BENCH_HW" --ignored --test-threads=1 || fail "bench rdma_hardware"

step "the engine's rdma transport (tests/rdma_vm.rs)"
"$ENGINE_VM" --ignored --test-threads=1 --skip rdma_vm_role_server || fail "engine rdma_vm"

step "the Python binding over rdma (crates/python/tests/test_rdma.py)"
(cd crates/python/tests && GDX_REQUIRE_RDMA=1 "$PYENV/bin/python" -m pytest -q -p no:cacheprovider test_rdma.py) \
  || fail "python test_rdma.py"

step "the fabric transport over libfabric's verbs provider (tests/fabric_route.rs)"
# verbs;ofi_rxm asks for more CQ entries than rxe allows unless FI_UNIVERSE_SIZE is lowered
# (gdx's error says so; checked below).
FI_UNIVERSE_SIZE=64 GDX_TEST_FABRIC_PROVIDER=verbs "$ENGINE_FABRIC" --test-threads=1 \
  || fail "engine fabric_route over verbs"
GDX_FABRIC_PROVIDER=verbs "$GDX" doctor --color never 2>&1 | grep -E "probe-fabric" \
  | tee /tmp/pf.txt | grep -q "FI_UNIVERSE_SIZE=64" || fail "probe-fabric does not name the CQ-size cause"
FI_UNIVERSE_SIZE=64 GDX_FABRIC_PROVIDER=verbs "$GDX" doctor --color never 2>&1 \
  | grep -Eq "^PASS +probe-fabric .*verbs" || fail "probe-fabric over verbs did not pass"

step "doctor's verbs probe (unit test, with a device)"
"$DOCTOR_LIB" --test-threads=1 probe_rdma || fail "doctor probe_rdma"

step "gdx topo --json lists rxe0 as a software NIC"
"$GDX" topo --json >/tmp/topo.json || fail "gdx topo --json"
python3 - <<'PY' || fail "topo does not list rxe0"
import json
t = json.load(open("/tmp/topo.json"))
nics = [d for d in t["devices"] if d["kind"].lower() == "nic"]
rxe = [d for d in nics if (d.get("nic") or {}).get("rdma_name") == "rxe0"]
assert rxe, f"no rxe0 among {nics}"
assert rxe[0]["nic"]["software"] is True, rxe[0]
print("topo: rxe0 is", rxe[0]["label"], "netdevs", rxe[0]["nic"]["netdevs"])
PY

step "gdx doctor: roce-gid, mtu and probe-rdma on rxe0"
"$GDX" doctor --color never >/tmp/doctor.txt 2>&1
cat /tmp/doctor.txt | grep -E "rdma|roce|mtu|probe|fabric|memlock" || true
for c in rdma-devices roce-gid mtu probe-rdma; do
  grep -Eq "^PASS +$c +.*rxe0" /tmp/doctor.txt || fail "doctor's $c did not pass on rxe0"
done

step "gdx bench --path rdma at 8 B .. 8 MiB, bytes verified"
"$GDX" bench --path rdma --size 8,64KiB,1MiB,8MiB --json >/tmp/bench.json 2>/tmp/bench.err
rc=$?
cat /tmp/bench.err | tail -5
python3 - <<'PY' || fail "bench rdma (exit $rc)"
import json
r = json.load(open("/tmp/bench.json"))
bad = [c for c in r["cases"] if c["status"] not in ("passed", "waived")]
assert not bad, bad
rows = [x for x in r["results"] if x.get("path") == "rdma"]
host = [x for x in rows if "gpu" not in x["key"]]
assert host, "no host rdma rows"
for key in {x["key"] for x in host}:
    sizes = sorted(x["size_bytes"] for x in host if x["key"] == key)
    assert sizes == [8, 65536, 1 << 20, 8 << 20], (key, sizes)
for x in host:
    assert x.get("verified") is True, x
    print(f'{x["key"]:<34} {x["size_bytes"]:>9} B  {x["bw_gbps"]:.4f} GB/s  p50 {x["lat_p50_us"]:.1f} us  verified')
PY
[[ $rc == 0 ]] || fail "gdx bench exited $rc"
echo; echo "suite-one: all passed"
