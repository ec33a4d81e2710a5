//! The initiator's side of the shm control ring (layout and states: `ring.rs`).
//!
//! A transfer whose ops all fit the ring runs without the socket: small ops (≤ `INLINE_MAX`)
//! travel inline, and the target copies them between the slot and its region under a lease, so
//! the op costs one ring round trip and the `DONE` is the target's confirmation. Larger ops to
//! mapped regions are leased by a `BEGIN` request (one round trip), copied once through the
//! mapping, and the slot is marked `END` without waiting: the copy finished while the target held
//! the leases, so the bytes are in place when the op completes; the target drops the leases when
//! it sees `END`. A notification still travels on the socket (`ShmEnd`), after the bytes.
//!
//! A small transfer (one inline slot, no notification) is posted by the submitting thread and
//! left in flight (`Worker::inflight`): many may be outstanding (up to the ring's slots), each
//! completing on its own. Whoever waits completes them (`Drive`): the waiter polls the slots and
//! completes every answered one, oldest first; a waiter about to sleep hands the rest to the
//! worker thread, which waits with the liveness checks below.
//!
//! Liveness: a waiter spins briefly, then sleeps on the slot's futex in short naps, and between
//! naps checks the shm socket for hang-up (the target closes it when it dies or its ring
//! thread gives up) and the I/O timeout; either fails the transfer's unconfirmed ops with
//! `PeerLost` and the connection stays failed.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use super::Worker;
use crate::error::{Error, Result};
use crate::gpu::{copy_span, Dir};
use crate::plan::Path;
use crate::region::LeaseKind;
use crate::ring::{
    self, Ring, DATA_BYTES, DONE, END, FREE, INLINE_MAX, KIND_BEGIN, KIND_INLINE, MAX_RING_OPS,
    NAP, POSTED,
};
use crate::transfer::{Drive, NewTransfer, OpKind, OpRef, XferState};
use crate::transport::SerialQueue;
use crate::wire::ShmOp;

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
    fn complete(&mut self, xfer: Arc<XferState>, skip: Skip) {
        self.0.push((xfer, Some(skip)));
    }

    /// Ends them all, in order.
    pub(super) fn finish(self) {
        for (x, skip) in self.0 {
            match skip {
                None => x.finish(),
                Some(s) => x.finish_with(|i| !s.get(i)),
            }
        }
    }
}

/// `RingClient::front` when nothing is in flight.
const NO_SLOT: u32 = u32::MAX;

/// How long the initiator spins on a slot before it sleeps on its futex.
const SPIN: Duration = Duration::from_micros(100);
/// How long the submitting thread waits for the next slot (the oldest in flight to be answered)
/// before it queues the transfer to the worker thread instead: a ring round trip to a running
/// peer is a few µs; anything longer (a sleeping, descheduled or stopped peer) is waited for off
/// the caller's thread.
const SUBMIT_SPIN: Duration = Duration::from_micros(10);

/// The initiator's ring state: the mapping and the next sequence number.
#[derive(Debug)]
pub(super) struct RingClient {
    /// Shared with the connection's `Driver`, which reads slot states without the lock.
    pub(super) ring: Arc<Ring>,
    /// The slot of the oldest transfer in flight (`NO_SLOT`: none), for `Driver::poll`.
    pub(super) front: Arc<AtomicU32>,
    seq: u32,
    /// Inline slots whose `DONE` this side has read: free to reuse as they are. The initiator
    /// does not write `FREE` into them, which would take the slot's line back from the target's
    /// core once more per request (and stall this core's next atomic until it had).
    consumed: [bool; ring::SLOTS],
    /// The shm socket, watched for hang-up while waiting.
    sock_fd: RawFd,
    wait: Duration,
    /// When this side last published a slot (`publish`).
    last_post: Option<quanta::Instant>,
}

/// A post this soon after the previous one skips the doorbell check (`RingClient::publish`):
/// half the target's spin before it may sleep (200 µs, `docs/wire-protocol.md`).
const QUIET: Duration = Duration::from_micros(100);

impl RingClient {
    pub(super) fn new(ring: Ring, sock_fd: RawFd, wait: Duration) -> Self {
        RingClient {
            ring: Arc::new(ring),
            front: Arc::new(AtomicU32::new(NO_SLOT)),
            seq: 0,
            consumed: [false; ring::SLOTS],
            sock_fd,
            wait,
            last_post: None,
        }
    }

    /// Waits until `slot` is in state `want`.
    fn wait_state(&self, slot: usize, want: u32) -> Result<()> {
        let st = self.ring.state(slot);
        if ring::spin_until(SPIN, || st.load(Ordering::Acquire) == want) {
            return Ok(());
        }
        let deadline = Instant::now() + self.wait;
        loop {
            self.ring.waiting(slot).store(1, Ordering::SeqCst);
            let cur = st.load(Ordering::SeqCst);
            if cur != want {
                ring::futex_wait(st, cur, NAP);
            }
            self.ring.waiting(slot).store(0, Ordering::SeqCst);
            if st.load(Ordering::Acquire) == want {
                return Ok(());
            }
            if hung_up(self.sock_fd) {
                return Err(Error::PeerLost(
                    "the shm peer closed its connection while a ring request was pending".into(),
                ));
            }
            if Instant::now() >= deadline {
                return Err(Error::PeerLost(format!(
                    "no answer on the shm ring within the I/O timeout ({} ms)",
                    self.wait.as_millis()
                )));
            }
        }
    }

    /// Whether the next slot is free now (taking it would not wait).
    fn next_is_free(&self) -> bool {
        let slot = self.seq as usize % ring::SLOTS;
        self.consumed[slot] || self.ring.state(slot).load(Ordering::Acquire) == FREE
    }

    /// An answered inline slot was read: it may be reused without waiting.
    fn consume(&mut self, slot: usize) {
        self.consumed[slot] = true;
    }

    /// Takes the next slot (waiting until the target freed it) and writes the request's op
    /// table into it; `post_slot` completes and posts it.
    fn prepare(&mut self, ops: impl Iterator<Item = ShmOp>) -> Result<usize> {
        let slot = self.seq as usize % ring::SLOTS;
        if !std::mem::take(&mut self.consumed[slot]) {
            self.wait_state(slot, FREE)?;
        }
        self.ring.write_ops(slot, ops);
        Ok(slot)
    }

    /// Writes the control block of the slot `prepare` took (its data already in place), posts
    /// it and rings the doorbell.
    fn post_slot(&mut self, slot: usize, kind: u32, xfer: u64, n_ops: usize) {
        self.ring.write_control(slot, self.seq, kind, n_ops, xfer);
        self.seq = self.seq.wrapping_add(1);
        self.publish(slot, POSTED);
        // The next slot, if the target is done with it (its answer was read), is fetched for
        // writing while this one is in flight.
        let next = self.seq as usize % ring::SLOTS;
        if self.consumed[next] {
            self.ring.prefetch_for_write(next);
        }
    }

    /// Publishes a slot state (`POSTED`, `END`) and rings the doorbell.
    fn publish(&mut self, slot: usize, state: u32) {
        // Within `QUIET` of the previous post the target is still spinning (it spins 200 µs
        // after the last request it saw, which was that post or a later one, before it may
        // sleep), and this store is visible to it long before it could re-check the slots on
        // its way to sleep: a release store does, with no doorbell check. The fence a check
        // needs (the SeqCst store) would hold this core until the slot's line came back from
        // the target's core, once per post.
        let now = quanta::Instant::now();
        let recent = self
            .last_post
            .is_some_and(|t| now.saturating_duration_since(t) < QUIET);
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
            ring::futex_wake(self.ring.doorbell());
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

/// Whether `xfer` may be posted by the submitting thread and left in flight (`Worker::post`
/// decides: one slot, every op inline or every op leased with `BEGIN`): at most one slot's ops,
/// every op over shm, no notification (that is a socket round trip after the bytes).
pub(super) fn may_post(xfer: &XferState) -> bool {
    xfer.ops.len() <= MAX_RING_OPS
        && xfer.notify.is_none()
        && xfer
            .paths()
            .all(|p| matches!(p, Path::Shm | Path::ShmStaged))
}

/// Whether `n` may be posted before its state is built (`Worker::post_early`): one op over
/// shm, inline (a write of up to `STAGE_MAX` bytes, staged on the stack; a read of up to
/// `INLINE_MAX`), no notification.
pub(super) fn posts_early(n: &NewTransfer<'_>) -> bool {
    let ([op], Some(plan)) = (&n.t.ops[..], n.plans.only()) else {
        return false;
    };
    let fits = match op.kind {
        OpKind::Write => op.len <= STAGE_MAX as u64,
        OpKind::Read => op.len <= INLINE_MAX,
    };
    fits && n.t.notify.is_none() && matches!(plan.path, Path::Shm | Path::ShmStaged)
}

/// Whether `xfer` goes in one inline slot (all its bytes ≤ `INLINE_MAX`: two copies of that
/// cost less than a BEGIN's extra round trip and bookkeeping), every op inline, no
/// notification.
pub(super) fn posts_inline(xfer: &XferState) -> bool {
    xfer.ops.len() <= MAX_RING_OPS
        && xfer.notify.is_none()
        && xfer.ops.iter().map(|o| o.len).sum::<u64>() <= INLINE_MAX
        && all_inline(xfer)
}

/// Largest one-op write staged on the stack before its slot is written (`stage_op`).
const STAGE_MAX: usize = 64;

/// A one-op write's bytes read onto the stack (`stage_op`), and their length.
type Staged = Result<([u8; STAGE_MAX], usize)>;

/// Most queued small transfers the worker posts before it awaits the first answer.
pub(super) const PIPELINE: usize = ring::SLOTS / 2;

/// A slot `post_early` posted for a transfer whose state is not built yet.
#[derive(Debug)]
pub(super) struct Early {
    started: Started,
    /// The op's local copy failed (the op was withdrawn from the slot).
    failed: Option<Error>,
}

/// A slot `start_slot` posted, before it joins the transfers in flight.
#[derive(Debug)]
struct Started {
    slot: usize,
    kind: u32,
    skip: Skip,
}

/// A posted slot not yet answered (or answered and not yet completed): inline, or `BEGIN`
/// (answered: the ops are leased by the target, and whoever completes it copies through the
/// mappings and marks it `END`).
#[derive(Debug)]
pub(super) struct Inflight {
    xfer: Arc<XferState>,
    slot: usize,
    kind: u32,
    /// The ops withdrawn before posting (their local copy failed).
    skip: Skip,
}

/// The ops of one slot that are out of it: withdrawn before posting, or failed by the target.
/// Nothing is allocated until an op fails (the common case).
#[derive(Debug, Default)]
pub(super) struct Skip(Option<Vec<bool>>);

impl Skip {
    fn get(&self, j: usize) -> bool {
        self.0
            .as_ref()
            .is_some_and(|v| v.get(j).copied().unwrap_or(false))
    }

    /// Marks op `j` of a slot of `n` ops.
    fn set(&mut self, j: usize, n: usize) {
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
    pub(super) front: Arc<AtomicU32>,
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

/// Whether every op of `xfer` travels inline (small, and to a path the ring carries inline).
fn all_inline(xfer: &XferState) -> bool {
    xfer.paths()
        .zip(&xfer.ops)
        .all(|(p, op)| op.len <= INLINE_MAX && matches!(p, Path::Shm | Path::ShmStaged))
}

/// Whether op `i` can go through the ring (inline, or leased and copied through a mapping).
/// A transfer of more than `INLINE_MAX` bytes moves its small ops to mapped regions with `BEGIN`
/// too: one copy instead of two, and one lease per region run instead of one per op.
fn ring_class(w: &Worker, xfer: &XferState, plan: &Path, i: usize, big: bool) -> Option<u32> {
    let op = xfer.op(i);
    let mapped = *plan == Path::Shm && w.maps.contains_key(&op.remote.id);
    if mapped && (big || op.len > INLINE_MAX) {
        return Some(KIND_BEGIN);
    }
    if op.len <= INLINE_MAX && matches!(plan, Path::Shm | Path::ShmStaged) {
        return Some(KIND_INLINE);
    }
    None
}

/// The op table entries (ring or `ShmBegin`) for `batch`.
pub(super) fn ring_ops(xfer: &XferState, batch: &[usize]) -> Vec<ShmOp> {
    ring_ops_iter(xfer, batch).collect()
}

/// `ring_ops`, written straight into a slot (no list built).
fn ring_ops_iter<'a>(
    xfer: &'a XferState,
    batch: &'a [usize],
) -> impl ExactSizeIterator<Item = ShmOp> + 'a {
    batch.iter().map(|&i| shm_op(xfer.op(i)))
}

/// An op's entry in a slot's op table.
fn shm_op(op: OpRef<'_>) -> ShmOp {
    ShmOp {
        write: op.kind == OpKind::Write,
        region: op.remote.id,
        key: op.remote.key,
        offset: op.remote_offset,
        len: op.len,
    }
}

impl Worker {
    /// Runs `xfer` through the ring when every op fits it; `Ok(false)` when some op does not
    /// (the caller runs the transfer over the socket).
    pub(super) fn run_ring(
        &mut self,
        xfer: &XferState,
        plans: &[Path],
        ok: &[bool],
    ) -> Result<bool> {
        if self.ring.is_none() {
            return Ok(false);
        }
        let idx: Vec<usize> = (0..xfer.ops.len()).filter(|&i| ok[i]).collect();
        let mut classes = Vec::with_capacity(idx.len());
        let big = idx.iter().map(|&i| xfer.ops[i].len).sum::<u64>() > INLINE_MAX;
        for &i in &idx {
            match ring_class(self, xfer, &plans[i], i, big) {
                Some(k) => classes.push(k),
                None => return Ok(false),
            }
        }
        // Consecutive ops of one class share a slot, up to its op and data limits.
        let mut start = 0;
        while start < idx.len() {
            let kind = classes[start];
            let mut end = start;
            let mut data = 0u64;
            while end < idx.len() && classes[end] == kind && end - start < MAX_RING_OPS {
                let len = xfer.ops[idx[end]].len;
                if kind == KIND_INLINE && data + len > DATA_BYTES as u64 {
                    break;
                }
                data += len;
                end += 1;
            }
            self.ring_batch(xfer, &idx[start..end], kind)?;
            start = end;
        }
        if let Some(n) = xfer.notify.clone().filter(|_| !xfer.has_failed()) {
            self.send_notify(xfer, n)?;
        }
        Ok(true)
    }

    /// One slot: post, wait for `DONE`, then complete (inline) or copy and `END` (begin).
    fn ring_batch(&mut self, xfer: &XferState, batch: &[usize], kind: u32) -> Result<()> {
        if kind == KIND_INLINE {
            let (slot, skip) = self.post_inline(xfer, batch)?;
            self.ring_mut()?.wait_state(slot, DONE)?;
            let skip = self.finish_inline(xfer, batch, slot, skip)?;
            xfer.ops_done(
                batch
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| !skip.get(*j))
                    .map(|(_, &i)| i),
            );
            return Ok(());
        }
        let rc = self.ring_mut()?;
        let slot = rc.prepare(ring_ops_iter(xfer, batch))?;
        rc.post_slot(slot, kind, xfer.id, batch.len());
        rc.wait_state(slot, DONE)?;
        // BEGIN: the target holds a lease on every accepted op until END.
        self.finish_begin(xfer, batch, slot, Skip::default())
    }

    /// The copies of a `BEGIN` slot through the mappings: consecutive ops between the same
    /// local region and the same remote region, in the same direction, share one local lease and
    /// one mapping look-up (a batch of small ops costs its copies, not per-op bookkeeping).
    /// Returns the ops copied and the error that broke the connection, if one did.
    fn copy_runs(
        &self,
        xfer: &XferState,
        batch: &[usize],
        skip: &Skip,
    ) -> (Vec<usize>, Option<Error>) {
        let mut done = Vec::with_capacity(batch.len());
        let mut j = 0;
        while j < batch.len() {
            if skip.get(j) {
                j += 1;
                continue;
            }
            let first = xfer.op(batch[j]);
            let mut end = j + 1;
            while end < batch.len() && !skip.get(end) {
                let op = xfer.op(batch[end]);
                if !Arc::ptr_eq(op.local, first.local)
                    || op.remote.id != first.remote.id
                    || op.kind != first.kind
                {
                    break;
                }
                end += 1;
            }
            let run = &batch[j..end];
            j = end;
            let fail_run = |e: &Error| {
                for &i in run {
                    xfer.chunk_done(i, 0, Err(e.clone()));
                }
            };
            if xfer.expired() {
                fail_run(&xfer.timeout_error());
                continue;
            }
            let Some((m, writable)) = self.maps.get(&first.remote.id) else {
                fail_run(&Error::NoSuchRegion {
                    region: first.remote.id,
                });
                continue;
            };
            let (kind, dir) = match first.kind {
                OpKind::Write if !writable => {
                    fail_run(&Error::ReadOnly {
                        region: first.remote.id,
                    });
                    continue;
                }
                OpKind::Write => (LeaseKind::Source, Dir::OutOfRegion),
                OpKind::Read => (LeaseKind::Sink, Dir::IntoRegion),
            };
            let lease = match first.local.lease(kind, self.wait) {
                Ok(l) => l,
                Err(e) if e.is_fatal_for_stream() => return (done, Some(e)),
                Err(e) => {
                    fail_run(&e);
                    continue;
                }
            };
            for &i in run {
                let op = xfer.op(i);
                if let Err(e) =
                    crate::region::check_bounds(op.remote_offset, op.len, m.len() as u64)
                {
                    xfer.chunk_done(i, 0, Err(e));
                    continue;
                }
                // SAFETY: remote_offset + len <= m.len() (checked above).
                let remote = unsafe { m.ptr().add(op.remote_offset as usize) };
                // SAFETY: the remote span is checked above, mapped (writable for a write) and
                // leased by the target since BEGIN; the local span was bounds-checked at submit
                // and is held by the lease; distinct mappings do not overlap.
                match unsafe { copy_span(&lease, op.local_offset, remote, op.len as usize, dir) } {
                    Ok(()) => done.push(i),
                    Err(e) if e.is_fatal_for_stream() => return (done, Some(e)),
                    Err(e) => xfer.chunk_done(i, 0, Err(e)),
                }
            }
        }
        (done, None)
    }

    fn ring_mut(&mut self) -> Result<&mut RingClient> {
        self.ring
            .as_mut()
            .ok_or_else(|| Error::Protocol("no shm ring".into()))
    }

    /// Reads the target's per-op errors of `slot` into `skip` (and fails those ops).
    fn take_result(
        &mut self,
        xfer: &XferState,
        batch: &[usize],
        slot: usize,
        skip: &mut Skip,
    ) -> Result<()> {
        let errors = self.ring_mut()?.ring.read_result(slot)?;
        for (j, e) in errors {
            let j = j as usize;
            if j >= batch.len() {
                return Err(Error::Protocol("shm ring result index out of range".into()));
            }
            if !skip.get(j) {
                skip.set(j, batch.len());
                if matches!(e, Error::NoSuchRegion { .. } | Error::RegionGone { .. }) {
                    let gone = xfer.op(batch[j]).remote.id;
                    self.maps.remove(&gone);
                }
                xfer.chunk_done(batch[j], 0, Err(e));
            }
        }
        Ok(())
    }

    /// Copies the inline bytes of the ops of `batch` going `kind` (writes: into the slot before
    /// posting; reads: out of it after `DONE`), skipping the ops in `skip`; an op whose local
    /// copy fails is failed and added to `skip` (and, before posting, withdrawn from the slot).
    fn copy_inline(
        &self,
        xfer: &XferState,
        batch: &[usize],
        slot: usize,
        skip: &mut Skip,
        kind: OpKind,
    ) -> Result<()> {
        let rc = self
            .ring
            .as_ref()
            .ok_or_else(|| Error::Protocol("no shm ring".into()))?;
        let (lease_kind, dir) = match kind {
            OpKind::Write => (LeaseKind::Source, Dir::OutOfRegion),
            OpKind::Read => (LeaseKind::Sink, Dir::IntoRegion),
        };
        let mut at = 0usize;
        for (j, &i) in batch.iter().enumerate() {
            let op = xfer.op(i);
            if !skip.get(j) && op.kind == kind {
                let slot_data = rc.ring.data_ptr(slot, batch.len(), at);
                let len = op.len as usize;
                // The copy under the local region's locked lease state (no lease taken and
                // dropped); GPU memory or a conflicting user view takes a lease below.
                let quick = op.local.with_locked(lease_kind, |base| {
                    // SAFETY: local_offset + len <= the region's length (checked at submit);
                    // [at, at + len) lies in the slot's data area (the batch was cut to
                    // DATA_BYTES); a slot and a region are distinct mappings.
                    unsafe {
                        let region = base.add(op.local_offset as usize);
                        match dir {
                            Dir::OutOfRegion => {
                                std::ptr::copy_nonoverlapping(region.cast_const(), slot_data, len)
                            }
                            Dir::IntoRegion => {
                                std::ptr::copy_nonoverlapping(slot_data.cast_const(), region, len)
                            }
                        }
                    }
                });
                let r = match quick {
                    Some(r) => r,
                    None => op.local.lease(lease_kind, self.wait).and_then(|lease| {
                        // SAFETY: [at, at + len) lies in the slot's data area (the batch was cut
                        // to DATA_BYTES); the local span is leased and bounds-checked at submit.
                        unsafe { copy_span(&lease, op.local_offset, slot_data, len, dir) }
                    }),
                };
                if let Err(e) = r {
                    skip.set(j, batch.len());
                    if kind == OpKind::Write {
                        rc.ring.skip_op(slot, j);
                    }
                    xfer.chunk_done(i, 0, Err(e));
                }
            }
            at += op.len as usize;
        }
        Ok(())
    }

    /// Takes the next slot (waiting until it is free), copies the writes' bytes into it and
    /// posts it. Returns the slot and the ops withdrawn (their local copy failed).
    fn post_inline(&mut self, xfer: &XferState, batch: &[usize]) -> Result<(usize, Skip)> {
        if let [i] = *batch {
            if let Some(staged) = self.stage_op(xfer.op(i)) {
                let (slot, skip, failed) = self.post_one(xfer.op(i), xfer.id, Some(staged))?;
                if let Some(e) = failed {
                    xfer.chunk_done(i, 0, Err(e));
                }
                return Ok((slot, skip));
            }
        }
        let mut skip = Skip::default();
        let slot = self.ring_mut()?.prepare(ring_ops_iter(xfer, batch))?;
        self.copy_inline(xfer, batch, slot, &mut skip, OpKind::Write)?;
        self.ring_mut()?
            .post_slot(slot, KIND_INLINE, xfer.id, batch.len());
        Ok((slot, skip))
    }

    /// One inline op posted in its own slot: its table entry, then its staged bytes (a write,
    /// `stage_op`) or none (a read), then the control block. Returns the slot, the op withdrawn
    /// if its local copy failed, and that failure (for the caller to record on the transfer).
    fn post_one(
        &mut self,
        op: OpRef<'_>,
        id: u64,
        staged: Option<Staged>,
    ) -> Result<(usize, Skip, Option<Error>)> {
        let rc = self.ring_mut()?;
        let slot = rc.prepare(std::iter::once(shm_op(op)))?;
        let mut skip = Skip::default();
        let mut failed = None;
        match staged {
            Some(Ok((buf, len))) => {
                // SAFETY: one op of `len` <= STAGE_MAX bytes: its data lies at the start of
                // the slot's data area; `buf` is on this stack.
                unsafe {
                    std::ptr::copy_nonoverlapping(buf.as_ptr(), rc.ring.data_ptr(slot, 1, 0), len)
                };
            }
            Some(Err(e)) => {
                skip.set(0, 1);
                rc.ring.skip_op(slot, 0);
                failed = Some(e);
            }
            None => {}
        }
        rc.post_slot(slot, KIND_INLINE, id, 1);
        Ok((slot, skip, failed))
    }

    /// A one-op write of at most `STAGE_MAX` bytes, read out of its region onto the stack
    /// before the slot is touched: the region's lock is then let go (a full barrier) with no
    /// store to the shared slot pending, and the slot's two cache lines are written back to
    /// back and move to the target together, not one after the other. `None`: not such an op.
    fn stage_op(&self, op: OpRef<'_>) -> Option<Staged> {
        let len = usize::try_from(op.len).ok().filter(|&l| l <= STAGE_MAX)?;
        if op.kind != OpKind::Write {
            return None;
        }
        let mut buf = [0u8; STAGE_MAX];
        let dst = buf.as_mut_ptr();
        let quick = op.local.with_locked(LeaseKind::Source, |base| {
            // SAFETY: local_offset + len <= the region's length (checked at submit); `buf`
            // holds STAGE_MAX >= len bytes.
            unsafe { std::ptr::copy_nonoverlapping(base.add(op.local_offset as usize), dst, len) }
        });
        let r = match quick {
            Some(r) => r,
            None => op
                .local
                .lease(LeaseKind::Source, self.wait)
                .and_then(|lease| {
                    // SAFETY: `buf` holds len bytes; the local span is leased and bounds-checked.
                    unsafe { copy_span(&lease, op.local_offset, dst, len, Dir::OutOfRegion) }
                }),
        };
        Some(r.map(|()| (buf, len)))
    }

    /// After `DONE` on an inline slot: the target's errors, the reads' bytes out of the slot,
    /// the slot marked for reuse (it stays `DONE`). Returns the ops of `batch` that did not
    /// complete (the rest did; the caller records them).
    fn finish_inline(
        &mut self,
        xfer: &XferState,
        batch: &[usize],
        slot: usize,
        mut skip: Skip,
    ) -> Result<Skip> {
        let rc = self.ring_mut()?;
        // The common answer (no op failed, only writes) reads one word here.
        if rc.ring.has_result(slot) {
            self.take_result(xfer, batch, slot, &mut skip)?;
        }
        if batch.iter().any(|&i| xfer.ops[i].kind == OpKind::Read) {
            self.copy_inline(xfer, batch, slot, &mut skip, OpKind::Read)?;
        }
        self.ring_mut()?.consume(slot);
        Ok(skip)
    }

    /// Posts `xfer` (`may_post`) into the next slot and leaves it in flight, completing (into
    /// `done`) the answered slots before it; waits at most `SUBMIT_SPIN` for a slot.
    /// `Ok(None)`: nothing was started (no slot came free, or the transfer needs more than one
    /// slot or mixes inline and leased ops).
    fn post(&mut self, xfer: &XferState, done: &mut Done) -> Result<Option<Started>> {
        let Some(kind) = self.direct_kind(xfer) else {
            return Ok(None);
        };
        if !self.slot_ready(done)? {
            return Ok(None);
        }
        self.start_slot(xfer, kind).map(Some)
    }

    /// Whether the next slot is free, after completing (into `done`) the answered slots
    /// before it for at most `SUBMIT_SPIN`.
    fn slot_ready(&mut self, done: &mut Done) -> Result<bool> {
        let mut err = None;
        ring::spin_until(SUBMIT_SPIN, || {
            if let Err(e) = self.reap(false, done) {
                err = Some(e);
                return true;
            }
            self.inflight.is_empty() || self.ring.as_ref().is_some_and(RingClient::next_is_free)
        });
        if let Some(e) = err {
            return Err(e);
        }
        Ok(self.ring.as_ref().is_some_and(RingClient::next_is_free))
    }

    /// Posts a one-op inline transfer (a write of up to `STAGE_MAX` bytes, or a read of up to
    /// `INLINE_MAX`) before its state is built (`NewTransfer`): the slot is on its way to the
    /// target while the caller builds the state and hands it to `in_flight_early`. `None`: not
    /// such a transfer, or no slot free now (the caller takes the usual path).
    pub(super) fn post_early(
        &mut self,
        n: &NewTransfer<'_>,
        done: &mut Done,
    ) -> Result<Option<Early>> {
        let Some(op) = n.t.op_refs().next().filter(|_| n.t.ops.len() == 1) else {
            return Ok(None);
        };
        if !posts_early(n)
            || self.ring.is_none()
            || self.broken.is_some()
            || !self.slot_ready(done)?
        {
            return Ok(None);
        }
        let staged = self.stage_op(op);
        let (slot, skip, failed) = self.post_one(op, n.id, staged)?;
        Ok(Some(Early {
            started: Started {
                slot,
                kind: KIND_INLINE,
                skip,
            },
            failed,
        }))
    }

    /// The state of a transfer `post_early` posted joins the transfers in flight, left to
    /// whoever waits (its op failed first if its local copy did).
    pub(super) fn in_flight_early(&mut self, xfer: Arc<XferState>, e: Early) {
        if let Some(err) = e.failed {
            xfer.chunk_done(0, 0, Err(err));
        }
        xfer.set_driven();
        self.in_flight(xfer, e.started);
    }

    /// `post_early` broke the connection: the new transfer fails with `e`, as does everything
    /// in flight.
    pub(super) fn fail_early(&mut self, xfer: Arc<XferState>, e: Error, done: &mut Done) {
        xfer.fail_pending(&e);
        done.push(xfer);
        self.break_with(e, done);
    }

    /// The one slot `xfer` (`may_post`) goes in, if it fits one: inline (`posts_inline`), or
    /// `BEGIN` when every op is leased (`ring_class`: to mapped regions) and the ops fit one
    /// slot's table.
    fn direct_kind(&self, xfer: &XferState) -> Option<u32> {
        if posts_inline(xfer) {
            return Some(KIND_INLINE);
        }
        if self.ring.is_none() || xfer.ops.len() > MAX_RING_OPS {
            return None;
        }
        let big = xfer.ops.iter().map(|o| o.len).sum::<u64>() > INLINE_MAX;
        // Consecutive ops on the same remote region share its verdict (one map look-up).
        (0..xfer.ops.len())
            .all(|i| {
                (i > 0
                    && xfer.path(i) == xfer.path(i - 1)
                    && Arc::ptr_eq(xfer.op(i).remote, xfer.op(i - 1).remote))
                    || ring_class(self, xfer, &xfer.path(i), i, big) == Some(KIND_BEGIN)
            })
            .then_some(KIND_BEGIN)
    }

    /// Posts `xfer` into the next slot as `kind` (`direct_kind`), waiting for it to be free;
    /// `in_flight` then keeps it.
    fn start_slot(&mut self, xfer: &XferState, kind: u32) -> Result<Started> {
        // `may_post`: at most MAX_RING_OPS ops.
        let batch = &ring::IDENTITY[..xfer.ops.len().min(MAX_RING_OPS)];
        let (slot, skip) = if kind == KIND_BEGIN {
            let rc = self.ring_mut()?;
            let slot = rc.prepare(ring_ops_iter(xfer, batch))?;
            rc.post_slot(slot, KIND_BEGIN, xfer.id, batch.len());
            (slot, Skip::default())
        } else {
            self.post_inline(xfer, batch)?
        };
        Ok(Started { slot, kind, skip })
    }

    /// A posted slot joins the transfers in flight (the caller's reference moves in).
    fn in_flight(&mut self, xfer: Arc<XferState>, s: Started) {
        self.inflight.push_back(Inflight {
            xfer,
            slot: s.slot,
            kind: s.kind,
            skip: s.skip,
        });
        self.mark_front();
    }

    /// An answered `BEGIN` slot: the target's verdicts, the copies through the mappings, `END`
    /// (the target then drops the leases), the ops completed.
    fn finish_begin(
        &mut self,
        xfer: &XferState,
        batch: &[usize],
        slot: usize,
        mut skip: Skip,
    ) -> Result<()> {
        self.take_result(xfer, batch, slot, &mut skip)?;
        let (done, fatal) = self.copy_runs(xfer, batch, &skip);
        self.ring_mut()?.publish(slot, END);
        if let Some(e) = fatal {
            return Err(e);
        }
        xfer.ops_done(done);
        Ok(())
    }

    /// The submitting thread's `post`: `None` when the transfer was taken (posted and left to
    /// whoever waits, or failed into `done` on a broken connection), else the transfer back.
    pub(super) fn post_guarded(
        &mut self,
        xfer: Arc<XferState>,
        done: &mut Done,
    ) -> Option<Arc<XferState>> {
        let r = match &self.broken {
            Some(e) => Err(e.clone()),
            None => self.post(&xfer, done),
        };
        match r {
            Ok(Some(s)) => {
                xfer.set_driven();
                self.in_flight(xfer, s);
                None
            }
            Ok(None) => Some(xfer),
            Err(e) => {
                xfer.fail_pending(&e);
                done.push(xfer);
                self.break_with(e, done);
                None
            }
        }
    }

    /// The worker thread's group of queued small transfers (each `posts_inline`): every slot
    /// posted before the first answer is awaited, then all completed (each into `done`, once).
    /// True when the group broke the connection (its unfinished ops fail).
    pub(super) fn pipeline_guarded(&mut self, group: &[Arc<XferState>], done: &mut Done) -> bool {
        for (k, x) in group.iter().enumerate() {
            let r = match &self.broken {
                Some(e) => Err(e.clone()),
                None => self
                    .start_slot(x, KIND_INLINE)
                    .map(|s| self.in_flight(Arc::clone(x), s)),
            };
            if let Err(e) = r {
                for x in &group[k..] {
                    x.fail_pending(&e);
                    done.push(Arc::clone(x));
                }
                let fresh = self.broken.is_none();
                self.break_with(e, done);
                return fresh;
            }
        }
        self.reap_guarded(true, done)
    }

    /// Completes the transfers in flight, oldest first, into `done` (the caller finishes them
    /// once it let go of the worker): with `block` all of them, each waited for (with the
    /// liveness checks of every ring wait), else those answered by now.
    pub(super) fn reap(&mut self, block: bool, done: &mut Done) -> Result<()> {
        while let Some(slot) = self.inflight.front().map(|f| f.slot) {
            let rc = self.ring_mut()?;
            if block {
                rc.wait_state(slot, DONE)?;
            } else if rc.ring.state(slot).load(Ordering::Acquire) != DONE {
                break;
            }
            let Some(f) = self.inflight.pop_front() else {
                break;
            };
            self.mark_front();
            let batch = &ring::IDENTITY[..f.xfer.ops.len().min(MAX_RING_OPS)];
            // An inline slot in flight holds its whole transfer (`may_post`, `pipeline_guarded`):
            // its ops complete with the transfer's end.
            let r = if f.kind == KIND_BEGIN {
                self.finish_begin(&f.xfer, batch, f.slot, f.skip)
                    .map(|()| None)
            } else {
                self.finish_inline(&f.xfer, batch, f.slot, f.skip).map(Some)
            };
            match r {
                Ok(Some(skip)) => done.complete(f.xfer, skip),
                Ok(None) => done.push(f.xfer),
                Err(e) => {
                    f.xfer.fail_pending(&e);
                    done.push(f.xfer);
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// `reap`, and when it breaks the connection: every transfer in flight failed (into
    /// `done`) and the connection marked broken. True when it broke the connection.
    pub(super) fn reap_guarded(&mut self, block: bool, done: &mut Done) -> bool {
        if let Some(e) = self.broken.clone() {
            self.break_with(e, done);
            return false;
        }
        let Err(e) = self.reap(block, done) else {
            return false;
        };
        self.break_with(e, done);
        true
    }

    /// The connection broke with `e` (or had broken): every transfer in flight fails with it
    /// (into `done`), and the first error stays the connection's.
    fn break_with(&mut self, e: Error, done: &mut Done) {
        for f in self.inflight.drain(..) {
            f.xfer.fail_pending(&e);
            done.push(f.xfer);
        }
        self.mark_front();
        self.broken.get_or_insert(e);
    }

    /// Publishes the oldest slot in flight for `Driver::poll`.
    fn mark_front(&self) {
        if let Some(rc) = &self.ring {
            let f = self.inflight.front().map_or(NO_SLOT, |f| f.slot as u32);
            rc.front.store(f, Ordering::Release);
        }
    }
}
