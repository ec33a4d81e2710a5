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

/// A CUDA stream (`cuStreamCreate` with `CU_STREAM_NON_BLOCKING`).
pub struct Stream {
    ctx: Context,
    raw: CuStream,
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
        })
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

    /// Wait on the host until all work queued on the stream is done (`cuStreamSynchronize`).
    pub fn synchronize(&self) -> Result<(), CudaError> {
        // SAFETY: the handle is live.
        let status = unsafe { (self.ctx.api().cuStreamSynchronize)(self.raw) };
        self.ctx.check(status, "cuStreamSynchronize")
    }

    /// Make work queued later on this stream wait for `event` (`cuStreamWaitEvent`); the
    /// event may belong to another context.
    pub fn wait_event(&self, event: &Event) -> Result<(), CudaError> {
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
        // SAFETY: this value owns the handle. Destroying a stream with queued work is allowed:
        // the call returns at once and the driver frees the stream once the work is done.
        let status = unsafe { (self.ctx.api().cuStreamDestroy_v2)(self.raw) };
        if let Err(e) = self.ctx.check(status, "cuStreamDestroy_v2") {
            self.ctx.record_err(e);
        }
    }
}

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
