//! Registration cache behaviour with a fake registrar: hits, misses, overlap-extend,
//! whole-allocation registrations, eviction by byte budget, invalidation, stats.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_rdma::cache::{CacheError, CacheStats, MemKind, MemRange, RegCache, RegRequest, Registrar};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Counts live registrations; optionally registers a whole "allocation" around the request.
#[derive(Default)]
struct Fake {
    live: Arc<AtomicUsize>,
    calls: Mutex<Vec<MemRange>>,
    /// Requests inside one of these register all of it (like dma-buf on a GPU allocation).
    allocations: Vec<MemRange>,
    fail: bool,
    delay: Duration,
}

struct Handle {
    live: Arc<AtomicUsize>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(Debug, thiserror::Error)]
#[error("fake registration failed")]
struct FakeError;

impl Registrar for Fake {
    type Request = MemRange;
    type Handle = Handle;
    type Error = FakeError;
    fn register(&self, req: &MemRange) -> Result<(Handle, MemRange), FakeError> {
        std::thread::sleep(self.delay);
        self.calls.lock().unwrap().push(*req);
        if self.fail {
            return Err(FakeError);
        }
        self.live.fetch_add(1, Ordering::SeqCst);
        let range = self
            .allocations
            .iter()
            .find(|a| a.contains(req))
            .copied()
            .unwrap_or(*req);
        Ok((
            Handle {
                live: Arc::clone(&self.live),
            },
            range,
        ))
    }
}

fn host(addr: u64, len: u64) -> MemRange {
    MemRange {
        kind: MemKind::Host,
        addr,
        len,
    }
}

fn cache(budget: u64) -> (RegCache<Fake>, Arc<AtomicUsize>) {
    let f = Fake::default();
    let live = Arc::clone(&f.live);
    (RegCache::new(f, budget), live)
}

fn calls(c: &RegCache<Fake>) -> usize {
    c.registrar().calls.lock().unwrap().len()
}

#[test]
fn same_and_contained_ranges_hit() {
    let (c, _) = cache(1 << 30);
    let a = c.get(&host(0x1000, 0x1000)).unwrap();
    let b = c.get(&host(0x1000, 0x1000)).unwrap();
    let inner = c.get(&host(0x1800, 0x100)).unwrap();
    assert!(Arc::ptr_eq(&a, &b) && Arc::ptr_eq(&a, &inner));
    assert_eq!(calls(&c), 1);
    let s = c.stats();
    assert_eq!(
        (s.hits, s.misses, s.entries, s.bytes_cached),
        (2, 1, 1, 0x1000)
    );
}

#[test]
fn overlap_extend_misses_and_the_covered_entry_is_superseded() {
    let (c, live) = cache(1 << 30);
    let small = c.get(&host(0x1000, 0x1000)).unwrap();
    drop(small);
    // Starts inside, ends past: not covered.
    let big = c.get(&host(0x1800, 0x2000)).unwrap();
    assert_eq!(big.range, host(0x1800, 0x2000));
    assert_eq!(calls(&c), 2);
    let s = c.stats();
    assert_eq!((s.hits, s.misses), (0, 2));
    // A range covering the first entirely supersedes it (it was unused).
    let all = c.get(&host(0x1000, 0x3000)).unwrap();
    assert_eq!(all.range, host(0x1000, 0x3000));
    let s = c.stats();
    assert_eq!(s.evictions, 1, "{s:?}");
    assert_eq!(
        s.entries, 2,
        "the overlapping, still-held entry stays: {s:?}"
    );
    assert_eq!(live.load(Ordering::SeqCst), 2);
}

#[test]
fn kinds_never_match_each_other() {
    let (c, _) = cache(1 << 30);
    c.get(&host(0x1000, 0x1000)).unwrap();
    let g = MemRange {
        kind: MemKind::Gpu(0),
        addr: 0x1000,
        len: 0x1000,
    };
    c.get(&g).unwrap();
    let g1 = MemRange {
        kind: MemKind::Gpu(1),
        ..g
    };
    c.get(&g1).unwrap();
    assert_eq!(calls(&c), 3);
}

#[test]
fn whole_allocation_registrations_serve_later_sub_ranges() {
    let gpu = |addr, len| MemRange {
        kind: MemKind::Gpu(0),
        addr,
        len,
    };
    let f = Fake {
        allocations: vec![gpu(0x10_0000, 0x10_0000)],
        ..Fake::default()
    };
    let c = RegCache::new(f, 1 << 30);
    let first = c.get(&gpu(0x10_0000, 0x1000)).unwrap();
    assert_eq!(first.range, gpu(0x10_0000, 0x10_0000));
    c.get(&gpu(0x18_0000, 0x8_0000)).unwrap();
    assert_eq!(calls(&c), 1);
    assert_eq!(c.stats().bytes_registered, 0x10_0000);
}

#[test]
fn eviction_by_budget_drops_least_recently_used_unheld_entries() {
    let (c, live) = cache(3 * 4096);
    let a = c.get(&host(0x10000, 4096)).unwrap();
    let b = c.get(&host(0x20000, 4096)).unwrap();
    let held = c.get(&host(0x30000, 4096)).unwrap();
    drop(a);
    drop(b);
    // Touch `a` so `b` becomes the least recently used.
    drop(c.get(&host(0x10000, 4096)).unwrap());
    let d = c.get(&host(0x40000, 4096)).unwrap();
    let s = c.stats();
    assert_eq!(s.evictions, 1, "{s:?}");
    assert_eq!(s.bytes_cached, 3 * 4096);
    assert_eq!(live.load(Ordering::SeqCst), 3, "b was deregistered");
    // b is gone (miss), a is still there (hit).
    let before = calls(&c);
    drop(c.get(&host(0x10000, 4096)).unwrap());
    assert_eq!(calls(&c), before);
    drop((held, d));
}

#[test]
fn entries_in_use_are_never_evicted_even_over_budget() {
    let (c, live) = cache(4096);
    let a = c.get(&host(0x10000, 4096)).unwrap();
    let b = c.get(&host(0x20000, 4096)).unwrap();
    let s = c.stats();
    assert_eq!((s.evictions, s.over_budget, s.entries), (0, 1, 2));
    assert_eq!(live.load(Ordering::SeqCst), 2);
    drop((a, b));
    // The next insertion can evict them.
    let _x = c.get(&host(0x30000, 4096)).unwrap();
    assert_eq!(c.stats().entries, 1);
    assert_eq!(live.load(Ordering::SeqCst), 1);
}

#[test]
fn invalidation_drops_overlapping_entries_but_holders_keep_theirs() {
    let (c, live) = cache(1 << 30);
    let held = c.get(&host(0x1000, 0x1000)).unwrap();
    drop(c.get(&host(0x3000, 0x1000)).unwrap());
    drop(c.get(&host(0x9000, 0x1000)).unwrap());
    assert_eq!(c.invalidate(&host(0x1800, 0x2000)), 2);
    let s = c.stats();
    assert_eq!((s.invalidations, s.entries), (2, 1));
    assert_eq!(
        live.load(Ordering::SeqCst),
        2,
        "the held registration lives on"
    );
    drop(held);
    assert_eq!(live.load(Ordering::SeqCst), 1);
    // The next lookup of the invalidated range registers again.
    drop(c.get(&host(0x1000, 0x1000)).unwrap());
    assert_eq!(c.stats().misses, 4);
    assert_eq!(c.clear(), 2);
    assert_eq!(live.load(Ordering::SeqCst), 0);
}

#[test]
fn failures_and_empty_ranges_are_errors_and_counted() {
    let f = Fake {
        fail: true,
        ..Fake::default()
    };
    let c = RegCache::new(f, 1 << 30);
    assert!(matches!(
        c.get(&host(0x1000, 1)),
        Err(CacheError::Register(FakeError))
    ));
    assert!(matches!(c.get(&host(0x1000, 0)), Err(CacheError::Empty)));
    let s = c.stats();
    assert_eq!((s.failures, s.misses, s.entries), (1, 1, 0));
}

#[test]
fn time_spent_registering_is_counted() {
    let f = Fake {
        delay: Duration::from_millis(2),
        ..Fake::default()
    };
    let c = RegCache::new(f, 1 << 30);
    c.get(&host(0x1000, 4096)).unwrap();
    c.get(&host(0x1000, 4096)).unwrap();
    let s: CacheStats = c.stats();
    assert!(s.register_time >= Duration::from_millis(2), "{s:?}");
    assert_eq!(s.bytes_registered, 4096);
    let j = serde_json::to_value(s).unwrap();
    assert!(j.get("register_time").is_some(), "{j}");
}

#[test]
fn ranges_contain_and_overlap() {
    let a = host(100, 100);
    assert!(a.contains(&host(100, 100)) && a.contains(&host(150, 50)));
    assert!(!a.contains(&host(150, 51)) && !a.contains(&host(99, 2)));
    assert!(a.overlaps(&host(199, 10)) && !a.overlaps(&host(200, 10)));
    assert_eq!(host(u64::MAX - 1, 10).end(), u64::MAX);
    assert_eq!(a.range(), a);
}
