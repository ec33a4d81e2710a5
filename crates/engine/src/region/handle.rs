//! The user's handles: [`Region`] (deregisters on drop), its byte views and [`RegionScope`]
//! for borrowed buffers.

use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::Result;

use super::lease::{Lease, LeaseKind, RegionInner};
use super::registry::Registry;
use super::{Access, Location, RegionDesc};

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
        Ok(RegionRef {
            lease: self.host_lease(LeaseKind::UserRead)?,
            _r: PhantomData,
        })
    }

    /// A mutable view of the bytes; excludes every remote access while it lives.
    ///
    /// # Errors
    /// [`Error::Timeout`] if remote accesses do not finish in time; [`Error::InvalidArgument`]
    /// for GPU memory (see [`Region::device`]).
    pub fn bytes_mut(&mut self) -> Result<RegionMut<'_>> {
        Ok(RegionMut {
            lease: self.host_lease(LeaseKind::UserWrite)?,
            _r: PhantomData,
        })
    }

    /// A user lease for a view of the host bytes; GPU memory has none.
    fn host_lease(&self, kind: LeaseKind) -> Result<Lease> {
        if self.inner.host_ptr().is_none() {
            return Err(self.inner.not_host());
        }
        self.inner.lease(kind, self.timeout)
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

/// The host bytes a user lease (`UserRead` or `UserWrite`) covers.
fn leased_bytes(lease: &Lease) -> &[u8] {
    let r = lease.region();
    let Some(ptr) = r.host_ptr() else {
        // Views of GPU regions are refused when they are made (Region::host_lease).
        return &[];
    };
    // SAFETY: a user lease excludes every writer but its holder (local and remote) while it
    // lives, and the region's memory is valid for `len` bytes until it is retired, which waits
    // for the lease.
    unsafe { std::slice::from_raw_parts(ptr, r.len as usize) }
}

impl Deref for RegionRef<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        leased_bytes(&self.lease)
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
        leased_bytes(&self.lease)
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
