//! Whom to shed when a table of connections that have not finished their handshake (or, for an
//! HTTP server, their request) is full.
//!
//! Shedding the oldest lets a flood aim: new connections arriving faster than a slow, legitimate
//! client can finish push it out every time (issue 54: 0 of 10 logins under a flood from 40
//! addresses). Instead the victim is taken from the **group that holds the most** entries
//! (a network prefix: IPv4 /24, IPv6 /64, all of loopback one; or an address inside one prefix),
//! and among groups holding as many, from the one whose connections most often **ended without
//! finishing** lately ([`Record`]): a flooding source is marked by what its own connections did,
//! a client whose connections finish is not. An address that **proved the secret** lately
//! ([`Record::proved`]: it authenticated) goes last among equals even after failures of its own:
//! that is the one thing a flood that lacks the secret cannot show, and a client that failed a
//! few handshakes (a crash, a flaky link, or the flood evicting it) would otherwise be marked
//! like the flood and shed first until it finished one. Only inside the chosen group does age
//! decide (silent entries, which have sent nothing, always go before ones that have).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Instant;

/// The network an address counts against: an IPv4 /24 (all of 127/8 for loopback, where every
/// address is the same host), an IPv6 /64 (IPv4-mapped addresses as IPv4).
pub fn prefix(a: IpAddr) -> IpAddr {
    let v4 = match a {
        IpAddr::V4(v4) => Some(v4),
        IpAddr::V6(v6) => v6.to_ipv4_mapped(),
    };
    match (v4, a) {
        (Some(v4), _) if v4.is_loopback() => IpAddr::from([127, 0, 0, 0]),
        (Some(v4), _) => {
            let o = v4.octets();
            IpAddr::from([o[0], o[1], o[2], 0])
        }
        (None, IpAddr::V6(v6)) => {
            let s = v6.segments();
            IpAddr::from([s[0], s[1], s[2], s[3], 0, 0, 0, 0])
        }
        (None, IpAddr::V4(v4)) => IpAddr::V4(v4),
    }
}

/// How a full scope groups its entries before choosing a victim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// By network prefix ([`prefix`]), then by address inside the chosen prefix: the scope is
    /// the whole table.
    Prefix,
    /// By address: the scope is one prefix.
    Address,
    /// One group: the scope is one address (age alone decides inside it).
    One,
}

/// One entry of a full scope, in arrival order (oldest first).
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    /// Its source (`None`: a unix socket, all one group).
    pub addr: Option<IpAddr>,
    /// It has sent nothing yet.
    pub silent: bool,
}

/// Most sources remembered; beyond, the least suspect are forgotten first.
const MAX_SOURCES: usize = 4096;
/// A source's count halves every this many seconds.
const HALF_LIFE_S: f64 = 10.0;
/// How long an address that proved the secret goes last among equals.
const PROVED_S: u64 = 600;

/// How often connections from each address and each prefix ended without finishing lately:
/// a count that halves every [`HALF_LIFE_S`] seconds, bounded in the sources it keeps.
#[derive(Debug, Default)]
pub struct Record {
    /// By address, and by prefix.
    by: Mutex<[HashMap<IpAddr, (f64, Instant)>; 2]>,
    /// Addresses that proved the secret, and when they last did.
    proved: Mutex<HashMap<IpAddr, Instant>>,
}

fn decayed(v: f64, since: Instant, now: Instant) -> f64 {
    v * 0.5f64.powf(now.duration_since(since).as_secs_f64() / HALF_LIFE_S)
}

/// Adds one to `k`'s count in `m`, first forgetting the least suspect half when `m` is full
/// (so a flood of fresh addresses cannot grow it).
fn bump(m: &mut HashMap<IpAddr, (f64, Instant)>, k: IpAddr, now: Instant) {
    if m.len() >= MAX_SOURCES && !m.contains_key(&k) {
        let mut v: Vec<(IpAddr, f64)> = m
            .iter()
            .map(|(k, (c, t))| (*k, decayed(*c, *t, now)))
            .collect();
        v.sort_by(|x, y| x.1.total_cmp(&y.1));
        for (k, _) in v.iter().take(m.len() / 2) {
            m.remove(k);
        }
    }
    let e = m.entry(k).or_insert((0.0, now));
    *e = (decayed(e.0, e.1, now) + 1.0, now);
}

impl Record {
    /// A connection from `a` ended without finishing its handshake (evicted, timed out,
    /// refused, closed).
    pub fn failed(&self, a: IpAddr) {
        let now = Instant::now();
        let mut m = self.by.lock().unwrap_or_else(|p| p.into_inner());
        bump(&mut m[0], a, now);
        bump(&mut m[1], prefix(a), now);
    }

    /// A connection from `a` finished its handshake (authenticated, answered): the address
    /// hosts a real client, and its count starts again from zero (its prefix keeps its own).
    pub fn finished(&self, a: IpAddr) {
        let mut m = self.by.lock().unwrap_or_else(|p| p.into_inner());
        m[0].remove(&a);
    }

    /// A connection from `a` proved the secret (it authenticated): its count starts again from
    /// zero, and for [`PROVED_S`] seconds the address goes last among addresses holding as many,
    /// whatever it fails meanwhile. Only an authenticating server calls this (an HTTP request
    /// that was answered proves nothing: [`Record::finished`]).
    pub fn proved(&self, a: IpAddr) {
        self.finished(a);
        let now = Instant::now();
        let mut m = self.proved.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() >= MAX_SOURCES && !m.contains_key(&a) {
            let ttl = std::time::Duration::from_secs(PROVED_S);
            m.retain(|_, t| now.duration_since(*t) < ttl);
            if m.len() >= MAX_SOURCES {
                // Still full of fresh ones: the stalest goes.
                if let Some(k) = m.iter().min_by_key(|(_, t)| **t).map(|(k, _)| *k) {
                    m.remove(&k);
                }
            }
        }
        m.insert(a, now);
    }

    /// Whether `a` proved the secret within the last [`PROVED_S`] seconds.
    fn proved_lately(&self, a: IpAddr) -> bool {
        let m = self.proved.lock().unwrap_or_else(|p| p.into_inner());
        m.get(&a)
            .is_some_and(|t| t.elapsed() < std::time::Duration::from_secs(PROVED_S))
    }

    /// How suspect `a` is now: as an address, or (`Group::Prefix`) its prefix. An address that
    /// proved the secret lately scores below any other.
    fn score(&self, a: Option<IpAddr>, group: Group) -> f64 {
        let Some(a) = a else { return 0.0 };
        if group != Group::Prefix && self.proved_lately(a) {
            return -1.0;
        }
        let now = Instant::now();
        let m = self.by.lock().unwrap_or_else(|p| p.into_inner());
        let (m, k) = if group == Group::Prefix {
            (&m[1], prefix(a))
        } else {
            (&m[0], a)
        };
        m.get(&k).map_or(0.0, |(c, t)| decayed(*c, *t, now))
    }
}

/// The index (into `entries`, oldest first) of the entry to shed from a full scope: silent
/// entries if any, else all; of those, the prefix (`Group::Prefix`) and then the address
/// holding the most entries of the scope, ties going to the one the [`Record`] finds most
/// suspect; inside the chosen address, the oldest. `None` only for an empty scope.
pub fn victim(entries: &[Entry], group: Group, record: &Record) -> Option<usize> {
    let any_silent = entries.iter().any(|e| e.silent);
    let mut pool: Vec<usize> = (0..entries.len())
        .filter(|&i| entries[i].silent || !any_silent)
        .collect();
    if group == Group::Prefix {
        pool = narrow(entries, pool, Group::Prefix, record);
    }
    if group != Group::One {
        pool = narrow(entries, pool, Group::Address, record);
    }
    pool.first().copied()
}

/// The entries of `pool` in the group (by prefix or by address) that holds the most entries of
/// the whole scope, ties to the most suspect, then to the group of the oldest entry.
fn narrow(entries: &[Entry], pool: Vec<usize>, by: Group, record: &Record) -> Vec<usize> {
    let key = |e: &Entry| match by {
        Group::Prefix => e.addr.map(prefix),
        _ => e.addr,
    };
    let mut held: HashMap<Option<IpAddr>, usize> = HashMap::new();
    for e in entries {
        *held.entry(key(e)).or_default() += 1;
    }
    let mut best: Option<(Option<IpAddr>, usize, f64)> = None;
    for &i in &pool {
        let e = &entries[i];
        let k = key(e);
        let n = held.get(&k).copied().unwrap_or(0);
        let s = record.score(e.addr, by);
        // The pool is oldest first: only a strictly better group replaces the best, so full
        // ties go to the oldest entry's group. Scores closer than half a failed connection
        // count as equal (decay makes them differ by a hair).
        if best.is_none_or(|(_, bn, bs)| n > bn || (n == bn && s > bs + 0.5)) {
            best = Some((k, n, s));
        }
    }
    match best {
        Some((k, _, _)) => pool
            .into_iter()
            .filter(|&i| key(&entries[i]) == k)
            .collect(),
        None => pool,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap_or_else(|e| panic!("{e}"))
    }

    fn e(a: &str, silent: bool) -> Entry {
        Entry {
            addr: Some(ip(a)),
            silent,
        }
    }

    #[test]
    fn prefixes_group_loopback_v4_24_and_v6_64() {
        let n = |s: &str| prefix(ip(s));
        assert_eq!(n("127.0.0.1"), n("127.9.8.7"));
        assert_eq!(n("10.1.2.3"), n("10.1.2.200"));
        assert_ne!(n("10.1.2.3"), n("10.1.3.3"));
        assert_eq!(n("::ffff:10.1.2.3"), n("10.1.2.9"));
        assert_eq!(n("2001:db8:1:2::1"), n("2001:db8:1:2:ffff::9"));
        assert_ne!(n("2001:db8:1:2::1"), n("2001:db8:1:3::1"));
    }

    #[test]
    fn the_prefix_holding_most_is_shed_not_the_oldest() {
        let r = Record::default();
        // The legitimate client came first (the oldest); two flooding /24s hold the rest.
        let mut v = vec![e("192.0.2.7", false)];
        for i in 0..5 {
            v.push(e(&format!("198.51.100.{i}"), false));
            v.push(e(&format!("203.0.113.{i}"), false));
        }
        v.push(e("203.0.113.99", false));
        let i = victim(&v, Group::Prefix, &r).unwrap_or(usize::MAX);
        assert_eq!(v[i].addr, Some(ip("203.0.113.0")), "{i}");
    }

    #[test]
    fn among_equal_holders_the_source_whose_connections_fail_is_shed() {
        let r = Record::default();
        for _ in 0..20 {
            for i in 2..42 {
                r.failed(ip(&format!("127.0.0.{i}")));
            }
        }
        // One entry each, the legitimate one oldest: by age alone it would go.
        let mut v = vec![e("127.0.0.1", false)];
        v.extend((2..18).map(|i| e(&format!("127.0.0.{i}"), false)));
        let i = victim(&v, Group::Address, &r).unwrap_or(usize::MAX);
        assert_ne!(v[i].addr, Some(ip("127.0.0.1")));
        assert_eq!(i, 1, "the oldest of the most suspect");
    }

    #[test]
    fn inside_the_fullest_prefix_the_suspect_address_is_shed() {
        let r = Record::default();
        for i in 2..42 {
            r.failed(ip(&format!("127.0.0.{i}")));
        }
        // All loopback: one prefix; the health checker (127.0.0.1) came first and is silent
        // like the flood, but its connections finish.
        let mut v = vec![e("127.0.0.1", true)];
        v.extend((2..33).map(|i| e(&format!("127.0.0.{i}"), true)));
        let i = victim(&v, Group::Prefix, &r).unwrap_or(usize::MAX);
        assert_ne!(v[i].addr, Some(ip("127.0.0.1")));
    }

    #[test]
    fn a_finished_handshake_clears_the_address_not_its_prefix() {
        let r = Record::default();
        for _ in 0..5 {
            r.failed(ip("10.0.0.1"));
        }
        r.finished(ip("10.0.0.1"));
        assert!(r.score(Some(ip("10.0.0.1")), Group::Address) < 0.5);
        assert!(r.score(Some(ip("10.0.0.1")), Group::Prefix) > 4.0);
    }

    #[test]
    fn an_address_that_proved_the_secret_goes_last_among_equals_despite_failures() {
        let r = Record::default();
        r.proved(ip("127.0.0.1"));
        // Afterwards its own handshakes fail more often than any flooding address's.
        for _ in 0..30 {
            r.failed(ip("127.0.0.1"));
        }
        for i in 2..42 {
            r.failed(ip(&format!("127.0.2.{i}")));
        }
        let mut v = vec![e("127.0.0.1", false)];
        v.extend((2..17).map(|i| e(&format!("127.0.2.{i}"), false)));
        // Whether it came first (the oldest) or last.
        let i = victim(&v, Group::Address, &r).unwrap_or(usize::MAX);
        assert_ne!(v[i].addr, Some(ip("127.0.0.1")), "{i}");
        v.rotate_left(1);
        let i = victim(&v, Group::Address, &r).unwrap_or(usize::MAX);
        assert_ne!(v[i].addr, Some(ip("127.0.0.1")), "{i}");
        // Without the proof, the same failures make it the one shed.
        let fresh = Record::default();
        for _ in 0..30 {
            fresh.failed(ip("127.0.0.1"));
        }
        for i in 2..42 {
            fresh.failed(ip(&format!("127.0.2.{i}")));
        }
        let i = victim(&v, Group::Address, &fresh).unwrap_or(usize::MAX);
        assert_eq!(v[i].addr, Some(ip("127.0.0.1")), "{i}");
        // It wins ties only: holding more than the others, it is still shed first.
        let w = [
            e("127.0.0.1", false),
            e("127.0.0.1", false),
            e("127.0.2.5", false),
        ];
        assert_eq!(victim(&w, Group::Address, &r), Some(0));
    }

    #[test]
    fn the_proved_table_is_bounded() {
        let r = Record::default();
        for i in 0..(MAX_SOURCES as u32 + 100) {
            let o = i.to_be_bytes();
            r.proved(IpAddr::from([10, o[1], o[2], o[3]]));
        }
        let n = r.proved.lock().unwrap_or_else(|p| p.into_inner()).len();
        assert!(n <= MAX_SOURCES, "{n}");
    }

    #[test]
    fn silent_entries_go_first_and_one_group_falls_back_to_age() {
        let r = Record::default();
        let v = [
            e("10.0.0.1", false),
            e("10.0.0.1", true),
            e("10.0.0.1", true),
        ];
        assert_eq!(victim(&v, Group::One, &r), Some(1));
        let v = [e("10.0.0.1", false), e("10.0.0.1", false)];
        assert_eq!(victim(&v, Group::One, &r), Some(0));
        assert_eq!(victim(&[], Group::One, &r), None);
    }

    #[test]
    fn the_record_is_bounded_and_keeps_the_most_suspect() {
        let r = Record::default();
        for _ in 0..50 {
            r.failed(ip("10.9.9.9"));
        }
        for i in 0..20_000u32 {
            let o = i.to_be_bytes();
            r.failed(IpAddr::from([11, o[1], o[2], o[3]]));
        }
        let n = r.by.lock().unwrap_or_else(|p| p.into_inner())[0].len();
        assert!(n <= MAX_SOURCES, "{n}");
        assert!(r.score(Some(ip("10.9.9.9")), Group::Address) > 10.0);
    }
}
