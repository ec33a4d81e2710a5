//! Discovery from a sysfs/proc tree under a root folder: `/` for the live machine, a folder or
//! `.tar.gz` written by [`crate::capture()`] for another one.
//!
//! What is read, and from where:
//! - PCI functions: `sys/bus/pci/devices/*` (links into `sys/devices/pciDDDD:BB/...`), their
//!   `class`, `vendor`, `device`, `numa_node`, `local_cpulist`, link files and `config`; the
//!   real path gives the host bridge and the bridges above (`pci` module).
//! - NICs: `sys/class/infiniband/*` and `sys/class/net/*` (`net` module).
//! - NUMA nodes: `sys/devices/system/node/node*/cpulist`.
//! - GPU names: `proc/driver/nvidia/gpus/<bdf>/information`.
//! - NVLinks and NVML facts: `gdx/nvml.json` when a capture holds one.
//!
//! GPUs are display (0x03) and processing-accelerator (0x12) functions, except the display
//! adapters of BMCs and hypervisors (ASPEED, Matrox, QEMU, ...), which every server has and
//! `nvidia-smi` never shows. Nothing odd inside the tree is fatal: unreadable files, garbage
//! values and dangling links become [`Topology::notes`]. All paths are resolved inside the
//! root (`rootfs` module), so a capture's absolute links never reach the host's own `/sys`.
//!
//! This module is gdx's one sysfs layer: the doctor and the rdma crate read roots through
//! [`RootFs`] ([`rootfs`], [`files`]), the PCI and RDMA device facts of [`devices`] and the
//! config-space capabilities of [`config`], and unpack captures with [`archive`]; none of
//! them joins, resolves or unpacks sysfs paths on its own.

pub mod archive;
pub mod config;
pub mod counters;
pub mod devices;
pub mod files;
mod net;
mod parse;
pub(crate) mod pci;
pub mod qos;
pub mod rootfs;

use crate::enrich;
use crate::model::{
    kind_from_class, natural_cmp, Device, DeviceKind, HostBridge, NumaNode, PciAddr, Source,
    Topology,
};
use crate::TopoError;
pub use files::FileError;
pub use net::is_efa;
pub use rootfs::{ReadError, RootFs};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Vendors of display adapters that are not compute GPUs: BMC video (ASPEED, Matrox) and
/// emulated VGA (QEMU/Bochs, Cirrus, QXL, VMware SVGA, virtio-gpu, Hyper-V).
const NON_COMPUTE_DISPLAY_VENDORS: [u16; 8] = [
    0x1a03, 0x102b, 0x1234, 0x1013, 0x1b36, 0x15ad, 0x1af4, 0x1414,
];

/// At most this many notes are kept; a badly broken tree would otherwise bury the first ones.
const MAX_NOTES: usize = 200;

/// Build the model from `root/sys/...` and `root/proc/...` (`/` is the live machine), or from
/// a `.tar.gz`/`.tgz` capture, unpacked to a temporary folder first (see [`archive`]).
///
/// # Errors
/// [`TopoError::RootMissing`] when `root` does not exist; [`TopoError::RootUnusable`] when it
/// holds no `sys/bus/pci/devices` or is a file that does not unpack within the archive rules;
/// [`TopoError::Io`] when the root itself cannot be read. Problems inside the tree are notes,
/// not errors.
pub fn from_root(root: &Path) -> Result<Topology, TopoError> {
    let opened = archive::open_root(root, archive::Require::PciTree)?;
    from_open_root(&opened)
}

/// Build the model from a root opened with [`archive::open_root`] (the doctor opens the root
/// once and reads both the topology and its own files from it). The model's source names the
/// root as given, never an archive's temporary folder.
///
/// # Errors
/// [`TopoError::RootUnusable`] when the root holds no `sys/bus/pci/devices` (a root opened
/// with [`archive::Require::Nothing`] may not).
pub fn from_open_root(opened: &archive::OpenRoot) -> Result<Topology, TopoError> {
    let fs = RootFs::new(opened.dir());
    if !fs.is_dir(Path::new("sys/bus/pci/devices")) {
        return Err(TopoError::RootUnusable {
            path: opened.given().to_path_buf(),
            why: archive::NOT_A_ROOT.into(),
            source: None,
        });
    }
    Ok(build(&fs, opened.given().display().to_string()))
}

/// Reads files under the root and collects notes about the ones that are odd.
pub(crate) struct Reader<'a> {
    pub fs: &'a RootFs,
    notes: Vec<String>,
    dropped: usize,
}

impl<'a> Reader<'a> {
    fn new(fs: &'a RootFs) -> Reader<'a> {
        Reader {
            fs,
            notes: Vec::new(),
            dropped: 0,
        }
    }

    /// Record a non-fatal problem.
    pub(crate) fn note(&mut self, s: String) {
        if self.notes.len() < MAX_NOTES {
            self.notes.push(s);
        } else {
            self.dropped += 1;
        }
    }

    fn finish(mut self) -> Vec<String> {
        if self.dropped > 0 {
            self.notes
                .push(format!("... and {} more notes like these", self.dropped));
        }
        self.notes
    }

    fn failed(&mut self, p: &Path, e: ReadError) {
        if let ReadError::Failed(why) = e {
            self.note(format!("{}: cannot read: {why}", p.display()));
        }
    }

    /// Trimmed text of a file; `None` when absent, not applicable, or unreadable (noted).
    pub(crate) fn text(&mut self, p: &Path) -> Option<String> {
        match self.fs.read_text(p) {
            Ok(t) => Some(t),
            Err(e) => {
                self.failed(p, e);
                None
            }
        }
    }

    /// The first `limit` bytes of a file; `None` as for [`Reader::text`].
    pub(crate) fn bytes(&mut self, p: &Path, limit: u64) -> Option<Vec<u8>> {
        match self.fs.read_prefix(p, limit) {
            Ok(b) => Some(b),
            Err(e) => {
                self.failed(p, e);
                None
            }
        }
    }

    /// A file parsed by `parse`; text it does not understand is noted as an unexpected `what`.
    pub(crate) fn parsed<T>(
        &mut self,
        p: &Path,
        parse: impl Fn(&str) -> Option<T>,
        what: &str,
    ) -> Option<T> {
        let t = self.text(p)?;
        let v = parse(&t);
        if v.is_none() {
            let shown: String = t.chars().take(40).collect();
            self.note(format!("{}: unexpected {what} {shown:?}", p.display()));
        }
        v
    }
}

fn ids_name(vendor: Option<u16>, device: Option<u16>) -> Option<String> {
    Some(format!("{:04x}:{:04x}", vendor?, device?))
}

/// Assemble the topology from the tree under `fs`.
fn build(fs: &RootFs, source: String) -> Topology {
    let mut r = Reader::new(fs);
    let mut tree = pci::scan(&mut r);
    let (nics, software_nics) = net::scan(&mut r, &mut tree);
    let models = nvidia_models(&mut r);

    let bdfs: BTreeSet<PciAddr> = tree.fns.keys().chain(nics.keys()).copied().collect();
    let mut devices = Vec::new();
    for bdf in bdfs {
        let f = tree.fns.get(&bdf).cloned();
        let class = f.as_ref().and_then(|f| f.class);
        let vendor = f.as_ref().and_then(|f| f.vendor);
        let kind = if nics.contains_key(&bdf) {
            DeviceKind::Nic
        } else {
            match class.and_then(kind_from_class) {
                Some(DeviceKind::Gpu)
                    if !vendor.is_some_and(|v| NON_COMPUTE_DISPLAY_VENDORS.contains(&v)) =>
                {
                    DeviceKind::Gpu
                }
                Some(DeviceKind::Nvme) => DeviceKind::Nvme,
                _ => continue,
            }
        };
        let mut d = Device::new(kind, Some(bdf));
        if let Some(f) = &f {
            d.vendor = f.vendor;
            d.device_id = f.device;
            d.class = f.class;
            d.numa = f.numa;
            d.cpu_affinity = f.cpulist.clone();
            d.link = f.link;
        }
        d.name = match kind {
            DeviceKind::Gpu => models.get(&bdf).cloned(),
            // RDMA device, else netdev (a virtio `eth0`), else the vendor in words.
            DeviceKind::Nic => nics
                .get(&bdf)
                .and_then(|n| n.rdma_name.clone().or_else(|| n.netdevs.first().cloned()))
                .or_else(|| crate::vendor::nic_name(d.vendor, d.device_id, d.class)),
            DeviceKind::Nvme => None,
        }
        .or_else(|| ids_name(d.vendor, d.device_id));
        if kind == DeviceKind::Nic {
            d.nic = nics.get(&bdf).cloned();
        }
        d.attach = tree.attach(bdf);
        devices.push(d);
    }
    // Software RDMA devices: no PCI place, so their class to every other device is SYS.
    for nic in software_nics {
        let mut d = Device::new(DeviceKind::Nic, None);
        d.name = nic.rdma_name.clone();
        d.nic = Some(nic);
        devices.push(d);
    }

    let used: BTreeSet<String> = devices
        .iter()
        .filter_map(|d| d.attach.host_bridge.clone())
        .collect();
    let mut host_bridges: Vec<HostBridge> = used
        .into_iter()
        .map(|id| {
            // The host bridge folder has no numa_node; its functions do (first known wins).
            let numa = tree
                .fns
                .values()
                .filter(|f| f.host_bridge.as_deref() == Some(id.as_str()))
                .find_map(|f| f.numa);
            HostBridge { id, numa }
        })
        .collect();
    host_bridges.sort_by(|a, b| natural_cmp(&a.id, &b.id));
    let numa_nodes = numa_nodes(&mut r);

    let mut topo = Topology {
        source: Source::Sysfs(source),
        devices,
        switches: std::mem::take(&mut tree.switches),
        host_bridges,
        numa_nodes,
        nvml_enriched: false,
        notes: Vec::new(),
    };
    match enrich::read_snapshot(fs.base()) {
        Ok(Some(snap)) => enrich::apply(&mut topo, &snap),
        Ok(None) => {}
        Err(e) => r.note(format!("NVML snapshot not used: {e}")),
    }
    topo.assign_labels();
    let mut notes = r.finish();
    notes.append(&mut topo.notes);
    topo.notes = notes;
    topo
}

/// NUMA nodes and their CPUs from `sys/devices/system/node/node*/cpulist`.
fn numa_nodes(r: &mut Reader<'_>) -> Vec<NumaNode> {
    let dir = Path::new("sys/devices/system/node");
    let names = r.fs.list(dir).unwrap_or_default();
    let mut nodes: Vec<NumaNode> = names
        .iter()
        .filter_map(|n| Some((parse::node_id(n)?, n)))
        .map(|(id, n)| NumaNode {
            id,
            // Memory-only nodes (CXL, HBM) have an empty cpulist: still nodes.
            cpus: r.text(&dir.join(n).join("cpulist")).unwrap_or_default(),
        })
        .collect();
    nodes.sort_by_key(|n| n.id);
    nodes
}

/// GPU product names from the NVIDIA driver's proc files, by PCI address.
fn nvidia_models(r: &mut Reader<'_>) -> BTreeMap<PciAddr, String> {
    let dir = Path::new("proc/driver/nvidia/gpus");
    let mut out = BTreeMap::new();
    for name in r.fs.list(dir).unwrap_or_default() {
        let Ok(bdf) = name.parse::<PciAddr>() else {
            continue;
        };
        if let Some(model) = r
            .text(&dir.join(&name).join("information"))
            .and_then(|t| parse::nvidia_model(&t))
        {
            out.insert(bdf, model);
        }
    }
    out
}
