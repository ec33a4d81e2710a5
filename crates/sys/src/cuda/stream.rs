//! [`Stream`]: a non-blocking CUDA stream of one context, and [`Hold`], a gate that keeps a
//! stream from starting the work queued behind it until released, so that the time spent
//! enqueueing stays out of event timings (nvbandwidth's blocking kernel, done here with a host
//! function: `cuLaunchHostFunc`).
//!
//! The copies themselves are in `copy`.

use super::api::{self, CuStream};
use super::{Context, CudaError, Event};
use std::ffi::c_void;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A CUDA stream: created here (`cuStreamCreate` with `CU_STREAM_NON_BLOCKING`, destroyed when
/// dropped), or borrowed from another framework ([`Stream::from_raw`], never destroyed here).
pub struct Stream {
    ctx: Context,
    raw: CuStream,
    /// Whether dropping the value destroys the handle.
    owned: bool,
}

// SAFETY: stream handles may be used from any thread; the driver serialises work submission.
unsafe impl Send for Stream {}
// SAFETY: as above; `&Stream` only passes the handle to thread-safe driver calls.
unsafe impl Sync for Stream {}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stream")
            .field("gpu", &self.ctx.ordinal())
            .field("raw", &self.raw)
            .field("owned", &self.owned)
            .finish()
    }
}

impl Stream {
    /// A new stream on `ctx` that does not synchronise with the legacy default stream.
    pub fn new(ctx: &Context) -> Result<Stream, CudaError> {
        ctx.make_current()?;
        let mut raw: CuStream = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the context is current on this thread.
        let status = unsafe { (ctx.api().cuStreamCreate)(&mut raw, api::STREAM_NON_BLOCKING) };
        ctx.check(status, "cuStreamCreate")?;
        Ok(Stream {
            ctx: ctx.clone(),
            raw,
            owned: true,
        })
    }

    /// Borrow a `CUstream` another framework created (e.g. PyTorch's
    /// `torch.cuda.current_stream().cuda_stream`). Every method works on it as on an owned
    /// stream; dropping the value leaves the stream alone (no `cuStreamDestroy_v2`).
    ///
    /// # Safety
    ///
    /// - `raw` is a stream of `ctx`'s context (for PyTorch: of `ctx`'s GPU, whose primary
    ///   context PyTorch uses), or null, the context's legacy default stream.
    /// - It is not `CU_STREAM_PER_THREAD` (its meaning changes with the calling thread, so
    ///   buffers could not tell its uses apart).
    /// - The stream stays alive (not destroyed by its owner) for as long as the returned
    ///   value. Buffers used on it need only the context afterwards: they wait for events
    ///   recorded on the stream, not for the stream.
    pub unsafe fn from_raw(ctx: &Context, raw: *mut c_void) -> Stream {
        Stream {
            ctx: ctx.clone(),
            raw,
            owned: false,
        }
    }

    /// Whether dropping the value destroys the stream (false for [`Stream::from_raw`]).
    pub fn is_owned(&self) -> bool {
        self.owned
    }

    /// The context the stream belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The `CUstream`. Still owned by this value: do not destroy it.
    pub fn as_raw(&self) -> *mut c_void {
        self.raw
    }

    pub(crate) fn raw(&self) -> CuStream {
        self.raw
    }

    /// What tells this stream's uses apart from other streams' (for buffers' last-use
    /// markers): the context and the handle, since a null handle names the default stream of
    /// whichever context is current.
    pub(crate) fn key(&self) -> (usize, usize) {
        (self.ctx.as_raw() as usize, self.raw as usize)
    }

    /// Make the stream's context current when the handle is one of the special ones (null,
    /// `CU_STREAM_LEGACY`), which the driver resolves against the current context. Real
    /// handles carry their context.
    pub(crate) fn enter(&self) -> Result<(), CudaError> {
        if (self.raw as usize) <= CU_STREAM_LEGACY {
            self.ctx.make_current()?;
        }
        Ok(())
    }

    /// Wait on the host until all work queued on the stream is done (`cuStreamSynchronize`).
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.enter()?;
        // SAFETY: the handle is live (or the current context's default stream).
        let status = unsafe { (self.ctx.api().cuStreamSynchronize)(self.raw) };
        self.ctx.check(status, "cuStreamSynchronize")
    }

    /// Make work queued later on this stream wait for `event` (`cuStreamWaitEvent`); the
    /// event may belong to another context.
    pub fn wait_event(&self, event: &Event) -> Result<(), CudaError> {
        self.enter()?;
        // SAFETY: both handles are live; flags must be 0.
        let status = unsafe { (self.ctx.api().cuStreamWaitEvent)(self.raw, event.as_raw(), 0) };
        self.ctx.check(status, "cuStreamWaitEvent")
    }

    /// Whether [`Stream::hold`] is available (the driver has `cuLaunchHostFunc`).
    pub fn can_hold(&self) -> bool {
        self.ctx.api().cuLaunchHostFunc.is_some()
    }

    /// Stop the stream from starting the work queued after this call until the returned
    /// [`Hold`] is released or dropped, or [`HOLD_LIMIT`] has passed. Enqueue what is to be
    /// timed, then release.
    pub fn hold(&self) -> Result<Hold, CudaError> {
        let Some(launch) = self.ctx.api().cuLaunchHostFunc else {
            return Err(CudaError::MissingSymbol {
                call: "cuLaunchHostFunc",
            });
        };
        self.enter()?;
        let flag = Arc::new(AtomicBool::new(false));
        let data = Arc::into_raw(Arc::clone(&flag)) as *mut c_void;
        // SAFETY: `wait_for_release` takes back the Arc reference passed as `data` exactly
        // once, when the stream runs it; the function makes no CUDA call.
        let status = unsafe { launch(self.raw, Some(wait_for_release), data) };
        if let Err(e) = self.ctx.check(status, "cuLaunchHostFunc") {
            // SAFETY: the launch failed, so the callback never runs and never takes back the
            // reference made by `into_raw` above; it is taken back here instead.
            drop(unsafe { Arc::from_raw(data as *const AtomicBool) });
            return Err(e);
        }
        Ok(Hold { flag })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // SAFETY: this value owns the handle. Destroying a stream with queued work is allowed:
        // the call returns at once and the driver frees the stream once the work is done.
        let status = unsafe { (self.ctx.api().cuStreamDestroy_v2)(self.raw) };
        if let Err(e) = self.ctx.check(status, "cuStreamDestroy_v2") {
            self.ctx.record_err(e);
        }
    }
}

/// `CU_STREAM_LEGACY`, the largest of the special stream handles that name a context's default
/// stream (null is the other one gdx accepts).
const CU_STREAM_LEGACY: usize = 0x1;

/// The longest a [`Hold`] blocks its stream, so a forgotten hold cannot block it for ever.
pub const HOLD_LIMIT: Duration = Duration::from_secs(10);

/// A gate on a stream (see [`Stream::hold`]); releases it when dropped.
#[must_use = "the stream starts again when the hold is dropped"]
#[derive(Debug)]
pub struct Hold {
    flag: Arc<AtomicBool>,
}

impl Hold {
    /// Let the stream run the work queued behind the hold.
    pub fn release(self) {
        drop(self);
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.flag.store(true, Ordering::Release);
    }
}

/// The host function of [`Stream::hold`]: spin (yielding) until the flag is set.
unsafe extern "C" fn wait_for_release(data: *mut c_void) {
    // SAFETY: `data` is the reference `Stream::hold` made with `Arc::into_raw`; the driver runs
    // this function once, so the reference is taken back exactly once.
    let flag = unsafe { Arc::from_raw(data as *const AtomicBool) };
    let start = Instant::now();
    while !flag.load(Ordering::Acquire) && start.elapsed() < HOLD_LIMIT {
        std::thread::yield_now();
    }
}
