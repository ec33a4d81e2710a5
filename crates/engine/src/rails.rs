//! Rails: the parallel links of one peer connection (one per NIC pair, or per local address on
//! tcp), their health and their measured throughput.
//!
//! A rail that errors is paused with its cause and a backoff that doubles on each failed
//! re-probe (from [`FIRST_BACKOFF`] up to [`MAX_BACKOFF`]); the transport re-probes it in the
//! background once the backoff has passed and resumes it when a connection over it works again.
//! Each stream of a rail keeps a moving average of its throughput; large transfers are spread
//! over the streams of active rails in proportion to it, small ones go to the best rail.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::Error;

/// Most rails one peer connection uses (per-transfer byte counts are kept inline).
pub const MAX_RAILS: usize = 8;

/// Backoff after a rail's first error.
pub(crate) const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// Longest backoff between re-probes of a paused rail.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Weight of a new sample in a stream's throughput average: high, so that a rail whose speed
/// changed (shaped, congested, back from a failure) gets its share within a few transfers.
const EWMA_NEW: f64 = 0.75;

/// Whether a rail takes work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RailState {
    /// Takes work.
    Active,
    /// Errored: takes no work until a re-probe succeeds.
    Paused,
}

impl RailState {
    /// `"active"` or `"paused"`.
    pub fn as_str(self) -> &'static str {
        match self {
            RailState::Active => "active",
            RailState::Paused => "paused",
        }
    }
}

impl std::fmt::Display for RailState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One rail as seen now: its ends, the bytes it moved (for a transfer, or in all), its errors,
/// its state and the cause of its last error while paused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RailInfo {
    /// This side's end: a local address (tcp) or a device (rdma).
    pub local: String,
    /// The peer's end.
    pub remote: String,
    /// Bytes confirmed in place over this rail.
    pub bytes: u64,
    /// Errors seen on this rail since the connection was made.
    pub errors: u64,
    /// Active or paused.
    pub state: RailState,
    /// Why it is paused (`None` while active).
    pub cause: Option<String>,
}

/// The rails of one outbound peer connection ([`crate::Agent::rails`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerRails {
    /// The peer's agent name.
    pub peer: String,
    /// The address connected to.
    pub addr: String,
    /// Its rails now, bytes counted since the connection was made.
    pub rails: Vec<RailInfo>,
}

#[derive(Debug)]
struct Health {
    paused: bool,
    cause: Option<String>,
    backoff: Duration,
    retry_at: Instant,
}

#[derive(Debug)]
pub(crate) struct Rail {
    pub(crate) local: String,
    pub(crate) remote: String,
    bytes: AtomicU64,
    errors: AtomicU64,
    health: Mutex<Health>,
}

/// The rails of one peer connection.
#[derive(Debug)]
pub(crate) struct Rails {
    rails: Vec<Rail>,
    /// Each stream's rail and its throughput average (bytes/s as f64 bits; 0: not measured).
    streams: Vec<(usize, AtomicU64)>,
}

impl Rails {
    /// Rails named by their ends, with the rail of each stream in stream order.
    pub(crate) fn new(ends: Vec<(String, String)>, stream_rails: Vec<usize>) -> Rails {
        let now = Instant::now();
        Rails {
            rails: ends
                .into_iter()
                .map(|(local, remote)| Rail {
                    local,
                    remote,
                    bytes: AtomicU64::new(0),
                    errors: AtomicU64::new(0),
                    health: Mutex::new(Health {
                        paused: false,
                        cause: None,
                        backoff: Duration::ZERO,
                        retry_at: now,
                    }),
                })
                .collect(),
            streams: stream_rails
                .into_iter()
                .map(|r| (r, AtomicU64::new(0)))
                .collect(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.rails.len()
    }

    pub(crate) fn rail(&self, i: usize) -> &Rail {
        &self.rails[i]
    }

    fn health(&self, i: usize) -> std::sync::MutexGuard<'_, Health> {
        self.rails[i]
            .health
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn is_active(&self, i: usize) -> bool {
        !self.health(i).paused
    }

    pub(crate) fn any_active(&self) -> bool {
        (0..self.rails.len()).any(|i| self.is_active(i))
    }

    /// Pauses rail `i` for the error `e` (a rail already paused keeps its backoff running).
    pub(crate) fn pause(&self, i: usize, e: &Error) {
        self.rails[i].errors.fetch_add(1, Ordering::Relaxed);
        let mut h = self.health(i);
        if !h.paused {
            h.paused = true;
            h.backoff = FIRST_BACKOFF;
            h.retry_at = Instant::now() + h.backoff;
            log::warn!(
                "gdx: rail {} -> {} paused: {e}",
                self.rails[i].local,
                self.rails[i].remote
            );
        }
        h.cause = Some(e.to_string());
    }

    /// Whether a paused rail `i` is due for a re-probe (an active one always is: its broken
    /// streams reconnect at once).
    pub(crate) fn probe_due(&self, i: usize) -> bool {
        let h = self.health(i);
        !h.paused || Instant::now() >= h.retry_at
    }

    /// A re-probe of rail `i` failed: the backoff doubles.
    pub(crate) fn probe_failed(&self, i: usize, e: &Error) {
        let mut h = self.health(i);
        h.backoff = (h.backoff * 2).clamp(FIRST_BACKOFF, MAX_BACKOFF);
        h.retry_at = Instant::now() + h.backoff;
        if h.paused {
            h.cause = Some(e.to_string());
        }
    }

    /// A connection over rail `i` works again: it takes work.
    pub(crate) fn resume(&self, i: usize) {
        let mut h = self.health(i);
        if h.paused {
            log::info!(
                "gdx: rail {} -> {} active again",
                self.rails[i].local,
                self.rails[i].remote
            );
        }
        h.paused = false;
        h.cause = None;
        h.backoff = Duration::ZERO;
    }

    /// Counts `n` bytes landed over rail `i`.
    pub(crate) fn add_bytes(&self, i: usize, n: u64) {
        self.rails[i].bytes.fetch_add(n, Ordering::Relaxed);
    }

    /// The counter of bytes landed over rail `i`.
    pub(crate) fn counter(&self, i: usize) -> &AtomicU64 {
        &self.rails[i].bytes
    }

    /// Adds a throughput sample of stream `s`: `bytes` confirmed over `elapsed` of work.
    pub(crate) fn measured(&self, s: usize, bytes: u64, elapsed: Duration) {
        let sample = bytes as f64 / elapsed.as_secs_f64().max(1e-6);
        let slot = &self.streams[s].1;
        let old = f64::from_bits(slot.load(Ordering::Relaxed));
        let new = if old > 0.0 {
            old + EWMA_NEW * (sample - old)
        } else {
            sample
        };
        slot.store(new.to_bits(), Ordering::Relaxed);
    }

    /// Stream `s`'s throughput average (bytes/s), if measured.
    fn rate(&self, s: usize) -> Option<f64> {
        let r = f64::from_bits(self.streams[s].1.load(Ordering::Relaxed));
        (r > 0.0).then_some(r)
    }

    /// The weight of each stream among `usable` for spreading a transfer: its throughput
    /// average, or, for a stream not measured yet, the highest measured one (so that it gets
    /// work and is measured; all equal when none is).
    pub(crate) fn weights(&self, usable: &[usize]) -> Vec<f64> {
        let top = usable
            .iter()
            .filter_map(|&s| self.rate(s))
            .fold(None, |m: Option<f64>, r| Some(m.map_or(r, |m| m.max(r))))
            .unwrap_or(1.0);
        usable
            .iter()
            .map(|&s| self.rate(s).unwrap_or(top))
            .collect()
    }

    /// The active rail with the most throughput over its streams (the first on a tie).
    pub(crate) fn best(&self) -> Option<usize> {
        let all: Vec<usize> = (0..self.streams.len()).collect();
        let w = self.weights(&all);
        let mut per = vec![0.0; self.rails.len()];
        for (s, w) in w.iter().enumerate() {
            per[self.streams[s].0] += w;
        }
        (0..self.rails.len())
            .filter(|&i| self.is_active(i))
            .fold(None, |best: Option<usize>, i| match best {
                Some(b) if per[b] >= per[i] => Some(b),
                _ => Some(i),
            })
    }

    /// Each rail's cause, for a transfer that no rail could finish.
    pub(crate) fn causes(&self) -> String {
        self.rails
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let h = self.health(i);
                format!(
                    "rail {} -> {}: {}",
                    r.local,
                    r.remote,
                    h.cause.as_deref().unwrap_or("active")
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// The rails now, with `bytes` per rail (a transfer's) or, if `None`, each rail's total.
    pub(crate) fn snapshot(&self, bytes: Option<&[AtomicU64]>) -> Vec<RailInfo> {
        self.rails
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let h = self.health(i);
                RailInfo {
                    local: r.local.clone(),
                    remote: r.remote.clone(),
                    bytes: match bytes {
                        Some(b) => b.get(i).map_or(0, |b| b.load(Ordering::Relaxed)),
                        None => r.bytes.load(Ordering::Relaxed),
                    },
                    errors: r.errors.load(Ordering::Relaxed),
                    state: if h.paused {
                        RailState::Paused
                    } else {
                        RailState::Active
                    },
                    cause: h.cause.clone(),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two() -> Rails {
        Rails::new(
            vec![("a".into(), "A".into()), ("b".into(), "B".into())],
            vec![0, 1],
        )
    }

    #[test]
    fn pause_backs_off_and_resume_clears_the_cause() {
        let r = two();
        r.pause(1, &Error::peer_lost("reset"));
        assert!(!r.is_active(1));
        assert!(!r.probe_due(1), "the first backoff has not passed");
        let s = r.snapshot(None);
        assert_eq!(s[1].state, RailState::Paused);
        assert!(s[1].cause.as_deref().unwrap().contains("reset"));
        assert_eq!(s[1].errors, 1);
        assert_eq!(r.best(), Some(0));
        r.probe_failed(1, &Error::peer_lost("refused"));
        assert!(r.snapshot(None)[1]
            .cause
            .as_deref()
            .unwrap()
            .contains("refused"));
        r.resume(1);
        let s = r.snapshot(None);
        assert_eq!((s[1].state, s[1].cause.clone()), (RailState::Active, None));
        assert!(r.any_active());
    }

    #[test]
    fn weights_follow_the_measured_rates_and_default_to_their_mean() {
        let r = Rails::new(
            vec![("a".into(), "A".into()), ("b".into(), "B".into())],
            vec![0, 1, 1],
        );
        assert_eq!(r.weights(&[0, 1, 2]), vec![1.0, 1.0, 1.0]);
        r.measured(0, 200, Duration::from_secs(1));
        r.measured(1, 100, Duration::from_secs(1));
        assert_eq!(r.weights(&[0, 1, 2]), vec![200.0, 100.0, 200.0]);
        r.measured(0, 100, Duration::from_secs(1));
        assert_eq!(r.weights(&[0]), vec![125.0]);
        // Rail 1's two streams (100 + 125) outweigh rail 0's one (125).
        assert_eq!(r.best(), Some(1));
    }
}
