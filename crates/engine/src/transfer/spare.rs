//! Spare transfer states: a fresh transfer's state, once it ended and its last handle is
//! dropped, is kept (emptied) for the peer's next fresh submit, which fills it in place instead
//! of allocating, copying and later freeing ~500 bytes (`Peer::submit` at the latency floor:
//! the state is built after the post, and a build longer than the peer's answer is latency).
//!
//! Ownership: the spares sit in the peer's [`XferShared`], and each spare holds that
//! `XferShared` (every state does), so the peer breaks the cycle when it goes
//! ([`Spares::close`], from `PeerInner`'s drop): the spares are dropped, and a state whose
//! handle drops after that is freed as before. A spare holds no region: its ops, regions, plans
//! and notification are dropped when it is put back, so a region's memory is never kept alive
//! by a transfer that ended.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{Clock, NewTransfer, OpState, Plans, Regions, XferState};

/// Most spares per peer: a window of transfers in flight up to the shm ring's slots.
const MOST: usize = 128;

/// The spare states of one peer.
#[derive(Debug, Default)]
pub(crate) struct Spares(Mutex<SpareList>);

#[derive(Debug, Default)]
struct SpareList {
    states: Vec<Arc<XferState>>,
    /// The peer is gone: nothing is kept any more.
    closed: bool,
}

impl Spares {
    fn list(&self) -> std::sync::MutexGuard<'_, SpareList> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A spare, if there is one (nothing else holds it).
    fn take(&self) -> Option<Arc<XferState>> {
        self.list().states.pop()
    }

    /// Drops the spares and keeps none from now on (the peer is gone).
    pub(crate) fn close(&self) {
        let states = {
            let mut l = self.list();
            l.closed = true;
            std::mem::take(&mut l.states)
        };
        drop(states);
    }
}

impl NewTransfer<'_> {
    /// The state, built into one of the peer's spares when it has one, else allocated.
    pub(crate) fn into_state(self) -> Arc<XferState> {
        if let Some(mut s) = self.shared.spares.take() {
            // A spare is held by nothing else; were it not, the state is built anew.
            if let Some(st) = Arc::get_mut(&mut s) {
                st.refill(self);
                return s;
            }
        }
        Arc::new(self.build())
    }
}

impl XferState {
    /// Keeps `state`, whose last handle is being dropped, as a spare of its peer when nothing
    /// else holds it and it ended; otherwise it is simply dropped by its caller.
    pub(crate) fn put_back(state: &mut Arc<XferState>) {
        if !state.ended() {
            return;
        }
        let Some(st) = Arc::get_mut(state) else {
            return;
        };
        // Emptied before the list is looked at: a state the list has no room for is freed
        // by the caller right after, emptied or not.
        st.empty();
        let spare = Arc::clone(state);
        let mut l = state.shared.spares.list();
        if !l.closed && l.states.len() < MOST {
            l.states.push(spare);
        }
    }

    /// Lets go of what the transfer referenced (its regions, plans and notification) and of
    /// any heap room its op lists took (a spare of a thousand-op batch would keep ~50 KB).
    fn empty(&mut self) {
        self.ops = Default::default();
        self.regions = Regions::default();
        self.plans = Plans::default();
        self.notify = None;
        let p = self.progress.get_mut().unwrap_or_else(|e| e.into_inner());
        // Its heap room let go (a transfer that failed many ops), without a drop when there
        // is none, as for nearly every transfer.
        if p.errors.capacity() != 0 {
            p.errors = Vec::new();
        }
        p.first_error = None;
        if p.state.spilled() {
            p.state = Default::default();
        }
        if p.pending_chunks.spilled() {
            p.pending_chunks = Default::default();
        }
    }

    /// Becomes the state of `n` (a spare of `n`'s peer, held by nothing else).
    fn refill(&mut self, n: NewTransfer<'_>) {
        let ops = n.t.ops.len();
        debug_assert_eq!(n.plans.len(), ops, "one plan per op");
        if !Arc::ptr_eq(&self.shared, n.shared) {
            self.shared = Arc::clone(n.shared);
        }
        let timeout = n.t.timeout.unwrap_or(n.timeout);
        // Swapped, not assigned: the spare's emptied lists go back into the caller's
        // transfer, which drops them, and nothing is dropped here.
        std::mem::swap(&mut self.ops, &mut n.t.ops);
        std::mem::swap(&mut self.regions, &mut n.t.regions);
        std::mem::swap(&mut self.notify, &mut n.t.notify);
        std::mem::swap(&mut self.plans, n.plans);
        self.reset(n.id, n.started, timeout, ops);
    }

    /// The start of a transfer of `ops` ops: every op pending, nothing done, nothing ended.
    pub(super) fn reset(&mut self, id: u64, started: Clock, timeout: Duration, ops: usize) {
        self.id = id;
        self.started = started;
        // A timeout too long for the clock (`Duration::MAX` for "never") saturates.
        self.deadline = started.plus(timeout);
        self.timeout = timeout;
        *self.bytes_done.get_mut() = 0;
        for b in self.rail_bytes.iter_mut().chain(&mut self.batched) {
            *b.get_mut() = 0;
        }
        *self.ended.get_mut() = false;
        *self.ok.get_mut() = false;
        *self.elapsed_ns.get_mut() = 0;
        *self.driven.get_mut() = false;
        *self.cancelled.get_mut() = false;
        let p = self.progress.get_mut().unwrap_or_else(|e| e.into_inner());
        refill_with(&mut p.state, ops, OpState::PENDING);
        p.errors.clear();
        refill_with(&mut p.pending_chunks, ops, 1);
        p.first_error = None;
        p.done = None;
        p.waiters = 0;
    }
}

/// Makes `v` `n` copies of `x`. A spare mostly serves a transfer of as many ops as its last
/// (one, at the latency floor): the entries are then overwritten in place, with none of a
/// resize's capacity checks and per-element pushes.
fn refill_with<T: Copy, const N: usize>(v: &mut smallvec::SmallVec<[T; N]>, n: usize, x: T)
where
    [T; N]: smallvec::Array<Item = T>,
{
    if v.len() == n {
        v.fill(x);
    } else {
        v.clear();
        v.extend(std::iter::repeat_n(x, n));
    }
}

#[cfg(test)]
#[test]
fn refill_with_makes_n_copies_whatever_the_length_was() {
    let mut v: smallvec::SmallVec<[u32; 4]> = smallvec::smallvec![7, 7, 7];
    for n in [3, 1, 0, 6, 2, 2] {
        refill_with(&mut v, n, n as u32);
        assert_eq!(&v[..], &vec![n as u32; n][..]);
    }
}

/// Makes a prepared transfer's state ready for its next post: a new id and deadline, every op
/// pending again. In place when nothing else holds the state; else (the last post is still
/// running, or its handle is held) a state of its own for this post, an allocation, not a
/// different path.
pub(crate) fn rearm(state: &mut Arc<XferState>, timeout: Duration) {
    let (id, started) = (super::next_id(), Clock::now());
    match Arc::get_mut(state) {
        Some(s) => {
            let n = s.ops.len();
            s.reset(id, started, timeout, n);
        }
        None => *state = Arc::new(state.repost(id, started, timeout)),
    }
}

impl XferState {
    /// A fresh state for the same ops (when this one is still in use).
    fn repost(&self, id: u64, started: Clock, timeout: Duration) -> XferState {
        let n = self.ops.len();
        XferState {
            id,
            ops: self.ops.iter().map(|o| o.copy_with_table()).collect(),
            regions: self.regions.clone(),
            notify: self.notify.clone(),
            plans: self.plans.clone(),
            started,
            deadline: started.plus(timeout),
            timeout,
            bytes_done: Default::default(),
            ended: Default::default(),
            ok: Default::default(),
            elapsed_ns: Default::default(),
            progress: std::sync::Mutex::new(super::Progress::new(n)),
            cv: Default::default(),
            shared: Arc::clone(&self.shared),
            driven: Default::default(),
            rail_bytes: Default::default(),
            batched: Default::default(),
            cancelled: Default::default(),
        }
    }
}
