//! Admission of inbound connections before they authenticate.
//!
//! Open connections are capped in total and per address (refused beyond). Connections still in
//! their handshake ("pending") are capped per address, per network (/24, /64; all of 127/8 is
//! one) and in total, and when a cap is reached one pending connection of that scope is evicted
//! (shut down) — the newcomer is never refused. The victim is chosen by `gdx_base::shed`:
//! silent ones first, then from the network (for the total cap) or the address (for a
//! network's cap) holding the most, ties going to the source whose connections most often ended
//! without authenticating (an address that authenticated lately goes last); age decides only
//! inside that group. So a flood evicts its own
//! connections, not a slow legitimate peer's, unless it comes from that peer's own network.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use gdx_base::shed::{self, Group};

use crate::conn::Sock;
use crate::limits::{LimitHits, Limits};

/// The network a pending slot counts against (`gdx_base::shed::prefix`).
pub(crate) use gdx_base::shed::prefix as network;

/// Whether bytes (or the peer's close) wait on `s`, without waiting.
fn readable(s: &Sock) -> bool {
    use rustix::event::{PollFd, PollFlags};
    let mut p = [PollFd::new(s, PollFlags::IN)];
    rustix::event::poll(&mut p, Some(&rustix::event::Timespec::default())).unwrap_or(0) > 0
}

/// Whether a pending connection is inside the scope whose cap was reached.
type InScope<'a> = dyn Fn(&Pending) -> bool + 'a;

/// A full scope: the bound's name, its limit, who is inside, and how they are grouped.
type Scope<'a> = (&'static str, usize, &'a InScope<'a>, Group);

/// One pending connection.
#[derive(Debug)]
struct Pending {
    id: u64,
    addr: Option<IpAddr>,
    /// It sent its first frame (silent ones are evicted first).
    spoke: bool,
    /// A handle to shut it down with when evicted.
    sock: Sock,
}

/// Counts open connections per agent and per address, and holds the pending ones, oldest
/// first.
#[derive(Debug, Default)]
pub(crate) struct Gate {
    total: AtomicUsize,
    per_addr: Mutex<HashMap<IpAddr, usize>>,
    pending: Mutex<(u64, VecDeque<Pending>)>,
    /// Which sources' connections ended without authenticating, lately.
    record: shed::Record,
}

/// One admitted connection; releases its counts on drop.
#[derive(Debug)]
pub(crate) struct Slot {
    gate: Arc<Gate>,
    addr: Option<IpAddr>,
    /// Its id in the pending table while it has not authenticated.
    pending: Option<u64>,
}

impl Gate {
    /// Admits a connection from `addr` (None: the unix socket), `sock` a handle on it, or says
    /// which bound refused it. A full pending table evicts, never refuses.
    pub(crate) fn admit(
        self: &Arc<Self>,
        addr: Option<IpAddr>,
        sock: Sock,
        l: &Limits,
        hits: &LimitHits,
    ) -> Option<Slot> {
        if self.total.fetch_add(1, Ordering::SeqCst) >= l.max_connections {
            self.total.fetch_sub(1, Ordering::SeqCst);
            if let Some(a) = addr {
                self.record.failed(a);
            }
            hits.hit(
                &hits.connections,
                &format!("max_connections ({}) open", l.max_connections),
            );
            return None;
        }
        if let Some(a) = addr {
            let mut m = self.per_addr.lock().unwrap_or_else(|p| p.into_inner());
            let n = m.entry(a).or_insert(0);
            if *n >= l.max_connections_per_addr {
                drop(m);
                self.total.fetch_sub(1, Ordering::SeqCst);
                self.record.failed(a);
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
        let mut g = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let (next, q) = &mut *g;
        let same_addr = |p: &Pending| p.addr == addr;
        let same_net = |p: &Pending| p.addr.map(network) == addr.map(network);
        // The narrowest scope that is full decides whom to evict, and how its connections are
        // grouped: one address by age; one network by address; the whole table by network.
        let all = |_: &Pending| true;
        let scope: Option<Scope> =
            if q.iter().filter(|p| same_addr(p)).count() >= l.max_pending_per_addr {
                let n = l.max_pending_per_addr;
                Some(("max_pending_per_addr", n, &same_addr, Group::One))
            } else if q.iter().filter(|p| same_net(p)).count() >= l.max_pending_per_net {
                let n = l.max_pending_per_net;
                Some(("max_pending_per_net", n, &same_net, Group::Address))
            } else if q.len() >= l.max_pending {
                Some(("max_pending", l.max_pending, &all, Group::Prefix))
            } else {
                None
            };
        if let Some((bound, limit, inside, group)) = scope {
            // Silent: no frame read and no byte waiting (a legitimate peer sends its first
            // frame right after connecting, often before its serving thread ran).
            let idx: Vec<usize> = (0..q.len()).filter(|&i| inside(&q[i])).collect();
            let entries: Vec<shed::Entry> = idx
                .iter()
                .map(|&i| shed::Entry {
                    addr: q[i].addr,
                    silent: !q[i].spoke && !readable(&q[i].sock),
                })
                .collect();
            let victim = shed::victim(&entries, group, &self.record).map(|j| idx[j]);
            if let Some(old) = victim.and_then(|i| q.remove(i)) {
                old.sock.shutdown();
                let from = old
                    .addr
                    .map_or("the shm socket".to_string(), |a| a.to_string());
                hits.hit(
                    &hits.evictions,
                    &format!(
                        "{bound} ({limit}) handshakes in progress: a{} one from {from} \
                         (its {} holds the most) evicted for a new one",
                        if old.spoke { "" } else { " silent" },
                        match group {
                            Group::Prefix => "network",
                            Group::Address => "address",
                            Group::One => "address, oldest",
                        }
                    ),
                );
            }
        }
        *next += 1;
        let id = *next;
        q.push_back(Pending {
            id,
            addr,
            spoke: false,
            sock,
        });
        Some(Slot {
            gate: Arc::clone(self),
            addr,
            pending: Some(id),
        })
    }

    fn forget(&self, id: u64) {
        let mut g = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = g.1.iter().position(|p| p.id == id) {
            g.1.remove(i);
        }
    }
}

impl Slot {
    /// The connection sent its first frame: evicted after silent ones.
    pub(crate) fn spoke(&self) {
        let Some(id) = self.pending else { return };
        let mut g = self.gate.pending.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = g.1.iter_mut().find(|p| p.id == id) {
            p.spoke = true;
        }
    }

    /// The connection authenticated: it no longer counts as pending, its address's record of
    /// failed handshakes is cleared, and the address goes last among equals for a while
    /// (`gdx_base::shed::Record::proved`).
    pub(crate) fn authenticated(&mut self) {
        if let Some(id) = self.pending.take() {
            self.gate.forget(id);
            if let Some(a) = self.addr {
                self.gate.record.proved(a);
            }
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(id) = self.pending.take() {
            // Ended without authenticating (evicted, timed out, refused, closed): its source
            // is shed first next time among sources holding as many.
            self.gate.forget(id);
            if let Some(a) = self.addr {
                self.gate.record.failed(a);
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sock() -> (Sock, std::os::unix::net::UnixStream) {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap_or_else(|e| panic!("{e}"));
        (Sock::Unix(a), b)
    }

    #[test]
    fn a_full_table_evicts_the_oldest_silent_connection_of_the_address() {
        let gate = Arc::new(Gate::default());
        let hits = LimitHits::default();
        let l = Limits {
            max_pending_per_addr: 2,
            ..Limits::default()
        };
        let a: IpAddr = "10.0.0.1".parse().unwrap_or_else(|e| panic!("{e}"));
        let (s1, mut p1) = sock();
        let (s2, _p2) = sock();
        let (s3, _p3) = sock();
        let first = gate.admit(Some(a), s1, &l, &hits);
        let second = gate.admit(Some(a), s2, &l, &hits);
        assert!(first.is_some() && second.is_some());
        // The second spoke: the first (silent) is the one evicted for a third.
        if let Some(s) = &second {
            s.spoke();
        }
        let third = gate.admit(Some(a), s3, &l, &hits);
        assert!(third.is_some(), "the newcomer was refused");
        assert_eq!(hits.evictions.load(Ordering::Relaxed), 1);
        let mut b = [0u8; 1];
        assert!(
            matches!(std::io::Read::read(&mut p1, &mut b), Ok(0)),
            "the oldest silent connection was not shut down"
        );
        // Another address is not touched by this address's cap.
        let (s4, _p4) = sock();
        let other: IpAddr = "10.0.1.1".parse().unwrap_or_else(|e| panic!("{e}"));
        assert!(gate.admit(Some(other), s4, &l, &hits).is_some());
        assert_eq!(hits.evictions.load(Ordering::Relaxed), 1);
    }
}
