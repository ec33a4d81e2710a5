//! The initiator's side of the shm control ring (layout and states: `shm_ring.rs`).
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
//! Inline and short requests are written and read back in `ring_inline.rs`, leased ones
//! in `ring_begin.rs`.
//!
//! Liveness (`ring_client.rs`): a waiter spins briefly, then sleeps on the slot's futex in
//! short naps, and between naps checks the shm socket for hang-up (the target closes it when it
//! dies or its ring thread gives up) and the I/O timeout; either fails the transfer's
//! unconfirmed ops with `PeerLost` and the connection stays failed.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::ring_client::NO_SLOT;
pub(super) use super::ring_client::{Done, Driver};
use super::worker::Worker;
pub(super) use super::worker::{Inflight, RingClient, Skip};
use crate::error::{Error, Result};
use crate::routing::plan::Path;
use crate::shm_ring::{self, DONE, INLINE_MAX, KIND_BEGIN, KIND_INLINE, MAX_RING_OPS};
use crate::transfer::{NewTransfer, OpKind, OpRef, XferState};
use crate::wire::ShmOp;

/// Whether `xfer` may be posted by the submitting thread and left in flight (`Worker::post`
/// decides: one slot, every op inline or every op leased with `BEGIN`): at most one slot's ops,
/// every op over shm, no notification (that is a socket round trip after the bytes).
pub(super) fn may_post(xfer: &XferState) -> bool {
    xfer.ops.len() <= MAX_RING_OPS
        && xfer.notify.is_none()
        && xfer
            .paths()
            .all(|p| matches!(p, Path::Shm | Path::ShmStaged | Path::Cma))
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
    fits && n.t.notify.is_none() && matches!(plan.path, Path::Shm | Path::ShmStaged | Path::Cma)
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
pub(super) const STAGE_MAX: usize = 64;

/// Most queued small transfers the worker posts before it awaits the first answer.
pub(super) const PIPELINE: usize = shm_ring::SLOTS / 2;

/// A slot `post_early` posted for a transfer whose state is not built yet.
#[derive(Debug)]
pub(super) struct Early {
    started: Started,
    /// The op's local copy failed (the op was withdrawn from the slot).
    failed: Option<Error>,
}

/// A slot `start_slot` posted, before it joins the transfers in flight.
#[derive(Debug)]
pub(super) struct Started {
    pub(super) slot: usize,
    pub(super) kind: u32,
    pub(super) skip: Skip,
    /// Ops per slot: a `BEGIN` transfer may be cut into several slots posted back to back
    /// (`start_begin`), each holding `chunk` ops (the last the rest).
    pub(super) chunk: usize,
}

/// Whether every op of `xfer` travels inline (small, and to a path the ring carries inline).
fn all_inline(xfer: &XferState) -> bool {
    xfer.paths()
        .zip(&xfer.ops)
        .all(|(p, op)| op.len <= INLINE_MAX && matches!(p, Path::Shm | Path::ShmStaged | Path::Cma))
}

/// Whether op `i` can go through the ring (inline, or leased and copied through a mapping).
/// A transfer of more than `INLINE_MAX` bytes moves its small ops to mapped regions with `BEGIN`
/// too: one copy instead of two, and one lease per region run instead of one per op.
pub(super) fn ring_class(
    w: &Worker,
    xfer: &XferState,
    plan: &Path,
    i: usize,
    big: bool,
) -> Option<u32> {
    let op = xfer.op(i);
    // A borrowed region the `cma` path reaches is leased the same way, and copied by the
    // kernel between the processes.
    let mapped = match plan {
        Path::Shm => w.maps.contains_key(&op.remote.id),
        Path::Cma => w.cma_ready(xfer, i),
        _ => false,
    };
    if mapped && (big || op.len > INLINE_MAX) {
        return Some(KIND_BEGIN);
    }
    // A peer's GPU memory this connection has mapped already: the target leases it through
    // the ring (`BEGIN`) while this side copies through the mapping, as for mapped host memory;
    // a first transfer maps it over the socket.
    if *plan == Path::Ipc && w.imports.contains_key(&op.remote.id) {
        return Some(KIND_BEGIN);
    }
    if op.len <= INLINE_MAX && matches!(plan, Path::Shm | Path::ShmStaged | Path::Cma) {
        return Some(KIND_INLINE);
    }
    None
}

/// The op table entries (ring or `ShmBegin`) for `batch`.
pub(super) fn ring_ops(xfer: &XferState, batch: &[usize]) -> Vec<ShmOp> {
    ring_ops_iter(xfer, batch).collect()
}

/// `ring_ops`, written straight into a slot (no list built).
pub(super) fn ring_ops_iter<'a>(
    xfer: &'a XferState,
    batch: &'a [usize],
) -> impl ExactSizeIterator<Item = ShmOp> + 'a {
    batch.iter().map(|&i| shm_op(xfer.op(i)))
}

/// An op's entry in a slot's op table.
pub(super) fn shm_op(op: OpRef<'_>) -> ShmOp {
    ShmOp {
        write: op.kind == OpKind::Write,
        region: op.remote.id,
        key: op.remote.key,
        offset: op.remote_offset,
        len: op.len,
    }
}

impl Worker {
    pub(super) fn ring_mut(&mut self) -> Result<&mut RingClient> {
        self.ring
            .as_mut()
            .ok_or_else(|| Error::Protocol("no shm ring".into()))
    }

    /// Posts `xfer` (`may_post`) into the next slot and leaves it in flight, completing (into
    /// `done`) the answered slots before it when it must (`slot_ready`); waits at most
    /// `spin::SHM_SUBMIT_SPIN` for a slot.
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
    /// before it for at most `spin::SHM_SUBMIT_SPIN` (at once when it is free and the oldest in
    /// flight is inline).
    fn slot_ready(&mut self, done: &mut Done) -> Result<bool> {
        // With the next slot free, answered inline slots are left to whoever waits: the target
        // has moved their bytes, and reading the oldest one's state here would fetch a line the
        // target is writing, once per post of a window. A leased (`BEGIN`) one is completed now:
        // its bytes move only when someone completes it, and the target holds its leases until.
        let leased = self.inflight.front().is_some_and(|f| f.kind == KIND_BEGIN);
        if !leased && self.ring.as_ref().is_some_and(RingClient::next_is_free) {
            return Ok(true);
        }
        let mut err = None;
        shm_ring::spin_until(crate::spin::SHM_SUBMIT_SPIN, || {
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
    /// target while the caller builds the state and hands it to `in_flight_early`. `n` is
    /// `posts_early` (the caller checks that before it takes the worker lock). `None`: no ring,
    /// or no slot free now (the caller takes the usual path).
    pub(super) fn post_early(
        &mut self,
        n: &NewTransfer<'_>,
        done: &mut Done,
    ) -> Result<Option<Early>> {
        debug_assert!(posts_early(n));
        let Some(op) = n.t.op_refs().next() else {
            return Ok(None);
        };
        if self.ring.is_none() || self.broken.is_some() || !self.slot_ready(done)? {
            return Ok(None);
        }
        let staged = self.stage_op(op);
        let (slot, skip, failed, kind) = self.post_one(op, n.id, staged)?;
        Ok(Some(Early {
            started: Started {
                slot,
                kind,
                skip,
                chunk: 1,
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
        let batch = &shm_ring::IDENTITY[..xfer.ops.len().min(MAX_RING_OPS)];
        if kind == KIND_BEGIN {
            return self.start_begin(xfer, batch.len());
        }
        let (slot, skip, kind) = self.post_inline(xfer, batch)?;
        Ok(Started {
            slot,
            kind,
            skip,
            chunk: batch.len(),
        })
    }

    /// A posted slot joins the transfers in flight (the caller's reference moves in).
    fn in_flight(&mut self, xfer: Arc<XferState>, s: Started) {
        let n = xfer.ops.len().min(MAX_RING_OPS);
        self.inflight.push_back(Inflight {
            xfer,
            slot: s.slot,
            kind: s.kind,
            skip: s.skip,
            ops: 0..s.chunk.min(n),
            chunk: s.chunk.max(1),
        });
        self.mark_front();
    }

    /// The submitting thread's `post`: `None` when the transfer was taken (posted and left to
    /// whoever waits, or failed into `done` on a broken connection), else the transfer back.
    pub(super) fn post_guarded(
        &mut self,
        xfer: Arc<XferState>,
        done: &mut Done,
    ) -> Option<Arc<XferState>> {
        // Under the target's standing leases the copies run here and now (`standing.rs`).
        match self.copy_standing(&xfer) {
            Some(Ok(())) => {
                done.push(xfer);
                return None;
            }
            Some(Err(e)) => {
                xfer.fail_pending(&e);
                done.push(xfer);
                self.break_with(e, done);
                return None;
            }
            None => {}
        }
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
        while let Some(f) = self.inflight.front() {
            let slot = f.slot;
            let rc = self
                .ring
                .as_ref()
                .ok_or_else(|| Error::Protocol("no shm ring".into()))?;
            if block {
                rc.wait_state(slot, DONE, Some(&f.xfer))?;
            } else if rc.ring.state(slot).load(Ordering::Acquire) != DONE {
                break;
            }
            let Some(mut f) = self.inflight.pop_front() else {
                break;
            };
            self.mark_front();
            let batch = &shm_ring::IDENTITY[f.ops.clone()];
            // An inline slot in flight holds its whole transfer (`may_post`, `pipeline_guarded`):
            // its ops complete with the transfer's end. A `BEGIN` transfer may go on in the
            // slots after this one (`start_begin`): it ends with its last.
            let skip = std::mem::take(&mut f.skip);
            let r = if f.kind == KIND_BEGIN {
                self.finish_begin(&f.xfer, batch, f.slot, skip)
                    .map(|()| None)
            } else {
                self.finish_inline(&f.xfer, batch, (f.slot, f.kind), skip)
                    .map(Some)
            };
            let n = f.xfer.ops.len().min(MAX_RING_OPS);
            match r {
                Ok(None) if f.ops.end < n => {
                    f.slot = (f.slot + 1) % shm_ring::SLOTS;
                    f.ops = f.ops.end..(f.ops.end + f.chunk).min(n);
                    self.inflight.push_front(f);
                    self.mark_front();
                }
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
