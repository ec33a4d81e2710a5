//! gdx-sys: run-time loading of the vendor libraries gdx uses (libcuda, NVML, libibverbs,
//! cuFile, NCCL). Every entry point returns either a working handle or a typed
//! [`Unavailable`] saying which library and why; nothing here panics when a library or a
//! symbol is missing. (STUB — being written.)

pub mod nvml;

/// A vendor library that could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{library} unavailable: {reason}")]
pub struct Unavailable {
    /// Library name, e.g. `libnvidia-ml.so.1`.
    pub library: String,
    /// Why: every soname tried and the loader's message, or the init call that failed.
    pub reason: String,
}
