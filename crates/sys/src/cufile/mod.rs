//! cuFile (GPUDirect Storage, `libcufile.so.0`): loading, the driver, file handles, buffer
//! registration, reads and writes.
//!
//! [`Cufile::load`] opens the library and resolves every symbol gdx calls, without panicking;
//! [`probe`] reports its path and version (`cuFileGetVersion`, cuFile 1.7 / CUDA 12.2 and later)
//! for `gdx topo` and `gdx doctor`, without opening the cuFile driver.
//!
//! The owning types, each releasing its handle when dropped (never panicking):
//!
//! | type | acquired with | released with |
//! |---|---|---|
//! | [`Driver`] | `cuFileDriverOpen` | `cuFileDriverClose_v2` (or `cuFileDriverClose`) |
//! | [`FileHandle`] | `cuFileHandleRegister` | `cuFileHandleDeregister` |
//! | [`BufferRegistration`] | `cuFileBufRegister` | `cuFileBufDeregister` |
//!
//! [`Driver::mode`] says whether reads and writes run true GPUDirect Storage (the `nvidia-fs`
//! kernel module moves the bytes between storage and GPU memory) or cuFile's compatibility
//! mode (cuFile reads into its own host bounce buffers with POSIX I/O, then copies).
//!
//! Layout: `api` (symbols, structs, status codes), `error` ([`CufileError`]), `driver`
//! ([`Driver`], [`DriverProperties`], [`CufileMode`]), `io` ([`FileHandle`],
//! [`BufferRegistration`]).

mod api;
mod driver;
mod error;
mod io;

pub use driver::{nvidia_fs_loaded, CufileMode, Driver, DriverProperties};
pub use error::CufileError;
pub use io::{BufferRegistration, FileHandle, ParallelIo};

use crate::loader::{self, Opened};
use crate::Unavailable;
use std::ffi::{c_int, c_void};
use std::fmt;
use std::sync::{Arc, OnceLock};

/// Canonical soname of cuFile.
pub const SONAME: &str = "libcufile.so.0";

/// The file names [`probe`] tries, in order: `libcufile.so.0` and `libcufile.so` on the loader
/// path, then `libcufile.so.0` in the CUDA toolkit's directories (`$CUDA_HOME`, `$CUDA_PATH`,
/// `/usr/local/cuda`, each under `targets/<arch>/lib` and `lib64`) and the multiarch directory.
pub fn default_candidates() -> Vec<String> {
    loader::candidates(&[SONAME, "libcufile.so"], SONAME, &loader::toolkit_dirs())
}

/// A cuFile library version, as `cuFileGetVersion` reports it (`1000 * major + 10 * minor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CufileVersion(pub i32);

impl fmt::Display for CufileVersion {
    /// `1.15.0`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.0;
        write!(f, "{}.{}.{}", v / 1000, (v % 1000) / 10, v % 10)
    }
}

/// The cuFile library [`probe`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CufileInfo {
    /// The file the loader mapped.
    pub path: String,
    /// The library version; `None` when the library lacks `cuFileGetVersion` or it failed.
    pub version: Option<CufileVersion>,
}

/// A loaded cuFile library. Cheap to clone; all clones share one library. Opening the
/// driver is a separate step ([`Driver::open`]).
#[derive(Clone)]
pub struct Cufile {
    inner: Arc<Inner>,
}

struct Inner {
    api: api::Api,
    path: String,
    version: Option<CufileVersion>,
    /// Keeps the library open (it is never closed).
    _lib: Opened,
}

impl fmt::Debug for Cufile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cufile")
            .field("path", &self.inner.path)
            .field("version", &self.inner.version)
            .finish()
    }
}

impl Cufile {
    /// The process-wide cuFile library: loaded from [`default_candidates`] on the first call;
    /// later calls return the same handle or the same [`Unavailable`].
    pub fn load() -> Result<Cufile, Unavailable> {
        static CUFILE: OnceLock<Result<Cufile, Unavailable>> = OnceLock::new();
        CUFILE
            .get_or_init(|| Cufile::load_from(&default_candidates()))
            .clone()
    }

    /// Load from an explicit candidate list, bypassing the cache: the first file the loader
    /// opens must have every required symbol.
    pub fn load_from<S: AsRef<str>>(candidates: &[S]) -> Result<Cufile, Unavailable> {
        let opened = loader::open_first(SONAME, candidates)?;
        // SAFETY: `opened` is the library found under cuFile's names, and the table's
        // prototypes copy cufile.h (enums as plain ints, struct pointers to the repr(C)
        // copies in `api`).
        let api = unsafe { api::Api::resolve(&opened) }
            .map_err(|m| m.into_unavailable(SONAME, &opened))?;
        let path = opened.file(api.cuFileDriverOpen as *const c_void);
        let version = api.cuFileGetVersion.and_then(|f| {
            let mut v: c_int = 0;
            // SAFETY: `v` is a valid out-pointer for one int; the call needs no open driver.
            let status = unsafe { f(&mut v) };
            if status.err == api::SUCCESS {
                Some(CufileVersion(v))
            } else {
                log::debug!(
                    "cuFileGetVersion failed: CUfileOpError {} (CUresult {})",
                    status.err,
                    status.cu_err
                );
                None
            }
        });
        Ok(Cufile {
            inner: Arc::new(Inner {
                api,
                path,
                version,
                _lib: opened,
            }),
        })
    }

    /// The file the library was loaded from.
    pub fn path(&self) -> &str {
        &self.inner.path
    }

    /// The library version, when it reports one (cuFile 1.7 and later).
    pub fn version(&self) -> Option<CufileVersion> {
        self.inner.version
    }

    pub(crate) fn api(&self) -> &api::Api {
        &self.inner.api
    }
}

/// Open cuFile and read its version, through the cached [`Cufile::load`].
pub fn probe() -> Result<CufileInfo, Unavailable> {
    Cufile::load().map(|c| CufileInfo {
        path: c.path().to_string(),
        version: c.version(),
    })
}

/// Whether [`probe`] succeeds.
pub fn is_available() -> bool {
    probe().is_ok()
}

/// Probe an explicit candidate list, bypassing the cache.
pub fn probe_from<S: AsRef<str>>(candidates: &[S]) -> Result<CufileInfo, Unavailable> {
    Cufile::load_from(candidates).map(|c| CufileInfo {
        path: c.path().to_string(),
        version: c.version(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_candidates_include_the_toolkit_target_dir() {
        let c = default_candidates();
        assert_eq!(c[0], "libcufile.so.0");
        assert!(c.iter().any(
            |p| p.starts_with("/usr/local/cuda/targets/") && p.ends_with("/lib/libcufile.so.0")
        ));
    }

    #[test]
    fn versions_print_as_major_minor_patch() {
        assert_eq!(CufileVersion(1070).to_string(), "1.7.0");
        assert_eq!(CufileVersion(1150).to_string(), "1.15.0");
    }
}
