//! NICs: RDMA devices from `sys/class/infiniband/*` and network interfaces from
//! `sys/class/net/*`, each tied to a PCI function through its `device` link.
//!
//! A PCI function becomes a NIC when it carries an RDMA device, or when it is a network
//! controller (class 0x02) with a kernel interface on it. Interfaces without a `device` link
//! (`lo`, veth, bridges) are not hardware and are ignored; a `device` link that ends below the
//! PCI function (virtio, auxiliary devices) counts for the nearest PCI function above it.

use super::parse;
use super::pci::{nearest_pci, read_fn, PciTree};
use super::Reader;
use crate::model::{natural_cmp, Gid, NicInfo, NicPort, PciAddr};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// NIC facts per PCI function, and the software RDMA devices (no PCI function) by name.
pub(crate) fn scan(
    r: &mut Reader<'_>,
    tree: &mut PciTree,
) -> (BTreeMap<PciAddr, NicInfo>, Vec<NicInfo>) {
    let mut nics: BTreeMap<PciAddr, NicInfo> = BTreeMap::new();
    let software = scan_rdma(r, tree, &mut nics);
    scan_net(r, tree, &mut nics);
    mark_efa(r, tree, &mut nics);
    for n in nics.values_mut() {
        n.netdevs.sort_by(|a, b| natural_cmp(a, b));
        n.netdevs.dedup();
    }
    (nics, software)
}

/// Names in a class folder; a missing folder (no RDMA stack) is simply empty.
fn class_members(r: &mut Reader<'_>, dir: &Path) -> Vec<String> {
    match r.fs.list(dir) {
        Ok(n) => n,
        Err(super::rootfs::ReadError::Missing) => Vec::new(),
        Err(e) => {
            r.note(format!("{}: cannot list: {}", dir.display(), e.why()));
            Vec::new()
        }
    }
}

/// The PCI function behind a class member's `device` link, read into the tree if
/// `sys/bus/pci/devices` did not list it. `None` when there is no link or no PCI above it.
fn pci_of(r: &mut Reader<'_>, tree: &mut PciTree, real: &Path) -> Option<PciAddr> {
    let dev = r.fs.resolve_from(real, Path::new("device"))?;
    let (bdf, pci_real) = nearest_pci(&dev)?;
    if !tree.contains(bdf) {
        r.note(format!(
            "{}: PCI function {bdf} is not listed under sys/bus/pci/devices; read from {}",
            real.display(),
            pci_real.display()
        ));
        let f = read_fn(r, bdf, &pci_real);
        tree.fns.insert(bdf, f);
    }
    Some(bdf)
}

/// RDMA devices onto their PCI functions; returns the software ones (rxe, siw), which have
/// none and are NICs all the same: a machine with only Soft-RoCE still has an RDMA path.
fn scan_rdma(
    r: &mut Reader<'_>,
    tree: &mut PciTree,
    nics: &mut BTreeMap<PciAddr, NicInfo>,
) -> Vec<NicInfo> {
    let dir = Path::new("sys/class/infiniband");
    let mut software = Vec::new();
    for name in class_members(r, dir) {
        let link = dir.join(&name);
        let Some(real) = r.fs.resolve(&link) else {
            r.note(format!("{}: dangling link, ignored", link.display()));
            continue;
        };
        let Some(bdf) = pci_of(r, tree, &real) else {
            let ports = read_ports(r, &real);
            // rxe names its netdev in `parent`; otherwise the GIDs say which netdev they are on.
            let mut netdevs: Vec<String> = r
                .text(&real.join("parent"))
                .filter(|s| !s.is_empty())
                .into_iter()
                .collect();
            if netdevs.is_empty() {
                netdevs = ports
                    .iter()
                    .flat_map(|p| p.gids.iter().filter_map(|g| g.ndev.clone()))
                    .collect();
                netdevs.sort_by(|a, b| natural_cmp(a, b));
                netdevs.dedup();
            }
            software.push(NicInfo {
                rdma_name: Some(name),
                netdevs,
                ports,
                software: true,
                ..NicInfo::default()
            });
            continue;
        };
        let ports = read_ports(r, &real);
        let entry = nics.entry(bdf).or_default();
        if let Some(first) = &entry.rdma_name {
            let first = first.clone();
            r.note(format!(
                "PCI function {bdf} carries RDMA devices {first} and {name}; keeping {first}"
            ));
            continue;
        }
        entry.rdma_name = Some(name);
        entry.ports = ports;
    }
    software
}

fn read_ports(r: &mut Reader<'_>, real: &Path) -> Vec<NicPort> {
    let dir = real.join("ports");
    let mut nums: Vec<u32> = class_members(r, &dir)
        .iter()
        .filter_map(|n| n.parse().ok())
        .collect();
    nums.sort_unstable();
    nums.into_iter()
        .map(|n| {
            let p = dir.join(n.to_string());
            let rate = r.text(&p.join("rate")).filter(|s| !s.is_empty());
            let rate_gbps = rate.as_deref().and_then(|t| {
                let v = parse::ib_rate_gbps(t);
                if v.is_none() {
                    r.note(format!(
                        "{}: unexpected rate {t:?}",
                        p.join("rate").display()
                    ));
                }
                v
            });
            NicPort {
                port: n,
                state: r.text(&p.join("state")).filter(|s| !s.is_empty()),
                phys_state: r.text(&p.join("phys_state")).filter(|s| !s.is_empty()),
                link_layer: r.text(&p.join("link_layer")).filter(|s| !s.is_empty()),
                rate,
                rate_gbps,
                gids: read_gids(r, &p),
            }
        })
        .collect()
}

/// Non-empty GID table entries of one port, with their type and netdev when readable.
fn read_gids(r: &mut Reader<'_>, port: &Path) -> Vec<Gid> {
    let dir = port.join("gids");
    let mut idx: Vec<u32> = class_members(r, &dir)
        .iter()
        .filter_map(|n| n.parse().ok())
        .collect();
    idx.sort_unstable();
    let mut out = Vec::new();
    for i in idx {
        let Some(gid) = r.text(&dir.join(i.to_string())) else {
            continue;
        };
        if gid.is_empty() || parse::gid_is_zero(&gid) {
            continue;
        }
        let attr = |r: &mut Reader<'_>, kind: &str| -> Option<String> {
            let p: PathBuf = port.join("gid_attrs").join(kind).join(i.to_string());
            r.text(&p).filter(|s| !s.is_empty())
        };
        out.push(Gid {
            index: i,
            gid,
            gid_type: attr(r, "types"),
            ndev: attr(r, "ndevs"),
        });
    }
    out
}

fn scan_net(r: &mut Reader<'_>, tree: &mut PciTree, nics: &mut BTreeMap<PciAddr, NicInfo>) {
    let dir = Path::new("sys/class/net");
    for ifname in class_members(r, dir) {
        let link = dir.join(&ifname);
        let Some(real) = r.fs.resolve(&link) else {
            r.note(format!("{}: dangling link, ignored", link.display()));
            continue;
        };
        let Some(bdf) = pci_of(r, tree, &real) else {
            continue;
        };
        let is_net_class = tree
            .fns
            .get(&bdf)
            .and_then(|f| f.class)
            .is_some_and(|c| c >> 16 == 0x02);
        // A USB or other non-network function above an interface is not a NIC we can place.
        if !is_net_class && !nics.contains_key(&bdf) {
            continue;
        }
        let speed = r
            .parsed(&real.join("speed"), parse::net_speed, "link speed")
            .flatten();
        let entry = nics.entry(bdf).or_default();
        entry.netdevs.push(ifname);
        entry.speed_mbps = entry.speed_mbps.max(speed);
    }
}

/// Amazon's PCI vendor id.
pub(crate) const VENDOR_AMAZON: u16 = 0x1d0f;
/// Device ids of EFA functions (the kernel's `efa` driver table: efa0 .. efa3).
pub(crate) const EFA_DEVICE_IDS: [u16; 4] = [0xefa0, 0xefa1, 0xefa2, 0xefa3];

/// Whether a function is an EFA: bound to the `efa` driver, Amazon's vendor id with an EFA
/// device id, or an RDMA device named like one (`efa_0`; newer kernels name EFAs
/// `rdmap<bus>s<slot>`, hence the ids and driver).
pub fn is_efa(
    vendor: Option<u16>,
    device: Option<u16>,
    driver: Option<&str>,
    rdma: Option<&str>,
) -> bool {
    driver == Some("efa")
        || (vendor == Some(VENDOR_AMAZON) && device.is_some_and(|d| EFA_DEVICE_IDS.contains(&d)))
        || rdma.is_some_and(|n| n.contains("efa"))
}

/// The driver a PCI function is bound to (the last component of its `driver` link).
fn driver_of(r: &Reader<'_>, bdf: PciAddr) -> Option<String> {
    let link = Path::new(&super::devices::dev_dir(bdf)).join("driver");
    let real = r.fs.resolve(&link)?;
    Some(real.file_name()?.to_string_lossy().into_owned())
}

/// Marks EFA NICs. An EFA function without an RDMA device (its driver not loaded) and without
/// a netdev (EFAs have none) is still a NIC here, so `gdx topo` shows it is there.
fn mark_efa(r: &mut Reader<'_>, tree: &PciTree, nics: &mut BTreeMap<PciAddr, NicInfo>) {
    for (bdf, f) in &tree.fns {
        let driver = driver_of(r, *bdf);
        let rdma = nics.get(bdf).and_then(|n| n.rdma_name.clone());
        if !is_efa(f.vendor, f.device, driver.as_deref(), rdma.as_deref()) {
            continue;
        }
        let entry = nics.entry(*bdf).or_default();
        entry.efa = true;
        if entry.rdma_name.is_none() {
            r.note(format!(
                "EFA {bdf} has no RDMA device (is the efa kernel module loaded?)"
            ));
        }
    }
}
