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
    /// CUDA device ordinal when this is GPU memory (registered with FI_HMEM_CUDA, never
    /// dereferenced on the host).
    cuda: Option<i32>,
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
            cuda: None,
        }
    }

    /// The caller's memory.
    ///
    /// # Safety
    ///
    /// - `ptr..ptr+len` is mapped, readable and writable memory;
    /// - it stays valid (not freed, unmapped or remapped) until this value and every
    ///   registration made from it ([`super::Mr`], gdx-fabric's `MemoryRegion`, including
    ///   clones held by outstanding operations) are dropped;
    /// - the caller accepts that the provider and remote peers with the key read and write it
    ///   asynchronously while registered.
    pub unsafe fn from_raw(ptr: *mut u8, len: usize) -> Memory {
        Memory {
            ptr,
            len,
            owned: None,
            cuda: None,
        }
    }

    /// The caller's CUDA device memory on GPU `device` (an ordinal), registered through
    /// `fi_mr_regattr` with `FI_HMEM_CUDA`. It is never dereferenced on the host:
    /// [`Memory::write_at`] and [`Memory::read_at`] refuse it (and gdx-fabric's
    /// `Endpoint::register` refuses it unless the endpoint's provider was opened with FI_HMEM).
    ///
    /// # Safety
    ///
    /// - `ptr..ptr+len` is CUDA device memory of GPU `device` (from `cuMemAlloc` or a pool);
    /// - it stays allocated until this value and every registration made from it are dropped;
    /// - the caller accepts that the provider and remote peers with the key read and write it
    ///   asynchronously while registered.
    pub unsafe fn from_cuda(ptr: u64, len: usize, device: i32) -> Memory {
        Memory {
            ptr: ptr as usize as *mut u8,
            len,
            owned: None,
            cuda: Some(device),
        }
    }

    /// The CUDA device ordinal when this is GPU memory ([`Memory::from_cuda`]).
    pub fn cuda_device(&self) -> Option<i32> {
        self.cuda
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

    /// Copies `data` in at `offset`; `false` (nothing copied) when it does not fit, or when
    /// this is GPU memory (not addressable from the host).
    pub fn write_at(&self, offset: usize, data: &[u8]) -> bool {
        if self.cuda.is_some() || offset.checked_add(data.len()).is_none_or(|e| e > self.len) {
            return false;
        }
        // SAFETY: in bounds (checked above) of memory valid by construction; `data` is a
        // separate Rust slice, so the spans do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(offset), data.len()) };
        true
    }

    /// Copies `out.len()` bytes out from `offset`; `false` when out of bounds, or when this
    /// is GPU memory.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> bool {
        if self.cuda.is_some() || offset.checked_add(out.len()).is_none_or(|e| e > self.len) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_memory_is_never_copied_through_the_host() {
        // SAFETY: the address is never dereferenced: host copies of CUDA memory are refused.
        let m = unsafe { Memory::from_cuda(0x7f00_0000_0000, 4096, 1) };
        assert_eq!(m.cuda_device(), Some(1));
        assert!(!m.write_at(0, &[1, 2, 3]));
        let mut out = [0u8; 3];
        assert!(!m.read_at(0, &mut out));
        let h = Memory::alloc(16);
        assert_eq!(h.cuda_device(), None);
        assert!(h.write_at(0, &[1, 2, 3]) && h.read_at(0, &mut out));
        assert_eq!(out, [1, 2, 3]);
    }
}
