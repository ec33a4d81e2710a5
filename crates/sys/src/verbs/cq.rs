//! [`CompletionQueue`]: where the device reports finished work requests (`ibv_create_cq`,
//! `ibv_poll_cq`), and [`WorkCompletion`], one report as plain numbers.
//!
//! Invariants: the queue holds its [`RdmaContext`]; every [`super::QueuePair`] using it holds
//! a clone of the queue, so the queue is destroyed only after its queue pairs. Status codes are
//! passed up as numbers; `gdx-rdma` names them (sideway's conversion panics on codes it does
//! not know).

use super::context::RdmaContext;
use super::error::{Errno, VerbsError};
use rdma_mummy_sys::{ibv_cq, ibv_wc};
use std::ffi::c_int;
use std::fmt;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::Arc;

/// Completions read per `ibv_poll_cq` call.
const POLL_BATCH: usize = 32;

/// One work completion (`struct ibv_wc`), as numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkCompletion {
    /// The id the work request was posted with.
    pub wr_id: u64,
    /// `enum ibv_wc_status` (0 = success).
    pub status: u32,
    /// `enum ibv_wc_opcode` (0 = send, 1 = RDMA write, 2 = RDMA read, ...). Only valid when
    /// the status is success.
    pub opcode: u32,
    /// Vendor error syndrome, meaningful when the status is an error.
    pub vendor_err: u32,
    /// Bytes received (for receives; not set for RDMA write/read completions).
    pub byte_len: u32,
    /// The local queue pair number the work request ran on.
    pub qp_num: u32,
}

/// A completion queue. Cheap to clone; clones share one queue.
#[derive(Clone)]
pub struct CompletionQueue {
    inner: Arc<Inner>,
}

struct Inner {
    cq: NonNull<ibv_cq>,
    entries: u32,
    ctx: RdmaContext,
}

// SAFETY: libibverbs serialises `ibv_poll_cq` on one CQ internally (providers take the CQ
// lock), and the handle itself is only destroyed in `Drop`, which needs ownership.
unsafe impl Send for Inner {}
// SAFETY: as above: shared references only poll, which libibverbs makes thread-safe.
unsafe impl Sync for Inner {}

impl fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("device", &self.inner.ctx.name())
            .field("entries", &self.inner.entries)
            .finish()
    }
}

impl CompletionQueue {
    /// A queue for at least `entries` completions on `ctx` (`ibv_create_cq`, no completion
    /// channel: it is polled).
    pub fn new(ctx: &RdmaContext, entries: u32) -> Result<CompletionQueue, VerbsError> {
        const CALL: &str = "ibv_create_cq";
        let max = ctx.caps().max_cqe;
        if entries == 0 || (max > 0 && entries > max) {
            return Err(VerbsError::InvalidArgument {
                call: CALL,
                reason: format!("{entries} entries asked; {} allows 1 to {max}", ctx.name()),
            });
        }
        let cqe = c_int::try_from(entries).map_err(|_| VerbsError::InvalidArgument {
            call: CALL,
            reason: format!("{entries} entries do not fit an int"),
        })?;
        // SAFETY: the context is live (held by `ctx`); no user context, channel or vector.
        let cq = unsafe {
            rdma_mummy_sys::ibv_create_cq(
                ctx.raw_context().as_ptr(),
                cqe,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        let Some(cq) = NonNull::new(cq) else {
            return Err(VerbsError::from_errno(
                CALL,
                ctx.name(),
                format!("{entries} entries"),
                Errno::last(),
            ));
        };
        Ok(CompletionQueue {
            inner: Arc::new(Inner {
                cq,
                entries,
                ctx: ctx.clone(),
            }),
        })
    }

    /// The entries asked for.
    pub fn entries(&self) -> u32 {
        self.inner.entries
    }

    /// The device the queue belongs to.
    pub fn context(&self) -> &RdmaContext {
        &self.inner.ctx
    }

    /// The raw queue. Still owned by this value: do not destroy it.
    pub(crate) fn raw(&self) -> NonNull<ibv_cq> {
        self.inner.cq
    }

    /// Whether two handles share one queue.
    pub fn same(&self, other: &CompletionQueue) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Move up to `out.len()` completions into `out` without waiting (`ibv_poll_cq`);
    /// returns how many were written (0 when the queue is empty).
    pub fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, VerbsError> {
        let mut done = 0;
        while done < out.len() {
            let want = (out.len() - done).min(POLL_BATCH);
            let mut wcs = [MaybeUninit::<ibv_wc>::uninit(); POLL_BATCH];
            // `want` ≤ POLL_BATCH = 32, so it fits an int.
            let n_want = want as c_int;
            // SAFETY: the CQ is live (held by `self`); `wcs` has room for `want` ≤ 32
            // entries, and the provider writes only the entries it returns.
            let n = unsafe {
                rdma_mummy_sys::ibv_poll_cq(
                    self.inner.cq.as_ptr(),
                    n_want,
                    wcs.as_mut_ptr().cast::<ibv_wc>(),
                )
            };
            if n < 0 {
                return Err(VerbsError::from_errno(
                    "ibv_poll_cq",
                    self.inner.ctx.name(),
                    "",
                    Errno(-n),
                ));
            }
            let n = n as usize; // 0 ≤ n ≤ want
            for (slot, wc) in out[done..].iter_mut().zip(wcs.iter().take(n)) {
                // SAFETY: the provider initialised the first `n` entries.
                let wc = unsafe { wc.assume_init_ref() };
                *slot = WorkCompletion {
                    wr_id: wc.wr_id,
                    status: wc.status,
                    opcode: wc.opcode,
                    vendor_err: wc.vendor_err,
                    byte_len: wc.byte_len,
                    qp_num: wc.qp_num,
                };
            }
            done += n;
            if n < want {
                break;
            }
        }
        Ok(done)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: the last handle owns the queue; queue pairs using it hold a handle, so
        // none is left; it is destroyed exactly once, here.
        let rc = unsafe { rdma_mummy_sys::ibv_destroy_cq(self.cq.as_ptr()) };
        if rc != 0 {
            log::warn!(
                "ibv_destroy_cq on {} failed: {}; the queue leaks",
                self.ctx.name(),
                Errno(rc)
            );
        }
    }
}

/// The libibverbs text for a work completion status (`ibv_wc_status_str`), when the loaded
/// library has it.
pub fn wc_status_str(status: u32) -> Option<String> {
    super::probe().ok()?;
    // SAFETY: `ibv_wc_status_str` accepts any value and returns a static string (or NULL
    // from the shim when the library is absent, checked above and below).
    let p = unsafe { rdma_mummy_sys::ibv_wc_status_str(status) };
    if p.is_null() {
        return None;
    }
    // SAFETY: a non-null return is a NUL-terminated static string in libibverbs.
    let s = unsafe { std::ffi::CStr::from_ptr(p) };
    Some(s.to_string_lossy().into_owned())
}
