"""Fixtures for the gdx tests: a second process to talk to, a shared secret, and the count of
GPU tests skipped here (printed at the end, so a run on a CPU machine says what it left out).

GPU tests carry ``@pytest.mark.gpu``; they run where torch sees a GPU and gdx can load CUDA.
"""

import json
import os
import secrets
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import gdx

HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (and torch); skipped and counted elsewhere")


def cuda_reason():
    """None when GPU tests can run here, else why not."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA GPU"
    ok, why = gdx.cuda_available()
    return None if ok else f"gdx cannot use CUDA: {why}"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    skipped = terminalreporter.stats.get("skipped", [])
    gpu = [r for r in skipped if "gpu" in getattr(r, "keywords", {})]
    ran = [
        r
        for key in ("passed", "failed")
        for r in terminalreporter.stats.get(key, [])
        if "gpu" in getattr(r, "keywords", {}) and r.when == "call"
    ]
    terminalreporter.write_line(
        f"gdx: {len(gpu)} GPU test(s) skipped, {len(ran)} GPU test(s) ran"
        + (f" ({cuda_reason()})" if gpu else "")
    )


@pytest.fixture
def secret():
    # Hex text: a secret file loses trailing whitespace bytes, so raw random bytes could differ
    # between secret= and GDX_SECRET_FILE.
    return secrets.token_hex(32).encode()


class Peer:
    """The other process (_peer.py): start it, send it commands, kill it."""

    def __init__(self, secret=None, env=None):
        e = dict(os.environ)
        e.pop("GDX_SECRET_FILE", None)
        if secret is not None:
            e["GDX_TEST_SECRET"] = secret.hex()
        e.update(env or {})
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "_peer.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=e,
            text=True,
        )
        hello = json.loads(self.proc.stdout.readline())
        self.address = hello["address"]
        self.pid = hello["pid"]

    def ask(self, cmd, **kw):
        self.proc.stdin.write(json.dumps(dict(cmd=cmd, **kw)) + "\n")
        self.proc.stdin.flush()
        out = json.loads(self.proc.stdout.readline())
        assert out["ok"], out
        return out

    def bytes(self, name, tmp_path):
        path = tmp_path / f"{name}.bin"
        self.ask("dump", name=name, path=str(path))
        return np.fromfile(path, dtype=np.uint8)

    def kill(self, sig=signal.SIGKILL):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self):
        """SIGSTOP the peer and return once every thread of it has stopped: the signal is
        delivered asynchronously, and a thread running on another core (the shm ring's) could
        still serve a request in the meantime."""
        os.kill(self.proc.pid, signal.SIGSTOP)
        tasks = f"/proc/{self.proc.pid}/task"
        deadline = time.monotonic() + 10
        while True:
            states = []
            for t in os.listdir(tasks):
                try:
                    with open(f"{tasks}/{t}/stat") as f:
                        states.append(f.read().rsplit(")", 1)[1].split()[0])
                except FileNotFoundError:  # a thread that ended meanwhile
                    pass
            if states and all(st in "tT" for st in states):
                return
            assert time.monotonic() < deadline, f"peer {self.proc.pid} did not stop: {states}"
            time.sleep(0.001)

    def close(self):
        if self.proc.poll() is None:
            self.kill(signal.SIGCONT)
            self.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def peer(secret):
    p = Peer(secret)
    yield p
    p.close()


@pytest.fixture
def agent(secret):
    with gdx.Agent("initiator", listen="127.0.0.1:0", secret=secret) as a:
        yield a
