//! The table of libcuda driver-API symbols gdx calls, resolved once per loaded library.
//!
//! Prototypes copy `cuda.h` (CUDA 13.0), with two deliberate changes: `CUresult` is a plain
//! `u32` and enum arguments are `c_int`, so that a status or value this build does not know
//! (a newer driver) is a number, never an invalid Rust enum. Handles (`CUcontext`, `CUstream`,
//! `CUevent`) are opaque pointers and `CUdeviceptr` is a `u64`.
//!
//! Required symbols exist in every driver since CUDA 11.0; symbols added later
//! (the memory-pool calls 11.2, `cuMemGetHandleForAddressRange` 11.7, `cuEventElapsedTime_v2`
//! 12.8) are optional, and so are the virtual memory management calls (`cuMemCreate` and its
//! kin, CUDA 10.2, used by `vmm`), so that a driver without them loses only that feature.

use crate::loader::fn_table;
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

/// `CUresult`, as the raw number the driver returns.
pub(crate) type CuResult = u32;
/// `CUdevice`: a device handle, an `int`.
pub(crate) type CuDevice = c_int;

/// `CUcontext`: an opaque context handle.
pub(crate) type CuContext = *mut c_void;
/// `CUstream`: an opaque stream handle.
pub(crate) type CuStream = *mut c_void;
/// `CUevent`: an opaque event handle.
pub(crate) type CuEvent = *mut c_void;
/// `CUdeviceptr`: a device address.
pub(crate) type CuDevicePtr = u64;
/// `CUhostFn`: a host function enqueued on a stream.
pub(crate) type CuHostFn = Option<unsafe extern "C" fn(*mut c_void)>;

/// `CUmodule`: an opaque loaded-module handle.
pub(crate) type CuModule = *mut c_void;
/// `CUfunction`: an opaque kernel handle (owned by its module).
pub(crate) type CuFunction = *mut c_void;

/// `CUmemoryPool`: an opaque memory-pool handle.
pub(crate) type CuMemPool = *mut c_void;

/// `CUipcMemHandle`: 64 opaque bytes naming an allocation across processes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct CuIpcMemHandle {
    pub(crate) reserved: [u8; 64],
}

/// `CUmemLocation`: where memory lives (type, id).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CuMemLocation {
    pub(crate) kind: c_int,
    pub(crate) id: c_int,
}

/// `CUmemAccessDesc`: an access right for one location.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CuMemAccessDesc {
    pub(crate) location: CuMemLocation,
    pub(crate) flags: c_int,
}

/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub(crate) const MEM_LOCATION_TYPE_DEVICE: c_int =
    cudarc::driver::sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE as c_int;
/// `CU_MEM_ACCESS_FLAGS_PROT_NONE`.
pub(crate) const MEM_ACCESS_FLAGS_PROT_NONE: c_int =
    cudarc::driver::sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE as c_int;
/// `CU_MEM_ACCESS_FLAGS_PROT_READ`.
pub(crate) const MEM_ACCESS_FLAGS_PROT_READ: c_int =
    cudarc::driver::sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ as c_int;
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
pub(crate) const MEM_ACCESS_FLAGS_PROT_READWRITE: c_int =
    cudarc::driver::sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE as c_int;
/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`.
pub(crate) const IPC_MEM_LAZY_ENABLE_PEER_ACCESS: c_uint =
    cudarc::driver::sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as c_uint;
/// `CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE`.
pub(crate) const POINTER_ATTRIBUTE_MEMPOOL_HANDLE: c_int =
    cudarc::driver::sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE as c_int;
/// `CU_POINTER_ATTRIBUTE_RANGE_START_ADDR`.
pub(crate) const POINTER_ATTRIBUTE_RANGE_START_ADDR: c_int =
    cudarc::driver::sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR as c_int;
/// `CU_POINTER_ATTRIBUTE_RANGE_SIZE`.
pub(crate) const POINTER_ATTRIBUTE_RANGE_SIZE: c_int =
    cudarc::driver::sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE as c_int;

/// `CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE`.
pub(crate) const POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: c_int =
    cudarc::driver::sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE
        as c_int;
/// `CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR`.
pub(crate) const POINTER_ATTRIBUTE_MAPPING_BASE_ADDR: c_int =
    cudarc::driver::sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR as c_int;
/// `CU_POINTER_ATTRIBUTE_MAPPING_SIZE`.
pub(crate) const POINTER_ATTRIBUTE_MAPPING_SIZE: c_int =
    cudarc::driver::sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MAPPING_SIZE as c_int;
/// `CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES`.
pub(crate) const POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES: c_int =
    cudarc::driver::sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES as c_int;

/// `CUmemGenericAllocationHandle`: a VMM allocation handle (`unsigned long long`).
pub(crate) type CuMemGenericAllocationHandle = c_ulonglong;

/// `CUmemAllocationProp::allocFlags`: the anonymous struct of allocation flags.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CuMemAllocFlags {
    /// `compressionType` (`CU_MEM_ALLOCATION_COMP_NONE` = 0).
    pub(crate) compression_type: u8,
    /// `gpuDirectRDMACapable`: 1 to make the allocation usable for GPUDirect RDMA.
    pub(crate) gpu_direct_rdma_capable: u8,
    /// `usage` (`CU_MEM_CREATE_USAGE_*` bits; 0 for none).
    pub(crate) usage: u16,
    /// `reserved`, must be zero.
    pub(crate) reserved: [u8; 4],
}

/// `CUmemAllocationProp` (`CUmemAllocationProp_v1`): what `cuMemCreate` allocates.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct CuMemAllocationProp {
    /// `type` (`CUmemAllocationType`).
    pub(crate) kind: c_int,
    /// `requestedHandleTypes` (`CUmemAllocationHandleType` bits).
    pub(crate) requested_handle_types: c_int,
    /// `location`.
    pub(crate) location: CuMemLocation,
    /// `win32HandleMetaData`: null on Linux.
    pub(crate) win32_handle_meta_data: *mut c_void,
    /// `allocFlags`.
    pub(crate) alloc_flags: CuMemAllocFlags,
}

/// `CU_MEM_ALLOCATION_TYPE_PINNED`: device memory that is never migrated.
pub(crate) const MEM_ALLOCATION_TYPE_PINNED: c_int = 1;
/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`: a shareable handle that is a file descriptor.
pub(crate) const MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: c_int = 1;
/// `CU_MEM_ALLOC_GRANULARITY_MINIMUM`: the granularity `cuMemCreate` requires.
pub(crate) const MEM_ALLOC_GRANULARITY_MINIMUM: c_int = 0;
/// `CU_MEM_ALLOC_GRANULARITY_RECOMMENDED`: the granularity for best performance.
pub(crate) const MEM_ALLOC_GRANULARITY_RECOMMENDED: c_int = 1;

/// `CUuuid`: 16 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CuUuid {
    pub(crate) bytes: [u8; 16],
}

/// `CUDA_SUCCESS`.
pub(crate) const SUCCESS: CuResult = cudarc::driver::sys::CUresult::CUDA_SUCCESS as CuResult;
/// `CUDA_ERROR_NOT_SUPPORTED`.
pub(crate) const NOT_SUPPORTED: CuResult =
    cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_SUPPORTED as CuResult;
/// `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED`.
pub(crate) const PEER_ACCESS_ALREADY_ENABLED: CuResult =
    cudarc::driver::sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED as CuResult;
/// `CU_MEMHOSTALLOC_PORTABLE`: pinned memory usable from every context.
pub(crate) const MEMHOSTALLOC_PORTABLE: c_uint = cudarc::driver::sys::CU_MEMHOSTALLOC_PORTABLE;
/// `CU_MEMHOSTALLOC_DEVICEMAP`: pinned memory the GPU can address (`cuMemHostGetDevicePointer`).
pub(crate) const MEMHOSTALLOC_DEVICEMAP: c_uint = cudarc::driver::sys::CU_MEMHOSTALLOC_DEVICEMAP;
/// `CUDA_ERROR_NOT_READY`: queued work is not done yet (`cuStreamQuery`).
pub(crate) const NOT_READY: CuResult =
    cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_READY as CuResult;
/// `CU_MEMHOSTREGISTER_PORTABLE`: registered memory usable from every context.
pub(crate) const MEMHOSTREGISTER_PORTABLE: c_uint =
    cudarc::driver::sys::CU_MEMHOSTREGISTER_PORTABLE;
/// `CU_STREAM_NON_BLOCKING`: no implicit synchronisation with the legacy default stream.
pub(crate) const STREAM_NON_BLOCKING: c_uint =
    cudarc::driver::sys::CUstream_flags::CU_STREAM_NON_BLOCKING as c_uint;
/// `CU_EVENT_DEFAULT`: an event that records timestamps.
pub(crate) const EVENT_DEFAULT: c_uint =
    cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT as c_uint;
/// `CU_EVENT_DISABLE_TIMING`: an event for ordering only (cheaper to record).
pub(crate) const EVENT_DISABLE_TIMING: c_uint =
    cudarc::driver::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint;
/// `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`.
pub(crate) const MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD: c_int =
    cudarc::driver::sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD as c_int;
/// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE`.
pub(crate) const POINTER_ATTRIBUTE_MEMORY_TYPE: c_int =
    cudarc::driver::sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE as c_int;
/// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`.
pub(crate) const POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_int =
    cudarc::driver::sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL as c_int;

fn_table! {
    /// libcuda entry points; required ones exist in every driver since CUDA 11.
    pub(crate) struct Api {
        cuInit: fn(c_uint) -> CuResult;
        cuDriverGetVersion: fn(*mut c_int) -> CuResult;
        cuGetErrorName: fn(CuResult, *mut *const c_char) -> CuResult;
        cuGetErrorString: fn(CuResult, *mut *const c_char) -> CuResult;
        cuDeviceGetCount: fn(*mut c_int) -> CuResult;
        cuDeviceGet: fn(*mut CuDevice, c_int) -> CuResult;
        cuDeviceGetName: fn(*mut c_char, c_int, CuDevice) -> CuResult;
        cuDeviceGetPCIBusId: fn(*mut c_char, c_int, CuDevice) -> CuResult;
        cuDeviceTotalMem_v2: fn(*mut usize, CuDevice) -> CuResult;
        cuDeviceGetAttribute: fn(*mut c_int, c_int, CuDevice) -> CuResult;
        cuDeviceCanAccessPeer: fn(*mut c_int, CuDevice, CuDevice) -> CuResult;
        // Contexts.
        cuDevicePrimaryCtxRetain: fn(*mut CuContext, CuDevice) -> CuResult;
        cuDevicePrimaryCtxRelease_v2: fn(CuDevice) -> CuResult;
        cuCtxGetCurrent: fn(*mut CuContext) -> CuResult;
        cuCtxSetCurrent: fn(CuContext) -> CuResult;
        cuCtxPushCurrent_v2: fn(CuContext) -> CuResult;
        cuCtxPopCurrent_v2: fn(*mut CuContext) -> CuResult;
        cuCtxEnablePeerAccess: fn(CuContext, c_uint) -> CuResult;
        // Memory.
        cuMemAlloc_v2: fn(*mut CuDevicePtr, usize) -> CuResult;
        cuMemFree_v2: fn(CuDevicePtr) -> CuResult;
        cuMemHostAlloc: fn(*mut *mut c_void, usize, c_uint) -> CuResult;
        cuMemFreeHost: fn(*mut c_void) -> CuResult;
        cuMemHostRegister_v2: fn(*mut c_void, usize, c_uint) -> CuResult;
        cuMemHostUnregister: fn(*mut c_void) -> CuResult;
        cuPointerGetAttribute: fn(*mut c_void, c_int, CuDevicePtr) -> CuResult;
        // Streams and events.
        cuStreamCreate: fn(*mut CuStream, c_uint) -> CuResult;
        cuStreamDestroy_v2: fn(CuStream) -> CuResult;
        cuStreamSynchronize: fn(CuStream) -> CuResult;
        cuStreamWaitEvent: fn(CuStream, CuEvent, c_uint) -> CuResult;
        cuEventCreate: fn(*mut CuEvent, c_uint) -> CuResult;
        cuEventDestroy_v2: fn(CuEvent) -> CuResult;
        cuEventRecord: fn(CuEvent, CuStream) -> CuResult;
        cuEventSynchronize: fn(CuEvent) -> CuResult;
        cuEventElapsedTime: fn(*mut f32, CuEvent, CuEvent) -> CuResult;
        // Copies.
        cuMemcpyHtoDAsync_v2: fn(CuDevicePtr, *const c_void, usize, CuStream) -> CuResult;
        cuMemcpyDtoHAsync_v2: fn(*mut c_void, CuDevicePtr, usize, CuStream) -> CuResult;
        cuMemcpyDtoDAsync_v2: fn(CuDevicePtr, CuDevicePtr, usize, CuStream) -> CuResult;
        cuMemcpyPeerAsync: fn(CuDevicePtr, CuContext, CuDevicePtr, CuContext, usize, CuStream) -> CuResult;
        cuMemsetD8Async: fn(CuDevicePtr, u8, usize, CuStream) -> CuResult;
        // Mapped host memory, modules and launches (every driver since CUDA 4.0; see `module`,
        // `mapped`).
        cuMemHostGetDevicePointer_v2: fn(*mut CuDevicePtr, *mut c_void, c_uint) -> CuResult;
        cuModuleLoadData: fn(*mut CuModule, *const c_void) -> CuResult;
        cuModuleGetFunction: fn(*mut CuFunction, CuModule, *const c_char) -> CuResult;
        cuModuleUnload: fn(CuModule) -> CuResult;
        cuLaunchKernel: fn(CuFunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CuStream, *mut *mut c_void, *mut *mut c_void) -> CuResult;
        cuStreamQuery: fn(CuStream) -> CuResult;
        // Cross-process sharing (legacy IPC, every driver since CUDA 4.1).
        cuIpcGetMemHandle: fn(*mut CuIpcMemHandle, CuDevicePtr) -> CuResult;
        cuIpcOpenMemHandle_v2: fn(*mut CuDevicePtr, CuIpcMemHandle, c_uint) -> CuResult;
        cuIpcCloseMemHandle: fn(CuDevicePtr) -> CuResult;
    }
    optional {
        cuDeviceGetUuid_v2: fn(*mut CuUuid, CuDevice) -> CuResult;
        cuDeviceGetUuid: fn(*mut CuUuid, CuDevice) -> CuResult;
        // CUDA 10.0; optional so that a driver without it only loses the launch gate.
        cuLaunchHostFunc: fn(CuStream, CuHostFn, *mut c_void) -> CuResult;
        // CUDA 12.8: the same as cuEventElapsedTime, preferred where present.
        cuEventElapsedTime_v2: fn(*mut f32, CuEvent, CuEvent) -> CuResult;
        // CUDA 11.7: export device memory as a dma-buf file descriptor.
        cuMemGetHandleForAddressRange: fn(*mut c_void, CuDevicePtr, usize, c_int, c_ulonglong) -> CuResult;
        // CUDA 11.2: stream-ordered memory pools.
        cuDeviceGetDefaultMemPool: fn(*mut CuMemPool, CuDevice) -> CuResult;
        cuMemPoolSetAccess: fn(CuMemPool, *const CuMemAccessDesc, usize) -> CuResult;
        cuMemPoolGetAccess: fn(*mut c_int, CuMemPool, *mut CuMemLocation) -> CuResult;
        cuMemAllocFromPoolAsync: fn(*mut CuDevicePtr, usize, CuMemPool, CuStream) -> CuResult;
        // CUDA 10.2: virtual memory management (allocation handles, address ranges, mappings,
        // shareable handles).
        cuMemGetAllocationGranularity: fn(*mut usize, *const CuMemAllocationProp, c_int) -> CuResult;
        cuMemCreate: fn(*mut CuMemGenericAllocationHandle, usize, *const CuMemAllocationProp, c_ulonglong) -> CuResult;
        cuMemRelease: fn(CuMemGenericAllocationHandle) -> CuResult;
        cuMemAddressReserve: fn(*mut CuDevicePtr, usize, usize, CuDevicePtr, c_ulonglong) -> CuResult;
        cuMemAddressFree: fn(CuDevicePtr, usize) -> CuResult;
        cuMemMap: fn(CuDevicePtr, usize, usize, CuMemGenericAllocationHandle, c_ulonglong) -> CuResult;
        cuMemUnmap: fn(CuDevicePtr, usize) -> CuResult;
        cuMemSetAccess: fn(CuDevicePtr, usize, *const CuMemAccessDesc, usize) -> CuResult;
        cuMemExportToShareableHandle: fn(*mut c_void, CuMemGenericAllocationHandle, c_int, c_ulonglong) -> CuResult;
        cuMemRetainAllocationHandle: fn(*mut CuMemGenericAllocationHandle, *mut c_void) -> CuResult;
        cuMemImportFromShareableHandle: fn(*mut CuMemGenericAllocationHandle, *mut c_void, c_int) -> CuResult;
        // CUDA 11.7: stream memory operations (`cuda.h` maps `cuStreamWriteValue64` and
        // `cuStreamWaitValue64` to these `_v2` symbols from 12.0 on; see `memop`).
        cuStreamWriteValue64_v2: fn(CuStream, CuDevicePtr, u64, c_uint) -> CuResult;
        cuStreamWaitValue64_v2: fn(CuStream, CuDevicePtr, u64, c_uint) -> CuResult;
    }
}
