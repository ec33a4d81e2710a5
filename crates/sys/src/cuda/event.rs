//! [`Event`]: a CUDA event for timing and ordering, and `Pending`, the last-use marker every
//! buffer carries so that the host never touches (or frees) memory a copy may still use.
//!
//! Invariants of `Pending`:
//! - Before a stream uses a buffer, the stream waits for the buffer's last use
//!   (`cuStreamWaitEvent`), so uses on different streams are ordered.
//! - After enqueueing, the buffer's marker event is recorded on that stream, so it covers this
//!   use and, through the wait, every earlier one.
//! - Host access and destruction synchronise the marker first.

use super::api::{self, CuEvent};
use super::{Context, CudaError, Stream};
use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

/// A CUDA event (`CUevent`) of one context: created here (destroyed when dropped), or borrowed
/// from another framework ([`Event::from_raw`], never destroyed here).
pub struct Event {
    ctx: Context,
    raw: CuEvent,
    timing: bool,
    /// Whether dropping the value destroys the handle.
    owned: bool,
}

// SAFETY: event handles may be used from any thread; the driver serialises access to them.
unsafe impl Send for Event {}
// SAFETY: as above; `&Event` only passes the handle to thread-safe driver calls.
unsafe impl Sync for Event {}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event")
            .field("gpu", &self.ctx.ordinal())
            .field("timing", &self.timing)
            .field("owned", &self.owned)
            .finish()
    }
}

impl Event {
    /// A timing event (`cuEventCreate` with `CU_EVENT_DEFAULT`).
    pub fn new(ctx: &Context) -> Result<Event, CudaError> {
        Event::create(ctx, true)
    }

    /// An ordering-only event (`CU_EVENT_DISABLE_TIMING`), cheaper to record.
    pub fn without_timing(ctx: &Context) -> Result<Event, CudaError> {
        Event::create(ctx, false)
    }

    fn create(ctx: &Context, timing: bool) -> Result<Event, CudaError> {
        ctx.make_current()?;
        let flags = if timing {
            api::EVENT_DEFAULT
        } else {
            api::EVENT_DISABLE_TIMING
        };
        let mut raw: CuEvent = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the context is current on this thread.
        let status = unsafe { (ctx.api().cuEventCreate)(&mut raw, flags) };
        ctx.check(status, "cuEventCreate")?;
        Ok(Event {
            ctx: ctx.clone(),
            raw,
            timing,
            owned: true,
        })
    }

    /// Borrow a `CUevent` another framework created (e.g. the handle of a PyTorch
    /// `torch.cuda.Event`). Every method works on it as on an owned event; dropping the value
    /// leaves the event alone (no `cuEventDestroy_v2`). Whether it records timestamps is not
    /// known here: [`Event::elapsed`] leaves that to the driver, which refuses an event created
    /// with `CU_EVENT_DISABLE_TIMING`.
    ///
    /// # Safety
    ///
    /// - `raw` is a live event created in `ctx`'s context (for PyTorch: on `ctx`'s GPU, whose
    ///   primary context PyTorch uses).
    /// - The event stays alive (not destroyed by its owner) for as long as the returned value.
    pub unsafe fn from_raw(ctx: &Context, raw: *mut std::ffi::c_void) -> Event {
        Event {
            ctx: ctx.clone(),
            raw,
            timing: true,
            owned: false,
        }
    }

    /// Whether dropping the value destroys the event (false for [`Event::from_raw`]).
    pub fn is_owned(&self) -> bool {
        self.owned
    }

    /// The context the event belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The `CUevent`. Still owned by this value: do not destroy it.
    pub fn as_raw(&self) -> *mut std::ffi::c_void {
        self.raw
    }

    /// Record the event on `stream` (`cuEventRecord`). The stream must belong to the same
    /// context.
    pub fn record(&self, stream: &Stream) -> Result<(), CudaError> {
        if !stream.context().same(&self.ctx) {
            return Err(CudaError::InvalidArgument {
                call: "cuEventRecord",
                reason: format!(
                    "the event belongs to GPU {} and the stream to GPU {}",
                    self.ctx.ordinal(),
                    stream.context().ordinal()
                ),
            });
        }
        stream.enter()?;
        // SAFETY: both handles are live and of the same context.
        let status = unsafe { (self.ctx.api().cuEventRecord)(self.raw, stream.raw()) };
        self.ctx.check(status, "cuEventRecord")
    }

    /// Wait on the host until the work recorded before the event is done
    /// (`cuEventSynchronize`). An event never recorded is complete.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        // SAFETY: the handle is live.
        let status = unsafe { (self.ctx.api().cuEventSynchronize)(self.raw) };
        self.ctx.check(status, "cuEventSynchronize")
    }

    /// Time from `self` to `end`, both recorded and complete (`cuEventElapsedTime_v2`, else
    /// `cuEventElapsedTime`; about 0.5 µs resolution). Both must be timing events.
    pub fn elapsed(&self, end: &Event) -> Result<Duration, CudaError> {
        if !self.timing || !end.timing {
            return Err(CudaError::InvalidArgument {
                call: "cuEventElapsedTime",
                reason: "both events must be timing events (Event::new)".to_string(),
            });
        }
        let api = self.ctx.api();
        let (f, call) = match api.cuEventElapsedTime_v2 {
            Some(f) => (f, "cuEventElapsedTime_v2"),
            None => (api.cuEventElapsedTime, "cuEventElapsedTime"),
        };
        let mut ms: f32 = 0.0;
        // SAFETY: `ms` is a valid out-pointer; both handles are live.
        let status = unsafe { f(&mut ms, self.raw, end.raw) };
        self.ctx.check(status, call)?;
        Ok(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // SAFETY: this value owns the handle; destroying an event whose work is pending is
        // allowed (the driver releases it once the work completes).
        let status = unsafe { (self.ctx.api().cuEventDestroy_v2)(self.raw) };
        if let Err(e) = self.ctx.check(status, "cuEventDestroy_v2") {
            self.ctx.record_err(e);
        }
    }
}

/// The last use of a buffer by a stream (see the module docs). `pub` only so that the sealed
/// host-memory trait can name it; not reachable from outside the crate.
#[derive(Default)]
pub struct Pending {
    last: Mutex<Option<Last>>,
}

/// The marker event and the stream it was last recorded on.
struct Last {
    event: Event,
    /// [`Stream::key`] of the stream.
    stream: (usize, usize),
    /// The host has waited for the event since it was last recorded: later waits are free
    /// (the mailbox waits before every op, so this saves a driver call per op).
    settled: bool,
}

impl fmt::Debug for Pending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Pending")
    }
}

impl Pending {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Last>> {
        self.last.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Make `stream` wait for the last use. Nothing to do when the last use was on `stream`
    /// itself: a stream runs its work in order.
    pub(crate) fn order_before(&self, stream: &Stream) -> Result<(), CudaError> {
        if let Some(last) = self.lock().as_ref() {
            if last.stream != stream.key() {
                stream.wait_event(&last.event)?;
            }
        }
        Ok(())
    }

    /// Record a use on `stream`, enqueued just now.
    pub(crate) fn mark(&self, stream: &Stream) -> Result<(), CudaError> {
        let mut last = self.lock();
        let reuse = matches!(last.as_ref(), Some(l) if l.event.context().same(stream.context()));
        if !reuse {
            *last = Some(Last {
                event: Event::without_timing(stream.context())?,
                stream: (0, 0),
                settled: false,
            });
        }
        match last.as_mut() {
            Some(l) => {
                l.stream = stream.key();
                l.settled = false;
                l.event.record(stream)
            }
            None => Ok(()),
        }
    }

    /// Note that the host has waited for `stream` after ordering it behind the last use (see
    /// [`Pending::order_before`]): the last use is complete, so `stream` need not wait for it
    /// again.
    pub(crate) fn completed_on(&self, stream: &Stream) {
        if let Some(l) = self.lock().as_mut() {
            l.stream = stream.key();
        }
    }

    /// Wait on the host for the last use.
    pub(crate) fn synchronize(&self) -> Result<(), CudaError> {
        match self.lock().as_mut() {
            Some(l) if !l.settled => {
                l.event.synchronize()?;
                l.settled = true;
                Ok(())
            }
            _ => Ok(()),
        }
    }
}
