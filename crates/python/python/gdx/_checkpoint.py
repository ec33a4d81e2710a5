"""Checkpoints in the safetensors format: ``load_safetensors`` and ``save_safetensors``.

Every header of a checkpoint (one file, a folder of shards, or a ``model.safetensors.index.json``)
is checked in Rust before any tensor byte moves; a refused one raises ``gdx.BadCheckpoint``
naming the reason. Each file's data section is then one pipelined copy into one pool (a numpy
byte array, or a torch CUDA byte tensor), planned like every gdx copy: through the page cache
when the file is cached, with O_DIRECT or cuFile when it is not, page by page when it is partly
cached. Shards load ``parallel`` at a time (the GIL is released during each copy). The tensors
returned are views of the pools.
"""

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


def _check_out(out, tensors):
    for name, t in tensors.items():
        if name not in out:
            continue
        o = out[name]
        if tuple(o.shape) != tuple(t.shape) or o.dtype != t.dtype:
            raise Error(
                f"out[{name!r}] is {tuple(o.shape)} {o.dtype} but the checkpoint has "
                f"{tuple(t.shape)} {t.dtype}"
            )


def load_safetensors(path, device="cpu", *, out=None, pool=None, framework=None, parallel=4,
                     progress=None, via="auto", chunk_bytes=16 << 20, depth=4,
                     return_report=False):
    """Load a safetensors checkpoint: ``{name: tensor}``.

    path: a file, a folder of shards, or a ``model.safetensors.index.json`` (or a PathLike).
    device: ``"cpu"`` (numpy arrays; torch CPU tensors with ``framework="pt"``) or
    ``"cuda:N"`` (torch tensors on GPU N).
    out: ``{name: array or tensor}`` to fill instead of returning views (shapes and dtypes must
    match; tensors it lacks are returned as views).
    pool: one preallocated contiguous byte buffer (numpy uint8 for cpu, a torch uint8 CUDA tensor
    for a GPU) of at least the checkpoint's bytes (plus up to 256 per file for alignment), to load
    into instead of allocating.
    parallel: files loaded at once. progress: ``True`` (a line on stderr) or
    ``callable(done_bytes, total_bytes)``, called as files finish.
    via: ``"auto"`` (the planner, by page-cache residency), ``"buffered"``, ``"file-staged"``
    (O_DIRECT) or ``"gds"``.
    return_report: also return one report per file (bytes, path taken and why, the bytes through
    the page cache and with O_DIRECT, GB/s).
    """
    files = _gdx._st_open(os.fspath(path))
    gpu = _parse_device(device)
    offs, total = _pool_offsets(files)
    if gpu is None:
        if pool is None:
            pool = np.empty(total, dtype=np.uint8)
        pool = np.asarray(pool)
        if pool.dtype != np.uint8 or pool.ndim != 1 or pool.size < total:
            raise Error(f"pool must be a 1-D uint8 array of at least {total} bytes")
        pools = [pool[o:o + f[2]] for o, f in zip(offs, files)]

        def load(i):
            f = files[i]
            return _gdx._st_load_host(f[0], f[1], f[2], pools[i], via, chunk_bytes, depth)

        reports = _run(files, load, parallel, progress)
        tensors = _views_numpy(files, pools, framework)
    else:
        import torch

        dev = torch.device("cuda", gpu)
        if pool is None:
            pool = torch.empty(max(total, 1), dtype=torch.uint8, device=dev)
        if pool.dtype != torch.uint8 or pool.dim() != 1 or pool.numel() < total or pool.device != dev:
            raise Error(f"pool must be a 1-D uint8 tensor on {dev} of at least {total} bytes")
        if not pool.is_contiguous():
            raise Error("pool must be contiguous")
        # Work queued on the pool's memory before (a free and reuse by the caching allocator)
        # must finish before gdx's copies write it.
        torch.cuda.current_stream(dev).synchronize()
        base = pool.data_ptr()

        def load(i):
            f = files[i]
            if f[2] == 0:  # a file of empty tensors: nothing to copy (and no GPU bytes to lend)
                return {"file": f[0], "bytes": 0, "path": None, "reason": "no tensor bytes",
                        "elapsed_s": 0.0, "gbps": None, "page_cache_bytes": 0, "direct_bytes": 0}
            return _gdx._st_load_gpu(f[0], f[1], f[2], base + offs[i], f[2], gpu, via, chunk_bytes, depth)

        reports = _run(files, load, parallel, progress)
        dts = _torch_dtypes()
        tensors = {}
        for (_, _, _, ts, _), o in zip(files, offs):
            for name, dtype, shape, begin, end in ts:
                if dtype not in dts:
                    raise Error(f"tensor {name!r} is {dtype}, which this torch has no dtype for")
                tensors[name] = _torch_view(pool, o + begin, o + end, dts[dtype], shape)
    if out is not None:
        _check_out(out, tensors)
        for name, t in tensors.items():
            if name in out:
                if gpu is None and framework != "pt":
                    np.copyto(out[name], t)
                else:
                    out[name].copy_(t)
                tensors[name] = out[name]
    return (tensors, reports) if return_report else tensors


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


def save_safetensors(tensors, path, metadata=None, *, via="auto"):
    """Write ``{name: numpy array or torch tensor}`` to ``path`` as a safetensors file (read by
    the ``safetensors`` package and by ``load_safetensors``): the header (checked as a reader
    checks it) and every tensor in one pipelined write. Returns the write's report."""
    if not isinstance(tensors, dict):
        raise Error("tensors must be a dict of name -> numpy array or torch tensor")
    specs = []
    for name, t in tensors.items():
        if not isinstance(name, str):
            raise Error(f"tensor names must be strings, not {name!r}")
        dtype, shape, raw = _as_bytes(name, t)
        specs.append((name, dtype, shape, raw))
    meta = {str(k): str(v) for k, v in (metadata or {}).items()}
    return _gdx._st_save(os.fspath(path), specs, meta, via)
