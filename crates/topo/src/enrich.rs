//! NVML enrichment: GPU names, UUIDs, NVLinks, BAR1 and P2P status, which sysfs does not hold.
//!
//! On the live machine the facts come from NVML through `gdx-sys` ([`live_snapshot`]). A
//! capture (`gdx topo --capture`) stores the same facts as `gdx/nvml.json` beside the sysfs
//! files, so a captured machine keeps its NVLinks; `--root` reads that file and never calls
//! NVML (the local NVML describes this machine, not the captured one).

use crate::error::TopoError;
use crate::model::{NvLink, NvLinkTarget, PciAddr, Topology};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Path of the snapshot file relative to a capture root.
pub const SNAPSHOT_PATH: &str = "gdx/nvml.json";

/// What NVML said about the GPUs of one machine.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NvmlSnapshot {
    /// Driver version string, e.g. `580.159.04`.
    pub driver_version: Option<String>,
    /// CUDA driver API version as NVML reports it, e.g. 13000.
    pub cuda_driver_version: Option<i32>,
    /// One entry per GPU NVML sees.
    pub gpus: Vec<NvmlGpu>,
}

/// One GPU as NVML sees it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NvmlGpu {
    /// NVML index.
    pub index: u32,
    /// Product name.
    pub name: Option<String>,
    /// UUID.
    pub uuid: Option<String>,
    /// PCI address.
    pub bdf: PciAddr,
    /// BAR1 size in bytes.
    pub bar1_bytes: Option<u64>,
    /// Framebuffer size in bytes.
    pub memory_bytes: Option<u64>,
    /// CUDA compute capability "major.minor".
    pub compute_capability: Option<String>,
    /// Active NVLinks, one entry per link.
    pub nvlinks: Vec<NvmlLink>,
    /// P2P read status to each other GPU, e.g. ("0000:07:00.0", "OK").
    pub p2p_read: Vec<(PciAddr, String)>,
}

/// One active NVLink.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmlLink {
    /// Link number on this GPU.
    pub link: u32,
    /// What is at the far end.
    pub remote: NvLinkTarget,
}

/// Query NVML on this machine.
///
/// # Errors
/// [`TopoError::Nvml`] with gdx-sys's reason (library missing, init failed).
pub fn live_snapshot() -> Result<NvmlSnapshot, TopoError> {
    gdx_sys::nvml::snapshot()
        .map(|s| NvmlSnapshot {
            driver_version: s.driver_version,
            cuda_driver_version: s.cuda_driver_version,
            gpus: s
                .gpus
                .into_iter()
                .filter_map(|g| {
                    let bdf = g.bdf.parse().ok()?;
                    Some(NvmlGpu {
                        index: g.index,
                        name: g.name,
                        uuid: g.uuid,
                        bdf,
                        bar1_bytes: g.bar1_bytes,
                        memory_bytes: g.memory_bytes,
                        compute_capability: g.compute_capability,
                        nvlinks: g
                            .nvlinks
                            .into_iter()
                            .filter_map(|l| {
                                let remote = match l.remote {
                                    gdx_sys::nvml::Remote::Gpu(b) => {
                                        NvLinkTarget::Gpu(b.parse().ok()?)
                                    }
                                    gdx_sys::nvml::Remote::Switch => NvLinkTarget::NvSwitch,
                                    gdx_sys::nvml::Remote::Cpu => NvLinkTarget::Cpu,
                                };
                                Some(NvmlLink {
                                    link: l.link,
                                    remote,
                                })
                            })
                            .collect(),
                        p2p_read: g
                            .p2p_read
                            .into_iter()
                            .filter_map(|(b, s)| Some((b.parse().ok()?, s)))
                            .collect(),
                    })
                })
                .collect(),
        })
        .map_err(TopoError::Nvml)
}

/// Read `gdx/nvml.json` under a capture root; `Ok(None)` when the capture has none. The file
/// is read like every other one of a capture (inside the root, a regular file, at most 1 MiB)
/// and errors name it relative to the capture, never an unpacked archive's temporary folder.
pub fn read_snapshot(root: &Path) -> Result<Option<NvmlSnapshot>, TopoError> {
    use crate::sysfs::rootfs::{ReadError, RootFs};
    let path = PathBuf::from(SNAPSHOT_PATH);
    let bytes = match RootFs::new(root).read(&path) {
        Ok(b) => b,
        Err(ReadError::Missing) => return Ok(None),
        Err(e) => return Err(TopoError::io(path, std::io::Error::other(e.why()))),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| TopoError::Snapshot {
            path,
            message: e.to_string(),
        })
}

/// Merge NVML facts into the GPUs of `topo` (matched by PCI address) and relabel GPUs in
/// NVML order. GPUs NVML knows but sysfs does not are noted, not invented.
pub fn apply(topo: &mut Topology, snap: &NvmlSnapshot) {
    for g in &snap.gpus {
        let Some(dev) = topo.devices.iter_mut().find(|d| d.bdf == Some(g.bdf)) else {
            topo.notes.push(format!(
                "NVML reports GPU {} at {} but the PCI tree has no such device",
                g.index, g.bdf
            ));
            continue;
        };
        if g.name.is_some() {
            dev.name = g.name.clone();
        }
        let info = dev.gpu.get_or_insert_with(Default::default);
        info.index = Some(g.index);
        info.uuid = g.uuid.clone();
        info.bar1_mib = g.bar1_bytes.map(|b| b >> 20);
        info.memory_mib = g.memory_bytes.map(|b| b >> 20);
        info.compute_capability = g.compute_capability.clone();
        info.p2p_status = g.p2p_read.clone();
        let mut bundles: Vec<NvLink> = Vec::new();
        for l in &g.nvlinks {
            match bundles.iter_mut().find(|b| b.target == l.remote) {
                Some(b) => b.count += 1,
                None => bundles.push(NvLink {
                    target: l.remote.clone(),
                    count: 1,
                }),
            }
        }
        info.nvlinks = bundles;
    }
    topo.nvml_enriched = true;
    topo.assign_labels();
}
