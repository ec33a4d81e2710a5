"""Type stubs for gdx (the native module gdx._gdx)."""

from types import TracebackType
from typing import (
    Any,
    Dict,
    Iterable,
    Literal,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    TypedDict,
    overload,
    Union,
)

__version__: str

Access = Literal["rw", "r", "w", "none"]

class _CudaStream(Protocol):
    @property
    def cuda_stream(self) -> int: ...

Stream = Union[int, _CudaStream]
Op = Tuple["Region", int, "RemoteRegion", int, int]

class Error(Exception):
    """Base class of every error gdx raises."""
    path: Optional[str]
    """An rdma or fabric refusal: the path (``"rdma"``, ``"fabric"``); else None."""
    region: Optional[int]
    """The region an error names, when it names one."""
    addr: Optional[str]
    """An address nothing answered at (connect); else None."""

class PeerLost(Error):
    """The connection to the peer broke."""
    errno: Optional[int]
    """The OS error number when a socket call saw the loss (ECONNRESET, EPIPE ...); else None."""

class Timeout(Error):
    """A wait ran out of time; the transfer may still be running."""

class Cancelled(Error):
    """The transfer was cancelled (``Transfer.cancel()``) before all of its ops completed."""

class AccessDenied(Error):
    """Wrong key, read-only or non-readable region, or failed authentication."""
    kind: Optional[str]
    """Failed authentication: which check (``"proof"``, ``"mode"``, ``"wrong-agent"``,
    ``"session"``, ``"sequence"``, ``"user"``); else None."""

class OutOfBounds(Error):
    """offset + length lies outside the region."""

class NotFound(Error):
    """No region with this name or id."""
    name: Optional[str]
    """The name asked for, when asked by name."""
    published: Optional[int]
    """When asked by name: how many names the agent publishes (0: none yet)."""

class Unavailable(Error):
    """A library, device or transport is missing (the message names it)."""
    path: Optional[str]
    """The path that cannot run (``"rdma"``, ``"ipc"``, ``"cma"``, ``"gds"`` ...), if one."""

class StrictViolation(Error):
    """Strict mode refused a plan that leaves the direct path."""
    path: Optional[str]
    """The fallback path refused (``"staged"``, ``"fabric-staged"`` ...), if one was planned."""

class BadCheckpoint(Error):
    """A safetensors header (or index) gdx refuses; nothing was loaded."""

def load_safetensors(
    path: Any,
    device: Any = "cpu",
    *,
    out: Optional[dict] = None,
    pool: Any = None,
    framework: Optional[str] = None,
    parallel: int = 4,
    progress: Any = None,
    via: str = "auto",
    chunk_bytes: int = ...,
    depth: int = 4,
    return_report: bool = False,
    names: Union[str, Sequence[str], None] = None,
) -> Any: ...
def load_model(
    model: Any,
    path: Any,
    *,
    strict: bool = True,
    names: Union[str, Sequence[str], None] = None,
    via: str = "auto",
    parallel: int = 4,
    progress: Any = None,
    return_report: bool = False,
) -> Any:
    """Load a checkpoint into a torch.nn.Module's own storage; (missing, unexpected)."""
def release_pinned() -> int:
    """Free the pinned buffers GPU loads keep for the next load; the bytes freed."""
def save_safetensors(
    tensors: dict,
    path: Any,
    metadata: Optional[dict] = None,
    *,
    via: str = "auto",
    fsync: bool = True,
    chunk_bytes: int = ...,
    depth: int = 4,
) -> dict: ...

class RemoteRegion:
    """A peer's region descriptor (never a pointer; the key is not shown)."""

    @property
    def nbytes(self) -> int: ...
    @property
    def location(self) -> str: ...
    @property
    def name(self) -> Optional[str]: ...
    @property
    def access(self) -> Access: ...
    @property
    def id(self) -> int: ...

class Region:
    """Registered memory; close() / with / GC deregisters."""

    @property
    def nbytes(self) -> int: ...
    @property
    def location(self) -> str:
        """"host" or "gpu:N"."""
    @property
    def name(self) -> Optional[str]: ...
    @property
    def access(self) -> Access: ...
    @property
    def closed(self) -> bool: ...
    @property
    def obj(self) -> Any:
        """The registered object (None for agent-allocated memory)."""
    def desc(self) -> RemoteRegion: ...
    def view(self) -> memoryview:
        """A memoryview of the host bytes; keeps the region open while it lives."""
    def close(self) -> None: ...
    def __enter__(self) -> "Region": ...
    def __exit__(
        self,
        exc_type: Optional[type],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int) -> memoryview: ...
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """Only for GPU memory from Agent.alloc(device=...)."""

class OpResult:
    """One op's outcome: path, reason, size, status."""

    kind: Literal["write", "read"]
    path: str
    reason: str
    nbytes: int
    status: str

class OpResults(Sequence[OpResult]):
    """Each op's result (``Transfer.wait``, ``PreparedTransfer.run``): a read-only sequence
    whose ``OpResult`` entries are made when read."""

    def __len__(self) -> int: ...
    @overload
    def __getitem__(self, index: int) -> OpResult: ...
    @overload
    def __getitem__(self, index: slice) -> OpResults: ...

class Notification:
    @property
    def sender(self) -> str: ...
    @property
    def data(self) -> bytes: ...
    @property
    def xfer(self) -> int: ...

class Rail(TypedDict):
    """One rail of a peer connection (``gdx bench --json`` rows carry the same)."""

    local: str
    remote: str
    bytes: int
    state: Literal["active", "paused"]
    cause: Optional[str]

class Transfer:
    """A submitted batch."""

    def wait(self, timeout: Optional[float] = None) -> OpResults: ...
    def cancel(self) -> OpResults:
        """Stops the batch; returns once none of its bytes will move any more (raises
        ``Cancelled`` when it stopped it)."""
    def done(self) -> bool: ...
    @property
    def status(self) -> str: ...
    def raise_for_status(self) -> None: ...
    @property
    def bytes_done(self) -> int: ...
    def results(self) -> OpResults: ...
    def explain(self) -> str: ...
    def rails(self) -> list[Rail]:
        """The peer connection's rails with the bytes this batch moved over each."""
    def __len__(self) -> int: ...

class PreparedTransfer:
    """A batch checked and planned once (``Peer.prepare_write``/``prepare_read``), posted
    again and again; the bytes are read at each post."""

    def post(self, stream: Optional[Stream] = None) -> Transfer: ...
    def run(self, timeout: Optional[float] = None) -> OpResults: ...
    @property
    def paths(self) -> list[str]: ...
    def __len__(self) -> int: ...

Segment = Union["Region", "RemoteRegion", Tuple[Union["Region", "RemoteRegion"], int, int]]

class BlockPool:
    """``num_blocks`` blocks of ``block_bytes`` bytes in every segment of every layer. Each
    entry of ``layers`` is a region, a ``(region, offset, stride)`` tuple, or a list of those
    (the layer's segments); block ``b`` lies at ``offset + b * stride``. All local regions or
    all the peer's."""

    def __init__(
        self,
        layers: Sequence[Union[Segment, Sequence[Segment]]],
        num_blocks: int,
        block_bytes: int,
    ) -> None: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def block_bytes(self) -> int: ...
    @property
    def segments(self) -> int: ...

class BlockTransfer:
    """Two pools checked to match (``Peer.prepare_blocks``)."""

    def post(
        self,
        src: Any,
        dst: Any,
        layers: Union[None, int, range, slice, Sequence[int]] = None,
        notify: Optional[bytes] = None,
        stream: Optional[Stream] = None,
    ) -> Transfer:
        """Moves block ``src[i]`` to ``dst[i]`` in every segment of ``layers`` as one
        transfer. Refused before anything moves: lists of different lengths, a block out of
        range, a destination given twice, layers out of range."""
    @property
    def num_layers(self) -> int: ...

class Peer:
    """A connected, authenticated remote agent."""

    @property
    def name(self) -> str: ...
    @property
    def transport(self) -> str: ...
    @property
    def route_reason(self) -> str: ...
    def rails(self) -> list[Rail]:
        """The connection's rails, bytes counted since it was made (empty on shm, rdma)."""
    @property
    def alive(self) -> bool: ...
    def region(self, name: str) -> RemoteRegion: ...
    def regions(self) -> list[RemoteRegion]: ...
    def write(
        self,
        ops: Iterable[Op],
        notify: Optional[bytes] = None,
        stream: Optional[Stream] = None,
        timeout: Optional[float] = None,
    ) -> Transfer: ...
    def read(
        self,
        ops: Iterable[Op],
        notify: Optional[bytes] = None,
        stream: Optional[Stream] = None,
        timeout: Optional[float] = None,
    ) -> Transfer: ...
    def prepare_write(
        self,
        ops: Iterable[Op],
        notify: Optional[bytes] = None,
        timeout: Optional[float] = None,
    ) -> PreparedTransfer: ...
    def prepare_read(
        self,
        ops: Iterable[Op],
        notify: Optional[bytes] = None,
        timeout: Optional[float] = None,
    ) -> PreparedTransfer: ...
    def prepare_blocks(
        self,
        local: BlockPool,
        remote: BlockPool,
        op: Literal["write", "read"] = "write",
        timeout: Optional[float] = None,
    ) -> BlockTransfer: ...
    def notify(self, data: bytes) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> "Peer": ...
    def __exit__(self, *args: object) -> bool: ...

class Agent:
    """One per process: registers memory, serves peers, connects to peers."""

    def __init__(
        self,
        name: Optional[str] = None,
        *,
        listen: Optional[str] = "127.0.0.1:0",
        transports: Optional[Sequence[Literal["tcp", "shm", "rdma"]]] = None,
        strict: Optional[bool] = None,
        secret: Optional[bytes] = None,
        insecure: Optional[bool] = None,
        tcp_streams: Optional[int] = None,
        chunk_bytes: Optional[int] = None,
        io_timeout: Optional[float] = None,
        timeout: Optional[float] = None,
        nics: Optional[Sequence[str]] = None,
    ) -> None:
        """nics: the rails of connections this agent makes, in order (tcp: "LOCAL_IP" or
        "LOCAL_IP=REMOTE_IP[:PORT]"); transfers from 1 MiB are striped over them by measured
        throughput and fail over between them."""
    @property
    def name(self) -> str: ...
    @property
    def address(self) -> Optional[str]: ...
    strict: bool
    @property
    def secret(self) -> Optional[bytes]: ...
    def register(self, obj: Any, name: Optional[str] = None, access: Access = "rw") -> Region: ...
    def alloc(
        self,
        nbytes: int,
        name: Optional[str] = None,
        access: Access = "rw",
        device: Union[None, int, str] = None,
    ) -> Region:
        """Host shared memory, or GPU memory with a CUDA IPC handle for device="gpu:N"."""
    def connect(self, address: str, timeout: Optional[float] = None) -> Peer: ...
    def join_cluster(
        self, etcd: str, cluster: str, ttl: int = 10, timeout: Optional[float] = None
    ) -> None:
        """Publish this agent (and its named regions) in etcd under its name, on a lease."""
    def connect_named(self, name: str) -> Peer:
        """Connect to the agent etcd lists under ``name`` (after ``join_cluster``)."""
    def wait_notification(self, timeout: Optional[float] = None) -> Notification: ...
    def try_notification(self) -> Optional[Notification]: ...
    def published(self) -> list[RemoteRegion]: ...
    def close(self) -> None: ...
    def __enter__(self) -> "Agent": ...
    def __exit__(self, *args: object) -> bool: ...

def cuda_available() -> Tuple[bool, str]: ...
def ipc_stats() -> Dict[str, int]: ...
