//! [`TransferHandle`]: what [`crate::Peer::submit`] returns, and the wait for a transfer's end.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{OpResults, Status, TransferReport, XferState};
use crate::error::{Error, Result};

/// The handle [`crate::Peer::submit`] returns. Cheap to clone; dropping it does not cancel
/// ([`TransferHandle::cancel`] does).
#[derive(Debug, Clone)]
pub struct TransferHandle {
    pub(crate) state: Arc<XferState>,
}

impl Drop for TransferHandle {
    /// The last handle of a transfer its waiters drive (`Drive`) hands it to the transport's
    /// thread, so it completes (and a target's leases end) with nobody waiting. Counted
    /// conservatively: the transport's in-flight entry holds one reference; any other holder is
    /// another handle (whose drop does this) or a completion pass (which finishes it).
    fn drop(&mut self) {
        if let Some(d) = self.state.drive() {
            if !self.state.ended() && Arc::strong_count(&self.state) <= 2 {
                d.park(&self.state);
            }
        }
        // The last handle of an ended transfer: its state may serve the peer's next submit.
        XferState::put_back(&mut self.state);
    }
}

impl TransferHandle {
    /// Where the transfer stands now.
    pub fn status(&self) -> Status {
        if let Some(d) = self.state.drive() {
            d.poll();
        }
        let p = self.state.lock();
        match (p.done, &p.first_error) {
            (None, _) => Status::Pending,
            (Some(_), None) => Status::Completed,
            (Some(_), Some(e)) => Status::Failed { reason: e.clone() },
        }
    }

    /// Bytes confirmed in place so far.
    pub fn bytes_done(&self) -> u64 {
        self.state.bytes_done.load(Ordering::Relaxed)
    }

    /// The rails of the peer's connection, each with the bytes this transfer landed on it so
    /// far, its state now and, while paused, why. Empty on routes without rails (shm, rdma,
    /// fabric).
    pub fn rails(&self) -> Vec<crate::RailInfo> {
        match &self.state.shared.rails {
            Some(r) => r.snapshot(Some(&self.state.rail_bytes)),
            None => Vec::new(),
        }
    }

    /// Number of ops.
    pub fn len(&self) -> usize {
        self.state.ops.len()
    }

    /// Always false: a transfer has at least one op.
    pub fn is_empty(&self) -> bool {
        self.state.ops.is_empty()
    }

    /// How many ops moved in batched copies so far, and in how many copies.
    pub fn batching(&self) -> super::Batching {
        self.state.batching()
    }

    /// Per-op results so far (path, reason, outcome).
    pub fn op_results(&self) -> OpResults {
        self.state.results(&self.state.lock())
    }

    /// Cancels the transfer and returns once none of its bytes will move any more: its
    /// regions may then be dropped or freed (a region dropped now does not wait for it).
    ///
    /// What is stopped, and what may still land (`docs/engine.md`, "Cancel, deadlines and
    /// peers that stop"): the transport starts no further piece of the transfer (a tcp chunk,
    /// an shm ring run or copy, an rdma piece). A copy in progress over shm and the work
    /// requests of an rdma piece are waited for; over tcp a chunk being handed to the kernel
    /// is finished, and the replies still due are abandoned (read and dropped later, never
    /// written into a region), so a write chunk already sent may still land at the peer; an
    /// shm request the peer does not answer within 100 ms closes the connection. Ops not
    /// completed fail with [`Error::Cancelled`] and the notification is not sent. A transfer
    /// queued behind others on the same connection ends when its turn comes, moving nothing.
    ///
    /// Cancelling an ended transfer changes nothing and returns its result; cancelling twice
    /// is fine. [`TransferHandle::wait`] afterwards returns the same result.
    ///
    /// # Errors
    /// [`Error::Cancelled`] when the cancel stopped at least one op (or held back the
    /// notification); the transfer's own failure if it failed first; `Ok` with the report
    /// when every op had completed before the transport saw the cancel.
    pub fn cancel(&self) -> Result<TransferReport> {
        self.request_cancel();
        // Every transport ends a transfer within its I/O timeout once it starts nothing more
        // of it; the wait is in spans so that no deadline computation overflows.
        const SPAN: Duration = Duration::from_secs(3600);
        loop {
            match self.wait(SPAN) {
                Err(Error::Timeout(d)) if d == SPAN && !self.state.ended() => continue,
                r => return r,
            }
        }
    }

    /// [`TransferHandle::cancel`] without its wait: asks the transport to stop the transfer
    /// and returns at once. The transfer's bytes stop moving only once it ended
    /// ([`TransferHandle::wait`], [`TransferHandle::status`]): its regions may be freed then,
    /// not before.
    pub fn request_cancel(&self) {
        if !self.state.ended() {
            self.state.cancelled.store(true, Ordering::Release);
        }
    }

    /// Waits up to `timeout` for the transfer to end.
    ///
    /// # Errors
    /// [`Error::Timeout`] if it is still pending after `timeout` (it keeps running; wait again or
    /// drop the handle), or the transfer's failure reason.
    pub fn wait(&self, timeout: Duration) -> Result<TransferReport> {
        // A small transfer ends within a round trip: catching that by spinning saves the
        // condition variable's sleep and wake-up, which would cost more than the round trip.
        let spin = crate::spin::TRANSFER_WAIT_SPIN.min(timeout);
        let drive = self.state.drive();
        let ended = crate::shm_ring::spin_until(spin, || {
            if let Some(d) = drive {
                d.poll();
            }
            self.state.ended()
        });
        if let (false, Some(d)) = (ended, drive) {
            d.park(&self.state);
        }
        if let Some(r) = self.state.report_if_ok() {
            return Ok(r);
        }
        let mut p = self.state.lock();
        // Read the clock only when the wait has to sleep (the spin above ends most waits).
        let mut deadline: Option<Instant> = None;
        while p.done.is_none() {
            let now = Instant::now();
            let deadline = *deadline.get_or_insert(now + timeout.saturating_sub(spin));
            if now >= deadline {
                return Err(Error::Timeout(timeout));
            }
            p.waiters += 1;
            p = self
                .state
                .cv
                .wait_timeout(p, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            p.waiters -= 1;
        }
        if let Some(e) = &p.first_error {
            return Err(e.clone());
        }
        // Ended (`done` is set): `finish` stored the elapsed time with it.
        Ok(self.state.report(self.state.results(&p)))
    }
}
