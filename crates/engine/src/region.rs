//! Registered memory: [`Region`], the registry peers reach it through, and the per-region lease
//! protocol.
//!
//! Invariants:
//! - A peer reaches a region only through the registry, which checks id, the 128-bit key (in constant
//!   time), the access right and `offset + len <= len` *before* any byte is touched.
//! - Every access to region memory, by the user or by a transport thread, holds a [`Lease`]. Local
//!   shared views exclude incoming remote writes; a local mutable view excludes everything. Dropping a
//!   region (or ending a [`RegionScope`]) first refuses new leases, then waits for the running ones, so
//!   a borrowed buffer is never touched after its borrow ends.

use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::mem::Mapping;

pub use crate::desc::{Access, Location, RegionDesc, RegionKey};

/// What a lease is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseKind {
    /// The user reads through a shared view.
    UserRead,
    /// The user writes through a mutable view.
    UserWrite,
    /// A transport reads bytes out of the region (they leave it).
    Source,
    /// A transport writes bytes into the region.
    Sink,
}

#[derive(Debug, Default)]
struct LeaseState {
    user_readers: u32,
    user_writer: bool,
    sources: u32,
    sinks: u32,
    dying: bool,
}

impl LeaseState {
    fn compatible(&self, k: LeaseKind) -> bool {
        match k {
            LeaseKind::UserRead => !self.user_writer && self.sinks == 0,
            LeaseKind::UserWrite => {
                !self.user_writer && self.user_readers == 0 && self.sources == 0 && self.sinks == 0
            }
            LeaseKind::Source => !self.user_writer,
            LeaseKind::Sink => !self.user_writer && self.user_readers == 0,
        }
    }

    fn idle(&self) -> bool {
        self.user_readers == 0 && !self.user_writer && self.sources == 0 && self.sinks == 0
    }
}

enum Backing {
    Owned(Mapping),
    Borrowed {
        ptr: *mut u8,
    },
    /// GPU memory ([`crate::Agent::register_gpu`]): never dereferenced on the host; transports
    /// copy through [`crate::gpu::AgentGpu`].
    Device(crate::gpu::AgentGpu),
}

/// The shared state of one registered region.
pub(crate) struct RegionInner {
    pub(crate) id: u64,
    pub(crate) key: RegionKey,
    pub(crate) len: u64,
    pub(crate) access: Access,
    pub(crate) location: Location,
    pub(crate) name: Option<String>,
    backing: Backing,
    state: Mutex<LeaseState>,
    cv: Condvar,
}

// SAFETY: the raw pointer of a borrowed backing is only dereferenced under a lease, and leases are
// refused once the region is retired (before its borrow ends); see the module invariants.
unsafe impl Send for RegionInner {}
// SAFETY: as above; all mutable state is behind the Mutex.
unsafe impl Sync for RegionInner {}

impl fmt::Debug for RegionInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region")
            .field("id", &self.id)
            .field("len", &self.len)
            .field("access", &self.access)
            .finish()
    }
}

impl RegionInner {
    fn lock(&self) -> MutexGuard<'_, LeaseState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The host address of the region's bytes; `None` for GPU memory.
    pub(crate) fn host_ptr(&self) -> Option<*mut u8> {
        match &self.backing {
            Backing::Owned(m) => Some(m.ptr()),
            Backing::Borrowed { ptr } => Some(*ptr),
            Backing::Device(_) => None,
        }
    }

    /// The GPU memory behind a region registered with [`crate::Agent::register_gpu`].
    pub(crate) fn device(&self) -> Option<&crate::gpu::AgentGpu> {
        match &self.backing {
            Backing::Device(d) => Some(d),
            _ => None,
        }
    }

    /// The memfd of an agent-allocated region.
    pub(crate) fn fd(&self) -> Option<std::os::fd::RawFd> {
        match &self.backing {
            Backing::Owned(m) => m.fd(),
            Backing::Borrowed { .. } | Backing::Device(_) => None,
        }
    }

    fn not_host(&self) -> Error {
        Error::InvalidArgument(format!(
            "region {} is {} memory: it has no host bytes (copy it with the LocalPeer it was \
             registered from)",
            self.id, self.location
        ))
    }

    pub(crate) fn desc(&self) -> RegionDesc {
        RegionDesc {
            id: self.id,
            key: self.key,
            len: self.len,
            location: self.location,
            access: self.access,
            shareable: self.fd().is_some(),
            name: self.name.clone(),
            ipc: self.device().and_then(|d| d.ipc.clone()),
        }
    }

    /// Takes a lease of `kind`, waiting up to `timeout` for incompatible leases to end.
    pub(crate) fn lease(self: &Arc<Self>, kind: LeaseKind, timeout: Duration) -> Result<Lease> {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        loop {
            if st.dying {
                return Err(Error::RegionGone { region: self.id });
            }
            if st.compatible(kind) {
                match kind {
                    LeaseKind::UserRead => st.user_readers += 1,
                    LeaseKind::UserWrite => st.user_writer = true,
                    LeaseKind::Source => st.sources += 1,
                    LeaseKind::Sink => st.sinks += 1,
                }
                return Ok(Lease {
                    region: Arc::clone(self),
                    kind,
                });
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout(timeout));
            }
            st = self
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Refuses new leases and waits until the running ones end. Idempotent.
    pub(crate) fn retire(&self) {
        let mut st = self.lock();
        st.dying = true;
        while !st.idle() {
            st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// A held right to touch `region`'s memory in one way; released on drop.
#[derive(Debug)]
pub(crate) struct Lease {
    region: Arc<RegionInner>,
    kind: LeaseKind,
}

impl Lease {
    pub(crate) fn region(&self) -> &Arc<RegionInner> {
        &self.region
    }

    /// Host pointer to byte `offset`; the caller has bounds-checked `offset + len <=
    /// region.len`. An error for GPU memory, which transports reach through
    /// [`Lease::device`] instead.
    pub(crate) fn ptr_at(&self, offset: u64) -> Result<*mut u8> {
        debug_assert!(offset <= self.region.len);
        let base = self
            .region
            .host_ptr()
            .ok_or_else(|| self.region.not_host())?;
        // SAFETY: offset <= len, so the result is within (or one past) the region's span.
        Ok(unsafe { base.add(offset as usize) })
    }

    /// The GPU memory of a GPU region (see [`crate::Agent::register_gpu`]).
    pub(crate) fn device(&self) -> Option<&crate::gpu::AgentGpu> {
        self.region.device()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut st = self.region.lock();
        match self.kind {
            LeaseKind::UserRead => st.user_readers -= 1,
            LeaseKind::UserWrite => st.user_writer = false,
            LeaseKind::Source => st.sources -= 1,
            LeaseKind::Sink => st.sinks -= 1,
        }
        drop(st);
        self.region.cv.notify_all();
    }
}

/// Checks `offset + len` against a region length.
pub(crate) fn check_bounds(offset: u64, len: u64, region_len: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= region_len => Ok(()),
        _ => Err(Error::OutOfBounds {
            offset,
            len,
            region_len,
        }),
    }
}

/// The agent's table of registered regions.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    /// The agent's RDMA side, told when a region goes so it deregisters it first.
    pub(crate) rdma: std::sync::OnceLock<Arc<crate::transport::rdma::RdmaNode>>,
    /// The agent's fabric side, told likewise (it closes the region's MR).
    pub(crate) fabric: std::sync::OnceLock<Arc<crate::transport::fabric::FabricNode>>,
    next_id: AtomicU64,
    regions: Mutex<HashMap<u64, Arc<RegionInner>>>,
    names: Mutex<HashMap<String, u64>>,
}

impl Registry {
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
            backing,
            state: Mutex::new(LeaseState::default()),
            cv: Condvar::new(),
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

    fn remove(&self, inner: &RegionInner) {
        if let Some(node) = self.rdma.get() {
            node.forget(inner.id);
        }
        if let Some(node) = self.fabric.get() {
            node.forget(inner.id);
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
        let id = *self
            .names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .ok_or_else(|| Error::NoSuchName(name.to_string()))?;
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
        if !r.key.ct_eq(&key) {
            return Err(Error::BadKey { region: id });
        }
        if write && !r.access.remote_write {
            return Err(Error::ReadOnly { region: id });
        }
        if !write && !r.access.remote_read {
            return Err(Error::NotReadable { region: id });
        }
        check_bounds(offset, len, r.len)?;
        r.lease(
            if write {
                LeaseKind::Sink
            } else {
                LeaseKind::Source
            },
            timeout,
        )
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

/// A registered span of memory. `Region<'static>` owns its memory (allocated by the agent);
/// `Region<'scope>` borrows a caller's buffer inside [`crate::Agent::scope`].
///
/// Dropping it deregisters: peers get `NoSuchRegion` from then on, and running remote accesses are
/// waited for.
pub struct Region<'a> {
    pub(crate) inner: Arc<RegionInner>,
    registry: Arc<Registry>,
    timeout: Duration,
    _borrow: PhantomData<&'a mut [u8]>,
}

impl fmt::Debug for Region<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl<'a> Region<'a> {
    pub(crate) fn new(inner: Arc<RegionInner>, registry: Arc<Registry>, timeout: Duration) -> Self {
        Region {
            inner,
            registry,
            timeout,
            _borrow: PhantomData,
        }
    }

    /// The description to hand to peers (contains the key: share it only with peers you trust with
    /// this region's access rights).
    pub fn desc(&self) -> RegionDesc {
        self.inner.desc()
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.inner.len
    }

    /// Always false: regions are never empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Region id inside this agent.
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// Where the bytes live (`Location::Gpu(n)` for a region from
    /// [`crate::Agent::register_gpu`]).
    pub fn location(&self) -> Location {
        self.inner.location
    }

    /// The address of the region's host bytes (`None` for GPU memory), for bindings that hand a
    /// view to a foreign runtime. Valid while the region lives; reading or writing through it
    /// takes no lease, so it races with remote accesses the caller did not wait for.
    pub fn host_ptr(&self) -> Option<*mut u8> {
        self.inner.host_ptr()
    }

    /// The GPU memory of a region from [`crate::Agent::register_gpu`]: copy into and out of it
    /// with its `LocalPeer`. `None` for host memory.
    pub fn device(&self) -> Option<&crate::DeviceRegion> {
        self.inner.device().map(|d| &d.region)
    }

    /// A shared view of the bytes. Waits (up to the agent's timeout) for incoming remote writes to
    /// finish and holds them off while the view lives; remote reads proceed.
    ///
    /// # Errors
    /// [`Error::Timeout`] if a remote write does not finish in time; [`Error::InvalidArgument`]
    /// for GPU memory, which has no host view (see [`Region::device`]).
    pub fn bytes(&self) -> Result<RegionRef<'_>> {
        if self.inner.host_ptr().is_none() {
            return Err(self.inner.not_host());
        }
        let lease = self.inner.lease(LeaseKind::UserRead, self.timeout)?;
        Ok(RegionRef {
            lease,
            _r: PhantomData,
        })
    }

    /// A mutable view of the bytes; excludes every remote access while it lives.
    ///
    /// # Errors
    /// [`Error::Timeout`] if remote accesses do not finish in time; [`Error::InvalidArgument`]
    /// for GPU memory (see [`Region::device`]).
    pub fn bytes_mut(&mut self) -> Result<RegionMut<'_>> {
        if self.inner.host_ptr().is_none() {
            return Err(self.inner.not_host());
        }
        let lease = self.inner.lease(LeaseKind::UserWrite, self.timeout)?;
        Ok(RegionMut {
            lease,
            _r: PhantomData,
        })
    }
}

impl Drop for Region<'_> {
    fn drop(&mut self) {
        self.registry.remove(&self.inner);
        self.inner.retire();
    }
}

/// A shared view of a region's bytes (see [`Region::bytes`]).
pub struct RegionRef<'r> {
    lease: Lease,
    _r: PhantomData<&'r ()>,
}

impl Deref for RegionRef<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        let r = self.lease.region();
        let Some(ptr) = r.host_ptr() else {
            // Views of GPU regions are refused when they are made (Region::bytes).
            return &[];
        };
        // SAFETY: the UserRead lease excludes every writer (local and remote) while self lives, and
        // the region's memory is valid for `len` bytes until it is retired, which waits for us.
        unsafe { std::slice::from_raw_parts(ptr, r.len as usize) }
    }
}

/// A mutable view of a region's bytes (see [`Region::bytes_mut`]).
pub struct RegionMut<'r> {
    lease: Lease,
    _r: PhantomData<&'r mut ()>,
}

impl Deref for RegionMut<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        let r = self.lease.region();
        let Some(ptr) = r.host_ptr() else {
            return &[];
        };
        // SAFETY: the UserWrite lease excludes every other access while self lives.
        unsafe { std::slice::from_raw_parts(ptr, r.len as usize) }
    }
}

impl DerefMut for RegionMut<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        let r = self.lease.region();
        let Some(ptr) = r.host_ptr() else {
            return &mut [];
        };
        // SAFETY: the UserWrite lease is exclusive, and `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(ptr, r.len as usize) }
    }
}

/// A scope in which caller-owned buffers can be registered (see [`crate::Agent::scope`]). When the
/// scope ends, every region registered in it is retired, even one leaked with `mem::forget`.
pub struct RegionScope<'scope, 'env: 'scope> {
    pub(crate) registry: Arc<Registry>,
    pub(crate) timeout: Duration,
    pub(crate) regions: Mutex<Vec<Arc<RegionInner>>>,
    pub(crate) _scope: PhantomData<&'scope mut &'scope ()>,
    pub(crate) _env: PhantomData<&'env mut &'env ()>,
}

impl<'scope, 'env> RegionScope<'scope, 'env> {
    /// Registers a borrowed buffer with `access`. Published under `name` if given.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty buffer or a name already in use.
    pub fn register(
        &'scope self,
        buf: &'env mut [u8],
        access: Access,
        name: Option<&str>,
    ) -> Result<Region<'scope>> {
        // SAFETY: `buf` is borrowed mutably for 'env, which outlives the scope; the scope retires the
        // region (waiting for running leases) before it returns, so the pointer is never used after
        // the borrow ends, and no other Rust reference to `buf` exists meanwhile.
        let inner = unsafe {
            self.registry.register_raw(
                buf.as_mut_ptr(),
                buf.len() as u64,
                access,
                name.map(str::to_string),
            )?
        };
        self.regions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Arc::clone(&inner));
        Ok(Region::new(inner, Arc::clone(&self.registry), self.timeout))
    }

    pub(crate) fn end(&self) {
        let regions = std::mem::take(&mut *self.regions.lock().unwrap_or_else(|p| p.into_inner()));
        for r in regions {
            self.registry.remove(&r);
            r.retire();
        }
    }
}

#[cfg(test)]
mod tests;
