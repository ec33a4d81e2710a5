"""gdx's KV connector for vLLM: disaggregated prefill with gdx moving the KV blocks.

    --kv-transfer-config '{"kv_connector": "GdxConnector",
                           "kv_connector_module_path": "gdx.vllm", "kv_role": "kv_producer"}'

``GdxConnector`` (``_connector.py``) imports vLLM; importing ``gdx.vllm`` alone does not
(the layout check and the block mover are plain gdx). See docs/vllm.md.
"""

from ._layout import KvLayout, LayoutMismatch, layout_of
from ._worker import DEFAULTS as OPTIONS

__all__ = ["GdxConnector", "KvLayout", "LayoutMismatch", "OPTIONS", "layout_of"]


def __getattr__(name: str):
    # vLLM loads the class with getattr(import_module("gdx.vllm"), "GdxConnector").
    if name == "GdxConnector":
        from ._connector import GdxConnector

        return GdxConnector
    raise AttributeError(f"module 'gdx.vllm' has no attribute {name!r}")
