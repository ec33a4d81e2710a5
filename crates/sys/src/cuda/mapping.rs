//! The driver calls behind `vmm`: the symbol check, allocation properties, granularity, and
//! [`Mapping`], a VMM mapping being set up that undoes itself when dropped unfinished
//! ([`release`], which [`DeviceBuffer`]'s `Drop` also calls).

use super::api::{
    self, CuDevicePtr, CuMemAccessDesc, CuMemAllocFlags, CuMemAllocationProp,
    CuMemGenericAllocationHandle, CuMemLocation,
};
use super::event::Pending;
use super::memory::Release;
use super::{Context, CudaError, DeviceBuffer};
use std::ffi::c_int;
use std::mem::ManuallyDrop;

/// `f`, or the typed error naming the symbol the loaded driver lacks.
pub(crate) fn need<F>(f: Option<F>, call: &'static str) -> Result<F, CudaError> {
    f.ok_or(CudaError::MissingSymbol { call })
}

/// `Ok` when the driver has every call a VMM mapping needs, else the first one it lacks.
pub(crate) fn require(api: &api::Api) -> Result<(), CudaError> {
    let present = [
        (
            "cuMemGetAllocationGranularity",
            api.cuMemGetAllocationGranularity.is_some(),
        ),
        ("cuMemCreate", api.cuMemCreate.is_some()),
        ("cuMemRelease", api.cuMemRelease.is_some()),
        ("cuMemAddressReserve", api.cuMemAddressReserve.is_some()),
        ("cuMemAddressFree", api.cuMemAddressFree.is_some()),
        ("cuMemMap", api.cuMemMap.is_some()),
        ("cuMemUnmap", api.cuMemUnmap.is_some()),
        ("cuMemSetAccess", api.cuMemSetAccess.is_some()),
        (
            "cuMemExportToShareableHandle",
            api.cuMemExportToShareableHandle.is_some(),
        ),
        (
            "cuMemImportFromShareableHandle",
            api.cuMemImportFromShareableHandle.is_some(),
        ),
    ];
    match present.iter().find(|(_, ok)| !ok) {
        Some(&(call, _)) => Err(CudaError::MissingSymbol { call }),
        None => Ok(()),
    }
}

/// Pinned device memory of GPU `ordinal`, exportable as a POSIX file descriptor, and
/// GPUDirect-RDMA capable when `rdma`.
pub(crate) fn pinned_prop(ordinal: u32, rdma: bool) -> CuMemAllocationProp {
    CuMemAllocationProp {
        kind: api::MEM_ALLOCATION_TYPE_PINNED,
        requested_handle_types: api::MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        location: CuMemLocation {
            kind: api::MEM_LOCATION_TYPE_DEVICE,
            id: c_int::try_from(ordinal).unwrap_or(c_int::MAX),
        },
        win32_handle_meta_data: std::ptr::null_mut(),
        alloc_flags: CuMemAllocFlags {
            gpu_direct_rdma_capable: u8::from(rdma),
            ..CuMemAllocFlags::default()
        },
    }
}

/// The allocation granularity of `prop` (`cuMemGetAllocationGranularity` with `option`);
/// never 0.
pub(crate) fn granularity(
    ctx: &Context,
    prop: &CuMemAllocationProp,
    option: c_int,
) -> Result<usize, CudaError> {
    const CALL: &str = "cuMemGetAllocationGranularity";
    let f = need(ctx.api().cuMemGetAllocationGranularity, CALL)?;
    let mut g: usize = 0;
    // SAFETY: `g` is a valid out-pointer for a size_t; `prop` is a valid property struct, read
    // during the call only.
    let status = unsafe { f(&mut g, prop, option) };
    ctx.check(status, CALL)?;
    if g == 0 {
        return Err(CudaError::InvalidArgument {
            call: CALL,
            reason: "the driver returned success with a granularity of 0".to_string(),
        });
    }
    Ok(g)
}

/// `len` rounded up to a multiple of `granularity` (not 0).
pub(crate) fn round_up(len: usize, granularity: usize) -> Result<usize, CudaError> {
    len.checked_next_multiple_of(granularity)
        .ok_or_else(|| CudaError::InvalidArgument {
            call: "cuMemCreate",
            reason: format!("{len} bytes cannot be rounded up to the granularity {granularity}"),
        })
}

/// The GPUs to grant access, in order and without repeats: `own` first, then each of `others`.
pub(crate) fn access_ordinals(own: u32, others: impl IntoIterator<Item = u32>) -> Vec<u32> {
    let mut ordinals = vec![own];
    for o in others {
        if !ordinals.contains(&o) {
            ordinals.push(o);
        }
    }
    ordinals
}

/// Undo a VMM mapping: `cuMemUnmap` of `size` bytes at `ptr` (when `mapped`),
/// `cuMemAddressFree` of the range (when `ptr` is not 0 and the unmap succeeded), then
/// `cuMemRelease` of `handle`. Every step that may run is tried; the first failure is returned.
///
/// # Safety
///
/// - `ptr` is 0 or the start of a `size`-byte range this caller reserved, mapped to `handle`
///   when `mapped`; the caller owns one reference to `handle`.
/// - No queued work uses the mapping any more, and nothing uses it afterwards.
pub(crate) unsafe fn release(
    ctx: &Context,
    ptr: CuDevicePtr,
    size: usize,
    mapped: bool,
    handle: CuMemGenericAllocationHandle,
) -> Result<(), CudaError> {
    let api = ctx.api();
    let mut first: Option<CudaError> = None;
    let mut keep = |r: Result<(), CudaError>| {
        if let Err(e) = r {
            if first.is_none() {
                first = Some(e);
            } else {
                log::warn!("{e}");
            }
        }
    };
    keep(ctx.bind());
    let mut unmapped = !mapped;
    if mapped {
        let r = need(api.cuMemUnmap, "cuMemUnmap").and_then(|f| {
            // SAFETY: the caller mapped exactly this range and nothing uses it any more.
            let status = unsafe { f(ptr, size) };
            ctx.check(status, "cuMemUnmap")
        });
        unmapped = r.is_ok();
        keep(r);
    }
    if ptr != 0 && unmapped {
        keep(
            need(api.cuMemAddressFree, "cuMemAddressFree").and_then(|f| {
                // SAFETY: the caller reserved exactly this range, which is no longer mapped.
                let status = unsafe { f(ptr, size) };
                ctx.check(status, "cuMemAddressFree")
            }),
        );
    }
    keep(need(api.cuMemRelease, "cuMemRelease").and_then(|f| {
        // SAFETY: the caller owns this reference to the handle and gives it up here; a mapping
        // that is still in place keeps the memory alive.
        let status = unsafe { f(handle) };
        ctx.check(status, "cuMemRelease")
    }));
    match first {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// A VMM mapping being set up. Owns one reference to `handle`; dropped before
/// [`Mapping::into_buffer`], it undoes what was done ([`release`]).
pub(crate) struct Mapping<'a> {
    ctx: &'a Context,
    handle: CuMemGenericAllocationHandle,
    /// The reserved range, 0 until [`Mapping::reserve`].
    ptr: CuDevicePtr,
    size: usize,
    mapped: bool,
}

impl<'a> Mapping<'a> {
    /// Take over one reference to `handle`, an allocation of `size` bytes.
    pub(crate) fn new(
        ctx: &'a Context,
        handle: CuMemGenericAllocationHandle,
        size: usize,
    ) -> Mapping<'a> {
        Mapping {
            ctx,
            handle,
            ptr: 0,
            size,
            mapped: false,
        }
    }

    /// Reserve `size` bytes of address space (`cuMemAddressReserve`; alignment 0 is the
    /// granularity).
    pub(crate) fn reserve(&mut self, alignment: usize) -> Result<(), CudaError> {
        const CALL: &str = "cuMemAddressReserve";
        let f = need(self.ctx.api().cuMemAddressReserve, CALL)?;
        let mut ptr: CuDevicePtr = 0;
        // SAFETY: `ptr` is a valid out-pointer; no fixed address is asked for (0); flags
        // must be 0.
        let status = unsafe { f(&mut ptr, self.size, alignment, 0, 0) };
        self.ctx
            .check(status, &format!("{CALL}({} bytes)", self.size))?;
        self.ptr = ptr;
        Ok(())
    }

    /// Map the whole allocation over the reserved range (`cuMemMap`).
    pub(crate) fn map(&mut self) -> Result<(), CudaError> {
        const CALL: &str = "cuMemMap";
        let f = need(self.ctx.api().cuMemMap, CALL)?;
        // SAFETY: the range was reserved by `reserve` with this size and nothing is mapped on
        // it; offset and flags are 0; the handle is live (this value holds a reference).
        let status = unsafe { f(self.ptr, self.size, 0, self.handle, 0) };
        self.ctx
            .check(status, &format!("{CALL}({} bytes)", self.size))?;
        self.mapped = true;
        Ok(())
    }

    /// Let each GPU of `ordinals` read and write the mapping (`cuMemSetAccess`).
    pub(crate) fn set_access(&self, ordinals: &[u32]) -> Result<(), CudaError> {
        const CALL: &str = "cuMemSetAccess";
        let f = need(self.ctx.api().cuMemSetAccess, CALL)?;
        let descs: Vec<CuMemAccessDesc> = ordinals
            .iter()
            .map(|&o| CuMemAccessDesc {
                location: CuMemLocation {
                    kind: api::MEM_LOCATION_TYPE_DEVICE,
                    id: c_int::try_from(o).unwrap_or(c_int::MAX),
                },
                flags: api::MEM_ACCESS_FLAGS_PROT_READWRITE,
            })
            .collect();
        // SAFETY: the range is mapped by `map`; `descs` holds `descs.len()` valid
        // descriptors, read during the call only.
        let status = unsafe { f(self.ptr, self.size, descs.as_ptr(), descs.len()) };
        let gpus: Vec<String> = ordinals.iter().map(u32::to_string).collect();
        self.ctx.check(
            status,
            &format!("{CALL}(GPU {}, READWRITE)", gpus.join(", GPU ")),
        )
    }

    /// The finished mapping as a buffer of `len` bytes that releases it when dropped.
    pub(crate) fn into_buffer(self, len: usize) -> DeviceBuffer {
        let this = ManuallyDrop::new(self);
        DeviceBuffer {
            ctx: this.ctx.clone(),
            ptr: this.ptr,
            len,
            pending: Pending::default(),
            release: Release::Vmm {
                handle: this.handle,
                reserved_len: this.size,
            },
        }
    }
}

impl Drop for Mapping<'_> {
    fn drop(&mut self) {
        // SAFETY: this value owns the handle reference and the range it reserved and mapped;
        // nothing has been queued on the range (it was never handed out).
        if let Err(e) = unsafe { release(self.ctx, self.ptr, self.size, self.mapped, self.handle) }
        {
            self.ctx.record_err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    #[test]
    fn allocation_props_match_cudarcs_layout() {
        use cudarc::driver::sys as cu;
        assert_eq!(
            size_of::<CuMemAllocationProp>(),
            size_of::<cu::CUmemAllocationProp>()
        );
        assert_eq!(
            align_of::<CuMemAllocationProp>(),
            align_of::<cu::CUmemAllocationProp>()
        );
        assert_eq!(
            size_of::<CuMemAllocFlags>(),
            size_of::<cu::CUmemAllocationProp_st__bindgen_ty_1>()
        );
        assert_eq!(
            align_of::<CuMemAllocFlags>(),
            align_of::<cu::CUmemAllocationProp_st__bindgen_ty_1>()
        );
        assert_eq!(size_of::<CuMemLocation>(), size_of::<cu::CUmemLocation>());
        assert_eq!(
            size_of::<CuMemAccessDesc>(),
            size_of::<cu::CUmemAccessDesc>()
        );
        assert_eq!(
            size_of::<CuMemGenericAllocationHandle>(),
            size_of::<cu::CUmemGenericAllocationHandle>()
        );
        type P = CuMemAllocationProp;
        type C = cu::CUmemAllocationProp_st;
        assert_eq!(offset_of!(P, kind), offset_of!(C, type_));
        assert_eq!(
            offset_of!(P, requested_handle_types),
            offset_of!(C, requestedHandleTypes)
        );
        assert_eq!(offset_of!(P, location), offset_of!(C, location));
        assert_eq!(
            offset_of!(P, win32_handle_meta_data),
            offset_of!(C, win32HandleMetaData)
        );
        assert_eq!(offset_of!(P, alloc_flags), offset_of!(C, allocFlags));
        type F = CuMemAllocFlags;
        type G = cu::CUmemAllocationProp_st__bindgen_ty_1;
        assert_eq!(
            offset_of!(F, compression_type),
            offset_of!(G, compressionType)
        );
        assert_eq!(
            offset_of!(F, gpu_direct_rdma_capable),
            offset_of!(G, gpuDirectRDMACapable)
        );
        assert_eq!(offset_of!(F, usage), offset_of!(G, usage));
        assert_eq!(offset_of!(F, reserved), offset_of!(G, reserved));
        // On x86-64 and aarch64 Linux: 4 + 4 + 8 + 8 + 8.
        assert_eq!(size_of::<CuMemAllocationProp>(), 32);
        assert_eq!(size_of::<CuMemAllocFlags>(), 8);
    }

    #[test]
    fn vmm_constants_match_cuda_h() {
        use cudarc::driver::sys as cu;
        assert_eq!(
            api::MEM_ALLOCATION_TYPE_PINNED,
            cu::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED as c_int
        );
        assert_eq!(
            api::MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR as u32,
            cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0
        );
        assert_eq!(
            api::MEM_ALLOC_GRANULARITY_MINIMUM,
            cu::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM as c_int
        );
        assert_eq!(
            api::MEM_ALLOC_GRANULARITY_RECOMMENDED,
            cu::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED as c_int
        );
    }

    #[test]
    fn props_ask_for_pinned_fd_shareable_memory_of_the_gpu() {
        let p = pinned_prop(3, true);
        assert_eq!(p.kind, api::MEM_ALLOCATION_TYPE_PINNED);
        assert_eq!(
            p.requested_handle_types,
            api::MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        );
        assert_eq!(p.location.kind, api::MEM_LOCATION_TYPE_DEVICE);
        assert_eq!(p.location.id, 3);
        assert!(p.win32_handle_meta_data.is_null());
        assert_eq!(p.alloc_flags.gpu_direct_rdma_capable, 1);
        assert_eq!(p.alloc_flags.compression_type, 0);
        assert_eq!(p.alloc_flags.usage, 0);
        assert_eq!(p.alloc_flags.reserved, [0; 4]);
        assert_eq!(pinned_prop(0, false).alloc_flags.gpu_direct_rdma_capable, 0);
    }

    #[test]
    fn lengths_round_up_to_the_granularity() {
        let g = 2 << 20;
        assert_eq!(round_up(1, g).unwrap(), g);
        assert_eq!(round_up(g, g).unwrap(), g);
        assert_eq!(round_up(g + 1, g).unwrap(), 2 * g);
        let e = round_up(usize::MAX, g).unwrap_err();
        assert!(matches!(
            e,
            CudaError::InvalidArgument {
                call: "cuMemCreate",
                ..
            }
        ));
        assert!(round_up(1, 0).is_err());
    }

    #[test]
    fn access_goes_to_the_own_gpu_first_without_repeats() {
        assert_eq!(access_ordinals(1, []), vec![1]);
        assert_eq!(access_ordinals(1, [0, 1, 2, 0]), vec![1, 0, 2]);
    }

    #[test]
    fn missing_symbols_are_named() {
        let e = need::<fn()>(None, "cuMemCreate").unwrap_err();
        assert_eq!(
            e,
            CudaError::MissingSymbol {
                call: "cuMemCreate"
            }
        );
        assert_eq!(
            e.to_string(),
            "cuMemCreate is not exported by the loaded libcuda (driver too old)"
        );
        assert!(need(Some(1), "cuMemCreate").is_ok());
    }
}
