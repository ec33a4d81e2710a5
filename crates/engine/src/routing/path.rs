//! The path vocabulary: [`Path`] (how one op's bytes move) and [`Plan`] (a path and the reason
//! it was chosen), which every result carries. Values only, below everything that plans or
//! moves bytes, so the GPU, file and transfer layers name paths without reaching the rules
//! (`routing::plan`) that read regions.

use std::fmt;

use serde::{Deserialize, Serialize};

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
    /// libfabric RMA with GPU memory on this end, staged through a registered host bounce
    /// buffer (GPU-to-host copy then `fi_write`; `fi_read` then host-to-GPU copy), because the
    /// provider does not offer FI_HMEM or gdx does not register GPU memory with it.
    FabricStaged,
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
    /// Same-host host memory to a peer's borrowed host region, one copy by the kernel straight
    /// between the two processes (cross-memory attach: `process_vm_writev`/`process_vm_readv`,
    /// many ops per system call), where the kernel lets this process reach the peer's memory.
    Cma,
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Path {
    /// How many paths there are.
    pub(crate) const COUNT: usize = 19;
    /// Every path, in declaration order (`ALL[p.index()] == p`). The index travels in a wire
    /// error (`Strict`, `Unavailable`: docs/wire-protocol.md), so a new path goes at the end.
    pub(crate) const ALL: [Path; Path::COUNT] = [
        Path::Tcp,
        Path::Shm,
        Path::ShmStaged,
        Path::Rdma,
        Path::Fabric,
        Path::FabricStaged,
        Path::Gdr,
        Path::TcpStaged,
        Path::P2p,
        Path::Ipc,
        Path::Staged,
        Path::HostToGpu,
        Path::GpuToHost,
        Path::DeviceLocal,
        Path::Gds,
        Path::FileStaged,
        Path::Buffered,
        Path::Mailbox,
        Path::Cma,
    ];

    /// The path's position in `ALL` (an array index for per-path counters). A match, so a new
    /// path does not compile until it has its place here and in `ALL`.
    pub(crate) const fn index(self) -> usize {
        match self {
            Path::Tcp => 0,
            Path::Shm => 1,
            Path::ShmStaged => 2,
            Path::Rdma => 3,
            Path::Fabric => 4,
            Path::FabricStaged => 5,
            Path::Gdr => 6,
            Path::TcpStaged => 7,
            Path::P2p => 8,
            Path::Ipc => 9,
            Path::Staged => 10,
            Path::HostToGpu => 11,
            Path::GpuToHost => 12,
            Path::DeviceLocal => 13,
            Path::Gds => 14,
            Path::FileStaged => 15,
            Path::Buffered => 16,
            Path::Mailbox => 17,
            Path::Cma => 18,
        }
    }

    /// The path's name, as `Display` writes it.
    pub fn as_str(&self) -> &'static str {
        match self {
            Path::Tcp => "tcp",
            Path::Shm => "shm",
            Path::ShmStaged => "shm-staged",
            Path::TcpStaged => "tcp-staged",
            Path::Rdma => "rdma",
            Path::Fabric => "fabric",
            Path::FabricStaged => "fabric-staged",
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
            Path::Cma => "cma",
        }
    }
}

// `ALL` lists every path once, at its index.
const _: () = {
    let mut i = 0;
    while i < Path::COUNT {
        assert!(Path::ALL[i].index() == i);
        i += 1;
    }
};

/// The path one op takes and the reason it was chosen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// The path.
    pub path: Path,
    /// Why, in words ("shm: same host, remote region agent-allocated (memfd), one copy").
    /// Shared: every op of a batch on one pair of regions holds the same text, and reports
    /// clone it, so a copy costs a reference count, not an allocation.
    pub reason: std::sync::Arc<str>,
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.path, self.reason)
    }
}
