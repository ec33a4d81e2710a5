//! GPU and pinned host regions of a [`LocalPeer`](super::LocalPeer): [`DeviceRegion`] (device
//! memory allocated by gdx, a caller's device pointer, pool memory, or an IPC import) and
//! [`PinnedRegion`] (page-locked host memory), plus [`IpcDesc`], what another process needs to
//! map a region.
//!
//! Invariants:
//! - A region holds its `gdx_sys` buffer behind a mutex, taken only while copies are queued;
//!   the buffer's own last-use marker makes host access and the final free wait for every
//!   queued copy, so a region may be dropped while transfers on it are still running.
//! - A region knows which GPUs may not reach it directly (`not_peer_mapped`), found at
//!   registration; the planner reads it.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use gdx_sys::cuda::{DeviceBuffer, IpcHandle, PinnedHostBuffer, Stream};
use serde::Serialize;

pub use crate::desc::IpcDesc;
use crate::error::{Error, Result};
use crate::region::Location;

/// Where a [`DeviceRegion`]'s memory came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum DeviceOrigin {
    /// Allocated by gdx (`cuMemAlloc_v2`); exportable over IPC.
    Allocated,
    /// A caller's pointer (e.g. a PyTorch tensor), not from a stream-ordered pool.
    Foreign,
    /// Stream-ordered pool memory (`cuMemAllocAsync`), the caller's or gdx's.
    Pool,
    /// A VMM allocation made by gdx (`cuMemCreate`), shareable as a POSIX file descriptor.
    Shareable,
    /// Mapped from another process through CUDA IPC.
    Imported {
        /// The exporting process.
        pid: u32,
        /// The region id in the exporting process.
        region: u64,
    },
}

pub(crate) struct DeviceInner {
    pub(crate) id: u64,
    pub(crate) gpu: u32,
    pub(crate) len: u64,
    pub(crate) origin: DeviceOrigin,
    /// GPU ordinal → why that GPU cannot reach this memory directly.
    pub(crate) not_peer_mapped: BTreeMap<u32, String>,
    pub(crate) buf: Mutex<DeviceBuffer>,
}

impl DeviceInner {
    pub(crate) fn lock(&self) -> MutexGuard<'_, DeviceBuffer> {
        self.buf.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Device memory registered with a [`LocalPeer`](super::LocalPeer). Cheap to clone (clones
/// name the same memory); freed (when owned) after the last clone and the last queued copy.
#[derive(Clone)]
pub struct DeviceRegion {
    pub(crate) inner: Arc<DeviceInner>,
}

impl fmt::Debug for DeviceRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceRegion")
            .field("id", &self.inner.id)
            .field("gpu", &self.inner.gpu)
            .field("len", &self.inner.len)
            .field("origin", &self.inner.origin)
            .finish()
    }
}

impl DeviceRegion {
    /// Region id, unique within the process.
    pub fn id(&self) -> u64 {
        self.inner.id
    }
    /// CUDA ordinal of the GPU holding the memory.
    pub fn gpu(&self) -> u32 {
        self.inner.gpu
    }
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.inner.len
    }
    /// Whether the region has no bytes (never: regions have at least one).
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }
    /// Where the memory came from.
    pub fn origin(&self) -> &DeviceOrigin {
        &self.inner.origin
    }
    /// `Location::Gpu(n)`.
    pub fn location(&self) -> Location {
        Location::Gpu(self.inner.gpu)
    }
    /// The device address. Still owned by the region: do not free it.
    pub fn device_ptr(&self) -> u64 {
        self.inner.lock().as_raw()
    }

    /// Whether GPU `ordinal` can reach this memory directly, or why not (e.g. "is
    /// stream-ordered pool memory of GPU1 without access for GPU0 (cuMemPoolSetAccess not
    /// granted)"). Only memory from a pool can be unmapped for a GPU whose context has peer
    /// access.
    ///
    /// # Errors
    /// [`Error::Unavailable`] with the reason.
    pub fn peer_mapped(&self, ordinal: u32) -> Result<()> {
        match self.not_peer_mapped(ordinal) {
            Some(why) => Err(Error::unavailable(None, why.to_string())),
            None => Ok(()),
        }
    }

    /// Why GPU `ordinal` cannot reach this memory directly; `None` when it can.
    pub(crate) fn not_peer_mapped(&self, ordinal: u32) -> Option<&str> {
        self.inner.not_peer_mapped.get(&ordinal).map(String::as_str)
    }

    /// Copy `bytes` from ordinary host memory into the region at `offset`, and wait.
    pub(crate) fn write_from_host(&self, stream: &Stream, offset: u64, bytes: &[u8]) -> Result<()> {
        crate::region::check_bounds(offset, bytes.len() as u64, self.inner.len)?;
        let mut buf = self.inner.lock();
        Ok(stream.copy_from_pageable(&mut buf, offset as usize, bytes)?)
    }

    /// Copy `out.len()` bytes of the region at `offset` into ordinary host memory, and wait.
    pub(crate) fn read_to_host(&self, stream: &Stream, offset: u64, out: &mut [u8]) -> Result<()> {
        crate::region::check_bounds(offset, out.len() as u64, self.inner.len)?;
        let buf = self.inner.lock();
        Ok(stream.copy_to_pageable(out, &buf, offset as usize)?)
    }

    /// Wait on the host until every queued copy that uses the region is done.
    pub fn synchronize(&self) -> Result<()> {
        Ok(self.inner.lock().synchronize()?)
    }
}

pub(crate) struct PinnedInner {
    pub(crate) id: u64,
    pub(crate) buf: Mutex<PinnedHostBuffer>,
}

impl PinnedInner {
    pub(crate) fn lock(&self) -> MutexGuard<'_, PinnedHostBuffer> {
        self.buf.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Page-locked host memory registered with a [`LocalPeer`](super::LocalPeer) (portable, so
/// every GPU copies with it at full speed). Cheap to clone.
#[derive(Clone)]
pub struct PinnedRegion {
    pub(crate) inner: Arc<PinnedInner>,
}

impl fmt::Debug for PinnedRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedRegion")
            .field("id", &self.inner.id)
            .field("len", &self.len())
            .finish()
    }
}

impl PinnedRegion {
    /// Region id, unique within the process.
    pub fn id(&self) -> u64 {
        self.inner.id
    }
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.inner.lock().len() as u64
    }
    /// Whether the region has no bytes (never).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Run `f` on the bytes, after every queued copy that uses them is done.
    pub fn with_bytes<T>(&self, f: impl FnOnce(&[u8]) -> T) -> Result<T> {
        let buf = self.inner.lock();
        Ok(f(buf.as_slice()?))
    }
    /// Run `f` on the bytes, writable, after every queued copy that uses them is done.
    pub fn with_bytes_mut<T>(&self, f: impl FnOnce(&mut [u8]) -> T) -> Result<T> {
        let mut buf = self.inner.lock();
        Ok(f(buf.as_mut_slice()?))
    }
}

/// One end of a local copy.
#[derive(Debug, Clone, Copy)]
pub enum Mem<'a> {
    /// Device memory.
    Gpu(&'a DeviceRegion),
    /// Pinned host memory.
    Pinned(&'a PinnedRegion),
}

impl<'a> From<&'a DeviceRegion> for Mem<'a> {
    fn from(r: &'a DeviceRegion) -> Self {
        Mem::Gpu(r)
    }
}

impl<'a> From<&'a PinnedRegion> for Mem<'a> {
    fn from(r: &'a PinnedRegion) -> Self {
        Mem::Pinned(r)
    }
}

impl Mem<'_> {
    pub(crate) fn location(&self) -> Location {
        match self {
            Mem::Gpu(r) => r.location(),
            Mem::Pinned(_) => Location::PinnedHost,
        }
    }
    pub(crate) fn len(&self) -> u64 {
        match self {
            Mem::Gpu(r) => r.len(),
            Mem::Pinned(r) => r.len(),
        }
    }
    pub(crate) fn id(&self) -> (bool, u64) {
        match self {
            Mem::Gpu(r) => (true, r.id()),
            Mem::Pinned(r) => (false, r.id()),
        }
    }
}

pub(crate) fn handle_to_hex(h: &IpcHandle) -> String {
    h.0.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn handle_from_hex(s: &str) -> Result<IpcHandle> {
    let bad = || Error::InvalidArgument(format!("bad IPC handle {s:?}: want 128 hex digits"));
    if s.len() != 128 || !s.is_ascii() {
        return Err(bad());
    }
    let mut out = [0u8; 64];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(IpcHandle(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipc_handles_round_trip_through_hex() {
        let mut b = [0u8; 64];
        for (i, x) in b.iter_mut().enumerate() {
            *x = (i * 7) as u8;
        }
        let h = IpcHandle(b);
        assert_eq!(handle_from_hex(&handle_to_hex(&h)).unwrap(), h);
        assert!(handle_from_hex("zz").is_err());
        assert!(handle_from_hex(&"g".repeat(128)).is_err());
    }
}
