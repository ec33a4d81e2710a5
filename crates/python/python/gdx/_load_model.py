"""``load_model``: a safetensors checkpoint straight into an existing ``torch.nn.Module``'s
parameters and buffers (as ``safetensors.torch.load_model`` does, without the intermediate
state dict): each tensor's bytes go from the file into the storage the module already holds,
on the GPU or in host memory, so no second copy of the model is ever made.
"""

import os

from . import _gdx
from ._checkpoint import _check_targets, _select, load_safetensors
from ._gdx import Error


def _storage_key(t):
    """Tensors that share memory (tied weights) share this."""
    return (t.device.type, t.device.index, t.untyped_storage().data_ptr(), t.storage_offset(),
            tuple(t.shape), t.dtype)


def load_model(model, path, *, strict=True, names=None, via="auto", parallel=4, progress=None,
               return_report=False):
    """Load the checkpoint at ``path`` (a file, a folder of shards, an ``*.index.json``) into
    ``model``'s own parameters and buffers, in place, on whatever device each lives on (all on
    one). Returns ``(missing, unexpected)``: the module's tensors the checkpoint lacks, and the
    checkpoint's tensors the module lacks (``(missing, unexpected, reports)`` with
    ``return_report``).

    names: a glob pattern or a list of them: only those tensors are loaded (and only module
    tensors matching them count as missing).
    strict: refuse (``gdx.Error``, before any byte moves) a checkpoint with missing or unexpected
    tensors; tied weights (two names, one storage, as ``save_pretrained`` stores them once)
    count as loaded when one of them is. A dtype or shape that differs from the module's is
    always refused, naming every such tensor.
    """
    files = _gdx._st_open(os.fspath(path))
    rows, _ = _select(files, names)
    state = model.state_dict(keep_vars=True)
    targets = {k: (v.data if hasattr(v, "data") else v) for k, v in state.items()}
    devices = {(t.device.type, t.device.index) for t in targets.values()}
    if len(devices) > 1:
        raise Error(f"the module's tensors are on several devices ({sorted(map(str, devices))}): "
                    "load_model loads into one; move the module to one device first")
    dev = next(iter(devices), ("cpu", None))
    device = "cpu" if dev[0] == "cpu" else f"cuda:{dev[1] or 0}"
    gpu = None if dev[0] == "cpu" else (dev[1] or 0)
    have = {r[1] for r in rows}
    unexpected = sorted(n for n in have if n not in targets)
    loaded = [n for n in targets if n in have]
    if names is None:
        wanted = list(targets)
    else:
        import fnmatch

        pats = [names] if isinstance(names, str) else list(names)
        wanted = [n for n in targets if any(fnmatch.fnmatchcase(n, p) for p in pats)]
    tied = {_storage_key(targets[n]) for n in loaded}
    missing = sorted(n for n in wanted if n not in have and _storage_key(targets[n]) not in tied)
    if strict and (missing or unexpected):
        parts = []
        if missing:
            parts.append(f"missing from the checkpoint: {_few(missing)}")
        if unexpected:
            parts.append(f"not in the module: {_few(unexpected)}")
        raise Error("load_model(strict=True): " + "; ".join(parts) +
                    " (strict=False loads the tensors both have)")
    out = {n: targets[n] for n in loaded}
    # Refused by name now (dtype, shape, layout, device) rather than part-way through.
    _check_targets(out, rows, gpu, "pt", label="module")
    # Leftover checkpoint tensors are skipped: only the loaded names are read.
    if not loaded:
        return (missing, unexpected, []) if return_report else (missing, unexpected)
    _, reports = load_safetensors(path, device, out=out, framework="pt", parallel=parallel,
                                  progress=progress, via=via, return_report=True, _files=files,
                                  _only=set(loaded))
    return (missing, unexpected, reports) if return_report else (missing, unexpected)


def _few(names, n=6):
    more = f" and {len(names) - n} more" if len(names) > n else ""
    return ", ".join(repr(x) for x in names[:n]) + more
