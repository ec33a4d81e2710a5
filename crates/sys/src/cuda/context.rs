//! [`Context`]: a retained primary context of one GPU, the parent of every allocation, stream
//! and event made on that GPU.
//!
//! Invariants:
//! - A [`Context`] holds one `cuDevicePrimaryCtxRetain` reference, released when the last clone
//!   (and so the last child holding one) is dropped.
//! - Calls that need a current context make this one current on the calling thread first
//!   ([`Context::make_current`], `cuCtxSetCurrent`, as cudarc does); the thread keeps it current
//!   afterwards. [`Context::push_current`] is the scoped alternative.
//! - Destructors never panic. A release that fails is logged and recorded here; the next
//!   checked call on the context returns it once as [`CudaError::Earlier`] (cudarc's
//!   `record_err`/`check_err`).

use super::api::{self, CuContext};
use super::{Cuda, CudaError, Device};
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

/// A GPU's primary context, retained. Cheap to clone: clones share one retain.
#[derive(Clone)]
pub struct Context {
    inner: Arc<Inner>,
}

struct Inner {
    device: Device,
    raw: CuContext,
    /// The first release failure not yet reported.
    error: Mutex<Option<CudaError>>,
}

// SAFETY: a CUcontext handle may be used from any thread (the driver API binds it per thread
// on demand), and the only mutable state here is behind a Mutex.
unsafe impl Send for Inner {}
// SAFETY: as above; shared references only read the handle or lock the Mutex.
unsafe impl Sync for Inner {}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("gpu", &self.inner.device.ordinal())
            .field("raw", &self.inner.raw)
            .finish()
    }
}

impl Context {
    /// Retain the primary context of `device` (`cuDevicePrimaryCtxRetain`).
    pub fn new(device: &Device) -> Result<Context, CudaError> {
        let cuda = device.cuda();
        let mut raw: CuContext = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the device handle came from `cuDeviceGet`.
        let status = unsafe { (cuda.api().cuDevicePrimaryCtxRetain)(&mut raw, device.raw()) };
        cuda.check(status, "cuDevicePrimaryCtxRetain", Some(device.ordinal()))?;
        Ok(Context {
            inner: Arc::new(Inner {
                device: device.clone(),
                raw,
                error: Mutex::new(None),
            }),
        })
    }

    /// The device this context belongs to.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// CUDA ordinal of the device.
    pub fn ordinal(&self) -> u32 {
        self.inner.device.ordinal()
    }

    /// The loaded driver.
    pub fn cuda(&self) -> &Cuda {
        self.inner.device.cuda()
    }

    /// The `CUcontext`. Still owned by this value: do not release or destroy it.
    pub fn as_raw(&self) -> *mut std::ffi::c_void {
        self.inner.raw
    }

    /// Whether `self` and `other` are the same context.
    pub fn same(&self, other: &Context) -> bool {
        self.inner.raw == other.inner.raw
    }

    pub(crate) fn api(&self) -> &api::Api {
        self.cuda().api()
    }

    /// `Ok` for `CUDA_SUCCESS`, else the error for `call` on this context's GPU.
    pub(crate) fn check(&self, status: api::CuResult, call: &str) -> Result<(), CudaError> {
        self.cuda().check(status, call, Some(self.ordinal()))
    }

    /// Keep `error` (from a destructor) for the next [`Context::check_err`], and log it.
    pub(crate) fn record_err(&self, error: CudaError) {
        log::warn!("{error}");
        let mut slot = self.inner.error.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(error);
        }
    }

    /// The release failure recorded since the last check, once.
    pub fn check_err(&self) -> Result<(), CudaError> {
        let mut slot = self.inner.error.lock().unwrap_or_else(|p| p.into_inner());
        match slot.take() {
            Some(e) => Err(CudaError::Earlier(Box::new(e))),
            None => Ok(()),
        }
    }

    /// Make this context current on the calling thread (`cuCtxGetCurrent`, then
    /// `cuCtxSetCurrent` when another one is current). Also reports a recorded release failure.
    pub fn make_current(&self) -> Result<(), CudaError> {
        self.check_err()?;
        self.bind()
    }

    /// Make this context current on the calling thread, like [`Context::make_current`], but
    /// leave a recorded release failure for a later check (for destructors).
    pub(crate) fn bind(&self) -> Result<(), CudaError> {
        let mut current: CuContext = std::ptr::null_mut();
        // SAFETY: `current` is a valid out-pointer.
        let status = unsafe { (self.api().cuCtxGetCurrent)(&mut current) };
        self.check(status, "cuCtxGetCurrent")?;
        if current != self.inner.raw {
            // SAFETY: the handle is retained by `self` for at least the duration of the call.
            let status = unsafe { (self.api().cuCtxSetCurrent)(self.inner.raw) };
            self.check(status, "cuCtxSetCurrent")?;
        }
        Ok(())
    }

    /// Push this context onto the calling thread's context stack (`cuCtxPushCurrent_v2`); the
    /// guard pops it (`cuCtxPopCurrent_v2`) when dropped, restoring the previous context.
    pub fn push_current(&self) -> Result<CurrentGuard<'_>, CudaError> {
        self.check_err()?;
        // SAFETY: the handle is retained by `self`, which the guard borrows.
        let status = unsafe { (self.api().cuCtxPushCurrent_v2)(self.inner.raw) };
        self.check(status, "cuCtxPushCurrent_v2")?;
        Ok(CurrentGuard {
            ctx: self,
            _not_send: PhantomData,
        })
    }

    /// Let this context's GPU map `peer`'s memory (`cuCtxEnablePeerAccess` with `peer`,
    /// while this context is current). Already enabled is `Ok`; so is `peer` being this
    /// context.
    pub fn enable_peer_access(&self, peer: &Context) -> Result<(), CudaError> {
        if self.same(peer) {
            return Ok(());
        }
        let _current = self.push_current()?;
        // SAFETY: both contexts are retained; flags must be 0.
        let status = unsafe { (self.api().cuCtxEnablePeerAccess)(peer.inner.raw, 0) };
        if status == api::PEER_ACCESS_ALREADY_ENABLED {
            return Ok(());
        }
        self.check(
            status,
            &format!("cuCtxEnablePeerAccess(GPU {})", peer.ordinal()),
        )
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let cuda = self.device.cuda();
        // SAFETY: this value holds one retain of the primary context of this device, and no
        // child remains (each holds a clone of the Arc around this value).
        let status = unsafe { (cuda.api().cuDevicePrimaryCtxRelease_v2)(self.device.raw()) };
        if let Err(e) = cuda.check(
            status,
            "cuDevicePrimaryCtxRelease_v2",
            Some(self.device.ordinal()),
        ) {
            log::warn!("{e}");
        }
    }
}

/// Keeps a context pushed on the calling thread; pops it when dropped. Not `Send`: the
/// context stack is per thread.
#[must_use = "the context is popped again when the guard is dropped"]
pub struct CurrentGuard<'a> {
    ctx: &'a Context,
    _not_send: PhantomData<*mut ()>,
}

impl fmt::Debug for CurrentGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CurrentGuard")
            .field("gpu", &self.ctx.ordinal())
            .finish()
    }
}

impl Drop for CurrentGuard<'_> {
    fn drop(&mut self) {
        let mut popped: CuContext = std::ptr::null_mut();
        // SAFETY: `popped` is a valid out-pointer; this guard pushed a context on this thread.
        let status = unsafe { (self.ctx.api().cuCtxPopCurrent_v2)(&mut popped) };
        if let Err(e) = self.ctx.check(status, "cuCtxPopCurrent_v2") {
            self.ctx.record_err(e);
        }
    }
}
