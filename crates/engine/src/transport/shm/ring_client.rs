//! The initiator's handle on its shm control ring (layout and states: `shm_ring.rs`): slots taken
//! in sequence, requests written and published, the doorbell rung only when the target may be
//! asleep, and the wait for a slot's answer with the liveness checks; and what waiters use to
//! complete transfers in flight (`Driver`, `Done`). `ring.rs` runs transfers through it.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use super::worker::{Front, RingClient, Skip, Worker};
use crate::error::{Error, Result};
use crate::shm_ring::{self, Ring, DONE, FREE, NAP, POSTED};
use crate::transfer::clock::Tick;
use crate::transfer::{Drive, XferState};
use crate::transport::SerialQueue;
use crate::wire::ShmOp;

/// How long a ring wait goes on after its transfer halted before it gives the peer up
/// (`RingClient::wait_state`): a running peer answers well within it, even on a loaded host.
pub(super) const HALT_GRACE: Duration = Duration::from_millis(100);

/// How often a wait on the shm socket looks whether its transfer halted.
pub(super) const HALT_LOOK: Duration = Duration::from_millis(10);

/// `RingClient::front` when nothing is in flight.
pub(super) const NO_SLOT: u32 = u32::MAX;

/// A post this soon after the previous one skips the doorbell check (`RingClient::publish`):
/// half the target's spin before it may sleep.
const QUIET: Duration = Duration::from_micros(shm_ring::TARGET_SPIN.as_micros() as u64 / 2);

impl RingClient {
    pub(super) fn new(ring: Ring, sock_fd: RawFd, wait: Duration) -> Self {
        RingClient {
            ring: Arc::new(ring),
            front: Arc::new(Front(AtomicU32::new(NO_SLOT))),
            seq: 0,
            consumed: [false; shm_ring::SLOTS],
            sock_fd,
            wait,
            last_post: None,
            quiet: Tick::span(QUIET),
        }
    }

    /// Waits until `slot` is in state `want`, for the transfer `owner` when the slot holds
    /// one's request.
    ///
    /// A transfer that halts while its request is unanswered (cancelled, or past its deadline:
    /// a stopped peer) ends then, not at the I/O timeout: its ops fail with the halt's error
    /// and the wait fails with `PeerLost`, which closes the connection, since the peer may
    /// still act on the request (lease the regions, take an inline slot's bytes) when it
    /// resumes. A peer that answers within `HALT_GRACE` of the halt keeps the connection.
    pub(super) fn wait_state(
        &self,
        slot: usize,
        want: u32,
        owner: Option<&XferState>,
    ) -> Result<()> {
        let st = self.ring.state(slot);
        if shm_ring::spin_until(crate::spin::RING_SLOT_SPIN, || {
            st.load(Ordering::Acquire) == want
        }) {
            return Ok(());
        }
        let deadline = Instant::now() + self.wait;
        // When the owner was first seen halted.
        let mut halted: Option<Instant> = None;
        loop {
            self.ring.waiting(slot).store(1, Ordering::SeqCst);
            let cur = st.load(Ordering::SeqCst);
            if cur != want {
                shm_ring::futex_wait(st, cur, NAP);
            }
            self.ring.waiting(slot).store(0, Ordering::SeqCst);
            if st.load(Ordering::Acquire) == want {
                return Ok(());
            }
            if hung_up(self.sock_fd) {
                return Err(Error::peer_lost(
                    "the shm peer closed its connection while a ring request was pending",
                ));
            }
            if Instant::now() >= deadline {
                return Err(Error::peer_lost(format!(
                    "no answer on the shm ring within the I/O timeout ({} ms)",
                    self.wait.as_millis()
                )));
            }
            if let Some(x) = owner {
                if let Some(e) = x.halt() {
                    let since = *halted.get_or_insert_with(Instant::now);
                    if since.elapsed() >= HALT_GRACE {
                        x.fail_pending(&e);
                        return Err(Error::peer_lost(format!(
                            "the shm peer did not answer transfer {} before it ended ({e}); the \
                             connection is closed, since the peer may still act on the request",
                            x.id
                        )));
                    }
                }
            }
        }
    }

    /// Whether the next `k` slots are free now (taking them would not wait).
    pub(super) fn free_ahead(&self, k: usize) -> bool {
        k <= shm_ring::SLOTS
            && (0..k).all(|j| {
                let slot = self.seq.wrapping_add(j as u32) as usize % shm_ring::SLOTS;
                self.consumed[slot] || self.ring.state(slot).load(Ordering::Acquire) == FREE
            })
    }

    /// Whether the next slot is free now (taking it would not wait).
    pub(super) fn next_is_free(&self) -> bool {
        let slot = self.seq as usize % shm_ring::SLOTS;
        self.consumed[slot] || self.ring.state(slot).load(Ordering::Acquire) == FREE
    }

    /// An answered inline slot was read: it may be reused without waiting.
    pub(super) fn consume(&mut self, slot: usize) {
        self.consumed[slot] = true;
    }

    /// Takes the next slot (waiting until the target freed it) and writes the request's op
    /// table into it; `post_slot` completes and posts it.
    pub(super) fn prepare(&mut self, ops: impl Iterator<Item = ShmOp>) -> Result<usize> {
        let slot = self.take_slot()?;
        self.ring.write_ops(slot, ops);
        Ok(slot)
    }

    /// Takes the next slot, waiting until the target freed it.
    fn take_slot(&mut self) -> Result<usize> {
        let slot = self.seq as usize % shm_ring::SLOTS;
        if !std::mem::take(&mut self.consumed[slot]) {
            self.wait_state(slot, FREE, None)?;
        }
        Ok(slot)
    }

    /// Takes the next slot (waiting until the target freed it), writes a short request for
    /// `op` into it (`shm_ring::KIND_SHORT`: with `data`, a write's bytes) and posts it.
    pub(super) fn post_short(&mut self, op: &ShmOp, data: &[u8]) -> Result<usize> {
        let slot = self.take_slot()?;
        self.ring.write_short(slot, self.seq, op, data);
        self.seq = self.seq.wrapping_add(1);
        self.publish(slot, POSTED);
        Ok(slot)
    }

    /// Writes the control block of the slot `prepare` took (its data already in place), posts
    /// it and rings the doorbell.
    pub(super) fn post_slot(&mut self, slot: usize, kind: u32, xfer: u64, n_ops: usize) {
        self.ring.write_control(slot, self.seq, kind, n_ops, xfer);
        self.seq = self.seq.wrapping_add(1);
        self.publish(slot, POSTED);
    }

    /// Publishes a slot state (`POSTED`, `END`) and rings the doorbell.
    pub(super) fn publish(&mut self, slot: usize, state: u32) {
        // Within `QUIET` of the previous post the target is still spinning (it spins
        // `TARGET_SPIN` after the last request it saw, which was that post or a later one,
        // before it may sleep), and this store is visible to it long before it could re-check
        // the slots on its way to sleep: a release store does, with no doorbell check. The fence a check
        // needs (the SeqCst store) would hold this core until the slot's line came back from
        // the target's core, once per post.
        let now = Tick::now();
        let recent = self.last_post.is_some_and(|t| now.within(t, self.quiet));
        self.last_post = Some(now);
        if recent {
            self.ring.state(slot).store(state, Ordering::Release);
            return;
        }
        self.ring.state(slot).store(state, Ordering::SeqCst);
        // The doorbell moves only for a sleeping target: the state store and this load are
        // both SeqCst, and the target sets `target_sleeping` (SeqCst) before it re-checks the
        // slots and sleeps on the doorbell's value, so either it sees this slot or this load
        // sees it sleeping (and the bump changes the value it sleeps on, or the wake finds it).
        if self.ring.target_sleeping().load(Ordering::SeqCst) != 0 {
            self.ring.doorbell().fetch_add(1, Ordering::SeqCst);
            shm_ring::futex_wake(self.ring.doorbell());
        }
    }
}

/// True when the peer hung up the socket (or it failed).
fn hung_up(fd: RawFd) -> bool {
    use rustix::event::{PollFd, PollFlags};
    // SAFETY: the transport keeps the socket open while its ring client lives; poll only looks
    // the number up (POLLNVAL if it were closed).
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let mut p = [PollFd::from_borrowed_fd(fd, PollFlags::RDHUP)];
    let n = rustix::event::poll(&mut p, Some(&rustix::event::Timespec::default())).unwrap_or(0);
    let hup = PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR | PollFlags::NVAL;
    n > 0 && p[0].revents().intersects(hup)
}

/// Transfers a completion pass ended, to be finished once the worker lock is let go (a waiter
/// that sees its transfer end may submit the next one at once, and that takes the lock).
#[derive(Debug, Default)]
pub(super) struct Done(smallvec::SmallVec<[(Arc<XferState>, Option<Skip>); 4]>);

impl Done {
    pub(super) fn new() -> Self {
        Done::default()
    }

    /// `xfer` ends as it stands (its ops already recorded).
    pub(super) fn push(&mut self, xfer: Arc<XferState>) {
        self.0.push((xfer, None));
    }

    /// `xfer`, one slot's worth of ops, ends with every op not in `skip` completed (recorded in
    /// the same update as the end).
    pub(super) fn complete(&mut self, xfer: Arc<XferState>, skip: Skip) {
        self.0.push((xfer, Some(skip)));
    }

    /// Ends them all, in order. By reference: the list lives on its caller's stack, and
    /// moving it into the call would copy it (144 bytes) once per completion pass.
    pub(super) fn finish(&mut self) {
        match self.0.len() {
            // Most passes end nothing (a submit that completed no earlier transfer), or one
            // transfer (a waiter's own): no drain of the list.
            0 => {}
            1 => {
                if let Some((x, skip)) = self.0.pop() {
                    end(&x, skip);
                }
            }
            _ => {
                for (x, skip) in self.0.drain(..) {
                    end(&x, skip);
                }
            }
        }
    }
}

/// Ends `x`: as it stands (`skip` none), or with every op not in `skip` completed.
fn end(x: &XferState, skip: Option<Skip>) {
    match skip {
        None => x.finish(),
        Some(s) => x.finish_with(|i| !s.get(i)),
    }
}

impl Skip {
    pub(super) fn get(&self, j: usize) -> bool {
        self.0
            .as_ref()
            .is_some_and(|v| v.get(j).copied().unwrap_or(false))
    }

    /// Marks op `j` of a slot of `n` ops.
    pub(super) fn set(&mut self, j: usize, n: usize) {
        if let Some(b) = self.0.get_or_insert_with(|| vec![false; n]).get_mut(j) {
            *b = true;
        }
    }
}

/// The handle waiters drive a transfer in flight through (`Drive`); weak, so an abandoned
/// transfer keeps neither the connection nor its worker thread alive.
#[derive(Debug)]
pub(super) struct Driver {
    /// The ring and its oldest slot in flight: a poll while that slot is unanswered costs
    /// two loads, no lock (a waiter polls in a tight loop, maybe on a core the target shares).
    pub(super) ring: Arc<Ring>,
    pub(super) front: Arc<Front>,
    pub(super) worker: Weak<Mutex<Worker>>,
    pub(super) queue: Weak<SerialQueue>,
    pub(super) dead: Arc<AtomicBool>,
}

impl Drive for Driver {
    fn poll(&self) {
        let front = self.front.load(Ordering::Acquire);
        if front == NO_SLOT || self.ring.state(front as usize).load(Ordering::Acquire) != DONE {
            return;
        }
        let Some(w) = self.worker.upgrade() else {
            return;
        };
        let mut done = Done::new();
        if let Ok(mut w) = w.try_lock() {
            if w.inflight.is_empty() {
                return;
            }
            if w.reap_guarded(false, &mut done) {
                self.dead.store(true, Ordering::SeqCst);
            }
        }
        done.finish();
    }

    fn park(&self, xfer: &Arc<XferState>) {
        if let Some(q) = self.queue.upgrade() {
            q.nudge(Arc::clone(xfer));
        }
    }
}
