"""CUDA tensors (torch) as GPU regions: two processes on one GPU, host <-> GPU, stream= ordering.

Skipped (and counted by conftest's summary) where torch or CUDA is missing.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import gdx

from conftest import Peer, cuda_reason

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(cuda_reason() is not None, reason=str(cuda_reason()))]

MiB = 1 << 20

# The GPU-side peer: a gdx-allocated GPU pool ("gpool", IPC-capable), a torch tensor ("tpool")
# and the host regions of _peer.py's kind; dumps any of them to a file on request.
GPU_PEER = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np, torch, gdx
    a = gdx.Agent("gpu-target", secret=bytes.fromhex(os.environ["GDX_TEST_SECRET"]))
    gpool = a.alloc(4 << 20, name="gpool", access="rw", device="gpu:0")
    torch.as_tensor(gpool, device="cuda").zero_()
    t = torch.zeros(4 << 20, dtype=torch.uint8, device="cuda")
    tpool = a.register(t, name="tpool", access="rw")
    torch.cuda.synchronize()
    print(json.dumps({"address": a.address, "pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "dump":
            src = torch.as_tensor(gpool, device="cuda") if cmd["name"] == "gpool" else t
            src.cpu().numpy().tofile(cmd["path"])
        elif cmd["cmd"] == "exit":
            break
        print(json.dumps({"ok": True}), flush=True)
    """
)


class GpuPeer(Peer):
    def __init__(self, secret, tmp_path, env=None):
        script = tmp_path / "gpu_peer.py"
        script.write_text(GPU_PEER)
        e = dict(os.environ, GDX_TEST_SECRET=secret.hex(), **(env or {}))
        self.proc = subprocess.Popen(
            [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=e, text=True
        )
        hello = json.loads(self.proc.stdout.readline())
        self.address, self.pid = hello["address"], hello["pid"]


@pytest.fixture
def gpu_peer(secret, tmp_path):
    p = GpuPeer(secret, tmp_path)
    yield p
    p.close()


def test_cuda_tensor_registers_as_gpu_region(agent):
    import torch

    t = torch.arange(1024, dtype=torch.float32, device="cuda")
    r = agent.register(t, name="t")
    assert r.location == "gpu:0" and r.nbytes == 4096
    with pytest.raises(gdx.Error, match="contiguous"):
        agent.register(torch.zeros(64, 64, device="cuda")[:, ::2])
    r.close()


class DlpackOnly:
    """A CUDA array that offers only DLPack (no __cuda_array_interface__)."""

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, stream=None):
        return self.t.__dlpack__()

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


def test_dlpack_cuda_array_registers_and_moves(agent, gpu_peer, tmp_path):
    import torch

    t = torch.randint(0, 256, (64 * 4096,), dtype=torch.uint8, device="cuda")
    r = agent.register(DlpackOnly(t), access="none")
    assert r.location == "gpu:0" and r.nbytes == t.numel()
    p = agent.connect(gpu_peer.address, timeout=10)
    rd = p.region("gpool")
    res = p.write([(r, 0, rd, 0, r.nbytes)]).wait(timeout=60)
    assert res[0].path == "ipc", res[0]
    assert np.array_equal(gpu_peer.bytes("gpool", tmp_path)[: r.nbytes], t.cpu().numpy())
    with pytest.raises(gdx.Error, match="contiguous"):
        agent.register(DlpackOnly(torch.zeros(64, 64, dtype=torch.uint8, device="cuda")[:, ::2]))


def test_torch_to_torch_two_processes_one_gpu(agent, gpu_peer, tmp_path):
    import torch

    src = torch.randint(0, 256, (1000 * 4096,), dtype=torch.uint8, device="cuda")
    r = agent.register(src, access="none")
    p = agent.connect(gpu_peer.address, timeout=10)
    for target in ("gpool", "tpool"):
        rd = p.region(target)
        assert rd.location == "gpu:0"
        blocks = np.random.default_rng(5).permutation(rd.nbytes // 4096)[:1000]
        ops = [(r, i * 4096, rd, int(b) * 4096, 4096) for i, b in enumerate(blocks)]
        res = p.write(ops, stream=torch.cuda.current_stream()).wait(timeout=60)
        paths = {x.path for x in res}
        print(target, paths, res[0].reason)
        # Both go GPU to GPU: gdx's own allocation and a torch tensor (its cudaMalloc block's
        # IPC handle).
        assert paths == {"ipc"}, res[0]
        remote = gpu_peer.bytes(target, tmp_path).reshape(-1, 4096)
        host = src.cpu().numpy().reshape(-1, 4096)
        assert np.array_equal(remote[blocks], host)


def test_host_to_gpu_and_back(agent, gpu_peer, tmp_path):
    src = np.random.default_rng(9).integers(0, 256, 64 * 4096, dtype=np.uint8)
    r = agent.register(src, access="none")
    p = agent.connect(gpu_peer.address, timeout=10)
    rd = p.region("tpool")
    res = p.write([(r, i * 4096, rd, i * 4096, 4096) for i in range(64)]).wait(timeout=60)
    print({x.path for x in res}, res[0].reason)
    assert np.array_equal(gpu_peer.bytes("tpool", tmp_path)[: src.size], src)
    back = np.zeros_like(src)
    b = agent.register(back, access="none")
    p.read([(b, 0, rd, 0, src.size)]).wait(timeout=60)
    assert np.array_equal(back, src)


def test_stream_orders_the_write_after_queued_kernels(agent, gpu_peer, tmp_path):
    import torch

    n = 16 * MiB
    src = torch.zeros(n, dtype=torch.uint8, device="cuda")
    r = agent.register(src, access="none")
    p = agent.connect(gpu_peer.address, timeout=10)
    rd = p.region("gpool")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(200_000_000)  # a long kernel queued first ...
        src.fill_(0xAB)  # ... then the fill the write must see
    p.write([(r, 0, rd, 0, 4 * MiB)], stream=s).wait(timeout=60)
    remote = gpu_peer.bytes("gpool", tmp_path)
    assert (remote == 0xAB).all()


def test_strict_refuses_staging_between_gpus(secret, tmp_path):
    import torch

    # With the cudaMallocAsync backend torch's memory is stream-ordered pool memory, which no
    # handle gdx exports can name, so only staging reaches it.
    vmm_peer = GpuPeer(secret, tmp_path, env={"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"})
    try:
        with gdx.Agent("strict", secret=secret, strict=True) as a:
            t = torch.ones(4096, dtype=torch.uint8, device="cuda")
            r = a.register(t, access="none")
            p = a.connect(vmm_peer.address, timeout=10)
            rd = p.region("tpool")
            with pytest.raises(gdx.StrictViolation, match="pool memory"):
                p.write([(r, 0, rd, 0, 4096)]).wait(timeout=30)
    finally:
        vmm_peer.close()
