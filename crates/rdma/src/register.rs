//! Registering memory with one RDMA device: [`Memory`] says what, [`VerbsRegistrar`] does it
//! (the real [`Registrar`] behind an endpoint's [`crate::cache::RegCache`]), [`Registration`]
//! records which mechanism worked.
//!
//! - Host memory: `ibv_reg_mr` ([`Mechanism::HostMr`]).
//! - GPU memory: dma-buf first (`cuMemGetHandleForAddressRange` → `ibv_reg_dmabuf_mr`,
//!   [`Mechanism::DmaBuf`]), then peermem (`ibv_reg_mr` on the device pointer,
//!   [`Mechanism::PeerMem`]). Both register the whole allocation, so later sub-ranges hit the
//!   cache. When neither works, strict mode fails with
//!   [`RdmaError::GpuDirectUnavailable`]; otherwise the registration is
//!   [`Mechanism::Staged`]: no memory region, the engine must stage through host memory, and
//!   the failed attempts say why.

use crate::cache::{MemKind, MemRange, RegRequest, Registrar};
use crate::conn::RemoteRegion;
use crate::error::RdmaError;
use gdx_sys::cuda::DeviceBuffer;
use gdx_sys::verbs::{Access, MemoryRegion, RdmaContext};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::os::fd::AsFd;
use std::sync::Arc;

/// How a region was registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mechanism {
    /// Host memory, `ibv_reg_mr`.
    HostMr,
    /// GPU memory exported as a dma-buf, `ibv_reg_dmabuf_mr`.
    DmaBuf,
    /// GPU memory through nvidia-peermem, `ibv_reg_mr` on the device pointer.
    #[serde(rename = "peermem")]
    PeerMem,
    /// Not registered: GPU memory that only a staged path (through host memory) can serve.
    Staged,
}

impl fmt::Display for Mechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mechanism::HostMr => "host ibv_reg_mr",
            Mechanism::DmaBuf => "dma-buf",
            Mechanism::PeerMem => "peermem",
            Mechanism::Staged => "staged (no GPUDirect RDMA registration)",
        })
    }
}

#[derive(Debug, Clone)]
enum Inner {
    Host {
        addr: u64,
        len: u64,
    },
    Gpu {
        buffer: Arc<DeviceBuffer>,
        offset: u64,
        len: u64,
    },
}

/// Memory to register.
#[derive(Debug, Clone)]
pub struct Memory {
    inner: Inner,
}

impl Memory {
    /// `len` bytes of host memory at `ptr`.
    ///
    /// # Safety
    ///
    /// - `ptr..ptr + len` is mapped memory of this process that stays mapped for as long as
    ///   any registration made from this value (and any cache entry holding it) lives, i.e.
    ///   until the caller has invalidated the range in the cache
    ///   ([`crate::RdmaEndpoint::invalidate`]) and dropped every handle to it.
    /// - While registered, the NIC may read or write it whenever a posted work request or a
    ///   peer holding the rkey says so: the caller must not rely on its contents then.
    pub unsafe fn host(ptr: *mut u8, len: usize) -> Memory {
        Memory {
            inner: Inner::Host {
                addr: ptr as u64,
                len: len as u64,
            },
        }
    }

    /// All of a GPU buffer. The registration holds the buffer, so the memory outlives it.
    pub fn gpu(buffer: Arc<DeviceBuffer>) -> Memory {
        let len = buffer.len() as u64;
        Memory {
            inner: Inner::Gpu {
                buffer,
                offset: 0,
                len,
            },
        }
    }

    /// `len` bytes at `offset` of a GPU buffer (the whole buffer is registered).
    pub fn gpu_range(
        buffer: Arc<DeviceBuffer>,
        offset: u64,
        len: u64,
    ) -> Result<Memory, RdmaError> {
        let size = buffer.len() as u64;
        if offset.checked_add(len).is_none_or(|e| e > size) || len == 0 {
            return Err(RdmaError::OutOfBounds {
                what: "GPU buffer".into(),
                offset,
                len,
                size,
            });
        }
        Ok(Memory {
            inner: Inner::Gpu {
                buffer,
                offset,
                len,
            },
        })
    }

    /// GPU ordinal for GPU memory.
    pub fn gpu_ordinal(&self) -> Option<u32> {
        match &self.inner {
            Inner::Gpu { buffer, .. } => Some(buffer.context().ordinal()),
            Inner::Host { .. } => None,
        }
    }
}

impl RegRequest for Memory {
    fn range(&self) -> MemRange {
        match &self.inner {
            Inner::Host { addr, len } => MemRange {
                kind: MemKind::Host,
                addr: *addr,
                len: *len,
            },
            Inner::Gpu {
                buffer,
                offset,
                len,
            } => MemRange {
                kind: MemKind::Gpu(buffer.context().ordinal()),
                addr: buffer.as_raw().saturating_add(*offset),
                len: *len,
            },
        }
    }
}

/// One mechanism that was tried and failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Attempt {
    /// The mechanism.
    pub mechanism: Mechanism,
    /// Why it failed.
    pub error: String,
}

/// Memory registered with one device (or, for [`Mechanism::Staged`], found unregistrable).
pub struct Registration {
    // Field order is drop order: the MR is deregistered before the GPU buffer may be freed.
    mr: Option<MemoryRegion>,
    _gpu: Option<Arc<DeviceBuffer>>,
    mechanism: Mechanism,
    range: MemRange,
    device: String,
    attempts: Vec<Attempt>,
}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration")
            .field("device", &self.device)
            .field("mechanism", &self.mechanism)
            .field("range", &self.range)
            .field("lkey", &self.lkey())
            .field("rkey", &self.rkey())
            .field("attempts", &self.attempts)
            .finish()
    }
}

impl Registration {
    /// How it was registered.
    pub fn mechanism(&self) -> Mechanism {
        self.mechanism
    }
    /// The range covered (the whole GPU allocation for GPU memory).
    pub fn range(&self) -> MemRange {
        self.range
    }
    /// RDMA device.
    pub fn device(&self) -> &str {
        &self.device
    }
    /// Mechanisms tried before the one that worked (or all of them, for staged).
    pub fn attempts(&self) -> &[Attempt] {
        &self.attempts
    }
    /// The memory region; `None` when staged.
    pub fn memory_region(&self) -> Option<&MemoryRegion> {
        self.mr.as_ref()
    }
    /// Local key; `None` when staged.
    pub fn lkey(&self) -> Option<u32> {
        self.mr.as_ref().map(MemoryRegion::lkey)
    }
    /// Remote key; `None` when staged.
    pub fn rkey(&self) -> Option<u32> {
        self.mr.as_ref().map(MemoryRegion::rkey)
    }
    /// Whether the NIC reaches the memory directly.
    pub fn is_direct(&self) -> bool {
        self.mr.is_some()
    }
    /// What a peer needs to target this registration, under the caller's `id`.
    pub fn remote_region(&self, id: u64) -> Option<RemoteRegion> {
        let mr = self.mr.as_ref()?;
        Some(RemoteRegion {
            id,
            addr: mr.addr(),
            len: mr.len() as u64,
            rkey: mr.rkey(),
        })
    }
}

/// What a [`VerbsRegistrar`] tries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegPolicy {
    /// Fail (rather than return a staged registration) when GPU memory cannot be registered.
    pub strict: bool,
    /// Try dma-buf for GPU memory.
    pub dmabuf: bool,
    /// Try peermem for GPU memory.
    pub peermem: bool,
    /// Access rights of every registration.
    pub access: Access,
}

impl Default for RegPolicy {
    fn default() -> Self {
        RegPolicy {
            strict: false,
            dmabuf: true,
            peermem: true,
            access: Access::ALL,
        }
    }
}

/// Registers [`Memory`] with one device.
#[derive(Debug, Clone)]
pub struct VerbsRegistrar {
    ctx: RdmaContext,
    policy: RegPolicy,
}

impl VerbsRegistrar {
    /// A registrar on `ctx` with `policy`.
    pub fn new(ctx: RdmaContext, policy: RegPolicy) -> VerbsRegistrar {
        VerbsRegistrar { ctx, policy }
    }

    /// The policy.
    pub fn policy(&self) -> RegPolicy {
        self.policy
    }

    fn gpu(&self, buffer: &Arc<DeviceBuffer>) -> Result<Registration, RdmaError> {
        let ordinal = buffer.context().ordinal();
        let whole = MemRange {
            kind: MemKind::Gpu(ordinal),
            addr: buffer.as_raw(),
            len: buffer.len() as u64,
        };
        let mut attempts = Vec::new();
        let done = |mr: MemoryRegion, mechanism, attempts| Registration {
            mr: Some(mr),
            _gpu: Some(Arc::clone(buffer)),
            mechanism,
            range: whole,
            device: self.ctx.name().to_string(),
            attempts,
        };
        if self.policy.dmabuf {
            match buffer.dma_buf() {
                Ok(d) => {
                    // SAFETY: `d` exports all of `buffer`, which the registration keeps alive
                    // (it holds the Arc) and drops after the MR (field order); the iova is the
                    // device address, so work requests use device addresses as with peermem.
                    let r = unsafe {
                        self.ctx.register_dmabuf(
                            d.fd().as_fd(),
                            0,
                            d.len(),
                            buffer.as_raw(),
                            self.policy.access,
                        )
                    };
                    match r {
                        Ok(mr) => return Ok(done(mr, Mechanism::DmaBuf, attempts)),
                        Err(e) => attempts.push(Attempt {
                            mechanism: Mechanism::DmaBuf,
                            error: e.to_string(),
                        }),
                    }
                }
                Err(e) => attempts.push(Attempt {
                    mechanism: Mechanism::DmaBuf,
                    error: format!("dma-buf export: {e}"),
                }),
            }
        }
        if self.policy.peermem {
            // SAFETY: the range is all of `buffer`, which the registration keeps alive and
            // drops after the MR; the host never dereferences the device address.
            let r = unsafe {
                self.ctx
                    .register_device_address(buffer.as_raw(), buffer.len(), self.policy.access)
            };
            match r {
                Ok(mr) => return Ok(done(mr, Mechanism::PeerMem, attempts)),
                Err(e) => attempts.push(Attempt {
                    mechanism: Mechanism::PeerMem,
                    error: e.to_string(),
                }),
            }
        }
        if attempts.is_empty() {
            attempts.push(Attempt {
                mechanism: Mechanism::Staged,
                error: "dma-buf and peermem are both disabled by the policy".into(),
            });
        }
        refuse_if_strict(
            self.policy.strict,
            ordinal,
            self.ctx.name(),
            whole.len,
            &attempts,
        )?;
        log::warn!(
            "{} bytes of GPU {ordinal} memory cannot be registered with {}; it will be staged: {:?}",
            whole.len,
            self.ctx.name(),
            attempts
        );
        Ok(Registration {
            mr: None,
            _gpu: Some(Arc::clone(buffer)),
            mechanism: Mechanism::Staged,
            range: whole,
            device: self.ctx.name().to_string(),
            attempts,
        })
    }
}

/// Strict mode's verdict on GPU memory that no mechanism registered.
fn refuse_if_strict(
    strict: bool,
    gpu: u32,
    device: &str,
    len: u64,
    attempts: &[Attempt],
) -> Result<(), RdmaError> {
    if !strict {
        return Ok(());
    }
    Err(RdmaError::GpuDirectUnavailable {
        gpu,
        device: device.to_string(),
        len,
        attempts: attempts
            .iter()
            .map(|a| format!("{}: {}", a.mechanism, a.error))
            .collect(),
    })
}

impl Registrar for VerbsRegistrar {
    type Request = Memory;
    type Handle = Registration;
    type Error = RdmaError;

    fn register(&self, req: &Memory) -> Result<(Registration, MemRange), RdmaError> {
        let reg = match &req.inner {
            Inner::Host { addr, len } => {
                let len = usize::try_from(*len).map_err(|_| {
                    RdmaError::InvalidArgument(format!("{len} bytes do not fit usize"))
                })?;
                // SAFETY: `Memory::host`'s contract: the range stays mapped while any
                // registration made from it lives.
                let mr = unsafe {
                    self.ctx
                        .register_host(*addr as *mut u8, len, self.policy.access)
                }?;
                Registration {
                    mr: Some(mr),
                    _gpu: None,
                    mechanism: Mechanism::HostMr,
                    range: req.range(),
                    device: self.ctx.name().to_string(),
                    attempts: Vec::new(),
                }
            }
            Inner::Gpu { buffer, .. } => self.gpu(buffer)?,
        };
        let range = reg.range;
        Ok((reg, range))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_mode_refuses_what_only_staging_could_serve_and_says_why() {
        let attempts = vec![
            Attempt {
                mechanism: Mechanism::DmaBuf,
                error: "ibv_reg_dmabuf_mr on mlx5_0 is not supported: EOPNOTSUPP".into(),
            },
            Attempt {
                mechanism: Mechanism::PeerMem,
                error: "ibv_reg_mr on mlx5_0 failed: Bad address (EFAULT)".into(),
            },
        ];
        assert!(refuse_if_strict(false, 0, "mlx5_0", 1 << 20, &attempts).is_ok());
        let e = refuse_if_strict(true, 1, "mlx5_0", 1 << 20, &attempts).unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, RdmaError::GpuDirectUnavailable { gpu: 1, .. }));
        assert!(
            text.starts_with("strict mode: 1048576 bytes of GPU 1 memory"),
            "{text}"
        );
        assert!(
            text.contains("dma-buf: ibv_reg_dmabuf_mr") && text.contains("peermem: ibv_reg_mr"),
            "{text}"
        );
        assert!(text.contains("only a staged path"), "{text}");
    }

    #[test]
    fn mechanisms_print_and_serialise() {
        assert_eq!(Mechanism::DmaBuf.to_string(), "dma-buf");
        assert_eq!(
            serde_json::to_string(&Mechanism::PeerMem).unwrap(),
            "\"peermem\""
        );
        assert_eq!(RegPolicy::default().access, Access::ALL);
        assert!(!RegPolicy::default().strict);
    }
}
