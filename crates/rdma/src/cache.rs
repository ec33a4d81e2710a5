//! [`RegCache`]: a registration cache, because registering memory is what users pay for first
//! (pinning and mapping a large buffer takes milliseconds to seconds).
//!
//! Behaviour, unit-tested with a fake [`Registrar`]:
//! - **Hit** when a cached registration of the same memory kind contains the requested range
//!   (same range or a sub-range).
//! - **Miss** otherwise, including a range that overlaps a cached one and extends past it:
//!   the registrar registers the request (it may register more, e.g. a whole GPU allocation
//!   for dma-buf, and says so). Unused cached entries the new one fully covers are dropped.
//! - **Eviction** by a byte budget, least recently used first, only of entries nobody holds
//!   (an entry in use is never deregistered under its user). The cache may exceed the budget
//!   while everything is in use; [`CacheStats::over_budget`] counts those moments.
//! - **Invalidation**: [`RegCache::invalidate`] drops every entry overlapping memory that is
//!   going away (a region being dropped); holders keep theirs alive until they let go.
//! - **Stats** ([`CacheStats`]): hits, misses, evictions, invalidations, failures, bytes
//!   cached and registered, and the wall time spent registering and deregistering.
//!
//! Lookups scan the entries of one memory kind linearly: caches hold tens to hundreds of
//! registrations, and the scan is far cheaper than one registration.

use serde::Serialize;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What kind of memory a range is in; registrations never match across kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum MemKind {
    /// Host memory.
    Host,
    /// Memory of GPU `n` (CUDA ordinal).
    Gpu(u32),
}

impl fmt::Display for MemKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemKind::Host => f.write_str("host"),
            MemKind::Gpu(n) => write!(f, "gpu{n}"),
        }
    }
}

/// A range of memory: kind, first address, length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct MemRange {
    /// Kind.
    pub kind: MemKind,
    /// First address (host virtual or GPU device address).
    pub addr: u64,
    /// Bytes.
    pub len: u64,
}

impl MemRange {
    /// One past the last address (saturating).
    pub fn end(&self) -> u64 {
        self.addr.saturating_add(self.len)
    }

    /// Whether `other` lies inside this range (same kind).
    pub fn contains(&self, other: &MemRange) -> bool {
        self.kind == other.kind && self.addr <= other.addr && other.end() <= self.end()
    }

    /// Whether the two ranges share at least one byte (same kind).
    pub fn overlaps(&self, other: &MemRange) -> bool {
        self.kind == other.kind && self.addr < other.end() && other.addr < self.end()
    }
}

impl fmt::Display for MemRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} bytes of {} memory at {:#x}",
            self.len, self.kind, self.addr
        )
    }
}

/// A request the cache can look up: it names the memory range it needs registered.
pub trait RegRequest {
    /// The range that must be covered.
    fn range(&self) -> MemRange;
}

impl RegRequest for MemRange {
    fn range(&self) -> MemRange {
        *self
    }
}

/// Registers memory for the cache. The real one registers with a verbs device
/// ([`crate::register::VerbsRegistrar`]); tests use a fake.
pub trait Registrar {
    /// What is looked up.
    type Request: RegRequest;
    /// A registration; dropping it deregisters.
    type Handle: Send + Sync;
    /// Why registration failed.
    type Error;
    /// Register at least `req.range()`; return the handle and the range it really covers
    /// (which must contain the request's range).
    fn register(&self, req: &Self::Request) -> Result<(Self::Handle, MemRange), Self::Error>;
}

/// A cached registration. Holding it keeps the registration alive.
#[derive(Debug)]
pub struct Cached<H> {
    /// The range the registration covers.
    pub range: MemRange,
    /// The registration.
    pub handle: H,
}

/// Counters, cumulative since the cache was made (except the current ones).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CacheStats {
    /// Lookups served from the cache.
    pub hits: u64,
    /// Lookups that registered.
    pub misses: u64,
    /// Registrations that failed.
    pub failures: u64,
    /// Entries dropped for the byte budget, or superseded by a larger registration.
    pub evictions: u64,
    /// Entries dropped by [`RegCache::invalidate`].
    pub invalidations: u64,
    /// Times an insertion left the cache over budget because every entry was in use.
    pub over_budget: u64,
    /// Entries now cached.
    pub entries: u64,
    /// Bytes now cached.
    pub bytes_cached: u64,
    /// Bytes registered in total (every miss).
    pub bytes_registered: u64,
    /// Wall time spent in the registrar.
    pub register_time: Duration,
    /// Wall time spent dropping evicted or invalidated registrations that nobody else held.
    pub deregister_time: Duration,
}

/// A failed lookup.
#[derive(Debug, thiserror::Error)]
pub enum CacheError<E> {
    /// A zero-length range.
    #[error("cannot register an empty range")]
    Empty,
    /// The registrar failed.
    #[error(transparent)]
    Register(E),
}

struct Entry<H> {
    cached: Arc<Cached<H>>,
    last_use: u64,
}

struct State<H> {
    by_kind: HashMap<MemKind, Vec<Entry<H>>>,
    tick: u64,
    stats: CacheStats,
}

/// A registration cache over a [`Registrar`], bounded by a byte budget.
pub struct RegCache<R: Registrar> {
    registrar: R,
    budget_bytes: u64,
    state: Mutex<State<R::Handle>>,
}

impl<R: Registrar> fmt::Debug for RegCache<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegCache")
            .field("budget_bytes", &self.budget_bytes)
            .field("stats", &self.stats())
            .finish()
    }
}

impl<R: Registrar> RegCache<R> {
    /// A cache keeping at most `budget_bytes` of unused registrations.
    pub fn new(registrar: R, budget_bytes: u64) -> RegCache<R> {
        RegCache {
            registrar,
            budget_bytes,
            state: Mutex::new(State {
                by_kind: HashMap::new(),
                tick: 0,
                stats: CacheStats::default(),
            }),
        }
    }

    /// The registrar.
    pub fn registrar(&self) -> &R {
        &self.registrar
    }

    /// The byte budget.
    pub fn budget_bytes(&self) -> u64 {
        self.budget_bytes
    }

    fn lock(&self) -> MutexGuard<'_, State<R::Handle>> {
        // A panic while holding the lock leaves consistent data (every update is a single
        // push/remove), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A registration covering `req`'s range: cached, or registered now.
    ///
    /// The registrar runs without the cache lock, so two threads missing on the same range
    /// at once may both register; both entries stay valid and the spare one ages out.
    pub fn get(&self, req: &R::Request) -> Result<Arc<Cached<R::Handle>>, CacheError<R::Error>> {
        let want = req.range();
        if want.len == 0 {
            return Err(CacheError::Empty);
        }
        {
            let mut st = self.lock();
            st.tick += 1;
            let tick = st.tick;
            let hit = st
                .by_kind
                .get_mut(&want.kind)
                .and_then(|v| v.iter_mut().find(|e| e.cached.range.contains(&want)))
                .map(|e| {
                    e.last_use = tick;
                    Arc::clone(&e.cached)
                });
            if let Some(c) = hit {
                st.stats.hits += 1;
                return Ok(c);
            }
            st.stats.misses += 1;
        }
        let start = Instant::now();
        let result = self.registrar.register(req);
        let took = start.elapsed();
        let mut st = self.lock();
        st.stats.register_time += took;
        let (handle, got) = match result {
            Ok(x) => x,
            Err(e) => {
                st.stats.failures += 1;
                return Err(CacheError::Register(e));
            }
        };
        // A registrar that covers less than asked would make later hits wrong: cache only
        // what the request needs then.
        let range = if got.contains(&want) { got } else { want };
        let cached = Arc::new(Cached { range, handle });
        st.tick += 1;
        let tick = st.tick;
        st.stats.bytes_registered += range.len;
        let mut dropped: Vec<Arc<Cached<R::Handle>>> = Vec::new();
        let list = st.by_kind.entry(range.kind).or_default();
        // Unused entries the new registration covers are superseded.
        let mut i = 0;
        let mut superseded = 0;
        while i < list.len() {
            if range.contains(&list[i].cached.range) && Arc::strong_count(&list[i].cached) == 1 {
                dropped.push(list.swap_remove(i).cached);
                superseded += 1;
            } else {
                i += 1;
            }
        }
        list.push(Entry {
            cached: Arc::clone(&cached),
            last_use: tick,
        });
        st.stats.evictions += superseded;
        self.evict_over_budget(&mut st, &mut dropped);
        Self::recount(&mut st);
        drop(st);
        self.release(dropped);
        Ok(cached)
    }

    /// Drop least recently used unused entries until the cache fits its budget.
    fn evict_over_budget(
        &self,
        st: &mut State<R::Handle>,
        dropped: &mut Vec<Arc<Cached<R::Handle>>>,
    ) {
        loop {
            let total: u64 = st
                .by_kind
                .values()
                .flatten()
                .map(|e| e.cached.range.len)
                .sum();
            if total <= self.budget_bytes {
                return;
            }
            let victim = st
                .by_kind
                .iter()
                .flat_map(|(k, v)| v.iter().enumerate().map(move |(i, e)| (*k, i, e)))
                .filter(|(_, _, e)| Arc::strong_count(&e.cached) == 1)
                .min_by_key(|(_, _, e)| e.last_use)
                .map(|(k, i, _)| (k, i));
            let Some((k, i)) = victim else {
                st.stats.over_budget += 1;
                return;
            };
            if let Some(v) = st.by_kind.get_mut(&k) {
                dropped.push(v.swap_remove(i).cached);
                st.stats.evictions += 1;
            }
        }
    }

    fn recount(st: &mut State<R::Handle>) {
        st.by_kind.retain(|_, v| !v.is_empty());
        let (n, bytes) = st
            .by_kind
            .values()
            .flatten()
            .fold((0u64, 0u64), |(n, b), e| (n + 1, b + e.cached.range.len));
        st.stats.entries = n;
        st.stats.bytes_cached = bytes;
    }

    /// Drop dropped entries outside the lock, timing the ones that deregister now.
    fn release(&self, dropped: Vec<Arc<Cached<R::Handle>>>) {
        if dropped.is_empty() {
            return;
        }
        let start = Instant::now();
        let mut any = false;
        for d in dropped {
            any |= Arc::strong_count(&d) == 1;
            drop(d);
        }
        if any {
            let took = start.elapsed();
            self.lock().stats.deregister_time += took;
        }
    }

    /// Counts `dropped` as invalidated, then releases them outside the lock; returns how many.
    fn drop_entries(
        &self,
        mut st: MutexGuard<'_, State<R::Handle>>,
        dropped: Vec<Arc<Cached<R::Handle>>>,
    ) -> usize {
        let n = dropped.len();
        st.stats.invalidations += n as u64;
        Self::recount(&mut st);
        drop(st);
        self.release(dropped);
        n
    }

    /// Forget every registration overlapping `range` (memory being freed or a region being
    /// dropped); returns how many were dropped. Holders keep theirs until they let go.
    pub fn invalidate(&self, range: &MemRange) -> usize {
        let mut st = self.lock();
        let mut dropped = Vec::new();
        if let Some(v) = st.by_kind.get_mut(&range.kind) {
            let mut i = 0;
            while i < v.len() {
                if v[i].cached.range.overlaps(range) {
                    dropped.push(v.swap_remove(i).cached);
                } else {
                    i += 1;
                }
            }
        }
        self.drop_entries(st, dropped)
    }

    /// Forget everything (e.g. before closing the device).
    pub fn clear(&self) -> usize {
        let mut st = self.lock();
        let dropped: Vec<_> = st
            .by_kind
            .drain()
            .flat_map(|(_, v)| v.into_iter().map(|e| e.cached))
            .collect();
        self.drop_entries(st, dropped)
    }

    /// The counters now.
    pub fn stats(&self) -> CacheStats {
        self.lock().stats
    }
}
