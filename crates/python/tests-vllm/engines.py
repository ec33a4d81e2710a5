"""One harness process (``harness.py``) as seen by its driver (the test's conftest, bench.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


class EngineFailed(RuntimeError):
    """An engine exited, hung or failed; the message ends with its log's tail."""


class Engine:
    """One harness process; its log is kept for the assertions."""

    def __init__(self, workdir: Path, name: str, args: list[str], env: dict | None = None):
        self.name, self.log_path = name, workdir / f"{name}.log"
        self.out = workdir / f"{name}.json"
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "harness.py"), *args, "--out", str(self.out)],
            stdout=open(self.log_path, "wb"),
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(HERE), **(env or {})},
            # Its own process group: vLLM's engine core and workers (spawned) stay in it, so
            # stop() can end them too when the harness itself died first.
            start_new_session=True,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, deadline: float, suffix: str = "") -> dict | None:
        path = self.out.parent / (self.out.name + suffix)
        while not path.exists():
            if self.proc.poll() is not None:
                raise EngineFailed(f"{self.name} exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
            if time.monotonic() > deadline:
                self.proc.kill()
                raise EngineFailed(f"{self.name} not ready in time:\n{self.log()[-4000:]}")
            time.sleep(0.5)
        return None if suffix else json.loads(self.out.read_text())

    def finish(self, deadline: float) -> dict:
        try:
            self.proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise EngineFailed(f"{self.name} did not finish in time:\n{self.log()[-4000:]}")
        if self.proc.returncode != 0:
            raise EngineFailed(f"{self.name} exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
        return json.loads(self.out.read_text())

    def stop(self) -> None:
        """Ends the engine and the worker processes it spawned, which outlive a killed parent."""
        (self.out.parent / (self.out.name + ".stop")).touch()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


