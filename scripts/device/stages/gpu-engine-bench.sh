#!/usr/bin/env bash
# gdx engine benchmark on the GPU machine, with its references measured in the same run:
# torch (scripts/device/torch_ref.py), raw CUDA (scripts/device/ref_p2p.cu, built here with nvcc),
# and gdx (gdx-bench's gpu_bench example, prebuilt into .devbin/). Prints a table of ratios and writes
# "$OUT"/engine-bench.txt and "$OUT"/engine-bench.json. Runs in about 1-2 minutes.
#   the `engine` stage: bash scripts/device/run.sh engine   (BIN_DIR, the first argument: .devbin)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
BIN=${1:-.devbin}; OUT=${OUT:-/tmp/gdx-engine-bench}; mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")/.." && pwd); W=$(mktemp -d)
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
echo "== raw CUDA reference" >&2
if "$NVCC" -O2 -o "$W/ref_p2p" "$HERE/ref_p2p.cu" 2> "$W/nvcc.err"; then
  timeout 120 "$W/ref_p2p" > "$W/cuda.jsonl" || echo "ref_p2p failed" >&2
else cat "$W/nvcc.err" >&2; : > "$W/cuda.jsonl"; fi
echo "== torch reference" >&2
timeout 120 python3 "$HERE/torch_ref.py" > "$W/torch.jsonl" || echo "torch reference failed" >&2
echo "== gdx" >&2
timeout 180 "$BIN/gpu_bench" > "$W/gdx.jsonl" || echo "gdx bench failed" >&2
python3 - "$W" "$OUT" <<'PY'
import json, sys, os
w, out = sys.argv[1], sys.argv[2]
def load(n):
    d = {}
    p = os.path.join(w, n)
    if os.path.exists(p):
        for l in open(p):
            l = l.strip()
            if l.startswith("{"):
                try: o = json.loads(l); d[o["key"]] = o
                except Exception: pass
    return d
cu, th, gx = load("cuda.jsonl"), load("torch.jsonl"), load("gdx.jsonl")
v = lambda d, k: d.get(k, {}).get("value")
rows = []
def row(name, g, ref, refname, target, lower_better=False):
    gv, rv = v(gx, g), ref
    ratio = None if gv is None or not rv else (rv / gv if lower_better else gv / rv)
    ok = None if ratio is None else (gv <= 8.0 if lower_better else ratio >= target)
    rows.append(dict(row=name, gdx=gv, reference=rv, reference_name=refname, ratio=ratio, target=target, passed=ok, plan=gx.get(g, {}).get("note")))
row("p2p GPU0→GPU1 1 GiB (GB/s)", "p2p_1GiB", v(th, "p2p_1GiB"), "torch copy_", 1.0)
row("p2p GPU0→GPU1 1 GiB (GB/s)", "p2p_1GiB", v(cu, "p2p_1GiB"), "cudaMemcpyPeerAsync", 0.99)
row("p2p GPU0→GPU1 8 MiB (GB/s)", "p2p_8MiB", v(cu, "p2p_8MiB"), "cudaMemcpyPeerAsync", 0.95)
row("p2p 64 MiB (GB/s)", "p2p_64MiB", v(cu, "p2p_64MiB"), "cudaMemcpyPeerAsync", 0.95)
row("both directions 1 GiB, total (GB/s)", "p2p_bidir_1GiB", v(th, "p2p_bidir_1GiB"), "torch copy_ x2 streams", 1.0)
row("ipc across processes 1 GiB (GB/s)", "ipc_1GiB", v(gx, "p2p_1GiB"), "gdx in-process p2p", 0.97)
row("pool memory, access granted, 1 GiB (GB/s)", "p2p_pool_granted_1GiB", v(gx, "p2p_1GiB"), "gdx p2p cuMemAlloc", 0.97)
d2h = v(cu, "d2h_pinned_1GiB")
row("staged GPU0→host→GPU1 1 GiB (GB/s)", "staged_1GiB", d2h, "D2H pinned ceiling (raw CUDA)", 0.95)
row("8-byte GPU0→GPU1 copy+completion p50 (µs)", "p2p_8B_latency_p50", v(cu, "p2p_8B_latency_p50"), "raw CUDA copy+sync; pass = gdx ≤ 8 µs", 0.0, lower_better=True)
f = lambda x: "n/a" if x is None else f"{x:.2f}"
lines = ["gdx engine benchmark (GB/s = 1e9 B/s; µs for latency; ratio = gdx/reference, reference/gdx for latency)", "",
         f"| {'row':44} | {'gdx':>8} | {'reference':>9} | reference is | ratio | target | pass |", "|---|---:|---:|---|---:|---:|---|"]
for r in rows:
    lines.append(f"| {r['row']:44} | {f(r['gdx']):>8} | {f(r['reference']):>9} | {r['reference_name']} | {f(r['ratio'])} | {r['target']:.2f} | {'—' if r['passed'] is None else ('yes' if r['passed'] else 'NO')} |")
lines += ["", "raw figures:"] + [f"  {src:5} {k:28} {o['value']:>10.3f} {o['unit']}  {o.get('note','')}" for src, d in (("cuda", cu), ("torch", th), ("gdx", gx)) for k, o in d.items()]
text = "\n".join(lines)
print(text)
open(os.path.join(out, "engine-bench.txt"), "w").write(text + "\n")
json.dump({"schema_version": 1, "rows": rows, "raw": {"cuda": cu, "torch": th, "gdx": gx}}, open(os.path.join(out, "engine-bench.json"), "w"), indent=1)
PY
