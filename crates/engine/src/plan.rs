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

use crate::region::RegionDesc;

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
    /// Same-host shared memory through a bounce buffer (two copies), for borrowed remote regions.
    ShmStaged,
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
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Path::Tcp => "tcp",
            Path::Shm => "shm",
            Path::ShmStaged => "shm-staged",
            Path::P2p => "p2p",
            Path::Ipc => "ipc",
            Path::Staged => "staged",
            Path::HostToGpu => "host-to-gpu",
            Path::GpuToHost => "gpu-to-host",
            Path::DeviceLocal => "device-local",
            Path::Gds => "gds",
            Path::FileStaged => "file-staged",
            Path::Buffered => "buffered",
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

/// Plans one op on a peer reached through `route`.
pub(crate) fn plan_op(route: &PeerRoute, remote: &RegionDesc, tcp_detail: &str) -> Plan {
    match route.transport {
        Path::Tcp => Plan { path: Path::Tcp, reason: format!("{}; {tcp_detail}", route.reason) },
        _ if remote.shareable => Plan {
            path: Path::Shm,
            reason: format!("{}; remote region is agent-allocated (memfd), mapped once, one copy", route.reason),
        },
        _ => Plan {
            path: Path::ShmStaged,
            reason: format!(
                "{}; remote region is a borrowed buffer (not shareable), two copies through the bounce buffer",
                route.reason
            ),
        },
    }
}
