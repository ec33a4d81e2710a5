//! Spinning for an answer from another thread or process (the shm ring's target thread and its
//! initiators, the tcp submit spin, a transfer's waiter): the one wait strategy of the engine.
//! Poll with `pause` for `YIELD_AFTER`, then yield between polls, then block (each waiter's
//! budget is below). A paired run on a 16-core host (old and new binaries, same run) showed no
//! win from the tuning this once had (a clock read every 64 polls, yielding sooner on a core
//! seen shared, `prefetchw` of the ring's lines, one codegen unit for the engine), so none is
//! kept; moving a thread off a shared core is opt-in (`GDX_LEAVE_SHARED_CORE=1`).

use std::time::Duration;

/// Spins until `done()` or `spin` elapsed; true when `done()` became true. The first
/// `YIELD_AFTER` only pause between polls: an answer from a running peer arrives within that,
/// and a `sched_yield` (a system call) taken meanwhile would delay seeing it. After that the
/// spinner yields between polls, since the peer may be waiting for this core.
pub(crate) fn spin_until(spin: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = std::time::Instant::now();
    loop {
        if done() {
            return true;
        }
        let t = start.elapsed();
        if t >= spin {
            return false;
        }
        if t >= YIELD_AFTER {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

// Every wait budget of the engine, in one place: how long each waiter polls (`spin_until`, or
// its own loop on the same rules) before it blocks. Each is a round trip to a running peer with
// room to spare; what takes longer is a sleeping, descheduled or stopped peer, waited for
// without holding a core. The target's ring spin (`ring::TARGET_SPIN`) is part of the shm
// protocol and lives with it.

/// The shm submitting thread, for the next ring slot (the oldest in flight to be answered),
/// before it queues the transfer to the connection's worker thread: a ring round trip to a
/// running peer is a few µs.
pub(crate) const SHM_SUBMIT_SPIN: Duration = Duration::from_micros(10);

/// An initiator waiting on a ring slot, before it sleeps on the slot's futex.
pub(crate) const RING_SLOT_SPIN: Duration = Duration::from_micros(100);

/// The tcp submitting thread, for the replies of what it wrote, before it leaves them to the
/// stream's thread: a loopback or same-rack round trip, not a stalled peer's.
pub(crate) const TCP_SUBMIT_SPIN: Duration = Duration::from_micros(50);

/// A tcp data stream's reader, for the next request, before it blocks in the read: a busy
/// stream's next request usually follows within it (the initiator polls for its ack alike).
pub(crate) const STREAM_READ_SPIN: Duration = Duration::from_micros(50);

/// A transfer's waiter (`TransferHandle::wait`), yielding, before it sleeps.
pub(crate) const TRANSFER_WAIT_SPIN: Duration = Duration::from_micros(50);

/// How long a spinner polls before it starts yielding its core (`spin_until`).
pub(crate) const YIELD_AFTER: Duration = Duration::from_micros(20);

/// A yield that returns this late ran another thread on this core (`yield_core`).
const SHARED_AFTER: Duration = Duration::from_micros(5);

/// Yields this core; true when that ran another thread here for a while (`before` is a clock
/// read just before the call): the spinner and the peer it waits for share the core.
pub(crate) fn yield_core(before: std::time::Instant) -> bool {
    std::thread::yield_now();
    before.elapsed() >= SHARED_AFTER
}

/// Late yields in a row after which `CoreWatch` leaves its core (`leave_core`).
const LATE_STREAK: u32 = 8;

/// The least time between two `leave_core` moves of one thread: on a machine with no core to
/// spare a move finds another busy one, and moving on at every streak would only thrash.
const LEAVE_EVERY: Duration = Duration::from_millis(20);

/// Whether `CoreWatch` may move its thread off a shared core: only when asked
/// (`GDX_LEAVE_SHARED_CORE=1`), since moving a thread is the scheduler's call and a user's
/// pinning plan may not expect it. It helps on small VMs, where the target's ring thread and an
/// initiator can end up sharing one core (see `leave_core`).
pub(crate) const LEAVE_ENV: &str = "GDX_LEAVE_SHARED_CORE";

fn leave_allowed() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var(LEAVE_ENV).is_ok_and(|v| v == "1"))
}

/// What a long-lived spinner (the target's ring thread) knows of its core across its idle
/// spins: how many of its yields in a row came back late (`yield_core`);
/// after `LATE_STREAK` of them it leaves its core (`leave_core`, at most every `LEAVE_EVERY`)
/// where `GDX_LEAVE_SHARED_CORE=1` allows it.
#[derive(Debug, Default)]
pub(crate) struct CoreWatch {
    late: u32,
    left_at: Option<std::time::Instant>,
}

impl CoreWatch {
    /// `yield_core` (`now` read just before), counted; leaves the core after a streak.
    pub(crate) fn yield_core(&mut self, now: std::time::Instant) {
        self.late = if yield_core(now) { self.late + 1 } else { 0 };
        if self.late >= LATE_STREAK
            && leave_allowed()
            && self
                .left_at
                .is_none_or(|t| now.duration_since(t) >= LEAVE_EVERY)
        {
            self.late = 0;
            self.left_at = Some(now);
            let _ = leave_core();
        }
    }
}

/// A run of late yields while another CPU may be idle means the scheduler left two spinners
/// that wait for each other (the target's ring thread and an initiator) on one core: each runs
/// a few µs, yields to the other and stays "cache hot", which the load balancer does not move,
/// so an idle core stays idle and every round trip costs two context switches (8 B shm at
/// 13–17 µs instead of 0.5 on a 2-vCPU VM, in about one `gdx bench` run in 25 there; a
/// sleep does not undo it: the wake-up lands on the same core). This moves the calling thread
/// off its CPU ([`leave_cpu`]). Returns the CPU it went from and the one it went to, if it
/// moved.
fn leave_core() -> Option<(usize, usize)> {
    leave_cpu(current_cpu())
}

/// The CPU the calling thread runs on now.
pub fn current_cpu() -> usize {
    rustix::thread::sched_getcpu()
}

/// Moves the calling thread off CPU `cpu` when it runs there and its affinity allows another:
/// its affinity without `cpu` (the kernel moves it at once), then its affinity as it was (a
/// user's pinning kept; the thread stays where it went). For two threads that spin for each
/// other, which must not share a CPU: the engine's ring thread ([`CoreWatch`]), and the
/// latency floor's echo thread in `gdx bench`, which is otherwise sometimes started on its
/// partner's CPU and then measures two context switches, not a floor. Nothing happens when the
/// thread is elsewhere already or may run on one CPU only; a failed call changes nothing.
/// Returns the CPU it went from and the one it went to, if it moved.
pub fn leave_cpu(cpu: usize) -> Option<(usize, usize)> {
    use rustix::thread::{sched_getaffinity, sched_setaffinity};
    let allowed = sched_getaffinity(None).ok()?;
    let here = current_cpu();
    if here != cpu
        || allowed.count() < 2
        || here >= rustix::thread::CpuSet::MAX_CPU
        || !allowed.is_set(here)
    {
        return None;
    }
    let mut elsewhere = allowed;
    elsewhere.unset(here);
    sched_setaffinity(None, &elsewhere).ok()?;
    let there = current_cpu();
    let _ = sched_setaffinity(None, &allowed);
    Some((here, there))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leave_core_moves_the_thread_and_keeps_its_affinity() {
        use rustix::thread::sched_getaffinity;
        std::thread::spawn(|| {
            let before = sched_getaffinity(None).expect("affinity");
            // Asked to leave some CPU it is not on, the thread stays (`leave_cpu`).
            let here = current_cpu();
            if let Some(other) = (0..rustix::thread::CpuSet::MAX_CPU).find(|&c| c != here) {
                assert_eq!(leave_cpu(other), None, "moved though not on CPU {other}");
            }
            let moved = leave_core();
            let after = sched_getaffinity(None).expect("affinity");
            assert!(
                before == after,
                "leave_core left the thread's affinity changed"
            );
            if before.count() >= 2 {
                let (from, to) = moved.expect("two CPUs allowed, yet the thread did not move");
                assert_ne!(from, to, "still on CPU {from}");
                assert!(before.is_set(to), "moved to CPU {to}, outside its affinity");
            } else {
                assert_eq!(moved, None, "one CPU allowed: nowhere to go");
            }
        })
        .join()
        .expect("thread");
    }

    #[test]
    fn spin_until_sees_a_condition_and_gives_up_after_its_time() {
        // The condition is met by count, not time: a budget far above 1,000 polls keeps a
        // preempted thread on a loaded machine from failing it.
        let mut n = 0;
        assert!(spin_until(Duration::from_secs(60), || {
            n += 1;
            n == 1000
        }));
        assert!(!spin_until(Duration::from_millis(2), || false));
    }
}
