"""Moving a request's blocks from the peer's KV pool into ours, layer by layer.

The two pools are described by their layouts (``_layout.KvLayout``: per layer, per segment, a
region, the offset of block 0 and the stride); a read moves remote block ``src[i]`` into local
block ``dst[i]`` in every segment of the chosen layers, as one gdx transfer. Adjacent blocks
merge into one op. Bad block lists are refused before any byte moves, naming the entry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import Error
from ._layout import KvLayout


def _check_ids(src: Sequence[int], dst: Sequence[int], n_src: int, n_dst: int) -> None:
    if len(src) != len(dst):
        raise Error(f"{len(src)} source blocks but {len(dst)} destination blocks")
    for name, ids, n in (("src", src, n_src), ("dst", dst, n_dst)):
        for i, b in enumerate(ids):
            if not 0 <= b < n:
                raise Error(f"{name}[{i}] = {b} is out of range: the pool has {n} blocks")
    seen: dict[int, int] = {}
    for i, b in enumerate(dst):
        if b in seen:
            raise Error(f"dst[{i}] = {b} appears twice (dst[{seen[b]}] too)")
        seen[b] = i


def _runs(src: Sequence[int], dst: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(src0, dst0, count)`` runs of blocks adjacent on both sides."""
    runs: list[tuple[int, int, int]] = []
    for s, d in zip(src, dst):
        if runs and runs[-1][0] + runs[-1][2] == s and runs[-1][1] + runs[-1][2] == d:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((s, d, 1))
    return runs


class BlockReader:
    """Reads blocks of ``remote`` (the peer's layout and region descriptors) into ``local``."""

    def __init__(
        self,
        peer: Any,
        local: KvLayout,
        local_regions: dict[str, Any],
        remote: KvLayout,
        remote_regions: dict[str, Any],
    ) -> None:
        self.peer = peer
        self.local = local
        self.remote = remote
        # (local region, offset, stride, remote region, offset, stride) per layer and segment.
        self.segments = [
            [
                (local_regions[lr], lo, ls, remote_regions[rr], ro, rs)
                for (lr, lo, ls), (rr, ro, rs) in zip(lseg, rseg)
            ]
            for lseg, rseg in zip(local.segments, remote.segments)
        ]

    def ops(
        self, src: Sequence[int], dst: Sequence[int], layers: Sequence[int]
    ) -> list[tuple[Any, int, Any, int, int]]:
        """The gdx op list moving remote blocks ``src`` into local blocks ``dst``."""
        bb = self.local.block_bytes
        out = []
        for layer in layers:
            for lr, lo, ls, rr, ro, rs in self.segments[layer]:
                for s, d, n in _runs(src, dst):
                    if ls == bb and rs == bb:
                        out.append((lr, lo + d * ls, rr, ro + s * rs, n * bb))
                    else:
                        out.extend(
                            (lr, lo + (d + k) * ls, rr, ro + (s + k) * rs, bb) for k in range(n)
                        )
        return out

    def post(
        self,
        src: Sequence[int],
        dst: Sequence[int],
        layers: Sequence[int] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Starts the read; returns the ``gdx.Transfer`` (wait or poll it)."""
        _check_ids(src, dst, self.remote.num_blocks, self.local.num_blocks)
        layers = range(self.local.num_layers) if layers is None else layers
        return self.peer.read(self.ops(src, dst, layers), timeout=timeout)
