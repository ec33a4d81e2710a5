//! Registering GPU memory with an RDMA device: the two GPUDirect RDMA routes.
//!
//! - [`RegMethod::DmaBuf`]: export the memory as a dma-buf (`cuMemGetHandleForAddressRange`),
//!   then `ibv_reg_dmabuf_mr`. Needs a kernel with dma-buf peer-to-peer and an NVIDIA open
//!   kernel module.
//! - [`RegMethod::PeerMem`]: `ibv_reg_mr` on the device address. Needs the `nvidia_peermem`
//!   (or `nv_peer_mem`) module, without which the kernel answers `EFAULT`.
//!
//! [`GpuRegistration`] borrows the [`DeviceBuffer`], so the memory outlives the memory region;
//! dropping it deregisters (`ibv_dereg_mr`), then deallocates the protection domain and closes
//! the device.

use super::context::chain_text;
use crate::cuda::{CudaError, DeviceBuffer, DmaBuf};
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::AccessFlags;
use std::fmt;
use std::marker::PhantomData;
use std::os::fd::AsRawFd;
use std::sync::Arc;

/// How GPU memory is registered with an RDMA device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RegMethod {
    /// dma-buf export + `ibv_reg_dmabuf_mr`.
    DmaBuf,
    /// `ibv_reg_mr` on the device address (nvidia-peermem).
    PeerMem,
}

impl fmt::Display for RegMethod {
    /// `dma-buf` or `peermem`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RegMethod::DmaBuf => "dma-buf",
            RegMethod::PeerMem => "peermem",
        })
    }
}

/// A registration that failed, naming the step.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegisterError {
    /// libibverbs could not be used.
    #[error(transparent)]
    Unavailable(#[from] crate::Unavailable),
    /// libibverbs could not list its devices.
    #[error("ibv_get_device_list failed while looking for {device}: {detail}")]
    DeviceList {
        /// The device looked for.
        device: String,
        /// The failure, as text.
        detail: String,
    },
    /// libibverbs lists no device of that name.
    #[error("no RDMA device {device}; libibverbs lists {}", if listed.is_empty() {
        "none".to_string()
    } else {
        listed.join(", ")
    })]
    NoDevice {
        /// The device looked for.
        device: String,
        /// The devices libibverbs lists.
        listed: Vec<String>,
    },
    /// A verbs call failed; `detail` is its errno text.
    #[error(
        "failed to register {len} bytes of GPU {gpu} memory with {device} ({method}): {call} \
         failed: {detail}"
    )]
    Verbs {
        /// The verbs call, e.g. `ibv_reg_dmabuf_mr`.
        call: &'static str,
        /// RDMA device name.
        device: String,
        /// GPU ordinal.
        gpu: u32,
        /// Bytes.
        len: usize,
        /// The method.
        method: RegMethod,
        /// What the call reported.
        detail: String,
    },
    /// The dma-buf export failed.
    #[error("dma-buf export of GPU memory failed: {0}")]
    Cuda(#[from] CudaError),
}

/// GPU memory registered with an RDMA device; deregistered when dropped.
pub struct GpuRegistration<'a> {
    // Field order is drop order: the MR goes before the dma-buf descriptor.
    mr: Arc<MemoryRegion>,
    _dma_buf: Option<DmaBuf<'a>>,
    method: RegMethod,
    _buffer: PhantomData<&'a DeviceBuffer>,
}

impl fmt::Debug for GpuRegistration<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuRegistration")
            .field("method", &self.method)
            .field("lkey", &self.mr.lkey())
            .field("rkey", &self.mr.rkey())
            .finish()
    }
}

impl GpuRegistration<'_> {
    /// The local key.
    pub fn lkey(&self) -> u32 {
        self.mr.lkey()
    }
    /// The remote key.
    pub fn rkey(&self) -> u32 {
        self.mr.rkey()
    }
    /// How the memory was registered.
    pub fn method(&self) -> RegMethod {
        self.method
    }
}

/// Register all of `buffer` with RDMA device `rdma_device` (e.g. `mlx5_0`) by `method`, for
/// local write and remote read and write.
pub fn register_gpu_memory<'a>(
    rdma_device: &str,
    method: RegMethod,
    buffer: &'a DeviceBuffer,
) -> Result<GpuRegistration<'a>, RegisterError> {
    super::probe()?;
    let verbs_err = |call: &'static str, detail: String| RegisterError::Verbs {
        call,
        device: rdma_device.to_string(),
        gpu: buffer.context().ordinal(),
        len: buffer.len(),
        method,
        detail,
    };
    let list = DeviceList::new().map_err(|e| RegisterError::DeviceList {
        device: rdma_device.to_string(),
        detail: chain_text(&e),
    })?;
    let Some(dev) = list.iter().find(|d| d.name() == rdma_device) else {
        return Err(RegisterError::NoDevice {
            device: rdma_device.to_string(),
            listed: list.iter().map(|d| d.name()).collect(),
        });
    };
    let ctx = dev
        .open()
        .map_err(|e| verbs_err("ibv_open_device", chain_text(&e)))?;
    let pd = ctx
        .alloc_pd()
        .map_err(|e| verbs_err("ibv_alloc_pd", chain_text(&e)))?;
    let access = AccessFlags::LocalWrite | AccessFlags::RemoteWrite | AccessFlags::RemoteRead;
    let (mr, dma_buf) = match method {
        RegMethod::DmaBuf => {
            let d = buffer.dma_buf()?;
            // SAFETY: `d` is a dma-buf exporting all `len` bytes of `buffer`, which outlives
            // the returned registration (it borrows the buffer), and the MR is dropped before
            // the descriptor (field order). The iova is the device address, as NCCL uses.
            let mr = unsafe {
                pd.reg_dmabuf_mr(0, d.len(), buffer.as_raw(), d.fd().as_raw_fd(), access)
            }
            .map_err(|e| verbs_err("ibv_reg_dmabuf_mr", chain_text(&e)))?;
            (mr, Some(d))
        }
        RegMethod::PeerMem => {
            let addr = usize::try_from(buffer.as_raw())
                .map_err(|_| verbs_err("ibv_reg_mr", "device address does not fit usize".into()))?;
            // SAFETY: the address range is all of `buffer`, device memory that outlives the
            // returned registration (it borrows the buffer); the host never dereferences it.
            let mr = unsafe { pd.reg_mr(addr, buffer.len(), access) }
                .map_err(|e| verbs_err("ibv_reg_mr", chain_text(&e)))?;
            (mr, None)
        }
    };
    Ok(GpuRegistration {
        mr,
        _dma_buf: dma_buf,
        method,
        _buffer: PhantomData,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_call_device_gpu_and_method() {
        let e = RegisterError::Verbs {
            call: "ibv_reg_mr",
            device: "mlx5_0".into(),
            gpu: 1,
            len: 8 << 20,
            method: RegMethod::PeerMem,
            detail: "Bad address (os error 14)".into(),
        };
        assert_eq!(
            e.to_string(),
            "failed to register 8388608 bytes of GPU 1 memory with mlx5_0 (peermem): \
             ibv_reg_mr failed: Bad address (os error 14)"
        );
        assert_eq!(RegMethod::DmaBuf.to_string(), "dma-buf");
    }
}
