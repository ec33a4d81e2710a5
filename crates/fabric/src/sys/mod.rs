//! The only place in this crate with `unsafe`: libfabric opened at run time, and owning handles
//! for its objects.
//!
//! - libfabric exports only a handful of functions (`fi_getinfo`, `fi_fabric`, ...); everything
//!   else in its API is a `static inline` wrapper that calls through an ops table in the object
//!   (`ep->rma->write(...)`). Those wrappers are written out here over the layouts in
//!   [`bindings`], which are checked in so the build needs no libfabric headers.
//! - A missing or too-old library is a [`gdx_sys::Unavailable`], never a panic.
//! - Each object is owned by one handle whose `Drop` calls `fi_close`; a child holds an `Arc` to
//!   the objects it must be closed before (MR → domain, endpoint → CQ, AV → domain → fabric), so
//!   the teardown order follows from the types.

pub(crate) mod bindings;
mod handles;
mod memory;

pub(crate) use bindings as ffi;
pub(crate) use handles::{CqEvent, Domain, Ep, Fabric, Mr, Post};
pub use memory::Memory;

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::OnceLock;

use gdx_sys::Unavailable;

use crate::error::{FabricError, Result};

/// The API version gdx asks for: 1.11 (FI_MR_ENDPOINT, FI_HMEM, `fid_nic`), older than every
/// libfabric a current distribution or the EFA installer ships.
pub(crate) const API_VERSION: u32 = (1 << 16) | 11;

type GetInfoFn = unsafe extern "C" fn(
    u32,
    *const c_char,
    *const c_char,
    u64,
    *const ffi::fi_info,
    *mut *mut ffi::fi_info,
) -> c_int;
type FreeInfoFn = unsafe extern "C" fn(*mut ffi::fi_info);
type DupInfoFn = unsafe extern "C" fn(*const ffi::fi_info) -> *mut ffi::fi_info;
type FabricFn =
    unsafe extern "C" fn(*mut ffi::fi_fabric_attr, *mut *mut ffi::fid_fabric, *mut c_void) -> c_int;
type StrErrorFn = unsafe extern "C" fn(c_int) -> *const c_char;
type VersionFn = unsafe extern "C" fn() -> u32;

/// The exported libfabric functions gdx calls.
pub(crate) struct Api {
    getinfo: GetInfoFn,
    freeinfo: FreeInfoFn,
    dupinfo: DupInfoFn,
    fabric: FabricFn,
    strerror: StrErrorFn,
    version: VersionFn,
    /// The candidate that opened.
    pub(crate) path: String,
}

const CANDIDATES: &[&str] = &[
    "libfabric.so.1",
    "libfabric.so",
    "/opt/amazon/efa/lib/libfabric.so.1",
    "/opt/amazon/efa/lib64/libfabric.so.1",
];

static API: OnceLock<std::result::Result<Api, Unavailable>> = OnceLock::new();

/// libfabric, opened on first use (the result, good or bad, is kept for the process).
pub(crate) fn api() -> std::result::Result<&'static Api, Unavailable> {
    API.get_or_init(open).as_ref().map_err(Clone::clone)
}

fn open() -> std::result::Result<Api, Unavailable> {
    let mut tried = Vec::new();
    for c in CANDIDATES {
        // SAFETY: loading libfabric runs its initialisers (provider discovery); that is what
        // loading it means. The library is never unloaded (leaked below), so the function
        // pointers taken from it stay valid for the process.
        match unsafe { libloading::Library::new(c) } {
            Ok(lib) => {
                let lib: &'static libloading::Library = Box::leak(Box::new(lib));
                return resolve(lib, c);
            }
            Err(e) => tried.push(format!("{c}: {e}")),
        }
    }
    Err(Unavailable::new(
        "libfabric.so.1",
        format!("not loaded; tried {}", tried.join("; ")),
    ))
}

fn resolve(lib: &'static libloading::Library, path: &str) -> std::result::Result<Api, Unavailable> {
    fn get<T: Copy>(lib: &libloading::Library, name: &str) -> std::result::Result<T, Unavailable> {
        // SAFETY: each call below names the function type of that libfabric symbol as
        // declared in rdma/fabric.h (the same prototypes bindgen produced).
        unsafe { lib.get::<T>(name.as_bytes()) }
            .map(|s| *s)
            .map_err(|e| Unavailable::new("libfabric.so.1", format!("{name}: {e}")))
    }
    let api = Api {
        getinfo: get(lib, "fi_getinfo")?,
        freeinfo: get(lib, "fi_freeinfo")?,
        dupinfo: get(lib, "fi_dupinfo")?,
        fabric: get(lib, "fi_fabric")?,
        strerror: get(lib, "fi_strerror")?,
        version: get(lib, "fi_version")?,
        path: path.to_string(),
    };
    let (maj, min) = api.runtime_version();
    if (maj << 16 | min) < API_VERSION {
        return Err(Unavailable::new(
            "libfabric.so.1",
            format!("{path} is libfabric {maj}.{min}; gdx needs API 1.11 or newer"),
        ));
    }
    Ok(api)
}

impl Api {
    /// `fi_version()` as (major, minor).
    pub(crate) fn runtime_version(&self) -> (u32, u32) {
        // SAFETY: `fi_version` takes no arguments and returns a number.
        let v = unsafe { (self.version)() };
        (v >> 16, v & 0xffff)
    }

    /// `fi_strerror(code)` for a positive code.
    pub(crate) fn strerror(&self, code: i32) -> String {
        // SAFETY: fi_strerror returns a pointer to a static string for any value.
        let p = unsafe { (self.strerror)(code) };
        if p.is_null() {
            return format!("error {code}");
        }
        // SAFETY: non-null and NUL-terminated (a static string in libfabric).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// Turns a negative return into [`FabricError::Call`].
    pub(crate) fn check(&self, call: &'static str, rc: isize) -> Result<()> {
        if rc >= 0 {
            return Ok(());
        }
        let code = i32::try_from(-rc).unwrap_or(i32::MAX);
        Err(FabricError::Call {
            call,
            code,
            message: self.strerror(code),
        })
    }
}

/// What to ask `fi_getinfo` for.
#[derive(Debug, Clone, Default)]
pub(crate) struct Hints {
    /// Capability bits (FI_RMA | ...).
    pub caps: u64,
    /// `fabric_attr.prov_name`.
    pub provider: Option<String>,
    /// MR mode bits gdx can handle.
    pub mr_mode: i32,
    /// `node` argument (with FI_SOURCE: the local address to bind).
    pub node: Option<String>,
}

/// One `fi_info` entry, copied into plain values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub provider: String,
    pub fabric: String,
    pub domain: String,
    pub caps: u64,
    pub mode: u64,
    pub mr_mode: i32,
    pub mr_key_size: usize,
    pub ep_type: u32,
    pub thread_safe: bool,
    pub manual_progress: bool,
    pub max_msg_size: usize,
    pub tx_size: usize,
    pub addr_format: u32,
    pub src_addr: Vec<u8>,
}

/// A list from `fi_getinfo`, freed with `fi_freeinfo`.
pub(crate) struct InfoList {
    api: &'static Api,
    head: *mut ffi::fi_info,
}

fn cstring(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| FabricError::NoProvider(format!("{s:?} contains a NUL byte")))
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
    pub(crate) fn get(api: &'static Api, h: &Hints) -> Result<InfoList> {
        // SAFETY: fi_dupinfo(NULL) is fi_allocinfo: a zeroed fi_info with all attribute
        // structs allocated, freed with fi_freeinfo below.
        let hints = unsafe { (api.dupinfo)(std::ptr::null()) };
        if hints.is_null() {
            return Err(FabricError::Call {
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
            (api.getinfo)(
                API_VERSION,
                node.as_ref().map_or(std::ptr::null(), |n| n.as_ptr()),
                std::ptr::null(),
                flags,
                hints,
                &mut out,
            )
        };
        // SAFETY: hints came from fi_allocinfo and is not used after this.
        unsafe { (api.freeinfo)(hints) };
        if rc == -(ffi::FI_ENODATA as c_int) {
            return Ok(InfoList {
                api,
                head: std::ptr::null_mut(),
            });
        }
        api.check("fi_getinfo", rc as isize)?;
        Ok(InfoList { api, head: out })
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
    pub(crate) fn entries(&self) -> Vec<Entry> {
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
    pub(crate) fn take(&self, i: usize) -> Result<OwnedInfo> {
        let p = self.nth(i);
        if p.is_null() {
            return Err(FabricError::NoProvider(format!("no entry {i}")));
        }
        // SAFETY: `p` is a valid entry; fi_dupinfo deep-copies one fi_info (next = NULL).
        let d = unsafe { (self.api.dupinfo)(p) };
        if d.is_null() {
            return Err(FabricError::Call {
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
            unsafe { (self.api.freeinfo)(self.head) };
        }
    }
}

/// One `fi_info` owned by gdx (from `fi_dupinfo`).
pub(crate) struct OwnedInfo {
    pub(crate) api: &'static Api,
    ptr: *mut ffi::fi_info,
}

// SAFETY: an fi_info is plain data owned by this value; it is only read after creation.
unsafe impl Send for OwnedInfo {}
// SAFETY: as above, shared access only reads.
unsafe impl Sync for OwnedInfo {}

impl OwnedInfo {
    pub(crate) fn as_ptr(&self) -> *mut ffi::fi_info {
        self.ptr
    }
}

impl Drop for OwnedInfo {
    fn drop(&mut self) {
        // SAFETY: from fi_dupinfo; the objects opened from it copied what they need.
        unsafe { (self.api.freeinfo)(self.ptr) };
    }
}

/// `fi_fabric` over an owned info.
pub(crate) fn open_fabric(info: OwnedInfo) -> Result<std::sync::Arc<Fabric>> {
    let api = info.api;
    let mut fab: *mut ffi::fid_fabric = std::ptr::null_mut();
    // SAFETY: fabric_attr belongs to a valid fi_info; out-pointer is valid.
    let rc = unsafe { (api.fabric)((*info.as_ptr()).fabric_attr, &mut fab, std::ptr::null_mut()) };
    api.check("fi_fabric", rc as isize)?;
    Ok(std::sync::Arc::new(Fabric::from_raw(info, fab)))
}
