"""The KV layout both engines must share, how it is read off vLLM's KV tensors, and the check.

A layout says where each block of each layer lies (segments: region name, offset, stride, as
``gdx.BlockPool`` takes them) and what a block holds (block size in tokens, dtype, heads, head
size, the tensor's per-block shape). The prefill engine publishes its layout as a small region;
the decode engine reads it at connect and compares it with its own before any KV byte moves:
a difference is ``LayoutMismatch`` naming every field that differs. Where the blocks lie
(offsets, strides, the number of blocks) may differ between the engines; what a block holds
may not.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from math import prod
from typing import Any

from .. import Error

#: Fields that must be equal on both sides: what a block holds and how it is cut.
COMPARED = (
    "block_size",
    "dtype",
    "num_kv_heads",
    "head_size",
    "num_layers",
    "tp_size",
    "tensor_layout",
    "block_bytes",
    "segments_per_layer",
)

#: The region the layout is published under (JSON, zero-padded).
LAYOUT_REGION = "gdx-vllm.layout"
LAYOUT_BYTES = 64 << 10


class LayoutMismatch(Error):
    """The prefill and decode engines lay their KV caches out differently (block size, dtype,
    heads, layers, tensor layout or TP size); raised before any KV byte moves."""


@dataclass
class KvLayout:
    """One engine's (one TP rank's) KV cache layout."""

    block_size: int
    dtype: str
    num_kv_heads: int
    head_size: int
    num_layers: int
    tp_size: int
    tp_rank: int
    #: e.g. "(num_blocks, 2, 32, 64) block dim 0": the tensor's shape with its block dim named.
    tensor_layout: str
    block_bytes: int
    num_blocks: int
    segments_per_layer: int
    layer_names: list[str] = field(default_factory=list)
    #: Per layer, per segment: [region name, byte offset of block 0, byte stride between blocks].
    segments: list[list[list[Any]]] = field(default_factory=list)

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> "KvLayout":
        text = bytes(raw).rstrip(b"\0")
        try:
            return cls(**json.loads(text))
        except (ValueError, TypeError) as e:
            raise LayoutMismatch(
                f"the peer's KV layout record is unreadable ({e}): is it a gdx vLLM connector "
                "of the same version?"
            ) from None

    def differences(self, other: "KvLayout") -> list[str]:
        """``"field: here X, there Y"`` for every compared field that differs."""
        return [
            f"{f} {getattr(self, f)!r} here, {getattr(other, f)!r} there"
            for f in COMPARED
            if getattr(self, f) != getattr(other, f)
        ]

    def check(self, remote: "KvLayout", who: str) -> None:
        """Raises LayoutMismatch naming every difference with ``remote`` (``who`` names it)."""
        diff = self.differences(remote)
        if diff:
            raise LayoutMismatch(
                f"KV layout mismatch with {who}: " + "; ".join(diff) + ". Start both engines "
                "with the same model, dtype, --block-size and --tensor-parallel-size; no KV "
                "byte was moved"
            )


def _block_dim(shape: tuple[int, ...], num_blocks: int, name: str) -> int:
    for d, n in enumerate(shape):
        if n == num_blocks:
            return d
    raise Error(
        f"KV cache {name} of shape {tuple(shape)} has no dimension of num_blocks={num_blocks}: "
        "the gdx connector does not know this attention backend's layout"
    )


def layout_of(
    kv_caches: dict[str, Any],
    *,
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_size: int,
    tp_size: int = 1,
    tp_rank: int = 0,
) -> tuple[KvLayout, list[Any]]:
    """Reads the layout off vLLM's KV tensors (one per attention layer, ``register_kv_caches``).

    Returns the layout and the distinct storages under the tensors, in region order: region
    ``gdx-vllm.kv.{i}`` is storage ``i`` (vLLM often carves every layer out of one storage, so
    one registration covers all of them). The block dim is the first of size ``num_blocks``;
    the dims before it (K and V apart, on some backends) make the segments, the dims after it
    one block, which must be contiguous.
    """
    storages: dict[int, Any] = {}
    segments: list[list[list[Any]]] = []
    shapes: set[str] = set()
    block_bytes = None
    dtype = None
    for name, t in kv_caches.items():
        shape, stride, es = tuple(t.shape), tuple(t.stride()), t.element_size()
        d = _block_dim(shape, num_blocks, name)
        inner = shape[d + 1 :]
        if stride[d + 1 :] != tuple(prod(inner[k + 1 :]) for k in range(len(inner))):
            raise Error(
                f"KV cache {name}: a block is not contiguous (shape {shape}, stride {stride}); "
                "the gdx connector moves whole blocks"
            )
        st = t.untyped_storage()
        base = st.data_ptr()
        region = storages.setdefault(base, (len(storages), st))[0]
        start = t.data_ptr() - base
        segs = []
        for idx in range(prod(shape[:d])):
            off, rest = 0, idx
            for k in reversed(range(d)):
                off += (rest % shape[k]) * stride[k]
                rest //= shape[k]
            segs.append([f"gdx-vllm.kv.{region}", start + off * es, stride[d] * es])
        segments.append(segs)
        dims = ["num_blocks" if k == d else str(n) for k, n in enumerate(shape)]
        shapes.add(f"({', '.join(dims)}) block dim {d}")
        bb, dt = prod(inner) * es, str(t.dtype).removeprefix("torch.")
        if block_bytes not in (None, bb) or dtype not in (None, dt):
            raise Error(
                f"KV cache {name}: blocks of {bb} B of {dt}, the other layers' {block_bytes} B "
                f"of {dtype}"
            )
        block_bytes, dtype = bb, dt
    if not segments:
        raise Error("vLLM registered no KV cache tensors")
    if len(shapes) != 1 or len({len(s) for s in segments}) != 1:
        raise Error(f"the KV cache layers are laid out differently: {sorted(shapes)}")
    layout = KvLayout(
        block_size=block_size,
        dtype=dtype,
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        num_layers=len(segments),
        tp_size=tp_size,
        tp_rank=tp_rank,
        tensor_layout=shapes.pop(),
        block_bytes=block_bytes,
        num_blocks=num_blocks,
        segments_per_layer=len(segments[0]),
        layer_names=list(kv_caches),
        segments=segments,
    )
    return layout, [st for _, st in sorted(storages.values(), key=lambda v: v[0])]
