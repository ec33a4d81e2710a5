//! Device memory that is not a plain `cuMemAlloc_v2` allocation of this process: memory from a
//! GPU's stream-ordered pool ([`DeviceBuffer::from_pool`], [`MemPool`]), memory shared across
//! processes ([`IpcHandle`], [`DeviceBuffer::open_ipc`]), and a caller's device pointer
//! ([`DeviceBuffer::from_raw_parts`]), plus the pointer queries that tell them apart
//! ([`Cuda::pointer_range`], [`Cuda::pointer_mem_pool`]).
//!
//! Why pools matter: peer access enabled on a context (`cuCtxEnablePeerAccess`) does not cover
//! pool memory. A peer copy between pool allocations without `cuMemPoolSetAccess` silently
//! takes a driver fallback (37.7 GB/s against 395.5 on the H200 test machine), so callers
//! check [`MemPool::access`] and grant it with [`MemPool::set_access`].

use super::api::{self, CuDevicePtr, CuIpcMemHandle, CuMemAccessDesc, CuMemLocation, CuMemPool};
use super::event::Pending;
use super::memory::Release;
use super::{Context, Cuda, CudaError, Device, DeviceBuffer, Stream};
use std::ffi::{c_int, c_void};
use std::fmt;

/// A legacy CUDA IPC handle (`cuIpcGetMemHandle`): 64 opaque bytes that another process on the
/// same host opens with [`DeviceBuffer::open_ipc`].
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpcHandle(pub [u8; 64]);

impl fmt::Debug for IpcHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IpcHandle(")?;
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "..)")
    }
}

/// What another GPU may do with a pool's memory (`CUmemAccess_flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PoolAccess {
    /// No access: peer copies fall back to a slow path or fail.
    None,
    /// Read only.
    Read,
    /// Read and write.
    ReadWrite,
    /// A value this build does not know.
    Other(i32),
}

impl PoolAccess {
    fn from_raw(v: c_int) -> PoolAccess {
        match v {
            api::MEM_ACCESS_FLAGS_PROT_NONE => PoolAccess::None,
            api::MEM_ACCESS_FLAGS_PROT_READ => PoolAccess::Read,
            api::MEM_ACCESS_FLAGS_PROT_READWRITE => PoolAccess::ReadWrite,
            v => PoolAccess::Other(v),
        }
    }
}

/// A stream-ordered memory pool (`CUmemoryPool`). Pools are owned by the driver (the default
/// pool of a device lives as long as the device); this value only names one.
#[derive(Clone)]
pub struct MemPool {
    cuda: Cuda,
    raw: CuMemPool,
}

// SAFETY: a pool handle is a driver-wide name usable from any thread.
unsafe impl Send for MemPool {}
// SAFETY: as above; `&MemPool` only passes the handle to thread-safe driver calls.
unsafe impl Sync for MemPool {}

impl fmt::Debug for MemPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemPool").field("raw", &self.raw).finish()
    }
}

impl MemPool {
    /// The pool handle. Owned by the driver: do not destroy it.
    pub fn as_raw(&self) -> *mut c_void {
        self.raw
    }

    /// What GPU `ordinal` may do with this pool's memory (`cuMemPoolGetAccess`).
    pub fn access(&self, ordinal: u32) -> Result<PoolAccess, CudaError> {
        let Some(f) = self.cuda.api().cuMemPoolGetAccess else {
            return Err(CudaError::MissingSymbol {
                call: "cuMemPoolGetAccess",
            });
        };
        let mut loc = CuMemLocation {
            kind: api::MEM_LOCATION_TYPE_DEVICE,
            id: c_int::try_from(ordinal).unwrap_or(c_int::MAX),
        };
        let mut flags: c_int = 0;
        // SAFETY: both out-pointers are valid; the pool handle came from the driver.
        let status = unsafe { f(&mut flags, self.raw, &mut loc) };
        self.cuda
            .check(status, "cuMemPoolGetAccess", Some(ordinal))?;
        Ok(PoolAccess::from_raw(flags))
    }

    /// Let GPU `ordinal` read and write this pool's memory (`cuMemPoolSetAccess` with
    /// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`). Covers allocations made before and after.
    /// Granting the pool's own device is refused by the driver; callers skip it.
    pub fn set_access(&self, ordinal: u32) -> Result<(), CudaError> {
        let Some(f) = self.cuda.api().cuMemPoolSetAccess else {
            return Err(CudaError::MissingSymbol {
                call: "cuMemPoolSetAccess",
            });
        };
        let desc = CuMemAccessDesc {
            location: CuMemLocation {
                kind: api::MEM_LOCATION_TYPE_DEVICE,
                id: c_int::try_from(ordinal).unwrap_or(c_int::MAX),
            },
            flags: api::MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: `desc` is one valid access descriptor, read during the call only.
        let status = unsafe { f(self.raw, &desc, 1) };
        self.cuda.check(
            status,
            format!("cuMemPoolSetAccess(GPU {ordinal}, READWRITE)"),
            Some(ordinal),
        )
    }
}

impl Device {
    /// The device's default stream-ordered pool (`cuDeviceGetDefaultMemPool`), the one
    /// `cuMemAllocAsync` (and so cudarc's `alloc_zeros`) draws from.
    pub fn default_mem_pool(&self) -> Result<MemPool, CudaError> {
        let Some(f) = self.cuda().api().cuDeviceGetDefaultMemPool else {
            return Err(CudaError::MissingSymbol {
                call: "cuDeviceGetDefaultMemPool",
            });
        };
        let mut raw: CuMemPool = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the device handle came from `cuDeviceGet`.
        let status = unsafe { f(&mut raw, self.raw()) };
        self.cuda()
            .check(status, "cuDeviceGetDefaultMemPool", Some(self.ordinal()))?;
        Ok(MemPool {
            cuda: self.cuda().clone(),
            raw,
        })
    }
}

/// How another process could map the allocation that holds a device address
/// ([`Cuda::sharing`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Sharing {
    /// A `cuMemAlloc` allocation (`cudaMalloc`: torch's default allocator, CuPy's pool, JAX's
    /// BFC allocator): its legacy IPC handle, taken at the allocation's start, maps all
    /// `size` bytes from `start` in the importer.
    Legacy {
        /// The handle ([`DeviceBuffer::open_ipc`] maps it).
        handle: IpcHandle,
        /// The allocation's first address in this process.
        start: u64,
        /// The allocation's size in bytes.
        size: usize,
    },
    /// A VMM range (`cuMemCreate` memory mapped piece by piece, as torch's
    /// `expandable_segments` and XLA make) whose allocations allow a POSIX file descriptor:
    /// [`Cuda::vmm_pieces`] exports each piece, and the importer maps them one by one.
    Vmm {
        /// The first piece's first address in this process.
        start: u64,
        /// Each piece's size in bytes, in address order (contiguous from `start`).
        pieces: Vec<usize>,
    },
    /// No handle: why, in words a user can act on.
    Unshareable(String),
}

/// One mapped piece of a VMM range ([`Cuda::vmm_pieces`]): the allocation mapped there, whose
/// handle this value retains (released when dropped).
pub struct VmmPiece {
    ctx: Context,
    handle: api::CuMemGenericAllocationHandle,
    base: u64,
    size: usize,
}

impl fmt::Debug for VmmPiece {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VmmPiece")
            .field("base", &format_args!("{:#x}", self.base))
            .field("size", &self.size)
            .finish()
    }
}

impl VmmPiece {
    /// The piece's first address in this process.
    pub fn base(&self) -> u64 {
        self.base
    }
    /// Bytes mapped.
    pub fn size(&self) -> usize {
        self.size
    }
    /// The allocation as a POSIX file descriptor (`cuMemExportToShareableHandle`), which
    /// [`DeviceBuffer::import_fd`] maps in another process with `alloc_len` = [`VmmPiece::size`].
    pub fn export_fd(&self) -> Result<std::os::fd::OwnedFd, CudaError> {
        super::vmm::export_handle_fd(&self.ctx, self.handle)
    }
}

impl Drop for VmmPiece {
    fn drop(&mut self) {
        if let Some(f) = self.ctx.api().cuMemRelease {
            // SAFETY: this value holds one reference to the handle (cuMemRetainAllocationHandle).
            let status = unsafe { f(self.handle) };
            if let Err(e) = self.ctx.check(status, "cuMemRelease") {
                self.ctx.record_err(e);
            }
        }
    }
}

impl Cuda {
    /// How another process could map the allocation holding `addr`: its legacy IPC handle
    /// where the driver says the memory is capable of one
    /// (`CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE`), else why not: stream-ordered
    /// pool memory, or a VMM mapping (`cuMemCreate`, e.g. torch's `expandable_segments`): its
    /// pieces where they allow a POSIX fd ([`Sharing::Vmm`]), else the handle types they allow.
    /// `len` bytes from `addr` are described. `ctx` is the context of the GPU that holds the
    /// memory.
    /// Never dereferences the address.
    pub fn sharing(&self, ctx: &Context, addr: u64, len: usize) -> Result<Sharing, CudaError> {
        let mut capable: u64 = 0;
        // SAFETY: the attribute is a bool-sized value, which fits in the zeroed u64
        // out-pointer; the driver writes at most its size.
        let status = unsafe {
            (self.api().cuPointerGetAttribute)(
                (&mut capable as *mut u64).cast(),
                api::POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                addr,
            )
        };
        self.check(
            status,
            "cuPointerGetAttribute(IS_LEGACY_CUDA_IPC_CAPABLE)",
            None,
        )?;
        if capable != 0 {
            let (start, size) = self.pointer_range(addr)?;
            ctx.make_current()?;
            let mut h = CuIpcMemHandle { reserved: [0; 64] };
            // SAFETY: `h` is a valid out-pointer; `start` is the start of a live allocation
            // the driver just described.
            let status = unsafe { (self.api().cuIpcGetMemHandle)(&mut h, start) };
            ctx.check(status, "cuIpcGetMemHandle")?;
            return Ok(Sharing::Legacy {
                handle: IpcHandle(h.reserved),
                start,
                size,
            });
        }
        if self.pointer_mem_pool(addr)?.is_some() {
            return Ok(Sharing::Unshareable(
                "it is stream-ordered pool memory (cuMemAllocAsync), which legacy CUDA IPC \
                 cannot name and whose pool gdx does not export"
                    .into(),
            ));
        }
        let mut types: u64 = 0;
        // SAFETY: the attribute is a 64-bit mask of CUmemAllocationHandleType, and `types` a
        // valid out-pointer for one.
        let status = unsafe {
            (self.api().cuPointerGetAttribute)(
                (&mut types as *mut u64).cast(),
                api::POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,
                addr,
            )
        };
        self.check(status, "cuPointerGetAttribute(ALLOWED_HANDLE_TYPES)", None)?;
        if types & api::MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR as u64 == 0 {
            return Ok(Sharing::Unshareable(vmm_reason(types)));
        }
        let pieces = self.vmm_pieces(ctx, addr, len)?;
        Ok(Sharing::Vmm {
            start: pieces.first().map_or(addr, VmmPiece::base),
            pieces: pieces.iter().map(VmmPiece::size).collect(),
        })
    }

    /// The mapped pieces of the VMM range `addr..addr + len`, in address order: at each
    /// address the allocation mapped there (`cuMemRetainAllocationHandle`) and the mapping's
    /// extent (`CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR`, `..._MAPPING_SIZE`), then the next
    /// address after it. `ctx` is the context of the GPU that holds the memory.
    pub fn vmm_pieces(
        &self,
        ctx: &Context,
        addr: u64,
        len: usize,
    ) -> Result<Vec<VmmPiece>, CudaError> {
        const CALL: &str = "cuMemRetainAllocationHandle";
        let retain = super::mapping::need(self.api().cuMemRetainAllocationHandle, CALL)?;
        ctx.make_current()?;
        let end = addr + len as u64;
        let mut pieces: Vec<VmmPiece> = Vec::new();
        let mut p = addr;
        while p < end {
            let mut handle: api::CuMemGenericAllocationHandle = 0;
            // SAFETY: `handle` is a valid out-pointer; the address is only looked up.
            let status = unsafe { retain(&mut handle, p as usize as *mut c_void) };
            ctx.check(status, &format!("{CALL}({p:#x})"))?;
            let mut piece = VmmPiece {
                ctx: ctx.clone(),
                handle,
                base: 0,
                size: 0,
            };
            // SAFETY: both attributes are 64-bit values and the out-pointers valid for one.
            let status = unsafe {
                (self.api().cuPointerGetAttribute)(
                    (&mut piece.base as *mut u64).cast(),
                    api::POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
                    p,
                )
            };
            self.check(status, "cuPointerGetAttribute(MAPPING_BASE_ADDR)", None)?;
            let mut size: u64 = 0;
            // SAFETY: as above.
            let status = unsafe {
                (self.api().cuPointerGetAttribute)(
                    (&mut size as *mut u64).cast(),
                    api::POINTER_ATTRIBUTE_MAPPING_SIZE,
                    p,
                )
            };
            self.check(status, "cuPointerGetAttribute(MAPPING_SIZE)", None)?;
            piece.size = size as usize;
            let next = piece.base + size;
            if size == 0 || piece.base > p || next <= p {
                return Err(CudaError::InvalidArgument {
                    call: "cuPointerGetAttribute(MAPPING_BASE_ADDR)",
                    reason: format!(
                        "the driver maps {size} bytes at {:#x} for address {p:#x}",
                        piece.base
                    ),
                });
            }
            if let Some(last) = pieces.last() {
                if last.base + last.size as u64 != piece.base {
                    return Err(CudaError::InvalidArgument {
                        call: "cuPointerGetAttribute(MAPPING_BASE_ADDR)",
                        reason: format!("the range has a hole before {:#x}", piece.base),
                    });
                }
            }
            pieces.push(piece);
            p = next;
        }
        Ok(pieces)
    }

    /// The allocation `addr` lies in: its start address and size
    /// (`CU_POINTER_ATTRIBUTE_RANGE_START_ADDR`, `CU_POINTER_ATTRIBUTE_RANGE_SIZE`). An error
    /// for an address the driver does not know. Never dereferences the address.
    pub fn pointer_range(&self, addr: u64) -> Result<(u64, usize), CudaError> {
        let mut start: CuDevicePtr = 0;
        // SAFETY: the attribute is a CUdeviceptr and `start` a valid out-pointer for one.
        let status = unsafe {
            (self.api().cuPointerGetAttribute)(
                (&mut start as *mut CuDevicePtr).cast(),
                api::POINTER_ATTRIBUTE_RANGE_START_ADDR,
                addr,
            )
        };
        self.check(status, "cuPointerGetAttribute(RANGE_START_ADDR)", None)?;
        let mut size: usize = 0;
        // SAFETY: the attribute is a size_t and `size` a valid out-pointer for one.
        let status = unsafe {
            (self.api().cuPointerGetAttribute)(
                (&mut size as *mut usize).cast(),
                api::POINTER_ATTRIBUTE_RANGE_SIZE,
                addr,
            )
        };
        self.check(status, "cuPointerGetAttribute(RANGE_SIZE)", None)?;
        Ok((start, size))
    }

    /// The stream-ordered pool `addr` was allocated from
    /// (`CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE`); `None` for memory not from a pool
    /// (`cuMemAlloc_v2`, IPC imports, VMM).
    pub fn pointer_mem_pool(&self, addr: u64) -> Result<Option<MemPool>, CudaError> {
        let mut raw: CuMemPool = std::ptr::null_mut();
        // SAFETY: the attribute is a CUmemoryPool and `raw` a valid out-pointer for one.
        let status = unsafe {
            (self.api().cuPointerGetAttribute)(
                (&mut raw as *mut CuMemPool).cast(),
                api::POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
                addr,
            )
        };
        self.check(status, "cuPointerGetAttribute(MEMPOOL_HANDLE)", None)?;
        Ok((!raw.is_null()).then(|| MemPool {
            cuda: self.clone(),
            raw,
        }))
    }
}

impl DeviceBuffer {
    /// Allocate `len` bytes from `ctx`'s device default pool on `stream`
    /// (`cuMemAllocFromPoolAsync`, the allocation cudarc's `alloc_zeros` makes), and wait for
    /// the allocation. Freed with `cuMemFree_v2`. For tests and baselines of the pool trap:
    /// gdx's own allocations use [`DeviceBuffer::new`].
    pub fn from_pool(
        ctx: &Context,
        len: usize,
        stream: &Stream,
    ) -> Result<DeviceBuffer, CudaError> {
        const CALL: &str = "cuMemAllocFromPoolAsync";
        let Some(f) = ctx.api().cuMemAllocFromPoolAsync else {
            return Err(CudaError::MissingSymbol { call: CALL });
        };
        if len == 0 {
            return Err(CudaError::InvalidArgument {
                call: CALL,
                reason: "a buffer must have at least one byte".to_string(),
            });
        }
        let pool = ctx.device().default_mem_pool()?;
        ctx.make_current()?;
        let mut ptr: CuDevicePtr = 0;
        // SAFETY: `ptr` is a valid out-pointer; the pool and stream are live; the context is
        // current on this thread.
        let status = unsafe { f(&mut ptr, len, pool.raw, stream.raw()) };
        ctx.check(status, &format!("{CALL}({len} bytes)"))?;
        let buf = DeviceBuffer {
            ctx: ctx.clone(),
            ptr,
            len,
            pending: Pending::default(),
            release: Release::Free,
        };
        stream.synchronize()?;
        Ok(buf)
    }

    /// Wrap `len` bytes of device memory at `ptr` that the caller owns (e.g. a PyTorch
    /// tensor's storage). Dropping the value never frees the memory; it waits for queued uses.
    ///
    /// # Safety
    ///
    /// - `ptr..ptr + len` is device memory of `ctx`'s GPU (or memory that GPU can address),
    ///   live until the returned value and every copy queued with it are done.
    /// - Nothing else writes that memory while a copy queued through this value may read it,
    ///   and nothing reads or writes it while a copy may write it (device races are the
    ///   caller's to exclude).
    pub unsafe fn from_raw_parts(ctx: &Context, ptr: u64, len: usize) -> DeviceBuffer {
        DeviceBuffer {
            ctx: ctx.clone(),
            ptr,
            len,
            pending: Pending::default(),
            release: Release::Borrowed,
        }
    }

    /// The legacy IPC handle of this allocation (`cuIpcGetMemHandle`). The buffer must be a
    /// whole `cuMemAlloc_v2` allocation: pool and VMM memory need other handle types (a VMM
    /// buffer is refused here: see [`DeviceBuffer::export_fd`]), and a handle names the
    /// allocation's start, so a sub-range would be opened at the wrong place.
    pub fn ipc_handle(&self) -> Result<IpcHandle, CudaError> {
        if self.release == Release::IpcClose {
            return Err(CudaError::InvalidArgument {
                call: "cuIpcGetMemHandle",
                reason: "the buffer is itself an IPC import".to_string(),
            });
        }
        if self.is_shareable_vmm() {
            return Err(CudaError::InvalidArgument {
                call: "cuIpcGetMemHandle",
                reason: "the buffer is a VMM allocation: export it with DeviceBuffer::export_fd"
                    .to_string(),
            });
        }
        self.ctx.make_current()?;
        let mut h = CuIpcMemHandle { reserved: [0; 64] };
        // SAFETY: `h` is a valid out-pointer; the pointer is a live allocation of this context.
        let status = unsafe { (self.ctx.api().cuIpcGetMemHandle)(&mut h, self.ptr) };
        self.ctx.check(status, "cuIpcGetMemHandle")?;
        Ok(IpcHandle(h.reserved))
    }

    /// Map another process's allocation named by `handle` into `ctx`
    /// (`cuIpcOpenMemHandle_v2` with `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`), as `len` bytes;
    /// closed with `cuIpcCloseMemHandle` when dropped. `ctx` should be the context of the GPU
    /// that holds the memory; `len` must not exceed the exported allocation (the driver cannot
    /// check it: a larger `len` makes copies fail with an illegal-address error on the GPU, never
    /// a host memory error).
    pub fn open_ipc(
        ctx: &Context,
        handle: &IpcHandle,
        len: usize,
    ) -> Result<DeviceBuffer, CudaError> {
        ctx.make_current()?;
        let mut ptr: CuDevicePtr = 0;
        let h = CuIpcMemHandle { reserved: handle.0 };
        // SAFETY: `ptr` is a valid out-pointer; the handle is passed by value; the context is
        // current on this thread.
        let status = unsafe {
            (ctx.api().cuIpcOpenMemHandle_v2)(&mut ptr, h, api::IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
        };
        ctx.check(status, "cuIpcOpenMemHandle_v2")?;
        Ok(DeviceBuffer {
            ctx: ctx.clone(),
            ptr,
            len,
            pending: Pending::default(),
            release: Release::IpcClose,
        })
    }
}

/// Why a VMM mapping with the allowed handle types `types` (a `CUmemAllocationHandleType`
/// mask) is not shared.
fn vmm_reason(types: u64) -> String {
    format!(
        "it is a VMM mapping (cuMemCreate) created without a POSIX fd handle type (allowed \
         handle types {types:#x}), so no other process can map it; allocate it with cudaMalloc \
         or with Agent.alloc"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vmm_reasons_name_the_handle_types() {
        let r = vmm_reason(0x8);
        assert!(r.contains("without a POSIX fd handle type"), "{r}");
        assert!(r.contains("0x8"), "{r}");
    }

    #[test]
    fn pool_access_flags_match_cuda_h() {
        use cudarc::driver::sys::CUmemAccess_flags as F;
        assert_eq!(
            PoolAccess::from_raw(F::CU_MEM_ACCESS_FLAGS_PROT_READWRITE as c_int),
            PoolAccess::ReadWrite
        );
        assert_eq!(
            PoolAccess::from_raw(F::CU_MEM_ACCESS_FLAGS_PROT_NONE as c_int),
            PoolAccess::None
        );
        assert_eq!(PoolAccess::from_raw(77), PoolAccess::Other(77));
    }

    #[test]
    fn ipc_handles_print_a_short_prefix() {
        let mut b = [0u8; 64];
        b[0] = 0xab;
        assert_eq!(
            format!("{:?}", IpcHandle(b)),
            "IpcHandle(ab00000000000000..)"
        );
    }
}
