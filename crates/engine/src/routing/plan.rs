//! The planner: which path each op takes, and why.
//!
//! The choice is made in two steps. At connect time the peer gets one transport ([`PeerRoute`]):
//! shm when both agents offer it, run on the same kernel (same host id) and the shm socket connects;
//! tcp otherwise, with the reason. At submit time each op gets a [`Plan`]: on shm, `Shm` (one copy
//! into/out of the peer's mapped region) when the remote region is agent-allocated, `ShmStaged` (two
//! copies through a bounce buffer) when it is a borrowed buffer. Nothing falls back silently: the
//! plan is fixed before the op starts and an op that cannot run on its path fails.

use serde::Serialize;

pub use super::path::{Path, Plan};
use crate::error::{Error, Result};
use crate::region::{Location, RegionDesc, RegionInner};

/// The transport a peer connection uses, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PeerRoute {
    /// `Path::Shm` for a shm peer (ops then plan to `Shm` or `ShmStaged`), `Path::Tcp` otherwise.
    pub transport: Path,
    /// Why this transport.
    pub reason: String,
}

/// What a fabric route can do with GPU memory: the provider's name, and whether gdx registers
/// GPU memory with it through FI_HMEM (the provider offers FI_HMEM and gdx's registration of
/// CUDA memory applies). Unused on other routes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FabricMem {
    /// The provider (`tcp;ofi_rxm`, `efa`).
    pub(crate) provider: String,
    /// The provider offers FI_HMEM (fi_getinfo with FI_HMEM asked for matched it).
    pub(crate) offers_hmem: bool,
    /// gdx registers CUDA memory with this provider (`fi_mr_regattr`, FI_HMEM_CUDA).
    pub(crate) registers_cuda: bool,
}

/// Whether this end may copy straight into and out of the peer's memory (the `cma` path),
/// learnt once per shm connection by reading a probe value the peer placed in its memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CmaGrant {
    /// The kernel let this process read the peer's probe (pid `pid`, as the shm socket's
    /// credentials name it).
    Granted {
        /// The peer's process id in this PID namespace.
        pid: u32,
    },
    /// Why not, in words naming the refusal (the errno and the policy behind it, or the peer's
    /// answer); staged ops carry it in their reason.
    Refused(std::sync::Arc<str>),
}

impl Default for CmaGrant {
    fn default() -> Self {
        CmaGrant::Refused("not an shm route".into())
    }
}

/// What this end can do beyond what the route is: the shm route's one-copy paths.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Here<'a> {
    /// This process can map a peer's GPU memory for a host region
    /// ([`crate::Agent::use_cuda`]).
    pub(crate) cuda: bool,
    /// Whether the kernel lets this process copy to and from the peer's memory.
    pub(crate) cma: &'a CmaGrant,
}

/// Plans one op on a fabric route. Host memory on both ends: `Fabric`. A GPU end the provider
/// registers through FI_HMEM: `Fabric`, the NIC reading/writing the GPU. Otherwise this end's
/// GPU memory is staged through a host bounce buffer (`FabricStaged`), and strict mode refuses
/// that fallback; the peer's GPU memory cannot be staged (one-sided RMA gives the target no
/// step in which to copy between a bounce buffer and its GPU), so that op is refused, strict
/// or not, naming the route that can stage it.
fn plan_fabric(
    route: &PeerRoute,
    fabric: &FabricMem,
    local_gpu: Option<u32>,
    remote_gpu: Option<u32>,
    ends: &str,
    strict: bool,
) -> Result<Plan> {
    let r = &route.reason;
    if ends.is_empty() {
        return Ok(Plan {
            path: Path::Fabric,
            reason: format!("{r}; one-sided RMA between host memory").into(),
        });
    }
    let p = &fabric.provider;
    if fabric.offers_hmem && fabric.registers_cuda {
        return Ok(Plan {
            path: Path::Fabric,
            reason: format!(
                "{r}; {ends} registered with provider {p} through FI_HMEM (fi_mr_regattr, \
                 FI_HMEM_CUDA), the provider reads/writes GPU memory directly (an op whose GPU \
                 memory the provider refuses to register fails, never staged)"
            )
            .into(),
        });
    }
    let why = if fabric.offers_hmem {
        format!("provider {p} offers FI_HMEM but gdx does not register GPU memory with it")
    } else {
        format!("provider {p} does not offer FI_HMEM")
    };
    if let Some(b) = remote_gpu {
        return Err(Error::refused(
            Path::Fabric,
            None,
            format!(
                "{r}; the peer's GPU{b} cannot be reached over fabric: {why}, and the peer's GPU \
             memory cannot be staged over one-sided RMA (the target takes no step in which to \
             copy between a bounce buffer and its GPU); connect with GDX_TRANSPORTS=tcp,shm to \
             stage it over tcp"
            ),
        ));
    }
    let staged = format!(
        "staged: {r}; {ends} copied through a registered host bounce buffer, chunk by chunk \
         (GPU-to-host copy then fi_write; fi_read then host-to-GPU copy; not pipelined) ({why})"
    );
    if strict && local_gpu.is_some() {
        return Err(Error::strict(
            Path::FabricStaged,
            format!("strict mode refuses the fabric staged fallback: {staged}"),
        ));
    }
    Ok(Plan {
        path: Path::FabricStaged,
        reason: staged.into(),
    })
}

/// Plans one op on a peer reached through `route`: `local` is the initiator's region, `remote`
/// the target's descriptor. With `strict`, a GPU-to-GPU op between two agents of one host that
/// cannot take the IPC path is refused ([`Error::Strict`]) instead of staged. `here`: what this
/// process can do on an shm route.
pub(crate) fn plan_op(
    route: &PeerRoute,
    local: &RegionInner,
    remote: &RegionDesc,
    tcp_detail: &str,
    fabric: &FabricMem,
    strict: bool,
    here: Here<'_>,
) -> Result<Plan> {
    let local_gpu = local.device().map(|d| d.region.gpu());
    let remote_gpu = match remote.location {
        Location::Gpu(n) => Some(n),
        _ => None,
    };
    let ends = match (local_gpu, remote_gpu) {
        (Some(a), Some(b)) => format!("GPU{a} here and the peer's GPU{b}"),
        (Some(a), None) => format!("GPU{a} here"),
        (None, Some(b)) => format!("the peer's GPU{b}"),
        (None, None) => String::new(),
    };
    let plan = match route.transport {
        Path::Rdma if ends.is_empty() => Plan {
            path: Path::Rdma,
            reason: format!("{}; one-sided RDMA between host memory", route.reason).into(),
        },
        Path::Rdma => Plan {
            path: Path::Gdr,
            reason: format!(
                "gdr: {}; the NIC reads/writes {ends} directly (dma-buf or nvidia-peermem \
                 registration; an op whose GPU memory cannot be registered fails, never staged)",
                route.reason.trim_start_matches("rdma: ")
            )
            .into(),
        },
        Path::Fabric => return plan_fabric(route, fabric, local_gpu, remote_gpu, &ends, strict),
        Path::Tcp if ends.is_empty() => Plan {
            path: Path::Tcp,
            reason: format!("{}; {tcp_detail}", route.reason).into(),
        },
        Path::Tcp => Plan {
            path: Path::TcpStaged,
            reason: format!(
                "{}; {ends} staged through pinned bounce buffers (device-to-host of the next \
                 chunks overlaps the send, the receiver's host-to-device overlaps the next \
                 receive); no GPU-direct transport to this peer; {tcp_detail}",
                route.reason
            )
            .into(),
        },
        _ => plan_shm(route, local_gpu, remote, remote_gpu, &ends, here),
    };
    if strict
        && local_gpu.is_some()
        && remote_gpu.is_some()
        && !matches!(plan.path, Path::Ipc | Path::Gdr)
    {
        return Err(Error::strict(plan.path, plan.reason.to_string()));
    }
    Ok(plan)
}

fn plan_shm(
    route: &PeerRoute,
    local_gpu: Option<u32>,
    remote: &RegionDesc,
    remote_gpu: Option<u32>,
    ends: &str,
    here: Here<'_>,
) -> Plan {
    let r = &route.reason;
    let cuda_here = here.cuda;
    let same_host_handle = |ipc: &crate::desc::IpcDesc| {
        if ipc.offset == 0 && ipc.mapped_len() == ipc.len {
            format!("the {} of its allocation", ipc.handle_kind())
        } else {
            format!(
                "the {} of the allocation of {} bytes holding it (region at offset {})",
                ipc.handle_kind(),
                ipc.mapped_len(),
                ipc.offset
            )
        }
    };
    let same_process = remote
        .ipc
        .as_ref()
        .is_some_and(|i| i.pid == std::process::id());
    match (local_gpu, remote_gpu) {
        (Some(_), Some(_)) if same_process => Plan {
            path: Path::ShmStaged,
            reason: format!(
                "{r}; the peer agent is in this very process, and legacy CUDA IPC cannot map a \
                 process's own allocation, so {ends} are staged through the bounce buffer"
            )
            .into(),
        },
        (Some(a), Some(b)) if let Some(ipc) = remote.ipc.as_ref() => Plan {
            path: Path::Ipc,
            reason: format!(
                "ipc: peer on the same host; its GPU{b} region reached through {}, mapped once \
                 per allocation; copied GPU{a}<->GPU{b} on the copy engines, no host copy",
                same_host_handle(ipc)
            )
            .into(),
        },
        (Some(_), Some(_)) => Plan {
            path: Path::ShmStaged,
            reason: format!(
                "{r}; the peer's GPU region has no CUDA IPC handle ({}), so {ends} are staged \
                 through the bounce buffer",
                remote.no_ipc.as_deref().unwrap_or("the peer sent none")
            )
            .into(),
        },
        (None, Some(b)) if cuda_here && let Some(ipc) = remote.ipc.as_ref() => Plan {
            path: Path::Ipc,
            reason: format!(
                "ipc: peer on the same host; its GPU{b} region reached through {}, mapped once \
                 per allocation; this host region is page-locked in place once \
                 (cuMemHostRegister) and the copy engine moves the bytes directly, one copy, \
                 no bounce buffer",
                same_host_handle(ipc)
            )
            .into(),
        },
        (None, Some(_)) => Plan {
            path: Path::ShmStaged,
            reason: format!(
                "{r}; {ends}: the target copies between the bounce buffer and its GPU ({})",
                match (&remote.ipc, &remote.no_ipc) {
                    (Some(_), _) => "this process has no CUDA to map the peer's GPU memory: \
                                     Agent::use_cuda enables the ipc path"
                        .to_string(),
                    (None, Some(why)) => format!("the peer's GPU region has no IPC handle: {why}"),
                    (None, None) => "the peer's GPU region has no IPC handle".to_string(),
                }
            )
            .into(),
        },
        (Some(_), None) if remote.shareable => Plan {
            path: Path::Shm,
            reason: format!(
                "{r}; remote region is agent-allocated (memfd), mapped once; one copy from \
                 {ends} by the driver's pageable copy"
            )
            .into(),
        },
        (Some(_), None) => Plan {
            path: Path::ShmStaged,
            reason: format!(
                "{r}; remote region is a borrowed buffer; {ends} copied through the bounce buffer"
            )
            .into(),
        },
        (None, None) if remote.shareable => Plan {
            path: Path::Shm,
            reason: format!("{r}; remote region is agent-allocated (memfd), mapped once, one copy")
                .into(),
        },
        (None, None) => match here.cma {
            CmaGrant::Granted { pid } => Plan {
                path: Path::Cma,
                reason: format!(
                    "cma: {}; remote region is a borrowed buffer, copied by the kernel straight \
                     between the two processes (process_vm_writev/readv to pid {pid}, up to {} \
                     ops per system call), one copy; a transfer of at most {} KiB in all \
                     travels inline in the control ring instead",
                    r.trim_start_matches("shm: "),
                    gdx_sys::os::CMA_MAX_IOV,
                    crate::shm_ring::INLINE_MAX >> 10
                )
                .into(),
            },
            CmaGrant::Refused(why) => Plan {
                path: Path::ShmStaged,
                reason: format!(
                    "{r}; remote region is a borrowed buffer (not shareable), two copies through \
                     the bounce buffer; no direct copy between the processes: {why}"
                )
                .into(),
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route() -> PeerRoute {
        PeerRoute {
            transport: Path::Fabric,
            reason: "fabric: peer on another host".into(),
        }
    }

    fn mem(offers_hmem: bool, registers_cuda: bool) -> FabricMem {
        FabricMem {
            provider: "tcp;ofi_rxm".into(),
            offers_hmem,
            registers_cuda,
        }
    }

    fn plan(
        m: &FabricMem,
        local: Option<u32>,
        remote: Option<u32>,
        ends: &str,
        strict: bool,
    ) -> Result<Plan> {
        plan_fabric(&route(), m, local, remote, ends, strict)
    }

    #[test]
    fn host_memory_takes_fabric() {
        let p = plan(&mem(false, false), None, None, "", true).unwrap();
        assert_eq!(p.path, Path::Fabric);
        assert!(p.reason.contains("between host memory"), "{p}");
    }

    #[test]
    fn local_gpu_without_hmem_is_staged_with_the_reason_unless_strict() {
        let p = plan(&mem(false, false), Some(0), None, "GPU0 here", false).unwrap();
        assert_eq!(p.path, Path::FabricStaged, "{p}");
        assert!(p.reason.starts_with("staged: fabric:"), "{p}");
        assert!(p.reason.contains("bounce buffer"), "{p}");
        assert!(
            p.reason
                .contains("provider tcp;ofi_rxm does not offer FI_HMEM"),
            "{p}"
        );
        match plan(&mem(false, false), Some(0), None, "GPU0 here", true) {
            Err(Error::Strict { reason: why, .. }) => {
                assert!(why.contains("refuses the fabric staged fallback"), "{why}")
            }
            other => panic!("strict let the staged fallback through: {other:?}"),
        }
    }

    #[test]
    fn hmem_without_gdx_registration_is_still_staged_and_says_so() {
        let p = plan(&mem(true, false), Some(1), None, "GPU1 here", false).unwrap();
        assert_eq!(p.path, Path::FabricStaged, "{p}");
        assert!(
            p.reason
                .contains("offers FI_HMEM but gdx does not register GPU memory with it"),
            "{p}"
        );
        assert!(matches!(
            plan(&mem(true, false), Some(1), None, "GPU1 here", true),
            Err(Error::Strict { .. })
        ));
    }

    #[test]
    fn hmem_registration_takes_fabric_for_either_end_strict_or_not() {
        for (l, r, ends) in [
            (Some(0), None, "GPU0 here"),
            (None, Some(2), "the peer's GPU2"),
            (Some(0), Some(2), "GPU0 here and the peer's GPU2"),
        ] {
            for strict in [false, true] {
                let p = plan(&mem(true, true), l, r, ends, strict).unwrap();
                assert_eq!(p.path, Path::Fabric, "{p}");
                assert!(p.reason.contains("FI_HMEM_CUDA"), "{p}");
                assert!(p.reason.contains(ends), "{p}");
            }
        }
    }

    #[test]
    fn the_peers_gpu_without_hmem_is_refused_strict_or_not() {
        for (m, strict) in [
            (mem(false, false), false),
            (mem(false, false), true),
            (mem(true, false), false),
        ] {
            for (l, ends) in [
                (None, "the peer's GPU3"),
                (Some(0), "GPU0 here and the peer's GPU3"),
            ] {
                match plan(&m, l, Some(3), ends, strict) {
                    Err(Error::Refused { reason: why, .. }) => {
                        assert!(why.contains("the peer's GPU3"), "{why}");
                        assert!(why.contains("GDX_TRANSPORTS=tcp,shm"), "{why}");
                    }
                    other => panic!("{m:?} strict {strict}: {other:?}"),
                }
            }
        }
    }
}
