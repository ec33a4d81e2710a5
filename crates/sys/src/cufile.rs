//! cuFile (GPUDirect Storage, `libcufile.so.0`): presence and version.
//!
//! [`probe`] opens the library and reads `cuFileGetVersion` when the library has it (cuFile
//! 1.7, CUDA 12.2, and later). It does not open the cuFile driver (`cuFileDriverOpen`); that
//! belongs to the engine's file transport.

use crate::loader;
use crate::Unavailable;
use std::ffi::{c_int, c_void};
use std::fmt;
use std::sync::OnceLock;

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

/// `CUfileError_t`: `{ CUfileOpError err; CUresult cu_err; }`, both plain ints here.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct CufileStatus {
    err: c_int,
    cu_err: c_int,
}

loader::fn_table! {
    /// Symbols checked to tell cuFile from another library.
    struct Api {
        cuFileDriverOpen: fn() -> CufileStatus;
        cuFileHandleRegister: fn(*mut c_void, *mut c_void) -> CufileStatus;
        cuFileRead: fn(*mut c_void, *mut c_void, usize, i64, i64) -> isize;
    }
    optional {
        cuFileGetVersion: fn(*mut c_int) -> CufileStatus;
    }
}

/// Open cuFile and read its version; cached like the other loaders.
pub fn probe() -> Result<CufileInfo, Unavailable> {
    static PROBE: OnceLock<Result<CufileInfo, Unavailable>> = OnceLock::new();
    PROBE
        .get_or_init(|| probe_from(&default_candidates()))
        .clone()
}

/// Whether [`probe`] succeeds.
pub fn is_available() -> bool {
    probe().is_ok()
}

/// Probe an explicit candidate list, bypassing the cache.
pub fn probe_from<S: AsRef<str>>(candidates: &[S]) -> Result<CufileInfo, Unavailable> {
    let opened = loader::open_first(SONAME, candidates)?;
    // SAFETY: the table's prototypes copy cufile.h (struct pointers as `*mut c_void`, the
    // CUfileError_t struct as two ints); only `cuFileGetVersion` is ever called.
    let api = unsafe { Api::resolve(&opened) }.map_err(|m| m.into_unavailable(SONAME, &opened))?;
    let path = opened.file(api.cuFileDriverOpen as *const c_void);
    let version = api.cuFileGetVersion.and_then(|f| {
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid out-pointer for one int; the call needs no open driver.
        let status = unsafe { f(&mut v) };
        if status.err == 0 {
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
    Ok(CufileInfo { path, version })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_is_ok_or_names_every_candidate() {
        match probe() {
            Ok(info) => {
                assert!(!info.path.is_empty());
                assert!(is_available());
            }
            Err(e) => {
                assert_eq!(e.library, "libcufile.so.0");
                for c in default_candidates() {
                    assert!(e.reason.contains(&c), "{c} not in: {}", e.reason);
                }
            }
        }
        assert_eq!(probe(), probe());
    }

    #[test]
    fn default_candidates_include_the_toolkit_target_dir() {
        let c = default_candidates();
        assert_eq!(c[0], "libcufile.so.0");
        assert!(c.iter().any(
            |p| p.starts_with("/usr/local/cuda/targets/") && p.ends_with("/lib/libcufile.so.0")
        ));
    }

    #[test]
    fn bogus_path_and_wrong_library_are_unavailable() {
        let bogus = "/nonexistent/gdx/libcufile.so.0";
        let e = probe_from(&[bogus]).unwrap_err();
        assert!(e.reason.contains(bogus), "{}", e.reason);
        let e = probe_from(&["libc.so.6"]).unwrap_err();
        assert!(e.reason.contains("cuFileDriverOpen"), "{}", e.reason);
    }

    #[test]
    fn versions_print_as_major_minor_patch() {
        assert_eq!(CufileVersion(1070).to_string(), "1.7.0");
        assert_eq!(CufileVersion(1150).to_string(), "1.15.0");
    }
}
