//! Path classes between devices, with the meaning `nvidia-smi topo -m` gives them:
//!
//! | class | meaning |
//! |---|---|
//! | `X`    | self |
//! | `NV#`  | a bonded set of # NVLinks (directly, or through NVSwitches) |
//! | `PIX`  | at most a single PCIe switch |
//! | `PXB`  | several PCIe switches, no host bridge |
//! | `PHB`  | a PCIe host bridge (typically the CPU) |
//! | `NODE` | PCIe plus the links between host bridges within one NUMA node |
//! | `SYS`  | PCIe plus the SMP link between NUMA nodes (QPI/UPI, Infinity Fabric) |
//!
//! Classification only looks at attachments (host bridge + switch chain) and NVLinks, so it
//! gives the same answer for a model read from sysfs or from NCCL XML.

use crate::model::{Device, NvLinkTarget, Topology};
use serde::{Serialize, Serializer};
use std::collections::BTreeMap;
use std::fmt;

/// How two devices are connected, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PathClass {
    /// The same device.
    X,
    /// `n` bonded NVLinks.
    Nv(u32),
    /// One PCIe switch.
    Pix,
    /// Several PCIe switches, no host bridge.
    Pxb,
    /// Through a host bridge.
    Phb,
    /// Across host bridges of one NUMA node.
    Node,
    /// Across NUMA nodes.
    Sys,
}

impl PathClass {
    /// Lower is closer: X < NV < PIX < PXB < PHB < NODE < SYS.
    pub fn rank(self) -> u8 {
        match self {
            PathClass::X => 0,
            PathClass::Nv(_) => 1,
            PathClass::Pix => 2,
            PathClass::Pxb => 3,
            PathClass::Phb => 4,
            PathClass::Node => 5,
            PathClass::Sys => 6,
        }
    }

    /// True for classes where NICs and peers reach GPU memory without crossing a host bridge
    /// (NCCL's default GPUDirect RDMA level is PXB).
    pub fn is_pcie_local(self) -> bool {
        matches!(self, PathClass::X | PathClass::Pix | PathClass::Pxb)
    }

    /// The legend line for this class, as `nvidia-smi topo -m` words it.
    pub fn meaning(self) -> &'static str {
        match self {
            PathClass::X => "Self",
            PathClass::Nv(_) => "Connection traversing a bonded set of # NVLinks",
            PathClass::Pix => "Connection traversing at most a single PCIe bridge",
            PathClass::Pxb => {
                "Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)"
            }
            PathClass::Phb => {
                "Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)"
            }
            PathClass::Node => {
                "Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node"
            }
            PathClass::Sys => {
                "Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)"
            }
        }
    }
}

impl fmt::Display for PathClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathClass::X => f.write_str("X"),
            PathClass::Nv(n) => write!(f, "NV{n}"),
            PathClass::Pix => f.write_str("PIX"),
            PathClass::Pxb => f.write_str("PXB"),
            PathClass::Phb => f.write_str("PHB"),
            PathClass::Node => f.write_str("NODE"),
            PathClass::Sys => f.write_str("SYS"),
        }
    }
}

impl Serialize for PathClass {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The legend, in display order, as `(key, meaning)`.
pub fn legend() -> Vec<(&'static str, &'static str)> {
    [
        PathClass::X,
        PathClass::Sys,
        PathClass::Node,
        PathClass::Phb,
        PathClass::Pxb,
        PathClass::Pix,
        PathClass::Nv(0),
    ]
    .iter()
    .map(|c| {
        let key = match c {
            PathClass::Nv(_) => "NV#",
            PathClass::X => "X",
            PathClass::Sys => "SYS",
            PathClass::Node => "NODE",
            PathClass::Phb => "PHB",
            PathClass::Pxb => "PXB",
            PathClass::Pix => "PIX",
        };
        (key, c.meaning())
    })
    .collect()
}

impl Topology {
    /// Number of NVLinks joining two GPUs: direct links from either side's record, or, when
    /// both reach NVSwitches, the smaller of their switch link counts (every GPU on an
    /// NVSwitch fabric reaches every other at its own link count).
    pub fn nvlinks_between(&self, a: &Device, b: &Device) -> u32 {
        let (Some(ga), Some(gb)) = (a.gpu.as_ref(), b.gpu.as_ref()) else {
            return 0;
        };
        let direct = |from: &crate::model::GpuInfo, to: &Device| -> u32 {
            from.nvlinks
                .iter()
                .filter(|l| matches!(l.target, NvLinkTarget::Gpu(t) if Some(t) == to.bdf))
                .map(|l| l.count)
                .sum()
        };
        let d = direct(ga, b).max(direct(gb, a));
        if d > 0 {
            return d;
        }
        let sw = |g: &crate::model::GpuInfo| -> u32 {
            g.nvlinks
                .iter()
                .filter(|l| l.target == NvLinkTarget::NvSwitch)
                .map(|l| l.count)
                .sum()
        };
        sw(ga).min(sw(gb))
    }

    /// The PCIe-only class between two devices (ignores NVLink).
    pub fn pcie_class(&self, a: &Device, b: &Device) -> PathClass {
        if a.label == b.label && a.bdf == b.bdf {
            return PathClass::X;
        }
        let (ha, hb) = (&a.attach.host_bridge, &b.attach.host_bridge);
        let same_bridge = matches!((ha, hb), (Some(x), Some(y)) if x == y);
        if !same_bridge {
            let na = a
                .numa
                .or_else(|| ha.as_deref().and_then(|h| self.host_bridge_numa(h)));
            let nb = b
                .numa
                .or_else(|| hb.as_deref().and_then(|h| self.host_bridge_numa(h)));
            return match (na, nb) {
                (Some(x), Some(y)) if x != y => PathClass::Sys,
                // Unknown NUMA on a device with no host bridge at all: assume the worst.
                _ if ha.is_none() || hb.is_none() => PathClass::Sys,
                _ => PathClass::Node,
            };
        }
        let (sa, sb) = (&a.attach.switches, &b.attach.switches);
        let common = sa.iter().zip(sb.iter()).take_while(|(x, y)| x == y).count();
        if common == 0 {
            return PathClass::Phb;
        }
        // Both hang directly below the deepest shared switch: one switch traversed.
        if sa.len() == common && sb.len() == common {
            PathClass::Pix
        } else {
            PathClass::Pxb
        }
    }

    /// The class between two devices: `X`, `NV#` when both are GPUs joined by NVLink, else
    /// the PCIe class.
    pub fn path_class(&self, a: &Device, b: &Device) -> PathClass {
        if a.label == b.label && a.bdf == b.bdf {
            return PathClass::X;
        }
        if a.kind == crate::model::DeviceKind::Gpu && b.kind == crate::model::DeviceKind::Gpu {
            let n = self.nvlinks_between(a, b);
            if n > 0 {
                return PathClass::Nv(n);
            }
        }
        self.pcie_class(a, b)
    }

    /// Class between two labelled devices, `None` if either label is unknown.
    pub fn class_between(&self, a: &str, b: &str) -> Option<PathClass> {
        Some(self.path_class(self.device(a)?, self.device(b)?))
    }

    /// The full matrix over GPUs and NICs (the devices `nvidia-smi topo -m` shows), keyed by
    /// label.
    pub fn matrix(&self) -> BTreeMap<String, BTreeMap<String, PathClass>> {
        let devs: Vec<&Device> = self.gpus().chain(self.nics()).collect();
        devs.iter()
            .map(|a| {
                let row = devs
                    .iter()
                    .map(|b| (b.label.clone(), self.path_class(a, b)))
                    .collect();
                (a.label.clone(), row)
            })
            .collect()
    }

    /// The nearest NICs to a device, with their class (all NICs sharing the best class).
    pub fn nearest_nics(&self, dev: &Device) -> Vec<(&Device, PathClass)> {
        let all: Vec<(&Device, PathClass)> =
            self.nics().map(|n| (n, self.pcie_class(dev, n))).collect();
        let best = all.iter().map(|(_, c)| c.rank()).min();
        all.into_iter()
            .filter(|(_, c)| Some(c.rank()) == best)
            .collect()
    }
}
