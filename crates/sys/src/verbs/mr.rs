//! [`MemoryRegion`]: memory registered with an RDMA device, three ways:
//!
//! - [`RdmaContext::register_host`]: host memory, `ibv_reg_mr`.
//! - [`RdmaContext::register_device_address`]: GPU memory by its device address,
//!   `ibv_reg_mr` again; the kernel resolves the address through a peer-memory client
//!   (`nvidia_peermem`), without which it answers `EFAULT`.
//! - [`RdmaContext::register_dmabuf`]: memory exported as a dma-buf, `ibv_reg_dmabuf_mr`.
//!
//! Invariants: a region holds its [`RdmaContext`] (so the protection domain outlives it) and
//! deregisters itself exactly once on drop; a failed deregistration is logged, never a panic.

use super::context::RdmaContext;
use super::error::{Errno, VerbsError};
use rdma_mummy_sys::ibv_mr;
use std::ffi::c_void;
use std::fmt;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;

/// What a memory region lets the device do. Local read is always allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access {
    /// The local device may write into it (needed to receive RDMA READ data).
    pub local_write: bool,
    /// Remote peers may RDMA WRITE into it.
    pub remote_write: bool,
    /// Remote peers may RDMA READ from it.
    pub remote_read: bool,
    /// Let the NIC relax PCIe write ordering (`IBV_ACCESS_RELAXED_ORDERING`; ignored by
    /// libibverbs when unsupported).
    pub relaxed_ordering: bool,
}

impl Access {
    /// Local write plus remote read and write: what a transfer region needs.
    pub const ALL: Access = Access {
        local_write: true,
        remote_write: true,
        remote_read: true,
        relaxed_ordering: false,
    };

    /// The `ibv_access_flags` bits. Remote write implies local write (verbs requires it).
    pub fn bits(self) -> i32 {
        let mut b = 0u32;
        if self.local_write || self.remote_write {
            b |= rdma_mummy_sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
        }
        if self.remote_write {
            b |= rdma_mummy_sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        }
        if self.remote_read {
            b |= rdma_mummy_sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
        }
        if self.relaxed_ordering {
            b |= rdma_mummy_sys::ibv_access_flags::IBV_ACCESS_RELAXED_ORDERING.0;
        }
        i32::try_from(b).unwrap_or(0)
    }
}

/// Memory registered with one RDMA device; deregistered when dropped.
pub struct MemoryRegion {
    mr: NonNull<ibv_mr>,
    ctx: RdmaContext,
    addr: u64,
    len: usize,
    lkey: u32,
    rkey: u32,
}

// SAFETY: an `ibv_mr` is an immutable record after registration (the fields are only read
// here) and `ibv_dereg_mr` runs once, in `Drop`, which needs ownership.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above: shared references only read copied fields.
unsafe impl Sync for MemoryRegion {}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("device", &self.ctx.name())
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#x}", self.lkey))
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .finish()
    }
}

impl MemoryRegion {
    /// Take ownership of a registration `ibv_reg_*` just returned.
    /// The result of the `ibv_reg_*mr` call `call`: the region it returned, or on null the
    /// errno it set (read first, before anything can change it), naming `what` it registered.
    fn adopt_or_errno(
        ctx: &RdmaContext,
        call: &'static str,
        mr: *mut ibv_mr,
        addr: u64,
        len: usize,
        what: impl FnOnce() -> String,
    ) -> Result<MemoryRegion, VerbsError> {
        let errno = Errno::last();
        match NonNull::new(mr) {
            Some(mr) => Ok(MemoryRegion::adopt(ctx, mr, addr, len)),
            None => Err(VerbsError::from_errno(call, ctx.name(), what(), errno)),
        }
    }

    fn adopt(ctx: &RdmaContext, mr: NonNull<ibv_mr>, addr: u64, len: usize) -> MemoryRegion {
        // SAFETY: `mr` points to the record the successful registration returned; it stays
        // valid until `ibv_dereg_mr`, which only `Drop` calls.
        let (lkey, rkey) = unsafe { (mr.as_ref().lkey, mr.as_ref().rkey) };
        MemoryRegion {
            mr,
            ctx: ctx.clone(),
            addr,
            len,
            lkey,
            rkey,
        }
    }

    /// The address the region is registered at: the host address, the device address, or
    /// the iova given for a dma-buf. Work requests and peers use addresses in this space.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty (never: registrations need at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The local key, for this side's scatter/gather entries.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// The remote key a peer presents to RDMA READ or WRITE this region.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// The device the region is registered with.
    pub fn context(&self) -> &RdmaContext {
        &self.ctx
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: this value owns the registration; it is released exactly once, here, and
        // the protection domain is still alive (`self.ctx` is dropped after this body).
        let rc = unsafe { rdma_mummy_sys::ibv_dereg_mr(self.mr.as_ptr()) };
        if rc != 0 {
            log::warn!(
                "ibv_dereg_mr on {} ({} bytes at {:#x}) failed: {}; the registration leaks",
                self.ctx.name(),
                self.len,
                self.addr,
                Errno(rc)
            );
        }
    }
}

fn refuse_empty(call: &'static str, len: usize) -> Result<(), VerbsError> {
    if len == 0 {
        return Err(VerbsError::InvalidArgument {
            call,
            reason: "a memory region must have at least one byte".to_string(),
        });
    }
    Ok(())
}

impl RdmaContext {
    /// Register `len` bytes of host memory at `addr` (`ibv_reg_mr`).
    ///
    /// # Safety
    ///
    /// - `addr..addr + len` is mapped host memory of this process and stays mapped (not freed,
    ///   unmapped or remapped) for as long as the returned region lives.
    /// - While the region lives, the device may read or write that memory at any time a
    ///   posted work request or a peer holding the rkey says so: the caller must not rely on
    ///   its contents while such an access may run.
    pub unsafe fn register_host(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion, VerbsError> {
        const CALL: &str = "ibv_reg_mr";
        refuse_empty(CALL, len)?;
        // SAFETY: the PD is live (held by `self`); the caller guarantees the range.
        let mr = unsafe {
            rdma_mummy_sys::ibv_reg_mr(
                self.raw_pd().as_ptr(),
                addr.cast::<c_void>(),
                len,
                access.bits(),
            )
        };
        let what = || format!("{len} bytes of host memory at {addr:p}");
        MemoryRegion::adopt_or_errno(self, CALL, mr, addr as u64, len, what)
    }

    /// Register `len` bytes of GPU memory at device address `addr` through the peer-memory
    /// client (`ibv_reg_mr` on the device pointer; needs `nvidia_peermem`).
    ///
    /// # Safety
    ///
    /// - `addr..addr + len` is device memory allocated in this process (e.g. by
    ///   `cuMemAlloc`) that stays allocated for as long as the returned region lives.
    /// - While the region lives, the device may read or write that memory whenever a posted
    ///   work request or a peer holding the rkey says so.
    pub unsafe fn register_device_address(
        &self,
        addr: u64,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion, VerbsError> {
        const CALL: &str = "ibv_reg_mr";
        refuse_empty(CALL, len)?;
        let Ok(ptr) = usize::try_from(addr) else {
            return Err(VerbsError::InvalidArgument {
                call: CALL,
                reason: format!("device address {addr:#x} does not fit a pointer"),
            });
        };
        // SAFETY: the PD is live; the caller guarantees the device range. The host never
        // dereferences the pointer: the kernel resolves it through the peer-memory client.
        let mr = unsafe {
            rdma_mummy_sys::ibv_reg_mr(
                self.raw_pd().as_ptr(),
                ptr as *mut c_void,
                len,
                access.bits(),
            )
        };
        let what = || format!("{len} bytes of GPU memory at {addr:#x} (peermem)");
        MemoryRegion::adopt_or_errno(self, CALL, mr, addr, len, what)
    }

    /// Register `len` bytes starting `offset` bytes into the dma-buf `fd`, addressed by the
    /// device as `iova..iova + len` (`ibv_reg_dmabuf_mr`). The descriptor may be closed once
    /// this returns: the kernel keeps its own reference to the dma-buf.
    ///
    /// # Safety
    ///
    /// - `fd` is a dma-buf exporting at least `offset + len` bytes of memory that stays
    ///   allocated for as long as the returned region lives.
    /// - While the region lives, the device may read or write that memory whenever a posted
    ///   work request or a peer holding the rkey says so.
    pub unsafe fn register_dmabuf(
        &self,
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MemoryRegion, VerbsError> {
        const CALL: &str = "ibv_reg_dmabuf_mr";
        refuse_empty(CALL, len)?;
        if !super::has_reg_dmabuf_mr() {
            return Err(VerbsError::Unsupported {
                call: CALL,
                device: self.name().to_string(),
                detail: "the loaded libibverbs does not export ibv_reg_dmabuf_mr (rdma-core < v34)"
                    .to_string(),
            });
        }
        // SAFETY: the PD is live; `fd` is a valid descriptor for the call's duration (it is
        // borrowed) and the caller guarantees what it exports.
        let mr = unsafe {
            rdma_mummy_sys::ibv_reg_dmabuf_mr(
                self.raw_pd().as_ptr(),
                offset,
                len,
                iova,
                fd.as_raw_fd(),
                access.bits(),
            )
        };
        let what = || {
            format!(
                "{len} bytes at offset {offset} of dma-buf fd {}",
                fd.as_raw_fd()
            )
        };
        MemoryRegion::adopt_or_errno(self, CALL, mr, iova, len, what)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_write_implies_local_write() {
        let a = Access {
            remote_write: true,
            ..Access::default()
        };
        assert_eq!(a.bits(), 1 | 2);
        assert_eq!(Access::ALL.bits(), 1 | 2 | 4);
        assert_eq!(Access::default().bits(), 0);
    }
}
