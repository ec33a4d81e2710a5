"""Moving a request's blocks from the peer's KV pool into ours, layer by layer.

The two pools are described by their layouts (``_layout.KvLayout``: per layer, per segment, a
region, the offset of block 0 and the stride), which become ``gdx.BlockPool``s; the pair is
checked once (``Peer.prepare_blocks``) and each request's read is one ``BlockTransfer.post``:
remote block ``src[i]`` into local block ``dst[i]`` in every segment of the chosen layers, with
adjacent blocks merged and bad block lists refused before any byte moves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import BlockPool
from ._layout import KvLayout


def pool(layout: KvLayout, regions: dict[str, Any]) -> BlockPool:
    """``layout`` as a ``gdx.BlockPool`` over ``regions`` (local Regions or RemoteRegions)."""
    layers = [
        [(regions[name], off, stride) for name, off, stride in segs] for segs in layout.segments
    ]
    return BlockPool(layers, num_blocks=layout.num_blocks, block_bytes=layout.block_bytes)


class BlockReader:
    """Reads blocks of ``remote`` (the peer's layout and region descriptors) into ``local``."""

    def __init__(
        self,
        peer: Any,
        local: KvLayout,
        local_regions: dict[str, Any],
        remote: KvLayout,
        remote_regions: dict[str, Any],
        timeout: float | None = None,
    ) -> None:
        self.peer = peer
        self.local = local
        self.remote = remote
        self.blocks = peer.prepare_blocks(
            pool(local, local_regions), pool(remote, remote_regions), op="read", timeout=timeout
        )

    def post(
        self, src: Sequence[int], dst: Sequence[int], layers: Sequence[int] | None = None
    ) -> Any:
        """Starts the read of remote blocks ``src`` into local ``dst``; returns the
        ``gdx.Transfer`` (wait or poll it)."""
        return self.blocks.post(src, dst, layers=layers)
