"""Faults for the end-to-end test, injected from a GdxConnector subclass (test code only).

Loaded by the decode engine through ``kv_connector_module_path="faults"`` with
``kv_connector="FaultyGdxConnector"``; configured by the JSON file ``GDX_VLLM_TEST_FAULTS``
names (read at the first load; the engine's processes inherit the variable), with keys:

- ``corrupt``: a list of prefill request ids; when such a request's blocks
  have landed, one of them (its first block, layer 0) is overwritten with random values before
  vLLM uses it. The outputs must then differ from the baseline: the test would see wrong bytes.
- ``kill`` = ``{"pid": PID, "address": ADDRESS}``: a load from the prefill worker at ADDRESS (process
  PID, where the KV lives) connects (layout checked), then that process is stopped (SIGSTOP),
  the read is posted, and the process is killed (SIGKILL) while the read is outstanding.
- ``mark``: a file recording whether the read was still outstanding at the kill.
"""

from __future__ import annotations

import json
import os
import signal
import time

import torch

from gdx.vllm import GdxConnector


def _wait_stopped(pid: int) -> None:
    """Until the kernel shows ``pid`` stopped (state T), at most 5 s."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.001)
    raise RuntimeError(f"process {pid} did not stop within 5 s of SIGSTOP")


class FaultyGdxConnector(GdxConnector):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self._faults: dict | None = None
        self._loading: dict[str, tuple[str, list[int]]] = {}
        self._kv: dict[str, torch.Tensor] = {}

    def register_kv_caches(self, kv_caches):
        self._kv = kv_caches
        super().register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context, **kwargs):
        meta = self._get_connector_metadata()
        if meta.loads and self._faults is None:
            with open(os.environ["GDX_VLLM_TEST_FAULTS"]) as f:
                self._faults = json.load(f)
        kill = (self._faults or {}).get("kill") or {}
        victims = [m for m in meta.loads if m["remote_ranks"][0]["address"] == kill.get("address")]
        for m in meta.loads:
            self._loading[m["req_id"]] = (m["remote_req_id"], m["dst"])
        if not victims:
            return super().start_load_kv(forward_context, **kwargs)
        # Connect (and check layouts) while the prefill still answers, then freeze it so the
        # read cannot complete, post the read, and kill the prefill under it.
        self.worker._reader(victims[0]["remote_ranks"][0])
        pid = int(kill["pid"])
        os.kill(pid, signal.SIGSTOP)
        _wait_stopped(pid)
        super().start_load_kv(forward_context, **kwargs)
        pending = [self.worker.loads.get(m["req_id"]) for m in victims]
        outstanding = all(
            ld is not None and not all(t.done() for t in ld.transfers) for ld in pending
        )
        os.kill(pid, signal.SIGKILL)
        self._faults["kill"] = None
        with open(self._faults["mark"], "w") as f:
            json.dump({"outstanding_at_kill": outstanding, "killed_at": time.time()}, f)

    def get_transfer_results(self, finished_req_ids):
        r = super().get_transfer_results(finished_req_ids)
        for req_id in r.finished_recving - r.failed_recving:
            remote_req_id, dst = self._loading.pop(req_id, ("", []))
            if dst and remote_req_id in (self._faults or {}).get("corrupt", ()):
                layer0 = next(iter(self._kv.values()))
                g = torch.Generator().manual_seed(0)
                layer0[dst[0]] = torch.randn(layer0[dst[0]].shape, generator=g) * 100
        return r


__all__ = ["FaultyGdxConnector"]
