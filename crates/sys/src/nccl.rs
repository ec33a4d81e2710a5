//! NCCL (`libnccl.so.2`): presence and version.
//!
//! [`probe`] opens the library and calls `ncclGetVersion`, which needs no CUDA context and no
//! communicator. [`Nccl`] (module `comm`) adds communicators and collectives for
//! `gdx nccl run`.

mod comm;

pub use comm::{launch, Collective, Comm, Nccl, NcclError, ELEMENT_BYTES};

use crate::loader;
use crate::Unavailable;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::fmt;
use std::sync::OnceLock;

/// Canonical soname of NCCL 2.
pub const SONAME: &str = "libnccl.so.2";

/// The file names [`probe`] tries, in order: `libnccl.so.2` and `libnccl.so` on the loader
/// path, then `libnccl.so.2` in the CUDA toolkit's directories and the multiarch directory.
pub fn default_candidates() -> Vec<String> {
    loader::candidates(&[SONAME, "libnccl.so"], SONAME, &loader::toolkit_dirs())
}

/// An NCCL version code, as `ncclGetVersion` reports it: `10000 * major + 100 * minor + patch`
/// since 2.9, `1000 * major + 100 * minor + patch` before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NcclVersion(pub i32);

impl NcclVersion {
    /// (major, minor, patch).
    pub fn parts(self) -> (i32, i32, i32) {
        let v = self.0;
        if v >= 10000 {
            (v / 10000, (v % 10000) / 100, v % 100)
        } else {
            (v / 1000, (v % 1000) / 100, v % 100)
        }
    }
}

impl fmt::Display for NcclVersion {
    /// `2.28.3`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (a, b, c) = self.parts();
        write!(f, "{a}.{b}.{c}")
    }
}

/// The NCCL library [`probe`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NcclInfo {
    /// The file the loader mapped.
    pub path: String,
    /// The version; `None` when `ncclGetVersion` failed.
    pub version: Option<NcclVersion>,
}

loader::fn_table! {
    /// Symbols checked to tell NCCL from another library.
    struct Api {
        ncclGetVersion: fn(*mut c_int) -> c_int;
        ncclGetErrorString: fn(c_int) -> *const c_char;
        ncclCommDestroy: fn(*mut c_void) -> c_int;
    }
    optional {}
}

/// Open NCCL and read its version; cached like the other loaders.
pub fn probe() -> Result<NcclInfo, Unavailable> {
    static PROBE: OnceLock<Result<NcclInfo, Unavailable>> = OnceLock::new();
    PROBE
        .get_or_init(|| probe_from(&default_candidates()))
        .clone()
}

/// Whether [`probe`] succeeds.
pub fn is_available() -> bool {
    probe().is_ok()
}

/// Probe an explicit candidate list, bypassing the cache.
pub fn probe_from<S: AsRef<str>>(candidates: &[S]) -> Result<NcclInfo, Unavailable> {
    let opened = loader::open_first(SONAME, candidates)?;
    // SAFETY: the table's prototypes copy nccl.h (`ncclComm_t` as `*mut c_void`,
    // `ncclResult_t` an int); only `ncclGetVersion` and `ncclGetErrorString` are called.
    let api = unsafe { Api::resolve(&opened) }.map_err(|m| m.into_unavailable(SONAME, &opened))?;
    let path = opened.file(api.ncclGetVersion as *const c_void);
    let mut v: c_int = 0;
    // SAFETY: `v` is a valid out-pointer for one int.
    let rc = unsafe { (api.ncclGetVersion)(&mut v) };
    let version = if rc == 0 {
        Some(NcclVersion(v))
    } else {
        // SAFETY: `ncclGetErrorString` accepts any result code and returns a static string.
        let p = unsafe { (api.ncclGetErrorString)(rc) };
        let text = if p.is_null() {
            String::new()
        } else {
            // SAFETY: non-null: a static NUL-terminated string in libnccl.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        };
        log::debug!("ncclGetVersion failed: ncclResult_t {rc}: {text}");
        None
    };
    Ok(NcclInfo { path, version })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_codes_decode_in_both_schemes() {
        assert_eq!(NcclVersion(22803).to_string(), "2.28.3");
        assert_eq!(NcclVersion(2708).to_string(), "2.7.8");
        assert_eq!(NcclVersion(21003).parts(), (2, 10, 3));
    }
}
