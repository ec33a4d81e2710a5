//! Why a `gdx nccl` operation could not produce a result at all. Odd lines in a log are not
//! errors: they become [`crate::model::ParseWarning`]s and the parse carries on.

use std::path::PathBuf;

/// The errors of this crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NcclError {
    /// A log file could not be read.
    #[error("reading NCCL log {path}: {source}")]
    ReadLog {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A path given as a log is not something gdx reads as one (a FIFO, a device, too big).
    #[error("cannot read {path} as an NCCL log: {why}")]
    NotALog {
        /// The path.
        path: PathBuf,
        /// Why it is refused.
        why: String,
    },
    /// The scratch folder for NCCL's debug files could not be made or listed.
    #[error("NCCL debug-file folder {path}: {source}")]
    LogDir {
        /// The folder.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A run was asked for with no size, no collective or no timed iteration.
    #[error(
        "invalid run parameters: need at least one size, one collective and one timed iteration"
    )]
    EmptyRun,
    /// A CUDA call of the run failed.
    #[error("invalid run parameters: the run failed: {0}")]
    RunCuda(#[source] gdx_sys::cuda::CudaError),
    /// An NCCL call of the run failed.
    #[error("invalid run parameters: the run failed: {0}")]
    RunNccl(#[source] gdx_sys::nccl::NcclError),
}
