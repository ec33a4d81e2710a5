//! What peers moved into and out of this agent's regions (the target's side of the counters in
//! [`crate::stats`], which count what this agent initiated): bytes and op chunks by peer, path
//! and direction, for `/metrics`.
//!
//! Each serving connection takes its counters once ([`Served::counters`]) and adds to them
//! with relaxed atomics, so the hot paths (a data stream's chunks, the shm ring's requests)
//! take no lock. Counted when the target grants the op: a tcp chunk once its bytes are in place
//! or sent, an shm op when its lease is granted (`ShmBegin`, ring `BEGIN`: the initiator copies
//! through its own mapping) or its inline/staged copy is done. One-sided rdma and fabric ops
//! never reach the target's CPU and are not counted here.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The counters of one (peer, path).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    write_bytes: AtomicU64,
    write_ops: AtomicU64,
    read_bytes: AtomicU64,
    read_ops: AtomicU64,
}

impl Counters {
    /// One op chunk of `bytes` served; `write`: into the region.
    pub(crate) fn add(&self, write: bool, bytes: u64) {
        let (b, o) = if write {
            (&self.write_bytes, &self.write_ops)
        } else {
            (&self.read_bytes, &self.read_ops)
        };
        b.fetch_add(bytes, Ordering::Relaxed);
        o.fetch_add(1, Ordering::Relaxed);
    }
}

/// Bytes and op chunks peers moved through this agent, by peer, path and direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedStat {
    /// The peer agent's name (as its handshake gave it).
    pub peer: String,
    /// `tcp` or `shm`.
    pub path: &'static str,
    /// `write` (the peer wrote into a region here) or `read` (it read from one).
    pub direction: &'static str,
    /// Bytes.
    pub bytes: u64,
    /// Op chunks.
    pub ops: u64,
}

/// Every (peer, path)'s counters.
#[derive(Debug, Default)]
pub(crate) struct Served {
    by: Mutex<HashMap<(String, &'static str), Arc<Counters>>>,
}

/// Distinct peer names kept; later ones are counted under `"(other)"` so a peer cycling
/// through names cannot grow the table (or the `/metrics` page) without bound.
const MAX_PEERS: usize = 1024;

impl Served {
    /// The counters of `peer` on `path`.
    pub(crate) fn counters(&self, peer: &str, path: &'static str) -> Arc<Counters> {
        let mut m = self.by.lock().unwrap_or_else(|p| p.into_inner());
        let known = m.contains_key(&(peer.to_string(), path));
        let name = if known || m.len() < MAX_PEERS {
            peer
        } else {
            "(other)"
        };
        Arc::clone(m.entry((name.to_string(), path)).or_default())
    }

    /// A snapshot, sorted by peer, path and direction; directions with no op left out.
    pub(crate) fn snapshot(&self) -> Vec<ServedStat> {
        let m = self.by.lock().unwrap_or_else(|p| p.into_inner());
        let mut v = Vec::new();
        for ((peer, path), c) in m.iter() {
            for (direction, b, o) in [
                ("write", &c.write_bytes, &c.write_ops),
                ("read", &c.read_bytes, &c.read_ops),
            ] {
                let ops = o.load(Ordering::Relaxed);
                if ops > 0 {
                    v.push(ServedStat {
                        peer: peer.clone(),
                        path,
                        direction,
                        bytes: b.load(Ordering::Relaxed),
                        ops,
                    });
                }
            }
        }
        v.sort_by(|a, b| (&a.peer, a.path, a.direction).cmp(&(&b.peer, b.path, b.direction)));
        v
    }
}
