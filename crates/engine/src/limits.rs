//! Bounds on what peers can make an agent hold, and the counters that say when one was hit.
//!
//! Every bound is a [`Limits`] field (documented there and in `docs/wire-protocol.md`); hitting
//! one logs a warning naming the bound and its setting, counts it in [`LimitHits`]
//! ([`crate::Agent::limit_hits`]) and refuses the connection or the request — never silently.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
    /// Inbound connections still in their handshake (not yet authenticated) at once.
    pub max_pending: usize,
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
            max_name_bytes: 256,
            max_queued_notifications: 1024,
            max_queued_notification_bytes: 64 << 20,
            max_leases_per_conn: MAX_OPS_PER_BEGIN,
        }
    }
}

impl Limits {
    pub(crate) fn validate(&self) -> Result<()> {
        if self.handshake_timeout.is_zero() || self.idle_timeout.is_zero() {
            return Err(Error::InvalidArgument(
                "handshake and idle timeouts must be > 0".into(),
            ));
        }
        let counts = [
            ("max_connections", self.max_connections),
            ("max_connections_per_addr", self.max_connections_per_addr),
            ("max_pending", self.max_pending),
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
    /// Connections refused: `max_connections`.
    pub connections: AtomicU64,
    /// Connections refused: `max_connections_per_addr`.
    pub connections_per_addr: AtomicU64,
    /// Connections refused: `max_pending`.
    pub pending: AtomicU64,
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
}

impl LimitHits {
    /// Counts a hit and logs it.
    pub(crate) fn hit(&self, c: &AtomicU64, what: &str) {
        c.fetch_add(1, Ordering::Relaxed);
        log::warn!("gdx: limit hit: {what}");
    }
}

/// Admission of inbound connections: counts open and pending ones per agent and per address.
#[derive(Debug, Default)]
pub(crate) struct Gate {
    total: AtomicUsize,
    pending: AtomicUsize,
    per_addr: Mutex<HashMap<IpAddr, usize>>,
}

/// One admitted connection; releases its counts on drop.
#[derive(Debug)]
pub(crate) struct Slot {
    gate: Arc<Gate>,
    addr: Option<IpAddr>,
    pending: bool,
}

impl Gate {
    /// Admits a connection from `addr` (None: the unix socket) or says which bound refused it.
    pub(crate) fn admit(
        self: &Arc<Self>,
        addr: Option<IpAddr>,
        l: &Limits,
        hits: &LimitHits,
    ) -> Option<Slot> {
        if self.total.fetch_add(1, Ordering::SeqCst) >= l.max_connections {
            self.total.fetch_sub(1, Ordering::SeqCst);
            hits.hit(
                &hits.connections,
                &format!("max_connections ({}) open", l.max_connections),
            );
            return None;
        }
        if self.pending.fetch_add(1, Ordering::SeqCst) >= l.max_pending {
            self.pending.fetch_sub(1, Ordering::SeqCst);
            self.total.fetch_sub(1, Ordering::SeqCst);
            hits.hit(
                &hits.pending,
                &format!("max_pending ({}) handshakes in progress", l.max_pending),
            );
            return None;
        }
        if let Some(a) = addr {
            let mut m = self.per_addr.lock().unwrap_or_else(|p| p.into_inner());
            let n = m.entry(a).or_insert(0);
            if *n >= l.max_connections_per_addr {
                drop(m);
                self.pending.fetch_sub(1, Ordering::SeqCst);
                self.total.fetch_sub(1, Ordering::SeqCst);
                hits.hit(
                    &hits.connections_per_addr,
                    &format!(
                        "max_connections_per_addr ({}) from {a}",
                        l.max_connections_per_addr
                    ),
                );
                return None;
            }
            *n += 1;
        }
        Some(Slot {
            gate: Arc::clone(self),
            addr,
            pending: true,
        })
    }
}

impl Slot {
    /// The connection authenticated: it no longer counts as pending.
    pub(crate) fn authenticated(&mut self) {
        if std::mem::replace(&mut self.pending, false) {
            self.gate.pending.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.authenticated();
        self.gate.total.fetch_sub(1, Ordering::SeqCst);
        if let Some(a) = self.addr {
            let mut m = self.gate.per_addr.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(n) = m.get_mut(&a) {
                *n -= 1;
                if *n == 0 {
                    m.remove(&a);
                }
            }
        }
    }
}
