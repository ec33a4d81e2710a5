"""Issue 52 on the GPU machine, in one run: checkpoint loads to GPU 0 by gdx (its default and
each warm candidate) beside safetensors, InstantTensor (BUFFERED and default), fastsafetensors
(nogds) and the Run:ai streamer, warm and cold, with the raw O_DIRECT read (the cold floor) and
the pinned host-to-GPU copy (the warm ceiling); saves of GPU tensors (gdx, safetensors,
torch.save, raw O_DIRECT writes; all fsync'd); a transformers model round trip. Each row runs in
its own process (ckpt_worker.py) with CUDA started before the clock; every loaded tensor is
checked against safetensors' own load of the file.

    python3 ckpt.py --dir /scratch/ckpt --out $OUT [--quick] [--rows gdx,safetensors,...]

File A: 256 x 16 MiB bf16 tensors in one file (4 GiB). File B: a Llama-8B-shaped bf16 slice,
72 tensors in two shards with an index (3.49 GB). --quick: both about 16x smaller, for a smoke
run. GB/s = 1e9 bytes of tensor data per second, best of the repetitions. Results:
$OUT/ckpt.json (every figure and sample) and $OUT/ckpt.md (the tables and the checks).
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
T0 = time.monotonic()

# (row, loader, environment, states): gdx's warm candidates are rows of their own.
LOADS = [
    ("safetensors", "safetensors", {}, ("warm", "cold")),
    ("gdx", "gdx", {}, ("warm", "cold")),
    ("gdx readers=8", "gdx", {"GDX_CKPT_READERS": "8"}, ("warm",)),
    ("gdx readers=16", "gdx", {"GDX_CKPT_READERS": "16"}, ("warm", "cold")),
    ("gdx 8 x 2 x 32M", "gdx", {"GDX_CKPT_READERS": "8", "GDX_CKPT_CHUNK": "32M"}, ("warm",)),
    ("gdx 4M x4", "gdx", {"GDX_CKPT_CHUNK": "4M", "GDX_CKPT_BUFFERS": "4"}, ("warm",)),
    ("gdx register", "gdx", {"GDX_CKPT_WARM": "register"}, ("warm",)),
    ("gdx register 64M", "gdx", {"GDX_CKPT_WARM": "register", "GDX_CKPT_CHUNK": "64M"}, ("warm",)),
    # Cold through the page cache (readahead) instead of O_DIRECT: whichever this disk takes.
    ("gdx via=buffered", "gdx", {"CKPT_VIA": "buffered"}, ("cold",)),
    ("InstantTensor BUFFERED", "instanttensor-buffered", {}, ("warm", "cold")),
    ("InstantTensor default", "instanttensor", {}, ("warm", "cold")),
    ("fastsafetensors nogds", "fastsafetensors", {}, ("warm", "cold")),
    ("Run:ai streamer", "runai", {}, ("warm", "cold")),
]
PEERS = ["safetensors", "InstantTensor BUFFERED", "InstantTensor default", "fastsafetensors nogds",
         "Run:ai streamer"]
SAVES = ["gdx", "safetensors", "torch.save", "raw-odirect-x1", "raw-odirect-x4"]


def say(*x):
    print(f"[{time.monotonic() - T0:5.0f}s]", *x, flush=True)


def worker(spec, env=None, timeout=150):
    """Run one measurement in its own process; its JSON result (or the error)."""
    e = dict(os.environ)
    for k in [k for k in e if k.startswith("GDX_CKPT_")]:
        del e[k]
    e.update(env or {})
    try:
        p = subprocess.run([sys.executable, os.path.join(HERE, "ckpt_worker.py"), json.dumps(spec)],
                           capture_output=True, text=True, env=e, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"error": f"rc={p.returncode}: {p.stderr.strip()[-600:]}"}
    r = json.loads(lines[-1])
    if "error" in r:
        r["stderr"] = p.stderr.strip()[-1500:]
    return r


def gbps(nbytes, seconds):
    return nbytes / seconds / 1e9 if seconds else None


def fmt(x, nd=2):
    return "—" if x is None else f"{x:.{nd}f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True, help="scratch folder on the disk to measure (not tmpfs)")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/gdx-out"))
    ap.add_argument("--quick", action="store_true", help="small files, one repetition: a smoke run")
    ap.add_argument("--rows", default="", help="comma-separated load rows to run (default: all)")
    ap.add_argument("--budget", type=float, default=360, help="seconds; load rows that would start later are skipped")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    os.makedirs(a.out, exist_ok=True)
    q = a.quick
    res = {"quick": q, "machine": machine(), "commit": os.environ.get("GDX_COMMIT"), "loads": {},
           "saves": {}, "floors": {}}
    files = {"A": os.path.join(a.dir, "a.safetensors"), "B": os.path.join(a.dir, "b")}
    make = {"kind": "make", "a": files["A"], "b": files["B"], "a_tensors": 16 if q else 256,
            "a_tensor_bytes": 16 << 20, "layers": 2 if q else 8, "hidden": 1024 if q else 4096,
            "mlp": 3584 if q else 14336, "kv": 256 if q else 1024}
    say("making files A and B in", a.dir)
    res["make"] = worker(make, timeout=240)
    say("made:", res["make"])
    shards = sorted(os.path.join(files["B"], f) for f in os.listdir(files["B"]) if f.endswith(".safetensors"))
    sets = {"A": {"files": [files["A"]], "target": files["A"]},
            "B": {"files": shards, "target": os.path.join(files["B"], "model.safetensors.index.json")}}
    refs = {}
    for k, s in sets.items():
        r = worker({"kind": "reference", "files": s["files"]})
        refs[k] = r.get("fingerprints") or {}
        s["bytes"] = sum(v[0] for v in refs[k].values())
        say(f"reference {k}: {len(refs[k])} tensors, {s['bytes'] / 1e9:.2f} GB", r.get("error", ""))
    res["files"] = {k: {"files": s["files"], "bytes": s["bytes"], "tensors": len(refs[k])} for k, s in sets.items()}
    res["floors"]["h2d_pinned_gbps"] = worker({"kind": "h2d"}).get("gbps")
    for k, s in sets.items():
        r = worker({"kind": "raw-read", "files": s["files"], "reps": 1 if q else 2})
        res["floors"][f"raw_read_{k}"] = {m: gbps(v["bytes"], v["seconds"]) for m, v in r.items()
                                          if isinstance(v, dict)} if "error" not in r else r
        say(f"raw O_DIRECT read {k}:", res["floors"][f"raw_read_{k}"])
    pick = {x.strip() for x in a.rows.split(",") if x.strip()}
    for row, loader, env, states in LOADS:
        if pick and row not in pick:
            continue
        for k, s in sets.items():
            if time.monotonic() - T0 > a.budget:
                res["loads"][f"{row}|{k}"] = {"error": "skipped: past the time budget"}
                continue
            reps = {"warm": 1 if q else 3, "cold": 1 if q else 2}
            spec = {"kind": "load", "loader": loader, "files": s["files"], "target": s["target"],
                    "states": list(states), "reps": reps}
            r = worker(spec, env)
            r["bytes_ok"] = check_bytes(r, refs[k])
            r["gbps"] = {st: gbps(s["bytes"], min(t)) for st, t in (r.get("times") or {}).items()}
            r.pop("fingerprints", None)
            r["env"] = env
            res["loads"][f"{row}|{k}"] = r
            say(f"{row:<24} {k}: {json.dumps(r.get('gbps'))} bytes_ok={r['bytes_ok']} "
                f"left_cached={r.get('left_cached')} {r.get('error', '')}")
    for saver in SAVES:
        if time.monotonic() - T0 > a.budget + 60:
            res["saves"][saver] = {"error": "skipped: past the time budget"}
            continue
        r = worker({"kind": "save", "saver": saver, "dir": a.dir, "tensors": 16 if q else 256,
                    "tensor_bytes": 16 << 20, "reps": 1 if q else 2}, timeout=200)
        r["gbps"] = gbps(r.get("bytes"), r.get("seconds"))
        res["saves"][saver] = r
        say(f"save {saver:<16} {fmt(r['gbps'])} GB/s {r.get('bytes_ok', '')} {r.get('error', '')}")
    res["transformers"] = worker({"kind": "transformers", "dir": a.dir}, timeout=200)
    say("transformers:", json.dumps(res["transformers"])[:400])
    res["checks"] = checks(res)
    res["elapsed_s"] = time.monotonic() - T0
    with open(os.path.join(a.out, "ckpt.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = tables(res)
    with open(os.path.join(a.out, "ckpt.md"), "w") as f:
        f.write(md)
    print(md, flush=True)
    return 0 if all(c["pass"] for c in res["checks"]) else 1


def machine():
    def out(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
        except Exception as e:  # noqa: BLE001 - a missing tool only blanks its line
            return f"({e})"

    return {"gpu": out(["nvidia-smi", "-L"]).splitlines()[:1], "cpus": os.cpu_count(),
            "kernel": os.uname().release, "fs": out(["df", "-T", "/tmp"]).splitlines()[-1:]}


def check_bytes(r, ref):
    """Every tensor of safetensors' load present, with equal bytes, and no other."""
    fp = r.get("fingerprints")
    if not fp or not ref:
        return False
    return sorted(fp) == sorted(ref) and all(fp[k] == ref[k] for k in ref)


def load_gbps(res, row, k, state):
    r = res["loads"].get(f"{row}|{k}") or {}
    return (r.get("gbps") or {}).get(state) if r.get("bytes_ok") else None


def checks(res):
    out = []

    def add(what, got, want, ok):
        out.append({"check": what, "got": got, "want": want, "pass": bool(ok)})

    for k in ("A", "B"):
        g = load_gbps(res, "gdx", k, "warm")
        it = load_gbps(res, "InstantTensor BUFFERED", k, "warm")
        add(f"warm {k}: gdx default >= 40 GB/s", g, 40, g is not None and g >= 40)
        add(f"warm {k}: gdx / InstantTensor BUFFERED >= 1.3", g / it if g and it else None, 1.3,
            g and it and g / it >= 1.3)
        g = load_gbps(res, "gdx", k, "cold")
        peers = [load_gbps(res, p, k, "cold") for p in PEERS]
        best = max((p for p in peers if p), default=None)
        add(f"cold {k}: gdx / best peer >= 1.0", g / best if g and best else None, 1.0,
            g and best and g / best >= 1.0)
        raw = res["floors"].get(f"raw_read_{k}") or {}
        floor = max((v for v in raw.values() if isinstance(v, float)), default=None)
        add(f"cold {k}: gdx / raw O_DIRECT read >= 0.9", g / floor if g and floor else None, 0.9,
            g and floor and g / floor >= 0.9)
    s = res["saves"]
    g = (s.get("gdx") or {}).get("gbps") if (s.get("gdx") or {}).get("bytes_ok") else None
    raw = max((s.get(x, {}).get("gbps") or 0 for x in ("raw-odirect-x1", "raw-odirect-x4")), default=0)
    st = (s.get("safetensors") or {}).get("gbps")
    add("save: gdx / raw O_DIRECT write >= 0.9", g / raw if g and raw else None, 0.9, g and raw and g / raw >= 0.9)
    add("save: gdx / safetensors >= 1.2", g / st if g and st else None, 1.2, g and st and g / st >= 1.2)
    t = res.get("transformers") or {}
    same = [bool(v.get("differed_before_load") and v.get("identical_logits") and v.get("state_dict_equal"))
            for v in t.values() if isinstance(v, dict)]
    add("transformers round trip: identical logits", same, True, same and all(same))
    bad = [key for key, r in res["loads"].items() if not r.get("bytes_ok") and "skipped" not in r.get("error", "")]
    add("every load's bytes equal safetensors'", bad or "all", "all", not bad)
    return out


def tables(res):
    L = [f"## Checkpoint loads to cuda:0 (GB/s = 1e9 B/s, best of the repetitions){' — QUICK' if res['quick'] else ''}",
         "", f"machine: {res['machine']}; commit {res.get('commit')}; files: "
         + "; ".join(f"{k}: {v['tensors']} tensors, {v['bytes'] / 1e9:.2f} GB" for k, v in res["files"].items()), "",
         "| loader → cuda:0 | warm A | warm B | cold A | cold B | cold leaves cached | bytes | notes |",
         "|---|---:|---:|---:|---:|---:|---|---|"]
    for row, _, _, _ in LOADS:
        if not any(key.startswith(row + "|") for key in res["loads"]):
            continue  # not asked for (--rows)
        cells, notes, ok, cached = [], "", True, None
        for st in ("warm", "cold"):
            for k in ("A", "B"):
                r = res["loads"].get(f"{row}|{k}") or {}
                cells.append(fmt((r.get("gbps") or {}).get(st)))
        for k in ("A", "B"):
            r = res["loads"].get(f"{row}|{k}") or {}
            ok &= bool(r.get("bytes_ok"))
            cached = r.get("left_cached") if r.get("left_cached") is not None else cached
            if r.get("error"):
                notes = r["error"][:80]
            elif ((r.get("info") or {}).get("warm") or {}).get("load"):
                ld = r["info"]["warm"]["load"]
                reg = any(f.get("registered") for f in r["info"]["warm"].get("files", []))
                notes = (f"warm: {ld.get('warm')}{' (in place)' if reg else ''}, {ld.get('readers')} "
                         f"readers x {ld.get('buffers')} x {ld.get('chunk_bytes', 0) >> 20} MiB, pinned "
                         f"{ld.get('pinned_bytes', 0) >> 20} MiB, peak locked {ld.get('registered_peak_bytes', 0) >> 20} MiB")
        c = "—" if cached is None else f"{cached:.0%}"
        L.append(f"| {row} | " + " | ".join(cells) + f" | {c} | {'ok' if ok else 'FAIL'} | {notes} |")
    f = res["floors"]
    for k in ("A", "B"):
        raw = f.get(f"raw_read_{k}") or {}
        L.append(f"| raw O_DIRECT read → host, {k} (1 x 64 MiB / 8 x 16 MiB) | | | "
                 f"{fmt(raw.get('x1')) + ' / ' + fmt(raw.get('x8')) if k == 'A' else ''} | "
                 f"{fmt(raw.get('x1')) + ' / ' + fmt(raw.get('x8')) if k == 'B' else ''} | | | |")
    L.append(f"| pinned host → GPU copy (1 GiB) | {fmt(f.get('h2d_pinned_gbps'))} | | | | | | |")
    L += ["", "## Saves of GPU tensors, fsync included (GB/s)", "", "| saver | GB/s | bytes | notes |", "|---|---:|---|---|"]
    for saver in SAVES:
        r = res["saves"].get(saver) or {}
        ok = {True: "ok", False: "FAIL"}.get(r.get("bytes_ok"), "")
        note = (r.get("error") or (r.get("info") or {}).get("reason") or "")[:100]
        L.append(f"| {saver} | {fmt(r.get('gbps'))} | {ok} | {note} |")
    L += ["", "## transformers round trip", "", "```", json.dumps(res.get("transformers"), indent=1)[:1500], "```",
          "", "## Checks (issue 52)", ""]
    for c in res["checks"]:
        got = c["got"] if not isinstance(c["got"], float) else f"{c['got']:.2f}"
        L.append(f"- {'PASS' if c['pass'] else 'FAIL'} {c['check']}: {got}")
    L.append(f"\n({res['elapsed_s']:.0f} s)\n")
    return "\n".join(L)


if __name__ == "__main__":
    sys.exit(main())
