#!/usr/bin/env bash
# Inside one of two RDMA VMs joined by two wires (scripts/test-rdma.sh, GDX_RDMA_SUITE=rails or
# all): vm b serves over rxe0 and rxe1 (`gdx serve`, the engine's rdma route), vm a runs the rail
# benchmark (two rate-limited rails of equal speed against one, same boot) and then the rail
# tests (crates/engine/tests/rdma_rails_vm.rs: both rails used, share under tc shaping, a wire
# down mid-transfer and back, both down). Fails on the first failure, naming the step.
set -uo pipefail
role=$1
fail() { echo "suite-rails($role): FAILED: $*"; exit 1; }

if [[ $role == b ]]; then
  exec "$GDX" serve --listen "$GDX_VM_SELF_IP:7447" --size 64MiB --insecure
fi

for ((i = 0; i < 180; i++)); do
  (exec 3<>"/dev/tcp/$GDX_VM_PEER_IP/7447") 2>/dev/null && break
  sleep 1
done

echo "=== rails benchmark: two equal rate-limited rails against one ==="
"$ENGINE_RAILS" --ignored --exact rails_bench_two_equal_rails_against_one --nocapture \
  --test-threads=1 >/tmp/rails-bench.txt 2>&1 || { cat /tmp/rails-bench.txt; fail "rails bench"; }
# The test harness prints its "test NAME ... " before the line, on the same line.
grep -o 'rails-bench one=.*' /tmp/rails-bench.txt || { cat /tmp/rails-bench.txt; fail "no rails-bench line"; }

echo "=== gdx bench: the engine's rdma case on the rails --nics names ==="
# b serves without authentication (--insecure), so the bench's agent must too.
GDX_INSECURE=1 "$GDX" bench --path host_to_remote_rdma --peer "$GDX_VM_PEER_IP:7447" \
  --nics rxe0,rxe1 --size 8MiB --json >/tmp/bench-rails.json 2>/tmp/bench-rails.err
rc=$?
tail -3 /tmp/bench-rails.err
python3 - <<'PY' || fail "gdx bench --nics rxe0,rxe1 (exit $rc)"
import json
r = json.load(open("/tmp/bench-rails.json"))
bad = [c for c in r["cases"] if c["status"] != "passed"]
assert not bad, bad
rows = [x for x in r["results"] if x["key"] == "host_to_remote_rdma"]
assert rows, r["cases"]
for x in rows:
    assert x.get("verified") is True, x
    rails = x.get("rails") or []
    assert [y["local"] for y in rails] == ["rxe0", "rxe1"], rails
    assert all(y["bytes"] > 0 for y in rails), rails
    print(f'{x["key"]} {x["size_bytes"]} B {x["bw_gbps"]:.4f} GB/s rails ' +
          ", ".join(f'{y["local"]}->{y["remote"]} {y["bytes"]} B {y["state"]}' for y in rails))
PY

echo "=== rdma rails over two wires ==="
"$ENGINE_RAILS" --ignored --exact rails_over_two_wires --nocapture --test-threads=1 \
  || fail "rails_over_two_wires"

echo "suite-rails: passed"
