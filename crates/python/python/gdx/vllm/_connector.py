"""``GdxConnector``: vLLM's ``KVConnectorBase_V1`` over gdx (imports vLLM; see ``gdx.vllm``).

Scheduler side: a prefill engine (``kv_transfer_params={"do_remote_decode": True}``) keeps a
finished request's blocks and returns where they are; a decode engine given those params
(``do_remote_prefill``) asks for the prompt's tokens to be loaded, learns which local blocks
vLLM allocated and tells its worker. Worker side: ``_worker.KvWorker``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
)
from vllm.logger import init_logger
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from ._worker import KvWorker, Load, options

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = init_logger("vllm.gdx")


@dataclass
class GdxMetadata(KVConnectorMetadata):
    """Scheduler -> worker, per step: loads to start, requests whose blocks are now held."""

    loads: list[dict[str, Any]] = field(default_factory=list)
    holds: list[str] = field(default_factory=list)


@dataclass
class GdxHandshake(KVConnectorHandshakeMetadata):
    """Worker -> scheduler, once: how decode engines reach this worker's agent."""

    info: dict[str, Any]


class GdxConnector(KVConnectorBase_V1):
    """Disaggregated prefill over gdx: the decode engine pulls the prompt's KV blocks."""

    _cache_hit_source = CacheHitSource.P2P

    def __init__(
        self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: "KVCacheConfig"
    ):
        super().__init__(vllm_config, role, kv_cache_config)
        self.opts = options(self._kv_transfer_config.kv_connector_extra_config)
        self.layerwise = self.opts["load"] == "layerwise"
        self.block_size = vllm_config.cache_config.block_size
        self.engine_id = self._kv_transfer_config.engine_id
        # Scheduler state.
        self._ranks: list[dict[str, Any]] = []
        self._local_tokens: dict[str, int] = {}
        self._meta = GdxMetadata()
        # Worker state.
        self.worker: KvWorker | None = None
        self._layer_index: dict[str, int] = {}
        if role == KVConnectorRole.WORKER:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

            self.worker = KvWorker(
                self.opts, str(self.engine_id), get_tensor_model_parallel_rank(), log=logger
            )

    # ==== scheduler side ====================================================================

    def set_xfer_handshake_metadata(self, metadata: dict[int, KVConnectorHandshakeMetadata]):
        self._ranks = [metadata[r].info for r in sorted(metadata)]  # type: ignore[attr-defined]

    def get_num_new_matched_tokens(
        self, request: "Request", num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        p = request.kv_transfer_params
        if not (p and p.get("do_remote_prefill") and p.get("remote_block_ids")):
            return 0, False
        # The last prompt token is always computed here: its logits give the first token.
        n = min(
            int(p.get("remote_num_tokens") or 0),
            request.num_prompt_tokens - 1,
            len(p["remote_block_ids"]) * self.block_size,
        )
        count = n - num_computed_tokens
        if count <= 0:
            return 0, False
        self._local_tokens[request.request_id] = num_computed_tokens
        return count, not self.layerwise

    def update_state_after_alloc(
        self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int
    ):
        p = request.kv_transfer_params
        if not (p and p.get("do_remote_prefill")):
            return
        # Loaded once: a preempted request recomputes rather than reloads.
        p["do_remote_prefill"] = False
        local = self._local_tokens.pop(request.request_id, 0)
        if num_external_tokens <= 0:
            return
        b = self.block_size
        first, last = local // b, -(-(local + num_external_tokens) // b)
        ranks = p.get("remote_ranks") or []
        if len(ranks) != len(self._ranks or [None]):
            logger.warning(
                "gdx: request %s: the prefill engine has %d TP rank(s), this one %d; the "
                "workers will refuse the load (layouts differ)",
                request.request_id,
                len(ranks),
                len(self._ranks),
            )
        self._meta.loads.append(
            {
                "req_id": request.request_id,
                "remote_ranks": ranks,
                "remote_req_id": p["remote_request_id"],
                "src": list(p["remote_block_ids"][first:last]),
                "dst": list(blocks.get_block_ids()[0][first:last]),
            }
        )

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        meta, self._meta = self._meta, GdxMetadata()
        return meta

    def request_finished(
        self, request: "Request", block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        from vllm.v1.request import RequestStatus

        p = request.kv_transfer_params
        if not (p and p.get("do_remote_decode")):
            return False, None
        ok = request.status in (RequestStatus.FINISHED_LENGTH_CAPPED, RequestStatus.FINISHED_STOPPED)
        if not ok or not block_ids:
            return False, None
        self._meta.holds.append(request.request_id)
        return True, {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": list(block_ids),
            "remote_request_id": request.request_id,
            "remote_num_tokens": request.num_computed_tokens,
            "remote_engine_id": str(self.engine_id),
            "remote_ranks": self._ranks,
        }

    # ==== worker side =======================================================================

    def register_kv_caches(self, kv_caches: dict[str, Any]):
        cfg = self._vllm_config
        layout = self.worker.register(
            kv_caches,
            num_blocks=self._kv_cache_config.num_blocks,
            block_size=self.block_size,
            num_kv_heads=cfg.model_config.get_num_kv_heads(cfg.parallel_config),
            head_size=cfg.model_config.get_head_size(),
            tp_size=cfg.parallel_config.tensor_parallel_size,
        )
        self._layer_index = {n: i for i, n in enumerate(layout.layer_names)}

    def get_handshake_metadata(self) -> KVConnectorHandshakeMetadata | None:
        return GdxHandshake(self.worker.handshake())

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, GdxMetadata)
        for req_id in meta.holds:
            self.worker.hold(req_id)
        rank = self.worker.tp_rank
        for m in meta.loads:
            ranks = m["remote_ranks"]
            load = Load(
                req_id=m["req_id"],
                # None: the prefill has no rank of ours; the worker fails the load by name.
                remote=ranks[rank] if rank < len(ranks) else None,
                remote_req_id=m["remote_req_id"],
                src=m["src"],
                dst=m["dst"],
                layerwise=self.layerwise,
            )
            self.worker.start(load)

    def wait_for_layer_load(self, layer_name: str) -> None:
        if self.layerwise and layer_name in self._layer_index:
            self.worker.wait_layer(self._layer_index[layer_name])

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any):
        # Pull model: the decode engine reads the prefill's blocks; nothing is pushed.
        return

    def wait_for_save(self):
        return

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        sending, recving, failed = self.worker.take_results()
        return KVConnectorTransferResults(
            finished_sending=sending, finished_recving=recving, failed_recving=failed
        )

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        r = self.get_transfer_results(finished_req_ids)
        return r.finished_sending or None, r.finished_recving or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.worker.take_failed_blocks()

    def shutdown(self):
        if self.worker is not None:
            logger.info("gdx: connector stats %s", self.worker.stats)
            self.worker.close()
