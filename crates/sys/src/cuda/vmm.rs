//! Device memory from the virtual memory management API (CUDA 10.2), shareable across processes
//! as a POSIX file descriptor: [`DeviceBuffer::new_shareable`] allocates one
//! (`cuMemCreate`, `cuMemAddressReserve`, `cuMemMap`, `cuMemSetAccess`),
//! [`DeviceBuffer::export_fd`] exports it (`cuMemExportToShareableHandle`), and
//! [`DeviceBuffer::import_fd`] maps an exported one (`cuMemImportFromShareableHandle`). A
//! descriptor can be passed to another process over a Unix socket (`SCM_RIGHTS`), which the
//! legacy IPC handle ([`DeviceBuffer::ipc_handle`]) does not need but which works where that
//! handle does not (VMM memory, containers without a shared `/dev/shm`).
//!
//! Invariants:
//! - A VMM buffer maps its whole allocation, [`DeviceBuffer::alloc_len`] bytes (the requested
//!   length rounded up to the allocation granularity), at its address; [`DeviceBuffer::len`]
//!   is the requested length, and copies stay inside it.
//! - Dropping the buffer waits for its last queued use (as every [`DeviceBuffer`] does), then
//!   unmaps (`cuMemUnmap`), frees the address range (`cuMemAddressFree`) and releases the
//!   allocation handle (`cuMemRelease`). The memory itself lives until every process that
//!   holds a handle or a mapping has released it.
//! - A driver without one of the calls gives [`CudaError::MissingSymbol`] naming it, before
//!   anything is allocated.
//!
//! How the other [`DeviceBuffer`] helpers behave on VMM memory:
//! - The copies and [`super::Stream::memset`] work unchanged: the address is an ordinary
//!   unified address. Who may touch it is decided by `cuMemSetAccess` alone (the `access`
//!   argument of [`DeviceBuffer::new_shareable`]); [`super::Context::enable_peer_access`] does
//!   not cover VMM memory.
//! - [`super::Cuda::pointer_info`] reports device memory. VMM memory belongs to no context
//!   (`CU_POINTER_ATTRIBUTE_CONTEXT` is null), and its `device_ordinal` is whatever the driver
//!   reports for it, possibly `None`: code that needs the GPU of a VMM buffer takes it from
//!   [`DeviceBuffer::context`]. [`super::Cuda::pointer_range`] reports the mapping;
//!   [`super::Cuda::pointer_mem_pool`] reports no pool.
//! - [`DeviceBuffer::dma_buf`] exports [`DeviceBuffer::len`] bytes as for any buffer. The
//!   allocation is made GPUDirect-RDMA capable (`gpuDirectRDMACapable`) where the device reports
//!   `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED`; elsewhere the driver may
//!   refuse the export.
//! - [`DeviceBuffer::ipc_handle`] refuses VMM buffers: use [`DeviceBuffer::export_fd`].

use super::api::{self, CuMemGenericAllocationHandle};
use super::mapping::{access_ordinals, granularity, need, pinned_prop, require, round_up, Mapping};
use super::memory::{refuse_empty, Release};
use super::{Attribute, Context, CudaError, DeviceBuffer};
use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// What [`DeviceBuffer::export_fd`] says about a buffer that is not a VMM allocation.
fn not_vmm() -> CudaError {
    CudaError::InvalidArgument {
        call: "cuMemExportToShareableHandle",
        reason: "the buffer is not a VMM allocation (DeviceBuffer::new_shareable); share it \
                 with the legacy IPC handle (DeviceBuffer::ipc_handle)"
            .to_string(),
    }
}

/// `handle` as a POSIX file descriptor (`cuMemExportToShareableHandle`); the caller keeps a
/// reference to the handle for the call.
pub(crate) fn export_handle_fd(
    ctx: &Context,
    handle: api::CuMemGenericAllocationHandle,
) -> Result<OwnedFd, CudaError> {
    const CALL: &str = "cuMemExportToShareableHandle";
    let f = need(ctx.api().cuMemExportToShareableHandle, CALL)?;
    ctx.make_current()?;
    let mut fd: c_int = -1;
    // SAFETY: for a POSIX file descriptor the out-pointer is one int, which `fd` is; the
    // handle is live (the caller holds a reference); flags must be 0.
    let status = unsafe {
        f(
            (&mut fd as *mut c_int).cast::<c_void>(),
            handle,
            api::MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0,
        )
    };
    ctx.check(status, CALL)?;
    if fd < 0 {
        return Err(CudaError::InvalidArgument {
            call: CALL,
            reason: format!("the driver returned success with file descriptor {fd}"),
        });
    }
    // SAFETY: the driver just opened `fd` for the caller, who owns it from now on.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl DeviceBuffer {
    /// Allocate `len` bytes on `ctx`'s GPU with the virtual memory management API, shareable
    /// with other processes as a file descriptor ([`DeviceBuffer::export_fd`]): `cuMemCreate`
    /// (pinned, on `ctx`'s device, `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`), rounded up to
    /// the recommended granularity ([`DeviceBuffer::alloc_len`]); `cuMemAddressReserve`;
    /// `cuMemMap`; and `cuMemSetAccess` letting `ctx`'s GPU and the GPU of each context in
    /// `access` read and write it (a peer that cannot access this GPU makes the call fail). The
    /// contents are undefined. Released with `cuMemUnmap`, `cuMemAddressFree` and
    /// `cuMemRelease` when dropped.
    pub fn new_shareable(
        ctx: &Context,
        len: usize,
        access: &[Context],
    ) -> Result<DeviceBuffer, CudaError> {
        const CALL: &str = "cuMemCreate";
        refuse_empty(CALL, len)?;
        require(ctx.api())?;
        let ordinal = ctx.ordinal();
        let device = ctx.device();
        let unsupported = |call: &str| CudaError::Unsupported {
            call: call.to_string(),
            device: Some(ordinal),
        };
        // An attribute the driver does not know is no verdict: cuMemCreate then decides.
        if device.attribute(Attribute::VirtualMemoryManagementSupported) == Ok(0) {
            return Err(unsupported(CALL));
        }
        if device.attribute(Attribute::HandleTypePosixFileDescriptorSupported) == Ok(0) {
            return Err(unsupported(
                "cuMemCreate(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)",
            ));
        }
        let rdma = matches!(
            device.attribute(Attribute::GpuDirectRdmaWithCudaVmmSupported),
            Ok(v) if v != 0
        );
        let prop = pinned_prop(ordinal, rdma);
        ctx.make_current()?;
        let gran = granularity(ctx, &prop, api::MEM_ALLOC_GRANULARITY_RECOMMENDED)?;
        let size = round_up(len, gran)?;
        let create = need(ctx.api().cuMemCreate, CALL)?;
        let mut handle: CuMemGenericAllocationHandle = 0;
        // SAFETY: `handle` is a valid out-pointer; `prop` is a valid property struct read during
        // the call only; the size is a multiple of the granularity; flags must be 0.
        let status = unsafe { create(&mut handle, size, &prop, 0) };
        ctx.check(status, &format!("{CALL}({size} bytes)"))?;
        let mut m = Mapping::new(ctx, handle, size);
        m.reserve(gran)?;
        m.map()?;
        m.set_access(&access_ordinals(
            ordinal,
            access.iter().map(Context::ordinal),
        ))?;
        Ok(m.into_buffer(len))
    }

    /// Map an allocation another process (or this one) exported with
    /// [`DeviceBuffer::export_fd`] into `ctx`, as a buffer of `len` bytes:
    /// `cuMemImportFromShareableHandle`, then `cuMemAddressReserve`, `cuMemMap` and
    /// `cuMemSetAccess` (read and write for `ctx`'s GPU) of `alloc_len` bytes, the exporter's
    /// [`DeviceBuffer::alloc_len`]. `ctx` should be the context of the GPU that holds the memory.
    /// The descriptor stays the caller's (the driver does not keep it), and may be closed
    /// once this returns. Released like [`DeviceBuffer::new_shareable`] memory when dropped.
    pub fn import_fd(
        ctx: &Context,
        fd: BorrowedFd<'_>,
        len: usize,
        alloc_len: usize,
    ) -> Result<DeviceBuffer, CudaError> {
        const CALL: &str = "cuMemImportFromShareableHandle";
        refuse_empty(CALL, len)?;
        if len > alloc_len {
            return Err(CudaError::InvalidArgument {
                call: CALL,
                reason: format!("{len} bytes do not fit in an allocation of {alloc_len}"),
            });
        }
        require(ctx.api())?;
        let ordinal = ctx.ordinal();
        ctx.make_current()?;
        let gran = granularity(
            ctx,
            &pinned_prop(ordinal, false),
            api::MEM_ALLOC_GRANULARITY_MINIMUM,
        )?;
        if !alloc_len.is_multiple_of(gran) {
            return Err(CudaError::InvalidArgument {
                call: CALL,
                reason: format!(
                    "the allocation size {alloc_len} is not a multiple of GPU {ordinal}'s \
                     granularity {gran}: pass the exporter's DeviceBuffer::alloc_len"
                ),
            });
        }
        let Ok(raw_fd) = usize::try_from(fd.as_raw_fd()) else {
            return Err(CudaError::InvalidArgument {
                call: CALL,
                reason: format!("{} is not a file descriptor", fd.as_raw_fd()),
            });
        };
        let import = need(ctx.api().cuMemImportFromShareableHandle, CALL)?;
        let mut handle: CuMemGenericAllocationHandle = 0;
        // cuda.h: for CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR the handle argument is the
        // descriptor itself, cast to a pointer (`(void *)(uintptr_t)fd`).
        let os_handle = std::ptr::without_provenance_mut::<c_void>(raw_fd);
        // SAFETY: `handle` is a valid out-pointer; the descriptor is open for the whole call
        // (it is borrowed), and the driver only reads it (it does not take it over).
        let status = unsafe {
            import(
                &mut handle,
                os_handle,
                api::MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        };
        ctx.check(status, CALL)?;
        let mut m = Mapping::new(ctx, handle, alloc_len);
        m.reserve(0)?;
        m.map()?;
        m.set_access(&[ordinal])?;
        Ok(m.into_buffer(len))
    }

    /// Export the allocation as a file descriptor (`cuMemExportToShareableHandle` with
    /// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`) that [`DeviceBuffer::import_fd`] maps, in
    /// this or another process (pass it with `SCM_RIGHTS`, together with
    /// [`DeviceBuffer::len`] and [`DeviceBuffer::alloc_len`]). Only VMM buffers
    /// ([`DeviceBuffer::is_shareable_vmm`]) have one; others give
    /// [`CudaError::InvalidArgument`]. The caller owns the descriptor; the allocation lives
    /// while any process holds a handle or a mapping of it, not while the descriptor is open.
    pub fn export_fd(&self) -> Result<OwnedFd, CudaError> {
        let Release::Vmm { handle, .. } = self.release else {
            return Err(not_vmm());
        };
        export_handle_fd(&self.ctx, handle)
    }

    /// Whether the buffer is a VMM mapping ([`DeviceBuffer::new_shareable`],
    /// [`DeviceBuffer::import_fd`]), which [`DeviceBuffer::export_fd`] can export.
    pub fn is_shareable_vmm(&self) -> bool {
        matches!(self.release, Release::Vmm { .. })
    }

    /// Bytes of the underlying allocation this value maps: for a VMM buffer the requested
    /// length rounded up to the granularity, the size [`DeviceBuffer::import_fd`] must map;
    /// for any other buffer [`DeviceBuffer::len`].
    pub fn alloc_len(&self) -> usize {
        match self.release {
            Release::Vmm { reserved_len, .. } => reserved_len,
            _ => self.len,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_of_other_memory_points_to_the_ipc_handle() {
        let e = not_vmm();
        assert!(matches!(
            e,
            CudaError::InvalidArgument {
                call: "cuMemExportToShareableHandle",
                ..
            }
        ));
        assert_eq!(
            e.to_string(),
            "cuMemExportToShareableHandle: the buffer is not a VMM allocation \
             (DeviceBuffer::new_shareable); share it with the legacy IPC handle \
             (DeviceBuffer::ipc_handle)"
        );
    }
}
