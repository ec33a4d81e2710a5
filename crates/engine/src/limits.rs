//! Bounds on what peers can make an agent hold, and the counters that say when one was hit.
//!
//! Every bound is a [`Limits`] field (documented there and in `docs/wire-protocol.md`); hitting
//! one logs a warning naming the bound and its setting, counts it in [`LimitHits`]
//! ([`crate::Agent::limit_hits`]) and refuses the connection or the request — never silently.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::wire::MAX_OPS_PER_BEGIN;

/// The bounds an agent enforces on its peers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Whole-handshake deadline of an inbound connection, from accept to authenticated (and of
    /// an outbound one, from connect to every stream joined). A client that drips bytes is cut
    /// off at this deadline however often it sends.
    pub handshake_timeout: Duration,
    /// An authenticated connection that sends no frame for this long is closed (the peer sees
    /// `PeerLost` on its next use and reconnects). Checked at the granularity of `io_timeout`.
    pub idle_timeout: Duration,
    /// Inbound connections open at once (tcp control and data streams plus shm sockets).
    pub max_connections: usize,
    /// Inbound tcp connections open at once from one peer IP address.
    pub max_connections_per_addr: usize,
    /// Inbound connections still in their handshake (not yet authenticated) at once. When
    /// full, the oldest pending connection is evicted (silent ones first), never the newcomer.
    pub max_pending: usize,
    /// Pending connections from one address; beyond, its oldest pending one is evicted.
    pub max_pending_per_addr: usize,
    /// Pending connections from one network (IPv4 /24, IPv6 /64, all of 127/8); beyond, its
    /// oldest pending one is evicted.
    pub max_pending_per_net: usize,
    /// How long an inbound connection may take to send its first frame (`Hello`, `Join`,
    /// `ShmJoin`); a legitimate peer sends it at once.
    pub first_frame_timeout: Duration,
    /// Longest agent name a peer may send in `Hello` and region name it may look up (bytes).
    pub max_name_bytes: usize,
    /// Notifications queued at this agent and not yet taken by the application.
    pub max_queued_notifications: usize,
    /// Bytes of queued notification data.
    pub max_queued_notification_bytes: usize,
    /// Region leases one shm connection may hold at once (over every `ShmBegin` without its
    /// `ShmEnd`).
    pub max_leases_per_conn: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            handshake_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(600),
            max_connections: 256,
            max_connections_per_addr: 128,
            max_pending: 32,
            max_pending_per_addr: 8,
            max_pending_per_net: 16,
            first_frame_timeout: Duration::from_secs(1),
            max_name_bytes: 256,
            max_queued_notifications: 1024,
            max_queued_notification_bytes: 64 << 20,
            max_leases_per_conn: MAX_OPS_PER_BEGIN,
        }
    }
}

impl Limits {
    pub(crate) fn validate(&self) -> Result<()> {
        if self.handshake_timeout.is_zero()
            || self.idle_timeout.is_zero()
            || self.first_frame_timeout.is_zero()
        {
            return Err(Error::InvalidArgument(
                "handshake, first-frame and idle timeouts must be > 0".into(),
            ));
        }
        let counts = [
            ("max_connections", self.max_connections),
            ("max_connections_per_addr", self.max_connections_per_addr),
            ("max_pending", self.max_pending),
            ("max_pending_per_addr", self.max_pending_per_addr),
            ("max_pending_per_net", self.max_pending_per_net),
            ("max_name_bytes", self.max_name_bytes),
            ("max_queued_notifications", self.max_queued_notifications),
            ("max_leases_per_conn", self.max_leases_per_conn),
        ];
        for (name, v) in counts {
            if v == 0 {
                return Err(Error::InvalidArgument(format!("limits.{name} must be > 0")));
            }
        }
        Ok(())
    }
}

/// How often each bound was hit since the agent started.
#[derive(Debug, Default)]
pub struct LimitHits {
    /// Pending connections evicted for newer ones: `max_pending`, `max_pending_per_addr`,
    /// `max_pending_per_net`.
    pub evictions: AtomicU64,
    /// Connections closed: no first frame within `first_frame_timeout`.
    pub first_frame_timeouts: AtomicU64,
    /// Connections refused: `max_connections`.
    pub connections: AtomicU64,
    /// Connections refused: `max_connections_per_addr`.
    pub connections_per_addr: AtomicU64,
    /// Connections closed: `handshake_timeout` passed.
    pub handshake_timeouts: AtomicU64,
    /// Connections closed: `idle_timeout` passed.
    pub idle_timeouts: AtomicU64,
    /// Handshakes refused: a wrong proof, or a mode mismatch.
    pub auth_failures: AtomicU64,
    /// Shm connections refused by `SO_PEERCRED` (another user).
    pub peer_uid: AtomicU64,
    /// Names refused: `max_name_bytes`.
    pub names: AtomicU64,
    /// Notifications refused: `max_queued_notifications` / `_bytes`.
    pub notifications: AtomicU64,
    /// `ShmBegin` ops refused: `max_leases_per_conn`.
    pub leases: AtomicU64,
    /// When each counter last logged, and hits not logged since (see [`LimitHits::hit`]).
    logged: Mutex<HashMap<usize, (Option<Instant>, u64)>>,
}

/// Shortest time between two log lines of one counter: a flood of refused logins or limit
/// hits is counted in full but logged once per interval, with how many were not logged.
const LOG_EVERY: Duration = Duration::from_secs(1);

impl LimitHits {
    /// Counts a hit and logs it (at most once per second per counter, saying how many hits
    /// were not logged in between).
    pub(crate) fn hit(&self, c: &AtomicU64, what: &str) {
        c.fetch_add(1, Ordering::Relaxed);
        let key = std::ptr::from_ref(c) as usize;
        let now = Instant::now();
        let mut m = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        let e = m.entry(key).or_insert((None, 0));
        if e.0.is_some_and(|t| now.duration_since(t) < LOG_EVERY) {
            e.1 += 1;
            return;
        }
        let skipped = std::mem::replace(e, (Some(now), 0)).1;
        drop(m);
        let what = gdx_topo::printable(what);
        if skipped > 0 {
            log::warn!("gdx: limit hit: {what} ({skipped} more in the last second, not logged)");
        } else {
            log::warn!("gdx: limit hit: {what}");
        }
    }

    /// Every counter by its `/metrics` label.
    pub fn counts(&self) -> Vec<(&'static str, u64)> {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        vec![
            ("max_connections", g(&self.connections)),
            ("max_connections_per_addr", g(&self.connections_per_addr)),
            ("pending_evicted", g(&self.evictions)),
            ("first_frame_timeout", g(&self.first_frame_timeouts)),
            ("handshake_timeout", g(&self.handshake_timeouts)),
            ("idle_timeout", g(&self.idle_timeouts)),
            ("auth_failed", g(&self.auth_failures)),
            ("peer_uid", g(&self.peer_uid)),
            ("max_name_bytes", g(&self.names)),
            ("max_queued_notifications", g(&self.notifications)),
            ("max_leases_per_conn", g(&self.leases)),
        ]
    }
}
