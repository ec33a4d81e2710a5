//! [`snapshot`]: what NVML says about every GPU, as plain data for `gdx-topo`.
//!
//! Per GPU: index, name, UUID, PCI bus id, BAR1 and memory size, compute capability, active
//! NVLinks with their far end, and the P2P read status to every other GPU in the legend of
//! `nvidia-smi topo -p2p r`. A query that fails for one GPU or link leaves that field empty
//! (logged at debug level); a GPU whose PCI bus id cannot be read is left out.

use super::{Nvml, NvmlError};
use crate::Unavailable;
use nvml_wrapper::enum_wrappers::device::{P2pCapabilitiesIndex, P2pStatus};
use nvml_wrapper::Device;
use nvml_wrapper_sys::bindings::{
    nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU as NVLINK_GPU,
    nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_IBMNPU as NVLINK_IBMNPU,
    nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH as NVLINK_SWITCH,
    nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_UNKNOWN as NVLINK_UNKNOWN,
    nvmlReturn_enum_NVML_SUCCESS as NVML_SUCCESS, NVML_NVLINK_MAX_LINKS,
};

/// What is at the far end of an NVLink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Remote {
    /// A GPU, by PCI bus id text.
    Gpu(String),
    /// An NVSwitch.
    Switch,
    /// A CPU (NVML's "IBM NPU" device type).
    Cpu,
}

/// One active NVLink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// Link number.
    pub link: u32,
    /// Far end.
    pub remote: Remote,
}

/// One GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Gpu {
    /// NVML index.
    pub index: u32,
    /// Product name.
    pub name: Option<String>,
    /// UUID.
    pub uuid: Option<String>,
    /// PCI bus id text as NVML gives it, e.g. `00000000:06:00.0`.
    pub bdf: String,
    /// BAR1 total bytes.
    pub bar1_bytes: Option<u64>,
    /// Memory total bytes.
    pub memory_bytes: Option<u64>,
    /// "major.minor".
    pub compute_capability: Option<String>,
    /// Active NVLinks.
    pub nvlinks: Vec<Link>,
    /// (peer bus id, P2P read status text): `OK`, `CNS` (chipset not supported), `GNS` (GPU
    /// not supported), `TNS` (topology not supported), `DI` (disabled by regkey), `NS` (not
    /// supported) or `U` (unknown, also when the query failed).
    pub p2p_read: Vec<(String, String)>,
}

/// All GPUs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Driver version.
    pub driver_version: Option<String>,
    /// CUDA driver version number.
    pub cuda_driver_version: Option<i32>,
    /// GPUs in NVML order.
    pub gpus: Vec<Gpu>,
}

/// Query NVML through the process-wide handle ([`Nvml::load`]).
pub fn snapshot() -> Result<Snapshot, Unavailable> {
    Nvml::load()?.snapshot()
}

/// `Some` of an NVML result, logging the error at debug level.
fn ok<T>(r: Result<T, nvml_wrapper::error::NvmlError>, call: &'static str, gpu: u32) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            log::debug!("{}", NvmlError::new(call, Some(gpu), e));
            None
        }
    }
}

impl Nvml {
    /// Query every GPU. Fails only when NVML cannot count its devices.
    pub fn snapshot(&self) -> Result<Snapshot, Unavailable> {
        let nvml = self.wrapper();
        let count = self
            .device_count()
            .map_err(|e| Unavailable::new(super::SONAME, e.to_string()))?;
        let mut devices: Vec<(u32, Device<'_>, String)> = Vec::new();
        for i in 0..count {
            let Some(dev) = ok(nvml.device_by_index(i), "nvmlDeviceGetHandleByIndex_v2", i) else {
                continue;
            };
            let Some(pci) = ok(dev.pci_info(), "nvmlDeviceGetPciInfo_v3", i) else {
                continue;
            };
            devices.push((i, dev, pci.bus_id));
        }
        let gpu_bdfs: Vec<String> = devices.iter().map(|(_, _, b)| b.clone()).collect();
        let gpus = devices
            .iter()
            .map(|(i, dev, bdf)| Gpu {
                index: *i,
                name: ok(dev.name(), "nvmlDeviceGetName", *i),
                uuid: ok(dev.uuid(), "nvmlDeviceGetUUID", *i),
                bdf: bdf.clone(),
                bar1_bytes: ok(dev.bar1_memory_info(), "nvmlDeviceGetBAR1MemoryInfo", *i)
                    .map(|m| m.total),
                memory_bytes: ok(dev.memory_info(), "nvmlDeviceGetMemoryInfo_v2", *i)
                    .map(|m| m.total),
                compute_capability: ok(
                    dev.cuda_compute_capability(),
                    "nvmlDeviceGetCudaComputeCapability",
                    *i,
                )
                .map(|c| format!("{}.{}", c.major, c.minor)),
                nvlinks: nvlinks(nvml, dev, *i, &gpu_bdfs),
                p2p_read: devices
                    .iter()
                    .filter(|(j, _, _)| j != i)
                    .map(|(j, peer, peer_bdf)| {
                        let status = ok(
                            dev.p2p_status(peer, P2pCapabilitiesIndex::Read),
                            "nvmlDeviceGetP2PStatus",
                            *i,
                        );
                        if status.is_none() {
                            log::debug!("P2P read status GPU {i} -> GPU {j} unknown");
                        }
                        (peer_bdf.clone(), p2p_text(status).to_string())
                    })
                    .collect(),
            })
            .collect();
        Ok(Snapshot {
            driver_version: self.driver_version().ok(),
            cuda_driver_version: self.cuda_driver_version().ok(),
            gpus,
        })
    }
}

/// The active NVLinks of `dev`; links whose state or far end cannot be read are skipped.
fn nvlinks(
    nvml: &nvml_wrapper::Nvml,
    dev: &Device<'_>,
    gpu: u32,
    gpu_bdfs: &[String],
) -> Vec<Link> {
    let mut links = Vec::new();
    for link in 0..NVML_NVLINK_MAX_LINKS {
        let l = dev.link_wrapper_for(link);
        match l.is_active() {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                log::debug!(
                    "{}",
                    NvmlError::new("nvmlDeviceGetNvLinkState", Some(gpu), e)
                );
                continue;
            }
        }
        let remote_bdf = ok(
            l.remote_pci_info(),
            "nvmlDeviceGetNvLinkRemotePciInfo_v2",
            gpu,
        )
        .map(|p| p.bus_id);
        let kind = remote_device_type(nvml, dev, link);
        if let Some(remote) = classify_remote(kind, remote_bdf, gpu_bdfs) {
            links.push(Link { link, remote });
        } else {
            log::debug!("GPU {gpu} NVLink {link}: far end unknown, skipped");
        }
    }
    links
}

/// `nvmlDeviceGetNvLinkRemoteDeviceType`, called directly: nvml-wrapper 0.13's
/// `remote_device_type` writes the answer into a temporary and always returns `Unknown`.
fn remote_device_type(nvml: &nvml_wrapper::Nvml, dev: &Device<'_>, link: u32) -> Option<u32> {
    let f = nvml
        .lib()
        .nvmlDeviceGetNvLinkRemoteDeviceType
        .as_ref()
        .ok()?;
    let mut kind: u32 = NVLINK_UNKNOWN;
    // SAFETY: the handle belongs to this initialised NVML and stays valid while `dev` lives;
    // `kind` is a valid out-pointer for the C enum (an unsigned int).
    let rc = unsafe { f(dev.handle(), link, &mut kind) };
    (rc == NVML_SUCCESS).then_some(kind)
}

/// The far end from NVML's device type and the remote PCI bus id. Without a usable type, a
/// bus id that is one of the GPUs means a GPU, any other bus id an NVSwitch (the only other
/// NVLink endpoint on x86 and Arm servers); without either, `None`. On an HGX H200 in a VM,
/// NVML reports type SWITCH with remote bus id `FFFFFFFF:FF:FF.0` for all 18 links (the
/// switches are not visible to the guest): GPU-to-GPU "NV18" there goes through NVSwitch.
fn classify_remote(
    kind: Option<u32>,
    remote_bdf: Option<String>,
    gpu_bdfs: &[String],
) -> Option<Remote> {
    match kind {
        Some(NVLINK_GPU) => remote_bdf.map(Remote::Gpu),
        Some(NVLINK_SWITCH) => Some(Remote::Switch),
        Some(NVLINK_IBMNPU) => Some(Remote::Cpu),
        _ => {
            let bdf = remote_bdf?;
            if gpu_bdfs.iter().any(|g| g.eq_ignore_ascii_case(&bdf)) {
                Some(Remote::Gpu(bdf))
            } else {
                Some(Remote::Switch)
            }
        }
    }
}

/// The `nvidia-smi topo -p2p` legend text for a status; `U` when the query failed.
fn p2p_text(status: Option<P2pStatus>) -> &'static str {
    match status {
        Some(P2pStatus::Ok) => "OK",
        Some(P2pStatus::ChipsetNotSupported) => "CNS",
        Some(P2pStatus::GpuNotSupported) => "GNS",
        Some(P2pStatus::IohTopologyNotSupported) => "TNS",
        Some(P2pStatus::DisabledByRegkey) => "DI",
        Some(P2pStatus::NotSupported) => "NS",
        Some(P2pStatus::Unknown) | None => "U",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p2p_status_uses_the_nvidia_smi_legend() {
        assert_eq!(p2p_text(Some(P2pStatus::Ok)), "OK");
        assert_eq!(p2p_text(Some(P2pStatus::ChipsetNotSupported)), "CNS");
        assert_eq!(p2p_text(Some(P2pStatus::GpuNotSupported)), "GNS");
        assert_eq!(p2p_text(Some(P2pStatus::IohTopologyNotSupported)), "TNS");
        assert_eq!(p2p_text(Some(P2pStatus::DisabledByRegkey)), "DI");
        assert_eq!(p2p_text(Some(P2pStatus::NotSupported)), "NS");
        assert_eq!(p2p_text(Some(P2pStatus::Unknown)), "U");
        assert_eq!(p2p_text(None), "U");
    }

    #[test]
    fn remote_kind_decides_the_far_end() {
        let gpus = ["00000000:07:00.0".to_string()];
        let bdf = || Some("00000000:07:00.0".to_string());
        assert_eq!(
            classify_remote(Some(NVLINK_GPU), bdf(), &gpus),
            Some(Remote::Gpu("00000000:07:00.0".into()))
        );
        assert_eq!(classify_remote(Some(NVLINK_GPU), None, &gpus), None);
        assert_eq!(
            classify_remote(Some(NVLINK_SWITCH), None, &gpus),
            Some(Remote::Switch)
        );
        assert_eq!(
            classify_remote(Some(NVLINK_IBMNPU), bdf(), &gpus),
            Some(Remote::Cpu)
        );
        // No usable type: fall back on whether the bus id is a GPU's.
        assert_eq!(
            classify_remote(Some(NVLINK_UNKNOWN), bdf(), &gpus),
            Some(Remote::Gpu("00000000:07:00.0".into()))
        );
        assert_eq!(
            classify_remote(None, Some("00000000:99:00.0".into()), &gpus),
            Some(Remote::Switch)
        );
        assert_eq!(classify_remote(None, None, &gpus), None);
        // What the H200 test machine reports: type SWITCH, switch not visible on PCI.
        assert_eq!(
            classify_remote(Some(NVLINK_SWITCH), Some("FFFFFFFF:FF:FF.0".into()), &gpus),
            Some(Remote::Switch)
        );
    }

    #[test]
    fn snapshot_is_ok_or_unavailable_naming_nvml() {
        match snapshot() {
            Ok(s) => {
                for g in &s.gpus {
                    assert!(!g.bdf.is_empty());
                    assert_eq!(g.p2p_read.len(), s.gpus.len() - 1);
                }
            }
            Err(e) => assert_eq!(e.library, "libnvidia-ml.so.1"),
        }
    }

    #[test]
    #[ignore = "requires a GPU; cargo test -- --ignored"]
    fn gpu_snapshot_has_sane_values() {
        let s = snapshot().unwrap();
        eprintln!("{s:#?}");
        assert!(!s.gpus.is_empty());
        assert!(s.driver_version.as_deref().is_some_and(|v| !v.is_empty()));
        assert!(s.cuda_driver_version.unwrap() >= 11000);
        let legend = ["OK", "CNS", "GNS", "TNS", "DI", "NS", "U"];
        for g in &s.gpus {
            assert!(g.name.as_deref().is_some_and(|n| !n.is_empty()));
            assert!(g.uuid.as_deref().unwrap().starts_with("GPU-"));
            assert_eq!(g.bdf.matches(':').count(), 2, "{}", g.bdf);
            assert!(g.memory_bytes.unwrap() >= 1 << 30);
            assert!(g.bar1_bytes.unwrap() > 0);
            assert!(g.compute_capability.as_deref().unwrap().contains('.'));
            assert_eq!(g.p2p_read.len(), s.gpus.len() - 1);
            for (peer, status) in &g.p2p_read {
                assert_ne!(peer, &g.bdf);
                assert!(legend.contains(&status.as_str()), "{status}");
            }
            for l in &g.nvlinks {
                if let Remote::Gpu(b) = &l.remote {
                    assert_ne!(b, &g.bdf, "an NVLink to itself");
                }
            }
        }
    }
}
