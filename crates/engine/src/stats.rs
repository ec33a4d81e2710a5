//! Counters of what an agent moved, read by exporters (gdx-cluster's `/metrics`): bytes and ops
//! by path and direction, failures by reason, a transfer latency histogram, peers connected.
//!
//! Recorded once per transfer when it ends (`XferState::finish`), on the initiating agent: a
//! transfer's ops are counted where their outcome is known, so the counters equal what the
//! caller's reports say, exactly.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::error::Error;
use crate::routing::plan::Path;
use crate::transfer::{OpKind, Outcome};

/// Upper bounds (seconds) of the transfer latency histogram's buckets; a last `+Inf` bucket
/// is implied. Roughly 2.5x apart, from 100 µs (a small shm op) to 60 s (a default timeout).
pub const LATENCY_BOUNDS_S: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    10.0, 60.0,
];

/// [`LATENCY_BOUNDS_S`] in nanoseconds: a transfer's end picks its bucket with integer
/// compares (a test checks the two agree).
const LATENCY_BOUNDS_NS: [u64; 16] = [
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    10_000_000_000,
    60_000_000_000,
];

/// Bytes and ops that completed on one path in one direction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PathStat {
    /// The path (`tcp`, `shm`, `rdma` ...; see [`crate::Path`]).
    pub path: String,
    /// `write` (local → remote) or `read` (remote → local).
    pub direction: &'static str,
    /// Bytes of completed ops.
    pub bytes: u64,
    /// Completed ops.
    pub ops: u64,
}

/// Transfer latency: submit to end, per transfer (completed or failed).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LatencyStat {
    /// Count per bucket of [`LATENCY_BOUNDS_S`] (not cumulative), then the `+Inf` bucket.
    pub buckets: Vec<u64>,
    /// Sum of latencies, seconds.
    pub sum_s: f64,
    /// Number of transfers.
    pub count: u64,
}

/// A point-in-time copy of an agent's counters ([`crate::Agent::stats`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StatsSnapshot {
    /// Completed ops by path and direction, sorted.
    pub paths: Vec<PathStat>,
    /// Failed ops by reason (the error's kind: `peer_lost`, `bad_key`, `timeout` ...), sorted.
    pub failures: Vec<(String, u64)>,
    /// Transfers that completed.
    pub transfers_completed: u64,
    /// Transfers that failed.
    pub transfers_failed: u64,
    /// Latency of ended transfers.
    pub latency: LatencyStat,
    /// Outbound peers ([`crate::Peer`]s) alive now.
    pub peers_outbound: u64,
    /// Inbound authenticated sessions now.
    pub peers_inbound: u64,
}

/// Completed bytes and ops of one path, by direction (0 write, 1 read).
#[derive(Debug, Default)]
struct PathCounts {
    bytes: [AtomicU64; 2],
    ops: [AtomicU64; 2],
}

/// The counters a transfer's end adds to: bytes and ops per path and direction, the latency
/// histogram and its sum.
#[derive(Debug, Default)]
struct Counts {
    paths: [PathCounts; Path::COUNT],
    latency: [AtomicU64; LATENCY_BOUNDS_S.len() + 1],
    sum_ns: AtomicU64,
}

impl Counts {
    /// Adds `other` into these (any thread: atomic adds).
    fn absorb(&self, other: &Counts) {
        let add = |a: &AtomicU64, b: &AtomicU64| {
            a.fetch_add(b.load(Ordering::Relaxed), Ordering::Relaxed);
        };
        for (a, b) in self.paths.iter().zip(&other.paths) {
            for d in 0..2 {
                add(&a.bytes[d], &b.bytes[d]);
                add(&a.ops[d], &b.ops[d]);
            }
        }
        for (a, b) in self.latency.iter().zip(&other.latency) {
            add(a, b);
        }
        add(&self.sum_ns, &other.sum_ns);
    }
}

/// Adds `v` to a counter only the calling thread writes (its shard): a load and a store, not
/// an atomic read-modify-write (which costs 5–8 ns each on the machines gdx runs on, and a
/// small transfer's end would take four).
fn bump(c: &AtomicU64, v: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(v), Ordering::Relaxed);
}

/// How a counter of `Counts` is added to: shared counts (the retired sums) take atomic adds; a
/// thread's own shard a load and a store (`bump`).
fn adder(shared: bool) -> impl Fn(&AtomicU64, u64) {
    move |c: &AtomicU64, v: u64| {
        if shared {
            c.fetch_add(v, Ordering::Relaxed);
        } else {
            bump(c, v);
        }
    }
}

/// Counts one transfer of `ns` nanoseconds in the latency histogram and its sum.
fn add_latency(shard: &Counts, add: impl Fn(&AtomicU64, u64), ns: u64) {
    let i = LATENCY_BOUNDS_NS
        .iter()
        .position(|b| ns <= *b)
        .unwrap_or(LATENCY_BOUNDS_NS.len());
    add(&shard.latency[i], 1);
    add(&shard.sum_ns, ns);
}

/// The agent's counters. Completed transfers are counted in per-thread shards (each written by
/// its own thread only, with plain loads and stores) that a snapshot sums; a thread's shard is
/// folded into `retired` when the thread exits. Failures, which carry a reason, take the lock.
/// A snapshot taken while transfers end may miss the last few; at rest the counters equal the
/// reports.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    shards: Mutex<Vec<Arc<Counts>>>,
    /// The sums of shards whose threads exited.
    retired: Counts,
    failures: Mutex<BTreeMap<&'static str, u64>>,
    /// Transfers that failed (those that completed are the latency count less these).
    failed: AtomicU64,
    pub(crate) peers_outbound: AtomicU64,
}

/// This thread's shard of one agent's counters; folded into the agent's `retired` counts when
/// the thread exits (or dropped if the agent is gone).
struct ShardRef {
    stats: Weak<Stats>,
    shard: Arc<Counts>,
}

impl Drop for ShardRef {
    fn drop(&mut self) {
        if let Some(stats) = self.stats.upgrade() {
            let mut shards = stats.shards.lock().unwrap_or_else(|p| p.into_inner());
            shards.retain(|s| !Arc::ptr_eq(s, &self.shard));
            // Folded while the shard list is locked, so a snapshot sees it in one place.
            stats.retired.absorb(&self.shard);
        }
    }
}

thread_local! {
    /// This thread's shards, one per agent it ended transfers for (usually one). A `Weak`
    /// keeps its agent's allocation, so a live `Stats` at the same address is the same agent.
    static SHARDS: RefCell<Vec<ShardRef>> = const { RefCell::new(Vec::new()) };
}

/// A stable label for an error (Prometheus label values must not carry free text).
pub fn reason_label(e: &Error) -> &'static str {
    match e {
        Error::PeerLost { .. } => "peer_lost",
        Error::Unreachable { .. } => "unreachable",
        Error::Timeout(_) => "timeout",
        Error::BadKey { .. } => "bad_key",
        Error::NoSuchRegion { .. } => "no_such_region",
        Error::NoSuchName { .. } => "no_such_name",
        Error::OutOfBounds { .. } => "out_of_bounds",
        Error::ReadOnly { .. } => "read_only",
        Error::NotReadable { .. } => "not_readable",
        Error::RegionGone { .. } => "region_gone",
        Error::Strict { .. } => "strict",
        Error::Rdma(_)
        | Error::Refused {
            path: Path::Rdma, ..
        } => "rdma",
        Error::AuthFailed { .. } => "auth_failed",
        Error::LimitReached { .. } => "limit_reached",
        Error::Cuda(_) => "cuda",
        Error::Os { .. } | Error::Storage(_) => "os",
        // A peer's OS failure arrives in its wire form (its cause stays there).
        Error::Remote(r) if r.code == 18 => "os",
        Error::Remote(r) if r.code == 19 => "cuda",
        Error::Unavailable { .. } => "unavailable",
        Error::InvalidArgument(_) => "invalid_argument",
        _ => "protocol",
    }
}

impl Stats {
    /// Runs `f` on this thread's shard of these counters (made on the thread's first use), or,
    /// when the thread is exiting (its shards are gone), on the retired sums, which others may
    /// add to too (`f`'s flag says which).
    fn with_shard(self: &Arc<Self>, f: impl FnOnce(&Counts, bool)) {
        let me = Arc::as_ptr(self);
        let mut f = Some(f);
        let mut run = |c: &Counts, shared: bool| {
            if let Some(f) = f.take() {
                f(c, shared);
            }
        };
        let _ = SHARDS.try_with(|shards| {
            let mut shards = shards.borrow_mut();
            if let Some(s) = shards.iter().find(|s| s.stats.as_ptr() == me) {
                run(&s.shard, false);
                return;
            }
            shards.retain(|s| s.stats.strong_count() > 0);
            let shard = Arc::new(Counts::default());
            self.shards
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Arc::clone(&shard));
            run(&shard, false);
            shards.push(ShardRef {
                stats: Arc::downgrade(self),
                shard,
            });
        });
        // Not run above: the thread's locals are gone.
        run(&self.retired, true);
    }

    /// Records one ended transfer: each op's direction, length, path and outcome.
    pub(crate) fn record<'a>(
        self: &Arc<Self>,
        ops: impl Iterator<Item = (OpKind, u64, Path, Outcome<'a>)>,
        failed: bool,
        elapsed: Duration,
    ) {
        self.with_shard(|shard, shared| self.record_into(shard, shared, ops, failed, elapsed));
    }

    /// Records one ended transfer of a single op that completed: `record` without the walk over
    /// ops and outcomes (the end of every small transfer at the latency floor).
    pub(crate) fn record_one(
        self: &Arc<Self>,
        kind: OpKind,
        len: u64,
        path: Path,
        elapsed_ns: u64,
    ) {
        self.with_shard(|shard, shared| {
            let add = adder(shared);
            let c = &shard.paths[path.index()];
            let dir = match kind {
                OpKind::Write => 0,
                OpKind::Read => 1,
            };
            add(&c.bytes[dir], len);
            add(&c.ops[dir], 1);
            add_latency(shard, add, elapsed_ns);
        });
    }

    fn record_into<'a>(
        &self,
        shard: &Counts,
        shared: bool,
        ops: impl Iterator<Item = (OpKind, u64, Path, Outcome<'a>)>,
        failed: bool,
        elapsed: Duration,
    ) {
        let add = adder(shared);
        // Completed ops are summed per run of one path and direction first: a batch of a
        // thousand ops costs one add per counter, not a thousand.
        let mut run: Option<(Path, usize, u64, u64)> = None;
        let flush = |run: Option<(Path, usize, u64, u64)>| {
            if let Some((path, dir, bytes, n)) = run {
                let c = &shard.paths[path.index()];
                add(&c.bytes[dir], bytes);
                add(&c.ops[dir], n);
            }
        };
        for (kind, len, path, status) in ops {
            let dir = match kind {
                OpKind::Write => 0,
                OpKind::Read => 1,
            };
            match status {
                Outcome::Completed => match &mut run {
                    Some((p, d, bytes, n)) if *p == path && *d == dir => {
                        *bytes += len;
                        *n += 1;
                    }
                    _ => {
                        flush(run.take());
                        run = Some((path, dir, len, 1));
                    }
                },
                Outcome::Failed(err) => {
                    let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
                    *f.entry(reason_label(err)).or_default() += 1;
                }
                Outcome::Pending => {}
            }
        }
        flush(run);
        if failed {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
        add_latency(
            shard,
            add,
            u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX),
        );
    }

    /// The sum of every shard and the retired counts, taken under the shard list's lock.
    fn totals(&self) -> Counts {
        let total = Counts::default();
        let shards = self.shards.lock().unwrap_or_else(|p| p.into_inner());
        total.absorb(&self.retired);
        for s in shards.iter() {
            total.absorb(s);
        }
        total
    }

    pub(crate) fn snapshot(&self, peers_inbound: u64) -> StatsSnapshot {
        let totals = self.totals();
        let mut paths = Vec::new();
        for path in Path::ALL {
            let c = &totals.paths[path.index()];
            for (dir, direction) in ["write", "read"].into_iter().enumerate() {
                let ops = c.ops[dir].load(Ordering::Relaxed);
                if ops > 0 {
                    paths.push(PathStat {
                        path: path.as_str().to_string(),
                        direction,
                        bytes: c.bytes[dir].load(Ordering::Relaxed),
                        ops,
                    });
                }
            }
        }
        paths.sort_by(|a, b| (&a.path, a.direction).cmp(&(&b.path, b.direction)));
        let failed = self.failed.load(Ordering::Relaxed);
        let buckets: Vec<u64> = totals
            .latency
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let count: u64 = buckets.iter().sum();
        StatsSnapshot {
            paths,
            failures: self
                .failures
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .map(|(r, n)| (r.to_string(), *n))
                .collect(),
            transfers_completed: count.saturating_sub(failed),
            transfers_failed: failed,
            latency: LatencyStat {
                count,
                buckets,
                sum_s: totals.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
            },
            peers_outbound: self.peers_outbound.load(Ordering::Relaxed),
            peers_inbound,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::OpStatus;

    fn op(kind: OpKind, len: u64, status: OpStatus) -> (OpKind, u64, Path, OpStatus) {
        (kind, len, Path::Tcp, status)
    }

    fn ops(
        v: &[(OpKind, u64, Path, OpStatus)],
    ) -> impl Iterator<Item = (OpKind, u64, Path, Outcome<'_>)> {
        v.iter().map(|(k, l, p, s)| {
            let o = match s {
                OpStatus::Pending => Outcome::Pending,
                OpStatus::Completed => Outcome::Completed,
                OpStatus::Failed(e) => Outcome::Failed(e),
            };
            (*k, *l, *p, o)
        })
    }

    #[test]
    fn bounds_in_nanoseconds_are_the_bounds_in_seconds() {
        for (s, ns) in LATENCY_BOUNDS_S.iter().zip(LATENCY_BOUNDS_NS) {
            assert_eq!((s * 1e9).round() as u64, ns, "{s} s");
        }
    }

    #[test]
    fn one_completed_op_counts_as_the_general_walk_does() {
        let one = Arc::new(Stats::default());
        let walk = Arc::new(Stats::default());
        for (kind, len, ms) in [(OpKind::Write, 8, 1), (OpKind::Read, 4096, 300)] {
            let d = Duration::from_millis(ms);
            one.record_one(kind, len, Path::Shm, d.as_nanos() as u64);
            walk.record(
                ops(&[(kind, len, Path::Shm, OpStatus::Completed)]),
                false,
                d,
            );
        }
        let (a, b) = (one.snapshot(0), walk.snapshot(0));
        assert_eq!(a.paths, b.paths);
        assert_eq!(a.latency.buckets, b.latency.buckets);
        assert_eq!(a.latency.count, 2);
        assert!((a.latency.sum_s - b.latency.sum_s).abs() < 1e-12);
        assert_eq!(a.transfers_failed, b.transfers_failed);
    }

    #[test]
    fn counts_completed_ops_and_failures_by_reason() {
        let s = Arc::new(Stats::default());
        s.record(
            ops(&[
                op(OpKind::Write, 100, OpStatus::Completed),
                op(OpKind::Read, 7, OpStatus::Completed),
                op(
                    OpKind::Write,
                    50,
                    OpStatus::Failed(Error::BadKey { region: 1 }),
                ),
            ]),
            true,
            Duration::from_micros(700),
        );
        s.record(
            ops(&[op(OpKind::Write, 1, OpStatus::Completed)]),
            false,
            Duration::from_secs(100),
        );
        let snap = s.snapshot(2);
        let w = snap
            .paths
            .iter()
            .find(|p| p.direction == "write")
            .expect("write");
        assert_eq!((w.path.as_str(), w.bytes, w.ops), ("tcp", 101, 2));
        let r = snap
            .paths
            .iter()
            .find(|p| p.direction == "read")
            .expect("read");
        assert_eq!((r.bytes, r.ops), (7, 1));
        assert_eq!(snap.failures, vec![("bad_key".to_string(), 1)]);
        assert_eq!((snap.transfers_completed, snap.transfers_failed), (1, 1));
        // 700 µs lands in the (0.5 ms, 1 ms] bucket; 100 s in +Inf.
        assert_eq!(snap.latency.buckets[3], 1);
        assert_eq!(snap.latency.buckets[LATENCY_BOUNDS_S.len()], 1);
        assert_eq!(snap.latency.count, 2);
        assert_eq!(snap.peers_inbound, 2);
    }

    #[test]
    fn counts_from_threads_that_exited_and_threads_still_running_add_up() {
        let s = Arc::new(Stats::default());
        let one = |s: &Arc<Stats>| {
            s.record(
                ops(&[op(OpKind::Write, 10, OpStatus::Completed)]),
                false,
                Duration::from_micros(1),
            );
        };
        // Four threads that record and exit (their shards fold into the retired sums) ...
        let done: Vec<_> = (0..4)
            .map(|_| {
                let s = Arc::clone(&s);
                std::thread::spawn(move || (0..25).for_each(|_| one(&s)))
            })
            .collect();
        for t in done {
            t.join().expect("thread");
        }
        // ... one that is still running when the snapshot is taken ...
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let (ready, is_ready) = std::sync::mpsc::channel::<()>();
        let live = {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                (0..7).for_each(|_| one(&s));
                ready.send(()).expect("ready");
                wait.recv().expect("go");
            })
        };
        is_ready.recv().expect("ready");
        // ... and this thread.
        one(&s);
        let snap = s.snapshot(0);
        go.send(()).expect("go");
        live.join().expect("thread");
        assert_eq!(snap.paths.len(), 1);
        assert_eq!((snap.paths[0].ops, snap.paths[0].bytes), (108, 1080));
        assert_eq!(snap.transfers_completed, 108);
        assert_eq!(snap.latency.buckets[0], 108);
        // After the live thread exited too, nothing is lost or counted twice.
        let again = s.snapshot(0);
        assert_eq!(again.paths[0].ops, 108);
        assert_eq!(
            s.shards.lock().expect("shards").len(),
            1,
            "only this thread's is live"
        );
    }

    #[test]
    fn two_agents_on_one_thread_keep_their_own_counts() {
        let (a, b) = (Arc::new(Stats::default()), Arc::new(Stats::default()));
        for (s, n) in [(&a, 3u64), (&b, 5)] {
            for _ in 0..n {
                s.record(
                    ops(&[op(OpKind::Read, 4, OpStatus::Completed)]),
                    false,
                    Duration::from_millis(2),
                );
            }
        }
        assert_eq!(a.snapshot(0).paths[0].ops, 3);
        assert_eq!(b.snapshot(0).paths[0].ops, 5);
        drop(a);
        // A new agent (maybe at the dropped one's address) starts from zero.
        let c = Arc::new(Stats::default());
        assert!(c.snapshot(0).paths.is_empty());
        c.record(
            ops(&[op(OpKind::Read, 4, OpStatus::Completed)]),
            false,
            Duration::from_millis(2),
        );
        assert_eq!(c.snapshot(0).paths[0].ops, 1);
        assert_eq!(b.snapshot(0).paths[0].ops, 5);
    }
}
