"""Checkpoints in the safetensors format: ``load_safetensors`` and ``save_safetensors``.

Every header of a checkpoint (one file, a folder of shards, or a ``model.safetensors.index.json``)
is checked in Rust before any tensor byte moves; a refused one raises ``gdx.BadCheckpoint``
naming the reason. Each file's data section is then one pipelined copy into one pool (a numpy
byte array, or a torch CUDA byte tensor), planned like every gdx copy: through the page cache
when the file is cached, with O_DIRECT or cuFile when it is not, page by page when it is partly
cached. Shards load ``parallel`` at a time (the GIL is released during each copy). The tensors
returned are views of the pools.
"""

import fnmatch
import os
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed

import numpy as np

from . import _gdx
from ._gdx import Error

_NUMPY = {
    "BOOL": np.bool_,
    "U8": np.uint8,
    "I8": np.int8,
    "I16": np.int16,
    "U16": np.uint16,
    "F16": np.float16,
    "I32": np.int32,
    "U32": np.uint32,
    "F32": np.float32,
    "I64": np.int64,
    "U64": np.uint64,
    "F64": np.float64,
}
_FROM_NUMPY = {np.dtype(v): k for k, v in _NUMPY.items()}
_ITEM = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
         "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
# Each file's part of a caller's pool starts at a multiple of this, so every tensor keeps the
# alignment its file gives it.
_POOL_ALIGN = 256


def _torch_dtypes():
    import torch

    names = {
        "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
        "F16": "float16", "BF16": "bfloat16", "I32": "int32", "U32": "uint32", "F32": "float32",
        "I64": "int64", "U64": "uint64", "F64": "float64", "F8_E5M2": "float8_e5m2",
        "F8_E4M3": "float8_e4m3fn", "F8_E8M0": "float8_e8m0fnu",
    }
    return {k: getattr(torch, v) for k, v in names.items() if hasattr(torch, v)}


def _parse_device(device):
    d = str(device)
    if d == "cpu":
        return None
    for prefix in ("cuda:", "gpu:"):
        if d.startswith(prefix) and d[len(prefix):].isdigit():
            return int(d[len(prefix):])
    if d in ("cuda", "gpu"):
        return 0
    raise Error(f'device={device!r}: expected "cpu", "cuda:N" or "gpu:N"')


def _pool_offsets(files):
    offs, at = [], 0
    for f in files:
        at = -(-at // _POOL_ALIGN) * _POOL_ALIGN
        offs.append(at)
        at += f[2]
    return offs, at


def _progress_fn(progress):
    if progress is None or progress is False:
        return None
    if callable(progress):
        return progress

    def show(done, total):
        end = "\n" if done >= total else ""
        print(f"\rgdx: loaded {done / 2**30:.2f} of {total / 2**30:.2f} GiB", end=end, file=sys.stderr, flush=True)

    return show


def _run(files, load, parallel, progress):
    """``load(i)`` for every file, ``parallel`` at a time; the reports in file order."""
    total = sum(f[2] for f in files)
    done = 0
    reports = [None] * len(files)
    report_progress = _progress_fn(progress)
    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(files)))) as ex:
        futures = {ex.submit(load, i): i for i in range(len(files))}
        for fut in as_completed(futures):
            i = futures[fut]
            reports[i] = fut.result()
            done += files[i][2]
            if report_progress:
                report_progress(done, total)
    return reports


def _views_numpy(files, pools, framework):
    out = {}
    torch_dt = _torch_dtypes() if framework == "pt" else None
    for (_, _, _, tensors, _), pool in zip(files, pools):
        if framework == "pt":
            import torch

            tpool = torch.from_numpy(pool)
        for name, dtype, shape, begin, end in tensors:
            if framework == "pt":
                out[name] = _torch_view(tpool, begin, end, torch_dt[dtype], shape)
                continue
            if dtype not in _NUMPY:
                raise Error(
                    f"tensor {name!r} is {dtype}, which numpy has no dtype for: load it with "
                    "framework='pt' (torch CPU tensors) or to a GPU"
                )
            out[name] = pool[begin:end].view(_NUMPY[dtype]).reshape(shape)
    return out


def _torch_view(pool, begin, end, dtype, shape):
    import torch

    item = torch.empty((), dtype=dtype).element_size()
    raw = pool[begin:end]
    if (pool.storage_offset() + begin) % item == 0:
        return raw.view(dtype).view(shape)
    # A tensor its file left unaligned for its dtype: one copy on the device into its own.
    t = torch.empty(shape, dtype=dtype, device=pool.device)
    t.view(-1).view(torch.uint8).copy_(raw)
    return t


# Warm loads to a GPU: how the page cache's bytes reach it, unless GDX_CKPT_WARM names another.
# "readers" (threads pread into pinned buffers, each copying on its own stream) is the default:
# it needs no driver support beyond pinned memory and scales with threads until the copy
# engine's ~53 GB/s; "register" (page-locking the page cache in place, no CPU copy) pays the
# driver's page pinning per GB on every load and fails where the driver refuses file mappings.
_WARM_DEFAULT = "readers"
_WARM_WHY = ("default: reader threads into pinned buffers (page-locking the page cache in place "
             "costs a pin per page on every load; GDX_CKPT_WARM=register selects it)")


def _env_size(name):
    """An environment byte count: 16777216, 16M, 64MiB, 1G."""
    v = os.environ.get(name, "").strip()
    if not v:
        return None
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    num = v.lower().removesuffix("ib").removesuffix("b")
    mult = units.get(num[-1:], 1)
    num = num[:-1] if num[-1:] in units else num
    try:
        return int(num) * mult
    except ValueError:
        raise Error(f"{name}={v!r}: expected a byte count such as 16777216, 16M or 1G") from None


def _gather_knobs(chunk_bytes):
    """(warm, readers, chunk, buffers, why) for the GPU loader: the defaults, or GDX_CKPT_*."""
    warm = os.environ.get("GDX_CKPT_WARM", "").strip() or _WARM_DEFAULT
    readers = _env_size("GDX_CKPT_READERS") or 0
    buffers = _env_size("GDX_CKPT_BUFFERS") or 2
    chunk = _env_size("GDX_CKPT_CHUNK") or chunk_bytes
    set_ = [k for k in ("GDX_CKPT_WARM", "GDX_CKPT_READERS", "GDX_CKPT_BUFFERS", "GDX_CKPT_CHUNK")
            if os.environ.get(k, "").strip()]
    why = f"set by {', '.join(set_)}" if set_ else _WARM_WHY
    return warm, readers, chunk, buffers, why


def _patterns(names):
    if names is None:
        return None
    if isinstance(names, str):
        return [names]
    pats = list(names)
    if not all(isinstance(p, str) for p in pats):
        raise Error("names must be a glob pattern or a list of them (strings)")
    return pats


def _select(files, names, only=None):
    """The tensors to load, as (file index, name, dtype, shape, begin, end) in file order, and
    whether that is every tensor. A pattern that matches no tensor is an error. `only`: a set
    of exact names instead of patterns."""
    pats = _patterns(names)
    rows = [(i, n, dt, sh, b, e) for i, f in enumerate(files) for n, dt, sh, b, e in f[3]]
    if only is not None:
        hit = [r for r in rows if r[1] in only]
        return hit, len(hit) == len(rows)
    if pats is None:
        return rows, True
    hit = [r for r in rows if any(fnmatch.fnmatchcase(r[1], p) for p in pats)]
    for p in pats:
        if not any(fnmatch.fnmatchcase(r[1], p) for r in rows):
            some = ", ".join(repr(r[1]) for r in rows[:3])
            raise Error(f"names: the pattern {p!r} matches none of the checkpoint's {len(rows)} "
                        f"tensors (e.g. {some}); patterns are globs (*, ?, [..]) on whole names")
    return hit, len(hit) == len(rows)


def _target_dtype_shape(t):
    if type(t).__module__.startswith("torch"):
        return t.dtype, tuple(t.shape), t.is_contiguous()
    a = np.asarray(t)
    return a.dtype, a.shape, a.flags["C_CONTIGUOUS"] and a.flags["WRITEABLE"]


def _check_targets(out, rows, gpu, framework, label="out"):
    """Refuse, by name and before any byte moves, targets whose dtype, shape, layout or device
    do not fit. Returns (row, target) for the rows that have one."""
    dts = _torch_dtypes() if (gpu is not None or framework == "pt" or _any_torch(out)) else {}
    bad, mine = [], []
    for r in rows:
        _, name, dtype, shape, _, _ = r
        if name not in out:
            continue
        t = out[name]
        is_torch = type(t).__module__.startswith("torch")
        want = dts.get(dtype) if is_torch else (np.dtype(_NUMPY[dtype]) if dtype in _NUMPY else None)
        got_dt, got_shape, ok_layout = _target_dtype_shape(t)
        if got_dt != want or tuple(got_shape) != tuple(shape):
            bad.append(f"{label}[{name!r}] is {tuple(got_shape)} {got_dt} but the checkpoint has "
                       f"{tuple(shape)} {want if want is not None else dtype}")
            continue
        if not ok_layout:
            bad.append(f"{label}[{name!r}] is not contiguous (or not writable): gdx loads into its "
                       "storage in place")
            continue
        where = _where(t)
        if where != gpu:
            here = "cpu" if gpu is None else f"cuda:{gpu}"
            there = "cpu" if where is None else f"cuda:{where}"
            bad.append(f"{label}[{name!r}] is on {there} but this load goes to {here}")
            continue
        mine.append((r, t))
    if bad:
        more = f" (and {len(bad) - 8} more)" if len(bad) > 8 else ""
        raise Error("; ".join(bad[:8]) + more)
    return mine


def _any_torch(out):
    return any(type(t).__module__.startswith("torch") for t in (out or {}).values())


def _where(t):
    """None for host memory, else the CUDA device index."""
    if type(t).__module__.startswith("torch") and t.device.type == "cuda":
        return t.device.index if t.device.index is not None else 0
    return None


def _host_bytes(t):
    """A writable uint8 view of a host target's storage."""
    if type(t).__module__.startswith("torch"):
        import torch

        return t.detach().reshape(-1).view(torch.uint8).numpy()
    return np.asarray(t).reshape(-1).view(np.uint8)


def _knob_report(rep, files, why):
    """Per-file reports (as before) carrying the one loader report under "load"."""
    rep["warm_why"] = why
    out = []
    for f in rep["files"]:
        d = dict(f)
        d["elapsed_s"], d["gbps"], d["load"] = rep["elapsed_s"], rep["gbps"], rep
        out.append(d)
    return out


def _gpu_load(files, ranges, gpu, via, chunk_bytes, progress):
    """One gather of (file index, offset, bytes, device address) ranges into GPU `gpu`."""
    warm, readers, chunk, buffers, why = _gather_knobs(chunk_bytes)
    rep = _gdx._st_gather_gpu([f[0] for f in files], ranges, gpu, via, warm, readers, chunk, buffers,
                              _progress_fn(progress))
    return _knob_report(rep, files, why)


def _host_ranges(files, items, via, chunk_bytes, depth, parallel, progress):
    """Copy (file index, offset, bytes, uint8 destination) items on the host, `parallel` at a
    time; one report per file, the bytes and reasons of its items merged."""
    def load(i):
        fi, off, n, dst = items[i]
        return _gdx._st_load_host(files[fi][0], off, n, dst, via, chunk_bytes, depth)

    entries = [(None, None, it[2]) for it in items]
    reps = _run(entries, load, parallel, progress)
    per = {}
    for (fi, _, _, _), r in zip(items, reps):
        m = per.setdefault(fi, {"file": files[fi][0], "bytes": 0, "path": r["path"], "reason": r["reason"],
                                "elapsed_s": 0.0, "gbps": None, "page_cache_bytes": 0, "direct_bytes": 0})
        m["bytes"] += r["bytes"]
        m["elapsed_s"] += r["elapsed_s"]
        m["page_cache_bytes"] += r["page_cache_bytes"] or 0
        m["direct_bytes"] += r["direct_bytes"] or 0
    return [per[k] for k in sorted(per)]


def _pack(rows, skip):
    """Pool offsets for the rows not in `skip`, each at a multiple of _POOL_ALIGN; the total."""
    offs, at = {}, 0
    for r in rows:
        if r[1] in skip:
            continue
        at = -(-at // _POOL_ALIGN) * _POOL_ALIGN
        offs[r[1]] = at
        at += r[5] - r[4]
    return offs, at


def load_safetensors(path, device="cpu", *, out=None, pool=None, framework=None, parallel=4,
                     progress=None, via="auto", chunk_bytes=16 << 20, depth=4,
                     return_report=False, names=None, _files=None, _only=None):
    """Load a safetensors checkpoint: ``{name: tensor}``.

    path: a file, a folder of shards, or a ``model.safetensors.index.json`` (or a PathLike).
    device: ``"cpu"`` (numpy arrays; torch CPU tensors with ``framework="pt"``) or
    ``"cuda:N"`` (torch tensors on GPU N).
    names: a glob pattern or a list of them (``"model.layers.0.*"``): only the tensors whose
    names match are read; a pattern that matches none is an error.
    out: ``{name: array or tensor}`` (a ``state_dict()``) to load into in place: each is filled
    straight from the file, no second copy (dtype, shape, contiguity and device must match:
    refused by name before any byte moves); tensors it lacks are returned as views of a pool.
    pool: one preallocated contiguous byte buffer (numpy uint8 for cpu, a torch uint8 CUDA tensor
    for a GPU) of at least the bytes to load (plus up to 256 per tensor or file for alignment),
    to load into instead of allocating.
    parallel: host loads: files (or tensors) at once. progress: ``True`` (a line on stderr) or
    ``callable(done_bytes, total_bytes)``.
    via: ``"auto"`` (the planner, by page-cache residency), ``"buffered"``, ``"file-staged"``
    (O_DIRECT) or ``"gds"`` (GPU: cuFile, one file at a time).
    return_report: also return one report per file (bytes, path taken and why, the bytes through
    the page cache and with O_DIRECT, GB/s); a GPU load's reports carry the loader's own under
    ``"load"`` (readers, pinned bytes, the warm method and why, a one-line summary).

    A GPU load (any ``via`` but ``"gds"``) reads every file with one set of reader threads; a
    file in the page cache is read through it, one on the disk with O_DIRECT (and is then not
    left in the page cache). Pinned host memory is bounded (readers x 2 x chunk_bytes: 384 MiB
    on a 16-core host, kept for the next load up to 512 MiB; ``gdx.release_pinned()`` frees it).
    """
    files = _files if _files is not None else _gdx._st_open(os.fspath(path))
    gpu = _parse_device(device)
    rows, everything = _select(files, names, _only)
    targets = _check_targets(out, rows, gpu, framework) if out else []
    skip = {r[1] for r, _ in targets}
    whole = everything and not skip
    if whole:
        offs, total = _pool_offsets(files)
    else:
        packed, total = _pack(rows, skip)
    if gpu is None:
        tensors, reports = _load_host(files, rows, targets, whole, offs if whole else packed, total,
                                      pool, framework, via, chunk_bytes, depth, parallel, progress)
    else:
        tensors, reports = _load_gpu(files, rows, targets, whole, offs if whole else packed, total,
                                     pool, gpu, via, chunk_bytes, depth, parallel, progress)
    for r, t in targets:
        tensors[r[1]] = t
    return (tensors, reports) if return_report else tensors


def _load_host(files, rows, targets, whole, offs, total, pool, framework, via, chunk_bytes, depth,
               parallel, progress):
    if pool is None:
        pool = np.empty(total, dtype=np.uint8)
    pool = np.asarray(pool)
    if pool.dtype != np.uint8 or pool.ndim != 1 or pool.size < total:
        raise Error(f"pool must be a 1-D uint8 array of at least {total} bytes")
    if whole:
        pools = [pool[o:o + f[2]] for o, f in zip(offs, files)]

        def load(i):
            f = files[i]
            return _gdx._st_load_host(f[0], f[1], f[2], pools[i], via, chunk_bytes, depth)

        reports = _run(files, load, parallel, progress)
        return _views_numpy(files, pools, framework), reports
    dst_of = {}
    for r in rows:
        n = r[5] - r[4]
        if r[1] in offs:
            dst_of[r[1]] = pool[offs[r[1]]:offs[r[1]] + n]
    items = [(r[0], files[r[0]][1] + r[4], r[5] - r[4], dst_of[r[1]]) for r in rows if r[1] in dst_of]
    items += [(r[0], files[r[0]][1] + r[4], r[5] - r[4], _host_bytes(t)) for r, t in targets]
    items = [it for it in items if it[2] > 0]
    reports = _host_ranges(files, items, via, chunk_bytes, depth, parallel, progress)
    views = {}
    torch_dt = _torch_dtypes() if framework == "pt" else None
    for _, name, dtype, shape, b, e in (r for r in rows if r[1] in offs):
        raw = pool[offs[name]:offs[name] + (e - b)]
        if framework == "pt":
            import torch

            views[name] = _torch_view(torch.from_numpy(raw), 0, e - b, torch_dt[dtype], shape)
        elif dtype not in _NUMPY:
            raise Error(f"tensor {name!r} is {dtype}, which numpy has no dtype for: load it with "
                        "framework='pt' (torch CPU tensors) or to a GPU")
        else:
            views[name] = raw.view(_NUMPY[dtype]).reshape(shape)
    return views, reports


def _load_gpu(files, rows, targets, whole, offs, total, pool, gpu, via, chunk_bytes, depth,
              parallel, progress):
    import torch

    dev = torch.device("cuda", gpu)
    if pool is None and total == 0:
        # Everything goes into the caller's tensors: no pool, not even a byte of GPU memory.
        pool = torch.empty(0, dtype=torch.uint8, device=dev)
    elif pool is None:
        pool = torch.empty(total, dtype=torch.uint8, device=dev)
    if pool.dtype != torch.uint8 or pool.dim() != 1 or pool.numel() < total or pool.device != dev:
        raise Error(f"pool must be a 1-D uint8 tensor on {dev} of at least {total} bytes")
    if not pool.is_contiguous():
        raise Error("pool must be contiguous")
    # Work queued on the pool's (or a target's) memory before must finish before gdx's copies
    # write it.
    torch.cuda.current_stream(dev).synchronize()
    base = pool.data_ptr()
    if whole:
        ranges = [(i, f[1], f[2], base + offs[i]) for i, f in enumerate(files)]
    else:
        ranges = [(r[0], files[r[0]][1] + r[4], r[5] - r[4], base + offs[r[1]]) for r in rows
                  if r[1] in offs]
    ranges += [(r[0], files[r[0]][1] + r[4], r[5] - r[4], t.data_ptr()) for r, t in targets]
    if via == "gds":
        reports = _gds_per_range(files, ranges, gpu, chunk_bytes, depth, parallel, progress)
    else:
        reports = _gpu_load(files, ranges, gpu, via, chunk_bytes, progress)
    dts = _torch_dtypes()
    tensors = {}
    for i, name, dtype, shape, b, e in rows:
        if whole:
            at, end = offs[i] + b, offs[i] + e
        elif name in offs:
            at, end = offs[name], offs[name] + (e - b)
        else:
            continue
        if dtype not in dts:
            raise Error(f"tensor {name!r} is {dtype}, which this torch has no dtype for")
        tensors[name] = _torch_view(pool, at, end, dts[dtype], shape)
    return tensors, reports


def _gds_per_range(files, ranges, gpu, chunk_bytes, depth, parallel, progress):
    """via="gds": cuFile, one planned copy per range (as gdx cp does), `parallel` at a time."""
    def load(i):
        fi, off, n, ptr = ranges[i]
        if n == 0:
            return {"file": files[fi][0], "bytes": 0, "path": None, "reason": "no tensor bytes",
                    "elapsed_s": 0.0, "gbps": None, "page_cache_bytes": 0, "direct_bytes": 0}
        return _gdx._st_load_gpu(files[fi][0], off, n, ptr, n, gpu, "gds", chunk_bytes, depth)

    return _run([(None, None, r[2]) for r in ranges], load, parallel, progress)


def release_pinned():
    """Free the pinned bounce buffers GPU loads keep for the next load; returns the bytes."""
    return _gdx._st_release_pinned()


def _as_bytes(name, t):
    """(dtype name, shape, contiguous uint8 bytes) of a numpy array or torch tensor."""
    if type(t).__module__.startswith("torch"):
        import torch

        rev = {v: k for k, v in _torch_dtypes().items()}
        if t.dtype not in rev:
            raise Error(f"tensor {name!r}: torch dtype {t.dtype} has no safetensors dtype")
        c = t.detach().to("cpu").contiguous()
        return rev[t.dtype], list(c.shape), c.reshape(-1).view(torch.uint8).numpy()
    a = np.asarray(t)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    key = np.dtype(a.dtype.newbyteorder("=")) if a.dtype.byteorder != "|" else a.dtype
    if key not in _FROM_NUMPY:
        raise Error(f"tensor {name!r}: numpy dtype {a.dtype} has no safetensors dtype")
    # ascontiguousarray makes a 0-d array 1-d: the shape is taken before.
    shape = list(a.shape)
    return _FROM_NUMPY[key], shape, np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def save_safetensors(tensors, path, metadata=None, *, via="auto", fsync=True, chunk_bytes=16 << 20,
                     depth=4):
    """Write ``{name: numpy array or torch tensor}`` to ``path`` as a safetensors file (read by
    the ``safetensors`` package and by ``load_safetensors``): the header (checked as a reader
    checks it) and every tensor in one pipelined write (O_DIRECT where the file system takes it,
    ``depth`` writes of ``chunk_bytes`` in flight), then ``fdatasync`` unless ``fsync=False``
    (the report's time includes it). GPU tensors are copied to host memory first. Returns the
    write's report."""
    if not isinstance(tensors, dict):
        raise Error("tensors must be a dict of name -> numpy array or torch tensor")
    meta = {str(k): str(v) for k, v in (metadata or {}).items()}
    gpu = _one_gpu(tensors)
    if gpu is not None and via != "gds":
        return _save_gpu(tensors, path, meta, gpu, via, fsync, chunk_bytes, depth)
    specs = []
    for name, t in tensors.items():
        if not isinstance(name, str):
            raise Error(f"tensor names must be strings, not {name!r}")
        dtype, shape, raw = _as_bytes(name, t)
        specs.append((name, dtype, shape, raw))
    return _gdx._st_save(os.fspath(path), specs, meta, via, bool(fsync), chunk_bytes, depth)


def _one_gpu(tensors):
    """The CUDA device index when every tensor is a torch tensor on that one GPU, else None."""
    devs = set()
    for t in tensors.values():
        if not type(t).__module__.startswith("torch") or t.device.type != "cuda":
            return None
        devs.add(t.device.index or 0)
    return devs.pop() if len(devs) == 1 else None


def _save_gpu(tensors, path, meta, gpu, via, fsync, chunk_bytes, depth):
    """Every tensor on GPU `gpu`: the file is gathered chunk by chunk straight from GPU memory
    into pinned buffers and written as it goes (no copy of the whole in host memory)."""
    import torch

    rev = {v: k for k, v in _torch_dtypes().items()}
    keep, specs = [], []
    for name, t in tensors.items():
        if not isinstance(name, str):
            raise Error(f"tensor names must be strings, not {name!r}")
        if t.dtype not in rev:
            raise Error(f"tensor {name!r}: torch dtype {t.dtype} has no safetensors dtype")
        c = t.detach().contiguous()  # a strided tensor is copied on its GPU first
        keep.append(c)
        specs.append((name, rev[t.dtype], list(c.shape), c.data_ptr(), c.numel() * c.element_size()))
    # Work queued on the tensors (their last writes, the contiguous copies) finishes before the
    # save reads them.
    torch.cuda.current_stream(gpu).synchronize()
    return _gdx._st_save_gpu(os.fspath(path), specs, meta, gpu, via, bool(fsync), chunk_bytes, depth)
