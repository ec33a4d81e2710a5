"""The worker side of the connector, free of vLLM types: registers the KV caches with gdx,
publishes the layout, pulls a request's blocks from the prefill engine, tracks completions
and failures, and releases the prefill's blocks when the decode engine says it is done.

Protocol (pull): the prefill engine keeps a finished request's blocks and hands out where they
are (``kv_transfer_params``: its agent's address and name, the block ids). The decode engine
connects (by address, or by name through etcd), reads the prefill's layout record and checks it
against its own (``LayoutMismatch`` before any KV byte moves), reads the blocks into the ones
vLLM allocated, then notifies the prefill ``gdx-vllm.done:<request id>`` so it frees them. A
prefill that hears nothing frees them after ``send_ttl`` seconds.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from .. import Agent, Error
from ._blocks import BlockReader
from ._layout import LAYOUT_BYTES, LAYOUT_REGION, KvLayout, LayoutMismatch, layout_of

DONE = b"gdx-vllm.done:"
MISMATCH_MEMORY_S = 60.0

#: ``kv_connector_extra_config`` keys and their defaults.
DEFAULTS: dict[str, Any] = {
    "listen": "127.0.0.1:0",  # where this worker's agent listens (port + TP rank if not 0)
    "agent_name": None,  # default gdx-vllm-<engine id>-tp<rank>
    "secret_file": None,  # else GDX_SECRET_FILE, else a per-process secret
    "etcd": None,  # etcd client URL(s): publish the agent and find peers by name
    "cluster": "vllm",  # the etcd cluster name
    "etcd_timeout": 3.0,  # seconds: bound on each etcd request
    "etcd_ttl": 10,  # seconds: a dead engine's name leaves etcd this long after its last beat
    "load": "async",  # "async": between steps; "layerwise": in the step, layer by layer
    "transfer_timeout": 30.0,  # seconds a read may take before the request is failed
    "connect_timeout": 5.0,  # seconds to reach the prefill engine
    "io_timeout": None,  # seconds a silent peer is given before it counts as lost (gdx: 10)
    "send_ttl": 120.0,  # seconds the prefill keeps blocks nobody has read
}


def options(extra: dict[str, Any] | None) -> dict[str, Any]:
    """The connector's options: ``extra`` over the defaults; unknown keys are refused."""
    extra = dict(extra or {})
    unknown = sorted(set(extra) - set(DEFAULTS))
    if unknown:
        raise Error(
            f"unknown gdx connector option(s) {unknown} in kv_connector_extra_config; "
            f"known: {sorted(DEFAULTS)}"
        )
    if extra.get("load", "async") not in ("async", "layerwise"):
        raise Error(f"load={extra['load']!r}: expected \"async\" or \"layerwise\"")
    return {**DEFAULTS, **extra}


@dataclass
class Load:
    """One request's read: remote blocks ``src`` into local blocks ``dst``."""

    req_id: str
    remote: dict[str, Any] | None  # {"address", "agent", "cluster"?, "pid"} of the prefill's worker
    remote_req_id: str
    src: list[int]
    dst: list[int]
    layerwise: bool = False  # in-step (sync) load: failures are reported as blocks
    transfers: list[Any] = field(default_factory=list)  # one, or one per layer
    peer: Any = None
    started: float = 0.0


@dataclass
class Stats:
    loads_done: int = 0
    loads_failed: int = 0
    blocks_loaded: int = 0
    bytes_loaded: int = 0
    layout_mismatches: int = 0
    sends_released: int = 0
    sends_expired: int = 0
    last_error: str | None = None


def _listen(addr: str, rank: int) -> str:
    host, _, port = addr.rpartition(":")
    return f"{host}:{int(port) + rank}" if int(port) else addr


class KvWorker:
    """One per vLLM worker (TP rank)."""

    def __init__(self, opts: dict[str, Any], engine_id: str, tp_rank: int, log=None):
        self.opts = opts
        self.tp_rank = tp_rank
        self.log = log or logging.getLogger(__name__)
        secret = None
        if opts["secret_file"]:
            with open(opts["secret_file"], "rb") as f:
                secret = f.read().strip()
        name = opts["agent_name"] or f"gdx-vllm-{engine_id}-tp{tp_rank}"
        if opts["agent_name"] and tp_rank:
            name = f"{name}-tp{tp_rank}"
        self.agent = Agent(
            name,
            listen=_listen(opts["listen"], tp_rank),
            secret=secret,
            io_timeout=opts["io_timeout"],
        )
        self.layout: KvLayout | None = None
        self.regions: dict[str, Any] = {}
        self.readers: dict[tuple[str, str], BlockReader] = {}
        # Peers whose layout differs from ours: refused again at once, without reconnecting,
        # for MISMATCH_MEMORY_S (a restarted peer may have been fixed).
        self.mismatched: dict[tuple[str, str], tuple[LayoutMismatch, float]] = {}
        self.loads: dict[str, Load] = {}
        self.sends: dict[str, float] = {}  # req id -> when to give up waiting
        self.done_notes: set[str] = set()
        self.finished_recving: set[str] = set()
        self.failed_recving: set[str] = set()
        self.failed_blocks: set[int] = set()
        self.stats = Stats()

    # -- registration ---------------------------------------------------------------------

    def register(self, kv_caches: dict[str, Any], **geometry: Any) -> KvLayout:
        """Registers the storages under ``kv_caches`` once and publishes the layout."""
        import torch

        layout, storages = layout_of(kv_caches, tp_rank=self.tp_rank, **geometry)
        for i, st in enumerate(storages):
            flat = torch.empty(0, dtype=torch.uint8, device=st.device)
            flat.set_(st, 0, (st.nbytes(),))
            self.regions[f"gdx-vllm.kv.{i}"] = self.agent.register(
                flat, name=f"gdx-vllm.kv.{i}", access="rw"
            )
        raw = layout.to_bytes()
        if len(raw) > LAYOUT_BYTES:
            raise Error(f"the KV layout record is {len(raw)} bytes, over {LAYOUT_BYTES}")
        self._layout_buf = bytearray(raw.ljust(LAYOUT_BYTES, b"\0"))
        self.regions[LAYOUT_REGION] = self.agent.register(
            self._layout_buf, name=LAYOUT_REGION, access="r"
        )
        self.layout = layout
        if self.opts["etcd"]:
            # After the regions: joining publishes the ones registered so far.
            self.agent.join_cluster(
                self.opts["etcd"],
                self.opts["cluster"],
                ttl=int(self.opts["etcd_ttl"]),
                timeout=self.opts["etcd_timeout"],
            )
        self.log.info(
            "gdx: %d KV layer(s), %d region(s), block %d B; agent %s at %s%s",
            layout.num_layers,
            len(storages),
            layout.block_bytes,
            self.agent.name,
            self.agent.address,
            f", cluster {self.opts['cluster']} at {self.opts['etcd']}" if self.opts["etcd"] else "",
        )
        return layout

    def handshake(self) -> dict[str, Any]:
        """What the scheduler hands to decode engines: how to reach this worker."""
        h = {"address": self.agent.address, "agent": self.agent.name, "pid": os.getpid()}
        if self.opts["etcd"]:
            h["cluster"] = self.opts["cluster"]
        return h

    # -- the decode side ------------------------------------------------------------------

    def _reader(self, remote: dict[str, Any]) -> BlockReader:
        """The connection to ``remote`` with its layout checked (made once, then reused)."""
        by_name = bool(self.opts["etcd"] and remote.get("cluster"))
        key = ("etcd", remote["agent"]) if by_name else ("addr", remote["address"])
        r = self.readers.get(key)
        if r is not None and r.peer.alive:
            return r
        e, until = self.mismatched.get(key, (None, 0.0))
        if e is not None and time.monotonic() < until:
            raise e
        if by_name:
            if remote["cluster"] != self.opts["cluster"]:
                raise Error(
                    f"the prefill engine is in cluster {remote['cluster']!r}, this one in "
                    f"{self.opts['cluster']!r}: set the same \"cluster\" on both"
                )
            peer = self.agent.connect_named(remote["agent"])
            who = f"{remote['agent']} (etcd, cluster {remote['cluster']})"
        else:
            peer = self.agent.connect(remote["address"], timeout=self.opts["connect_timeout"])
            who = f"{remote['agent']} at {remote['address']}"
        try:
            r = self._check_and_plan(peer, who)
        except LayoutMismatch as e:
            self.mismatched[key] = (e, time.monotonic() + MISMATCH_MEMORY_S)
            peer.close()
            raise
        except BaseException:
            peer.close()
            raise
        self.readers[key] = r
        self.log.info("gdx: connected to %s over %s, layouts match", who, peer.transport)
        return r

    def _check_and_plan(self, peer: Any, who: str) -> BlockReader:
        """Reads ``peer``'s layout record, checks it against ours, plans the block reads."""
        rd = peer.region(LAYOUT_REGION)
        buf = self.agent.alloc(rd.nbytes)
        peer.read([(buf, 0, rd, 0, rd.nbytes)]).wait(timeout=self.opts["connect_timeout"])
        theirs = KvLayout.from_bytes(bytes(buf.view()))
        buf.close()
        self.layout.check(theirs, who)
        names = {seg[0] for layer in theirs.segments for seg in layer}
        remote_regions = {n: peer.region(n) for n in names}
        return BlockReader(
            peer,
            self.layout,
            self.regions,
            theirs,
            remote_regions,
            timeout=self.opts["transfer_timeout"],
        )

    def start(self, load: Load) -> None:
        """Starts reading ``load``'s blocks; a failure marks the request failed (never raises)."""
        load.started = time.monotonic()
        try:
            if not load.remote:
                raise Error(
                    f"the prefill engine has no TP rank {self.tp_rank}: start both engines with "
                    "the same --tensor-parallel-size"
                )
            r = self._reader(load.remote)
            load.peer = r.peer
            if load.layerwise:
                load.transfers = [
                    r.post(load.src, load.dst, layers=[i]) for i in range(self.layout.num_layers)
                ]
            else:
                load.transfers = [r.post(load.src, load.dst)]
        except Exception as e:  # noqa: BLE001  every failure becomes the request's failure
            self._fail(load, e)
            return
        self.loads[load.req_id] = load

    def wait_layer(self, layer: int) -> None:
        """Layer-wise loads: waits for ``layer`` of every running load."""
        for load in list(self.loads.values()):
            if len(load.transfers) > layer:
                try:
                    load.transfers[layer].wait(timeout=self.opts["transfer_timeout"])
                except Exception as e:  # noqa: BLE001
                    del self.loads[load.req_id]
                    self._fail(load, e)

    def _fail(self, load: Load, e: Exception) -> None:
        if isinstance(e, LayoutMismatch):
            self.stats.layout_mismatches += 1
        self.stats.loads_failed += 1
        self.stats.last_error = f"{type(e).__name__}: {e}"
        if load.layerwise:
            # A load inside the step: vLLM learns of it by block, in the same step.
            self.failed_blocks.update(load.dst)
        else:
            # An async load: failed requests are still reported finished, so vLLM stops
            # waiting and recomputes or fails them (kv_load_failure_policy).
            self.failed_recving.add(load.req_id)
            self.finished_recving.add(load.req_id)
        self.log.error(
            "gdx: loading the KV of request %s (%d blocks) from %s failed after %.3f s: %s: %s",
            load.req_id,
            len(load.dst),
            (load.remote or {}).get("agent"),
            time.monotonic() - load.started,
            type(e).__name__,
            e,
        )

    def _finish(self, load: Load) -> None:
        self.stats.loads_done += 1
        self.stats.blocks_loaded += len(load.dst)
        lay = self.layout
        self.stats.bytes_loaded += (
            len(load.dst) * lay.block_bytes * lay.num_layers * lay.segments_per_layer
        )
        if not load.layerwise:
            self.finished_recving.add(load.req_id)
        try:
            load.peer.notify(DONE + load.remote_req_id.encode())
        except Error as e:
            # The bytes are here; the prefill frees its blocks after send_ttl instead.
            self.log.warning(
                "gdx: telling %s that request %s is read: %s", load.remote.get("agent"), load.req_id, e
            )
        self.log.info(
            "gdx: loaded %d block(s) of request %s in %.3f s",
            len(load.dst),
            load.req_id,
            time.monotonic() - load.started,
        )

    def poll_loads(self) -> None:
        for req_id, load in list(self.loads.items()):
            if not all(t.done() for t in load.transfers):
                continue
            del self.loads[req_id]
            try:
                for t in load.transfers:
                    t.wait(timeout=0)
            except Exception as e:  # noqa: BLE001
                self._fail(load, e)
            else:
                self._finish(load)

    # -- the prefill side -----------------------------------------------------------------

    def hold(self, req_id: str) -> None:
        """The scheduler kept ``req_id``'s blocks for a decode engine to read."""
        self.sends[req_id] = time.monotonic() + self.opts["send_ttl"]

    def poll_sends(self) -> set[str]:
        while (n := self.agent.try_notification()) is not None:
            if n.data.startswith(DONE):
                self.done_notes.add(n.data[len(DONE) :].decode())
        released = set()
        now = time.monotonic()
        for req_id, deadline in list(self.sends.items()):
            if req_id in self.done_notes:
                self.done_notes.discard(req_id)
                self.stats.sends_released += 1
                self.log.info("gdx: request %s was read by its decode engine; freeing its blocks", req_id)
            elif now > deadline:
                self.stats.sends_expired += 1
                self.log.warning(
                    "gdx: no decode engine read request %s within send_ttl=%ss; freeing its blocks",
                    req_id,
                    self.opts["send_ttl"],
                )
            else:
                continue
            del self.sends[req_id]
            released.add(req_id)
        return released

    def take_results(self) -> tuple[set[str], set[str], set[str]]:
        """(finished sending, finished receiving, failed receiving) since the last call."""
        self.poll_loads()
        sending = self.poll_sends()
        recving, failed = self.finished_recving, self.failed_recving
        self.finished_recving, self.failed_recving = set(), set()
        return sending, recving, failed

    def take_failed_blocks(self) -> set[int]:
        b, self.failed_blocks = self.failed_blocks, set()
        return b

    def close(self) -> None:
        for r in self.readers.values():
            r.peer.close()
        self.agent.close()
