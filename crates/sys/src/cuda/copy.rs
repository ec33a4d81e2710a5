//! Asynchronous copies and fills on a [`Stream`], checked before any driver call.
//!
//! Every method checks its byte ranges first ([`CudaError::OutOfBounds`],
//! [`CudaError::LengthMismatch`]), then orders itself after the buffers' last uses, enqueues
//! the copy, and marks the buffers as used by this stream (see `event`). The methods return
//! once the copy is queued; reading a host buffer ([`PinnedHostBuffer::as_slice`]) or
//! dropping any buffer waits for it. A destination is borrowed `&mut` while the copy is
//! queued, a source `&`.
//!
//! | method | driver call |
//! |---|---|
//! | [`Stream::copy_to_device`], [`Stream::copy_to_device_at`] | `cuMemcpyHtoDAsync_v2` |
//! | [`Stream::copy_to_host`], [`Stream::copy_to_host_at`] | `cuMemcpyDtoHAsync_v2` |
//! | [`Stream::copy_device`] | `cuMemcpyDtoDAsync_v2` |
//! | [`Stream::copy_peer`] | `cuMemcpyPeerAsync` |
//! | [`Stream::memset`] | `cuMemsetD8Async` |
//! | [`Stream::copy_from_pageable`], [`Stream::copy_to_pageable`] | `cuMemcpyHtoDAsync_v2`, `cuMemcpyDtoHAsync_v2`, then `cuStreamSynchronize` |
//!
//! The two pageable copies take ordinary Rust memory (`&[u8]`, `&mut [u8]`), which the driver
//! stages through its own pinned buffers; they return only when the copy is done, so the
//! borrow covers it. They are the slow path a plain program takes, kept for baselines.
//!
//! [`PinnedHostBuffer::as_slice`]: super::PinnedHostBuffer::as_slice

use super::api::{CuContext, CuDevicePtr};
use super::endpoint::{Dst, Src};
use super::event::Pending;
use super::memory::HostBuffer;
use super::{CudaError, DeviceBuffer, Stream};

/// `offset..offset + len` must lie inside a `size`-byte buffer; `what` names the buffer.
pub(crate) fn check_range(
    what: &'static str,
    offset: usize,
    len: usize,
    size: usize,
) -> Result<(), CudaError> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(CudaError::OutOfBounds {
            what,
            offset,
            len,
            size,
        }),
    }
}

/// A whole-buffer copy needs equal sizes.
pub(crate) fn check_same_len(dst: usize, src: usize) -> Result<(), CudaError> {
    if dst == src {
        Ok(())
    } else {
        Err(CudaError::LengthMismatch { dst, src })
    }
}

/// The device address `offset` bytes into `base`, after [`check_range`].
pub(crate) fn device_at(
    what: &'static str,
    base: CuDevicePtr,
    size: usize,
    offset: usize,
    len: usize,
) -> Result<CuDevicePtr, CudaError> {
    check_range(what, offset, len, size)?;
    Ok(base + offset as u64)
}

/// The device addresses of a device-to-device copy's two ends, ranges checked.
fn device_ends(
    dst: &DeviceBuffer,
    dst_off: usize,
    src: &DeviceBuffer,
    src_off: usize,
    len: usize,
) -> Result<(CuDevicePtr, CuDevicePtr), CudaError> {
    let d = device_at(
        "destination device buffer",
        dst.as_raw(),
        dst.len(),
        dst_off,
        len,
    )?;
    let s = device_at(
        "source device buffer",
        src.as_raw(),
        src.len(),
        src_off,
        len,
    )?;
    Ok((d, s))
}

/// The host address `offset` bytes into `base`, after [`check_range`].
pub(crate) fn host_at(
    what: &'static str,
    (base, size): (*mut u8, usize),
    offset: usize,
    len: usize,
) -> Result<*mut u8, CudaError> {
    check_range(what, offset, len, size)?;
    Ok(base.wrapping_add(offset))
}

/// One copy or fill, with raw addresses (see [`Stream::enqueue_raw`]).
#[derive(Debug, Clone, Copy)]
pub(crate) enum RawCopy {
    /// `cuMemcpyHtoDAsync_v2`.
    HtoD {
        dst: CuDevicePtr,
        src: *const u8,
        len: usize,
    },
    /// `cuMemcpyDtoHAsync_v2`.
    DtoH {
        dst: *mut u8,
        src: CuDevicePtr,
        len: usize,
    },
    /// `cuMemcpyDtoDAsync_v2`.
    DtoD {
        dst: CuDevicePtr,
        src: CuDevicePtr,
        len: usize,
    },
    /// `cuMemcpyPeerAsync`.
    Peer {
        dst: CuDevicePtr,
        dst_ctx: CuContext,
        src: CuDevicePtr,
        src_ctx: CuContext,
        len: usize,
    },
    /// `cuMemsetD8Async`.
    Memset {
        dst: CuDevicePtr,
        value: u8,
        len: usize,
    },
}

impl RawCopy {
    fn len(&self) -> usize {
        match *self {
            RawCopy::HtoD { len, .. }
            | RawCopy::DtoH { len, .. }
            | RawCopy::DtoD { len, .. }
            | RawCopy::Peer { len, .. }
            | RawCopy::Memset { len, .. } => len,
        }
    }
}

impl Stream {
    /// Enqueue `op` as it is, without ordering or marking any buffer. The context must be
    /// current on this thread ([`super::Context::make_current`]).
    ///
    /// # Safety
    ///
    /// - Every address in `op` is valid for `len` bytes (live device memory, or page-locked
    ///   host memory) until the stream has run the copy.
    /// - Host memory the copy writes is neither read nor written by the host, and host memory
    ///   it reads is not written by the host, until the stream has run the copy.
    /// - Any context in `op` is live.
    pub(crate) unsafe fn enqueue_raw(&self, op: RawCopy) -> Result<(), CudaError> {
        let api = self.context().api();
        let s = self.raw();
        let (status, call) = match op {
            RawCopy::HtoD { dst, src, len } => (
                // SAFETY: the caller guarantees the addresses (and contexts); the stream is live.
                unsafe { (api.cuMemcpyHtoDAsync_v2)(dst, src.cast(), len, s) },
                "cuMemcpyHtoDAsync_v2",
            ),
            RawCopy::DtoH { dst, src, len } => (
                // SAFETY: the caller guarantees the addresses (and contexts); the stream is live.
                unsafe { (api.cuMemcpyDtoHAsync_v2)(dst.cast(), src, len, s) },
                "cuMemcpyDtoHAsync_v2",
            ),
            RawCopy::DtoD { dst, src, len } => (
                // SAFETY: the caller guarantees the addresses (and contexts); the stream is live.
                unsafe { (api.cuMemcpyDtoDAsync_v2)(dst, src, len, s) },
                "cuMemcpyDtoDAsync_v2",
            ),
            RawCopy::Peer {
                dst,
                dst_ctx,
                src,
                src_ctx,
                len,
            } => (
                // SAFETY: the caller guarantees the addresses (and contexts); the stream is live.
                unsafe { (api.cuMemcpyPeerAsync)(dst, dst_ctx, src, src_ctx, len, s) },
                "cuMemcpyPeerAsync",
            ),
            RawCopy::Memset { dst, value, len } => (
                // SAFETY: the caller guarantees the addresses (and contexts); the stream is live.
                unsafe { (api.cuMemsetD8Async)(dst, value, len, s) },
                "cuMemsetD8Async",
            ),
        };
        self.context()
            .check(status, &format!("{call}({} bytes)", op.len()))
    }

    /// Order `op` after the last uses of `uses`, enqueue it, and mark `uses` as used here.
    pub(crate) fn tracked(&self, uses: &[&Pending], op: RawCopy) -> Result<(), CudaError> {
        if op.len() == 0 {
            return Ok(());
        }
        self.context().make_current()?;
        for p in uses {
            p.order_before(self)?;
        }
        // SAFETY: the public callers built `op` from live buffers they borrow (destinations
        // `&mut`, sources `&`) after checking the ranges; the marks below make host access
        // and `Drop` of those buffers wait for the copy; the context is current.
        unsafe { self.enqueue_raw(op) }?;
        for p in uses {
            if let Err(e) = p.mark(self) {
                // Without the mark nothing would wait for the copy: wait for it here.
                if let Err(sync) = self.synchronize() {
                    self.context().record_err(sync);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Copy all of `src` (host) into all of `dst` (device); the sizes must be equal.
    pub fn copy_to_device(
        &self,
        dst: &mut DeviceBuffer,
        src: &impl HostBuffer,
    ) -> Result<(), CudaError> {
        check_same_len(dst.len(), src.size())?;
        self.copy_to_device_at(dst, 0, src, 0, src.size())
    }

    /// Copy `len` bytes from `src` (host) at `src_off` to `dst` (device) at `dst_off`.
    pub fn copy_to_device_at(
        &self,
        dst: &mut DeviceBuffer,
        dst_off: usize,
        src: &impl HostBuffer,
        src_off: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        self.copy(Dst::Device(dst), dst_off, Src::Host(src), src_off, len)
    }

    /// Copy all of `src` (device) into all of `dst` (host); the sizes must be equal.
    pub fn copy_to_host(
        &self,
        dst: &mut impl HostBuffer,
        src: &DeviceBuffer,
    ) -> Result<(), CudaError> {
        check_same_len(dst.size(), src.len())?;
        self.copy_to_host_at(dst, 0, src, 0, src.len())
    }

    /// Copy `len` bytes from `src` (device) at `src_off` to `dst` (host) at `dst_off`.
    pub fn copy_to_host_at(
        &self,
        dst: &mut impl HostBuffer,
        dst_off: usize,
        src: &DeviceBuffer,
        src_off: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        self.copy(Dst::Host(dst), dst_off, Src::Device(src), src_off, len)
    }

    /// Copy `len` bytes between device buffers (`cuMemcpyDtoDAsync_v2`; through unified
    /// addressing also between GPUs, where [`Stream::copy_peer`] is the explicit form).
    pub fn copy_device(
        &self,
        dst: &mut DeviceBuffer,
        dst_off: usize,
        src: &DeviceBuffer,
        src_off: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        let (d, s) = device_ends(dst, dst_off, src, src_off, len)?;
        let op = RawCopy::DtoD {
            dst: d,
            src: s,
            len,
        };
        self.tracked(&[&dst.pending, &src.pending], op)
    }

    /// Copy `len` bytes from `src` at `src_off` to `dst` at `dst_off`, each on its own GPU
    /// (`cuMemcpyPeerAsync`). It runs over the direct link only when the stream's context has
    /// peer access to the other GPU ([`super::Context::enable_peer_access`]); without it the
    /// driver stages the bytes through the host.
    pub fn copy_peer(
        &self,
        dst: &mut DeviceBuffer,
        dst_off: usize,
        src: &DeviceBuffer,
        src_off: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        let (d, s) = device_ends(dst, dst_off, src, src_off, len)?;
        let op = RawCopy::Peer {
            dst: d,
            dst_ctx: dst.context().as_raw(),
            src: s,
            src_ctx: src.context().as_raw(),
            len,
        };
        self.tracked(&[&dst.pending, &src.pending], op)
    }

    /// Copy all of `src`, ordinary (pageable) host memory, to `dst` at `dst_off`, and wait
    /// until it is done (`cuMemcpyHtoDAsync_v2`, `cuStreamSynchronize`). The driver stages the
    /// bytes through its own pinned memory: this is what a plain `cudaMemcpy` does.
    pub fn copy_from_pageable(
        &self,
        dst: &mut DeviceBuffer,
        dst_off: usize,
        src: &[u8],
    ) -> Result<(), CudaError> {
        let len = src.len();
        let d = device_at(
            "destination device buffer",
            dst.as_raw(),
            dst.len(),
            dst_off,
            len,
        )?;
        self.pageable(
            &dst.pending,
            RawCopy::HtoD {
                dst: d,
                src: src.as_ptr(),
                len,
            },
        )
    }

    /// Copy `dst.len()` bytes of `src` at `src_off` into `dst`, ordinary (pageable) host
    /// memory, and wait until it is done (`cuMemcpyDtoHAsync_v2`, `cuStreamSynchronize`).
    pub fn copy_to_pageable(
        &self,
        dst: &mut [u8],
        src: &DeviceBuffer,
        src_off: usize,
    ) -> Result<(), CudaError> {
        let len = dst.len();
        let s = device_at(
            "source device buffer",
            src.as_raw(),
            src.len(),
            src_off,
            len,
        )?;
        self.pageable(
            &src.pending,
            RawCopy::DtoH {
                dst: dst.as_mut_ptr(),
                src: s,
                len,
            },
        )
    }

    /// Order `op` after the device buffer's last use, enqueue it, and wait for the stream.
    fn pageable(&self, device: &Pending, op: RawCopy) -> Result<(), CudaError> {
        if op.len() == 0 {
            return Ok(());
        }
        self.context().make_current()?;
        device.order_before(self)?;
        // SAFETY: the public callers built `op` from a live device buffer and a host slice they
        // borrow (the destination `&mut`) after checking the ranges; the stream is synchronised
        // below, before either borrow ends, so no copy outlives them; the context is current.
        let queued = unsafe { self.enqueue_raw(op) };
        let waited = self.synchronize();
        queued?;
        waited
    }

    /// Set `len` bytes of `dst` at `offset` to `value` (`cuMemsetD8Async`).
    pub fn memset(
        &self,
        dst: &mut DeviceBuffer,
        offset: usize,
        len: usize,
        value: u8,
    ) -> Result<(), CudaError> {
        let d = device_at(
            "destination device buffer",
            dst.as_raw(),
            dst.len(),
            offset,
            len,
        )?;
        let op = RawCopy::Memset { dst: d, value, len };
        self.tracked(&[&dst.pending], op)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_inside_the_buffer_pass() {
        assert!(check_range("b", 0, 16, 16).is_ok());
        assert!(check_range("b", 15, 1, 16).is_ok());
        assert!(check_range("b", 16, 0, 16).is_ok());
        assert!(check_range("b", 3, 5, 16).is_ok());
    }

    #[test]
    fn ranges_past_the_end_are_refused_with_the_numbers() {
        assert_eq!(
            check_range("source device buffer", 10, 7, 16).unwrap_err(),
            CudaError::OutOfBounds {
                what: "source device buffer",
                offset: 10,
                len: 7,
                size: 16
            }
        );
        assert!(check_range("b", 17, 0, 16).is_err());
        assert!(check_range("b", 0, 17, 16).is_err());
    }

    #[test]
    fn ranges_that_overflow_are_refused() {
        assert!(check_range("b", usize::MAX, 1, 16).is_err());
        assert!(check_range("b", 1, usize::MAX, usize::MAX).is_err());
    }

    #[test]
    fn addresses_are_base_plus_offset_after_the_check() {
        assert_eq!(device_at("b", 0x1000, 64, 3, 61).unwrap(), 0x1003);
        assert!(device_at("b", 0x1000, 64, 3, 62).is_err());
        let mut host = [0u8; 8];
        let base = host.as_mut_ptr();
        assert_eq!(host_at("h", (base, 8), 5, 3).unwrap(), base.wrapping_add(5));
        assert!(host_at("h", (base, 8), 5, 4).is_err());
    }

    #[test]
    fn whole_buffer_copies_need_equal_sizes() {
        assert!(check_same_len(4, 4).is_ok());
        assert_eq!(
            check_same_len(4, 5).unwrap_err().to_string(),
            "cannot copy a 5-byte buffer into a 4-byte buffer: sizes differ"
        );
    }
}
