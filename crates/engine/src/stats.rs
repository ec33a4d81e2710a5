//! Counters of what an agent moved, read by exporters (gdx-cluster's `/metrics`): bytes and ops
//! by path and direction, failures by reason, a transfer latency histogram, peers connected.
//!
//! Recorded once per transfer when it ends (`XferState::finish`), on the initiating agent: a
//! transfer's ops are counted where their outcome is known, so the counters equal what the
//! caller's reports say, exactly.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::error::Error;
use crate::transfer::{OpKind, OpResult, OpStatus};

/// Upper bounds (seconds) of the transfer latency histogram's buckets; a last `+Inf` bucket
/// is implied. Roughly 2.5x apart, from 100 µs (a small shm op) to 60 s (a default timeout).
pub const LATENCY_BOUNDS_S: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    10.0, 60.0,
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

#[derive(Debug, Default)]
struct Counts {
    paths: BTreeMap<(String, &'static str), (u64, u64)>,
    failures: BTreeMap<&'static str, u64>,
    completed: u64,
    failed: u64,
    latency: [u64; LATENCY_BOUNDS_S.len() + 1],
    sum_s: f64,
}

/// The agent's counters.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    counts: Mutex<Counts>,
    pub(crate) peers_outbound: AtomicU64,
}

/// A stable label for an error (Prometheus label values must not carry free text).
pub fn reason_label(e: &Error) -> &'static str {
    match e {
        Error::PeerLost(_) => "peer_lost",
        Error::Unreachable(_) => "unreachable",
        Error::Timeout(_) => "timeout",
        Error::BadKey { .. } => "bad_key",
        Error::NoSuchRegion { .. } => "no_such_region",
        Error::NoSuchName(_) => "no_such_name",
        Error::OutOfBounds { .. } => "out_of_bounds",
        Error::ReadOnly { .. } => "read_only",
        Error::NotReadable { .. } => "not_readable",
        Error::RegionGone { .. } => "region_gone",
        Error::Strict(_) => "strict",
        Error::Rdma(_) | Error::RdmaRefused(_) => "rdma",
        Error::AuthFailed(_) => "auth_failed",
        Error::LimitReached { .. } => "limit_reached",
        Error::Cuda(_) => "cuda",
        Error::Os { .. } | Error::Storage(_) => "os",
        // A peer's OS failure arrives in its wire form (its cause stays there).
        Error::Remote(r) if r.code == 18 => "os",
        Error::Remote(r) if r.code == 19 => "cuda",
        Error::Unavailable(_) => "unavailable",
        Error::InvalidArgument(_) => "invalid_argument",
        _ => "protocol",
    }
}

impl Stats {
    /// Records one ended transfer.
    pub(crate) fn record(&self, ops: &[OpResult], failed: bool, elapsed: Duration) {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        // Completed ops are summed per run of one path and direction first: a batch of a
        // thousand ops costs one map update, not a thousand.
        let mut run: Option<(crate::plan::Path, &'static str, u64, u64)> = None;
        let flush = |c: &mut Counts, run: Option<(crate::plan::Path, &'static str, u64, u64)>| {
            if let Some((path, dir, bytes, n)) = run {
                // Found without allocating the key when it is there already (every time but
                // the first).
                let name = path.as_str();
                let e = match c.paths.iter_mut().find(|(k, _)| k.0 == name && k.1 == dir) {
                    Some((_, e)) => e,
                    None => c.paths.entry((name.to_string(), dir)).or_default(),
                };
                e.0 += bytes;
                e.1 += n;
            }
        };
        for op in ops {
            let dir = match op.kind {
                OpKind::Write => "write",
                OpKind::Read => "read",
            };
            match &op.status {
                OpStatus::Completed => match &mut run {
                    Some((p, d, bytes, n)) if *p == op.plan.path && *d == dir => {
                        *bytes += op.len;
                        *n += 1;
                    }
                    _ => {
                        flush(&mut c, run.take());
                        run = Some((op.plan.path, dir, op.len, 1));
                    }
                },
                OpStatus::Failed(err) => *c.failures.entry(reason_label(err)).or_default() += 1,
                OpStatus::Pending => {}
            }
        }
        flush(&mut c, run);
        if failed {
            c.failed += 1;
        } else {
            c.completed += 1;
        }
        let s = elapsed.as_secs_f64();
        let i = LATENCY_BOUNDS_S
            .iter()
            .position(|b| s <= *b)
            .unwrap_or(LATENCY_BOUNDS_S.len());
        c.latency[i] += 1;
        c.sum_s += s;
    }

    pub(crate) fn snapshot(&self, peers_inbound: u64) -> StatsSnapshot {
        let c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        StatsSnapshot {
            paths: c
                .paths
                .iter()
                .map(|((path, direction), (bytes, ops))| PathStat {
                    path: path.clone(),
                    direction,
                    bytes: *bytes,
                    ops: *ops,
                })
                .collect(),
            failures: c
                .failures
                .iter()
                .map(|(r, n)| (r.to_string(), *n))
                .collect(),
            transfers_completed: c.completed,
            transfers_failed: c.failed,
            latency: LatencyStat {
                buckets: c.latency.to_vec(),
                sum_s: c.sum_s,
                count: c.latency.iter().sum(),
            },
            peers_outbound: self.peers_outbound.load(Ordering::Relaxed),
            peers_inbound,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Path, Plan};

    fn op(kind: OpKind, len: u64, status: OpStatus) -> OpResult {
        OpResult {
            kind,
            len,
            plan: Plan {
                path: Path::Tcp,
                reason: "".into(),
            },
            status,
        }
    }

    #[test]
    fn counts_completed_ops_and_failures_by_reason() {
        let s = Stats::default();
        s.record(
            &[
                op(OpKind::Write, 100, OpStatus::Completed),
                op(OpKind::Read, 7, OpStatus::Completed),
                op(
                    OpKind::Write,
                    50,
                    OpStatus::Failed(Error::BadKey { region: 1 }),
                ),
            ],
            true,
            Duration::from_micros(700),
        );
        s.record(
            &[op(OpKind::Write, 1, OpStatus::Completed)],
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
}
