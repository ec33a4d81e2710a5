//! libfabric (`libfabric.so.1`), opened at run time, and owning handles for its objects.
//!
//! - libfabric exports only a handful of functions (`fi_getinfo`, `fi_fabric`, ...); everything
//!   else in its API is a `static inline` wrapper that calls through an ops table in the object
//!   (`ep->rma->write(...)`). Those wrappers are written out here ([`handles`]'s types) over the
//!   layouts in [`bindings`], which are checked in so the build needs no libfabric headers.
//! - [`Libfabric::load`] opens the library like the crate's other loaders (every candidate
//!   named when none opens, a missing symbol or an API older than 1.11 named): a missing or
//!   too-old library is an [`Unavailable`], never a panic.
//! - Each object is owned by one handle whose `Drop` calls `fi_close`; a child holds an `Arc` to
//!   the objects it must be closed before (MR → domain, endpoint → CQ, AV → domain → fabric), so
//!   the teardown order follows from the types. A failed close is logged and counted on the
//!   domain ([`Domain::close_errors`]), never a panic.
//! - Objects given to a call are checked to belong to the same domain before libfabric sees
//!   them. The one unchecked contract, that a registration outlives the operations posted on
//!   it, is [`Ep::post`]'s `# Safety`.
//!
//! Which provider to use, batches, timeouts and the mapping of completion errors are
//! gdx-fabric's.

pub mod bindings;
mod error;
mod handles;
mod memory;

pub use error::LibfabricError;
pub use handles::{Av, Cq, CqEvent, Domain, Ep, Fabric, Mr, Post};
pub use memory::Memory;

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::{Arc, OnceLock};

use crate::loader;
use crate::Unavailable;
use bindings as ffi;

type Result<T> = std::result::Result<T, LibfabricError>;

/// Canonical soname of libfabric.
pub const SONAME: &str = "libfabric.so.1";

/// The API version gdx asks for: 1.11 (FI_MR_ENDPOINT, FI_HMEM, `fid_nic`), older than every
/// libfabric a current distribution or the EFA installer ships.
pub const API_VERSION: u32 = (1 << 16) | 11;

/// The file names [`Libfabric::load`] tries, in order: `libfabric.so.1` and `libfabric.so` on
/// the loader path, then `libfabric.so.1` where the EFA installer puts it.
pub fn default_candidates() -> Vec<String> {
    let dirs = [
        "/opt/amazon/efa/lib".to_string(),
        "/opt/amazon/efa/lib64".to_string(),
    ];
    loader::candidates(&[SONAME, "libfabric.so"], SONAME, &dirs)
}

loader::fn_table! {
    /// The exported libfabric functions gdx calls.
    struct Api {
        fi_getinfo: fn(
            u32,
            *const c_char,
            *const c_char,
            u64,
            *const ffi::fi_info,
            *mut *mut ffi::fi_info,
        ) -> c_int;
        fi_freeinfo: fn(*mut ffi::fi_info) -> ();
        fi_dupinfo: fn(*const ffi::fi_info) -> *mut ffi::fi_info;
        fi_fabric: fn(*mut ffi::fi_fabric_attr, *mut *mut ffi::fid_fabric, *mut c_void) -> c_int;
        fi_strerror: fn(c_int) -> *const c_char;
        fi_version: fn() -> u32;
    }
    optional {}
}

/// libfabric, loaded. Lives for the rest of the process once loaded ([`Libfabric::load`]
/// returns a `&'static`).
pub struct Libfabric {
    api: Api,
    path: String,
    /// Keeps the library open (it is never closed).
    _lib: loader::Opened,
}

impl std::fmt::Debug for Libfabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Libfabric")
            .field("path", &self.path)
            .field("version", &self.runtime_version())
            .finish()
    }
}

impl Libfabric {
    /// libfabric, opened on first use from [`default_candidates`] (the result, good or bad, is
    /// kept for the process).
    pub fn load() -> std::result::Result<&'static Libfabric, Unavailable> {
        static LIB: OnceLock<std::result::Result<Libfabric, Unavailable>> = OnceLock::new();
        LIB.get_or_init(|| Libfabric::open(&default_candidates()))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Open libfabric from an explicit candidate list, bypassing the cache. The library stays
    /// open for the rest of the process, like every library this crate opens.
    pub fn load_from<S: AsRef<str>>(
        candidates: &[S],
    ) -> std::result::Result<&'static Libfabric, Unavailable> {
        Libfabric::open(candidates).map(|l| &*Box::leak(Box::new(l)))
    }

    fn open<S: AsRef<str>>(candidates: &[S]) -> std::result::Result<Libfabric, Unavailable> {
        // Loading libfabric runs its initialisers (provider discovery): that is what loading it
        // means. The library is never unloaded, so the function pointers stay valid.
        let opened = loader::open_first(SONAME, candidates)?;
        // SAFETY: the table's prototypes copy rdma/fabric.h (the same prototypes bindgen
        // produced for these six exported functions).
        let api =
            unsafe { Api::resolve(&opened) }.map_err(|m| m.into_unavailable(SONAME, &opened))?;
        let path = opened.file(api.fi_getinfo as *const c_void);
        let lib = Libfabric {
            api,
            path,
            _lib: opened,
        };
        let (maj, min) = lib.runtime_version();
        if (maj << 16 | min) < API_VERSION {
            return Err(Unavailable::new(
                SONAME,
                format!(
                    "{} is libfabric {maj}.{min}; gdx needs API 1.11 or newer",
                    lib.path
                ),
            ));
        }
        Ok(lib)
    }

    /// The file the loader mapped.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// `fi_version()` as (major, minor).
    pub fn runtime_version(&self) -> (u32, u32) {
        // SAFETY: `fi_version` takes no arguments and returns a number.
        let v = unsafe { (self.api.fi_version)() };
        (v >> 16, v & 0xffff)
    }

    /// `fi_strerror(code)` for a positive code.
    pub fn strerror(&self, code: i32) -> String {
        // SAFETY: fi_strerror returns a pointer to a static string for any value.
        let p = unsafe { (self.api.fi_strerror)(code) };
        if p.is_null() {
            return format!("error {code}");
        }
        // SAFETY: non-null and NUL-terminated (a static string in libfabric).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// Turns a negative return into [`LibfabricError::Call`].
    pub fn check(&self, call: &'static str, rc: isize) -> Result<()> {
        if rc >= 0 {
            return Ok(());
        }
        let code = i32::try_from(-rc).unwrap_or(i32::MAX);
        Err(LibfabricError::Call {
            call,
            code,
            message: self.strerror(code),
        })
    }
}

/// Whether [`Libfabric::load`] succeeds.
pub fn is_available() -> bool {
    Libfabric::load().is_ok()
}

/// What to ask `fi_getinfo` for (always an RDM endpoint, FI_DELIVERY_COMPLETE and
/// FI_THREAD_SAFE).
#[derive(Debug, Clone, Default)]
pub struct Hints {
    /// Capability bits (FI_RMA | ...).
    pub caps: u64,
    /// `fabric_attr.prov_name`.
    pub provider: Option<String>,
    /// MR mode bits the caller can handle.
    pub mr_mode: i32,
    /// `node` argument (with FI_SOURCE: the local address to bind).
    pub node: Option<String>,
}

/// One `fi_info` entry, copied into plain values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// `fabric_attr.prov_name` (`tcp;ofi_rxm`, `efa`).
    pub provider: String,
    /// `fabric_attr.name`.
    pub fabric: String,
    /// `domain_attr.name`.
    pub domain: String,
    /// Capability bits.
    pub caps: u64,
    /// Mode bits the provider needs of the caller.
    pub mode: u64,
    /// `domain_attr.mr_mode`.
    pub mr_mode: i32,
    /// `domain_attr.mr_key_size` in bytes.
    pub mr_key_size: usize,
    /// `ep_attr.type`.
    pub ep_type: u32,
    /// `domain_attr.threading` is FI_THREAD_SAFE.
    pub thread_safe: bool,
    /// `domain_attr.data_progress` is FI_PROGRESS_MANUAL.
    pub manual_progress: bool,
    /// `ep_attr.max_msg_size`.
    pub max_msg_size: usize,
    /// `tx_attr.size` (0 without a tx_attr).
    pub tx_size: usize,
    /// `addr_format` (FI_SOCKADDR_IN, ...).
    pub addr_format: u32,
    /// The source address, as bytes of `addr_format`.
    pub src_addr: Vec<u8>,
}

/// A list from `fi_getinfo`, freed with `fi_freeinfo`.
pub struct InfoList {
    api: &'static Libfabric,
    head: *mut ffi::fi_info,
}

fn cstring(s: &str) -> Result<CString> {
    CString::new(s).map_err(|e| LibfabricError::NulInName {
        name: s.to_string(),
        at: e.nul_position(),
    })
}

fn text(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: libfabric's attribute strings are NUL-terminated and owned by the fi_info that
    // is alive while this is called.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

impl InfoList {
    /// `fi_getinfo` with `hints` (an empty list when nothing matches).
    pub fn get(api: &'static Libfabric, h: &Hints) -> Result<InfoList> {
        // SAFETY: fi_dupinfo(NULL) is fi_allocinfo: a zeroed fi_info with all attribute
        // structs allocated, freed with fi_freeinfo below.
        let hints = unsafe { (api.api.fi_dupinfo)(std::ptr::null()) };
        if hints.is_null() {
            return Err(LibfabricError::Call {
                call: "fi_allocinfo",
                code: ffi::FI_ENOMEM as i32,
                message: api.strerror(ffi::FI_ENOMEM as i32),
            });
        }
        let node = h.node.as_deref().map(cstring).transpose()?;
        let prov = h.provider.as_deref().map(cstring).transpose()?;
        // SAFETY: `hints` and its attribute structs were just allocated by libfabric. The
        // provider name is strdup'd because fi_freeinfo frees it.
        unsafe {
            (*hints).caps = h.caps;
            (*hints).mode = 0;
            (*(*hints).ep_attr).type_ = ffi::fi_ep_type_FI_EP_RDM;
            // A write completes only once its bytes are in the target's memory (as an RC
            // write's ack means): with transmit completion a target that refuses the key
            // drops the write while the initiator sees success.
            (*(*hints).tx_attr).op_flags = ffi::FI_DELIVERY_COMPLETE as u64;
            let d = &mut *(*hints).domain_attr;
            d.mr_mode = h.mr_mode;
            d.threading = ffi::fi_threading_FI_THREAD_SAFE;
            if let Some(p) = &prov {
                (*(*hints).fabric_attr).prov_name = libc::strdup(p.as_ptr());
            }
        }
        let mut out: *mut ffi::fi_info = std::ptr::null_mut();
        let flags = if node.is_some() { ffi::FI_SOURCE } else { 0 };
        // SAFETY: valid hints, optional NUL-terminated node, and an out-pointer.
        let rc = unsafe {
            (api.api.fi_getinfo)(
                API_VERSION,
                node.as_ref().map_or(std::ptr::null(), |n| n.as_ptr()),
                std::ptr::null(),
                flags,
                hints,
                &mut out,
            )
        };
        // SAFETY: hints came from fi_allocinfo and is not used after this.
        unsafe { (api.api.fi_freeinfo)(hints) };
        if rc == -(ffi::FI_ENODATA as c_int) {
            return Ok(InfoList {
                api,
                head: std::ptr::null_mut(),
            });
        }
        api.check("fi_getinfo", rc as isize)?;
        Ok(InfoList { api, head: out })
    }

    /// Entries in the list.
    pub fn len(&self) -> usize {
        let (mut p, mut n) = (self.head, 0);
        while !p.is_null() {
            // SAFETY: `p` is a node of the list this value owns.
            p = unsafe { (*p).next };
            n += 1;
        }
        n
    }

    /// True for an empty list.
    pub fn is_empty(&self) -> bool {
        self.head.is_null()
    }

    fn nth(&self, i: usize) -> *mut ffi::fi_info {
        let mut p = self.head;
        let mut n = 0;
        while !p.is_null() && n < i {
            // SAFETY: `p` is a node of the list this value owns.
            p = unsafe { (*p).next };
            n += 1;
        }
        p
    }

    /// The entries, copied out.
    pub fn entries(&self) -> Vec<Entry> {
        let mut v = Vec::new();
        let mut p = self.head;
        while !p.is_null() {
            // SAFETY: `p` is a node of the owned list; libfabric fills every attribute pointer
            // of the fi_info it returns.
            unsafe {
                let i = &*p;
                let d = &*i.domain_attr;
                let f = &*i.fabric_attr;
                let e = &*i.ep_attr;
                let src = if i.src_addr.is_null() {
                    Vec::new()
                } else {
                    std::slice::from_raw_parts(i.src_addr as *const u8, i.src_addrlen).to_vec()
                };
                v.push(Entry {
                    provider: text(f.prov_name),
                    fabric: text(f.name),
                    domain: text(d.name),
                    caps: i.caps,
                    mode: i.mode,
                    mr_mode: d.mr_mode,
                    mr_key_size: d.mr_key_size,
                    ep_type: e.type_,
                    thread_safe: d.threading == ffi::fi_threading_FI_THREAD_SAFE,
                    manual_progress: d.data_progress == ffi::fi_progress_FI_PROGRESS_MANUAL,
                    max_msg_size: e.max_msg_size,
                    tx_size: if i.tx_attr.is_null() {
                        0
                    } else {
                        (*i.tx_attr).size
                    },
                    addr_format: i.addr_format,
                    src_addr: src,
                });
                p = i.next;
            }
        }
        v
    }

    /// A copy of entry `i` alone (`fi_dupinfo`), to open a fabric from.
    pub fn take(&self, i: usize) -> Result<OwnedInfo> {
        let p = self.nth(i);
        if p.is_null() {
            return Err(LibfabricError::NoEntry {
                index: i,
                len: self.len(),
            });
        }
        // SAFETY: `p` is a valid entry; fi_dupinfo deep-copies one fi_info (next = NULL).
        let d = unsafe { (self.api.api.fi_dupinfo)(p) };
        if d.is_null() {
            return Err(LibfabricError::Call {
                call: "fi_dupinfo",
                code: ffi::FI_ENOMEM as i32,
                message: self.api.strerror(ffi::FI_ENOMEM as i32),
            });
        }
        Ok(OwnedInfo {
            api: self.api,
            ptr: d,
        })
    }
}

impl Drop for InfoList {
    fn drop(&mut self) {
        if !self.head.is_null() {
            // SAFETY: the list came from fi_getinfo and nothing borrows it any more.
            unsafe { (self.api.api.fi_freeinfo)(self.head) };
        }
    }
}

/// One `fi_info` owned by gdx (from `fi_dupinfo`), to open a fabric from ([`open_fabric`]).
pub struct OwnedInfo {
    api: &'static Libfabric,
    ptr: *mut ffi::fi_info,
}

// SAFETY: an fi_info is plain data owned by this value; it is only read after creation.
unsafe impl Send for OwnedInfo {}
// SAFETY: as above, shared access only reads.
unsafe impl Sync for OwnedInfo {}

impl OwnedInfo {
    /// The library it came from.
    pub fn library(&self) -> &'static Libfabric {
        self.api
    }

    pub(crate) fn as_ptr(&self) -> *mut ffi::fi_info {
        self.ptr
    }
}

impl Drop for OwnedInfo {
    fn drop(&mut self) {
        // SAFETY: from fi_dupinfo; the objects opened from it copied what they need.
        unsafe { (self.api.api.fi_freeinfo)(self.ptr) };
    }
}

/// `fi_fabric` over an owned info.
pub fn open_fabric(info: OwnedInfo) -> Result<Arc<Fabric>> {
    let api = info.api;
    let mut fab: *mut ffi::fid_fabric = std::ptr::null_mut();
    // SAFETY: fabric_attr belongs to a valid fi_info; out-pointer is valid.
    let rc = unsafe {
        (api.api.fi_fabric)((*info.as_ptr()).fabric_attr, &mut fab, std::ptr::null_mut())
    };
    api.check("fi_fabric", rc as isize)?;
    Ok(Arc::new(Fabric::from_raw(info, fab)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loader::testing::assert_names_every_candidate;

    #[test]
    fn load_works_or_names_every_candidate() {
        match Libfabric::load() {
            Ok(lib) => {
                assert!(!lib.path().is_empty());
                let (maj, min) = lib.runtime_version();
                assert!((maj << 16 | min) >= API_VERSION, "{maj}.{min}");
                assert!(is_available());
                assert!(!lib.strerror(ffi::FI_EAGAIN as i32).is_empty());
                let e = lib
                    .check("fi_test", -(ffi::FI_EAGAIN as isize))
                    .unwrap_err();
                assert!(
                    matches!(
                        e,
                        LibfabricError::Call {
                            call: "fi_test",
                            code: 11,
                            ..
                        }
                    ),
                    "{e}"
                );
                assert!(lib.check("fi_test", 0).is_ok());
            }
            Err(e) => assert_names_every_candidate(&e, SONAME, &default_candidates(), None),
        }
        assert_eq!(
            Libfabric::load().map(|l| l.path().to_string()),
            Libfabric::load().map(|l| l.path().to_string())
        );
    }

    #[test]
    fn a_missing_file_or_another_library_is_unavailable() {
        let bogus = "/nonexistent/gdx/libfabric.so.1";
        let e = Libfabric::load_from(&[bogus]).unwrap_err();
        assert_eq!(e.library, SONAME);
        assert!(e.reason.contains(bogus), "{}", e.reason);
        let e = Libfabric::load_from(&["libc.so.6"]).unwrap_err();
        assert!(e.reason.contains("fi_getinfo"), "{}", e.reason);
    }

    #[test]
    fn default_candidates_try_the_loader_path_then_the_efa_installer() {
        assert_eq!(
            default_candidates(),
            [
                "libfabric.so.1",
                "libfabric.so",
                "/opt/amazon/efa/lib/libfabric.so.1",
                "/opt/amazon/efa/lib64/libfabric.so.1",
            ]
        );
    }
}
