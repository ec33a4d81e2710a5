//! Synthetic sysfs/proc trees with the real layout, for tests here and in crates that read a
//! `--root` (doctor, cli). Enabled by the `fixture` cargo feature.
//!
//! Devices are created where the kernel puts them (`sys/devices/pci0000:00/0000:00:01.0/...`)
//! and reached through the same links (`sys/bus/pci/devices/*`, `sys/class/{net,infiniband}/*`,
//! `device`), so [`crate::from_root`] and [`crate::capture()`] see what they would see on a
//! machine. This is a test helper: every method **panics** on an I/O error or a malformed PCI
//! address, with the path in the message.
//!
//! ```
//! # use gdx_topo::fixture::SysfsFixture;
//! let dir = tempfile::tempdir().unwrap();
//! let mut f = SysfsFixture::new(dir.path());
//! let rp = f.root_port("0000:00", "0000:00:01.0", Some(0));
//! let sw = f.switch_below(&rp, "0000:01:00.0", &["0000:02:00.0", "0000:02:01.0"]);
//! f.gpu(&sw.downstream[0], "0000:03:00.0");
//! let nic = f.nic(&sw.downstream[1], "0000:04:00.0");
//! f.rdma(&nic, "mlx5_0", &[gdx_topo::fixture::RdmaPort::infiniband(1)]);
//! let topo = gdx_topo::from_root(dir.path()).unwrap();
//! assert_eq!(topo.class_between("GPU0", "NIC0").unwrap().to_string(), "PIX");
//! ```

// A test helper behind the `fixture` feature: it panics on purpose (see above).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::enrich::{NvmlSnapshot, SNAPSHOT_PATH};
use crate::model::PciAddr;
use crate::sysfs::rootfs::relative_path;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

mod config;
mod nvmeof;
pub use config::{
    ConfigSpace, DOWNSTREAM_PORT, ENDPOINT, PCIE_TO_PCI_BRIDGE, ROOT_PORT, UPSTREAM_PORT,
};
pub use nvmeof::NvmeofCtrl;

/// A place in the synthetic PCI tree: a host bridge or a PCI function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciNode {
    dir: PathBuf,
    bdf: Option<PciAddr>,
    numa: Option<u32>,
}

impl PciNode {
    /// The function's address (`None` for a host bridge).
    pub fn bdf(&self) -> Option<PciAddr> {
        self.bdf
    }

    /// Real folder, relative to the fixture root (`sys/devices/pci0000:00/...`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// NUMA node that functions created below inherit.
    pub fn numa(&self) -> Option<u32> {
        self.numa
    }
}

/// The ports of a switch made by [`SysfsFixture::switch_below`].
#[derive(Debug, Clone)]
pub struct SwitchPorts {
    /// The upstream port.
    pub upstream: PciNode,
    /// The downstream ports, in the order given.
    pub downstream: Vec<PciNode>,
}

/// One GID table entry of an [`RdmaPort`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidEntry {
    /// Table index.
    pub index: u32,
    /// GID text as sysfs prints it.
    pub gid: String,
    /// `gid_attrs/types/<index>` (`IB/RoCE v1`, `RoCE v2`), or no file.
    pub gid_type: Option<String>,
    /// `gid_attrs/ndevs/<index>`, or no file.
    pub ndev: Option<String>,
}

/// One port of a synthetic RDMA device.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RdmaPort {
    /// Port number (1-based).
    pub port: u32,
    /// `state`, e.g. `4: ACTIVE`.
    pub state: String,
    /// `phys_state`, e.g. `5: LinkUp`.
    pub phys_state: String,
    /// `link_layer`: `InfiniBand` or `Ethernet`.
    pub link_layer: String,
    /// `rate`, e.g. `400 Gb/sec (4X NDR)`.
    pub rate: String,
    /// Used GID entries; the slots between them are written as all-zero GIDs.
    pub gids: Vec<GidEntry>,
}

impl RdmaPort {
    /// An active 400 Gb/s InfiniBand port with one link-local GID.
    pub fn infiniband(port: u32) -> RdmaPort {
        RdmaPort {
            port,
            state: "4: ACTIVE".into(),
            phys_state: "5: LinkUp".into(),
            link_layer: "InfiniBand".into(),
            rate: "400 Gb/sec (4X NDR)".into(),
            gids: vec![GidEntry {
                index: 0,
                gid: "fe80:0000:0000:0000:a088:c203:0001:0001".into(),
                gid_type: Some("IB/RoCE v1".into()),
                ndev: None,
            }],
        }
    }

    /// An active 200 Gb/s RoCE port on `netdev` with the usual layout: link-local GIDs at
    /// 0 (v1) and 1 (v2), the IPv4-mapped address at 2 (v1) and 3 (v2).
    pub fn roce(port: u32, netdev: &str, ipv4: [u8; 4]) -> RdmaPort {
        let ll = "fe80:0000:0000:0000:0a00:27ff:fe00:0001".to_string();
        let v4 = format!(
            "0000:0000:0000:0000:0000:ffff:{:02x}{:02x}:{:02x}{:02x}",
            ipv4[0], ipv4[1], ipv4[2], ipv4[3]
        );
        let gid = |index: u32, gid: &str, t: &str| GidEntry {
            index,
            gid: gid.to_string(),
            gid_type: Some(t.to_string()),
            ndev: Some(netdev.to_string()),
        };
        RdmaPort {
            port,
            state: "4: ACTIVE".into(),
            phys_state: "5: LinkUp".into(),
            link_layer: "Ethernet".into(),
            rate: "200 Gb/sec (4X HDR)".into(),
            gids: vec![
                gid(0, &ll, "IB/RoCE v1"),
                gid(1, &ll, "RoCE v2"),
                gid(2, &v4, "IB/RoCE v1"),
                gid(3, &v4, "RoCE v2"),
            ],
        }
    }

    /// The same port, link down.
    pub fn down(mut self) -> RdmaPort {
        self.state = "1: DOWN".into();
        self.phys_state = "3: Disabled".into();
        self
    }
}

/// Writes a synthetic machine under a folder. See the module docs for an example.
#[derive(Debug, Clone)]
pub struct SysfsFixture {
    root: PathBuf,
    full_config: bool,
    absolute_links: bool,
    cpus: BTreeMap<u32, String>,
}

fn addr(bdf: &str) -> PciAddr {
    bdf.parse()
        .unwrap_or_else(|e| panic!("fixture: bad PCI address: {e}"))
}

fn gts(speed: f64) -> String {
    format!("{speed:.1} GT/s PCIe")
}

impl SysfsFixture {
    /// Start a tree under `root` (created if missing) with empty `sys/bus/pci/devices`.
    pub fn new(root: impl Into<PathBuf>) -> SysfsFixture {
        let f = SysfsFixture {
            root: root.into(),
            full_config: false,
            absolute_links: false,
            cpus: BTreeMap::new(),
        };
        f.mkdir(Path::new("sys/bus/pci/devices"));
        f.mkdir(Path::new("sys/devices/system/node"));
        f.mkdir(Path::new("proc"));
        f
    }

    /// The folder the tree is written in (pass it to `from_root`).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Write full 4 KiB `config` files with a PCIe capability (what root reads) for functions
    /// created from now on. Off by default: `config` is the 64-byte header an unprivileged
    /// read returns, so port types must be inferred from the tree's shape.
    pub fn full_config(&mut self, on: bool) -> &mut Self {
        self.full_config = on;
        self
    }

    /// Make `sys/bus/pci/devices/*` links absolute (`/sys/devices/...`) for functions created
    /// from now on, as a careless copy of a machine would.
    pub fn absolute_links(&mut self, on: bool) -> &mut Self {
        self.absolute_links = on;
        self
    }

    fn mkdir(&self, rel: &Path) {
        let p = self.root.join(rel);
        std::fs::create_dir_all(&p)
            .unwrap_or_else(|e| panic!("fixture: cannot create {}: {e}", p.display()));
    }

    /// Write a file (parents created), e.g. `f.file("proc/cmdline", "iommu=pt\n")`.
    pub fn file(&mut self, rel: impl AsRef<Path>, contents: impl AsRef<[u8]>) -> &mut Self {
        let rel = rel.as_ref();
        if let Some(parent) = rel.parent() {
            self.mkdir(parent);
        }
        let p = self.root.join(rel);
        std::fs::write(&p, contents)
            .unwrap_or_else(|e| panic!("fixture: cannot write {}: {e}", p.display()));
        self
    }

    /// Create a symlink at `rel` pointing to `target` (written as given).
    pub fn symlink(&mut self, rel: impl AsRef<Path>, target: impl AsRef<Path>) -> &mut Self {
        let rel = rel.as_ref();
        if let Some(parent) = rel.parent() {
            self.mkdir(parent);
        }
        let p = self.root.join(rel);
        let _ = std::fs::remove_file(&p);
        std::os::unix::fs::symlink(target.as_ref(), &p)
            .unwrap_or_else(|e| panic!("fixture: cannot link {}: {e}", p.display()));
        self
    }

    /// A relative symlink at `rel` to the in-root path `to`, as the kernel writes them.
    fn link_to(&mut self, rel: &Path, to: &Path) {
        let from = rel.parent().unwrap_or(Path::new(""));
        let target = relative_path(from, to);
        self.symlink(rel, target);
    }

    /// Write `attr` of a function (`f.set(&gpu, "numa_node", "-1")`); a newline is added.
    pub fn set(&mut self, node: &PciNode, attr: &str, value: impl std::fmt::Display) -> &mut Self {
        let rel = node.dir.join(attr);
        self.file(rel, format!("{value}\n"))
    }

    /// Set a function's current and maximum link as (GT/s, lanes).
    pub fn link(&mut self, node: &PciNode, current: (f64, u32), max: (f64, u32)) -> &mut Self {
        self.set(node, "current_link_speed", gts(current.0))
            .set(node, "current_link_width", current.1)
            .set(node, "max_link_speed", gts(max.0))
            .set(node, "max_link_width", max.1)
    }

    /// Replace a function's `config` bytes (see [`ConfigSpace`]).
    pub fn config(&mut self, node: &PciNode, bytes: &[u8]) -> &mut Self {
        let rel = node.dir.join("config");
        self.file(rel, bytes)
    }

    /// Register NUMA node `id` with its CPU list (`sys/devices/system/node/node<id>/cpulist`);
    /// functions created later on that node get it as `local_cpulist`.
    pub fn numa_node(&mut self, id: u32, cpus: &str) -> &mut Self {
        self.cpus.insert(id, cpus.to_string());
        self.file(
            format!("sys/devices/system/node/node{id}/cpulist"),
            format!("{cpus}\n"),
        )
    }

    /// The root bus `DDDD:BB` of a host bridge (`sys/devices/pciDDDD:BB`); functions placed
    /// directly on it (a flattened VM) use the returned node as parent.
    pub fn host_bridge(&mut self, bus: &str, numa: Option<u32>) -> PciNode {
        let dir = PathBuf::from(format!("sys/devices/pci{bus}"));
        self.mkdir(&dir);
        PciNode {
            dir,
            bdf: None,
            numa,
        }
    }

    /// A root port on host bridge `bus` (created if needed).
    pub fn root_port(&mut self, bus: &str, bdf: &str, numa: Option<u32>) -> PciNode {
        let hb = self.host_bridge(bus, numa);
        self.bridge(&hb, bdf, ROOT_PORT, 0x8086, 0x352a)
    }

    /// A PCIe switch below `parent` (PLX/Broadcom ids 10b5:c010): its upstream port and
    /// downstream ports.
    pub fn switch_below(
        &mut self,
        parent: &PciNode,
        upstream: &str,
        downstream: &[&str],
    ) -> SwitchPorts {
        let up = self.bridge(parent, upstream, UPSTREAM_PORT, 0x10b5, 0xc010);
        let downstream = downstream
            .iter()
            .map(|d| self.bridge(&up, d, DOWNSTREAM_PORT, 0x10b5, 0xc010))
            .collect();
        SwitchPorts {
            upstream: up,
            downstream,
        }
    }

    /// A PCI bridge (class 0x060400) of the given PCIe port type below `parent`.
    pub fn bridge(
        &mut self,
        parent: &PciNode,
        bdf: &str,
        port_type: u8,
        vendor: u16,
        device: u16,
    ) -> PciNode {
        self.function(parent, bdf, 0x060400, vendor, device, port_type)
    }

    /// An NVIDIA H200-like GPU (10de:2335, class 0x030200, Gen5 x16).
    pub fn gpu(&mut self, parent: &PciNode, bdf: &str) -> PciNode {
        self.function(parent, bdf, 0x030200, 0x10de, 0x2335, ENDPOINT)
    }

    /// A ConnectX-7-like NIC function (15b3:1021, class 0x020000, Gen5 x16). Add
    /// [`SysfsFixture::rdma`] and/or [`SysfsFixture::netdev`] to make it a NIC.
    pub fn nic(&mut self, parent: &PciNode, bdf: &str) -> PciNode {
        self.function(parent, bdf, 0x020000, 0x15b3, 0x1021, ENDPOINT)
    }

    /// An NVMe controller (144d:a824, class 0x010802).
    pub fn nvme(&mut self, parent: &PciNode, bdf: &str) -> PciNode {
        self.function(parent, bdf, 0x010802, 0x144d, 0xa824, ENDPOINT)
    }

    /// Any PCI function below `parent`, with the attribute files sysfs has: ids, NUMA node
    /// (inherited from `parent`; `-1` when unknown), `local_cpulist`, a Gen5 x16 link and
    /// `config`; linked from `sys/bus/pci/devices`.
    pub fn function(
        &mut self,
        parent: &PciNode,
        bdf: &str,
        class: u32,
        vendor: u16,
        device: u16,
        port_type: u8,
    ) -> PciNode {
        let a = addr(bdf);
        let node = PciNode {
            dir: parent.dir.join(a.to_string()),
            bdf: Some(a),
            numa: parent.numa,
        };
        self.mkdir(&node.dir);
        let numa = node.numa.map_or("-1".to_string(), |n| n.to_string());
        let cpus = node
            .numa
            .and_then(|n| self.cpus.get(&n).cloned())
            .unwrap_or_else(|| "0-31".to_string());
        self.set(&node, "class", format!("0x{class:06x}"))
            .set(&node, "vendor", format!("0x{vendor:04x}"))
            .set(&node, "device", format!("0x{device:04x}"))
            .set(&node, "subsystem_vendor", format!("0x{vendor:04x}"))
            .set(&node, "subsystem_device", "0x0000")
            .set(&node, "numa_node", numa)
            .set(&node, "local_cpulist", cpus)
            .link(&node, (32.0, 16), (32.0, 16));
        let cfg = ConfigSpace::new(vendor, device, class).pcie(port_type);
        let cfg = if self.full_config {
            cfg
        } else {
            cfg.truncated(64)
        };
        self.config(&node, cfg.as_bytes());
        let bus_link = PathBuf::from("sys/bus/pci/devices").join(a.to_string());
        if self.absolute_links {
            let target = Path::new("/").join(&node.dir);
            self.symlink(&bus_link, target);
        } else {
            self.link_to(&bus_link, &node.dir);
        }
        node
    }

    /// Bind a function to a driver: `driver` → `sys/bus/pci/drivers/<name>`.
    pub fn driver(&mut self, node: &PciNode, name: &str) -> &mut Self {
        let drv = PathBuf::from("sys/bus/pci/drivers").join(name);
        self.mkdir(&drv);
        self.link_to(&node.dir.join("driver"), &drv);
        self
    }

    /// Put a function in IOMMU group `group` of domain `kind` (`identity`, `DMA`, `DMA-FQ`):
    /// `sys/kernel/iommu_groups/<group>/{type,devices/<bdf>}` and the function's
    /// `iommu_group` link.
    pub fn iommu_group(&mut self, node: &PciNode, group: u32, kind: &str) -> &mut Self {
        let g = PathBuf::from(format!("sys/kernel/iommu_groups/{group}"));
        self.file(g.join("type"), format!("{kind}\n"));
        self.mkdir(&g.join("devices"));
        if let Some(bdf) = node.bdf {
            self.link_to(&g.join("devices").join(bdf.to_string()), &node.dir);
        }
        self.link_to(&node.dir.join("iommu_group"), &g);
        self
    }

    /// Make `nic` an RDMA device `name` (`sys/class/infiniband/<name>`) with these ports.
    pub fn rdma(&mut self, nic: &PciNode, name: &str, ports: &[RdmaPort]) -> &mut Self {
        let real = nic.dir.join("infiniband").join(name);
        self.mkdir(&real);
        self.link_to(&real.join("device"), &nic.dir);
        self.file(real.join("node_type"), "1: CA\n");
        self.file(real.join("fw_ver"), "28.39.1002\n");
        self.rdma_ports(&real, ports);
        self.link_to(&PathBuf::from("sys/class/infiniband").join(name), &real);
        self
    }

    /// A software RDMA device (Soft-RoCE): `sys/devices/virtual/infiniband/<name>` with no
    /// `device` link, its netdev in `parent`, as the kernel's rxe lays it out.
    pub fn software_rdma(&mut self, name: &str, netdev: &str, ports: &[RdmaPort]) -> &mut Self {
        let real = PathBuf::from("sys/devices/virtual/infiniband").join(name);
        self.mkdir(&real);
        self.file(real.join("node_type"), "1: CA\n");
        self.file(real.join("parent"), format!("{netdev}\n"));
        self.rdma_ports(&real, ports);
        self.link_to(&PathBuf::from("sys/class/infiniband").join(name), &real);
        self
    }

    fn rdma_ports(&mut self, real: &Path, ports: &[RdmaPort]) {
        for p in ports {
            let pd = real.join("ports").join(p.port.to_string());
            self.file(pd.join("state"), format!("{}\n", p.state));
            self.file(pd.join("phys_state"), format!("{}\n", p.phys_state));
            self.file(pd.join("link_layer"), format!("{}\n", p.link_layer));
            self.file(pd.join("rate"), format!("{}\n", p.rate));
            let slots = p.gids.iter().map(|g| g.index + 2).max().unwrap_or(2);
            for i in 0..slots {
                let g = p.gids.iter().find(|g| g.index == i);
                let text = g.map_or("0000:0000:0000:0000:0000:0000:0000:0000", |g| &g.gid);
                self.file(pd.join("gids").join(i.to_string()), format!("{text}\n"));
                if let Some(t) = g.and_then(|g| g.gid_type.as_ref()) {
                    self.file(
                        pd.join("gid_attrs/types").join(i.to_string()),
                        format!("{t}\n"),
                    );
                }
                if let Some(n) = g.and_then(|g| g.ndev.as_ref()) {
                    self.file(
                        pd.join("gid_attrs/ndevs").join(i.to_string()),
                        format!("{n}\n"),
                    );
                }
            }
        }
    }

    /// A network interface on `nic` (`sys/class/net/<ifname>`, `device` link, `speed` in Mb/s
    /// or `-1`, `mtu`, `operstate`, `address`).
    pub fn netdev(&mut self, nic: &PciNode, ifname: &str, speed_mbps: Option<u64>) -> &mut Self {
        let real = nic.dir.join("net").join(ifname);
        self.mkdir(&real);
        self.link_to(&real.join("device"), &nic.dir);
        self.net_files(&real, speed_mbps);
        self.link_to(&PathBuf::from("sys/class/net").join(ifname), &real);
        self
    }

    /// A software interface with no `device` link (`lo`, a bridge, a veth).
    pub fn virtual_netdev(&mut self, ifname: &str) -> &mut Self {
        let real = PathBuf::from("sys/devices/virtual/net").join(ifname);
        self.mkdir(&real);
        self.net_files(&real, None);
        self.link_to(&PathBuf::from("sys/class/net").join(ifname), &real);
        self
    }

    fn net_files(&mut self, real: &Path, speed_mbps: Option<u64>) {
        let speed = speed_mbps.map_or("-1".to_string(), |s| s.to_string());
        self.file(real.join("speed"), format!("{speed}\n"));
        self.file(real.join("mtu"), "9000\n");
        self.file(real.join("operstate"), "up\n");
        self.file(real.join("address"), "0a:00:27:00:00:01\n");
    }

    /// `proc/driver/nvidia/gpus/<bdf>/information` with this model name.
    pub fn nvidia_gpu_info(&mut self, gpu: &PciNode, model: &str) -> &mut Self {
        let bdf = gpu.bdf.map(|b| b.to_string()).unwrap_or_default();
        self.file(
            format!("proc/driver/nvidia/gpus/{bdf}/information"),
            format!("Model: \t\t {model}\nIRQ:   \t\t 42\nBus Type: \t PCIe\nDevice Minor: \t 0\n"),
        )
    }

    /// A loaded kernel module: `sys/module/<name>/{version,refcnt,parameters/*}`.
    pub fn module(
        &mut self,
        name: &str,
        version: Option<&str>,
        params: &[(&str, &str)],
    ) -> &mut Self {
        let m = PathBuf::from("sys/module").join(name);
        self.file(m.join("refcnt"), "1\n");
        if let Some(v) = version {
            self.file(m.join("version"), format!("{v}\n"));
        }
        for (k, v) in params {
            self.file(m.join("parameters").join(k), format!("{v}\n"));
        }
        self
    }

    /// Write `gdx/nvml.json` (what a capture stores to keep NVLinks and NVML facts).
    pub fn nvml(&mut self, snap: &NvmlSnapshot) -> &mut Self {
        let text = serde_json::to_string_pretty(snap)
            .unwrap_or_else(|e| panic!("fixture: cannot encode snapshot: {e}"));
        self.file(SNAPSHOT_PATH, text)
    }
}

/// The real NCCL topology files (`crates/topo/tests/data/topologies`, copied from public
/// repositories; `SOURCES.md` there names each one's origin), found at run time from the test
/// crate's folder (`CARGO_MANIFEST_DIR`, which cargo sets for the test process) or the working
/// directory upwards, never from a build-time path. Panics when they are not there (they are
/// committed with this crate).
pub fn reference_topologies() -> std::path::PathBuf {
    const REL: &str = "crates/topo/tests/data/topologies";
    let starts = [
        std::env::var_os("CARGO_MANIFEST_DIR").map(std::path::PathBuf::from),
        std::env::current_dir().ok(),
    ];
    starts
        .iter()
        .flatten()
        .find_map(|start| start.ancestors().map(|a| a.join(REL)).find(|p| p.is_dir()))
        .unwrap_or_else(|| panic!("fixture {REL} not found above {starts:?}"))
}

/// The real 2× H200 capture (`crates/topo/tests/data/h200x2-capture.tar.gz`, a Firecracker VM
/// with a flat PCI bus and 18 NVLinks per GPU), found at run time like
/// [`reference_topologies`]: from `CARGO_MANIFEST_DIR` or the working directory upwards.
/// Panics when it is not there (it is committed with this crate).
pub fn h200x2_capture() -> std::path::PathBuf {
    const REL: &str = "crates/topo/tests/data/h200x2-capture.tar.gz";
    let starts = [
        std::env::var_os("CARGO_MANIFEST_DIR").map(std::path::PathBuf::from),
        std::env::current_dir().ok(),
    ];
    starts
        .iter()
        .flatten()
        .find_map(|start| start.ancestors().map(|a| a.join(REL)).find(|p| p.is_file()))
        .unwrap_or_else(|| panic!("fixture {REL} not found above {starts:?}"))
}
