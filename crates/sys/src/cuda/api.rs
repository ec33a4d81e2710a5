//! The table of libcuda driver-API symbols gdx calls, resolved once per loaded library.
//!
//! Prototypes copy `cuda.h` (CUDA 13.0), with two deliberate changes: `CUresult` is a plain
//! `u32` and enum arguments are `c_int`, so that a status or value this build does not know
//! (a newer driver) is a number, never an invalid Rust enum. The engine's later calls
//! (allocations, streams, copies) are added here as fields, required or optional.

use crate::loader::fn_table;
use std::ffi::{c_char, c_int, c_uint};

/// `CUresult`, as the raw number the driver returns.
pub(crate) type CuResult = u32;
/// `CUdevice`: a device handle, an `int`.
pub(crate) type CuDevice = c_int;

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
    }
    optional {
        cuDeviceGetUuid_v2: fn(*mut CuUuid, CuDevice) -> CuResult;
        cuDeviceGetUuid: fn(*mut CuUuid, CuDevice) -> CuResult;
    }
}
