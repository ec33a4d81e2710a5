//! The agent's table of registered regions and the check every remote access goes through.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::mem::Mapping;

use super::lease::{Backing, Lease, LeaseKind, LeaseState, RegionInner};
use super::{check_bounds, Access, Location, RegionDesc, RegionKey};

/// The lease a remote op takes: `write` puts bytes into the region.
fn remote_kind(write: bool) -> LeaseKind {
    if write {
        LeaseKind::Sink
    } else {
        LeaseKind::Source
    }
}

/// A NIC backend that registers regions' memory with its device (the rdma and fabric
/// transports). The registry knows its backends only through this, so a new backend attaches
/// itself ([`Registry::attach`]) without the registry naming it.
pub(crate) trait NicRegistrations: Send + Sync + std::fmt::Debug {
    /// Drops region `region`'s registration: called when the region is removed, before its
    /// memory can go, so the NIC never touches freed memory.
    fn forget(&self, region: u64);
}

/// The agent's table of registered regions.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    /// The NIC backends holding registrations of region memory, told when a region goes so they
    /// deregister it first.
    nics: Mutex<Vec<Arc<dyn NicRegistrations>>>,
    next_id: AtomicU64,
    regions: Mutex<HashMap<u64, Arc<RegionInner>>>,
    names: Mutex<HashMap<String, u64>>,
    /// Bumped on every removal, so a `RegionCache` knows its entry may be stale.
    removals: AtomicU64,
}

/// One region a hot loop (the shm ring thread) looked up last, so a stream of ops to it costs
/// no table lock and no hash per op. Valid while the registry saw no removal since it was
/// filled (else looked up again, and the old entry dropped: a cache never keeps a freed
/// region's memory mapped past the next op); the lease is still taken per op, and it is what
/// refuses a region being freed.
#[derive(Debug, Default)]
pub(crate) struct RegionCache {
    entry: Option<(u64, u64, Arc<RegionInner>)>,
}

impl RegionCache {
    /// Drops the entry (the ring goes idle: nothing is kept alive while nothing runs).
    pub(crate) fn clear(&mut self) {
        self.entry = None;
    }
}

impl Registry {
    /// Tells `nic` of every region removed from now on.
    pub(crate) fn attach(&self, nic: Arc<dyn NicRegistrations>) {
        self.nics
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(nic);
    }

    fn insert(
        &self,
        backing: Backing,
        len: u64,
        access: Access,
        name: Option<String>,
    ) -> Result<Arc<RegionInner>> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let location = match &backing {
            Backing::Device(d) => d.region.location(),
            _ => Location::Host,
        };
        let inner = Arc::new(RegionInner {
            id,
            key: RegionKey(crate::mem::random_u128()?),
            len,
            access,
            location,
            name: name.clone(),
            pin: Mutex::new(None),
            backing,
            state: Mutex::new(LeaseState::default()),
            cv: Condvar::new(),
            standing: Mutex::new(Vec::new()),
        });
        if let Some(n) = name {
            let mut names = self.names.lock().unwrap_or_else(|p| p.into_inner());
            if names.contains_key(&n) {
                return Err(Error::InvalidArgument(format!(
                    "a region named {n:?} is already published"
                )));
            }
            names.insert(n, id);
        }
        self.regions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, Arc::clone(&inner));
        Ok(inner)
    }

    pub(super) fn remove(&self, inner: &RegionInner) {
        self.removals.fetch_add(1, Ordering::SeqCst);
        let nics = self.nics.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for nic in nics {
            nic.forget(inner.id);
        }
        self.regions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&inner.id);
        if let Some(n) = &inner.name {
            let mut names = self.names.lock().unwrap_or_else(|p| p.into_inner());
            if names.get(n) == Some(&inner.id) {
                names.remove(n);
            }
        }
    }

    pub(crate) fn get(&self, id: u64) -> Result<Arc<RegionInner>> {
        self.regions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
            .ok_or(Error::NoSuchRegion { region: id })
    }

    pub(crate) fn by_name(&self, name: &str) -> Result<RegionDesc> {
        let names = self.names.lock().unwrap_or_else(|p| p.into_inner());
        let id = *names.get(name).ok_or_else(|| Error::NoSuchName {
            name: name.to_string(),
            published: names.len() as u64,
        })?;
        drop(names);
        Ok(self.get(id)?.desc())
    }

    pub(crate) fn published(&self) -> Vec<RegionDesc> {
        let ids: Vec<u64> = self
            .names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .copied()
            .collect();
        ids.into_iter()
            .filter_map(|id| self.get(id).ok())
            .map(|r| r.desc())
            .collect()
    }

    /// The check every remote access goes through: id, key, access right, bounds, then a lease.
    /// `write` is true when bytes go *into* the region.
    pub(crate) fn check_remote(
        &self,
        id: u64,
        key: RegionKey,
        offset: u64,
        len: u64,
        write: bool,
        timeout: Duration,
    ) -> Result<Lease> {
        let r = self.get(id)?;
        Self::check_access(&r, id, key, offset, len, write)?;
        r.lease(remote_kind(write), timeout)
    }

    /// `check_remote` through `cache` (see [`RegionCache`]), for a small host copy: `copy(ptr)`
    /// runs with the region's address at `offset` under its locked lease state
    /// (`RegionInner::with_locked`), no lease taken. `Ok(Some(lease))`: it could not (GPU
    /// memory, a conflicting lease), the caller copies under the lease; `Ok(None)`: copied.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn with_remote_cached(
        &self,
        cache: &mut RegionCache,
        id: u64,
        key: RegionKey,
        offset: u64,
        len: u64,
        write: bool,
        timeout: Duration,
        copy: impl FnOnce(*mut u8),
    ) -> Result<Option<Lease>> {
        let gen = self.removals.load(Ordering::SeqCst);
        let fresh = !matches!(&cache.entry, Some((cid, cgen, _)) if *cid == id && *cgen == gen);
        if fresh {
            // The stale entry goes first: a failed look-up leaves the cache empty.
            cache.entry = None;
            cache.entry = Some((id, gen, self.get(id)?));
        }
        let Some((_, _, r)) = &cache.entry else {
            return Err(Error::NoSuchRegion { region: id });
        };
        Self::check_access(r, id, key, offset, len, write)?;
        let kind = remote_kind(write);
        let quick = r.with_locked(kind, |base| {
            // SAFETY: offset + len <= r.len (checked above): within the region's span.
            let at = unsafe { base.add(offset as usize) };
            copy(at)
        });
        match quick {
            Some(res) => res.map(|()| None),
            None => r.lease(kind, timeout).map(Some),
        }
    }

    fn check_access(
        r: &RegionInner,
        id: u64,
        key: RegionKey,
        offset: u64,
        len: u64,
        write: bool,
    ) -> Result<()> {
        if !r.key.ct_eq(&key) {
            return Err(Error::BadKey { region: id });
        }
        if write && !r.access.remote_write {
            return Err(Error::ReadOnly { region: id });
        }
        if !write && !r.access.remote_read {
            return Err(Error::NotReadable { region: id });
        }
        check_bounds(offset, len, r.len)
    }

    pub(crate) fn alloc(
        &self,
        len: u64,
        access: Access,
        name: Option<String>,
    ) -> Result<Arc<RegionInner>> {
        let ulen =
            usize::try_from(len).map_err(|_| Error::InvalidArgument("region too large".into()))?;
        let mut m = Mapping::memfd(ulen, name.as_deref().unwrap_or("region"))?;
        if !access.remote_write {
            m.seal_future_write();
        }
        self.insert(Backing::Owned(m), len, access, name)
    }

    /// # Safety
    /// `ptr..ptr+len` must stay valid and unaliased by Rust references until the region is retired.
    pub(crate) unsafe fn register_raw(
        &self,
        ptr: *mut u8,
        len: u64,
        access: Access,
        name: Option<String>,
    ) -> Result<Arc<RegionInner>> {
        if len == 0 {
            return Err(Error::InvalidArgument("region length must be > 0".into()));
        }
        self.insert(Backing::Borrowed { ptr }, len, access, name)
    }

    /// Registers GPU memory; peers reach it through the transports' staging or, on the same
    /// host, through its IPC handle.
    pub(crate) fn register_device(
        &self,
        gpu: crate::gpu::AgentGpu,
        access: Access,
        name: Option<String>,
    ) -> Result<Arc<RegionInner>> {
        let len = gpu.region.len();
        self.insert(Backing::Device(gpu), len, access, name)
    }
}
