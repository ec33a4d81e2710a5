//! Owned memory: [`DeviceBuffer`] (`cuMemAlloc_v2`; VMM allocations are in `vmm`),
//! [`PinnedHostBuffer`] (`cuMemHostAlloc`, portable), [`RegisteredHost`]
//! (`cuMemHostRegister_v2` over caller memory), [`DmaBuf`] (`cuMemGetHandleForAddressRange`),
//! and pointer queries (`cuPointerGetAttribute`).
//!
//! Device memory never comes from the stream-ordered pool (`cuMemAllocAsync`): pool memory
//! needs `cuMemPoolSetAccess` for peer access, and without it peer copies silently take a slow
//! path (37.7 instead of 395.5 GB/s on the H200 test machine).
//!
//! Invariants:
//! - Every buffer holds its [`Context`], so the context outlives the memory.
//! - Every buffer carries a `Pending` marker (see `event`): host access and `Drop` wait for the
//!   last queued use first. When that wait fails the memory is leaked, never freed under a copy
//!   that may still run, and the failure is recorded on the context.
//! - Zero-byte buffers are refused: the driver cannot allocate them.

use super::api::{self, CuDevicePtr};
use super::event::Pending;
use super::{mapping, Context, Cuda, CudaError};
use std::ffi::{c_int, c_uint, c_void};
use std::fmt;
use std::marker::PhantomData;
use std::os::fd::{FromRawFd, OwnedFd};
use std::ptr::NonNull;

/// Device memory of one GPU: allocated here (`cuMemAlloc_v2`, freed with `cuMemFree_v2`), taken
/// from the device's stream-ordered pool ([`DeviceBuffer::from_pool`]), imported from another
/// process ([`DeviceBuffer::open_ipc`], closed with `cuIpcCloseMemHandle`), a VMM allocation
/// shareable as a file descriptor ([`DeviceBuffer::new_shareable`], [`DeviceBuffer::import_fd`]),
/// or borrowed from a caller ([`DeviceBuffer::from_raw_parts`], never freed here).
pub struct DeviceBuffer {
    pub(crate) ctx: Context,
    pub(crate) ptr: CuDevicePtr,
    pub(crate) len: usize,
    pub(crate) pending: Pending,
    pub(crate) release: Release,
}

/// How a [`DeviceBuffer`] gives its memory back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Release {
    /// `cuMemFree_v2` (also right for pool memory: the driver synchronises).
    Free,
    /// `cuIpcCloseMemHandle`.
    IpcClose,
    /// Nothing: the caller owns the memory.
    Borrowed,
    /// A VMM mapping (see `vmm`): `cuMemUnmap` and `cuMemAddressFree` of the `reserved_len`
    /// bytes at the pointer, then `cuMemRelease` of `handle`.
    Vmm {
        /// The allocation handle (`cuMemCreate` or `cuMemImportFromShareableHandle`).
        handle: api::CuMemGenericAllocationHandle,
        /// Bytes reserved and mapped at the pointer: the whole allocation.
        reserved_len: usize,
    },
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("gpu", &self.ctx.ordinal())
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .finish()
    }
}

pub(crate) fn refuse_empty(call: &'static str, len: usize) -> Result<(), CudaError> {
    if len == 0 {
        return Err(CudaError::InvalidArgument {
            call,
            reason: "a buffer must have at least one byte".to_string(),
        });
    }
    Ok(())
}

impl DeviceBuffer {
    /// Allocate `len` bytes on `ctx`'s GPU. The contents are undefined.
    pub fn new(ctx: &Context, len: usize) -> Result<DeviceBuffer, CudaError> {
        refuse_empty("cuMemAlloc_v2", len)?;
        ctx.make_current()?;
        let mut ptr: CuDevicePtr = 0;
        // SAFETY: `ptr` is a valid out-pointer; the context is current on this thread.
        let status = unsafe { (ctx.api().cuMemAlloc_v2)(&mut ptr, len) };
        ctx.check(status, &format!("cuMemAlloc_v2({len} bytes)"))?;
        Ok(DeviceBuffer {
            ctx: ctx.clone(),
            ptr,
            len,
            pending: Pending::default(),
            release: Release::Free,
        })
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: buffers have at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether this value frees or closes the memory when dropped (false for
    /// [`DeviceBuffer::from_raw_parts`]).
    pub fn is_owned(&self) -> bool {
        self.release != Release::Borrowed
    }

    /// The context (and GPU) the memory belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The device address. Still owned by this value: do not free it, and do not use it after
    /// the buffer is dropped.
    pub fn as_raw(&self) -> u64 {
        self.ptr
    }

    /// Wait on the host until every queued use of the buffer is done.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.pending.synchronize()
    }

    /// Export the whole buffer as a dma-buf file descriptor
    /// (`cuMemGetHandleForAddressRange` with `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`), e.g. for
    /// `ibv_reg_dmabuf_mr`. The length must be a multiple of the host page size.
    pub fn dma_buf(&self) -> Result<DmaBuf<'_>, CudaError> {
        const CALL: &str = "cuMemGetHandleForAddressRange";
        let Some(f) = self.ctx.api().cuMemGetHandleForAddressRange else {
            return Err(CudaError::MissingSymbol { call: CALL });
        };
        let page = page_size();
        if self.len & (page - 1) != 0 {
            return Err(CudaError::InvalidArgument {
                call: CALL,
                reason: format!(
                    "the length {} is not a multiple of the host page size {page}",
                    self.len
                ),
            });
        }
        self.ctx.make_current()?;
        let mut fd: c_int = -1;
        // SAFETY: `fd` is a valid out-pointer for the int a dma-buf handle is; the range is
        // this live allocation; flags must be 0.
        let status = unsafe {
            f(
                (&mut fd as *mut c_int).cast::<c_void>(),
                self.ptr,
                self.len,
                api::MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        };
        self.ctx.check(status, CALL)?;
        if fd < 0 {
            return Err(CudaError::InvalidArgument {
                call: CALL,
                reason: format!("the driver returned success with file descriptor {fd}"),
            });
        }
        Ok(DmaBuf {
            // SAFETY: the driver just opened `fd` for the caller, who owns it from now on.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            len: self.len,
            _buffer: PhantomData,
        })
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if let Err(e) = self.pending.synchronize() {
            self.ctx.record_err(e);
            log::warn!(
                "leaking {} bytes of GPU {} memory: a copy may still use them",
                self.len,
                self.ctx.ordinal()
            );
            return;
        }
        let (status, call) = match self.release {
            Release::Borrowed => return,
            // SAFETY: this value owns the allocation and no queued work uses it any more.
            Release::Free => (
                unsafe { (self.ctx.api().cuMemFree_v2)(self.ptr) },
                "cuMemFree_v2",
            ),
            Release::IpcClose => (
                // SAFETY: this value opened the mapping and no queued work uses it any more.
                unsafe { (self.ctx.api().cuIpcCloseMemHandle)(self.ptr) },
                "cuIpcCloseMemHandle",
            ),
            Release::Vmm {
                handle,
                reserved_len,
            } => {
                // SAFETY: this value mapped `reserved_len` bytes at `ptr` and owns one
                // reference to `handle`; no queued work uses the mapping any more.
                let r =
                    unsafe { mapping::release(&self.ctx, self.ptr, reserved_len, true, handle) };
                if let Err(e) = r {
                    self.ctx.record_err(e);
                }
                return;
            }
        };
        if let Err(e) = self.ctx.check(status, call) {
            self.ctx.record_err(e);
        }
    }
}

/// A dma-buf file descriptor exporting a [`DeviceBuffer`]; closed when dropped. Borrows the
/// buffer, so the memory outlives the descriptor.
#[derive(Debug)]
pub struct DmaBuf<'a> {
    fd: OwnedFd,
    len: usize,
    _buffer: PhantomData<&'a DeviceBuffer>,
}

impl DmaBuf<'_> {
    /// The descriptor.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }

    /// Bytes exported, starting at offset 0 of the descriptor.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: buffers have at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The host page size, a power of two.
fn page_size() -> usize {
    // SAFETY: sysconf only reads a configuration value.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p)
        .ok()
        .filter(|p| p.is_power_of_two())
        .unwrap_or(4096)
}

pub(crate) mod sealed {
    /// The parts of host memory the copies use; not nameable outside the crate.
    pub trait HostMemory {
        /// Start and length; valid, page-locked memory for as long as `self` lives.
        fn host_range(&self) -> (*mut u8, usize);
        /// The last-use marker.
        fn pending(&self) -> &super::Pending;
        /// Registered read-only: a copy source only.
        fn read_only(&self) -> bool {
            false
        }
    }
}

/// Page-locked host memory a stream can copy to and from: [`PinnedHostBuffer`] or
/// [`RegisteredHost`] (or only from: [`super::RegisteredFile`]). Sealed.
pub trait HostBuffer: sealed::HostMemory {
    /// Size in bytes.
    fn size(&self) -> usize {
        self.host_range().1
    }
}

/// Page-locked host memory (`cuMemHostAlloc` with `CU_MEMHOSTALLOC_PORTABLE`, so every
/// context can copy with it), freed with `cuMemFreeHost`. Zeroed when allocated.
pub struct PinnedHostBuffer {
    ctx: Context,
    ptr: NonNull<u8>,
    len: usize,
    pending: Pending,
}

// SAFETY: the buffer owns its memory like a Vec<u8>; host access goes through &self/&mut self
// after waiting for queued copies.
unsafe impl Send for PinnedHostBuffer {}
// SAFETY: as above; `&PinnedHostBuffer` only gives `&[u8]`, and copies that write the memory
// take `&mut`.
unsafe impl Sync for PinnedHostBuffer {}

impl fmt::Debug for PinnedHostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedHostBuffer")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

impl PinnedHostBuffer {
    /// Allocate `len` zeroed bytes of pinned host memory (through `ctx`, usable from all).
    pub fn new(ctx: &Context, len: usize) -> Result<PinnedHostBuffer, CudaError> {
        refuse_empty("cuMemHostAlloc", len)?;
        ctx.make_current()?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer; the context is current on this thread.
        let status = unsafe { (ctx.api().cuMemHostAlloc)(&mut p, len, api::MEMHOSTALLOC_PORTABLE) };
        ctx.check(status, &format!("cuMemHostAlloc({len} bytes)"))?;
        let Some(ptr) = NonNull::new(p.cast::<u8>()) else {
            return Err(CudaError::InvalidArgument {
                call: "cuMemHostAlloc",
                reason: "the driver returned success with a null pointer".to_string(),
            });
        };
        // SAFETY: the driver just allocated `len` writable bytes at `ptr`, used by nothing else.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, len) };
        Ok(PinnedHostBuffer {
            ctx: ctx.clone(),
            ptr,
            len,
            pending: Pending::default(),
        })
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: buffers have at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes, after every queued copy that uses the buffer is done.
    pub fn as_slice(&self) -> Result<&[u8], CudaError> {
        self.pending.synchronize()?;
        // SAFETY: `ptr` holds `len` initialised bytes (zeroed at allocation); no queued copy
        // uses them any more, and new ones that write need `&mut self`.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) })
    }

    /// The bytes, writable, after every queued copy that uses the buffer is done.
    pub fn as_mut_slice(&mut self) -> Result<&mut [u8], CudaError> {
        self.pending.synchronize()?;
        // SAFETY: as in `as_slice`; `&mut self` excludes every other access.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) })
    }
}

impl sealed::HostMemory for PinnedHostBuffer {
    fn host_range(&self) -> (*mut u8, usize) {
        (self.ptr.as_ptr(), self.len)
    }
    fn pending(&self) -> &Pending {
        &self.pending
    }
}
impl HostBuffer for PinnedHostBuffer {}

impl Drop for PinnedHostBuffer {
    fn drop(&mut self) {
        if let Err(e) = self.pending.synchronize() {
            self.ctx.record_err(e);
            log::warn!(
                "leaking {} bytes of pinned host memory: a copy may still use them",
                self.len
            );
            return;
        }
        // SAFETY: this value owns the allocation and no queued work uses it any more.
        let status = unsafe { (self.ctx.api().cuMemFreeHost)(self.ptr.as_ptr().cast()) };
        if let Err(e) = self.ctx.check(status, "cuMemFreeHost") {
            self.ctx.record_err(e);
        }
    }
}

/// Caller memory page-locked with `cuMemHostRegister_v2` (`CU_MEMHOSTREGISTER_PORTABLE`) for
/// as long as this value borrows it; unregistered when dropped.
pub struct RegisteredHost<'a> {
    ctx: Context,
    ptr: NonNull<u8>,
    len: usize,
    pending: Pending,
    _memory: PhantomData<&'a mut [u8]>,
}

// SAFETY: the value stands for a `&mut [u8]`, which is Send.
unsafe impl Send for RegisteredHost<'_> {}
// SAFETY: the value stands for a `&mut [u8]`, which is Sync; shared access gives only `&[u8]`.
unsafe impl Sync for RegisteredHost<'_> {}

impl fmt::Debug for RegisteredHost<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegisteredHost")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

impl RegisteredHost<'static> {
    /// Page-lock `len` bytes at `ptr` through `ctx` (usable from every context), memory whose
    /// lifetime no Rust borrow describes (a buffer another runtime owns, a shared mapping).
    ///
    /// # Safety
    ///
    /// `ptr..ptr + len` stays mapped until the value is dropped, and while a copy queued
    /// through the value may run, nothing else writes the bytes it reads nor touches the bytes
    /// it writes.
    pub unsafe fn from_raw_parts(
        ctx: &Context,
        ptr: *mut u8,
        len: usize,
    ) -> Result<RegisteredHost<'static>, CudaError> {
        let Some(ptr) = NonNull::new(ptr) else {
            return Err(CudaError::InvalidArgument {
                call: "cuMemHostRegister_v2",
                reason: "null pointer".to_string(),
            });
        };
        // SAFETY: the caller keeps the span mapped for the value's life (this function's
        // contract), which is all a `&'static mut` stands for here: no Rust reference to it is
        // made before `as_slice`, whose callers the contract covers.
        unsafe { Self::register(ctx, ptr, len) }
    }
}

impl<'a> RegisteredHost<'a> {
    /// Page-lock `memory` through `ctx` (usable from every context).
    pub fn new(ctx: &Context, memory: &'a mut [u8]) -> Result<RegisteredHost<'a>, CudaError> {
        let len = memory.len();
        let ptr = NonNull::from(memory).cast::<u8>();
        // SAFETY: `ptr` is valid for `len` bytes for 'a, which this value borrows exclusively.
        unsafe { Self::register(ctx, ptr, len) }
    }

    /// # Safety
    /// `ptr..ptr + len` stays mapped for 'a.
    unsafe fn register(
        ctx: &Context,
        ptr: NonNull<u8>,
        len: usize,
    ) -> Result<RegisteredHost<'a>, CudaError> {
        refuse_empty("cuMemHostRegister_v2", len)?;
        ctx.make_current()?;
        // SAFETY: `ptr` is valid for `len` bytes for 'a (this function's contract).
        let status = unsafe {
            (ctx.api().cuMemHostRegister_v2)(
                ptr.as_ptr().cast(),
                len,
                api::MEMHOSTREGISTER_PORTABLE as c_uint,
            )
        };
        ctx.check(status, &format!("cuMemHostRegister_v2({len} bytes)"))?;
        Ok(RegisteredHost {
            ctx: ctx.clone(),
            ptr,
            len,
            pending: Pending::default(),
            _memory: PhantomData,
        })
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: registrations have at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes, after every queued copy that uses them is done.
    pub fn as_slice(&self) -> Result<&[u8], CudaError> {
        self.pending.synchronize()?;
        // SAFETY: the memory came from a `&'a mut [u8]` this value still borrows; no queued
        // copy uses it any more, and new ones that write need `&mut self`.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) })
    }

    /// The bytes, writable, after every queued copy that uses them is done.
    pub fn as_mut_slice(&mut self) -> Result<&mut [u8], CudaError> {
        self.pending.synchronize()?;
        // SAFETY: as in `as_slice`; `&mut self` excludes every other access.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) })
    }
}

impl sealed::HostMemory for RegisteredHost<'_> {
    fn host_range(&self) -> (*mut u8, usize) {
        (self.ptr.as_ptr(), self.len)
    }
    fn pending(&self) -> &Pending {
        &self.pending
    }
}
impl HostBuffer for RegisteredHost<'_> {}

impl Drop for RegisteredHost<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.pending.synchronize() {
            // The wait fails only on a sticky error, after which the context runs no more
            // work, so no copy can still touch the caller's memory: unregister anyway.
            self.ctx.record_err(e);
        }
        // SAFETY: this value registered exactly this address.
        let status = unsafe { (self.ctx.api().cuMemHostUnregister)(self.ptr.as_ptr().cast()) };
        if let Err(e) = self.ctx.check(status, "cuMemHostUnregister") {
            self.ctx.record_err(e);
        }
    }
}

/// What kind of memory an address is (`CU_POINTER_ATTRIBUTE_MEMORY_TYPE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemoryType {
    /// Host memory known to CUDA (pinned or registered).
    Host,
    /// Device memory.
    Device,
    /// A CUDA array.
    Array,
    /// Unified (managed) memory.
    Unified,
    /// A value this build does not know.
    Other(u32),
}

impl MemoryType {
    fn from_raw(v: u32) -> MemoryType {
        match v {
            1 => MemoryType::Host,
            2 => MemoryType::Device,
            3 => MemoryType::Array,
            4 => MemoryType::Unified,
            v => MemoryType::Other(v),
        }
    }
}

/// What [`Cuda::pointer_info`] found about an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PointerInfo {
    /// The kind of memory.
    pub memory_type: MemoryType,
    /// The GPU the memory was allocated or registered on
    /// (`CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`); `None` when the driver does not say.
    pub device_ordinal: Option<u32>,
}

impl Cuda {
    /// The memory type and GPU of `addr` (`cuPointerGetAttribute`); an error for an address
    /// CUDA does not know. Only looks the address up, never dereferences it.
    pub fn pointer_info(&self, addr: u64) -> Result<PointerInfo, CudaError> {
        let mut ty: c_uint = 0;
        // SAFETY: the attribute is an unsigned int, and `ty` is a valid out-pointer for one.
        let status = unsafe {
            (self.api().cuPointerGetAttribute)(
                (&mut ty as *mut c_uint).cast(),
                api::POINTER_ATTRIBUTE_MEMORY_TYPE,
                addr,
            )
        };
        self.check(status, "cuPointerGetAttribute(MEMORY_TYPE)", None)?;
        let mut ordinal: c_int = -1;
        // SAFETY: the attribute is an int, and `ordinal` is a valid out-pointer for one.
        let status = unsafe {
            (self.api().cuPointerGetAttribute)(
                (&mut ordinal as *mut c_int).cast(),
                api::POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                addr,
            )
        };
        let device_ordinal = match self.check(status, "cuPointerGetAttribute(DEVICE_ORDINAL)", None)
        {
            Ok(()) => u32::try_from(ordinal).ok(),
            Err(e) => {
                log::debug!("{e}");
                None
            }
        };
        Ok(PointerInfo {
            memory_type: MemoryType::from_raw(ty),
            device_ordinal,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_types_match_cuda_h() {
        use cudarc::driver::sys::CUmemorytype as M;
        assert_eq!(
            MemoryType::from_raw(M::CU_MEMORYTYPE_HOST as u32),
            MemoryType::Host
        );
        assert_eq!(
            MemoryType::from_raw(M::CU_MEMORYTYPE_DEVICE as u32),
            MemoryType::Device
        );
        assert_eq!(
            MemoryType::from_raw(M::CU_MEMORYTYPE_UNIFIED as u32),
            MemoryType::Unified
        );
        assert_eq!(MemoryType::from_raw(99), MemoryType::Other(99));
    }

    #[test]
    fn empty_buffers_are_refused_before_any_call() {
        let e = refuse_empty("cuMemAlloc_v2", 0).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cuMemAlloc_v2: a buffer must have at least one byte"
        );
        assert!(refuse_empty("cuMemAlloc_v2", 1).is_ok());
    }

    #[test]
    fn page_size_is_a_power_of_two() {
        assert!(page_size().is_power_of_two());
    }
}
