//! The table of cuFile symbols gdx calls, the C structs they take, and the status codes.
//!
//! Layouts copy `cufile.h` (cuFile 1.x, CUDA 11.4 to 13.x). Enums are plain `c_int`, so that a
//! value this build does not know (a newer library) is a number, never an invalid Rust enum.
//! `CUfileDrvProps_t` is read into a larger zeroed buffer, so that a newer library writing
//! fields this build does not know cannot write past it.

use crate::loader::fn_table;
use std::ffi::{c_int, c_uint, c_void};

/// `CUfileHandle_t`: an opaque handle.
pub(crate) type RawHandle = *mut c_void;

/// `CUfileError_t`: `{ CUfileOpError err; CUresult cu_err; }`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Status {
    pub(crate) err: c_int,
    pub(crate) cu_err: c_int,
}

/// `CU_FILE_HANDLE_TYPE_OPAQUE_FD`: a Linux file descriptor.
pub(crate) const HANDLE_TYPE_OPAQUE_FD: c_int = 1;

/// The `handle` union of `CUfileDescr_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) union DescrHandle {
    pub(crate) fd: c_int,
    pub(crate) handle: *mut c_void,
}

/// `CUfileDescr_t`: `{ enum type; union { int fd; void *handle; } handle; const CUfileFSOps_t *fs_ops; }`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Descr {
    pub(crate) kind: c_int,
    pub(crate) handle: DescrHandle,
    pub(crate) fs_ops: *const c_void,
}

/// The `nvfs` part of `CUfileDrvProps_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct NvfsProps {
    pub(crate) major_version: c_uint,
    pub(crate) minor_version: c_uint,
    pub(crate) poll_thresh_size: usize,
    pub(crate) max_direct_io_size: usize,
    pub(crate) dstatusflags: c_uint,
    pub(crate) dcontrolflags: c_uint,
}

/// `CUfileDrvProps_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct DrvProps {
    pub(crate) nvfs: NvfsProps,
    pub(crate) fflags: c_uint,
    pub(crate) max_device_cache_size: c_uint,
    pub(crate) per_buffer_cache_size: c_uint,
    pub(crate) max_device_pinned_mem_size: c_uint,
    pub(crate) max_batch_io_size: c_uint,
    pub(crate) max_batch_io_timeout_msecs: c_uint,
}

/// [`DrvProps`] followed by spare room for fields a newer library may add.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct DrvPropsBuf {
    pub(crate) props: DrvProps,
    pub(crate) spare: [u64; 32],
}

fn_table! {
    /// libcufile entry points; the required ones exist since cuFile 1.0 (CUDA 11.4).
    pub(crate) struct Api {
        cuFileDriverOpen: fn() -> Status;
        cuFileDriverGetProperties: fn(*mut DrvProps) -> Status;
        cuFileHandleRegister: fn(*mut RawHandle, *mut Descr) -> Status;
        cuFileHandleDeregister: fn(RawHandle) -> ();
        cuFileBufRegister: fn(*const c_void, usize, c_int) -> Status;
        cuFileBufDeregister: fn(*const c_void) -> Status;
        cuFileRead: fn(RawHandle, *mut c_void, usize, i64, i64) -> isize;
        cuFileWrite: fn(RawHandle, *const c_void, usize, i64, i64) -> isize;
    }
    optional {
        // cufile.h maps cuFileDriverClose to cuFileDriverClose_v2 in newer releases; older
        // ones export only the first.
        cuFileDriverClose_v2: fn() -> Status;
        cuFileDriverClose: fn() -> Status;
        // cuFile 1.7 (CUDA 12.2).
        cuFileGetVersion: fn(*mut c_int) -> Status;
    }
}

/// `CU_FILE_SUCCESS`.
pub(crate) const SUCCESS: c_int = 0;
/// `CUFILEOP_BASE_ERR`: cuFile's own status codes start above it.
pub(crate) const BASE_ERR: c_int = 5000;
/// `CU_FILE_CUDA_DRIVER_ERROR`: `cu_err` holds the CUresult.
pub(crate) const CUDA_DRIVER_ERROR: c_int = BASE_ERR + 11;
/// `CU_FILE_DRIVER_ALREADY_OPEN`.
pub(crate) const DRIVER_ALREADY_OPEN: c_int = BASE_ERR + 26;

/// Codes meaning "not supported here" (mapped to [`super::CufileError::Unsupported`]).
pub(crate) const UNSUPPORTED: [c_int; 4] = [
    BASE_ERR + 7,  // CU_FILE_PLATFORM_NOT_SUPPORTED
    BASE_ERR + 8,  // CU_FILE_IO_NOT_SUPPORTED
    BASE_ERR + 9,  // CU_FILE_DEVICE_NOT_SUPPORTED
    BASE_ERR + 34, // CU_FILE_IO_DISABLED
];

/// The name and text of a `CUfileOpError` (cufile.h's `CUFILEOP_STATUS_ENTRIES`); `None` for a
/// code this build does not know.
pub(crate) fn op_error(code: c_int) -> Option<(&'static str, &'static str)> {
    let code = code.checked_abs()?;
    if code == 0 {
        return Some(("CU_FILE_SUCCESS", "cufile success"));
    }
    let text = match code - BASE_ERR {
        1 => ("CU_FILE_DRIVER_NOT_INITIALIZED", "nvidia-fs driver is not loaded; set allow_compat_mode to true in cufile.json to enable compatibility mode"),
        2 => ("CU_FILE_DRIVER_INVALID_PROPS", "invalid property"),
        3 => ("CU_FILE_DRIVER_UNSUPPORTED_LIMIT", "property range error"),
        4 => ("CU_FILE_DRIVER_VERSION_MISMATCH", "nvidia-fs driver version mismatch"),
        5 => ("CU_FILE_DRIVER_VERSION_READ_ERROR", "nvidia-fs driver version read error"),
        6 => ("CU_FILE_DRIVER_CLOSING", "driver shutdown in progress"),
        7 => ("CU_FILE_PLATFORM_NOT_SUPPORTED", "GPUDirect Storage not supported on current platform"),
        8 => ("CU_FILE_IO_NOT_SUPPORTED", "GPUDirect Storage not supported on current file"),
        9 => ("CU_FILE_DEVICE_NOT_SUPPORTED", "GPUDirect Storage not supported on current GPU"),
        10 => ("CU_FILE_NVFS_DRIVER_ERROR", "nvidia-fs driver ioctl error"),
        11 => ("CU_FILE_CUDA_DRIVER_ERROR", "CUDA driver API error"),
        12 => ("CU_FILE_CUDA_POINTER_INVALID", "invalid device pointer"),
        13 => ("CU_FILE_CUDA_MEMORY_TYPE_INVALID", "invalid pointer memory type"),
        14 => ("CU_FILE_CUDA_POINTER_RANGE_ERROR", "pointer range exceeds allocated address range"),
        15 => ("CU_FILE_CUDA_CONTEXT_MISMATCH", "cuda context mismatch"),
        16 => ("CU_FILE_INVALID_MAPPING_SIZE", "access beyond maximum pinned size"),
        17 => ("CU_FILE_INVALID_MAPPING_RANGE", "access beyond mapped size"),
        18 => ("CU_FILE_INVALID_FILE_TYPE", "unsupported file type"),
        19 => ("CU_FILE_INVALID_FILE_OPEN_FLAG", "unsupported file open flags"),
        20 => ("CU_FILE_DIO_NOT_SET", "fd direct IO not set"),
        22 => ("CU_FILE_INVALID_VALUE", "invalid arguments"),
        23 => ("CU_FILE_MEMORY_ALREADY_REGISTERED", "device pointer already registered"),
        24 => ("CU_FILE_MEMORY_NOT_REGISTERED", "device pointer lookup failure"),
        25 => ("CU_FILE_PERMISSION_DENIED", "driver or file access error"),
        26 => ("CU_FILE_DRIVER_ALREADY_OPEN", "driver is already open"),
        27 => ("CU_FILE_HANDLE_NOT_REGISTERED", "file descriptor is not registered"),
        28 => ("CU_FILE_HANDLE_ALREADY_REGISTERED", "file descriptor is already registered"),
        29 => ("CU_FILE_DEVICE_NOT_FOUND", "GPU device not found"),
        30 => ("CU_FILE_INTERNAL_ERROR", "internal error"),
        31 => ("CU_FILE_GETNEWFD_FAILED", "failed to obtain new file descriptor"),
        33 => ("CU_FILE_NVFS_SETUP_ERROR", "NVFS driver initialization error"),
        34 => ("CU_FILE_IO_DISABLED", "GPUDirect Storage disabled by config on current file"),
        35 => ("CU_FILE_BATCH_SUBMIT_FAILED", "failed to submit batch operation"),
        36 => ("CU_FILE_GPU_MEMORY_PINNING_FAILED", "failed to allocate pinned GPU memory"),
        37 => ("CU_FILE_BATCH_FULL", "queue full for batch operation"),
        38 => ("CU_FILE_ASYNC_NOT_SUPPORTED", "cuFile stream operation not supported"),
        43 => ("CU_FILE_NOMEM_ERROR", "cufile no memory error"),
        44 => ("CU_FILE_IO_ERROR", "cufile io error"),
        45 => ("CU_FILE_INTERNAL_BUF_REGISTER_ERROR", "cufile buf registration error"),
        47 => ("CU_FILE_INVALID_CONTEXT_ERROR", "cufile invalid context error"),
        48 => ("CU_FILE_NVFS_INTERNAL_DRIVER_ERROR", "nvfs internal driver error"),
        49 => ("CU_FILE_BATCH_NOCOMPAT_ERROR", "compat mode off error"),
        _ => return None,
    };
    Some(text)
}

/// `CUfileDriverStatusFlags_t` bits: which file systems and block devices cuFile's GDS path
/// supports (`dstatusflags`).
pub(crate) const STATUS_FLAGS: [(u32, &str); 13] = [
    (0, "lustre"),
    (1, "wekafs"),
    (2, "nfs"),
    (3, "gpfs"),
    (4, "nvme"),
    (5, "nvmeof"),
    (6, "scsi"),
    (7, "scaleflux-csd"),
    (8, "nvmesh"),
    (9, "beegfs"),
    (11, "nvme-p2p"),
    (12, "scatefs"),
    (13, "virtiofs"),
];

/// `CU_FILE_USE_POLL_MODE` bit of `dcontrolflags`.
pub(crate) const CONTROL_POLL_MODE: u32 = 0;
/// `CU_FILE_ALLOW_COMPAT_MODE` bit of `dcontrolflags`.
pub(crate) const CONTROL_ALLOW_COMPAT: u32 = 1;

/// `CUfileFeatureFlags_t` bits (`fflags`).
pub(crate) const FEATURE_FLAGS: [(u32, &str); 5] = [
    (0, "dynamic-routing"),
    (1, "batch-io"),
    (2, "streams"),
    (3, "parallel-io"),
    (4, "pci-p2pdma"),
];

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, size_of};

    #[test]
    fn layouts_match_cufile_h_on_lp64() {
        assert_eq!(size_of::<Status>(), 8);
        // int (4) + padding (4) + union of int and pointer (8) + pointer (8).
        assert_eq!(size_of::<Descr>(), 24);
        assert_eq!(align_of::<Descr>(), 8);
        // nvfs: 2 uint + 2 size_t + 2 uint = 32; then 6 uint = 24.
        assert_eq!(size_of::<NvfsProps>(), 32);
        assert_eq!(size_of::<DrvProps>(), 56);
        assert!(size_of::<DrvPropsBuf>() >= 56 + 256);
    }

    #[test]
    fn status_codes_have_names_and_unknown_ones_do_not() {
        assert_eq!(op_error(5001).unwrap().0, "CU_FILE_DRIVER_NOT_INITIALIZED");
        assert_eq!(op_error(-5020).unwrap().0, "CU_FILE_DIO_NOT_SET");
        assert_eq!(
            op_error(CUDA_DRIVER_ERROR).unwrap().0,
            "CU_FILE_CUDA_DRIVER_ERROR"
        );
        assert_eq!(
            op_error(DRIVER_ALREADY_OPEN).unwrap().0,
            "CU_FILE_DRIVER_ALREADY_OPEN"
        );
        assert_eq!(op_error(0).unwrap().0, "CU_FILE_SUCCESS");
        assert!(op_error(5999).is_none());
        assert!(op_error(c_int::MIN).is_none());
    }
}
