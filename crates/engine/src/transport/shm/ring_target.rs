//! The target's side of the shm control ring: one thread per attached ring, started by
//! `ShmRing` on an authenticated shm connection and stopped (leases dropped) when that connection
//! ends.
//!
//! Each posted request goes through the same check as every op (`Registry::check_remote`: region,
//! key, access, bounds, lease). Inline ops are copied between the slot and the region under a
//! lease held for the copy; `BEGIN` ops keep their leases until the initiator marks the slot
//! `END`, so a region is never freed under the initiator's copy. A request that breaks the ring
//! protocol shuts the connection down.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::conn::Sock;
use crate::error::{Error, Result};
use crate::gpu::{copy_span, Dir};
use crate::region::{Lease, RegionCache};
use crate::shm_ring::{self, Ring, DONE, END, FREE, KIND_BEGIN, POSTED, SLOTS};
use crate::target_stats::Counters;
use crate::transport::AgentView;

/// How long the ring thread spins after its last request before it sleeps on the doorbell.
const SPIN: Duration = shm_ring::TARGET_SPIN;
/// Longest sleep between checks of the stop flag.
const SLEEP: Duration = Duration::from_millis(100);
/// Requests served between two updates of the last-active stamp while the ring stays busy.
const STAMP_EVERY: u32 = 256;

/// A running ring thread; dropping it stops the thread and releases its leases.
#[derive(Debug)]
pub(crate) struct RingServer {
    stop: Arc<AtomicBool>,
    ring: Arc<Ring>,
    base: Instant,
    last_active_ms: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl RingServer {
    /// The ring it serves (the target writes the standing-lease entries into its header).
    pub(crate) fn ring(&self) -> &Arc<Ring> {
        &self.ring
    }

    pub(crate) fn start<S: AgentView>(
        agent: Arc<S>,
        ring: Ring,
        sock: Sock,
        served: Arc<Counters>,
    ) -> Result<RingServer> {
        let ring = Arc::new(ring);
        let stop = Arc::new(AtomicBool::new(false));
        let base = Instant::now();
        let last = Arc::new(AtomicU64::new(0));
        let (r, s, l) = (Arc::clone(&ring), Arc::clone(&stop), Arc::clone(&last));
        let thread = std::thread::Builder::new()
            .name("gdx-shm-ring".into())
            .spawn(move || {
                if let Err(e) = serve(&*agent, &r, &s, base, &l, &served) {
                    log::warn!("shm ring closed: {e}");
                    sock.shutdown();
                }
            })
            .map_err(|e| Error::os("spawn", e))?;
        Ok(RingServer {
            stop,
            ring,
            base,
            last_active_ms: last,
            thread: Some(thread),
        })
    }

    /// Whether the ring carried a request within `d` (the socket may then be idle).
    pub(crate) fn active_within(&self, d: Duration) -> bool {
        let now = self.base.elapsed().as_millis() as u64;
        now.saturating_sub(self.last_active_ms.load(Ordering::Relaxed)) < d.as_millis() as u64
    }
}

impl Drop for RingServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.ring.doorbell().fetch_add(1, Ordering::SeqCst);
        shm_ring::futex_wake(self.ring.doorbell());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve<S: AgentView>(
    agent: &S,
    ring: &Ring,
    stop: &AtomicBool,
    base: Instant,
    last: &AtomicU64,
    served: &Counters,
) -> Result<()> {
    let max = agent.config().limits.max_leases_per_conn;
    let mut next: u32 = 0;
    let mut held: Vec<Option<Vec<Lease>>> = (0..SLOTS).map(|_| None).collect();
    let mut held_count = 0usize;
    // Slots of `held` in use (`BEGIN` answered, `END` not seen yet).
    let mut held_slots = 0usize;
    // When the ring went idle (`None` while it carries requests).
    let mut idle_since: Option<Instant> = None;
    // Late yields in a row, and a move off a core that stays shared where that is allowed
    // (`spin::CoreWatch`).
    let mut core = crate::spin::CoreWatch::default();
    let mut served_since_stamp = 0u32;
    let mut req = shm_ring::Request::default();
    let mut regions = RegionCache::default();
    while !stop.load(Ordering::Relaxed) {
        let mut worked = false;
        // Every request posted by now, in sequence order, in one pass; the stop flag is read
        // before each one, so a peer that keeps posting cannot keep the thread serving after
        // its connection (or its session) ended.
        loop {
            if stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            let s = next as usize % SLOTS;
            if ring.state(s).load(Ordering::Acquire) != POSTED {
                break;
            }
            if held[s].is_some() {
                return Err(Error::Protocol(format!(
                    "shm ring slot {s} posted again before END"
                )));
            }
            ring.read_request(s, &mut req)?;
            if req.seq != next {
                return Err(Error::Protocol(format!(
                    "shm ring request seq {} (xfer {}) where {next} was due",
                    req.seq, req.xfer
                )));
            }
            let (errors, leases) = run_request(agent, ring, s, &req, &mut regions, max, held_count);
            // An agent going away deregisters its regions while this thread still runs: a
            // refusal now (`NoSuchRegion`) would tell the peer a lie about a region that its
            // owner never freed. The ring stops unanswered; the peer sees the connection,
            // which the agent shut down first, lost. The flag is set before any region goes,
            // so a refusal caused by the teardown always sees it here.
            if !errors.is_empty() && agent.shutting_down() {
                return Ok(());
            }
            count_served(served, &req, &errors);
            ring.write_result(s, errors);
            if req.kind == KIND_BEGIN {
                held_count += leases.len();
                held[s] = Some(leases);
                held_slots += 1;
            }
            set_state(ring, s, DONE);
            next = next.wrapping_add(1);
            worked = true;
        }
        if held_slots > 0 {
            for (slot, h) in held.iter_mut().enumerate() {
                if h.is_some() && ring.state(slot).load(Ordering::Acquire) == END {
                    held_count -= h.take().map_or(0, |l| l.len());
                    held_slots -= 1;
                    set_state(ring, slot, FREE);
                    worked = true;
                }
            }
        }
        if worked {
            served_since_stamp += 1;
            if idle_since.take().is_some() || served_since_stamp >= STAMP_EVERY {
                served_since_stamp = 0;
                last.store(base.elapsed().as_millis() as u64, Ordering::Relaxed);
            }
            continue;
        }
        let now = Instant::now();
        let since = *idle_since.get_or_insert_with(|| {
            last.store(base.elapsed().as_millis() as u64, Ordering::Relaxed);
            now
        });
        let idle = now.duration_since(since);
        if idle < SPIN {
            // Spin while a reply could still be on its way, then yield between polls (see
            // `spin::YIELD_AFTER`).
            if idle >= crate::spin::YIELD_AFTER {
                core.yield_core(now);
            } else {
                std::hint::spin_loop();
            }
            continue;
        }
        regions.clear();
        ring.target_sleeping().store(1, Ordering::SeqCst);
        let bell = ring.doorbell().load(Ordering::SeqCst);
        let due = ring.state(next as usize % SLOTS).load(Ordering::SeqCst) == POSTED
            || held
                .iter()
                .enumerate()
                .any(|(i, h)| h.is_some() && ring.state(i).load(Ordering::SeqCst) == END);
        if !due {
            shm_ring::futex_wait(ring.doorbell(), bell, SLEEP);
        }
        ring.target_sleeping().store(0, Ordering::SeqCst);
        idle_since = Some(Instant::now());
    }
    Ok(())
}

/// Counts the request's ops that were served (not skipped, not refused): inline ones were
/// copied, `BEGIN` ones were granted for the initiator's own copy.
fn count_served(served: &Counters, req: &shm_ring::Request, errors: &[(u32, Error)]) {
    for (i, op) in req.ops.iter().enumerate() {
        let refused = errors.iter().any(|(j, _)| *j as usize == i);
        if !refused && !req.skip.get(i).copied().unwrap_or(false) {
            served.add(op.write, op.len);
        }
    }
}

/// Publishes a slot state and wakes the initiator if it sleeps on it.
fn set_state(ring: &Ring, slot: usize, state: u32) {
    ring.state(slot).store(state, Ordering::SeqCst);
    if ring.waiting(slot).load(Ordering::SeqCst) != 0 {
        shm_ring::futex_wake(ring.state(slot));
    }
}

/// Checks (and for inline requests copies) every op; returns the per-op errors and, for `BEGIN`,
/// the leases to hold until `END`.
fn run_request<S: AgentView>(
    agent: &S,
    ring: &Ring,
    s: usize,
    req: &shm_ring::Request,
    regions: &mut RegionCache,
    max: usize,
    held: usize,
) -> (Vec<(u32, Error)>, Vec<Lease>) {
    if req.kind == KIND_BEGIN {
        return begin_request(agent, req, max, held);
    }
    let reg = agent.registry();
    let wait = agent.config().io_timeout;
    let mut errors = Vec::new();
    for (i, op) in req.ops.iter().enumerate() {
        if req.skip.get(i).copied().unwrap_or(false) {
            continue;
        }
        let at = req.data_off.get(i).copied().unwrap_or(0);
        let slot_data = ring.request_data(s, req.kind, req.ops.len(), at);
        let len = op.len as usize;
        // The copy under the region's locked lease state (no lease taken and dropped per op);
        // GPU memory or a conflicting lease gets a lease, and the copy runs under it.
        let quick = reg.with_remote_cached(
            regions,
            op.region,
            op.key,
            op.offset,
            op.len,
            op.write,
            wait,
            |region| {
                let (src, dst) = if op.write {
                    (slot_data.cast_const(), region)
                } else {
                    (region.cast_const(), slot_data)
                };
                // SAFETY: the slot's data span [at, at + len) was checked by `read_request` to
                // lie in the data area (len <= INLINE_MAX, at + len <= DATA_BYTES; a short
                // request: at 0, len <= SHORT_MAX, in its control block); the region
                // span is bounds-checked and its lease state locked; a slot and a region are
                // distinct mappings.
                unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
            },
        );
        let lease = match quick {
            Ok(None) => continue,
            Ok(Some(l)) => l,
            Err(e) => {
                errors.push((i as u32, e));
                continue;
            }
        };
        let dir = if op.write {
            Dir::IntoRegion
        } else {
            Dir::OutOfRegion
        };
        // SAFETY: as above, under a lease of the op's kind.
        let r = unsafe { copy_span(&lease, op.offset, slot_data, len, dir) };
        if let Err(e) = r {
            errors.push((i as u32, e));
        }
    }
    (errors, Vec::new())
}

/// A `BEGIN` request: one look-up and one lease per run of consecutive ops on the same region
/// (same key, same direction), checked over the span the run covers; a run whose span fails is
/// checked op by op, so every op still gets its own verdict. The leases are held until `END`.
fn begin_request<S: AgentView>(
    agent: &S,
    req: &shm_ring::Request,
    max: usize,
    held: usize,
) -> (Vec<(u32, Error)>, Vec<Lease>) {
    let reg = agent.registry();
    let wait = agent.config().io_timeout;
    let mut errors = Vec::new();
    let mut leases = Vec::new();
    let mut refused = 0usize;
    let skipped = |i: usize| req.skip.get(i).copied().unwrap_or(false);
    let mut i = 0;
    while i < req.ops.len() {
        if skipped(i) {
            i += 1;
            continue;
        }
        let first = &req.ops[i];
        let mut end = i + 1;
        let (mut lo, mut hi) = (first.offset, first.offset.saturating_add(first.len));
        while end < req.ops.len() && !skipped(end) {
            let op = &req.ops[end];
            if op.region != first.region || op.key != first.key || op.write != first.write {
                break;
            }
            lo = lo.min(op.offset);
            hi = hi.max(op.offset.saturating_add(op.len));
            end += 1;
        }
        if held + leases.len() >= max {
            refused += end - i;
            for j in i..end {
                errors.push((j as u32, leases_full(RING_LEASES, max)));
            }
            i = end;
            continue;
        }
        let span = hi.saturating_sub(lo);
        match reg.check_remote(first.region, first.key, lo, span, first.write, wait) {
            Ok(l) if req.ops[i..end].iter().all(|o| o.len > 0) => leases.push(l),
            // The span failed (or held an empty op): the verdict op by op, one lease each.
            _ => {
                for (j, op) in req.ops.iter().enumerate().take(end).skip(i) {
                    if held + leases.len() >= max {
                        refused += 1;
                        errors.push((j as u32, leases_full(RING_LEASES, max)));
                        continue;
                    }
                    match reg.check_remote(op.region, op.key, op.offset, op.len, op.write, wait) {
                        Ok(l) => leases.push(l),
                        Err(e) => errors.push((j as u32, e)),
                    }
                }
            }
        }
        i = end;
    }
    if refused > 0 {
        agent.hits().hit(
            &agent.hits().leases,
            &format!("{refused} shm ring op(s) refused: max_leases_per_conn ({max})"),
        );
    }
    (errors, leases)
}

/// Who holds the leases a ring's `BEGIN`s take (`leases_full`).
const RING_LEASES: &str = "ring (BEGIN without END)";

/// The refusal of an op whose lease would pass `max_leases_per_conn`; `holder` says which of
/// the connection's leases count (its socket's `ShmBegin`s or its ring's `BEGIN`s).
pub(super) fn leases_full(holder: &str, max: usize) -> Error {
    Error::LimitReached {
        what: format!("leases held by this shm {holder} reached max_leases_per_conn"),
        limit: max as u64,
    }
}
