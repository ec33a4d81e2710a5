"""One measurement of scripts/device/ckpt.py in a process of its own (issue 52): a checkpoint
loader, warm and cold; a saver; the raw O_DIRECT floors and the pinned copy ceiling; a
transformers round trip. CUDA is initialised before any clock starts. The result is one JSON
object on the last line of stdout.

    python3 ckpt_worker.py '{"kind": "load", "loader": "gdx", "target": "...", ...}'

Every loaded tensor is fingerprinted on the GPU afterwards (outside the timing) so ckpt.py can
compare it with safetensors' own load of the same file.
"""

import ctypes
import gc
import json
import mmap
import os
import sys
import threading
import time

import torch

# CKPT_DEVICE=cpu only for a smoke run of the script's own logic on a machine without a GPU.
DEV = os.environ.get("CKPT_DEVICE", "cuda:0")


def sync():
    if DEV != "cpu":
        torch.cuda.synchronize()


def fingerprint(t):
    """[bytes, sum of 32-bit words, position-weighted sum]: differs for any changed, missing or
    moved word (NaN-safe: integers, not floats)."""
    b = t.detach().contiguous().view(-1).view(torch.uint8)
    if b.device.type != "cuda":
        b = b.to(DEV)
    n = b.numel()
    if n % 4:
        b = torch.cat([b, b.new_zeros(4 - n % 4)])
    w = b.view(torch.int32).to(torch.int64)
    idx = torch.arange(w.numel(), device=w.device, dtype=torch.int64) % 65521 + 1
    return [n, int(w.sum()), int((w * idx).sum())]


def drop_caches(files=()):
    """Empty the page cache (root). CKPT_NO_DROP=1 (a smoke run on a shared machine): only
    `files`' pages, with posix_fadvise(DONTNEED)."""
    os.sync()
    if os.environ.get("CKPT_NO_DROP"):
        for f in files:
            fd = os.open(f, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        return
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def cached_fraction(path):
    """The part of `path` in the page cache: mincore(2) on a read-only mapping (no byte read)."""
    size = os.path.getsize(path)
    if size == 0:
        return 1.0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return None
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = (ctypes.c_ubyte * pages)()
        rc = libc.mincore(addr, size, vec)
        libc.munmap(addr, size)
        return None if rc != 0 else sum(v & 1 for v in vec) / pages
    finally:
        os.close(fd)


def read_through(files):
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while fh.read(64 << 20):
                pass


def free_gpu():
    gc.collect()
    sync()
    if DEV != "cpu":
        torch.cuda.empty_cache()


# --- loaders: each returns {name: tensor on cuda:0} and an info dict -------------------------

def load_safetensors(spec):
    import safetensors.torch as stt

    d = {}
    for f in spec["files"]:
        d.update(stt.load_file(f, device=DEV))
    return d, {}


def load_gdx(spec):
    import gdx

    via = os.environ.get("CKPT_VIA", "auto")
    d, reps = gdx.load_safetensors(spec["target"], device=DEV, framework="pt", via=via,
                                   return_report=True)
    load = dict(reps[0].get("load") or {})
    load.pop("files", None)
    info = {"load": load, "files": [{k: r.get(k) for k in ("file", "path", "registered", "reason",
                                                            "page_cache_bytes", "direct_bytes")}
                                    for r in reps]}
    return d, info


def load_instanttensor(spec, buffered):
    from instanttensor import BackendPolicy, safe_open

    kw = {"backend": BackendPolicy.BUFFERED} if buffered else {}
    d = {}
    with safe_open(spec["files"], framework="pt", device=0, **kw) as f:
        for name, t in f.tensors():
            d[name] = t
    return d, {}


def load_fastsafetensors(spec):
    from fastsafetensors import fastsafe_open

    d = {}
    with fastsafe_open(filenames=spec["files"], nogds=True, device=DEV) as f:
        for k in f.keys():
            d[k] = f.get_tensor(k)
    return d, {}


def load_runai(spec):
    from runai_model_streamer import SafetensorsStreamer

    d = {}
    with SafetensorsStreamer() as s:
        s.stream_files(spec["files"], device="cpu")
        for name, t in s.get_tensors():
            d[name] = t.to(DEV)  # as vLLM does
    return d, {}


LOADERS = {
    "safetensors": load_safetensors,
    "gdx": load_gdx,
    "instanttensor-buffered": lambda s: load_instanttensor(s, True),
    "instanttensor": lambda s: load_instanttensor(s, False),
    "fastsafetensors": load_fastsafetensors,
    "runai": load_runai,
}


def run_load(spec):
    fn = LOADERS[spec["loader"]]
    out = {"times": {}, "left_cached": None, "info": {}}
    # CUDA and the library start before any clock: one untimed load (it also fills the page
    # cache for the warm rows).
    torch.empty(1, device=DEV)
    d, info = fn(spec)
    sync()
    del d
    free_gpu()
    plan = [(state, i) for state in spec["states"] for i in range(spec["reps"][state])]
    d = None
    warmed = False
    for state, _ in plan:
        if d is not None:
            del d
            free_gpu()
        if state == "cold":
            drop_caches(spec["files"])
        elif not warmed:
            # A loader that reads with O_DIRECT leaves the page cache as it was: fill it here.
            read_through(spec["files"])
            warmed = True
        t0 = time.perf_counter()
        d, info = fn(spec)
        sync()
        out["times"].setdefault(state, []).append(time.perf_counter() - t0)
        out["info"][state] = info
        if state == "cold":
            # Whether a cold load leaves the files in the page cache (the least cached file).
            fr = [cached_fraction(f) for f in spec["files"]]
            out["left_cached"] = None if None in fr else min(fr)
    last = d
    out["fingerprints"] = {k: fingerprint(v) for k, v in last.items()}
    out["tensors"] = len(last)
    return out


def run_reference(spec):
    """safetensors' own load (to host memory), fingerprinted: what every loader must match."""
    import safetensors.torch as stt

    torch.empty(1, device=DEV)
    fps = {}
    for f in spec["files"]:
        for k, v in stt.load_file(f, device="cpu").items():
            fps[k] = fingerprint(v)
    return {"fingerprints": fps}


# --- the files ----------------------------------------------------------------------------

def _shape_b(spec):
    """File B: a Llama-8B-shaped slice (hidden 4096, MLP 14336, 8 KV heads of 128), bf16,
    `layers` layers of 9 tensors, in two shards with an index."""
    h, i, kv = spec["hidden"], spec["mlp"], spec["kv"]
    for layer in range(spec["layers"]):
        p = f"model.layers.{layer}."
        yield layer, [(p + "self_attn.q_proj.weight", (h, h)), (p + "self_attn.k_proj.weight", (kv, h)),
                      (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.o_proj.weight", (h, h)),
                      (p + "mlp.gate_proj.weight", (i, h)), (p + "mlp.up_proj.weight", (i, h)),
                      (p + "mlp.down_proj.weight", (h, i)), (p + "input_layernorm.weight", (h,)),
                      (p + "post_attention_layernorm.weight", (h,))]


def run_make(spec):
    """Write file A (one file of equal tensors) and file B (two shards and an index)."""
    import safetensors.torch as stt

    torch.empty(1, device=DEV)
    g = torch.Generator(device=DEV).manual_seed(52)
    rnd = lambda shape: torch.randn(shape, generator=g, device=DEV, dtype=torch.bfloat16).cpu()  # noqa: E731
    a = {f"layer.{i:03d}.weight": rnd((spec["a_tensor_bytes"] // 2,)) for i in range(spec["a_tensors"])}
    stt.save_file(a, spec["a"])
    del a
    weight_map, total = {}, 0
    half = (spec["layers"] + 1) // 2
    shards = {0: {}, 1: {}}
    for layer, ts in _shape_b(spec):
        for name, shape in ts:
            shards[0 if layer < half else 1][name] = rnd(shape)
    os.makedirs(spec["b"], exist_ok=True)
    for k, part in shards.items():
        f = f"model-{k + 1:05d}-of-00002.safetensors"
        stt.save_file(part, os.path.join(spec["b"], f))
        weight_map.update({n: f for n in part})
        total += sum(t.nbytes for t in part.values())
    with open(os.path.join(spec["b"], "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh)
    os.sync()
    return {"b_tensors": len(weight_map), "b_bytes": total}


# --- floors and ceilings ------------------------------------------------------------------

def _direct_read(path, chunk, threads):
    """Read all of `path` with O_DIRECT into host memory, `threads` readers taking `chunk`-byte
    pieces in turn; returns the bytes read."""
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    next_at = [0]
    lock = threading.Lock()
    done = [0]

    def reader():
        buf = mmap.mmap(-1, chunk)
        while True:
            with lock:
                at = next_at[0]
                next_at[0] += chunk
            if at >= size:
                break
            n = os.preadv(fd, [buf], at)
            with lock:
                done[0] += min(n, size - at)
        buf.close()

    ts = [threading.Thread(target=reader) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    os.close(fd)
    return done[0]


def run_raw_read(spec):
    out = {}
    for key, chunk, threads in (("x1", 64 << 20, 1), ("x8", 16 << 20, 8)):
        best = None
        for _ in range(spec["reps"]):
            drop_caches(spec["files"])
            t0 = time.perf_counter()
            n = sum(_direct_read(f, chunk, threads) for f in spec["files"]) if threads == 1 else \
                _parallel_files(spec["files"], chunk, threads)
            s = time.perf_counter() - t0
            best = s if best is None or s < best else best
        out[key] = {"seconds": best, "bytes": n}
    return out


def _parallel_files(files, chunk, threads):
    res = []
    ts = [threading.Thread(target=lambda f=f: res.append(_direct_read(f, chunk, max(1, threads // len(files)))))
          for f in files]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(res)


def run_h2d(spec):
    torch.empty(1, device=DEV)
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(n, dtype=torch.uint8, device=DEV)
    dst.copy_(src, non_blocking=True)
    sync()
    best = None
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        sync()
        s = time.perf_counter() - t0
        best = s if best is None or s < best else best
    return {"gbps": n / best / 1e9}


# --- saves --------------------------------------------------------------------------------

def _fsync(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def run_save(spec):
    import safetensors.torch as stt

    torch.empty(1, device=DEV)
    g = torch.Generator(device=DEV).manual_seed(52)
    n = spec["tensor_bytes"] // 2
    tensors = {f"layer.{i:03d}.weight": torch.randn(n, generator=g, device=DEV, dtype=torch.bfloat16)
               for i in range(spec["tensors"])}
    total = sum(t.nbytes for t in tensors.values())
    path = os.path.join(spec["dir"], f"save-{spec['saver']}.bin")

    def gdx_save():
        import gdx

        return gdx.save_safetensors(tensors, path)

    def st_save():
        stt.save_file(tensors, path)
        _fsync(path)

    def torch_save():
        torch.save(tensors, path)
        _fsync(path)

    def raw_write(threads):
        host = mmap.mmap(-1, 64 << 20)
        host.write(os.urandom(1 << 20) * 64)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
        chunk = 64 << 20 if threads == 1 else 16 << 20
        nxt = [0]
        lock = threading.Lock()
        view = memoryview(host)[:chunk]

        def writer():
            while True:
                with lock:
                    at = nxt[0]
                    nxt[0] += chunk
                if at >= total:
                    break
                os.pwritev(fd, [view], at)

        ts = [threading.Thread(target=writer) for _ in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        os.fdatasync(fd)
        os.close(fd)

    fns = {"gdx": gdx_save, "safetensors": st_save, "torch.save": torch_save,
           "raw-odirect-x1": lambda: raw_write(1), "raw-odirect-x4": lambda: raw_write(4)}
    fn = fns[spec["saver"]]
    best, info = None, None
    for _ in range(spec["reps"]):
        if os.path.exists(path):
            os.unlink(path)
        drop_caches()
        sync()
        t0 = time.perf_counter()
        r = fn()
        s = time.perf_counter() - t0
        if best is None or s < best:
            best, info = s, (r if isinstance(r, dict) else None)
    out = {"seconds": best, "bytes": total, "info": info}
    if spec["saver"] == "gdx":
        # What gdx wrote, read back by safetensors, against the GPU tensors it came from.
        back = stt.load_file(path, device="cpu")
        bad = [k for k, v in tensors.items() if fingerprint(back[k]) != fingerprint(v)]
        out["bytes_ok"] = not bad and sorted(back) == sorted(tensors)
        out["bad"] = bad[:5]
    os.unlink(path)
    return out


# --- transformers ---------------------------------------------------------------------------

def run_transformers(spec):
    import gdx
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.empty(1, device=DEV)
    out = {}
    for tie in (False, True):
        cfg = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=3,
                          num_attention_heads=8, num_key_value_heads=4, vocab_size=2048,
                          max_position_embeddings=128, tie_word_embeddings=tie)
        d = os.path.join(spec["dir"], f"llama-tie{int(tie)}")
        torch.manual_seed(0)
        LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(d, safe_serialization=True,
                                                                 max_shard_size="2MB")
        try:
            ref = LlamaForCausalLM.from_pretrained(d, dtype=torch.bfloat16)
        except TypeError:
            ref = LlamaForCausalLM.from_pretrained(d, torch_dtype=torch.bfloat16)
        ref = ref.to(DEV).eval()
        # Built from the config as from_pretrained builds it (parameters made in bf16, the rotary
        # buffers, which no checkpoint holds, kept in float32), with other random weights.
        torch.manual_seed(1)
        try:
            mine = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        except TypeError:
            mine = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
        mine = mine.to(DEV).eval()
        ids = torch.randint(0, cfg.vocab_size, (2, 48), device=DEV)
        with torch.no_grad():
            differed = not torch.equal(ref(ids).logits, mine(ids).logits)
        missing, unexpected, reps = gdx.load_model(mine, d, return_report=True)
        with torch.no_grad():
            same = torch.equal(ref(ids).logits, mine(ids).logits)
        sd = gdx.load_safetensors(d, device=DEV, framework="pt")
        ref_sd = ref.state_dict()
        sd_same = all(torch.equal(v, ref_sd[k]) for k, v in sd.items())
        shards = len([f for f in os.listdir(d) if f.endswith(".safetensors")])
        out[f"tie={tie}"] = {"differed_before_load": differed, "identical_logits": same, "state_dict_equal": sd_same,
                             "missing": missing, "unexpected": unexpected, "shards": shards,
                             "summary": (reps[0].get("load") or {}).get("summary") if reps else None}
    return out


KINDS = {"make": run_make, "load": run_load, "reference": run_reference, "raw-read": run_raw_read, "h2d": run_h2d,
         "save": run_save, "transformers": run_transformers}

if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    try:
        result = KINDS[spec["kind"]](spec)
    except Exception as e:  # the row says why; the others still run
        import traceback

        traceback.print_exc()
        result = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(result))
