"""The KV-block benchmark's machinery, shared by kv_peers.py (GPU memory, on the GPU machine) and
scripts/bench-kv-host.py (host memory, on any Linux machine): the cases, the seeded bytes and
block lists, the process pairs, the timed loops, the byte checks and the reports.

How one run goes. The driver (`main`) picks the rows (`--only`), groups them by library and runs
each library in its own pair of processes, so one library that crashes costs only its own rows
(each of them is then reported with the error). In a pair, the *initiator* allocates the source
memory, fills it with seeded random bytes and moves them; the *target* allocates the destination
memory (zeroed) and registers it with the library. Both initialise their memory and the library
before any clock runs. For each row: the target zeroes its memory, the initiator prepares the
batch (untimed: what a serving engine does once per pool pair), runs warm-up batches, then the
timed ones, and the target checks its memory: every destination block equals its source block
(the target regenerates the source bytes from the seed) and every other byte is still zero.

The two processes speak JSON lines over the target's stdin/stdout; a protocol line starts with
`KVP ` so whatever a library prints to stdout is skipped. The initiator hands each finished row
to the driver the same way.

A library is an adapter class (kvbench_libs.py) with the same few methods for GPU and host memory.
What runs without a GPU is tested by test_kvbench.py (`python3 -m pytest scripts/device/test_kvbench.py`).
"""

import argparse
import fnmatch
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass

TAG = "KVP "
POOL_BLOCKS = 8192
BATCH_BLOCKS = 1000


# ---------------------------------------------------------------- cases and row selection


@dataclass(frozen=True)
class Case:
    """What one row measures: `blocks` (BATCH_BLOCKS scattered blocks of `nbytes`), `lat` (one
    buffer of `nbytes`, p50 of write + completion) or `bw` (one buffer, median GB/s)."""

    key: str
    kind: str
    nbytes: int

    @property
    def title(self) -> str:
        size = human(self.nbytes)
        if self.kind == "blocks":
            return f"{BATCH_BLOCKS:,} x {size} blocks"
        return f"{size} {'p50' if self.kind == 'lat' else 'GB/s'}"


def human(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def select(keys: list[str], only: str | None) -> list[str]:
    """The row keys `--only` picks: comma-separated tokens, each a glob over `case.lib` keys, a
    case (`blocks16k`), a library or library prefix (`gdx`, `gdx-blocks`) or a key prefix."""
    if not only:
        return list(keys)
    tokens = [t.strip() for t in only.split(",") if t.strip()]
    picked = []
    for k in keys:
        case, lib = k.split(".", 1)
        if any(fnmatch.fnmatch(k, t) or k.startswith(t) or t == case or lib.startswith(t) for t in tokens):
            picked.append(k)
    if not picked:
        raise ValueError(f"--only {only!r} selects no row; the rows are (--list): {', '.join(keys)}")
    return picked


# ---------------------------------------------------------------- bytes, block lists, stats


def block_lists(seed: int, pool: int = POOL_BLOCKS, n: int = BATCH_BLOCKS):
    """Source and destination block ids: `n` of `pool` each, from a fixed random permutation
    (distinct within each list, as a KV manager's block table is)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.permutation(pool)[:n].astype(np.int64), rng.permutation(pool)[:n].astype(np.int64)


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


class HostMem:
    """Host memory: a numpy array (memory the framework owns, registered by each library)."""

    def __init__(self, nbytes: int):
        import numpy as np

        self.np = np
        self.obj = np.zeros(nbytes, np.uint8)
        self.nbytes = nbytes
        self.ptr = self.obj.ctypes.data
        self.device = "cpu"

    @staticmethod
    def pattern(nbytes: int, seed: int):
        import numpy as np

        return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)

    def fill(self, seed: int):
        self.obj[:] = self.pattern(self.nbytes, seed)

    def zero(self):
        self.obj.fill(0)

    def sync(self):
        pass

    def check_blocks(self, seed: int, block: int, si, di) -> str | None:
        np = self.np
        dv = self.obj[: POOL_BLOCKS * block].reshape(POOL_BLOCKS, block)
        sv = self.pattern(POOL_BLOCKS * block, seed).reshape(POOL_BLOCKS, block)
        bad = np.nonzero((dv[di] != sv[si]).any(axis=1))[0]
        if len(bad):
            return f"{len(bad)} destination blocks differ from their source, first dst[{di[bad[0]]}]"
        untouched = np.ones(POOL_BLOCKS, bool)
        untouched[di] = False
        hit = np.nonzero(dv[untouched].any(axis=1))[0]
        if len(hit):
            return f"{len(hit)} blocks outside the list were written, first block {np.nonzero(untouched)[0][hit[0]]}"
        if self.obj[POOL_BLOCKS * block :].any():
            return "bytes past the pool were written"
        return None

    def check_prefix(self, seed: int, n: int) -> str | None:
        np = self.np
        want = self.pattern(self.nbytes, seed)[:n]
        if not np.array_equal(self.obj[:n], want):
            return f"the {n} bytes written differ from the source, first at {int(np.argmax(self.obj[:n] != want))}"
        if self.obj[n:].any():
            return f"bytes past the {n} written were changed"
        return None


class GpuMem(HostMem):
    """GPU memory on device 0: a torch tensor from torch's caching allocator."""

    def __init__(self, nbytes: int):
        import torch

        self.torch = torch
        self.obj = torch.zeros(nbytes, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        self.nbytes = nbytes
        self.ptr = self.obj.data_ptr()
        self.device = "cuda"

    @staticmethod
    def pattern(nbytes: int, seed: int):
        import torch

        g = torch.Generator(device="cuda")
        g.manual_seed(seed)
        return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device="cuda", generator=g)

    def fill(self, seed: int):
        self.obj.copy_(self.pattern(self.nbytes, seed))
        self.sync()

    def zero(self):
        self.obj.zero_()
        self.sync()

    def sync(self):
        self.torch.cuda.synchronize()

    def check_blocks(self, seed: int, block: int, si, di) -> str | None:
        torch = self.torch
        si_t, di_t = torch.as_tensor(si, device="cuda"), torch.as_tensor(di, device="cuda")
        dv = self.obj[: POOL_BLOCKS * block].view(POOL_BLOCKS, block)
        sv = self.pattern(POOL_BLOCKS * block, seed).view(POOL_BLOCKS, block)
        bad = (dv[di_t] != sv[si_t]).any(dim=1).nonzero().flatten().tolist()
        del sv
        if bad:
            return f"{len(bad)} destination blocks differ from their source, first dst[{int(di[bad[0]])}]"
        untouched = torch.ones(POOL_BLOCKS, dtype=torch.bool, device="cuda")
        untouched[di_t] = False
        hit = dv[untouched].any(dim=1).nonzero().flatten().tolist()
        if hit:
            first = untouched.nonzero().flatten()[hit[0]].item()
            return f"{len(hit)} blocks outside the list were written, first block {first}"
        if self.obj[POOL_BLOCKS * block :].any().item():
            return "bytes past the pool were written"
        return None

    def check_prefix(self, seed: int, n: int) -> str | None:
        want = self.pattern(self.nbytes, seed)[:n]
        diff = (self.obj[:n] != want).nonzero()
        if diff.numel():
            return f"the {n} bytes written differ from the source, first at {diff[0].item()}"
        if self.obj[n:].any().item():
            return f"bytes past the {n} written were changed"
        return None


# ---------------------------------------------------------------- the pair protocol


def send(stream, obj):
    stream.write(TAG + json.dumps(obj) + "\n")
    stream.flush()


def recv(stream) -> dict:
    while True:
        line = stream.readline()
        if not line:
            raise EOFError("the other process closed its end (it exited; its log says why)")
        if line.startswith(TAG):
            return json.loads(line[len(TAG) :])


def memory_plan(cfg) -> dict[str, int]:
    """The regions each side allocates: one pool per block size and one single buffer."""
    plan = {f"pool{c.nbytes}": POOL_BLOCKS * c.nbytes for c in cfg.cases if c.kind == "blocks"}
    singles = [c.nbytes for c in cfg.cases if c.kind != "blocks"]
    if singles:
        plan["buf"] = max(singles)
    return plan


def region_for(case: Case) -> str:
    return f"pool{case.nbytes}" if case.kind == "blocks" else "buf"


def seed_for(name: str, base: int) -> int:
    return base + (sum(name.encode()) * 7919)


def protocol_stream():
    """This process's protocol output: the original stdout, kept apart from fd 1, which goes
    to stderr from now on (so nothing a library prints, from Python or C, lands in it)."""
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def run_target(cfg, lib):
    """The destination process: allocate, register, then answer zero/check until told to quit."""
    out = protocol_stream()
    try:
        mems = {name: cfg.Mem(n) for name, n in memory_plan(cfg).items()}
        hello = lib.target_setup(mems)
    except Exception as e:
        traceback.print_exc()
        send(out, {"error": f"{type(e).__name__}: {e}"})
        return 1
    send(out, {"hello": hello})
    si, di = block_lists(cfg.seed)
    for line in sys.stdin:
        if not line.startswith(TAG):
            continue
        cmd = json.loads(line[len(TAG) :])
        if cmd["cmd"] == "quit":
            break
        mem = mems[cmd["region"]]
        if cmd["cmd"] == "zero":
            mem.zero()
            send(out, {"ok": True})
        elif cmd["cmd"] == "check":
            seed = seed_for(cmd["region"], cfg.seed)
            if cmd["kind"] == "blocks":
                err = mem.check_blocks(seed, cmd["nbytes"], si, di)
            else:
                err = mem.check_prefix(seed, cmd["nbytes"])
            send(out, {"ok": err is None, "error": err})
    lib.close()


class Remote:
    """The initiator's handle on its target process."""

    def __init__(self, cfg, lib_name: str, log):
        argv = [sys.executable, cfg.script, "--role", "target", "--lib", lib_name, *cfg.passthrough]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
        first = recv(self.proc.stdout)
        if "error" in first:
            self.proc.wait(timeout=60)
            raise RuntimeError(f"the target process could not set up: {first['error']}")
        self.hello = first["hello"]

    def ask(self, **cmd) -> dict:
        send(self.proc.stdin, cmd)
        return recv(self.proc.stdout)

    def close(self):
        try:
            send(self.proc.stdin, {"cmd": "quit"})
            self.proc.wait(timeout=60)
        except Exception:
            self.proc.kill()
            self.proc.wait()


# ---------------------------------------------------------------- timing one row


def timed(fn, warmup: int, iters: int) -> list[float]:
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return ts


def measure(cfg, lib, variant: str, case: Case, src: dict, remote) -> dict:
    """One row: prepare (untimed), warm up, time, check the bytes; returns the row's figures."""
    region = region_for(case)
    if remote is not None:
        remote.ask(cmd="zero", region=region)
    si, di = block_lists(cfg.seed)
    if case.kind == "blocks":
        fn, info = lib.blocks(variant, region, case.nbytes, si, di)
        warm, iters = cfg.block_iters
    else:
        fn, info = lib.single(variant, region, case.nbytes)
        warm, iters = cfg.lat_iters if case.kind == "lat" else cfg.bw_iters
    ts = timed(fn, warm, iters)
    moved = case.nbytes * (BATCH_BLOCKS if case.kind == "blocks" else 1)
    check = lib.check(region, case) if remote is None else remote.ask(
        cmd="check", region=region, kind=case.kind, nbytes=case.nbytes)
    med = statistics.median(ts)
    row = {
        "status": "ok" if check["ok"] else "failed",
        "bytes": moved,
        "samples": len(ts),
        "warmup": warm,
        "median_s": med,
        "p50_us": percentile(ts, 50) * 1e6,
        "p99_us": percentile(ts, 99) * 1e6,
        "min_s": min(ts),
        "gbps": moved / med / 1e9,
        "verified": check["ok"],
        **(info() if callable(info) else info or {}),
    }
    if not check["ok"]:
        row["error"] = f"bytes check failed: {check['error']}"
    return row


def run_initiator(cfg, lib, keys: list[str]):
    """The source process: set up, run each selected row of this library, report each."""
    out = protocol_stream()
    remote = None
    try:
        src = {name: cfg.Mem(n) for name, n in memory_plan(cfg).items()}
        for name, mem in src.items():
            mem.fill(seed_for(name, cfg.seed))
        lib.seed = cfg.seed
        remote = Remote(cfg, lib.name, sys.stderr) if lib.needs_target else None
        lib.initiator_setup(src, remote.hello if remote else None)
    except Exception as e:  # the pair never came up: every row says why
        traceback.print_exc()
        for key in keys:
            send(out, {"key": key, "status": "error", "error": f"setup: {type(e).__name__}: {e}"})
        if remote is not None:
            remote.close()
        return 1
    try:
        for key in keys:
            case_key, variant = key.split(".", 1)
            case = cfg.case(case_key)
            try:
                waived = lib.waived(variant)
                if waived:
                    row = {"status": "waived", "reason": waived}
                else:
                    row = measure(cfg, lib, variant, case, src, remote)
            except Exception as e:  # one row's failure is that row's, the others still run
                traceback.print_exc()
                row = {"status": "error", "error": f"{type(e).__name__}: {e}"}
            send(out, {"key": key, **row})
    finally:
        lib.close()
        if remote is not None:
            remote.close()


# ---------------------------------------------------------------- the driver and its reports


class Config:
    """Everything a run is parameterised by; built from the command line in every process."""

    def __init__(self, a, cases: list[Case], libs: dict, Mem, script: str, passthrough: list[str]):
        self.args, self.cases, self.libs, self.Mem = a, cases, libs, Mem
        self.script, self.passthrough, self.seed = script, passthrough, a.seed
        self.header_extra = {}
        q = a.quick
        self.block_iters = (1, 3) if q else (3, a.iters or 20)
        self.lat_iters = (5, 50) if q else (50, a.iters * 100 if a.iters else 2000)
        self.bw_iters = (1, 3) if q else (2, a.iters or 10)

    def case(self, key: str) -> Case:
        return next(c for c in self.cases if c.key == key)

    def keys(self) -> list[str]:
        return [f"{c.key}.{v}" for c in self.cases for lib in self.libs.values() for v in lib.variants(c)]


def common_args(ap: argparse.ArgumentParser):
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for the JSON, table and logs")
    ap.add_argument("--only", help="comma-separated rows: globs over CASE.LIB keys, a case, a library (see --list)")
    ap.add_argument("--list", action="store_true", help="print the row keys and exit")
    ap.add_argument("--quick", action="store_true", help="a smoke run: few iterations (figures mean little)")
    ap.add_argument("--iters", type=int, default=0, help="timed batches per block row (default 20; x100 for latency)")
    ap.add_argument("--seed", type=int, default=51, help="seed of the block lists and the bytes")
    ap.add_argument("--timeout", type=int, default=300, help="seconds one library's process pair may take")
    ap.add_argument("--role", choices=["driver", "initiator", "target"], default="driver", help=argparse.SUPPRESS)
    ap.add_argument("--lib", help=argparse.SUPPRESS)
    ap.add_argument("--rows", help=argparse.SUPPRESS)


def passthrough_args(a, extra: list[str] = ()) -> list[str]:
    """The options a child process needs to rebuild the same Config (`extra`: the CLI's own)."""
    return ["--seed", str(a.seed), "--iters", str(a.iters), *(["--quick"] if a.quick else []), *extra]


def main(cfg, title: str, checks) -> int:
    """The driver (or, with --role, one side of a pair)."""
    import kvbench_report  # the reports import this module's constants
    a = cfg.args
    if a.role == "target":
        return run_target(cfg, cfg.libs[a.lib])
    if a.role == "initiator":
        return run_initiator(cfg, cfg.libs[a.lib], a.rows.split(","))
    try:
        picked = select(cfg.keys(), a.only)
    except ValueError as e:
        print(f"{os.path.basename(cfg.script)}: error: {e}", file=sys.stderr)
        return 2
    if a.list:
        print("\n".join(picked))
        return 0
    os.makedirs(os.path.join(a.out, "logs"), exist_ok=True)
    report = {"schema_version": 1, "title": title, "header": kvbench_report.header(cfg), "rows": []}
    by_key = {}
    for name, lib in cfg.libs.items():
        rows = [k for k in picked if k.split(".", 1)[1].split("-")[0] == name]
        if rows:
            by_key.update(run_pair(cfg, name, rows, lib.env()))
            report["rows"] = [dict(key=k, **by_key[k]) for k in picked if k in by_key]
            kvbench_report.write(cfg, report, checks)
    bad = [r for r in report["rows"] if r["status"] in ("error", "failed")]
    print(kvbench_report.markdown(cfg, report, checks))
    return 1 if bad else 0


def run_pair(cfg, name: str, rows: list[str], extra_env: dict) -> dict:
    a = cfg.args
    log_path = os.path.join(a.out, "logs", f"{name}.log")
    env = dict(os.environ, **{k: v for k, v in extra_env.items() if v is not None})
    for k, v in extra_env.items():
        if v is None:
            env.pop(k, None)
    argv = [sys.executable, cfg.script, "--role", "initiator", "--lib", name, "--rows", ",".join(rows),
            *cfg.passthrough]
    print(f"== {name}: {len(rows)} rows (log {log_path})", file=sys.stderr, flush=True)
    got, rc = {}, None
    with open(log_path, "w") as log:
        # The initiator leads its own process group, so a hung pair is ended whole (its target
        # too) and only the pair this driver started.
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True, env=env, start_new_session=True)
        timer = threading.Timer(a.timeout, lambda: os.killpg(p.pid, signal.SIGKILL))
        timer.start()
        try:
            for line in p.stdout:
                if line.startswith(TAG):
                    r = json.loads(line[len(TAG) :])
                    key = r.pop("key")
                    got[key] = r
                    print(f"   {key}: {fmt_row(r)}", file=sys.stderr, flush=True)
            rc = p.wait()
        finally:
            timed_out = not timer.is_alive() and rc_killed(p)
            timer.cancel()
            end_group(p)
    why = f"the {name} pair ran past --timeout {a.timeout}s and was killed" if timed_out else None
    tail = log_tail(log_path)
    for k in rows:
        if k not in got:
            cause = why or f"the {name} initiator exited with rc={rc} before this row"
            got[k] = {"status": "error", "error": f"{cause}; log tail: {tail}"}
        if got[k]["status"] == "ok":
            got[k].update(cfg.libs[name].annotate(log_path, k))
    return got


def end_group(p):
    """Ends what is left of a pair (a target whose initiator crashed), then reaps the initiator."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    p.wait()


def rc_killed(p) -> bool:
    return p.returncode == -signal.SIGKILL


def log_tail(path: str, n: int = 6) -> str:
    try:
        with open(path, errors="replace") as f:
            lines = [ln.strip() for ln in f.read().splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    return " | ".join(lines[-n:])[-800:] or "(empty log)"


def fmt_row(r: dict) -> str:
    if r["status"] != "ok":
        return f"{r['status']}: {r.get('error') or r.get('reason')}"
    return f"ok: {r['gbps']:.2f} GB/s, p50 {r['p50_us']:.1f} us, median {r['median_s'] * 1e6:.1f} us"
