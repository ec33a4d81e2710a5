//! The per-region lease protocol: who may touch a region's bytes, and how, at any moment, and
//! the shared state ([`RegionInner`]) each registered region keeps it in.

use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::mem::Mapping;

use super::{Access, Location, RegionDesc, RegionKey};

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
pub(super) struct LeaseState {
    user_readers: u32,
    user_writer: bool,
    sources: u32,
    sinks: u32,
    dying: bool,
    /// Threads sleeping on the region's condition variable (a lease's end wakes them only
    /// when there are some: the wake is a system call on every drop otherwise).
    waiters: u32,
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

/// `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`.
const HOST_MEMORY_ALREADY_REGISTERED: u32 = 712;

/// A region's page-locked host bytes ([`RegionInner::pin_for_dma`]).
pub(crate) enum HostPin {
    /// Locked by gdx; unlocked when dropped.
    Registered(#[allow(dead_code)] gdx_sys::cuda::RegisteredHost<'static>),
    /// Locked by someone else before.
    AlreadyPinned,
}

pub(super) enum Backing {
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
    /// The host bytes page-locked for the copy engine (`ipc` ops to a peer's GPU memory), made
    /// on first use and undone when the region retires. Declared before `backing` so that an
    /// owned mapping outlives it.
    pub(super) pin: Mutex<Option<HostPin>>,
    pub(super) backing: Backing,
    pub(super) state: Mutex<LeaseState>,
    pub(super) cv: Condvar,
    /// Transports' standing leases on this region (`Revocable`), revoked when a user lease or
    /// retirement needs them gone.
    pub(super) standing: Mutex<Vec<Weak<dyn Revocable>>>,
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

    pub(super) fn not_host(&self) -> Error {
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
            no_ipc: self.device().and_then(|d| d.no_ipc.clone()),
        }
    }

    /// Takes a lease of `kind`, waiting up to `timeout` for incompatible leases to end.
    pub(crate) fn lease(self: &Arc<Self>, kind: LeaseKind, timeout: Duration) -> Result<Lease> {
        // The clock is read only if the lease has to wait (the common case never does).
        let mut deadline: Option<Instant> = None;
        let mut st = self.lock();
        loop {
            if st.dying {
                return Err(Error::RegionGone { region: self.id });
            }
            if !st.compatible(kind) && matches!(kind, LeaseKind::UserRead | LeaseKind::UserWrite) {
                drop(st);
                let revoked = self.revoke_standing();
                st = self.lock();
                if revoked {
                    continue;
                }
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
            let deadline = *deadline.get_or_insert(now + timeout);
            if now >= deadline {
                return Err(Error::Timeout(timeout));
            }
            st.waiters += 1;
            st = self
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            st.waiters -= 1;
        }
    }

    /// Runs `f` with the region's host address while its lease state is locked, as a lease of
    /// `kind` would allow, instead of taking and dropping one (four atomic operations and an
    /// `Arc` fewer): for copies of a few KiB, where holding the lock that long costs less.
    /// `None` when a lease is needed: GPU memory, or a conflicting lease held (the caller
    /// then takes one, and waits). `Some(Err)` when the region is being freed.
    pub(crate) fn with_locked(
        &self,
        kind: LeaseKind,
        f: impl FnOnce(*mut u8),
    ) -> Option<Result<()>> {
        let base = self.host_ptr()?;
        let st = self.lock();
        if st.dying {
            return Some(Err(Error::RegionGone { region: self.id }));
        }
        if !st.compatible(kind) {
            return None;
        }
        f(base);
        drop(st);
        Some(Ok(()))
    }

    /// Registers a standing lease on this region, revoked through `r` when needed.
    pub(crate) fn add_standing(&self, r: Weak<dyn Revocable>) {
        let mut list = self.standing.lock().unwrap_or_else(|p| p.into_inner());
        list.retain(|w| w.strong_count() > 0);
        list.push(r);
    }

    /// Revokes every standing lease (call with the lease state unlocked: a revoke drops a
    /// lease, which locks it). True when there was one.
    fn revoke_standing(&self) -> bool {
        let list = std::mem::take(&mut *self.standing.lock().unwrap_or_else(|p| p.into_inner()));
        let live: Vec<Arc<dyn Revocable>> = list.iter().filter_map(Weak::upgrade).collect();
        for r in &live {
            r.revoke();
        }
        !live.is_empty()
    }

    /// Refuses new leases and waits until the running ones end. Idempotent.
    pub(crate) fn retire(&self) {
        let mut st = self.lock();
        st.dying = true;
        drop(st);
        self.revoke_standing();
        let mut st = self.lock();
        while !st.idle() {
            st.waiters += 1;
            st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
            st.waiters -= 1;
        }
        drop(st);
        // No lease is left or can be taken, so no copy uses the page-locked bytes: unlock
        // them before the caller's borrow of the memory ends.
        self.pin.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// Page-locks the region's host bytes (once; `cuMemHostRegister`, portable to every
    /// context) so the copy engine reads or writes them in place. Call with a lease held: the
    /// region is then not retiring, and retiring undoes the pin.
    pub(crate) fn pin_for_dma(&self, peer: &crate::gpu::LocalPeer, gpu: u32) -> Result<()> {
        let mut pin = self.pin.lock().unwrap_or_else(|p| p.into_inner());
        if pin.is_some() {
            return Ok(());
        }
        let ptr = self.host_ptr().ok_or_else(|| self.not_host())?;
        let ctx = peer.context(gpu)?;
        // SAFETY: the region's bytes stay mapped while it is registered, and `retire` (which
        // runs before a borrowed backing's owner may free them) and the drop of an owned
        // mapping (declared after `pin`) both drop the pin first.
        let r =
            unsafe { gdx_sys::cuda::RegisteredHost::from_raw_parts(&ctx, ptr, self.len as usize) };
        *pin = Some(match r {
            Ok(h) => HostPin::Registered(h),
            // Someone (the caller, torch's pin_memory) page-locked it already: copies run at
            // pinned speed, and that owner unlocks it.
            Err(gdx_sys::cuda::CudaError::Call { code, .. })
                if code == HOST_MEMORY_ALREADY_REGISTERED =>
            {
                HostPin::AlreadyPinned
            }
            Err(e) => return Err(e.into()),
        });
        Ok(())
    }
}

/// A lease a transport holds for a peer across transfers (the shm transport's standing lease,
/// which lets the peer copy without asking per transfer). The region revokes it before a user
/// lease it would exclude, and before it retires: `revoke` returns once the peer's copies under
/// way ended and the lease is dropped. Idempotent.
pub(crate) trait Revocable: Send + Sync {
    fn revoke(&self);
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
        let wake = st.waiters > 0;
        drop(st);
        if wake {
            self.region.cv.notify_all();
        }
    }
}
