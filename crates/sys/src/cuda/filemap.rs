//! [`RegisteredFile`]: a byte range of an open file mapped read-only (`mmap`, `MAP_SHARED`) and
//! page-locked for the GPU with `cuMemHostRegister_v2` (`CU_MEMHOSTREGISTER_READ_ONLY`), so the
//! copy engine reads the page cache's own pages: no CPU copy into a bounce buffer.
//!
//! Invariants:
//! - The mapping is made here and unmapped in `Drop`, after the registration is undone and
//!   after the last queued copy that reads it (its `Pending` marker).
//! - The host never reads the mapping (a file truncated under it would raise `SIGBUS` on a host
//!   read); only copies do, and the registration keeps the pages in memory while they run.
//! - The registration is read-only: the value is a copy source only ([`super::Src::Host`]); as a
//!   destination every copy is refused before any driver call.

use super::api;
use super::event::Pending;
use super::{Context, CudaError};
use std::ffi::{c_uint, c_void};
use std::fmt;
use std::os::fd::{AsFd, AsRawFd};
use std::ptr::NonNull;

/// `CU_MEMHOSTREGISTER_READ_ONLY`: the device only reads the registered memory (what lets a
/// read-only mapping be registered at all).
const MEMHOSTREGISTER_READ_ONLY: c_uint = 0x08;

/// A read-only, page-locked mapping of `len` bytes of a file at an offset (see the module docs).
pub struct RegisteredFile {
    ctx: Context,
    /// The mapping: page-aligned, `map_len` bytes.
    map: NonNull<u8>,
    map_len: usize,
    /// Where the asked-for range starts in the mapping.
    skip: usize,
    len: usize,
    pending: Pending,
}

// SAFETY: the value owns its mapping like a Box<[u8]>; the host never dereferences it, and
// copies order themselves on its `Pending` marker.
unsafe impl Send for RegisteredFile {}
// SAFETY: as above; shared access only lets copies read the mapping.
unsafe impl Sync for RegisteredFile {}

impl fmt::Debug for RegisteredFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegisteredFile")
            .field("map", &self.map)
            .field("len", &self.len)
            .finish()
    }
}

impl RegisteredFile {
    /// Map `len` bytes of `file` at `offset` read-only and page-lock them through `ctx`
    /// (usable from every context). `populate` maps every page at once (`MAP_POPULATE`), which
    /// the registration would otherwise fault in page by page.
    ///
    /// # Errors
    /// `InvalidArgument` for an empty range; `Os` naming `mmap` when the file cannot be mapped;
    /// the driver's error of `cuMemHostRegister_v2` (e.g. a driver that refuses to page-lock a
    /// file mapping), after which nothing stays mapped.
    pub fn new(
        ctx: &Context,
        file: &impl AsFd,
        offset: u64,
        len: usize,
        populate: bool,
    ) -> Result<RegisteredFile, CudaError> {
        super::memory::refuse_empty("cuMemHostRegister_v2", len)?;
        let page = crate::os::page_size();
        let start = offset - offset % page;
        let skip = (offset - start) as usize;
        let map_len = skip
            .checked_add(len)
            .and_then(|n| n.checked_next_multiple_of(page as usize))
            .ok_or_else(|| CudaError::InvalidArgument {
                call: "mmap",
                reason: format!("{len} bytes at offset {offset} overflow the address space"),
            })?;
        let file_off = libc::off_t::try_from(start).map_err(|_| CudaError::InvalidArgument {
            call: "mmap",
            reason: format!("offset {offset} is past what mmap takes"),
        })?;
        let flags = libc::MAP_SHARED | if populate { libc::MAP_POPULATE } else { 0 };
        // SAFETY: a fresh read-only mapping at an address the kernel picks (nothing of ours is
        // replaced); it is unmapped on every path below or by `Drop`.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ,
                flags,
                file.as_fd().as_raw_fd(),
                file_off,
            )
        };
        let map = match NonNull::new(addr.cast::<u8>()) {
            Some(m) if addr != libc::MAP_FAILED => m,
            _ => {
                return Err(CudaError::Os {
                    call: "mmap",
                    reason: format!(
                        "{} (mapping {len} bytes at offset {offset} read-only)",
                        std::io::Error::last_os_error()
                    ),
                })
            }
        };
        let unmap = || {
            // SAFETY: the mapping made above, of that length, unmapped once; nothing refers
            // to it (the registration failed).
            unsafe { libc::munmap(addr, map_len) };
        };
        if let Err(e) = ctx.make_current() {
            unmap();
            return Err(e);
        }
        // SAFETY: `addr..addr + map_len` is the live mapping made above, unmapped only after
        // `cuMemHostUnregister` (in `Drop`) or right here on failure.
        let status = unsafe {
            (ctx.api().cuMemHostRegister_v2)(
                addr,
                map_len,
                api::MEMHOSTREGISTER_PORTABLE | MEMHOSTREGISTER_READ_ONLY,
            )
        };
        if let Err(e) = ctx.check(
            status,
            &format!("cuMemHostRegister_v2(READ_ONLY, a {map_len}-byte file mapping)"),
        ) {
            unmap();
            return Err(e);
        }
        Ok(RegisteredFile {
            ctx: ctx.clone(),
            map,
            map_len,
            skip,
            len,
            pending: Pending::default(),
        })
    }

    /// Bytes of the file range.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: ranges have at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes mapped and page-locked: the range widened to whole pages.
    pub fn locked_len(&self) -> usize {
        self.map_len
    }
}

impl super::memory::sealed::HostMemory for RegisteredFile {
    fn host_range(&self) -> (*mut u8, usize) {
        (self.map.as_ptr().wrapping_add(self.skip), self.len)
    }
    fn pending(&self) -> &Pending {
        &self.pending
    }
    fn read_only(&self) -> bool {
        true
    }
}
impl super::HostBuffer for RegisteredFile {}

impl Drop for RegisteredFile {
    fn drop(&mut self) {
        if let Err(e) = self.pending.synchronize() {
            // A failed wait means a sticky error: the context runs no more work, so no copy
            // still reads the mapping.
            self.ctx.record_err(e);
        }
        let addr = self.map.as_ptr().cast::<c_void>();
        // SAFETY: this value registered exactly this address and no queued copy reads it.
        let status = unsafe { (self.ctx.api().cuMemHostUnregister)(addr) };
        if let Err(e) = self.ctx.check(status, "cuMemHostUnregister") {
            self.ctx.record_err(e);
        }
        // SAFETY: the mapping this value made, of that length, unmapped once.
        unsafe { libc::munmap(addr, self.map_len) };
    }
}
