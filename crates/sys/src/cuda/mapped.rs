//! [`MappedHostBuffer`]: page-locked host memory the GPU addresses directly
//! (`cuMemHostAlloc` with `CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE`, device
//! address from `cuMemHostGetDevicePointer_v2`).
//!
//! The memory is shared with running device code (a kernel polls it, a stream memory operation
//! writes it), so the host never gets a `&[u8]` over it: a slice would promise Rust that nothing
//! else changes the bytes. Host access is through 64-bit words, each an [`AtomicU64`] (an
//! aligned 8-byte access is one PCIe transaction, so the GPU sees a word whole), plus
//! byte copies in and out that the caller orders with those words.
//!
//! Invariants: the buffer holds its [`Context`]; its length is a whole number of 8-byte words;
//! it carries a `Pending` marker like the other buffers, so `Drop` waits for queued stream
//! operations that use it. A persistent kernel that uses it is not a queued stream operation:
//! its owner (e.g. the mailbox) stops the kernel before dropping the buffer.

use super::api::{self, CuDevicePtr};
use super::event::Pending;
use super::memory::refuse_empty;
use super::{Context, CudaError};
use std::ffi::c_void;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;

/// Page-locked host memory mapped into the GPUs' address space. Zeroed when allocated.
pub struct MappedHostBuffer {
    ctx: Context,
    ptr: NonNull<u64>,
    words: usize,
    dev: CuDevicePtr,
    pub(crate) pending: Pending,
}

// SAFETY: the buffer owns its memory; all host access goes through atomics or through byte
// copies whose races with the device the caller orders with those atomics (see module docs).
unsafe impl Send for MappedHostBuffer {}
// SAFETY: as above: `&MappedHostBuffer` gives only atomic words and copies.
unsafe impl Sync for MappedHostBuffer {}

impl fmt::Debug for MappedHostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MappedHostBuffer")
            .field("ptr", &self.ptr)
            .field("len", &self.len())
            .field("device_ptr", &format_args!("{:#x}", self.dev))
            .finish()
    }
}

impl MappedHostBuffer {
    /// Allocate `len` zeroed bytes (rounded up to a multiple of 8) of mapped, portable pinned
    /// memory through `ctx`.
    pub fn new(ctx: &Context, len: usize) -> Result<MappedHostBuffer, CudaError> {
        refuse_empty("cuMemHostAlloc", len)?;
        let words = len.div_ceil(8);
        let bytes = words * 8;
        ctx.make_current()?;
        let mut p: *mut c_void = std::ptr::null_mut();
        let flags = api::MEMHOSTALLOC_DEVICEMAP | api::MEMHOSTALLOC_PORTABLE;
        // SAFETY: `p` is a valid out-pointer; the context is current on this thread.
        let status = unsafe { (ctx.api().cuMemHostAlloc)(&mut p, bytes, flags) };
        ctx.check(status, &format!("cuMemHostAlloc({bytes} bytes, DEVICEMAP)"))?;
        let Some(ptr) = NonNull::new(p.cast::<u64>()) else {
            return Err(CudaError::InvalidArgument {
                call: "cuMemHostAlloc",
                reason: "the driver returned success with a null pointer".to_string(),
            });
        };
        // From here on `buf` owns the allocation, so an error below frees it.
        let mut buf = MappedHostBuffer {
            ctx: ctx.clone(),
            ptr,
            words,
            dev: 0,
            pending: Pending::default(),
        };
        // SAFETY: the driver just allocated `bytes` writable bytes at `ptr` (page-aligned),
        // used by nothing else yet.
        unsafe { std::ptr::write_bytes(ptr.as_ptr().cast::<u8>(), 0, bytes) };
        let mut dev: CuDevicePtr = 0;
        // SAFETY: `dev` is a valid out-pointer; `p` is a DEVICEMAP allocation; flags must be 0.
        let status = unsafe { (ctx.api().cuMemHostGetDevicePointer_v2)(&mut dev, p, 0) };
        ctx.check(status, "cuMemHostGetDevicePointer_v2")?;
        buf.dev = dev;
        Ok(buf)
    }

    /// Size in bytes (a multiple of 8).
    pub fn len(&self) -> usize {
        self.words * 8
    }

    /// Always false: buffers have at least one word.
    pub fn is_empty(&self) -> bool {
        self.words == 0
    }

    /// Number of 64-bit words.
    pub fn words(&self) -> usize {
        self.words
    }

    /// The context the memory was allocated through.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The address device code uses for byte 0 (valid in every context: the memory is
    /// portable). Do not use it after the buffer is dropped.
    pub fn device_ptr(&self) -> u64 {
        self.dev
    }

    /// The host address of byte 0, for diagnostics; access goes through [`Self::word`].
    pub fn host_ptr(&self) -> *const u8 {
        self.ptr.as_ptr().cast()
    }

    /// Word `index` as an atomic (`None` past the end). Use `Acquire` loads to read what device
    /// code published and `Release` stores to publish to it.
    pub fn word(&self, index: usize) -> Option<&AtomicU64> {
        if index >= self.words {
            return None;
        }
        // SAFETY: `index` is in bounds; the memory is 8-byte aligned (page-aligned allocation),
        // lives as long as `&self`, and every host access to it is atomic or an explicit copy.
        Some(unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(index)) })
    }

    /// The words `start..start + n` (`None` when they do not fit).
    pub fn word_range(&self, start: usize, n: usize) -> Option<&[AtomicU64]> {
        if start.checked_add(n)? > self.words {
            return None;
        }
        // SAFETY: in bounds; `AtomicU64` has the layout of `u64`; as in `word`.
        Some(unsafe {
            std::slice::from_raw_parts(self.ptr.as_ptr().add(start).cast::<AtomicU64>(), n)
        })
    }

    /// All the bytes, for a protocol in which device code reads or writes them only at times
    /// the caller excludes (e.g. a persistent kernel reads a slot only between the host's
    /// submission of it and the kernel's completion word, and the host writes it only outside
    /// that window).
    ///
    /// # Safety
    ///
    /// While the returned slice lives, no device code (kernel, stream operation, copy) and no
    /// other host code reads or writes these bytes.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes_mut(&self) -> &mut [u8] {
        // SAFETY: the memory is `len()` initialised bytes (zeroed at allocation) owned by
        // `self`; exclusivity is the caller's contract above.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().cast::<u8>(), self.len()) }
    }

    /// All the bytes, read-only, under the same kind of protocol as [`Self::bytes_mut`].
    ///
    /// # Safety
    ///
    /// While the returned slice lives, nothing (device code or host) writes these bytes.
    pub unsafe fn bytes(&self) -> &[u8] {
        // SAFETY: as in `bytes_mut`; no writer is the caller's contract.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().cast::<u8>(), self.len()) }
    }

    /// Wait on the host until every stream operation queued on the buffer is done.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.pending.synchronize()
    }
}

impl Drop for MappedHostBuffer {
    fn drop(&mut self) {
        if let Err(e) = self.pending.synchronize() {
            self.ctx.record_err(e);
            log::warn!(
                "leaking {} bytes of mapped host memory: a stream operation may still use them",
                self.len()
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
