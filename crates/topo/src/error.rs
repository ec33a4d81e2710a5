//! Errors from building a topology. Every variant names the file (and line, for XML) and the
//! problem, so the CLI can print it once and the user knows what to fix.

use std::path::PathBuf;

/// `": the cause"`, or nothing.
fn caused_by(source: &Option<std::io::Error>) -> String {
    source
        .as_ref()
        .map(|e| format!(": {e}"))
        .unwrap_or_default()
}

/// Why a topology could not be built or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TopoError {
    /// `--root` does not exist.
    #[error("root {path}: no such file or directory (give a folder or .tar.gz written by `gdx topo --capture`, or leave --root out for this machine)")]
    RootMissing {
        /// The root given.
        path: PathBuf,
    },
    /// `--root` exists but holds no sysfs tree gdx can read.
    #[error("root {path}: {why}{}", caused_by(.source))]
    RootUnusable {
        /// The root given.
        path: PathBuf,
        /// What is missing, e.g. "no sys/bus/pci/devices folder: not a captured machine".
        why: String,
        /// The read or write error behind it, when one is (an archive that does not
        /// decompress, an entry that cannot be written).
        #[source]
        source: Option<std::io::Error>,
    },
    /// A file or folder could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// An NCCL topology file is malformed.
    #[error("{path}:{line}:{column}: {message}")]
    Xml {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: u32,
        /// 1-based column.
        column: u32,
        /// What is wrong.
        message: String,
    },
    /// A well-formed XML file that is not an NCCL topology (e.g. an NCCL_GRAPH_FILE).
    #[error("{path}: not an NCCL topology file: {why}")]
    NotATopology {
        /// The file.
        path: PathBuf,
        /// What it looks like instead.
        why: String,
    },
    /// An `--xml` input that is not read at all: not a regular file, over the size cap, not
    /// text.
    #[error("{path}: cannot read as an NCCL topology file: {why}")]
    XmlInput {
        /// The file.
        path: PathBuf,
        /// Why, and what to give instead.
        why: String,
    },
    /// A captured NVML snapshot (`gdx/nvml.json`) is malformed.
    #[error("{path}: bad NVML snapshot: {message}")]
    Snapshot {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// NVML could not be queried on this machine (library missing, init failed).
    #[error("{0}")]
    Nvml(#[source] gdx_sys::Unavailable),
    /// A view that needs NVML's facts (the P2P matrix) on a topology that has none.
    #[error("NVML not available: {why}")]
    NoNvml {
        /// Why the topology has none.
        why: NvmlGap,
    },
    /// A CPU mask (NCCL's `affinity`) with a group that is not a 32-bit hex number.
    #[error("group {group:?} is not a 32-bit hex number (expected a mask like 0000ffff,ffffffff)")]
    CpuMask {
        /// The group as written.
        group: String,
        /// Its place from the right (group 0 holds CPUs 0-31).
        index: usize,
    },
    /// A file gdx writes into a capture (`gdx/env.json`) is malformed.
    #[error("capture file {path}: {message} (re-capture the machine with `gdx topo --capture`)")]
    CaptureFile {
        /// The file, relative to the capture.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

impl TopoError {
    /// Wrap an I/O error with its path.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> TopoError {
        TopoError::Io {
            path: path.into(),
            source,
        }
    }
}

/// Why a topology carries no NVML facts ([`TopoError::NoNvml`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NvmlGap {
    /// Read from an NCCL topology file, which has no P2P status.
    NcclXml,
    /// The live machine, where NVML was not used: the topology's note says why, when it has one.
    NotUsed {
        /// NVML's failure, from the topology's notes.
        reason: Option<String>,
    },
    /// A capture without `gdx/nvml.json`.
    NotCaptured,
}

impl std::fmt::Display for NvmlGap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NvmlGap::NcclXml => f.write_str(
                "an NCCL topology file carries no P2P status; run `gdx topo --p2p` on the machine",
            ),
            NvmlGap::NotUsed { reason: Some(r) } => f.write_str(r),
            NvmlGap::NotUsed { reason: None } => f.write_str("NVML was not used"),
            NvmlGap::NotCaptured => f.write_str(
                "the capture holds no NVML facts (gdx/nvml.json); capture on a machine where NVML loads",
            ),
        }
    }
}
