//! Memory a registration covers: a page-aligned buffer this crate owns, or the caller's memory
//! under the contract of [`Memory::from_raw`]. Contents are copied in and out through raw
//! pointers, never through references: the provider (and remote peers holding the key) may
//! write the memory at any time while it is registered.

use std::alloc::Layout;

const PAGE: usize = 4096;

/// Memory to register.
#[derive(Debug)]
pub struct Memory {
    ptr: *mut u8,
    len: usize,
    /// Set when this value owns the allocation (freed on drop).
    owned: Option<Layout>,
}

// SAFETY: a plain span of bytes; all access goes through raw copies.
unsafe impl Send for Memory {}
// SAFETY: as above; concurrent copies race only like DMA does, which is the contract of
// registered memory.
unsafe impl Sync for Memory {}

impl Memory {
    /// A zeroed, page-aligned buffer of `len` bytes (at least one page is allocated).
    pub fn alloc(len: usize) -> Memory {
        let size = len.max(1).next_multiple_of(PAGE);
        let layout = match Layout::from_size_align(size, PAGE) {
            Ok(l) => l,
            Err(_) => std::alloc::handle_alloc_error(Layout::new::<u8>()),
        };
        // SAFETY: non-zero size, valid layout.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Memory {
            ptr,
            len,
            owned: Some(layout),
        }
    }

    /// The caller's memory.
    ///
    /// # Safety
    ///
    /// - `ptr..ptr+len` is mapped, readable and writable memory;
    /// - it stays valid (not freed, unmapped or remapped) until this value and every
    ///   registration made from it ([`crate::MemoryRegion`], including clones held by
    ///   outstanding operations) are dropped;
    /// - the caller accepts that the provider and remote peers with the key read and write it
    ///   asynchronously while registered.
    pub unsafe fn from_raw(ptr: *mut u8, len: usize) -> Memory {
        Memory {
            ptr,
            len,
            owned: None,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Copies `data` in at `offset`; `false` (nothing copied) when it does not fit.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> bool {
        if offset.checked_add(data.len()).is_none_or(|e| e > self.len) {
            return false;
        }
        // SAFETY: in bounds (checked above) of memory valid by construction; `data` is a
        // separate Rust slice, so the spans do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(offset), data.len()) };
        true
    }

    /// Copies `out.len()` bytes out from `offset`; `false` when out of bounds.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> bool {
        if offset.checked_add(out.len()).is_none_or(|e| e > self.len) {
            return false;
        }
        // SAFETY: in bounds (checked above); `out` is a separate Rust slice.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(offset), out.as_mut_ptr(), out.len()) };
        true
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        if let Some(layout) = self.owned {
            // SAFETY: allocated in `alloc` with this layout; registrations hold an Arc to
            // the value that owns this Memory, so none is left.
            unsafe { std::alloc::dealloc(self.ptr, layout) };
        }
    }
}
