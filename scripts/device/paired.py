"""Paired `gdx bench` runs: several gdx binaries measured in one run, round after round, each
round in a different order (so drift and warm-up fall on all of them alike). Prints, per row,
each binary's median over the rounds with its range (min-max), and its ratio to the first
binary's median; a ratio whose ranges overlap the first's is within noise ("~").

    python3 paired.py --rounds 6 --out DIR base=PATH nocgu=PATH ... -- [gdx bench args]

The bench args default to the host transports at the sizes the heuristics were written for.
Writes DIR/paired.json (every figure of every round) and DIR/paired.txt (the table)."""
import argparse
import json
import os
import statistics
import subprocess
import sys

DEFAULT = ["--path", "shm,tcp", "--size", "8,4KiB,64KiB,1MiB,64MiB", "--duration", "300ms"]

ap = argparse.ArgumentParser()
ap.add_argument("--rounds", type=int, default=6)
ap.add_argument("--out", default=".")
ap.add_argument("bins", nargs="+", help="name=path, the first is the reference")
argv = sys.argv[1:]
cut = argv.index("--") if "--" in argv else len(argv)
args = ap.parse_args(argv[:cut])
bench = argv[cut + 1 :] or DEFAULT
bins = [b.split("=", 1) for b in args.bins]
runs = {name: [] for name, _ in bins}
for r in range(args.rounds):
    order = bins[r % len(bins):] + bins[: r % len(bins)]
    for name, exe in order:
        p = subprocess.run([exe, "bench", *bench, "--json"], capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            print(f"round {r} {name}: rc={p.returncode} {p.stderr.strip()[-300:]}", file=sys.stderr)
            continue
        rows = json.loads(p.stdout)["results"]
        runs[name].append({f"{x['key']} {x['size_bytes']}": x for x in rows})
    print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)

ref = bins[0][0]
keys = [k for k in (runs[ref][0] if runs[ref] else {})]


def figures(name, key, field):
    return [x[key][field] for x in runs[name] if key in x and x[key].get(field) is not None]


def cell(name, key, field, lower_is_better):
    v, base = figures(name, key, field), figures(ref, key, field)
    if not v:
        return "-"
    m = statistics.median(v)
    s = f"{m:.3f} ({min(v):.3f}-{max(v):.3f})"
    if name == ref or not base:
        return s
    ratio = m / statistics.median(base)
    overlap = min(v) <= max(base) and min(base) <= max(v)
    better = (ratio < 1) == lower_is_better
    verdict = "~" if overlap else ("better" if better else "WORSE")
    return f"{s} {ratio:.2f}x {verdict}"


lines = [f"paired gdx bench, {args.rounds} rounds: {' '.join(bench)}"]
for name, exe in bins:
    v = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip()
    lines.append(f"  {name}: {v}")
for field, label, lower in (("lat_p50_us", "p50 us", True), ("bw_gbps", "GB/s", False)):
    lines.append(f"\n{label}, median (min-max) over rounds, ratio to {ref}:")
    lines.append("  " + " | ".join(["row"] + [n for n, _ in bins]))
    for k in keys:
        lines.append("  " + " | ".join([k] + [cell(n, k, field, lower) for n, _ in bins]))
text = "\n".join(lines)
print(text)
os.makedirs(args.out, exist_ok=True)
open(os.path.join(args.out, "paired.txt"), "w").write(text + "\n")
json.dump(runs, open(os.path.join(args.out, "paired.json"), "w"))
