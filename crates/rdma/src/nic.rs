//! Which RDMA NICs serve a region, from the topology.
//!
//! - GPU memory: the NICs nearest to the GPU by PCIe class (PIX before PXB before PHB ...).
//!   All NICs sharing the best class are *rails*: a large transfer is split across them
//!   ([`split_across_rails`]). GPUDirect RDMA is advisable only when the best class is PIX or
//!   PXB (NCCL's default `NCCL_NET_GDR_LEVEL`); [`NicChoice::gpu_direct`] says so.
//! - Host memory: the NICs on the memory's NUMA node, all of them rails; every NIC when the
//!   node is unknown or has none.
//!
//! Only NICs with an RDMA device and, when the topology lists ports, an active port count.

use gdx_topo::{Device, DeviceKind, PathClass, PciAddr, Topology};
use serde::Serialize;
use std::fmt;

/// Where a region's memory is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemPlace {
    /// Host memory, on this NUMA node when known.
    Host {
        /// NUMA node of the memory.
        numa: Option<u32>,
    },
    /// GPU memory.
    Gpu(GpuRef),
}

/// A GPU in the topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuRef {
    /// By PCI address (what `cuDeviceGetPCIBusId` gives; robust to `CUDA_VISIBLE_DEVICES`).
    Bdf(PciAddr),
    /// By topology label (`GPU0`).
    Label(String),
}

impl fmt::Display for GpuRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuRef::Bdf(b) => write!(f, "GPU {b}"),
            GpuRef::Label(l) => f.write_str(l),
        }
    }
}

/// One NIC chosen for a region.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rail {
    /// RDMA device name, e.g. `mlx5_0`.
    pub device: String,
    /// Topology label, e.g. `NIC0`.
    pub label: String,
    /// PCIe class to the GPU (GPU memory), `None` for host memory.
    pub class: Option<PathClass>,
    /// Active ports (all listed ports when the topology does not say their state).
    pub ports: Vec<u32>,
    /// NUMA node of the NIC.
    pub numa: Option<u32>,
}

/// The NICs for a region, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NicChoice {
    /// Equally near NICs, in name order; split large transfers across them.
    pub rails: Vec<Rail>,
    /// For GPU memory: whether the NICs are close enough for GPUDirect RDMA (PIX/PXB).
    /// `None` for host memory.
    pub gpu_direct: Option<bool>,
    /// In words.
    pub reason: String,
}

/// Why no NIC could be chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NicError {
    /// The topology has no RDMA NIC.
    #[error("the topology has no RDMA NIC")]
    NoRdmaNic,
    /// RDMA NICs exist, but no port is active.
    #[error("no RDMA NIC has an active port ({} listed, every port down)", nics.join(", "))]
    NoActivePort {
        /// The RDMA NICs listed.
        nics: Vec<String>,
    },
    /// The GPU is not in the topology.
    #[error("{gpu} is not in the topology")]
    NoSuchGpu {
        /// The GPU asked for.
        gpu: GpuRef,
    },
}

fn active_ports(d: &Device) -> Option<Vec<u32>> {
    let nic = d.nic.as_ref()?;
    nic.rdma_name.as_ref()?;
    if nic.ports.is_empty() {
        // NCCL XML and some captures list no ports: assume port 1 works.
        return Some(vec![1]);
    }
    let active: Vec<u32> = nic
        .ports
        .iter()
        .filter(|p| p.state.as_deref().is_none_or(|s| s.contains("ACTIVE")))
        .map(|p| p.port)
        .collect();
    Some(active)
}

fn rail(d: &Device, class: Option<PathClass>, ports: Vec<u32>) -> Rail {
    Rail {
        device: d
            .nic
            .as_ref()
            .and_then(|n| n.rdma_name.clone())
            .unwrap_or_default(),
        label: d.label.clone(),
        class,
        ports,
        numa: d.numa,
    }
}

fn names(r: &[Rail]) -> String {
    r.iter()
        .map(|r| r.device.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The NICs to use for memory at `place`.
pub fn choose_nics(topo: &Topology, place: &MemPlace) -> Result<NicChoice, NicError> {
    let rdma: Vec<(&Device, Vec<u32>)> = topo
        .nics()
        .filter_map(|d| active_ports(d).map(|p| (d, p)))
        .collect();
    if rdma.is_empty() {
        return Err(NicError::NoRdmaNic);
    }
    let usable: Vec<(&Device, Vec<u32>)> = rdma
        .iter()
        .filter(|(_, p)| !p.is_empty())
        .cloned()
        .collect();
    if usable.is_empty() {
        let all: Vec<String> = rdma
            .iter()
            .filter_map(|(d, _)| d.nic.as_ref().and_then(|n| n.rdma_name.clone()))
            .collect();
        return Err(NicError::NoActivePort { nics: all });
    }
    match place {
        MemPlace::Gpu(g) => {
            let gpu = match g {
                GpuRef::Bdf(b) => topo.by_bdf(*b),
                GpuRef::Label(l) => topo.device(l),
            }
            .filter(|d| d.kind == DeviceKind::Gpu)
            .ok_or_else(|| NicError::NoSuchGpu { gpu: g.clone() })?;
            let classed: Vec<(&Device, Vec<u32>, PathClass)> = usable
                .into_iter()
                .map(|(d, p)| {
                    let c = topo.pcie_class(gpu, d);
                    (d, p, c)
                })
                .collect();
            let best = classed.iter().map(|(_, _, c)| c.rank()).min();
            let rails: Vec<Rail> = classed
                .into_iter()
                .filter(|(_, _, c)| Some(c.rank()) == best)
                .map(|(d, p, c)| rail(d, Some(c), p))
                .collect();
            let class = rails
                .first()
                .and_then(|r| r.class)
                .unwrap_or(PathClass::Sys);
            let direct = class.is_pcie_local();
            let mut reason = format!(
                "{} ({}): nearest RDMA NIC(s) {} at {class}",
                gpu.label,
                gpu.bdf.map(|b| b.to_string()).unwrap_or_default(),
                names(&rails)
            );
            if rails.len() > 1 {
                reason.push_str(&format!(
                    "; {} rails, large transfers split across them",
                    rails.len()
                ));
            }
            if !direct {
                reason.push_str(&format!(
                    "; {class} crosses the host bridge: GPUDirect RDMA would be slow (NCCL enables it up to PXB), stage through host memory or move the NIC"
                ));
            }
            Ok(NicChoice {
                rails,
                gpu_direct: Some(direct),
                reason,
            })
        }
        MemPlace::Host { numa } => {
            let on_node: Vec<Rail> = match numa {
                Some(n) => usable
                    .iter()
                    .filter(|(d, _)| topo.numa_affinity(d).contains(n))
                    .map(|(d, p)| rail(d, None, p.clone()))
                    .collect(),
                None => Vec::new(),
            };
            let (rails, reason) = if !on_node.is_empty() {
                let r = format!(
                    "host memory on NUMA node {}: NIC(s) {} on the same node",
                    numa.unwrap_or(0),
                    names(&on_node)
                );
                (on_node, r)
            } else {
                let all: Vec<Rail> = usable
                    .iter()
                    .map(|(d, p)| rail(d, None, p.clone()))
                    .collect();
                let r = match numa {
                    Some(n) => format!(
                        "host memory on NUMA node {n}, which has no RDMA NIC: using {} (crossing the inter-socket link)",
                        names(&all)
                    ),
                    None => format!("host memory, NUMA node unknown: using {}", names(&all)),
                };
                (all, r)
            };
            Ok(NicChoice {
                rails,
                gpu_direct: None,
                reason,
            })
        }
    }
}

/// One rail's share of a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RailSlice {
    /// Index into the rails.
    pub rail: usize,
    /// Offset of the slice in the transfer.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
}

/// Split `len` bytes across `rails` rails in contiguous slices whose boundaries are multiples
/// of `align` (at least 1): equal shares, the last taking the remainder. Fewer slices than
/// rails when the transfer is small; none for zero bytes.
pub fn split_across_rails(len: u64, rails: usize, align: u64) -> Vec<RailSlice> {
    let align = align.max(1);
    if len == 0 || rails == 0 {
        return Vec::new();
    }
    let n = (rails as u64).min(len.div_ceil(align)).max(1);
    let share = (len / n) / align * align;
    let share = share.max(align);
    let mut out = Vec::new();
    let mut offset = 0;
    for i in 0..n {
        if offset >= len {
            break;
        }
        let this = if i == n - 1 {
            len - offset
        } else {
            share.min(len - offset)
        };
        out.push(RailSlice {
            rail: i as usize,
            offset,
            len: this,
        });
        offset += this;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_covers_everything_once_and_respects_alignment() {
        for (len, rails, align) in [
            (1u64 << 30, 4usize, 4096u64),
            (10, 4, 1),
            (10, 4, 4),
            (4097, 2, 4096),
            (1, 8, 4096),
            (12_345_678, 3, 64),
        ] {
            let s = split_across_rails(len, rails, align);
            assert!(
                !s.is_empty() && s.len() <= rails,
                "{len} {rails} {align}: {s:?}"
            );
            let mut next = 0;
            for (i, x) in s.iter().enumerate() {
                assert_eq!(x.rail, i);
                assert_eq!(x.offset, next);
                assert!(x.len > 0);
                assert_eq!(x.offset % align, 0, "{s:?}");
                next += x.len;
            }
            assert_eq!(next, len);
        }
        assert!(split_across_rails(0, 4, 1).is_empty());
        assert!(split_across_rails(10, 0, 1).is_empty());
        let even = split_across_rails(4 << 20, 4, 4096);
        assert!(even.iter().all(|s| s.len == 1 << 20));
    }
}
