//! The machine model every part of gdx shares: PCI addresses, devices of interest (GPUs, NICs,
//! NVMe), the PCIe switches they hang below, the host bridges and NUMA nodes above them.
//!
//! The model is deliberately flat and source-neutral: sysfs discovery and NCCL XML parsing both
//! produce a [`Topology`], and path classification ([`crate::path`]) only looks at each device's
//! [`Attachment`] (host bridge + chain of switches) and its NVLinks. Invariant: every
//! [`SwitchId`] in an attachment indexes [`Topology::switches`].

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A PCI address `DDDD:BB:DD.F`. Parsing accepts NVML's 8-digit domain (`00000000:06:00.0`)
/// and upper-case hex; display is always the canonical lower-case 4-digit-domain form.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddr {
    /// PCI segment (domain).
    pub domain: u32,
    /// Bus number.
    pub bus: u8,
    /// Device (slot) number, 0..32.
    pub device: u8,
    /// Function number, 0..8.
    pub function: u8,
}

/// Error from parsing a PCI address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid PCI address {input:?}: expected DDDD:BB:DD.F")]
pub struct PciAddrError {
    /// The text that failed to parse.
    pub input: String,
}

impl FromStr for PciAddr {
    type Err = PciAddrError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || PciAddrError {
            input: s.to_string(),
        };
        let t = s.trim();
        let (dom_bus, dev_fn) = t.rsplit_once(':').ok_or_else(err)?;
        let (dom, bus) = dom_bus.split_once(':').ok_or_else(err)?;
        let (dev, func) = dev_fn.split_once('.').ok_or_else(err)?;
        let hex = |x: &str, max_len: usize| -> Result<u32, PciAddrError> {
            if x.is_empty() || x.len() > max_len {
                return Err(err());
            }
            u32::from_str_radix(x, 16).map_err(|_| err())
        };
        let domain = hex(dom, 8)?;
        let bus = hex(bus, 2)? as u8;
        let device = hex(dev, 2)?;
        let function = hex(func, 1)?;
        if device >= 32 || function >= 8 {
            return Err(err());
        }
        Ok(PciAddr {
            domain,
            bus,
            device: device as u8,
            function: function as u8,
        })
    }
}

impl fmt::Display for PciAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl Serialize for PciAddr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PciAddr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// What a device is, as far as gdx cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// Display controller (PCI class 0x03xx): a GPU or accelerator.
    Gpu,
    /// Network controller: an RDMA device or a plain Ethernet NIC.
    Nic,
    /// NVMe controller (PCI class 0x0108).
    Nvme,
}

/// PCIe link figures as the kernel reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Link {
    /// Transfer rate per lane in GT/s (2.5, 5, 8, 16, 32, 64), if known.
    pub speed_gts: Option<f64>,
    /// Lane count, if known.
    pub width: Option<u32>,
}

pub use crate::bandwidth::pcie_generation;

impl Link {
    /// PCIe generation for the lane rate (1..=6), if the rate is a known one.
    pub fn generation(&self) -> Option<u32> {
        pcie_generation(self.speed_gts?)
    }

    /// Usable one-direction bandwidth in GB/s (1e9 B/s) after line encoding, before protocol
    /// overhead ([`crate::bandwidth::pcie_gbps`], the one PCIe formula).
    pub fn raw_gbps(&self) -> Option<f64> {
        Some(crate::bandwidth::pcie_gbps(self.speed_gts?, self.width?))
    }

    /// `PCIe Gen5 x16`, or `PCIe 2.7 GT/s x16` for a rate of no known generation.
    pub fn name(&self) -> String {
        let gen = self
            .generation()
            .map(|g| format!("Gen{g}"))
            .unwrap_or_else(|| format!("{} GT/s", self.speed_gts.unwrap_or(0.0)));
        format!("PCIe {gen} x{}", self.width.unwrap_or(0))
    }
}

impl std::fmt::Display for Link {
    /// `PCIe Gen5 x16 (63.02 GB/s)`; the rate is left out when speed or width is unknown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())?;
        match self.raw_gbps() {
            Some(g) => write!(f, " ({g:.2} GB/s)"),
            None => Ok(()),
        }
    }
}

/// Current and maximum PCIe link of a device (a device link below max is "downtrained",
/// though idle GPUs legitimately drop their speed to save power).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkStatus {
    /// What the link runs at now.
    pub current: Link,
    /// What the device and slot support.
    pub max: Link,
}

/// Index into [`Topology::switches`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SwitchId(pub usize);

/// A PCIe switch: one upstream port and its downstream ports. In NCCL XML each bridge `<pci>`
/// element is one switch (NCCL itself collapses upstream and downstream ports).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Switch {
    /// The upstream port's address (or the XML bridge's bus id).
    pub upstream: PciAddr,
    /// Downstream ports seen (empty when the source does not list them, e.g. NCCL XML).
    pub downstream: Vec<PciAddr>,
    /// PCI vendor id of the upstream port, when known.
    pub vendor: Option<u16>,
    /// PCI device id of the upstream port, when known.
    pub device_id: Option<u16>,
    /// Link of the upstream port towards the root.
    pub link: LinkStatus,
    /// The switch above this one, if any.
    pub parent: Option<SwitchId>,
    /// True for bridges that exist only in software: hypervisor-made or NCCL's synthetic
    /// `ffff:ff:xx.x` nodes. Their link figures mean nothing.
    pub is_virtual: bool,
}

/// Where a device hangs in the PCI tree: the root complex and the switches between it and
/// the device, outermost first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attachment {
    /// Host bridge (root complex) id, e.g. `pci0000:00` from sysfs or `cpu0` from NCCL XML.
    /// `None` when unknown (a device with no PCI information at all).
    pub host_bridge: Option<String>,
    /// Switches from the root complex down to the device.
    pub switches: Vec<SwitchId>,
}

/// The far end of a bundle of NVLinks.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind", content = "bdf")]
pub enum NvLinkTarget {
    /// Another GPU, by its PCI address.
    Gpu(PciAddr),
    /// An NVSwitch (every GPU linked to NVSwitches reaches every other such GPU).
    NvSwitch,
    /// A CPU (Grace / POWER NVLink-C2C).
    Cpu,
}

/// A bundle of active NVLinks from one GPU to one target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvLink {
    /// What the links lead to.
    pub target: NvLinkTarget,
    /// Number of active links in the bundle.
    pub count: u32,
}

/// GPU-only facts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// NVML / CUDA index when known (NVML orders by PCI bus id).
    pub index: Option<u32>,
    /// NVML UUID (`GPU-...`).
    pub uuid: Option<String>,
    /// BAR1 aperture size in MiB (the window peers and NICs map GPU memory through).
    pub bar1_mib: Option<u64>,
    /// Total memory in MiB.
    pub memory_mib: Option<u64>,
    /// Active NVLinks grouped by target.
    pub nvlinks: Vec<NvLink>,
    /// Per peer GPU (by PCI address), NVML's P2P read status as text ("OK", "NS", "CNS", ...).
    pub p2p_status: Vec<(PciAddr, String)>,
    /// CUDA compute capability, e.g. "9.0", when known.
    pub compute_capability: Option<String>,
}

/// One port of an RDMA device.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NicPort {
    /// Port number (1-based, as verbs counts).
    pub port: u32,
    /// Logical state text, e.g. `4: ACTIVE`.
    pub state: Option<String>,
    /// Physical state text, e.g. `5: LinkUp`.
    pub phys_state: Option<String>,
    /// `InfiniBand` or `Ethernet`.
    pub link_layer: Option<String>,
    /// Rate text as sysfs gives it, e.g. `400 Gb/sec (4X NDR)`.
    pub rate: Option<String>,
    /// Rate in Gb/s parsed from the text.
    pub rate_gbps: Option<f64>,
    /// Non-empty GID table entries.
    pub gids: Vec<Gid>,
}

/// One GID table entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gid {
    /// GID index.
    pub index: u32,
    /// The GID as sysfs prints it (`fe80:0000:...`).
    pub gid: String,
    /// `IB/RoCE v1` or `RoCE v2`, when the kernel says.
    pub gid_type: Option<String>,
    /// The netdev this GID belongs to, when the kernel says.
    pub ndev: Option<String>,
}

/// NIC-only facts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NicInfo {
    /// RDMA device name (`mlx5_0`), when this NIC is an RDMA device.
    pub rdma_name: Option<String>,
    /// Kernel network interfaces on this PCI function (`eth0`, `ib0`).
    pub netdevs: Vec<String>,
    /// RDMA ports.
    pub ports: Vec<NicPort>,
    /// Speed in Mb/s of a plain netdev or NCCL `<net speed>`, when known.
    pub speed_mbps: Option<u64>,
    /// An AWS Elastic Fabric Adapter (see [`crate::sysfs::is_efa`]): driven through libfabric's
    /// efa provider, not raw verbs.
    #[serde(default)]
    pub efa: bool,
    /// A software RDMA device (Soft-RoCE `rxe`, `siw`): no PCI function of its own; it
    /// sends through its netdev (`netdevs`), and the CPU copies every byte.
    #[serde(default)]
    pub software: bool,
}

/// A device of interest: a GPU, NIC or NVMe controller.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Device {
    /// `GPU0`, `NIC3`, `NVME1`: stable within one topology.
    pub label: String,
    /// What it is.
    pub kind: DeviceKind,
    /// PCI address; `None` for NCCL `<nic>` entries with no PCI parent.
    pub bdf: Option<PciAddr>,
    /// Human name (NVML name, RDMA device name, or vendor:device ids).
    pub name: Option<String>,
    /// PCI vendor id.
    pub vendor: Option<u16>,
    /// PCI device id.
    pub device_id: Option<u16>,
    /// PCI class code (24 bits, e.g. 0x030200).
    pub class: Option<u32>,
    /// NUMA node, `None` when the platform does not say (`numa_node` = -1).
    pub numa: Option<u32>,
    /// CPUs close to the device as a list (`0-31`), when known.
    pub cpu_affinity: Option<String>,
    /// PCIe link.
    pub link: LinkStatus,
    /// Place in the PCI tree.
    pub attach: Attachment,
    /// GPU facts (kind == Gpu).
    pub gpu: Option<GpuInfo>,
    /// NIC facts (kind == Nic).
    pub nic: Option<NicInfo>,
}

/// A host bridge (root complex) and the NUMA node it belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostBridge {
    /// Same id as [`Attachment::host_bridge`].
    pub id: String,
    /// NUMA node, when known.
    pub numa: Option<u32>,
}

/// A NUMA node and its CPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaNode {
    /// Node id.
    pub id: u32,
    /// CPU list (`0-31,64-95`).
    pub cpus: String,
}

/// Where a topology came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type", content = "path")]
pub enum Source {
    /// sysfs/proc under a root folder (`/` for the live machine).
    Sysfs(String),
    /// An NCCL topology XML file.
    NcclXml(String),
}

/// The whole machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Topology {
    /// Where this model was read from.
    pub source: Source,
    /// GPUs first (GPU0..), then NICs (NIC0..), then NVMe controllers.
    pub devices: Vec<Device>,
    /// PCIe switches referenced by attachments.
    pub switches: Vec<Switch>,
    /// Root complexes referenced by attachments.
    pub host_bridges: Vec<HostBridge>,
    /// NUMA nodes.
    pub numa_nodes: Vec<NumaNode>,
    /// True when NVML enriched the GPUs (names, NVLinks, P2P status).
    pub nvml_enriched: bool,
    /// Non-fatal problems met while building the model (unreadable files, odd values).
    pub notes: Vec<String>,
}

impl Topology {
    /// Devices of one kind, in label order.
    pub fn of_kind(&self, kind: DeviceKind) -> impl Iterator<Item = &Device> {
        self.devices.iter().filter(move |d| d.kind == kind)
    }

    /// GPUs in label order.
    pub fn gpus(&self) -> impl Iterator<Item = &Device> {
        self.of_kind(DeviceKind::Gpu)
    }

    /// NICs in label order.
    pub fn nics(&self) -> impl Iterator<Item = &Device> {
        self.of_kind(DeviceKind::Nic)
    }

    /// A device by label (`GPU0`).
    pub fn device(&self, label: &str) -> Option<&Device> {
        self.devices.iter().find(|d| d.label == label)
    }

    /// A device by PCI address.
    pub fn by_bdf(&self, bdf: PciAddr) -> Option<&Device> {
        self.devices.iter().find(|d| d.bdf == Some(bdf))
    }

    /// NUMA node of a host bridge, when known.
    pub fn host_bridge_numa(&self, id: &str) -> Option<u32> {
        self.host_bridges
            .iter()
            .find(|h| h.id == id)
            .and_then(|h| h.numa)
    }

    /// Give devices their labels: GPUs by NVML index when every GPU has one, else by bus
    /// address; NICs by RDMA device name in natural order (`mlx5_2` before `mlx5_10`), then
    /// bus address; NVMe by bus address. Reorders [`Topology::devices`] to GPUs, NICs, NVMe.
    pub fn assign_labels(&mut self) {
        let mut gpus: Vec<Device> = Vec::new();
        let mut nics: Vec<Device> = Vec::new();
        let mut nvmes: Vec<Device> = Vec::new();
        for d in self.devices.drain(..) {
            match d.kind {
                DeviceKind::Gpu => gpus.push(d),
                DeviceKind::Nic => nics.push(d),
                DeviceKind::Nvme => nvmes.push(d),
            }
        }
        let all_indexed = gpus
            .iter()
            .all(|g| g.gpu.as_ref().and_then(|i| i.index).is_some());
        if all_indexed {
            gpus.sort_by_key(|g| g.gpu.as_ref().and_then(|i| i.index));
        } else {
            gpus.sort_by_key(|g| g.bdf);
        }
        nics.sort_by(|a, b| {
            let ka = a.nic.as_ref().and_then(|n| n.rdma_name.clone());
            let kb = b.nic.as_ref().and_then(|n| n.rdma_name.clone());
            match (ka, kb) {
                (Some(x), Some(y)) => natural_cmp(&x, &y).then(a.bdf.cmp(&b.bdf)),
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (None, None) => a
                    .bdf
                    .cmp(&b.bdf)
                    .then_with(|| natural_cmp(a.name_or_empty(), b.name_or_empty())),
            }
        });
        nvmes.sort_by_key(|d| d.bdf);
        for (i, d) in gpus.iter_mut().enumerate() {
            d.label = format!("GPU{i}");
        }
        for (i, d) in nics.iter_mut().enumerate() {
            d.label = format!("NIC{i}");
        }
        for (i, d) in nvmes.iter_mut().enumerate() {
            d.label = format!("NVME{i}");
        }
        self.devices = gpus.into_iter().chain(nics).chain(nvmes).collect();
    }
}

impl Device {
    fn name_or_empty(&self) -> &str {
        self.name.as_deref().unwrap_or("")
    }

    /// A device with only the basics set; the rest defaults to unknown.
    pub fn new(kind: DeviceKind, bdf: Option<PciAddr>) -> Device {
        Device {
            label: String::new(),
            kind,
            bdf,
            name: None,
            vendor: None,
            device_id: None,
            class: None,
            numa: None,
            cpu_affinity: None,
            link: LinkStatus::default(),
            attach: Attachment::default(),
            gpu: (kind == DeviceKind::Gpu).then(GpuInfo::default),
            nic: (kind == DeviceKind::Nic).then(NicInfo::default),
        }
    }
}

/// Kind of a device from its 24-bit PCI class code, for the kinds gdx tracks.
pub fn kind_from_class(class: u32) -> Option<DeviceKind> {
    match class >> 16 {
        0x03 => Some(DeviceKind::Gpu),
        // 0x12 = processing accelerators (some GPUs/AI chips report this).
        0x12 => Some(DeviceKind::Gpu),
        0x02 => Some(DeviceKind::Nic),
        0x01 if (class >> 8) & 0xff == 0x08 => Some(DeviceKind::Nvme),
        _ => None,
    }
}

/// Compare strings so that digit runs compare by value: `mlx5_2` < `mlx5_10`.
pub fn natural_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    let mut ai = a.chars().peekable();
    let mut bi = b.chars().peekable();
    loop {
        match (ai.peek().copied(), bi.peek().copied()) {
            (None, None) => return std::cmp::Ordering::Equal,
            (None, Some(_)) => return std::cmp::Ordering::Less,
            (Some(_), None) => return std::cmp::Ordering::Greater,
            (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit() => {
                let take = |it: &mut std::iter::Peekable<std::str::Chars<'_>>| {
                    let mut s = String::new();
                    while let Some(c) = it.peek().copied().filter(char::is_ascii_digit) {
                        s.push(c);
                        it.next();
                    }
                    s
                };
                let (na, nb) = (take(&mut ai), take(&mut bi));
                let (ta, tb) = (na.trim_start_matches('0'), nb.trim_start_matches('0'));
                let ord = ta.len().cmp(&tb.len()).then_with(|| ta.cmp(tb));
                if ord != std::cmp::Ordering::Equal {
                    return ord;
                }
            }
            (Some(x), Some(y)) => {
                if x != y {
                    return x.cmp(&y);
                }
                ai.next();
                bi.next();
            }
        }
    }
}

/// Parse a kernel CPU list (`0-31,64-95`) into CPU numbers; `None` if malformed.
pub fn parse_cpulist(list: &str) -> Option<std::collections::BTreeSet<u32>> {
    let mut set = std::collections::BTreeSet::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if b < a || b - a > 65_536 {
                    return None;
                }
                set.extend(a..=b);
            }
            None => {
                set.insert(part.trim().parse().ok()?);
            }
        }
    }
    Some(set)
}

impl Topology {
    /// NUMA nodes a device is close to: its own `numa` when the platform says, else the nodes
    /// whose CPUs overlap the device's CPU affinity (what `nvidia-smi topo -m` shows as "NUMA
    /// Affinity" on VMs that report `numa_node` = -1).
    pub fn numa_affinity(&self, dev: &Device) -> Vec<u32> {
        if let Some(n) = dev.numa {
            return vec![n];
        }
        let Some(cpus) = dev.cpu_affinity.as_deref().and_then(parse_cpulist) else {
            return Vec::new();
        };
        self.numa_nodes
            .iter()
            .filter(|n| parse_cpulist(&n.cpus).is_some_and(|c| !c.is_disjoint(&cpus)))
            .map(|n| n.id)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_addr_round_trip_and_nvml_form() {
        let a: PciAddr = "00000000:06:00.0".parse().unwrap();
        assert_eq!(a.to_string(), "0000:06:00.0");
        let b: PciAddr = "0001:1A:1f.7".parse().unwrap();
        assert_eq!(b.to_string(), "0001:1a:1f.7");
        assert!("0000:06:20.0".parse::<PciAddr>().is_err());
        assert!("06:00.0".parse::<PciAddr>().is_err());
        assert!("zz:06:00.0".parse::<PciAddr>().is_err());
    }

    #[test]
    fn natural_order() {
        let mut v = vec!["mlx5_10", "mlx5_2", "mlx5_1", "ib0"];
        v.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(v, ["ib0", "mlx5_1", "mlx5_2", "mlx5_10"]);
    }

    #[test]
    fn link_generation_and_bandwidth() {
        let l = Link {
            speed_gts: Some(32.0),
            width: Some(16),
        };
        assert_eq!(l.generation(), Some(5));
        let bw = l.raw_gbps().unwrap();
        assert!((bw - 63.015).abs() < 0.01, "{bw}");
    }

    #[test]
    fn cpulists() {
        let s = parse_cpulist("0-3,8,10-11").unwrap();
        assert_eq!(
            s.into_iter().collect::<Vec<_>>(),
            vec![0, 1, 2, 3, 8, 10, 11]
        );
        assert!(parse_cpulist("3-1").is_none());
        assert!(parse_cpulist("x").is_none());
        assert_eq!(parse_cpulist("").unwrap().len(), 0);
    }

    #[test]
    fn class_codes() {
        assert_eq!(kind_from_class(0x030200), Some(DeviceKind::Gpu));
        assert_eq!(kind_from_class(0x020700), Some(DeviceKind::Nic));
        assert_eq!(kind_from_class(0x010802), Some(DeviceKind::Nvme));
        assert_eq!(kind_from_class(0x060400), None);
    }
}
