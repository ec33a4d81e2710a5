"""gdx: move bytes between processes' numpy arrays, torch tensors and GPU memory.

Every transfer says which path it took and why (``OpResult.path``/``.reason``,
``Transfer.explain()``). Errors are typed: ``gdx.Error`` and its subclasses ``PeerLost``,
``Timeout``, ``Cancelled``, ``AccessDenied``, ``OutOfBounds``, ``NotFound``, ``Unavailable``
and ``StrictViolation``.

    import gdx, numpy as np
    a = gdx.Agent("decode", listen="127.0.0.1:0", secret=key)
    kv = a.register(np.zeros(1 << 20, np.uint8), name="kv", access="rw")
    n = a.wait_notification(timeout=5.0)

Paged KV caches: ``gdx.BlockPool`` describes a pool of blocks (per layer, K and V apart or
not), ``Peer.prepare_blocks(local, remote)`` checks two pools once, and
``BlockTransfer.post(src_blocks, dst_blocks, layers=..., notify=...)`` moves a block list as
one transfer (one batched copy on the GPU). See docs/blocks.md.

Checkpoints: ``gdx.load_safetensors(path, device="cuda:0")`` and ``gdx.save_safetensors``
(``_checkpoint.py``); a refused header raises ``gdx.BadCheckpoint``.

The native module is ``gdx._gdx``; this package re-exports it.
"""

from ._gdx import (
    AccessDenied,
    Agent,
    BadCheckpoint,
    BlockPool,
    BlockTransfer,
    Cancelled,
    Error,
    Notification,
    NotFound,
    OpResult,
    OpResults,
    OutOfBounds,
    Peer,
    PeerLost,
    PreparedTransfer,
    Region,
    RemoteRegion,
    StrictViolation,
    Timeout,
    Transfer,
    Unavailable,
    __version__,
    cuda_available,
    ipc_stats,
)
from ._checkpoint import load_safetensors, release_pinned, save_safetensors
from ._load_model import load_model

__all__ = [
    "AccessDenied",
    "Agent",
    "BadCheckpoint",
    "BlockPool",
    "BlockTransfer",
    "Cancelled",
    "Error",
    "Notification",
    "NotFound",
    "OpResult",
    "OpResults",
    "OutOfBounds",
    "Peer",
    "PeerLost",
    "PreparedTransfer",
    "Region",
    "RemoteRegion",
    "StrictViolation",
    "Timeout",
    "Transfer",
    "Unavailable",
    "__version__",
    "cuda_available",
    "ipc_stats",
    "load_model",
    "load_safetensors",
    "release_pinned",
    "save_safetensors",
]
