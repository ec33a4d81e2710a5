//! The sysfs PCI facts the checks read directly: the device list with vendor and class, the
//! chain of bridges above a device (from the `sys/bus/pci/devices/<bdf>` symlink), link
//! speed/width, NUMA node, and the RDMA devices of `sys/class/infiniband`.
//!
//! The doctor reads these rather than take them from the [`crate::Topology`] because its
//! checks need the raw values and file names as evidence, and because they must work even
//! when the topology could not be built. They live here, beside the topology's own scan, so
//! that every crate reads `sys/bus/pci` and `sys/class/infiniband` through one layer.

use super::files::FileError;
use super::parse;
use super::rootfs::RootFs;
use crate::model::{Link, PciAddr};

/// PCI vendor id of NVIDIA.
pub const VENDOR_NVIDIA: u16 = 0x10de;

/// The folder of a PCI function, relative to the root.
pub fn dev_dir(bdf: PciAddr) -> String {
    format!("sys/bus/pci/devices/{bdf}")
}

/// The link to a block device's folder, relative to the root (`sys/dev/block/259:0`).
pub fn block_dev(major: u32, minor: u32) -> String {
    format!("sys/dev/block/{major}:{minor}")
}

/// One PCI function from `sys/bus/pci/devices`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciFn {
    /// Address.
    pub bdf: PciAddr,
    /// `vendor`.
    pub vendor: Option<u16>,
    /// `device`.
    pub device: Option<u16>,
    /// `class` (24 bits).
    pub class: Option<u32>,
}

impl PciFn {
    /// An NVIDIA display/3D controller.
    pub fn is_nvidia_gpu(&self) -> bool {
        self.vendor == Some(VENDOR_NVIDIA) && self.class.is_some_and(|c| c >> 16 == 0x03)
    }

    /// An NVIDIA NVSwitch (bridge class "other", 0x0680).
    pub fn is_nvswitch(&self) -> bool {
        self.vendor == Some(VENDOR_NVIDIA) && self.class.is_some_and(|c| c >> 8 == 0x0680)
    }

    /// A PCI-to-PCI bridge (class 0x0604).
    pub fn is_bridge(&self) -> bool {
        self.class.is_some_and(|c| c >> 8 == 0x0604)
    }
}

fn hex_u32(s: &str) -> Option<u32> {
    super::parse::hex_u32(s)
}

/// Read one function's ids.
pub fn read_fn(fs: &RootFs, bdf: PciAddr) -> PciFn {
    let dir = dev_dir(bdf);
    let read = |f: &str| fs.text(&format!("{dir}/{f}")).and_then(|s| hex_u32(&s));
    PciFn {
        bdf,
        vendor: read("vendor").and_then(|v| u16::try_from(v).ok()),
        device: read("device").and_then(|v| u16::try_from(v).ok()),
        class: read("class"),
    }
}

/// Every PCI function under `sys/bus/pci/devices`, in address order. Entries whose name is
/// not a PCI address are ignored.
pub fn scan(fs: &RootFs) -> Result<Vec<PciFn>, FileError> {
    let mut out: Vec<PciFn> = fs
        .names("sys/bus/pci/devices")?
        .iter()
        .filter_map(|n| n.parse::<PciAddr>().ok())
        .map(|bdf| read_fn(fs, bdf))
        .collect();
    out.sort_by_key(|f| f.bdf);
    Ok(out)
}

/// Where a device hangs: its host bridge and the bridges from the root port down to (not
/// including) the device itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    /// `pci0000:00`.
    pub host_bridge: String,
    /// Bridges, outermost first.
    pub bridges: Vec<PciAddr>,
}

/// Why the bridges above a device are unknown.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    /// `sys/bus/pci/devices/<bdf>` does not resolve inside the root.
    #[error("{shown} does not resolve into sys/devices, so the bridges above it are unknown")]
    Unresolved {
        /// The device.
        bdf: PciAddr,
        /// The link as shown to the user.
        shown: String,
    },
    /// The real path has no host bridge folder.
    #[error("{shown}: no pciDDDD:BB component in its path")]
    NoHostBridge {
        /// The device.
        bdf: PciAddr,
        /// The link as shown to the user.
        shown: String,
    },
    /// The real path does not end in the device's own folder.
    #[error("{shown}: resolves to {real}, which does not end in the device")]
    NotTheDevice {
        /// The link as shown to the user.
        shown: String,
        /// Where it resolves, relative to the root.
        real: String,
    },
}

/// The chain above a device, from the realpath of `sys/bus/pci/devices/<bdf>`
/// (`sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/...`).
///
/// # Errors
/// [`ChainError`] when the link does not resolve to the device's folder below a host bridge.
pub fn chain(fs: &RootFs, bdf: PciAddr) -> Result<Chain, ChainError> {
    let rel = dev_dir(bdf);
    let shown = || fs.show(&rel);
    let real = fs
        .canonical_rel(&rel)
        .ok_or_else(|| ChainError::Unresolved {
            bdf,
            shown: shown(),
        })?;
    let mut comps = real
        .components()
        .filter_map(|c| c.as_os_str().to_str())
        .skip_while(|c| !c.starts_with("pci"));
    let host_bridge = comps
        .next()
        .ok_or_else(|| ChainError::NoHostBridge {
            bdf,
            shown: shown(),
        })?
        .to_string();
    let mut addrs: Vec<PciAddr> = comps.filter_map(|c| c.parse().ok()).collect();
    if addrs.last() != Some(&bdf) {
        return Err(ChainError::NotTheDevice {
            shown: shown(),
            real: real.display().to_string(),
        });
    }
    addrs.pop();
    Ok(Chain {
        host_bridge,
        bridges: addrs,
    })
}

/// The bridges that sit between two devices: those of each chain below their deepest common
/// bridge (the ports whose ACS settings can redirect traffic between them). Both chains must
/// be known.
pub fn bridges_between(a: &Chain, b: &Chain) -> Vec<PciAddr> {
    let common = if a.host_bridge == b.host_bridge {
        a.bridges
            .iter()
            .zip(&b.bridges)
            .take_while(|(x, y)| x == y)
            .count()
    } else {
        0
    };
    let mut out: Vec<PciAddr> = a.bridges[common..]
        .iter()
        .chain(&b.bridges[common..])
        .copied()
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Raw and parsed link values of a device.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LinkRead {
    /// Current link.
    pub current: Link,
    /// Maximum link.
    pub max: Link,
    /// `file: value` lines for evidence.
    pub evidence: Vec<String>,
}

/// Read `current_link_speed/width` and `max_link_speed/width` of the device at `bdf`.
pub fn read_link(fs: &RootFs, bdf: PciAddr) -> LinkRead {
    link_at(fs, &dev_dir(bdf))
}

/// Read `current_link_speed/width` and `max_link_speed/width` in the in-root folder `dir` (a
/// PCI function's, e.g. one found walking up from a block device), with the parsers the
/// topology reads every device with.
pub fn link_at(fs: &RootFs, dir: &str) -> LinkRead {
    let mut ev = Vec::new();
    let mut get = |f: &str| {
        let rel = format!("{dir}/{f}");
        let v = fs.text(&rel);
        if let Some(v) = &v {
            ev.push(format!("{}: {v}", fs.show(&rel)));
        }
        v
    };
    let speed = |s: Option<String>| s.and_then(|s| parse::link_speed(&s)).flatten();
    let width = |s: Option<String>| s.and_then(|s| parse::link_width(&s));
    let cs = speed(get("current_link_speed"));
    let cw = width(get("current_link_width"));
    let ms = speed(get("max_link_speed"));
    let mw = width(get("max_link_width"));
    LinkRead {
        current: Link {
            speed_gts: cs,
            width: cw,
        },
        max: Link {
            speed_gts: ms,
            width: mw,
        },
        evidence: ev,
    }
}

/// `numa_node` of a device: `Ok(None)` for -1 (firmware or VM does not say).
pub fn numa_node(fs: &RootFs, bdf: PciAddr) -> Result<Option<u32>, FileError> {
    let rel = format!("{}/numa_node", dev_dir(bdf));
    let t = fs.file_text(&rel)?;
    Ok(t.parse::<i64>().ok().and_then(|n| u32::try_from(n).ok()))
}

/// One port of an RDMA device, from `sys/class/infiniband/<dev>/ports/<n>`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RdmaPort {
    /// Port number.
    pub port: u32,
    /// `state`, e.g. `4: ACTIVE`.
    pub state: Option<String>,
    /// `phys_state`, e.g. `5: LinkUp`.
    pub phys_state: Option<String>,
    /// `link_layer`: `InfiniBand` or `Ethernet`.
    pub link_layer: Option<String>,
    /// `rate`.
    pub rate: Option<String>,
}

impl RdmaPort {
    /// Logical state ACTIVE.
    pub fn is_active(&self) -> bool {
        self.state.as_deref().is_some_and(|s| s.contains("ACTIVE"))
    }

    /// RoCE (Ethernet link layer).
    pub fn is_ethernet(&self) -> bool {
        self.link_layer
            .as_deref()
            .is_some_and(|l| l.eq_ignore_ascii_case("ethernet"))
    }
}

/// Where the kernel lists RDMA devices, relative to the root.
pub const RDMA_CLASS: &str = "sys/class/infiniband";

/// The folder of RDMA device `device`, relative to the root.
pub fn rdma_dev_dir(device: &str) -> String {
    format!("{RDMA_CLASS}/{device}")
}

/// The folder of port `port` of RDMA device `device`, relative to the root.
pub fn rdma_port_dir(device: &str, port: u32) -> String {
    format!("{}/ports/{port}", rdma_dev_dir(device))
}

/// One RDMA device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RdmaDev {
    /// `mlx5_0`.
    pub name: String,
    /// PCI function it sits on, from the `device` symlink.
    pub bdf: Option<PciAddr>,
    /// Ports.
    pub ports: Vec<RdmaPort>,
    /// Netdevs on the same PCI function (`device/net/*`).
    pub netdevs: Vec<String>,
}

impl RdmaDev {
    /// The folder of a port, relative to the root.
    pub fn port_dir(&self, port: u32) -> String {
        rdma_port_dir(&self.name, port)
    }
}

/// RDMA devices under `sys/class/infiniband`; `Ok(empty)` when the folder is missing (no
/// RDMA stack loaded is the same as no devices).
pub fn rdma_devices(fs: &RootFs) -> Vec<RdmaDev> {
    fs.names_or_empty(RDMA_CLASS)
        .into_iter()
        .map(|name| {
            let dir = rdma_dev_dir(&name);
            let bdf = fs
                .link_name(&format!("{dir}/device"))
                .and_then(|n| n.parse().ok());
            let ports = fs
                .names_or_empty(&format!("{dir}/ports"))
                .into_iter()
                .filter_map(|p| p.parse::<u32>().ok())
                .map(|port| {
                    let pd = format!("{dir}/ports/{port}");
                    RdmaPort {
                        port,
                        state: fs.text(&format!("{pd}/state")),
                        phys_state: fs.text(&format!("{pd}/phys_state")),
                        link_layer: fs.text(&format!("{pd}/link_layer")),
                        rate: fs.text(&format!("{pd}/rate")),
                    }
                })
                .collect();
            let netdevs = fs.names_or_empty(&format!("{dir}/device/net"));
            RdmaDev {
                name,
                bdf,
                ports,
                netdevs,
            }
        })
        .collect()
}
