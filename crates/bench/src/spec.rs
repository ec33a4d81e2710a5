//! What a case measures, as values: the path ([`PathKind`]), its two ends ([`End`]) and the
//! case's stable key and description ([`CaseSpec`]). Both the cases (`case.rs`) and the
//! result schema (`report.rs`) are built on these, so they sit below both.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Which path a case measures (the `path` field of a result).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PathKind {
    /// Single-thread host `memcpy` between two buffers (a baseline, not a transport).
    Memcpy,
    /// Copy engine between pinned host memory and a GPU.
    PinnedCe,
    /// Copy engine between pageable host memory and a GPU (the driver stages it).
    PageableCe,
    /// Copy engine between two GPUs over their direct link (peer access enabled).
    P2p,
    /// GPU → pinned host bounce buffers → GPU, chunked and pipelined.
    Staged,
    /// Like p2p, across two processes (CUDA IPC).
    Ipc,
    /// Same-host shared memory between two agents.
    Shm,
    /// Kernel TCP between two agents.
    Tcp,
    /// The deterministic mock backend (tests only).
    Mock,
    /// Between a file and GPU or host memory through `gdx-storage` (`gds`, `file-staged`, the
    /// naive baseline; the key says which). Opt-in: `--path file`.
    File,
    /// RDMA WRITE or READ through `gdx-rdma`, host or GPU memory on either side, against
    /// `gdx serve --rdma-listen` or a loopback server in this process. Opt-in: `--path rdma`.
    Rdma,
    /// One-sided RMA through libfabric (the engine's fabric transport) between two agents,
    /// over the provider `--provider` names or the automatic choice. Opt-in: `--path fabric`.
    Fabric,
    /// The mailbox: a persistent kernel polling mapped pinned host memory moves small payloads
    /// host ↔ GPU (one SM reserved while it runs).
    Mailbox,
    /// Stream-ordered signalling: a kernel, then a copy, then a stream memory operation the
    /// host sees (GPUDirect Async), or the `cuStreamSynchronize` way it is compared with.
    Signal,
}

impl PathKind {
    /// The name used in keys, tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            PathKind::Memcpy => "memcpy",
            PathKind::PinnedCe => "pinned-ce",
            PathKind::PageableCe => "pageable-ce",
            PathKind::P2p => "p2p",
            PathKind::Staged => "staged",
            PathKind::Ipc => "ipc",
            PathKind::Shm => "shm",
            PathKind::Tcp => "tcp",
            PathKind::Mock => "mock",
            PathKind::File => "file",
            PathKind::Rdma => "rdma",
            PathKind::Fabric => "fabric",
            PathKind::Mailbox => "mailbox",
            PathKind::Signal => "signal",
        }
    }
}

impl fmt::Display for PathKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One end of a transfer.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum End {
    /// Host memory of this process (or of the loopback agent).
    Host,
    /// The GPU with this CUDA ordinal.
    Gpu(u32),
    /// Host memory of a `gdx serve` agent at this address.
    Remote(String),
    /// GPU memory (this CUDA ordinal there) of a `gdx serve` at this address (rdma cases).
    RemoteGpu(String, u32),
    /// A scratch file (`gdx bench --path file`).
    File,
}

impl End {
    /// `host`, `gpu0`, `remote:HOST:PORT`, `remote:HOST:PORT/gpu0`: the spelling used in the
    /// `src`/`dst` fields.
    pub fn name(&self) -> String {
        match self {
            End::Host => "host".into(),
            End::Gpu(n) => format!("gpu{n}"),
            End::Remote(a) => format!("remote:{a}"),
            End::RemoteGpu(a, n) => format!("remote:{a}/gpu{n}"),
            End::File => "file".into(),
        }
    }

    /// The topology label (`GPU0`), for GPUs.
    pub fn topo_label(&self) -> Option<String> {
        match self {
            End::Gpu(n) => Some(format!("GPU{n}")),
            _ => None,
        }
    }
}

/// What a case measures. Keys follow nvbandwidth: `<src>_to_<dst>_<transport>[_bidir]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaseSpec {
    /// Stable key, e.g. `gpu0_to_gpu1_p2p`.
    pub key: String,
    /// One line: what is measured, which direction, what is only interference.
    pub description: String,
    /// The path.
    pub path: PathKind,
    /// Source.
    pub src: End,
    /// Destination.
    pub dst: End,
    /// Both directions at once (bandwidth is the sum of both).
    pub bidir: bool,
}

#[cfg(test)]
impl CaseSpec {
    /// A one-way spec with no description, for tests.
    pub(crate) fn bare(key: &str, path: PathKind, src: End, dst: End) -> CaseSpec {
        CaseSpec {
            key: key.into(),
            description: String::new(),
            path,
            src,
            dst,
            bidir: false,
        }
    }
}
