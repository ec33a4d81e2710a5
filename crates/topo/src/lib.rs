//! gdx-topo: one model of the machine — GPUs, NICs, NVMe, PCIe switches, host bridges, NUMA
//! nodes — and the path class between every pair (`X`, `NV#`, `PIX`, `PXB`, `PHB`, `NODE`,
//! `SYS`, the `nvidia-smi topo -m` legend).
//!
//! Sources: a sysfs/proc tree under a root folder ([`from_root`]; `/` is the live machine, a
//! captured folder or `.tar.gz` is another machine), optionally enriched from NVML on the live
//! machine ([`discover`]), or an NCCL topology XML file ([`from_nccl_xml`]). The model can be
//! written back as NCCL XML ([`to_nccl_xml`]) and a machine captured for later analysis
//! ([`capture()`]). No `unsafe` here: foreign libraries are reached through `gdx-sys`.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod bandwidth;
pub mod capture;
pub mod ceiling;
pub mod dcb;
pub mod enrich;
mod error;
#[cfg(any(test, feature = "fixture"))]
pub mod fixture;
pub mod model;
pub mod nicmap;
pub mod nvmeof;
pub mod path;
pub mod render;
pub mod sysfs;
pub mod vendor;
pub mod xml;

pub use capture::{capture, read_captured_env, CapturedEnv};
pub use error::{NvmlGap, TopoError};
pub use model::*;
pub use nicmap::{nic_map, rank_nics, Memory, NicMap, RankedNic};
pub use path::{legend, PathClass};
pub use sysfs::archive::{printable, printable_text, OpenRoot};
pub use sysfs::{from_open_root, from_root};
pub use xml::{from_nccl_xml, parse_nccl_xml, to_nccl_xml};

/// Read the live machine: sysfs under `/`, enriched from NVML when NVML loads. When NVML is
/// unavailable the model says so in [`Topology::notes`] and carries on with sysfs alone.
pub fn discover() -> Result<Topology, TopoError> {
    let mut topo = from_root(std::path::Path::new("/"))?;
    match enrich::live_snapshot() {
        Ok(snap) => enrich::apply(&mut topo, &snap),
        Err(why) => topo.notes.push(format!("NVML not used: {why}")),
    }
    Ok(topo)
}
