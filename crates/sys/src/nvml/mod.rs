//! NVML (`libnvidia-ml.so.1`): GPU names, UUIDs, NVLinks, BAR1, P2P status, driver versions.
//!
//! [`Nvml::load`] opens NVML through nvml-wrapper, which reports a missing library or symbol
//! as an error, never a panic (checked in nvml-wrapper 0.13: `NvmlLib::new` returns
//! `libloading::Error`, and each call resolves its symbol with `nvml_sym(..)?`). One gap is
//! closed here: its `Drop` calls `nvmlShutdown` through a bindgen accessor that panics when
//! the symbol is missing, so both `nvmlInit_v2` and `nvmlShutdown` are checked before init.
//! The candidates are nvml-wrapper's default soname, then the driver's usual directories.

mod snapshot;

pub use snapshot::{snapshot, Gpu, Link, Remote, Snapshot};

use crate::loader;
use crate::Unavailable;
use std::ffi::c_void;
use std::fmt;
use std::sync::{Arc, OnceLock};

/// Canonical soname of NVML.
pub const SONAME: &str = "libnvidia-ml.so.1";

/// The file names [`Nvml::load`] tries, in order: `libnvidia-ml.so.1` and `libnvidia-ml.so` on
/// the loader path, then `libnvidia-ml.so.1` in the driver's usual directories.
pub fn default_candidates() -> Vec<String> {
    loader::candidates(&[SONAME, "libnvidia-ml.so"], SONAME, &loader::driver_dirs())
}

/// An NVML call that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NvmlError {
    /// An NVML call returned an error.
    #[error("{call}{} failed: {message}", on_gpu(.gpu))]
    Call {
        /// The NVML function, e.g. `nvmlDeviceGetBAR1MemoryInfo`.
        call: &'static str,
        /// NVML index of the GPU the call was about, if any.
        gpu: Option<u32>,
        /// nvml-wrapper's description of the status.
        message: String,
    },
    /// NVML reports the call as not supported on this GPU or driver.
    #[error("{call}{} is not supported by this driver or GPU", on_gpu(.gpu))]
    Unsupported {
        /// The NVML function.
        call: &'static str,
        /// NVML index of the GPU, if any.
        gpu: Option<u32>,
    },
}

impl NvmlError {
    pub(crate) fn new(
        call: &'static str,
        gpu: Option<u32>,
        e: nvml_wrapper::error::NvmlError,
    ) -> Self {
        match e {
            nvml_wrapper::error::NvmlError::NotSupported => NvmlError::Unsupported { call, gpu },
            e => NvmlError::Call {
                call,
                gpu,
                message: e.to_string(),
            },
        }
    }
}

fn on_gpu(gpu: &Option<u32>) -> String {
    match gpu {
        Some(g) => format!(" on GPU {g}"),
        None => String::new(),
    }
}

/// An initialised NVML. Cheap to clone; all clones share one library.
#[derive(Clone)]
pub struct Nvml {
    inner: Arc<Inner>,
}

struct Inner {
    nvml: nvml_wrapper::Nvml,
    path: String,
}

impl fmt::Debug for Nvml {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nvml")
            .field("path", &self.inner.path)
            .finish()
    }
}

impl Nvml {
    /// The process-wide NVML handle: loaded from [`default_candidates`] on the first call;
    /// later calls return the same handle or the same [`Unavailable`].
    pub fn load() -> Result<Nvml, Unavailable> {
        static NVML: OnceLock<Result<Nvml, Unavailable>> = OnceLock::new();
        NVML.get_or_init(|| Nvml::load_from(&default_candidates()))
            .clone()
    }

    /// Whether [`Nvml::load`] succeeds.
    pub fn is_available() -> bool {
        Nvml::load().is_ok()
    }

    /// Load from an explicit candidate list, bypassing the cache: the first file the loader
    /// opens must export `nvmlInit_v2` and `nvmlShutdown`, and `nvmlInit_v2` must succeed.
    pub fn load_from<S: AsRef<str>>(candidates: &[S]) -> Result<Nvml, Unavailable> {
        let opened = loader::open_first(SONAME, candidates)?;
        // SAFETY: the table's prototypes copy nvml.h (both take no arguments and return
        // nvmlReturn_t, an int).
        let probe =
            unsafe { Probe::resolve(&opened) }.map_err(|m| m.into_unavailable(SONAME, &opened))?;
        let path = opened.file(probe.nvmlInit_v2 as *const c_void);
        let nvml = nvml_wrapper::Nvml::builder()
            .lib_path(std::ffi::OsStr::new(&opened.candidate))
            .init()
            .map_err(|e| Unavailable::new(SONAME, format!("{path}: nvmlInit_v2 failed: {e}")))?;
        log::debug!("NVML loaded from {path}");
        Ok(Nvml {
            inner: Arc::new(Inner { nvml, path }),
        })
    }

    /// The file NVML was loaded from.
    pub fn path(&self) -> &str {
        &self.inner.path
    }

    /// The nvml-wrapper handle, for queries this module does not wrap yet (fabric manager
    /// state, clocks, ...). Its errors are nvml-wrapper's; it never panics on a missing symbol.
    pub fn wrapper(&self) -> &nvml_wrapper::Nvml {
        &self.inner.nvml
    }

    /// Driver version text, e.g. `580.159.04` (`nvmlSystemGetDriverVersion`).
    pub fn driver_version(&self) -> Result<String, NvmlError> {
        self.inner
            .nvml
            .sys_driver_version()
            .map_err(|e| NvmlError::new("nvmlSystemGetDriverVersion", None, e))
    }

    /// CUDA driver API version number, e.g. 13000 (`nvmlSystemGetCudaDriverVersion_v2`).
    pub fn cuda_driver_version(&self) -> Result<i32, NvmlError> {
        self.inner
            .nvml
            .sys_cuda_driver_version()
            .map_err(|e| NvmlError::new("nvmlSystemGetCudaDriverVersion_v2", None, e))
    }

    /// How many GPUs NVML sees (`nvmlDeviceGetCount_v2`).
    pub fn device_count(&self) -> Result<u32, NvmlError> {
        self.inner
            .nvml
            .device_count()
            .map_err(|e| NvmlError::new("nvmlDeviceGetCount_v2", None, e))
    }
}

loader::fn_table! {
    /// The two symbols checked before nvml-wrapper takes over.
    struct Probe {
        nvmlInit_v2: fn() -> u32;
        nvmlShutdown: fn() -> u32;
    }
    optional {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loader::testing::assert_names_every_candidate;

    #[test]
    fn load_returns_a_handle_or_names_every_candidate() {
        match Nvml::load() {
            Ok(n) => {
                assert!(!n.path().is_empty());
                assert!(!n.driver_version().unwrap().is_empty());
            }
            Err(e) => {
                let init = Some("nvmlInit_v2 failed");
                assert_names_every_candidate(&e, "libnvidia-ml.so.1", &default_candidates(), init);
                assert!(!Nvml::is_available());
            }
        }
    }

    #[test]
    fn load_is_cached() {
        match (Nvml::load(), Nvml::load()) {
            (Ok(a), Ok(b)) => assert!(Arc::ptr_eq(&a.inner, &b.inner)),
            (Err(a), Err(b)) => assert_eq!(a, b),
            (a, b) => panic!("two loads disagree: {a:?} vs {b:?}"),
        }
    }

    #[test]
    fn bogus_path_is_unavailable_naming_the_path() {
        let bogus = "/nonexistent/gdx/libnvidia-ml.so.1";
        let e = Nvml::load_from(&[bogus]).unwrap_err();
        assert_eq!(e.library, "libnvidia-ml.so.1");
        assert!(e.reason.contains(bogus), "{}", e.reason);
    }

    #[test]
    fn wrong_library_is_unavailable_naming_the_missing_symbols() {
        let e = Nvml::load_from(&["libc.so.6"]).unwrap_err();
        assert!(e.reason.contains("libc.so.6"), "{}", e.reason);
        assert!(e.reason.contains("nvmlInit_v2"), "{}", e.reason);
        assert!(e.reason.contains("nvmlShutdown"), "{}", e.reason);
    }

    #[test]
    fn errors_name_call_and_gpu() {
        let e = NvmlError::new(
            "nvmlDeviceGetBAR1MemoryInfo",
            Some(1),
            nvml_wrapper::error::NvmlError::NotSupported,
        );
        assert_eq!(
            e.to_string(),
            "nvmlDeviceGetBAR1MemoryInfo on GPU 1 is not supported by this driver or GPU"
        );
        let e = NvmlError::new(
            "nvmlDeviceGetCount_v2",
            None,
            nvml_wrapper::error::NvmlError::Uninitialized,
        );
        assert!(
            e.to_string().starts_with("nvmlDeviceGetCount_v2 failed: "),
            "{e}"
        );
    }
}
