//! The planner: which path each op takes, and why.
//!
//! The choice is made in two steps. At connect time the peer gets one transport ([`PeerRoute`]):
//! shm when both agents offer it, run on the same kernel (same host id) and the shm socket connects;
//! tcp otherwise, with the reason. At submit time each op gets a [`Plan`]: on shm, `Shm` (one copy
//! into/out of the peer's mapped region) when the remote region is agent-allocated, `ShmStaged` (two
//! copies through a bounce buffer) when it is a borrowed buffer. Nothing falls back silently: the
//! plan is fixed before the op starts and an op that cannot run on its path fails.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::region::{Location, RegionDesc, RegionInner};

/// A data path. Later issues add RDMA paths.
///
/// Wire-safe: a path travels as its kebab-case name (serde), never as a number; new variants
/// add names and leave the existing ones unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Path {
    /// Kernel TCP sockets between host buffers.
    Tcp,
    /// Same-host shared memory, one copy into/out of the peer's mapped region.
    Shm,
    /// Same-host shared memory through a bounce buffer (two copies), for borrowed remote regions
    /// and for GPU regions the IPC path cannot serve.
    ShmStaged,
    /// RDMA WRITE/READ between host memory on both ends (RC queue pairs, kernel bypass, zero
    /// copy).
    Rdma,
    /// libfabric RMA (`fi_write`/`fi_read`) between host memory on both ends, over the
    /// provider the route names (efa, verbs, cxi; tcp on loopback).
    Fabric,
    /// GPUDirect RDMA: RDMA with GPU memory on one or both ends, which the NIC reads or writes
    /// directly (registered through dma-buf or nvidia-peermem).
    Gdr,
    /// Kernel TCP sockets with GPU memory on one or both ends, staged through pinned bounce
    /// buffers: device-to-host copies of the next chunks overlap the send of the current one,
    /// and the receiver's host-to-device copy of a chunk overlaps the receipt of the next.
    TcpStaged,
    /// GPU to GPU of one process over the direct link (NVLink or PCIe peer-to-peer), on the
    /// copy engines.
    P2p,
    /// GPU to GPU across two processes of one host through a CUDA IPC mapping: the same direct
    /// link as `P2p`, no host copy.
    Ipc,
    /// GPU to GPU through pinned host bounce buffers: a chunked pipeline of device-to-host and
    /// host-to-device copies (the "traditional" path).
    Staged,
    /// Pinned host memory to GPU memory on the GPU's copy engine.
    HostToGpu,
    /// GPU memory to pinned host memory on the GPU's copy engine.
    GpuToHost,
    /// Within the memory of one GPU.
    DeviceLocal,
    /// Between a file and GPU memory through cuFile (GPUDirect Storage, or cuFile's
    /// compatibility mode: the reason says which); see [`crate::file`].
    Gds,
    /// Between a file and GPU or host memory: `O_DIRECT` I/O through aligned (pinned, for a GPU)
    /// bounce buffers, pipelined with the host↔GPU copies.
    FileStaged,
    /// Like `FileStaged` through the page cache (the file system refused `O_DIRECT`, or it was
    /// asked for).
    Buffered,
    /// Pinned host memory ↔ GPU memory through the mailbox: a persistent kernel on the GPU
    /// polls a ring in mapped host memory and moves small payloads itself (microseconds, no
    /// copy-engine submission), occupying one SM while it runs; see
    /// [`crate::gpu::LocalPeer::start_mailbox`].
    Mailbox,
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Path::Tcp => "tcp",
            Path::Shm => "shm",
            Path::ShmStaged => "shm-staged",
            Path::TcpStaged => "tcp-staged",
            Path::Rdma => "rdma",
            Path::Fabric => "fabric",
            Path::Gdr => "gdr",
            Path::P2p => "p2p",
            Path::Ipc => "ipc",
            Path::Staged => "staged",
            Path::HostToGpu => "host-to-gpu",
            Path::GpuToHost => "gpu-to-host",
            Path::DeviceLocal => "device-local",
            Path::Gds => "gds",
            Path::FileStaged => "file-staged",
            Path::Buffered => "buffered",
            Path::Mailbox => "mailbox",
        })
    }
}

/// The path one op takes and the reason it was chosen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// The path.
    pub path: Path,
    /// Why, in words ("shm: same host, remote region agent-allocated (memfd), one copy").
    pub reason: String,
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.path, self.reason)
    }
}

/// The transport a peer connection uses, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PeerRoute {
    /// `Path::Shm` for a shm peer (ops then plan to `Shm` or `ShmStaged`), `Path::Tcp` otherwise.
    pub transport: Path,
    /// Why this transport.
    pub reason: String,
}

/// Plans one op on a peer reached through `route`: `local` is the initiator's region, `remote`
/// the target's descriptor. With `strict`, a GPU-to-GPU op between two agents of one host that
/// cannot take the IPC path is refused ([`Error::Strict`]) instead of staged.
pub(crate) fn plan_op(
    route: &PeerRoute,
    local: &RegionInner,
    remote: &RegionDesc,
    tcp_detail: &str,
    strict: bool,
) -> Result<Plan> {
    let local_gpu = local.device().map(|d| d.region.gpu());
    let remote_gpu = match remote.location {
        Location::Gpu(n) => Some(n),
        _ => None,
    };
    let ends = match (local_gpu, remote_gpu) {
        (Some(a), Some(b)) => format!("GPU{a} here and the peer's GPU{b}"),
        (Some(a), None) => format!("GPU{a} here"),
        (None, Some(b)) => format!("the peer's GPU{b}"),
        (None, None) => String::new(),
    };
    let plan = match route.transport {
        Path::Rdma if ends.is_empty() => Plan {
            path: Path::Rdma,
            reason: format!("{}; one-sided RDMA between host memory", route.reason),
        },
        Path::Rdma => Plan {
            path: Path::Gdr,
            reason: format!(
                "gdr: {}; the NIC reads/writes {ends} directly (dma-buf or nvidia-peermem \
                 registration; an op whose GPU memory cannot be registered fails, never staged)",
                route.reason.trim_start_matches("rdma: ")
            ),
        },
        Path::Fabric if ends.is_empty() => Plan {
            path: Path::Fabric,
            reason: format!("{}; one-sided RMA between host memory", route.reason),
        },
        // No FI_HMEM registration yet: refused, never staged behind the caller's back (strict
        // or not; the error says how to get the staged path).
        Path::Fabric => {
            return Err(Error::FabricRefused(format!(
                "{}; {ends} would need FI_HMEM registration, which gdx does not do yet; \
                 connect with GDX_TRANSPORTS=tcp,shm to stage GPU memory over tcp",
                route.reason
            )))
        }
        Path::Tcp if ends.is_empty() => Plan {
            path: Path::Tcp,
            reason: format!("{}; {tcp_detail}", route.reason),
        },
        Path::Tcp => Plan {
            path: Path::TcpStaged,
            reason: format!(
                "{}; {ends} staged through pinned bounce buffers (device-to-host of the next \
                 chunks overlaps the send, the receiver's host-to-device overlaps the next \
                 receive); no GPU-direct transport to this peer; {tcp_detail}",
                route.reason
            ),
        },
        _ => plan_shm(route, local_gpu, remote, remote_gpu, &ends),
    };
    if strict
        && local_gpu.is_some()
        && remote_gpu.is_some()
        && !matches!(plan.path, Path::Ipc | Path::Gdr)
    {
        return Err(Error::Strict(plan.reason));
    }
    Ok(plan)
}

fn plan_shm(
    route: &PeerRoute,
    local_gpu: Option<u32>,
    remote: &RegionDesc,
    remote_gpu: Option<u32>,
    ends: &str,
) -> Plan {
    let r = &route.reason;
    let same_process = remote
        .ipc
        .as_ref()
        .is_some_and(|i| i.pid == std::process::id());
    match (local_gpu, remote_gpu) {
        (Some(_), Some(_)) if same_process => Plan {
            path: Path::ShmStaged,
            reason: format!(
                "{r}; the peer agent is in this very process, and legacy CUDA IPC cannot map a \
                 process's own allocation, so {ends} are staged through the bounce buffer"
            ),
        },
        (Some(a), Some(b)) if remote.ipc.is_some() => Plan {
            path: Path::Ipc,
            reason: format!(
                "ipc: peer on the same host; its GPU{b} region mapped once through its CUDA IPC \
                 handle, copied GPU{a}<->GPU{b} on the copy engines, no host copy"
            ),
        },
        (Some(_), Some(_)) => Plan {
            path: Path::ShmStaged,
            reason: format!(
                "{r}; the peer's GPU region has no CUDA IPC handle (not gdx-allocated memory), \
                 so {ends} are staged through the bounce buffer"
            ),
        },
        (None, Some(_)) => Plan {
            path: Path::ShmStaged,
            reason: format!(
                "{r}; {ends}: the target copies between the bounce buffer and its GPU (this \
                 end is host memory, so no IPC mapping applies)"
            ),
        },
        (Some(_), None) if remote.shareable => Plan {
            path: Path::Shm,
            reason: format!(
                "{r}; remote region is agent-allocated (memfd), mapped once; one copy from \
                 {ends} by the driver's pageable copy"
            ),
        },
        (Some(_), None) => Plan {
            path: Path::ShmStaged,
            reason: format!(
                "{r}; remote region is a borrowed buffer; {ends} copied through the bounce buffer"
            ),
        },
        (None, None) if remote.shareable => Plan {
            path: Path::Shm,
            reason: format!("{r}; remote region is agent-allocated (memfd), mapped once, one copy"),
        },
        (None, None) => Plan {
            path: Path::ShmStaged,
            reason: format!(
                "{r}; remote region is a borrowed buffer (not shareable), two copies through the bounce buffer"
            ),
        },
    }
}
