//! Standing leases: `cma` copies without a round trip to the target.
//!
//! A `cma` transfer otherwise asks the target for leases on every transfer (a ring `BEGIN`, the
//! target's thread checks and leases, answers, and drops the leases at `END`), so a 4 KiB write
//! costs a wake-up of the target's thread, which on a loaded machine is most of its time. Where
//! the connection has a ring, the target instead takes one lease on a borrowed region when the
//! initiator resolves it (`ShmCmaRegion`) and keeps it for the connection, in an entry of the
//! ring header (`ring::Standing`); the initiator copies under it (`Worker::copy_standing`)
//! with no message at all. The target gives the lease up (`Revocable`) before a user lease on
//! the region that it would exclude, before the region retires, and when the connection ends:
//! it closes the entry, waits for the copies under way (the initiator's `busy` count), then
//! drops the lease. A closed entry stays closed; that region's transfers then lease per
//! transfer as before.
//!
//! What the standing lease protects is what the per-transfer lease did: the region's memory
//! stays registered while a copy runs. The peer's access itself is the `cma` grant (its
//! process may write this one's memory through the kernel), which no lease narrows.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::worker::Worker;
use crate::error::Result;
use crate::region::RegionKey;
use crate::region::{Lease, LeaseKind, RegionInner, Revocable};
use crate::routing::plan::Path;
use crate::shm_ring::{Ring, IDENTITY, MAX_RING_OPS, STANDING_CLOSED, STANDING_MAX, STANDING_OPEN};
use crate::transfer::{OpKind, XferState};

/// Target side: the lease behind one open entry of the ring header.
pub(super) struct StandingLease {
    ring: Arc<Ring>,
    k: usize,
    lease: Mutex<Option<Lease>>,
    /// How long a revoke waits for the peer's copies under way.
    wait: Duration,
}

impl StandingLease {
    /// Opens entry `k` of `ring` for `region` (`writable`: the peer may write it) and registers
    /// it with the region; `None` when the lease cannot be had now (a user lease, retirement)
    /// or the table is full.
    pub(super) fn open(
        ring: &Arc<Ring>,
        k: usize,
        region: &Arc<RegionInner>,
        writable: bool,
        wait: Duration,
    ) -> Option<Arc<StandingLease>> {
        if k >= STANDING_MAX {
            return None;
        }
        let kind = if writable {
            LeaseKind::Sink
        } else {
            LeaseKind::Source
        };
        let lease = region.lease(kind, Duration::ZERO).ok()?;
        let s = Arc::new(StandingLease {
            ring: Arc::clone(ring),
            k,
            lease: Mutex::new(Some(lease)),
            wait,
        });
        let e = ring.standing(k);
        e.set_region(region.id);
        e.state.store(STANDING_OPEN, Ordering::SeqCst);
        let weak: std::sync::Weak<dyn Revocable> = Arc::downgrade(&s) as _;
        region.add_standing(weak);
        Some(s)
    }
}

/// Opens the next entry of `ring` for `region` into `held` (the connection's standing leases),
/// where the lease can be had now and the table has room.
pub(super) fn open(
    held: &mut Vec<Arc<StandingLease>>,
    ring: &Arc<Ring>,
    region: &Arc<RegionInner>,
    writable: bool,
    wait: Duration,
) {
    if let Some(s) = StandingLease::open(ring, held.len(), region, writable, wait) {
        held.push(s);
    }
}

impl Revocable for StandingLease {
    fn revoke(&self) {
        let mut lease = self.lease.lock().unwrap_or_else(|p| p.into_inner());
        if lease.is_none() {
            return;
        }
        let e = self.ring.standing(self.k);
        e.state.store(STANDING_CLOSED, Ordering::SeqCst);
        // The peer's copies under way end within a system call; a peer stopped or gone with
        // the count raised is waited for only this long (its process can no longer copy once
        // it is gone, and a stopped one is past its call).
        let deadline = Instant::now() + self.wait;
        crate::spin::spin_until(crate::spin::YIELD_AFTER, || {
            e.busy.load(Ordering::SeqCst) == 0
        });
        while e.busy.load(Ordering::SeqCst) != 0 {
            if Instant::now() >= deadline {
                log::warn!(
                    "gdx: a peer kept a standing lease's copy count up past {:?}; releasing it",
                    self.wait
                );
                break;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        lease.take();
    }
}

impl Drop for StandingLease {
    fn drop(&mut self) {
        self.revoke();
    }
}

impl Worker {
    /// The open standing entry the target made for region `id` when it was resolved, if any.
    pub(super) fn find_standing(&self, id: u64) -> Option<usize> {
        let rc = self.ring.as_ref()?;
        (0..STANDING_MAX).find(|&k| {
            let e = rc.ring.standing(k);
            e.state.load(Ordering::Acquire) == STANDING_OPEN && e.region() == id
        })
    }

    /// Whether the one op of `n` (`ring::posts_early`) is `cma` to a region with an open
    /// standing entry.
    pub(super) fn standing_for(&mut self, n: &crate::transfer::NewTransfer<'_>) -> bool {
        let (Some(op), Some(plan)) = (n.t.op_refs().next(), n.plans.only()) else {
            return false;
        };
        plan.path == Path::Cma
            && self
                .standing_entry(op.remote.id, op.remote.key, op.kind == OpKind::Write)
                .is_some()
    }

    /// The open standing entry of the peer's region `id`, resolving the region first (once:
    /// small transfers go inline and never needed it resolved). `None`: none, or the
    /// resolution failed (the transfer's usual path then reports why).
    fn standing_entry(&mut self, id: u64, key: RegionKey, write: bool) -> Option<usize> {
        if self.broken.is_some() || self.ring.is_none() {
            return None;
        }
        if !self.cma_regions.contains_key(&id) && self.resolve_cma(id, key, write).is_err() {
            return None;
        }
        self.cma_regions.get(&id)?.standing
    }

    /// Copies `xfer` now, under the target's standing leases, when every op is `cma` to a
    /// region with an open entry and nothing is in flight before it: no ring slot, no message
    /// (but the notification). `None`: not taken; the caller runs it as usual.
    pub(super) fn copy_standing(&mut self, xfer: &XferState) -> Option<Result<()>> {
        if self.broken.is_some() || !self.inflight.is_empty() || xfer.ops.is_empty() {
            return None;
        }
        let mut entries: smallvec::SmallVec<[(u64, usize); 4]> = smallvec::SmallVec::new();
        for i in 0..xfer.ops.len() {
            if xfer.path(i) != Path::Cma {
                return None;
            }
            let op = xfer.op(i);
            let id = op.remote.id;
            if entries.iter().any(|e| e.0 == id) {
                continue;
            }
            let k = self.standing_entry(id, op.remote.key, op.kind == OpKind::Write)?;
            entries.push((id, k));
        }
        let rc = self.ring.as_ref()?;
        let ring = Arc::clone(&rc.ring);
        for (j, &(id, k)) in entries.iter().enumerate() {
            if !ring.standing(k).enter(id) {
                // Closed by the target: this region leases per transfer from now on (`enter`
                // counted this entry too).
                for &(_, k) in &entries[..=j] {
                    ring.standing(k).leave();
                }
                if let Some(r) = self.cma_regions.get_mut(&id) {
                    r.standing = None;
                }
                return None;
            }
        }
        // Every op, as indices: the shared table where it is long enough (a ring-sized
        // transfer), built only for a larger one (the worker's).
        let n = xfer.ops.len();
        let built: Vec<usize>;
        let all: &[usize] = if n <= MAX_RING_OPS {
            &IDENTITY[..n]
        } else {
            built = (0..n).collect();
            &built
        };
        let (done, fatal) = self.copy_cma(xfer, all);
        for &(_, k) in &entries {
            ring.standing(k).leave();
        }
        xfer.note_standing(done.len());
        xfer.ops_done(done);
        if let Some(e) = fatal {
            return Some(Err(e));
        }
        if let Some(n) = xfer.notify.clone().filter(|_| !xfer.has_failed()) {
            if let Err(e) = self.send_notify(xfer, n) {
                return Some(Err(e));
            }
        }
        Some(Ok(()))
    }
}
