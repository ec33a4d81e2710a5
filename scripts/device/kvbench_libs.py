"""The libraries the KV-block benchmark runs, one adapter each (kvbench_core.py says how a run
goes). An adapter's `blocks`/`single` return a function that moves one batch and returns once its
bytes are in place (the timed unit), and a dict (or a function giving one) of what the row should
record beside its figures: the path taken and why, where the library says.

Variants, by row key suffix:
  torch-ref       dst.view(P, B)[di] = src.view(P, B)[si] over torch's IPC mapping of the target's
                  pool (a gather and a scatter kernel), then synchronize
  torch-copy      one copy_ per block over the same mapping, then one synchronize
  torch           one buffer: copy_ over the IPC mapping + synchronize
  mooncake        Mooncake TE, batch_transfer_sync_write (Python lists), one batch
  mooncake-arrays the same through batch_transfer_sync_write_arrays (numpy address arrays)
  nixl            NIXL (UCX backend): descriptor lists prepared once per pool pair;
                  make_prepped_xfer + transfer + poll check_xfer_state + release per batch
  nixl-repost     the same request made once and reposted per batch
  gdx-write       gdx: one Peer.write of the batch's ops, wait
  gdx-prepared    gdx: Peer.prepare_write once, run per batch
  gdx-blocks      gdx's block API: Peer.prepare_blocks once, BlockTransfer.post(src, dst).wait()
  memcpy          host only, one process: one contiguous copy of as many bytes
  memcpy-blocks   host only, one process: the same 1,000 blocks copied one memcpy each, from
                  their source to their destination places (a C loop built with `cc`)
  memcpy-cma      host only, one process: one process_vm_writev of the same blocks to itself,
                  the kernel's cross-process copy with no library around it
"""

import base64
import collections
import functools
import importlib.metadata
import os
import pickle
import re

from kvbench_core import BATCH_BLOCKS, POOL_BLOCKS


def version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


class Lib:
    name = ""
    needs_target = True
    # variant -> (label in the tables, the case kinds it runs)
    VARIANTS: dict[str, tuple[str, tuple[str, ...]]] = {}

    def variants(self, case) -> list[str]:
        return [v for v, (_, kinds) in self.VARIANTS.items() if case.kind in kinds]

    def all_variants(self) -> list[str]:
        return list(self.VARIANTS)

    def label(self, variant: str) -> str:
        return self.VARIANTS[variant][0]

    def env(self) -> dict:
        """Environment of this library's pair (None removes a variable)."""
        return {}

    def versions(self) -> dict:
        return {}

    def waived(self, variant: str) -> str | None:
        """Why a variant cannot run in this build (None: it runs)."""
        return None

    def annotate(self, log_path: str, key: str) -> dict:
        """What the pair's log shows about a row (read by the driver after the pair ended)."""
        return {}

    def close(self):
        pass


def block_addrs(base: int, block: int, ids):
    return [base + int(b) * block for b in ids]


def paths_of(results) -> str:
    """`ipc x1000`: the paths a gdx transfer's ops took, counted."""
    c = collections.Counter(r.path for r in results)
    return ", ".join(f"{p} x{n}" for p, n in c.most_common())


# ---------------------------------------------------------------- torch (GPU only)


class Torch(Lib):
    name = "torch"
    VARIANTS = {
        "torch-ref": ("torch over its IPC handle: `dst[di] = src[si]` (gather + scatter kernels)", ("blocks",)),
        "torch-copy": ("torch, 1,000 `copy_` then one sync", ("blocks",)),
        "torch": ("torch IPC `copy_` + sync", ("lat", "bw")),
    }

    def versions(self):
        return {"torch": version("torch")}

    def target_setup(self, mems):
        from torch.multiprocessing.reductions import reduce_tensor

        self.keep = mems
        return {n: base64.b64encode(pickle.dumps(reduce_tensor(m.obj))).decode() for n, m in mems.items()}

    def initiator_setup(self, src, hello):
        import torch

        self.torch, self.src = torch, src
        self.dst = {}
        for name, h in hello.items():
            fn, args = pickle.loads(base64.b64decode(h))
            self.dst[name] = fn(*args)

    def blocks(self, variant, region, block, si, di):
        torch = self.torch
        sv = self.src[region].obj.view(POOL_BLOCKS, block)
        dv = self.dst[region].view(POOL_BLOCKS, block)
        if variant == "torch-ref":
            si_t, di_t = torch.as_tensor(si, device="cuda"), torch.as_tensor(di, device="cuda")

            def batch():
                dv[di_t] = sv[si_t]
                torch.cuda.synchronize()

            return batch, {"path": "torch IPC mapping, index_select + index_put kernels"}
        pairs = [(dv[int(d)], sv[int(s)]) for s, d in zip(si, di)]

        def copies():
            for d, s in pairs:
                d.copy_(s)
            torch.cuda.synchronize()

        return copies, {"path": f"torch IPC mapping, {len(pairs)} copy_ calls"}

    def single(self, variant, region, n):
        torch = self.torch
        d, s = self.dst[region][:n], self.src[region].obj[:n]

        def one():
            d.copy_(s)
            torch.cuda.synchronize()

        return one, {"path": "torch IPC mapping, copy_"}

    def close(self):
        self.dst = {}


# ---------------------------------------------------------------- Mooncake Transfer Engine (GPU)


class Mooncake(Lib):
    name = "mooncake"
    VARIANTS = {
        "mooncake": ("Mooncake TE `nvlink_intra`, `batch_transfer_sync_write`", ("blocks", "lat", "bw")),
        "mooncake-arrays": ("Mooncake TE `nvlink_intra`, `batch_transfer_sync_write_arrays`", ("blocks",)),
    }
    EXPECT = "Using Intra-Node NVLink transport"
    # With MC_INTRANODE_NVLINK set, "rdma" here gives nvlink_intra (no RDMA device needed).
    PROTOCOL = "rdma"

    def env(self):
        # nvlink_intra: CUDA IPC + cudaMemcpyBatchAsync; it refuses expandable segments.
        return {"MC_INTRANODE_NVLINK": "1", "GLOG_logtostderr": "1", "PYTORCH_CUDA_ALLOC_CONF": None}

    def versions(self):
        return {"mooncake": version("mooncake-transfer-engine-cuda13") or version("mooncake-transfer-engine")}

    def _engine(self, mems):
        from mooncake.engine import TransferEngine

        self.te = TransferEngine()
        rc = self.te.initialize("127.0.0.1", "P2PHANDSHAKE", self.PROTOCOL, "")
        if rc != 0:
            raise RuntimeError(f"Mooncake TransferEngine.initialize returned {rc}")
        for name, m in mems.items():
            rc = self.te.register_memory(m.ptr, m.nbytes)
            if rc != 0:
                raise RuntimeError(f"Mooncake register_memory({name}, {m.nbytes} B) returned {rc}")
        self.mems = mems

    def target_setup(self, mems):
        self._engine(mems)
        return {"session": f"127.0.0.1:{self.te.get_rpc_port()}", "ptrs": {n: m.ptr for n, m in mems.items()}}

    def initiator_setup(self, src, hello):
        self._engine(src)
        self.session, self.remote = hello["session"], hello["ptrs"]

    def waived(self, variant):
        if variant == "mooncake-arrays" and not hasattr(self.te, "batch_transfer_sync_write_arrays"):
            return "this Mooncake has no batch_transfer_sync_write_arrays"
        return None

    def _ok(self, rc, what):
        if rc != 0:
            raise RuntimeError(f"Mooncake {what} returned {rc}")

    def blocks(self, variant, region, block, si, di):
        srcs = block_addrs(self.mems[region].ptr, block, si)
        dsts = block_addrs(self.remote[region], block, di)
        lens = [block] * len(srcs)
        te, session = self.te, self.session
        if variant == "mooncake-arrays":
            import numpy as np

            a, b, c = (np.asarray(x, dtype=np.uint64) for x in (srcs, dsts, lens))
            return lambda: self._ok(te.batch_transfer_sync_write_arrays(session, a, b, c), "batch write"), {}
        return lambda: self._ok(te.batch_transfer_sync_write(session, srcs, dsts, lens), "batch write"), {}

    def single(self, variant, region, n):
        te, session, s, d = self.te, self.session, self.mems[region].ptr, self.remote[region]
        return lambda: self._ok(te.transfer_sync_write(session, s, d, n), "transfer_sync_write"), {}

    def annotate(self, log_path, key):
        """The transport Mooncake says it installed (`Using ... transport` in its log)."""
        try:
            with open(log_path, errors="replace") as f:
                said = sorted(set(re.findall(r"Using [^\n]*? transport[^\n]*", f.read())))
        except OSError:
            said = []
        path = "log: " + "; ".join(said) if said else "not shown: no 'Using ... transport' line in its log"
        if self.EXPECT not in path:
            path += f" (NOT the expected '{self.EXPECT}')"
        return {"path": path}


class MooncakeTcp(Mooncake):
    """Mooncake TE between two processes' host memory: tcp (it has no shared-memory path)."""

    VARIANTS = {
        "mooncake": ("Mooncake TE, tcp, `batch_transfer_sync_write`", ("blocks", "lat")),
        "mooncake-arrays": ("Mooncake TE, tcp, `batch_transfer_sync_write_arrays`", ("blocks",)),
    }
    PROTOCOL = "tcp"
    EXPECT = "Using TCP transport"

    def env(self):
        return {"MC_INTRANODE_NVLINK": None, "GLOG_logtostderr": "1"}


# ---------------------------------------------------------------- NIXL, UCX backend


class Nixl(Lib):
    name = "nixl"
    VARIANTS = {
        "nixl": ("NIXL UCX, prepared descriptor lists, a request per transfer (`make_prepped_xfer`)",
                 ("blocks", "lat", "bw")),
        "nixl-repost": ("NIXL UCX, prepared descriptor lists, one request reposted", ("blocks", "lat", "bw")),
    }
    def env(self):
        # UCX_TLS stays unset (UCX picks); the protocol table it prints names the transports.
        return {"UCX_PROTO_INFO": "y", "UCX_TLS": None}

    def versions(self):
        return {"nixl": version("nixl-cu13") or version("nixl-cu12") or version("nixl")}

    def _agent(self, name, mems):
        from nixl._api import nixl_agent, nixl_agent_config

        self.agent = nixl_agent(name, nixl_agent_config(backends=["UCX"]))
        if "UCX" not in self.agent.backends:
            raise RuntimeError(f"NIXL has no UCX backend here (plugins: {self.agent.get_plugin_list()})")
        self.mems, self.regs = mems, []
        for m in mems.values():
            self.regs.append(self.agent.register_memory([(m.ptr, m.nbytes, 0, "")], self.kind(m)))

    @staticmethod
    def kind(mem) -> str:
        return "VRAM" if mem.device == "cuda" else "DRAM"

    def target_setup(self, mems):
        self._agent("kv-target", mems)
        meta = base64.b64encode(self.agent.get_agent_metadata()).decode()
        return {"meta": meta, "ptrs": {n: m.ptr for n, m in mems.items()}}

    def initiator_setup(self, src, hello):
        self._agent("kv-initiator", src)
        self.peer = self.agent.add_remote_agent(base64.b64decode(hello["meta"]))
        self.remote = hello["ptrs"]
        self.lists, self.handles = {}, []

    def _dlists(self, region, block, count):
        """Both sides' descriptor lists for `count` pieces of `block` bytes, prepared once."""
        import numpy as np

        key = (region, block, count)
        if key not in self.lists:
            mem = self.mems[region]
            offs = np.arange(count, dtype=np.uint64) * np.uint64(block)
            ll = np.stack([offs + np.uint64(mem.ptr), np.full(count, block, np.uint64), np.zeros(count, np.uint64)], 1)
            rl = ll.copy()
            rl[:, 0] = offs + np.uint64(self.remote[region])
            kind = self.kind(mem)
            self.lists[key] = (self.agent.prep_xfer_dlist("NIXL_INIT_AGENT", ll, kind),
                               self.agent.prep_xfer_dlist(self.peer, rl, kind))
        return self.lists[key]

    def _post(self, h):
        st = self.agent.transfer(h)
        while st == "PROC":
            st = self.agent.check_xfer_state(h)
        if st != "DONE":
            raise RuntimeError(f"NIXL transfer ended in state {st}")

    def blocks(self, variant, region, block, si, di):
        import numpy as np

        local, remote = self._dlists(region, block, POOL_BLOCKS)
        li, ri = np.asarray(si, np.int32), np.asarray(di, np.int32)
        if variant == "nixl-repost":
            h = self.agent.make_prepped_xfer("WRITE", local, li, remote, ri)
            self.handles.append(h)
            return lambda: self._post(h), {"backend": self.agent.query_xfer_backend(h)}

        def batch():
            h = self.agent.make_prepped_xfer("WRITE", local, li, remote, ri)
            self._post(h)
            self.agent.release_xfer_handle(h)

        return batch, {}

    def single(self, variant, region, n):
        local, remote = self._dlists(region, n, 1)
        if variant == "nixl-repost":
            h = self.agent.make_prepped_xfer("WRITE", local, [0], remote, [0])
            self.handles.append(h)
            return lambda: self._post(h), {"backend": self.agent.query_xfer_backend(h)}

        def one():
            h = self.agent.make_prepped_xfer("WRITE", local, [0], remote, [0])
            self._post(h)
            self.agent.release_xfer_handle(h)

        return one, {}

    def annotate(self, log_path, key):
        try:
            with open(log_path, errors="replace") as f:
                found = ucx_put_configs(f.read())
        except OSError:
            found = []
        if not found:
            return {"path": "not shown: UCX printed no put protocol between the two agents (UCX_PROTO_INFO=y)"}
        return {"path": "UCX put between the agents: " + "; ".join(found)}

    def close(self):
        for h in getattr(self, "handles", []):
            self.agent.release_xfer_handle(h)
        self.handles = []


def ucx_put_configs(text: str) -> list[str]:
    """The transports of UCX's put protocols between two agents, from its UCX_PROTO_INFO
    tables (a title row `| kv-initiator intra-node cfg#1 |`, then `| remote memory write by
    ucp_put* ... |`, then Range/Description/Config rows), e.g. `cuda_ipc/cuda (0..inf zero-copy)`;
    an agent's tables with itself (`self`) are left out."""
    lines = [re.sub(r"^\[[^\]]*\]\s*\[[^\]]*\]\s*", "", ln).strip() for ln in text.splitlines()]
    found = []
    for i, ln in enumerate(lines):
        if "remote memory write by ucp_put" not in ln or i == 0 or " self " in f" {lines[i - 1]} ":
            continue
        borders = 0
        for row in lines[i + 1 :]:
            if row.startswith("+"):
                borders += 1
                if borders == 3:
                    break
                continue
            cells = [c.strip() for c in row.strip("|").split("|")]
            if borders == 2 and len(cells) == 3:
                item = f"{cells[2]} ({cells[0]} {cells[1]})"
                if item not in found:
                    found.append(item)
    return found


# ---------------------------------------------------------------- gdx


class Gdx(Lib):
    name = "gdx"
    VARIANTS = {
        "gdx-write": ("**gdx**, one `Peer.write` of 1,000 ops", ("blocks",)),
        "gdx-prepared": ("gdx, `prepare_write` once, `run` per batch", ("blocks",)),
        "gdx-blocks": ("gdx block API: `prepare_blocks` once, `post(src, dst).wait()`", ("blocks",)),
        "gdx": ("**gdx** `Peer.write` + wait", ("lat", "bw")),
    }

    def env(self):
        return {"KVBENCH_GDX_SECRET": os.urandom(32).hex()}

    def versions(self):
        return {"gdx": version("gdx")}

    def _agent(self, name):
        import gdx

        self.gdx = gdx
        return gdx.Agent(name, secret=os.environ["KVBENCH_GDX_SECRET"].encode())

    def target_setup(self, mems):
        self.agent = self._agent("kv-target")
        self.regs = {n: self.agent.register(m.obj, name=n, access="rw") for n, m in mems.items()}
        return {"address": self.agent.address, "version": self.gdx.__version__}

    def initiator_setup(self, src, hello):
        self.agent = self._agent("kv-initiator")
        self.regs = {n: self.agent.register(m.obj, access="none") for n, m in src.items()}
        self.peer = self.agent.connect(hello["address"], timeout=30)
        self.remote = {n: self.peer.region(n) for n in src}

    def waived(self, variant):
        if variant == "gdx-blocks" and not (hasattr(self.gdx, "BlockPool") and hasattr(self.peer, "prepare_blocks")):
            return (f"gdx {self.gdx.__version__} has no block API (gdx.BlockPool, Peer.prepare_blocks: "
                    "docs/blocks.md); build the wheel from a commit that has it")
        return None

    def blocks(self, variant, region, block, si, di):
        rs, rd, seen = self.regs[region], self.remote[region], {}

        def info():
            return seen

        def record(results):
            if not seen:
                seen.update(path=paths_of(results), reason=results[0].reason[:300])
            return results

        if variant == "gdx-blocks":
            local = self.gdx.BlockPool([rs], num_blocks=POOL_BLOCKS, block_bytes=block)
            remote = self.gdx.BlockPool([rd], num_blocks=POOL_BLOCKS, block_bytes=block)
            bt = self.peer.prepare_blocks(local, remote, op="write")

            def post():
                t = bt.post(si, di)
                record(t.wait(timeout=120))
                if "explain" not in seen:
                    seen["explain"] = t.explain()[:600]

            return post, info
        ops = [(rs, int(s) * block, rd, int(d) * block, block) for s, d in zip(si, di)]
        assert len(ops) == BATCH_BLOCKS
        if variant == "gdx-prepared":
            w = self.peer.prepare_write(ops)
            return lambda: record(w.run(timeout=120)), info
        return lambda: record(self.peer.write(ops).wait(timeout=120)), info

    def single(self, variant, region, n):
        ops, seen = [(self.regs[region], 0, self.remote[region], 0, n)], {}

        def one():
            res = self.peer.write(ops).wait(timeout=120)
            if not seen:
                seen.update(path=paths_of(res), reason=res[0].reason[:300])

        return one, lambda: seen

    def close(self):
        if hasattr(self, "peer"):
            self.peer.close()


# ---------------------------------------------------------------- the host floor


# The same blocks copied by one thread, one memcpy per block, with no per-block Python: a loop
# compiled here (a Python loop would add ~0.3 µs per block to the floor).
_COPY_BLOCKS_C = r"""
#include <stdint.h>
#include <string.h>
void copy_blocks(char *dst, const char *src, const int64_t *si, const int64_t *di, int64_t n,
                 int64_t bs) {
    for (int64_t k = 0; k < n; k++) memcpy(dst + di[k] * bs, src + si[k] * bs, (size_t)bs);
}
"""


@functools.cache
def _copy_blocks_lib():
    """The compiled block loop (ctypes), or the reason there is none."""
    import ctypes
    import shutil
    import subprocess
    import tempfile

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None, "no C compiler (cc) on this machine"
    d = tempfile.mkdtemp(prefix="kvbench-cc-")
    c, so = os.path.join(d, "copy_blocks.c"), os.path.join(d, "copy_blocks.so")
    with open(c, "w") as f:
        f.write(_COPY_BLOCKS_C)
    r = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", so, c], capture_output=True, text=True)
    if r.returncode != 0:
        return None, f"cc failed: {r.stderr.strip()[:200]}"
    return ctypes.CDLL(so), None


class Memcpy(Lib):
    """One process copies the same bytes (numpy's copy is one memcpy): the floors a
    cross-process copy of host memory is judged against. `memcpy` is one contiguous copy of as
    many bytes; `memcpy-blocks` copies the batch's own blocks, source place to destination
    place; `memcpy-cma` is one `process_vm_writev` of those blocks, what the kernel's
    cross-process copy costs with no library around it."""

    name = "memcpy"
    needs_target = False
    VARIANTS = {
        "memcpy": ("single-thread memcpy, one contiguous copy of as many bytes, one process", ("blocks", "lat")),
        "memcpy-blocks": ("single-thread memcpy of the same blocks, place to place, one process (floor)",
                          ("blocks",)),
        "memcpy-cma": ("one `process_vm_writev` of the same blocks, one process (the kernel's copy)", ("blocks",)),
    }

    def waived(self, variant):
        if variant == "memcpy-blocks":
            return _copy_blocks_lib()[1]
        return None

    def initiator_setup(self, src, hello):
        import numpy as np

        self.np, self.src = np, src
        self.dst = {n: type(m)(m.nbytes) for n, m in src.items()}
        self.last = None

    def _copy(self, region, nbytes):
        d, s = self.dst[region].obj[:nbytes], self.src[region].obj[:nbytes]
        self.dst[region].zero()
        self.last = None
        return lambda: self.np.copyto(d, s), {"path": f"np.copyto of {nbytes} contiguous bytes"}

    def blocks(self, variant, region, block, si, di):
        if variant == "memcpy":
            return self._copy(region, BATCH_BLOCKS * block)
        import ctypes

        np = self.np
        dst, src = self.dst[region], self.src[region]
        dst.zero()
        self.last = (block, si, di)
        if variant == "memcpy-blocks":
            lib, why = _copy_blocks_lib()
            if lib is None:
                raise RuntimeError(why)
            s64, d64 = np.ascontiguousarray(si, np.int64), np.ascontiguousarray(di, np.int64)
            args = [ctypes.c_void_p(dst.ptr), ctypes.c_void_p(src.ptr), ctypes.c_void_p(s64.ctypes.data),
                    ctypes.c_void_p(d64.ctypes.data), ctypes.c_int64(len(si)), ctypes.c_int64(block)]
            return (lambda: lib.copy_blocks(*args)), {"path": f"memcpy x{len(si)} (C loop)"}

        class Iov(ctypes.Structure):
            _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

        libc = ctypes.CDLL(None, use_errno=True)
        n = len(si)
        local, remote = (Iov * n)(), (Iov * n)()
        for k, (a, b) in enumerate(zip(si, di)):
            local[k].base, local[k].len = src.ptr + int(a) * block, block
            remote[k].base, remote[k].len = dst.ptr + int(b) * block, block
        pid, want = os.getpid(), n * block

        def one():
            got = libc.process_vm_writev(pid, local, n, remote, n, 0)
            if got != want:
                raise OSError(ctypes.get_errno(), f"process_vm_writev moved {got} of {want} bytes")

        return one, {"path": f"process_vm_writev, {n} iovecs a side, one call"}

    def single(self, variant, region, n):
        return self._copy(region, n)

    def check(self, region, case):
        from kvbench_core import seed_for

        seed = seed_for(region, self.seed)
        if self.last is not None:
            block, si, di = self.last
            err = self.dst[region].check_blocks(seed, block, si, di)
        else:
            n = case.nbytes * (BATCH_BLOCKS if case.kind == "blocks" else 1)
            err = self.dst[region].check_prefix(seed, n)
        return {"ok": err is None, "error": err}
