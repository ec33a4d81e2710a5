//! The live implementation of [`LiveFacts`], over `gdx-sys`: what the CLI passes when `--root`
//! is `/`. Each method loads its library through gdx-sys's cached loader; nothing here panics
//! when a library is missing.
//!
//! [`SystemProbe`] is the probe backend over the probe measurements
//! ([`crate::measure::timed_copy`], [`crate::measure::mailbox_round_trips`]) and
//! `gdx_sys::verbs::register_gpu_memory`.
//!
//! Not yet covered by gdx-sys, so reported as `None`/unknown (checks then rely on sysfs):
//! NVML's write/NVLink P2P status, NVLinks that are down, per-link speed and fabric state;
//! libibverbs' `ibv_reg_dmabuf_mr` symbol and NCCL's dma-buf probe; `cuFileDriverOpen`.

use crate::facts::{
    CudaDevice, CudaFacts, CufileFacts, DmabufProbe, LiveFacts, NvmlDevice, NvmlFacts, NvmlP2p,
    Unavailable, UnavailableKind, VerbsDevice, VerbsFacts, VerbsPort,
};
use crate::probe::{CopySamples, Loc, ProbeBackend, RegMethod};
use crate::DoctorError;

/// The active probes on this machine through `gdx-sys`: event-timed, pattern-verified copies
/// (`cuMemAlloc` and pinned memory, never pool memory) and GPU memory registration with
/// verbs by dma-buf and by peermem.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemProbe;

impl ProbeBackend for SystemProbe {
    fn copy(&self, from: Loc, to: Loc, bytes: u64, reps: u32) -> Result<CopySamples, DoctorError> {
        use crate::measure::timed_copy;
        let cuda = gdx_sys::cuda::Cuda::load()?;
        let len = usize::try_from(bytes).map_err(|_| DoctorError::TooLarge(bytes))?;
        let t = timed_copy(&cuda, from, to, len, reps)?;
        Ok(CopySamples {
            bytes: t.bytes as u64,
            samples: t.samples,
            verified: t.mismatch.is_none(),
            mismatch: t.mismatch.map(|m| m.to_string()),
        })
    }

    fn can_mailbox(&self) -> bool {
        true
    }

    fn mailbox(&self, gpu: u32, reps: u32) -> Result<Vec<std::time::Duration>, DoctorError> {
        let cuda = gdx_sys::cuda::Cuda::load()?;
        let t = crate::measure::mailbox_round_trips(&cuda, gpu, reps)?;
        match t.mismatch {
            Some((round, wrote, read)) => Err(DoctorError::MailboxMismatch { round, wrote, read }),
            None => Ok(t.samples),
        }
    }

    fn register(
        &self,
        gpu: u32,
        rdma_device: &str,
        method: RegMethod,
        bytes: u64,
    ) -> Result<(), DoctorError> {
        use gdx_sys::cuda::{Context, Cuda, DeviceBuffer};
        use gdx_sys::verbs::{register_gpu_memory, RegMethod as SysMethod};
        let cuda = Cuda::load()?;
        let dev = cuda.device(gpu)?;
        let ctx = Context::new(&dev)?;
        let len = usize::try_from(bytes).map_err(|_| DoctorError::TooLarge(bytes))?;
        let buf = DeviceBuffer::new(&ctx, len)?;
        let m = match method {
            RegMethod::DmaBuf => SysMethod::DmaBuf,
            RegMethod::PeerMem => SysMethod::PeerMem,
        };
        // Registered and, on drop, deregistered: success is all the probe needs to know.
        register_gpu_memory(rdma_device, m, &buf)
            .map(drop)
            .map_err(DoctorError::from)
    }
}

/// Live facts from this machine's libraries through `gdx-sys`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemFacts;

/// gdx-sys does not say whether a library is absent or failed; its loader's "not found" /
/// "tried N candidate(s)" wording marks the absent case.
fn convert(u: gdx_sys::Unavailable) -> Unavailable {
    let missing = u.reason.contains("not found") || u.reason.contains("tried");
    Unavailable {
        library: u.library,
        kind: if missing {
            UnavailableKind::Missing
        } else {
            UnavailableKind::Failed
        },
        reason: u.reason,
    }
}

impl LiveFacts for SystemFacts {
    fn cuda(&self) -> Result<CudaFacts, Unavailable> {
        use gdx_sys::cuda::{Attribute, Cuda, SONAME};
        let cuda = Cuda::load().map_err(convert)?;
        let devices = cuda
            .devices()
            .map_err(|e| Unavailable::failed(SONAME, e.to_string()))?;
        let n = devices.len() as u32;
        let out = devices
            .iter()
            .map(|d| {
                let o = d.ordinal();
                let flag = |a| d.attribute(a).ok().map(|v| v != 0);
                CudaDevice {
                    ordinal: o,
                    name: d.name().ok(),
                    bdf: d.pci_bus_id().ok().and_then(|b| b.parse().ok()),
                    gdr_supported: flag(Attribute::GpuDirectRdmaSupported),
                    gdr_with_vmm_supported: flag(Attribute::GpuDirectRdmaWithCudaVmmSupported),
                    dmabuf_supported: flag(Attribute::DmaBufSupported),
                    can_access_peer: (0..n)
                        .filter(|&p| p != o)
                        .filter_map(|p| Some((p, cuda.can_access_peer(o, p).ok()?)))
                        .collect(),
                    stream_mem_ops: d.stream_mem_ops().ok().map(|s| {
                        crate::facts::StreamMemOpsFacts {
                            ops_64bit: s.ops_64bit,
                            wait_nor: s.wait_nor,
                            flush_remote_writes: s.flush_remote_writes,
                            map_host_memory: s.map_host_memory,
                            symbols: s.symbols,
                        }
                    }),
                }
            })
            .collect();
        Ok(CudaFacts {
            driver_version: cuda.driver_version().ok().map(|v| v.0),
            library_path: Some(cuda.path().to_string()),
            devices: out,
        })
    }

    fn nvml(&self) -> Result<NvmlFacts, Unavailable> {
        let snap = gdx_sys::nvml::snapshot().map_err(convert)?;
        Ok(NvmlFacts {
            driver_version: snap.driver_version,
            devices: snap
                .gpus
                .into_iter()
                .map(|g| NvmlDevice {
                    index: g.index,
                    bdf: g.bdf.parse().ok(),
                    name: g.name,
                    bar1_bytes: g.bar1_bytes,
                    memory_bytes: g.memory_bytes,
                    p2p: g
                        .p2p_read
                        .into_iter()
                        .filter_map(|(b, s)| {
                            Some(NvmlP2p {
                                peer: b.parse().ok()?,
                                read: Some(s),
                                write: None,
                                nvlink: None,
                            })
                        })
                        .collect(),
                    nvlinks_active: g.nvlinks.len() as u32,
                    nvlinks_down: Vec::new(),
                    nvlink_gbps_per_link: None,
                    fabric: None,
                })
                .collect(),
        })
    }

    fn verbs(&self) -> Result<VerbsFacts, Unavailable> {
        let devs = gdx_sys::verbs::devices().map_err(convert)?;
        // NCCL's kernel-side dma-buf probe (fd -1: EBADF means supported), on the first device.
        let dmabuf_probe = devs.first().map(|d| {
            use gdx_sys::verbs::DmabufSupport as S;
            match gdx_sys::verbs::dmabuf_kernel_support(&d.name) {
                S::Supported => DmabufProbe::Supported,
                S::NotSupported(errno) => DmabufProbe::NotSupported(errno.to_string()),
                S::LibraryTooOld => DmabufProbe::NotSupported(
                    "libibverbs has no ibv_reg_dmabuf_mr (rdma-core older than v34)".into(),
                ),
                S::Error(e) => DmabufProbe::Error(e),
            }
        });
        let has_reg_dmabuf_mr = gdx_sys::verbs::probe()
            .ok()
            .map(|lib| lib.has_reg_dmabuf_mr);
        Ok(VerbsFacts {
            devices: devs
                .into_iter()
                .map(|d| VerbsDevice {
                    name: d.name,
                    ports: d
                        .ports
                        .into_iter()
                        .map(|p| VerbsPort {
                            port: u32::from(p.number),
                            active_mtu: p.active_mtu_bytes,
                            max_mtu: p.max_mtu_bytes,
                        })
                        .collect(),
                })
                .collect(),
            has_reg_dmabuf_mr,
            dmabuf_probe,
        })
    }

    fn nvml_snapshot(&self) -> Option<gdx_topo::enrich::NvmlSnapshot> {
        gdx_topo::enrich::live_snapshot().ok()
    }

    fn cufile(&self) -> Result<CufileFacts, Unavailable> {
        let info = gdx_sys::cufile::probe().map_err(convert)?;
        Ok(CufileFacts {
            version: info.version.map(|v| v.to_string()),
            driver_open: None,
            nvfs_version: None,
            compat_mode: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_panics_and_classifies_absence() {
        // On a machine without the libraries every call returns Unavailable; with them, facts.
        let f = SystemFacts;
        let _ = f.cuda();
        let _ = f.nvml();
        let _ = f.verbs();
        let _ = f.cufile();
        let u = convert(gdx_sys::Unavailable::new(
            "libx.so.1",
            "tried 1 candidate(s); not found: libx.so.1",
        ));
        assert_eq!(u.kind, UnavailableKind::Missing);
        let u = convert(gdx_sys::Unavailable::new(
            "libcuda.so.1",
            "cuInit(0) failed: CUDA_ERROR_NO_DEVICE",
        ));
        assert_eq!(u.kind, UnavailableKind::Failed);
    }
}
