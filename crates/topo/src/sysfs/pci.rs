//! The PCI tree: every function under `sys/bus/pci/devices`, the chain of bridges above each
//! one (from its real path), and the grouping of bridges into switches.
//!
//! A function's real path is `sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/...`: the
//! `pciDDDD:BB` component is the host bridge, the PCI addresses after it are the bridges down
//! to the function. A switch is one upstream port plus the downstream ports below it; root
//! ports are not switches. Port types come from the PCIe capability in `config` when the
//! file is long enough to reach it (root reads 256+ bytes, others only 64), else from the
//! position in the chain (root port, then upstream/downstream alternating).

use super::config::{CfgError, Config, CAP_ID_PCIE};
use super::parse;
use super::Reader;
use crate::model::{Attachment, Link, LinkStatus, PciAddr, Switch, SwitchId};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// PCI vendors whose bridges only exist in a hypervisor (QEMU/Red Hat, VMware, Microsoft,
/// virtio): their link figures are made up.
const VIRTUAL_BRIDGE_VENDORS: [u16; 4] = [0x1b36, 0x15ad, 0x1414, 0x1af4];

/// The kind of a PCIe bridge, from the Device/Port Type field of the PCIe capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PortType {
    /// Root port of a root complex (type 4).
    RootPort,
    /// Switch upstream port (type 5).
    Upstream,
    /// Switch downstream port (type 6).
    Downstream,
    /// PCIe↔PCI bridge (types 7, 8) or a conventional PCI bridge with no PCIe capability.
    PciBridge,
}

/// One PCI function as sysfs describes it.
#[derive(Debug, Clone)]
pub(crate) struct PciFn {
    /// Host bridge id (`pci0000:00`).
    pub host_bridge: Option<String>,
    /// Bridges from the host bridge down to (not including) this function.
    pub chain: Vec<PciAddr>,
    pub class: Option<u32>,
    pub vendor: Option<u16>,
    pub device: Option<u16>,
    pub subsys_vendor: Option<u16>,
    pub subsys_device: Option<u16>,
    pub numa: Option<u32>,
    pub cpulist: Option<String>,
    pub link: LinkStatus,
    /// Port type from `config`, when `config` was long enough to tell.
    pub port_type: Option<PortType>,
}

impl PciFn {
    fn is_bridge_class(&self) -> bool {
        matches!(self.class.map(|c| c >> 8), Some(0x0604 | 0x0609))
    }
}

/// The whole tree plus the switches built so far.
#[derive(Debug, Default)]
pub(crate) struct PciTree {
    pub fns: BTreeMap<PciAddr, PciFn>,
    pub switches: Vec<Switch>,
    by_upstream: HashMap<PciAddr, SwitchId>,
}

/// Read every function listed under `sys/bus/pci/devices`.
pub(crate) fn scan(r: &mut Reader<'_>) -> PciTree {
    let mut tree = PciTree::default();
    let list = Path::new("sys/bus/pci/devices");
    let names = match r.fs.list(list) {
        Ok(n) => n,
        Err(e) => {
            r.note(format!("{}: cannot list: {}", list.display(), e.why()));
            Vec::new()
        }
    };
    for name in names {
        let Some(bdf) = parse::pci_name(&name) else {
            r.note(format!(
                "{}/{name}: not a PCI address, ignored",
                list.display()
            ));
            continue;
        };
        let link = list.join(&name);
        let Some(real) = r.fs.resolve(&link) else {
            r.note(format!("{}: dangling link, ignored", link.display()));
            continue;
        };
        if !r.fs.is_dir(&real) {
            r.note(format!("{}: not a folder, ignored", link.display()));
            continue;
        }
        let f = read_fn(r, bdf, &real);
        tree.fns.insert(bdf, f);
    }
    tree
}

/// Read one function from its real folder. Public to the module so NICs found through
/// `sys/class/*/device` but missing from `sys/bus/pci/devices` can still be placed.
pub(crate) fn read_fn(r: &mut Reader<'_>, bdf: PciAddr, real: &Path) -> PciFn {
    let (host_bridge, chain) = chain_of(r, bdf, real);
    let at = |n: &str| real.join(n);
    let class = r.parsed(&at("class"), parse::hex_u32, "class code");
    let link = LinkStatus {
        current: Link {
            speed_gts: r
                .parsed(&at("current_link_speed"), parse::link_speed, "link speed")
                .flatten(),
            width: r.parsed(&at("current_link_width"), parse::link_width, "link width"),
        },
        max: Link {
            speed_gts: r
                .parsed(&at("max_link_speed"), parse::link_speed, "link speed")
                .flatten(),
            width: r.parsed(&at("max_link_width"), parse::link_width, "link width"),
        },
    };
    let mut f = PciFn {
        host_bridge,
        chain,
        class,
        vendor: r.parsed(&at("vendor"), parse::hex_u16, "vendor id"),
        device: r.parsed(&at("device"), parse::hex_u16, "device id"),
        subsys_vendor: r.parsed(&at("subsystem_vendor"), parse::hex_u16, "vendor id"),
        subsys_device: r.parsed(&at("subsystem_device"), parse::hex_u16, "device id"),
        numa: r
            .parsed(&at("numa_node"), parse::numa, "NUMA node")
            .flatten(),
        cpulist: r.text(&at("local_cpulist")).filter(|s| !s.is_empty()),
        link,
        port_type: None,
    };
    // Only bridges (or functions of unknown class) need their config read.
    if f.is_bridge_class() || f.class.is_none() {
        if let Some(cfg) = r.bytes(&at("config"), 4096) {
            f.port_type = port_type_from_config(&cfg);
        }
    }
    f
}

/// Host bridge and bridge chain from the real path.
fn chain_of(r: &mut Reader<'_>, bdf: PciAddr, real: &Path) -> (Option<String>, Vec<PciAddr>) {
    let names: Vec<String> = real
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let hb_at = names.iter().position(|n| parse::is_host_bridge_name(n));
    let start = hb_at.map_or(0, |i| i + 1);
    // Nested `pciDDDD:BB` components (Intel VMD domains) are skipped: the VMD endpoint above
    // them is kept as a bridge, so the whole domain stays under the outer host bridge.
    let mut chain: Vec<PciAddr> = names[start..]
        .iter()
        .filter_map(|n| parse::pci_name(n))
        .collect();
    if chain.last() == Some(&bdf) {
        chain.pop();
    } else {
        r.note(format!(
            "{}: real path does not end in {bdf}; its place in the PCI tree is a guess",
            real.display()
        ));
    }
    let hb = match hb_at {
        Some(i) => names[i].clone(),
        None => {
            let top = chain.first().copied().unwrap_or(bdf);
            r.note(format!(
                "{}: no pciDDDD:BB folder above {bdf}; host bridge assumed from its bus",
                real.display()
            ));
            format!("pci{:04x}:{:02x}", top.domain, top.bus)
        }
    };
    (Some(hb), chain)
}

/// Device/Port Type of the PCIe capability. `None` when `config` is too short to reach it
/// (an unprivileged read returns 64 bytes) or says something odd for a bridge.
pub(crate) fn port_type_from_config(cfg: &[u8]) -> Option<PortType> {
    let c = Config::new(cfg);
    match c.find_cap(CAP_ID_PCIE, "PCI Express") {
        Ok(cap) => match (c.u16_at(cap + 2).ok()? >> 4) & 0xf {
            4 => Some(PortType::RootPort),
            5 => Some(PortType::Upstream),
            6 => Some(PortType::Downstream),
            7 | 8 => Some(PortType::PciBridge),
            _ => None,
        },
        // No capability list, or the end of a fully readable one without a PCIe capability:
        // a conventional PCI bridge.
        Err(CfgError::NoCapability(_)) => Some(PortType::PciBridge),
        Err(CfgError::TooShort { .. } | CfgError::Malformed(_)) => None,
    }
}

/// Broadcom PEX generation for NCCL's switch flattening (`getBcmGen` in NCCL's topo.cc): a
/// Gen4/Gen5 PEX presents itself as two switch levels though it switches all ports at full
/// bandwidth. `level` 0 = the outer switch, 1 = the inner one.
fn bcm_gen(f: &PciFn, level: u16) -> Option<u32> {
    let (v, d, sv, sd) = (f.vendor?, f.device?, f.subsys_vendor?, f.subsys_device?);
    if v != 0x1000 || sv != 0x1000 {
        return None;
    }
    match d {
        0xc010 if sd & 0xf000 == 0xa000 => Some(4),
        0xc030 if sd & 0xf000 == level * 0x1000 => Some(5),
        _ => None,
    }
}

impl PciTree {
    fn port_type(&self, bdf: PciAddr, prev: Option<PortType>) -> PortType {
        let known = self.fns.get(&bdf).and_then(|f| f.port_type);
        known.unwrap_or(match prev {
            None => PortType::RootPort,
            Some(PortType::RootPort | PortType::Downstream) => PortType::Upstream,
            Some(PortType::Upstream) => PortType::Downstream,
            Some(PortType::PciBridge) => PortType::PciBridge,
        })
    }

    fn is_virtual(&self, bdf: PciAddr) -> bool {
        self.fns
            .get(&bdf)
            .and_then(|f| f.vendor)
            .is_some_and(|v| VIRTUAL_BRIDGE_VENDORS.contains(&v))
    }

    /// The switch whose upstream port is `up`, created below `parent` if new.
    fn switch_at(&mut self, up: PciAddr, parent: Option<SwitchId>) -> SwitchId {
        if let Some(&id) = self.by_upstream.get(&up) {
            return id;
        }
        let f = self.fns.get(&up);
        let sw = Switch {
            upstream: up,
            downstream: Vec::new(),
            vendor: f.and_then(|f| f.vendor),
            device_id: f.and_then(|f| f.device),
            link: f.map(|f| f.link).unwrap_or_default(),
            parent,
            is_virtual: self.is_virtual(up),
        };
        let id = SwitchId(self.switches.len());
        self.switches.push(sw);
        self.by_upstream.insert(up, id);
        id
    }

    /// True when the upstream port `up` is the inner level of the Broadcom PEX switch `outer`.
    fn fuses_into(&self, up: PciAddr, outer: SwitchId) -> bool {
        let Some(o) = self
            .switches
            .get(outer.0)
            .and_then(|s| self.fns.get(&s.upstream))
        else {
            return false;
        };
        let Some(i) = self.fns.get(&up) else {
            return false;
        };
        matches!((bcm_gen(o, 0), bcm_gen(i, 1)), (Some(a), Some(b)) if a == b)
    }

    /// Where `bdf` hangs: host bridge plus switches, outermost first. Creates the switches
    /// on its chain as needed. Functions not in the tree get an empty attachment.
    pub(crate) fn attach(&mut self, bdf: PciAddr) -> Attachment {
        let Some(f) = self.fns.get(&bdf) else {
            return Attachment::default();
        };
        let host_bridge = f.host_bridge.clone();
        let chain = f.chain.clone();
        let mut switches: Vec<SwitchId> = Vec::new();
        let mut prev: Option<PortType> = None;
        for b in chain {
            let t = self.port_type(b, prev);
            match t {
                PortType::RootPort => {}
                PortType::Upstream => match switches.last().copied() {
                    Some(outer) if self.fuses_into(b, outer) => {}
                    parent => switches.push(self.switch_at(b, parent)),
                },
                PortType::Downstream if prev == Some(PortType::Upstream) => {
                    if let Some(&sw) = switches.last() {
                        let virt = self.is_virtual(b);
                        let s = &mut self.switches[sw.0];
                        if !s.downstream.contains(&b) {
                            s.downstream.push(b);
                        }
                        s.is_virtual |= virt;
                    }
                }
                // A downstream port whose upstream port is hidden (some hypervisors show
                // only that), or a PCI bridge: one bridge crossed, counted as a switch.
                PortType::Downstream | PortType::PciBridge => {
                    let parent = switches.last().copied();
                    switches.push(self.switch_at(b, parent));
                }
            }
            prev = Some(t);
        }
        Attachment {
            host_bridge,
            switches,
        }
    }

    /// True when the tree holds function `bdf`.
    pub(crate) fn contains(&self, bdf: PciAddr) -> bool {
        self.fns.contains_key(&bdf)
    }
}

/// The nearest PCI function at or above `real` (a resolved in-root path): `eth0`'s `device`
/// may be a virtio or auxiliary device below the PCI function.
pub(crate) fn nearest_pci(real: &Path) -> Option<(PciAddr, PathBuf)> {
    let mut p = real.to_path_buf();
    loop {
        let name = p.file_name()?.to_string_lossy().into_owned();
        if let Some(bdf) = parse::pci_name(&name) {
            return Some((bdf, p));
        }
        if !p.pop() {
            return None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg_with(port_type: u8) -> Vec<u8> {
        let mut c = vec![0u8; 256];
        c[0x06] = 0x10;
        c[0x34] = 0x40;
        c[0x40] = 0x01; // power management first, to walk the list
        c[0x41] = 0x60;
        c[0x60] = 0x10;
        c[0x62] = 0x02 | (port_type << 4);
        c
    }

    #[test]
    fn port_types_from_config() {
        assert_eq!(
            port_type_from_config(&cfg_with(4)),
            Some(PortType::RootPort)
        );
        assert_eq!(
            port_type_from_config(&cfg_with(5)),
            Some(PortType::Upstream)
        );
        assert_eq!(
            port_type_from_config(&cfg_with(6)),
            Some(PortType::Downstream)
        );
        assert_eq!(
            port_type_from_config(&cfg_with(7)),
            Some(PortType::PciBridge)
        );
        assert_eq!(port_type_from_config(&cfg_with(0)), None);
        // Unprivileged read: 64 bytes, the list starts beyond them.
        assert_eq!(port_type_from_config(&cfg_with(5)[..64]), None);
        assert_eq!(port_type_from_config(&[0u8; 10]), None);
        // All-ones config (device gone): a looping list ends as unknown, not a hang.
        assert_eq!(port_type_from_config(&[0xffu8; 256]), None);
        // No capability list: conventional PCI bridge.
        let mut c = cfg_with(4);
        c[0x06] = 0;
        assert_eq!(port_type_from_config(&c), Some(PortType::PciBridge));
    }

    #[test]
    fn nearest_pci_walks_up() {
        let p = Path::new("sys/devices/pci0000:00/0000:00:03.0/virtio2");
        let (bdf, at) = nearest_pci(p).unwrap();
        assert_eq!(bdf.to_string(), "0000:00:03.0");
        assert_eq!(at, Path::new("sys/devices/pci0000:00/0000:00:03.0"));
        assert_eq!(nearest_pci(Path::new("sys/devices/virtual/net/lo")), None);
    }
}
