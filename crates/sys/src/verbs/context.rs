//! [`RdmaContext`]: one opened RDMA device with one protection domain, the parent of every
//! memory region, completion queue and queue pair made here.
//!
//! Invariants:
//! - The device context and the protection domain (sideway's owning types, which release
//!   them on drop) live as long as the last clone of the [`RdmaContext`]; every child
//!   ([`super::MemoryRegion`], [`super::CompletionQueue`], [`super::QueuePair`]) holds a clone,
//!   so teardown order follows from ownership.
//! - Nothing here panics on a value the device reports: capabilities are clamped into range.

use super::error::{Errno, VerbsError};
use super::port::{self, Port};
use super::SONAME;
use crate::Unavailable;
use rdma_mummy_sys::{ibv_context, ibv_pd};
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::DeviceContext;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

/// Device limits that bring-up and posting need (`ibv_query_device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceCaps {
    /// Physical ports.
    pub phys_port_cnt: u8,
    /// Largest work-request queue per QP.
    pub max_qp_wr: u32,
    /// Largest scatter/gather list per work request.
    pub max_sge: u32,
    /// Largest completion queue.
    pub max_cqe: u32,
    /// RDMA READ/atomic operations this device serves at once per QP (responder side).
    pub max_qp_rd_atom: u8,
    /// RDMA READ/atomic operations this device starts at once per QP (initiator side).
    pub max_qp_init_rd_atom: u8,
    /// Largest memory region in bytes.
    pub max_mr_size: u64,
}

/// An opened RDMA device and its protection domain. Cheap to clone; clones share both.
#[derive(Clone)]
pub struct RdmaContext {
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    caps: DeviceCaps,
    // Field order is drop order: the PD goes before the device context it belongs to.
    pd: Arc<ProtectionDomain>,
    ctx: Arc<DeviceContext>,
}

impl fmt::Debug for RdmaContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RdmaContext")
            .field("device", &self.inner.name)
            .field("caps", &self.inner.caps)
            .finish()
    }
}

/// What the kernel-side dma-buf probe found (NCCL's probe: `ibv_reg_dmabuf_mr` with fd −1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DmabufSupport {
    /// `EBADF`: kernel and provider accept dma-buf memory regions (the fd was the only
    /// problem).
    Supported,
    /// `EOPNOTSUPP` or `EPROTONOSUPPORT`: the kernel or the provider does not. The errno is
    /// kept for the evidence line.
    NotSupported(Errno),
    /// The loaded libibverbs does not export `ibv_reg_dmabuf_mr` (rdma-core older than v34).
    LibraryTooOld,
    /// The probe could not run or gave an answer it does not explain (another errno, no such
    /// device, PD allocation failed).
    Error(String),
}

impl fmt::Display for DmabufSupport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DmabufSupport::Supported => {
                f.write_str("supported (ibv_reg_dmabuf_mr(fd=-1) failed with EBADF)")
            }
            DmabufSupport::NotSupported(e) => {
                write!(
                    f,
                    "not supported (ibv_reg_dmabuf_mr(fd=-1) failed with {e})"
                )
            }
            DmabufSupport::LibraryTooOld => f.write_str(
                "not supported: the loaded libibverbs lacks ibv_reg_dmabuf_mr (rdma-core < v34)",
            ),
            DmabufSupport::Error(why) => write!(f, "probe failed: {why}"),
        }
    }
}

/// An error and its source chain as one line, e.g. `ibv_reg_mr: Bad address (os error 14)`.
pub(super) fn chain_text(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}

/// The errno inside a sideway error chain, if any. sideway wraps the `io::Error` in
/// `#[error(transparent)]` kind enums, whose `source()` skips it, so those are looked into.
fn errno_of(e: &(dyn std::error::Error + 'static)) -> Errno {
    use sideway::ibverbs::device::{GetDeviceListErrorKind, OpenDeviceErrorKind};
    use sideway::ibverbs::device_context::{
        AllocateProtectionDomainErrorKind, QueryDeviceErrorKind,
    };
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        let io = if let Some(io) = err.downcast_ref::<std::io::Error>() {
            Some(io)
        } else if let Some(GetDeviceListErrorKind::Ibverbs(io)) = err.downcast_ref() {
            Some(io)
        } else if let Some(OpenDeviceErrorKind::Ibverbs(io)) = err.downcast_ref() {
            Some(io)
        } else if let Some(QueryDeviceErrorKind::Ibverbs(io)) = err.downcast_ref() {
            Some(io)
        } else if let Some(AllocateProtectionDomainErrorKind::Ibverbs(io)) = err.downcast_ref() {
            Some(io)
        } else {
            None
        };
        if let Some(n) = io.and_then(std::io::Error::raw_os_error) {
            return Errno(n);
        }
        cur = err.source();
    }
    Errno(0)
}

fn clamp_u32(v: i32) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

fn clamp_u8(v: i32) -> u8 {
    u8::try_from(v.max(0)).unwrap_or(u8::MAX)
}

impl RdmaContext {
    /// Open RDMA device `name` (e.g. `mlx5_0`) and allocate its protection domain.
    pub fn open(name: &str) -> Result<RdmaContext, VerbsError> {
        super::probe()?;
        let list = DeviceList::new().map_err(|e| {
            let errno = errno_of(&e);
            if matches!(errno.0, libc::ENOSYS | libc::EOPNOTSUPP) {
                return VerbsError::NoSuchDevice {
                    name: name.to_string(),
                    available: Vec::new(),
                };
            }
            VerbsError::Unavailable(Unavailable::new(
                SONAME,
                format!("ibv_get_device_list failed: {}", chain_text(&e)),
            ))
        })?;
        let Some(dev) = list.iter().find(|d| d.name() == name) else {
            return Err(VerbsError::NoSuchDevice {
                name: name.to_string(),
                available: list.iter().map(|d| d.name()).collect(),
            });
        };
        let ctx = dev
            .open()
            .map_err(|e| VerbsError::from_errno("ibv_open_device", name, "", errno_of(&e)))?;
        let attr = ctx
            .query_device()
            .map_err(|e| VerbsError::from_errno("ibv_query_device_ex", name, "", errno_of(&e)))?;
        let caps = DeviceCaps {
            phys_port_cnt: attr.phys_port_cnt(),
            max_qp_wr: clamp_u32(attr.max_qp_wr()),
            max_sge: clamp_u32(attr.max_sge()),
            max_cqe: clamp_u32(attr.max_cqe()),
            max_qp_rd_atom: clamp_u8(attr.max_qp_rd_atom()),
            max_qp_init_rd_atom: clamp_u8(attr.max_qp_init_rd_atom()),
            max_mr_size: attr.max_mr_size(),
        };
        let pd = ctx
            .alloc_pd()
            .map_err(|e| VerbsError::from_errno("ibv_alloc_pd", name, "", errno_of(&e)))?;
        Ok(RdmaContext {
            inner: Arc::new(Inner {
                name: name.to_string(),
                caps,
                pd,
                ctx,
            }),
        })
    }

    /// The device name, e.g. `mlx5_0`.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The device limits.
    pub fn caps(&self) -> DeviceCaps {
        self.inner.caps
    }

    /// Port `number` (from 1) with its state, MTUs, rate, LID and GID table. A port that
    /// cannot be queried comes back with its `error` set.
    pub fn port(&self, number: u8) -> Port {
        port::query(&self.inner.ctx, &self.inner.name, number)
    }

    /// The raw device context. Still owned by this value: do not close it.
    pub(crate) fn raw_context(&self) -> NonNull<ibv_context> {
        // SAFETY: the pointer is only used while `self` (which owns the context) lives; every
        // user in this module tree holds a clone of `self` for as long as it uses it.
        unsafe { self.inner.ctx.context() }
    }

    /// The raw protection domain. Still owned by this value: do not deallocate it.
    pub(crate) fn raw_pd(&self) -> NonNull<ibv_pd> {
        // SAFETY: as for `raw_context`: the users hold a clone of `self`.
        unsafe { self.inner.pd.pd() }
    }

    /// Whether two handles share one opened device.
    pub fn same(&self, other: &RdmaContext) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// NCCL's kernel-side dma-buf probe on this device: `ibv_reg_dmabuf_mr(pd, 0, 0, 0, -1,
    /// 0)`. `EBADF` means the kernel and provider support dma-buf regions;
    /// `EOPNOTSUPP`/`EPROTONOSUPPORT` mean they do not.
    pub fn dmabuf_probe(&self) -> DmabufSupport {
        if !super::has_reg_dmabuf_mr() {
            return DmabufSupport::LibraryTooOld;
        }
        let pd = self.raw_pd();
        // SAFETY: `pd` is this context's live protection domain; fd -1 is never a valid
        // descriptor, so the kernel rejects the call before mapping anything.
        let mr = unsafe { rdma_mummy_sys::ibv_reg_dmabuf_mr(pd.as_ptr(), 0, 0, 0, -1, 0) };
        let errno = Errno::last();
        if !mr.is_null() {
            // SAFETY: `mr` was just returned by a successful registration and is released
            // exactly once, here.
            let rc = unsafe { rdma_mummy_sys::ibv_dereg_mr(mr) };
            if rc != 0 {
                log::warn!(
                    "{}: ibv_dereg_mr after the dma-buf probe failed: {}",
                    self.name(),
                    Errno(rc)
                );
            }
            return DmabufSupport::Error(
                "ibv_reg_dmabuf_mr(fd=-1) unexpectedly succeeded".to_string(),
            );
        }
        classify_dmabuf_errno(errno)
    }
}

/// The meaning of the errno the fd −1 probe left.
pub(crate) fn classify_dmabuf_errno(errno: Errno) -> DmabufSupport {
    match errno.0 {
        libc::EBADF => DmabufSupport::Supported,
        libc::EOPNOTSUPP | libc::EPROTONOSUPPORT => DmabufSupport::NotSupported(errno),
        _ => DmabufSupport::Error(format!(
            "ibv_reg_dmabuf_mr(fd=-1) failed with {errno}, which the probe does not interpret"
        )),
    }
}

/// NCCL's kernel-side dma-buf probe on RDMA device `device` (opens it for the probe).
pub fn dmabuf_kernel_support(device: &str) -> DmabufSupport {
    match RdmaContext::open(device) {
        Ok(ctx) => ctx.dmabuf_probe(),
        Err(e) => DmabufSupport::Error(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dmabuf_errnos_mean_what_nccl_says() {
        assert_eq!(
            classify_dmabuf_errno(Errno(libc::EBADF)),
            DmabufSupport::Supported
        );
        assert_eq!(
            classify_dmabuf_errno(Errno(libc::EOPNOTSUPP)),
            DmabufSupport::NotSupported(Errno(libc::EOPNOTSUPP))
        );
        assert_eq!(
            classify_dmabuf_errno(Errno(libc::EPROTONOSUPPORT)),
            DmabufSupport::NotSupported(Errno(libc::EPROTONOSUPPORT))
        );
        assert!(matches!(
            classify_dmabuf_errno(Errno(libc::EINVAL)),
            DmabufSupport::Error(_)
        ));
        assert!(DmabufSupport::Supported.to_string().contains("EBADF"));
    }

    #[test]
    fn opening_a_missing_device_is_a_typed_error() {
        match RdmaContext::open("gdx_no_such_device") {
            Ok(_) => panic!("opened a device that does not exist"),
            Err(VerbsError::NoSuchDevice { name, .. }) => assert_eq!(name, "gdx_no_such_device"),
            Err(VerbsError::Unavailable(u)) => assert_eq!(u.library, SONAME),
            Err(e) => panic!("unexpected error: {e}"),
        }
        assert!(matches!(
            dmabuf_kernel_support("gdx_no_such_device"),
            DmabufSupport::Error(_)
        ));
    }
}
