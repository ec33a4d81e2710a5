"""The GPU side of the foreign-memory tests (test_foreign_gpu.py): an agent that registers GPU
memory from one framework's allocator and obeys JSON-line commands on stdin.

argv[1], the allocator: ``torch`` (cudaMalloc caching allocator; the test may set ``PYTORCH_CUDA_ALLOC_CONF``), ``torch-expandable``
(``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, VMM; set by the test in the
environment), ``cupy`` (CuPy's pool over cudaMalloc), ``jax`` (XLA's allocator, registered
through DLPack), ``gdx`` (Agent.alloc). Regions:

- ``buf``  8 MiB, zeroed (for ``jax``: read-only, bytes i % 251)
- ``view`` bytes 1 MiB .. 3 MiB of the same allocation as ``buf`` (a block of a KV pool)

Commands: ``dump`` (name, path: the region's bytes to a file), ``stats`` (gdx.ipc_stats()),
``exit``.
"""

import json
import os
import sys

import numpy as np

import gdx

MiB = 1 << 20


def main():
    kind = sys.argv[1]
    agent = gdx.Agent("gpu-target", secret=bytes.fromhex(os.environ["GDX_TEST_SECRET"]))
    if kind in ("torch", "torch-expandable"):
        import torch

        buf = torch.zeros(8 * MiB, dtype=torch.uint8, device="cuda")
        view = buf[MiB:3 * MiB]
        torch.cuda.synchronize()

        def host(t):
            return t.cpu().numpy()
    elif kind == "cupy":
        import cupy

        buf = cupy.zeros(8 * MiB, dtype=cupy.uint8)
        view = buf[MiB:3 * MiB]
        cupy.cuda.runtime.deviceSynchronize()

        def host(t):
            return cupy.asnumpy(t)
    elif kind == "jax":
        import jax
        import jax.numpy as jnp

        # JAX arrays are immutable (their DLPack export is read-only): peers read this one,
        # bytes i % 251.
        buf = jax.device_put((jnp.arange(8 * MiB, dtype=jnp.uint32) % 251).astype(jnp.uint8),
                             jax.devices("gpu")[0])
        buf.block_until_ready()
        view = None  # a JAX slice is a copy, not a view: only the whole buffer is registered

        def host(t):
            return np.asarray(jax.device_get(t))
    elif kind == "gdx":
        buf = agent.alloc(8 * MiB, name="buf", access="rw", device="gpu:0")
        view = None

        def host(t):
            import torch

            return torch.as_tensor(t, device="cuda").cpu().numpy()
    else:
        raise SystemExit(f"unknown allocator {kind}")
    regions = {}
    if kind != "gdx":
        regions["buf"] = agent.register(buf, name="buf", access="r" if kind == "jax" else "rw")
    if view is not None:
        regions["view"] = agent.register(view, name="view", access="rw")
    arrays = {"buf": buf, "view": view}
    print(json.dumps({"address": agent.address, "pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        out = {"ok": True}
        if cmd["cmd"] == "dump":
            host(arrays[cmd["name"]]).tofile(cmd["path"])
        elif cmd["cmd"] == "stats":
            out.update(gdx.ipc_stats())
        elif cmd["cmd"] == "exit":
            print(json.dumps(out), flush=True)
            return
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
