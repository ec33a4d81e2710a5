//! Owning handles for fabric, domain, completion queue, address vector, endpoint and memory
//! registration. Each `Drop` calls `fi_close`; a failed close is logged and counted on the
//! domain (never a panic), and the domain's count of live registrations drops only when the
//! provider accepted the close, so a test can tell a leaked registration from a released one.
//!
//! gdx asks for FI_THREAD_SAFE ([`super::InfoList::get`]), so every handle is `Send + Sync`.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::{ffi, Libfabric, LibfabricError, Memory, OwnedInfo, Result};

/// Closes `fid` and reports the result.
///
/// # Safety
///
/// `fid` must be a live libfabric object that nothing uses after this call.
unsafe fn close(api: &Libfabric, what: &'static str, fid: *mut ffi::fid) -> Result<()> {
    // SAFETY: the caller guarantees `fid` is live; every fid has an ops table with close.
    let rc = unsafe {
        match (*(*fid).ops).close {
            Some(f) => f(fid),
            None => -(ffi::FI_ENOSYS as c_int),
        }
    };
    api.check(what, rc as isize)
}

fn missing(call: &'static str, api: &Libfabric) -> LibfabricError {
    LibfabricError::Call {
        call,
        code: ffi::FI_ENOSYS as i32,
        message: api.strerror(ffi::FI_ENOSYS as i32),
    }
}

/// An open fabric and the info it (and its domain and endpoint) were opened from
/// ([`super::open_fabric`]).
pub struct Fabric {
    info: OwnedInfo,
    ptr: *mut ffi::fid_fabric,
}

// SAFETY: gdx asks for FI_THREAD_SAFE, so libfabric objects may be used from any thread; the
// handles hold only pointers that libfabric owns and that live until the handle's Drop.
unsafe impl Send for Fabric {}
// SAFETY: as above (FI_THREAD_SAFE).
unsafe impl Sync for Fabric {}

impl Fabric {
    pub(super) fn from_raw(info: OwnedInfo, ptr: *mut ffi::fid_fabric) -> Fabric {
        Fabric { info, ptr }
    }

    /// The library it was opened with.
    pub fn api(&self) -> &'static Libfabric {
        self.info.library()
    }

    /// `fi_domain`.
    pub fn domain(self: &Arc<Self>) -> Result<Arc<Domain>> {
        let api = self.api();
        let mut d: *mut ffi::fid_domain = std::ptr::null_mut();
        // SAFETY: live fabric with its ops table; the info is the one it was opened from.
        let rc = unsafe {
            let f = (*(*self.ptr).ops)
                .domain
                .ok_or_else(|| missing("fi_domain", api))?;
            f(self.ptr, self.info.as_ptr(), &mut d, std::ptr::null_mut())
        };
        api.check("fi_domain", rc as isize)?;
        Ok(Arc::new(Domain {
            fabric: Arc::clone(self),
            ptr: d,
            live_mrs: AtomicUsize::new(0),
            close_errors: AtomicUsize::new(0),
        }))
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        // SAFETY: every child holds an Arc to this fabric, so none is left.
        if let Err(e) = unsafe { close(self.api(), "fi_close(fabric)", &mut (*self.ptr).fid) } {
            log::warn!("{e}");
        }
    }
}

/// An open domain.
pub struct Domain {
    fabric: Arc<Fabric>,
    ptr: *mut ffi::fid_domain,
    /// Registrations made here and not yet closed successfully.
    live_mrs: AtomicUsize,
    /// `fi_close` failures of objects under this domain.
    close_errors: AtomicUsize,
}

// SAFETY: FI_THREAD_SAFE (see `Fabric`).
unsafe impl Send for Domain {}
// SAFETY: FI_THREAD_SAFE (see `Fabric`).
unsafe impl Sync for Domain {}

impl Domain {
    /// The library it was opened with.
    pub fn api(&self) -> &'static Libfabric {
        self.fabric.api()
    }

    /// Registrations made here whose `fi_close` has not succeeded (still open, or refused).
    pub fn live_registrations(&self) -> usize {
        self.live_mrs.load(Ordering::SeqCst)
    }

    /// `fi_close` calls of objects under this domain that the provider refused.
    pub fn close_errors(&self) -> usize {
        self.close_errors.load(Ordering::SeqCst)
    }

    fn info(&self) -> *mut ffi::fi_info {
        self.fabric.info.as_ptr()
    }

    /// `fi_cq_open` with context-format entries; with a wait object when `wait`.
    pub fn cq(self: &Arc<Self>, size: usize, wait: bool) -> Result<Arc<Cq>> {
        let api = self.api();
        let mut attr = ffi::fi_cq_attr {
            size,
            format: ffi::fi_cq_format_FI_CQ_FORMAT_CONTEXT,
            wait_obj: if wait {
                ffi::fi_wait_obj_FI_WAIT_UNSPEC
            } else {
                ffi::fi_wait_obj_FI_WAIT_NONE
            },
            ..Default::default()
        };
        let mut cq: *mut ffi::fid_cq = std::ptr::null_mut();
        // SAFETY: live domain and ops table; attr and out-pointer are valid for the call.
        let rc = unsafe {
            let f = (*(*self.ptr).ops)
                .cq_open
                .ok_or_else(|| missing("fi_cq_open", api))?;
            f(self.ptr, &mut attr, &mut cq, std::ptr::null_mut())
        };
        api.check("fi_cq_open", rc as isize)?;
        Ok(Arc::new(Cq {
            domain: Arc::clone(self),
            ptr: cq,
        }))
    }

    /// `fi_av_open` (table: addresses are indices).
    pub fn av(self: &Arc<Self>) -> Result<Arc<Av>> {
        let api = self.api();
        let mut attr = ffi::fi_av_attr {
            type_: ffi::fi_av_type_FI_AV_TABLE,
            count: 64,
            ..Default::default()
        };
        let mut av: *mut ffi::fid_av = std::ptr::null_mut();
        // SAFETY: live domain and ops table; attr and out-pointer are valid for the call.
        let rc = unsafe {
            let f = (*(*self.ptr).ops)
                .av_open
                .ok_or_else(|| missing("fi_av_open", api))?;
            f(self.ptr, &mut attr, &mut av, std::ptr::null_mut())
        };
        api.check("fi_av_open", rc as isize)?;
        Ok(Arc::new(Av {
            domain: Arc::clone(self),
            ptr: av,
        }))
    }

    /// `fi_endpoint`, bound to `cq` (transmit and receive) and `av`, and enabled.
    ///
    /// # Errors
    /// [`LibfabricError::ForeignObject`] when `cq` or `av` was opened on another domain; the
    /// provider's error otherwise.
    pub fn endpoint(self: &Arc<Self>, cq: &Arc<Cq>, av: &Arc<Av>) -> Result<Arc<Ep>> {
        let api = self.api();
        self.own("fi_endpoint", "the completion queue", &cq.domain)?;
        self.own("fi_endpoint", "the address vector", &av.domain)?;
        let mut ep: *mut ffi::fid_ep = std::ptr::null_mut();
        // SAFETY: live domain; the info is the one the domain came from.
        let rc = unsafe {
            let f = (*(*self.ptr).ops)
                .endpoint
                .ok_or_else(|| missing("fi_endpoint", api))?;
            f(self.ptr, self.info(), &mut ep, std::ptr::null_mut())
        };
        api.check("fi_endpoint", rc as isize)?;
        // Own it at once, so an error below still closes it.
        let h = Ep {
            domain: Arc::clone(self),
            cq: Arc::clone(cq),
            av: Arc::clone(av),
            ptr: ep,
        };
        // SAFETY: live endpoint, AV and CQ of the same domain; fid ops tables have bind and
        // control.
        unsafe {
            let ops = &*(*ep).fid.ops;
            let bind = ops.bind.ok_or_else(|| missing("fi_ep_bind", api))?;
            let rc = bind(&mut (*ep).fid, &mut (*av.ptr).fid, 0);
            api.check("fi_ep_bind(av)", rc as isize)?;
            let flags = (ffi::FI_TRANSMIT | ffi::FI_RECV) as u64;
            let rc = bind(&mut (*ep).fid, &mut (*cq.ptr).fid, flags);
            api.check("fi_ep_bind(cq)", rc as isize)?;
            let control = ops.control.ok_or_else(|| missing("fi_enable", api))?;
            let rc = control(
                &mut (*ep).fid,
                ffi::FI_ENABLE as c_int,
                std::ptr::null_mut(),
            );
            api.check("fi_enable", rc as isize)?;
        }
        Ok(Arc::new(h))
    }

    /// Refuses `other` (the domain an argument was opened on) unless it is this domain.
    fn own(&self, call: &'static str, what: &'static str, other: &Arc<Domain>) -> Result<()> {
        if std::ptr::eq(Arc::as_ptr(other), self) {
            Ok(())
        } else {
            Err(LibfabricError::ForeignObject { call, what })
        }
    }

    /// `fi_mr_reg` of all of `mem` (`fi_mr_regattr` with FI_HMEM_CUDA for GPU memory); bound
    /// to `ep` and enabled when given (providers with FI_MR_ENDPOINT). The registration keeps
    /// `mem` alive.
    ///
    /// # Errors
    /// [`LibfabricError::ForeignObject`] when `ep` was opened on another domain; the
    /// provider's error otherwise.
    pub fn register(
        self: &Arc<Self>,
        mem: &Arc<Memory>,
        access: u64,
        requested_key: u64,
        ep: Option<&Arc<Ep>>,
    ) -> Result<Mr> {
        if let Some(ep) = ep {
            self.own("fi_mr_bind", "the endpoint", &ep.domain)?;
        }
        let base = mem.as_ptr();
        let len = mem.len();
        let api = self.api();
        let mut mr: *mut ffi::fid_mr = std::ptr::null_mut();
        let (rc, call) = match mem.cuda_device() {
            // GPU memory: `fi_mr_regattr` with the HMEM interface and device (the provider
            // registers it through its CUDA support; plain `fi_mr_reg` would take it for host
            // memory).
            Some(device) => {
                let iov = ffi::iovec {
                    iov_base: base as *mut c_void,
                    iov_len: len,
                };
                let attr = ffi::fi_mr_attr {
                    mr_iov: &iov,
                    iov_count: 1,
                    access,
                    offset: 0,
                    requested_key,
                    context: std::ptr::null_mut(),
                    auth_key_size: 0,
                    auth_key: std::ptr::null_mut(),
                    iface: ffi::fi_hmem_iface_FI_HMEM_CUDA,
                    device: ffi::fi_mr_attr__bindgen_ty_1 { cuda: device },
                };
                // SAFETY: live domain with an MR ops table; `attr` and `iov` outlive the call;
                // `mem` is CUDA memory by `Memory::from_cuda`'s contract, kept alive by the
                // returned Mr.
                let rc = unsafe {
                    let f = (*(*self.ptr).mr)
                        .regattr
                        .ok_or_else(|| missing("fi_mr_regattr", api))?;
                    f(&mut (*self.ptr).fid, &attr, 0, &mut mr)
                };
                (rc, "fi_mr_regattr")
            }
            // SAFETY: live domain with an MR ops table; `mem` is valid memory by its
            // construction contract and is kept alive by the returned Mr.
            None => (
                unsafe {
                    let f = (*(*self.ptr).mr)
                        .reg
                        .ok_or_else(|| missing("fi_mr_reg", api))?;
                    f(
                        &mut (*self.ptr).fid,
                        base as *const c_void,
                        len,
                        access,
                        0,
                        requested_key,
                        0,
                        &mut mr,
                        std::ptr::null_mut(),
                    )
                },
                "fi_mr_reg",
            ),
        };
        api.check(call, rc as isize)?;
        self.live_mrs.fetch_add(1, Ordering::SeqCst);
        let h = Mr {
            domain: Arc::clone(self),
            _ep: ep.map(Arc::clone),
            mem: Arc::clone(mem),
            ptr: mr,
            base: base as usize,
            len,
        };
        if let Some(ep) = ep {
            // SAFETY: live MR and endpoint of this domain (FI_MR_ENDPOINT: bind, then enable).
            unsafe {
                let ops = &*(*mr).fid.ops;
                let bind = ops.bind.ok_or_else(|| missing("fi_mr_bind", api))?;
                let rc = bind(&mut (*mr).fid, &mut (*ep.ptr).fid, 0);
                api.check("fi_mr_bind", rc as isize)?;
                let control = ops.control.ok_or_else(|| missing("fi_mr_enable", api))?;
                let rc = control(
                    &mut (*mr).fid,
                    ffi::FI_ENABLE as c_int,
                    std::ptr::null_mut(),
                );
                api.check("fi_mr_enable", rc as isize)?;
            }
        }
        Ok(h)
    }
}

impl Drop for Domain {
    fn drop(&mut self) {
        // SAFETY: every child holds an Arc to this domain, so none is left.
        if let Err(e) = unsafe { close(self.api(), "fi_close(domain)", &mut (*self.ptr).fid) } {
            log::warn!("{e}");
        }
    }
}

/// A completion queue.
pub struct Cq {
    domain: Arc<Domain>,
    ptr: *mut ffi::fid_cq,
}

// SAFETY: FI_THREAD_SAFE (see `Fabric`).
unsafe impl Send for Cq {}
// SAFETY: FI_THREAD_SAFE (see `Fabric`).
unsafe impl Sync for Cq {}

/// What one CQ read found.
#[derive(Debug)]
pub enum CqEvent {
    /// Completed operations' context values.
    Done(Vec<u64>),
    /// Nothing completed.
    Empty,
    /// A failed operation: its context, `err` (positive FI_E*), the provider's own code, and
    /// the provider's text.
    Failed {
        /// The failed operation's context.
        context: u64,
        /// Positive `FI_E*` code.
        err: i32,
        /// The provider's own code.
        prov_errno: i32,
        /// `fi_strerror` of `err` with the provider's text.
        text: String,
    },
}

impl Cq {
    /// Reads completions (`fi_cq_read`, or `fi_cq_sread` for up to `wait_ms` when non-zero);
    /// an error entry is fetched with `fi_cq_readerr`.
    pub fn read(&self, wait_ms: i32) -> Result<CqEvent> {
        let api = self.domain.api();
        let mut buf = [std::ptr::null_mut::<c_void>(); 64];
        // SAFETY: live CQ opened with FI_CQ_FORMAT_CONTEXT, whose entries are one pointer, so
        // `buf` holds 64 of them; sread is only used on CQs opened with a wait object.
        let rc = unsafe {
            let ops = &*(*self.ptr).ops;
            if wait_ms > 0 {
                let f = ops.sread.ok_or_else(|| missing("fi_cq_sread", api))?;
                f(
                    self.ptr,
                    buf.as_mut_ptr() as *mut c_void,
                    buf.len(),
                    std::ptr::null(),
                    wait_ms,
                )
            } else {
                let f = ops.read.ok_or_else(|| missing("fi_cq_read", api))?;
                f(self.ptr, buf.as_mut_ptr() as *mut c_void, buf.len())
            }
        };
        if rc > 0 {
            let n = rc as usize;
            return Ok(CqEvent::Done(buf[..n].iter().map(|p| *p as u64).collect()));
        }
        let code = -rc;
        if rc == 0 || code == ffi::FI_EAGAIN as isize || code == ffi::FI_ETIMEDOUT as isize {
            return Ok(CqEvent::Empty);
        }
        if code != ffi::FI_EAVAIL as isize {
            api.check("fi_cq_read", rc)?;
        }
        let mut e = ffi::fi_cq_err_entry::default();
        // SAFETY: live CQ; `e` is a zeroed error entry (err_data_size 0: the provider uses
        // its own buffer for err_data, valid until the next CQ call on this thread's path,
        // and it is consumed by strerror right below).
        let (rc, text) = unsafe {
            let ops = &*(*self.ptr).ops;
            let f = ops.readerr.ok_or_else(|| missing("fi_cq_readerr", api))?;
            let rc = f(self.ptr, &mut e, 0);
            let mut text = String::new();
            if rc > 0 {
                if let Some(s) = ops.strerror {
                    let mut b = [0 as std::ffi::c_char; 256];
                    let p = s(self.ptr, e.prov_errno, e.err_data, b.as_mut_ptr(), b.len());
                    if !p.is_null() {
                        text = std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned();
                    }
                }
            }
            (rc, text)
        };
        if rc == -(ffi::FI_EAGAIN as isize) {
            return Ok(CqEvent::Empty);
        }
        api.check("fi_cq_readerr", rc)?;
        Ok(CqEvent::Failed {
            context: e.op_context as u64,
            err: e.err,
            prov_errno: e.prov_errno,
            text: format!(
                "{} (prov_errno {}: {text})",
                api.strerror(e.err),
                e.prov_errno
            ),
        })
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: endpoints bound to this CQ hold an Arc to it, so none is left.
        let r = unsafe { close(self.domain.api(), "fi_close(cq)", &mut (*self.ptr).fid) };
        if let Err(e) = r {
            self.domain.close_errors.fetch_add(1, Ordering::SeqCst);
            log::warn!("{e}");
        }
    }
}

/// An address vector.
pub struct Av {
    domain: Arc<Domain>,
    ptr: *mut ffi::fid_av,
}

// SAFETY: FI_THREAD_SAFE (see `Fabric`).
unsafe impl Send for Av {}
// SAFETY: FI_THREAD_SAFE (see `Fabric`).
unsafe impl Sync for Av {}

impl Av {
    /// `fi_av_insert` of one address as the provider's `fi_getname` produced it. The provider
    /// reads one address of its own format, so `addr` must be at least that long: only
    /// [`Ep::insert_peer`] calls this, after checking the length against its own address.
    fn insert(&self, addr: &[u8]) -> Result<u64> {
        let api = self.domain.api();
        let mut out: ffi::fi_addr_t = u64::MAX;
        // SAFETY: live AV; `addr` is readable for its length (the provider reads one address
        // of its own format from it; `Ep::insert_peer` checked the length against the local
        // one).
        let rc = unsafe {
            let f = (*(*self.ptr).ops)
                .insert
                .ok_or_else(|| missing("fi_av_insert", api))?;
            f(
                self.ptr,
                addr.as_ptr() as *const c_void,
                1,
                &mut out,
                0,
                std::ptr::null_mut(),
            )
        };
        if rc != 1 {
            api.check("fi_av_insert", rc as isize)?;
            return Err(LibfabricError::BadAddress {
                len: addr.len(),
                why: "the provider inserted no address".into(),
            });
        }
        Ok(out)
    }
}

impl Drop for Av {
    fn drop(&mut self) {
        // SAFETY: endpoints bound to this AV hold an Arc to it, so none is left.
        let r = unsafe { close(self.domain.api(), "fi_close(av)", &mut (*self.ptr).fid) };
        if let Err(e) = r {
            self.domain.close_errors.fetch_add(1, Ordering::SeqCst);
            log::warn!("{e}");
        }
    }
}

/// An enabled RDM endpoint.
pub struct Ep {
    domain: Arc<Domain>,
    cq: Arc<Cq>,
    av: Arc<Av>,
    ptr: *mut ffi::fid_ep,
}

// SAFETY: FI_THREAD_SAFE (see `Fabric`).
unsafe impl Send for Ep {}
// SAFETY: FI_THREAD_SAFE (see `Fabric`).
unsafe impl Sync for Ep {}

/// What posting one operation did.
#[derive(Debug, PartialEq, Eq)]
pub enum Post {
    /// Queued; a completion will carry its context.
    Queued,
    /// The provider's queue is full (FI_EAGAIN): progress the CQ and post again.
    Again,
}

impl Ep {
    /// The completion queue bound to this endpoint (transmit and receive).
    pub fn cq(&self) -> &Cq {
        &self.cq
    }

    /// Adds a peer's address (from its [`Ep::name`]) to the endpoint's address vector and
    /// returns the `fi_addr_t` to post to.
    ///
    /// # Errors
    /// [`LibfabricError::BadAddress`] when `addr` is not as long as this endpoint's own address
    /// (the provider would read past it) or the provider inserted nothing; the provider's
    /// error otherwise.
    pub fn insert_peer(&self, addr: &[u8]) -> Result<u64> {
        let mine = self.name()?;
        if addr.len() != mine.len() {
            return Err(LibfabricError::BadAddress {
                len: addr.len(),
                why: format!("this provider's addresses are {} bytes", mine.len()),
            });
        }
        self.av.insert(addr)
    }

    /// `fi_getname`: this endpoint's address in the provider's format.
    pub fn name(&self) -> Result<Vec<u8>> {
        let api = self.domain.api();
        let mut buf = vec![0u8; 256];
        let mut len = buf.len();
        // SAFETY: live endpoint; `buf` is writable for `len` bytes.
        let rc = unsafe {
            let f = (*(*self.ptr).cm)
                .getname
                .ok_or_else(|| missing("fi_getname", api))?;
            f(
                &mut (*self.ptr).fid,
                buf.as_mut_ptr() as *mut c_void,
                &mut len,
            )
        };
        api.check("fi_getname", rc as isize)?;
        buf.truncate(len);
        Ok(buf)
    }

    /// Posts `fi_write` (`write`) or `fi_read` of `len` bytes at `offset` in `local`, to or
    /// from `raddr` under `key` at peer `dest` (from [`Ep::insert_peer`]); `context` comes back
    /// in the completion ([`Cq::read`]).
    ///
    /// # Errors
    /// [`LibfabricError::OutOfBounds`] when `offset + len` is past `local`;
    /// [`LibfabricError::ForeignObject`] when `local` was registered on another domain; the
    /// provider's error otherwise.
    ///
    /// # Safety
    ///
    /// - `local` (the [`Mr`], and with it its memory) must not be dropped until the completion
    ///   carrying `context` has been read from the CQ, or the endpoint is closed: until then
    ///   the provider reads (write) or writes (read) the registered memory.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn post(
        &self,
        write: bool,
        local: &Mr,
        offset: usize,
        len: usize,
        dest: u64,
        raddr: u64,
        key: u64,
        context: u64,
    ) -> Result<Post> {
        let api = self.domain.api();
        self.domain
            .own("fi_write/fi_read", "the local registration", &local.domain)?;
        if offset.checked_add(len).is_none_or(|end| end > local.len) {
            return Err(LibfabricError::OutOfBounds {
                side: "local",
                offset: offset as u64,
                len: len as u64,
                size: local.len as u64,
            });
        }
        let buf = (local.base + offset) as *mut c_void;
        // SAFETY: live endpoint; `buf..buf+len` is inside the registration `local` (checked
        // above), of this domain (checked above), which the caller keeps alive until the
        // completion (`# Safety`); `context` is an opaque value (gdx asks for no FI_CONTEXT
        // mode, so the provider does not write through it).
        let rc = unsafe {
            let rma = &*(*self.ptr).rma;
            let desc = (*local.ptr).mem_desc;
            if write {
                let f = rma.write.ok_or_else(|| missing("fi_write", api))?;
                f(
                    self.ptr,
                    buf,
                    len,
                    desc,
                    dest,
                    raddr,
                    key,
                    context as *mut c_void,
                )
            } else {
                let f = rma.read.ok_or_else(|| missing("fi_read", api))?;
                f(
                    self.ptr,
                    buf,
                    len,
                    desc,
                    dest,
                    raddr,
                    key,
                    context as *mut c_void,
                )
            }
        };
        if rc == -(ffi::FI_EAGAIN as isize) {
            return Ok(Post::Again);
        }
        api.check(if write { "fi_write" } else { "fi_read" }, rc)?;
        Ok(Post::Queued)
    }
}

impl Drop for Ep {
    fn drop(&mut self) {
        // SAFETY: the endpoint's owner stopped posting and polling before dropping it; MRs
        // bound to it hold an Arc, so none is left.
        let r = unsafe { close(self.domain.api(), "fi_close(ep)", &mut (*self.ptr).fid) };
        if let Err(e) = r {
            self.domain.close_errors.fetch_add(1, Ordering::SeqCst);
            log::warn!("{e}");
        }
    }
}

/// A memory registration ([`Domain::register`]).
pub struct Mr {
    domain: Arc<Domain>,
    _ep: Option<Arc<Ep>>,
    mem: Arc<Memory>,
    ptr: *mut ffi::fid_mr,
    base: usize,
    len: usize,
}

// SAFETY: FI_THREAD_SAFE (see `Fabric`); the registered memory is the caller's (see
// `Domain::register`).
unsafe impl Send for Mr {}
// SAFETY: as above.
unsafe impl Sync for Mr {}

impl Mr {
    /// `fi_mr_key`.
    pub fn key(&self) -> u64 {
        // SAFETY: live MR; the key field is set by the provider at registration.
        unsafe { (*self.ptr).key }
    }

    /// The registered memory.
    pub fn memory(&self) -> &Memory {
        &self.mem
    }

    /// Its first byte's address (a peer's remote address under FI_MR_VIRT_ADDR).
    pub fn base(&self) -> usize {
        self.base
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: no operation using the MR is outstanding once it is dropped (`Ep::post`'s
        // contract), so nothing uses it after this.
        let r = unsafe { close(self.domain.api(), "fi_close(mr)", &mut (*self.ptr).fid) };
        match r {
            Ok(()) => {
                self.domain.live_mrs.fetch_sub(1, Ordering::SeqCst);
            }
            Err(e) => {
                self.domain.close_errors.fetch_add(1, Ordering::SeqCst);
                log::warn!("{e}");
            }
        }
    }
}
