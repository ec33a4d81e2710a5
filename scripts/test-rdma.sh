#!/usr/bin/env bash
# The RDMA suite on a real verbs device: Soft-RoCE (rxe) in a QEMU VM (scripts/rdma-vm.sh).
# CI runs it on every run (the README's test command calls it). It builds on the host and runs
# inside the VM:
#
#   one VM (rxe0 paired with itself): gdx-rdma's hardware tests (GPU ones skipped by name: no
#   GPU in the VM), the bench's rdma test, the engine's rdma transport between two processes
#   (tests/rdma_vm.rs), doctor's verbs probe, `gdx topo --json` listing rxe0, doctor's
#   roce-gid/mtu/probe-rdma on rxe0, and `gdx bench --path rdma` at 8 B..8 MiB, bytes verified;
#
#   two VMs on one wire: `gdx serve --rdma-listen` in one, `gdx bench --path rdma --peer` in the
#   other, bytes verified, and the faults (link down mid-transfer, peer powered off).
#
#   two VMs on two wires (rxe0/eth0, rxe1/eth1): the engine's rdma rails (tests/rdma_rails_vm.rs:
#   both rails used, share under tc shaping, a wire down mid-transfer and back, both down) and
#   the rails benchmark (two equal rate-limited rails against one, same boot);
#
#   two VMs on one wire, NVMe over Fabrics (scripts/rdma-vm/suite-nvmeof.sh): vm b exports a RAM
#   disk over nvmet-rdma, vm a connects with nvme-cli and runs gdx topo, doctor, cp (both ways)
#   and a bench row beside dd on it; then vm b powers off mid-copy and gdx cp must fail by name;
#
#   GDX_RDMA_SUITE=one|pair|rails|nvmeof|all (default all) picks a part.
set -euo pipefail
cd "$(dirname "$0")/.."
part=${GDX_RDMA_SUITE:-all}

bash scripts/rdma-vm.sh setup

# Test executables, built here, run there.
tests_json=$(cargo test --no-run --message-format=json \
  -p gdx-rdma --test hardware -p gdx-bench --test rdma_hardware \
  -p gdx-engine --test rdma_vm --test rdma_rails_vm --test fabric_route -p gdx-doctor --lib 2>/dev/null)
exe() { # exe CRATE TARGET -> the test executable's path
  python3 -c '
import json, sys
crate, target = sys.argv[1], sys.argv[2]
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == target and m["package_id"].find(crate) >= 0:
        print(m["executable"]); break
' "$1" "$2" <<<"$tests_json"
}
RDMA_HW=$(exe gdx-rdma hardware)
BENCH_HW=$(exe gdx-bench rdma_hardware)
ENGINE_VM=$(exe gdx-engine rdma_vm)
DOCTOR_LIB=$(exe gdx-doctor gdx_doctor)
ENGINE_FABRIC=$(exe gdx-engine fabric_route)
ENGINE_RAILS=$(exe gdx-engine rdma_rails_vm)
for v in RDMA_HW BENCH_HW ENGINE_VM DOCTOR_LIB ENGINE_FABRIC ENGINE_RAILS; do
  [[ -x ${!v} ]] || { echo "test-rdma: no test executable for $v" >&2; exit 1; }
done
cargo build --release -p gdx 2>&1 | tail -1
GDX=$PWD/target/release/gdx
# The Python package as it is now, installed in the venv the VM runs (on this host its rdma
# test is skipped: no device).
bash scripts/test-python.sh -q test_rdma.py
PYENV=$PWD/${GDX_PYENV:-target/pyenv}

export RDMA_HW BENCH_HW ENGINE_VM DOCTOR_LIB ENGINE_FABRIC ENGINE_RAILS GDX PYENV
if [[ $part == one || $part == all ]]; then
  bash scripts/rdma-vm.sh run --timeout 2400 -- bash scripts/rdma-vm/suite-one.sh
fi
if [[ $part == pair || $part == all ]]; then
  bash scripts/rdma-vm.sh pair --timeout 1200 \
    --a 'bash scripts/rdma-vm/suite-pair.sh a' --b 'bash scripts/rdma-vm/suite-pair.sh b'
fi
if [[ $part == rails || $part == all ]]; then
  bash scripts/rdma-vm.sh pair --wires 2 --timeout 1500 \
    --a 'bash scripts/rdma-vm/suite-rails.sh a' --b 'bash scripts/rdma-vm/suite-rails.sh b'
fi
if [[ $part == nvmeof || $part == all ]]; then
  bash scripts/rdma-vm.sh pair --timeout 900 \
    --a 'bash scripts/rdma-vm/suite-nvmeof.sh a' --b 'bash scripts/rdma-vm/suite-nvmeof.sh b'
fi
echo "test-rdma: passed"
