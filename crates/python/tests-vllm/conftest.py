"""Fixtures of the vLLM end-to-end test: the tiny model, a real etcd, and the engine runs.

The engines are separate processes (``harness.py``), started once for the module and shared
by the tests, because each vLLM start costs tens of seconds on a small CPU host. Network bounds
are generous (a loaded 2-core host starves processes for seconds); a killed peer is still seen
at once, when its connection resets.

- prefill A (etcd name ``prefill-a``) holds four copies of the prompts' KV: copy 0 for the
  plain decode, copy 1 for the corrupted one, copy 2 for the mismatched decode, copy 3 for the
  layer-wise one;
- prefill B (direct address only) holds one copy, and is killed mid-read;
- decode 1 (block size 32, etcd, kv_load_failure_policy=recompute, faults.FaultyGdxConnector)
  generates A:0 (plain), A:1 (one block corrupted after it landed), B:0 (prefill killed);
- decode 2 (block size 64: its layout differs; direct address; policy fail) generates A:2;
- decode 3 (load=layerwise: read inside the step, one transfer per layer) generates A:3.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from engines import HERE, Engine

#: Bound on the whole run of engines (start, generation, exit).
ENGINE_TIMEOUT_S = 420


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def workdir():
    d = Path(tempfile.mkdtemp(prefix="gdx-vllm-"))
    yield d
    if not os.environ.get("GDX_VLLM_KEEP"):
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def model(workdir):
    out = workdir / "tiny"
    subprocess.run(
        [sys.executable, str(HERE / "make_model.py"), str(HERE / "models" / "tiny.json"), str(out)],
        check=True,
        capture_output=True,
    )
    return out


@pytest.fixture(scope="session")
def etcd(workdir):
    exe = os.environ.get("GDX_ETCD_BIN") or shutil.which("etcd")
    if not exe:
        pytest.fail("etcd is not installed: apt-get install etcd-server (scripts/bootstrap.sh does)")
    client, peer = _free_port(), _free_port()
    url = f"http://127.0.0.1:{client}"
    log = open(workdir / "etcd.log", "wb")
    p = subprocess.Popen(
        [exe, "--data-dir", str(workdir / "etcd"), "--listen-client-urls", url,
         "--advertise-client-urls", url, "--listen-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-cluster", f"default=http://127.0.0.1:{peer}"],
        stdout=log, stderr=log,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", client), timeout=1).close()
            break
        except OSError:
            time.sleep(0.2)
    else:
        p.kill()
        pytest.fail(f"etcd did not start: see {workdir / 'etcd.log'}")
    yield url
    p.terminate()
    p.wait(10)


def _conn(**cfg) -> str:
    extra = cfg.pop("extra")
    return json.dumps({**cfg, "kv_connector_extra_config": extra})


@pytest.fixture(scope="session")
def runs(workdir, model, etcd):
    """Runs the four engines (see the module docstring); returns their documents and logs.

    All four start at once; the prefills hold KV (and vLLM's loop spins while they do) only
    once both decode engines are up.
    """
    # Generous network bounds: a loaded CI host (or this 2-core one) can starve a process for
    # seconds; the failure tests bound what matters on their own.
    net = {"connect_timeout": 30.0, "etcd_timeout": 15.0, "etcd_ttl": 60, "io_timeout": 30.0,
           "send_ttl": 600.0}
    secret = workdir / "secret"
    secret.write_text(os.urandom(32).hex())  # text: a secret file loses trailing whitespace
    secret.chmod(0o600)
    m = ["--model", str(model)]
    go, faults, mark = workdir / "go", workdir / "faults.json", workdir / "kill-mark.json"
    deadline = time.monotonic() + ENGINE_TIMEOUT_S
    pre_a = Engine(workdir, "prefill-a", ["prefill", *m, "--copies", "4", "--go", str(go),
        "--connector", _conn(extra={"secret_file": str(secret), "etcd": etcd,
                                    "agent_name": "prefill-a", **net})])
    pre_b = Engine(workdir, "prefill-b", ["prefill", *m, "--copies", "1", "--go", str(go),
        "--connector", _conn(extra={"secret_file": str(secret), **net})])
    d1 = Engine(workdir, "decode-1", [
        "decode", *m, "--requests", f"{pre_a.out}:0", f"{pre_a.out}:1", f"{pre_b.out}:0",
        "--wait-for", str(faults), "--connector", _conn(
            kv_connector="FaultyGdxConnector", kv_connector_module_path="faults",
            kv_load_failure_policy="recompute",
            extra={"secret_file": str(secret), "etcd": etcd, "agent_name": "decode-1",
                   "transfer_timeout": 20.0, **net})],
        env={"GDX_VLLM_TEST_FAULTS": str(faults)})
    d2 = Engine(workdir, "decode-2", [
        "decode", *m, "--block-size", "64", "--requests", f"{pre_a.out}:2",
        "--connector", _conn(kv_load_failure_policy="fail",
                             extra={"secret_file": str(secret), **net})])
    d3 = Engine(workdir, "decode-3", [
        "decode", *m, "--requests", f"{pre_a.out}:3", "--connector", _conn(
            kv_load_failure_policy="fail",
            extra={"secret_file": str(secret), "load": "layerwise", **net})])
    engines = [pre_a, pre_b, d1, d2, d3]
    try:
        for d in (d1, d2, d3):
            d.wait_ready(deadline, suffix=".ready")
        go.touch()
        a, b = pre_a.wait_ready(deadline), pre_b.wait_ready(deadline)
        # The KV lives in prefill B's worker process (vLLM's engine core spawns it).
        b_rank = b["params"][0][0]["remote_ranks"][0]
        doc = {"corrupt": [p["remote_request_id"] for p in a["params"][1]],
               "kill": {"pid": b_rank["pid"], "address": b_rank["address"]}, "mark": str(mark)}
        (workdir / "faults.tmp").write_text(json.dumps(doc))
        os.replace(workdir / "faults.tmp", faults)
        r1, r2, r3 = d1.finish(deadline), d2.finish(deadline), d3.finish(deadline)
    finally:
        for e in engines:
            e.stop()
    return {
        "a": a, "b": b, "d1": r1, "d2": r2, "d3": r3,
        "mark": json.loads(mark.read_text()) if mark.exists() else None,
        "log": {e.name: e.log() for e in engines},
    }
