"""The KV-block benchmark's reports (kvbench_core.py runs the rows): the run's header, the
JSON file, the markdown tables in the issue's shape, and the acceptance lines."""

import json
import os
import platform
import subprocess
import sys
import time

from kvbench_core import BATCH_BLOCKS, POOL_BLOCKS, Case


def header(cfg) -> dict:
    h = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "command": " ".join([os.path.basename(cfg.script)] + sys.argv[1:]),
        "seed": cfg.seed,
        "pool_blocks": POOL_BLOCKS,
        "batch_blocks": BATCH_BLOCKS,
        "iterations": {"blocks": cfg.block_iters, "lat": cfg.lat_iters, "bw": cfg.bw_iters},
        "commit": os.environ.get("GDX_COMMIT") or git_commit(),
    }
    for lib in cfg.libs.values():
        h.update(lib.versions())
    h.update(cfg.header_extra)
    return h


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], check=False, capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__)), timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def write(cfg, report: dict, checks):
    """Rewritten after every library, so a run cut short still leaves what it measured."""
    with open(os.path.join(cfg.args.out, f"{cfg.args.name}.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(cfg.args.out, f"{cfg.args.name}.md"), "w") as f:
        f.write(markdown(cfg, report, checks))


def cell(case: Case, r: dict | None) -> str:
    if r is None:
        return ""
    if r["status"] == "waived":
        return "waived"
    if r["status"] != "ok":
        return f"**{r['status']}**"
    if case.kind == "blocks":
        return f"{r['gbps']:.2f} ({r['median_s'] * 1e6:,.0f} µs)"
    if case.kind == "lat":
        extra = f", {r['gbps']:.2f} GB/s" if case.nbytes >= 1 << 20 else ""
        return f"{r['p50_us']:.1f} µs{extra}"
    return f"{r['gbps']:,.1f}"


def markdown(cfg, report: dict, checks) -> str:
    rows = {r["key"]: r for r in report["rows"]}
    h = report["header"]
    lines = [f"## {report['title']}", "",
             f"{h['date']}, host {h['host']}, commit {h['commit']}, seed {h['seed']}; `{h['command']}`", ""]
    for kinds, what in ((("blocks",), "GB/s (median batch time)"), (("lat", "bw"), "p50 of write + completion; GB/s")):
        cases = [c for c in cfg.cases if c.kind in kinds]
        variants = []
        for c in cases:
            for lib in cfg.libs.values():
                variants += [v for v in lib.variants(c) if v not in variants]
        variants = [v for v in variants if any(f"{c.key}.{v}" in rows for c in cases)]
        if not variants:
            continue
        lines += [f"| {what} | " + " | ".join(c.title for c in cases) + " |",
                  "|---|" + "---:|" * len(cases)]
        for v in variants:
            label = next(lib.label(v) for lib in cfg.libs.values() if v in lib.all_variants())
            lines.append(f"| {label} | " + " | ".join(cell(c, rows.get(f"{c.key}.{v}")) for c in cases) + " |")
        lines.append("")
    why = {}
    for k, r in rows.items():
        if r["status"] != "ok":
            why.setdefault(f"{r['status']}: {r.get('error') or r.get('reason')}", []).append(f"`{k}`")
    notes = [f"- {', '.join(keys)}: {text}" for text, keys in why.items()]
    paths = [f"- `{k}`: {r['path']}" for k, r in rows.items() if r.get("path")]
    if paths:
        lines += ["Paths taken:", *paths, ""]
    if notes:
        lines += ["Rows not measured or not verified:", *notes, ""]
    results = [line for c in checks for line in c(rows) if line]
    if results:
        lines += ["Checks (issue 51's acceptance, same run):", *[f"- {r}" for r in results], ""]
    return "\n".join(lines)


def best(rows, case: str, variants, field: str = "gbps", higher: bool = True) -> str:
    """The key of a library's best verified row of a case among its variants (the acceptance
    judges each library by its best way); the first variant's key when none verified."""
    ok = [f"{case}.{v}" for v in variants if rows.get(f"{case}.{v}", {}).get("status") == "ok"]
    if not ok:
        return f"{case}.{variants[0]}"
    pick = max if higher else min
    return pick(ok, key=lambda k: rows[k][field])


def ratio_check(rows, what: str, a: str, b: str | None, want: float, higher: bool = True, field: str = "gbps",
                absolute: float | None = None):
    """One acceptance line: row a's figure against row b's (or an absolute figure)."""
    ra = rows.get(a)
    if not ra or ra["status"] != "ok":
        return None
    va = ra[field]
    if b is None:
        ok = va >= want if higher else va <= want
        return f"{what}: {va:.2f} (want {'>=' if higher else '<='} {want}) {'PASS' if ok else 'FAIL'}"
    rb = rows.get(b)
    if not rb or rb["status"] != "ok":
        return f"{what}: `{b}` not measured"
    r = va / rb[field]
    ok = r >= want if higher else r <= want
    return f"{what}: {r:.2f}x (`{a}` / `{b}`, want {'>=' if higher else '<='} {want}x) {'PASS' if ok else 'FAIL'}"
