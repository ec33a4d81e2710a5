//! Ceilings from the topology: the fastest a device's PCIe link, or a pair of GPUs, could
//! carry in one direction. This is the one place the GPU-pair rule lives — NVLink count ×
//! per-link rate when the two share NVLinks, else the slower of their PCIe links — so that
//! `gdx bench`, `gdx doctor`'s probes and `gdx nccl run` judge one machine against one figure
//! with one label. The rates are [`crate::bandwidth`]'s.
//!
//! A PCIe link counts at its maximum (its current speed when the maximum is unknown), since an
//! idle GPU drops its link to save power; a link running below its maximum is named in the
//! ceiling's [`Ceiling::caveat`].

use serde::Serialize;

use crate::bandwidth::nvlink_gbps_per_link;
use crate::{Device, Topology};

/// How fast a path could go, and what that figure is based on.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Ceiling {
    /// GB/s (1e9 B/s), one direction.
    pub gbps: f64,
    /// What it is, the one label every tool prints: `NV18 x 26.56 GB/s`,
    /// `PCIe Gen5 x16 (GPU0), SYS`.
    pub basis: String,
    /// A known reason the path runs below its hardware (a downtrained link).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub caveat: Option<String>,
}

/// The ceiling of `dev`'s PCIe link: `PCIe Gen5 x16 (GPU0)`, with a caveat when the link runs
/// below its maximum now. `None` when neither speed nor width is known.
pub fn pcie(dev: &Device) -> Option<Ceiling> {
    let (max, cur) = (dev.link.max, dev.link.current);
    let link = if max.raw_gbps().is_some() { max } else { cur };
    let gbps = link.raw_gbps()?;
    let caveat = match (cur.raw_gbps(), max.raw_gbps()) {
        (Some(c), Some(m)) if c + 0.01 < m => Some(format!(
            "{}'s link runs at {:.1} GT/s x{} now, below its maximum {:.1} GT/s x{} (downtrained, or idle power saving)",
            dev.label,
            cur.speed_gts.unwrap_or(0.0),
            cur.width.unwrap_or(0),
            max.speed_gts.unwrap_or(0.0),
            max.width.unwrap_or(0)
        )),
        _ => None,
    };
    Some(Ceiling {
        gbps,
        basis: format!("{} ({})", link.name(), dev.label),
        caveat,
    })
}

/// The slower of `a`'s and `b`'s PCIe links (what a copy through host memory is bounded by),
/// with either link's caveat.
pub fn slower_pcie(a: &Device, b: &Device) -> Option<Ceiling> {
    let (ca, cb) = (pcie(a)?, pcie(b)?);
    let caveat = ca.caveat.clone().or_else(|| cb.caveat.clone());
    let mut slower = if ca.gbps <= cb.gbps { ca } else { cb };
    slower.caveat = caveat;
    Some(slower)
}

/// The one-direction ceiling between GPUs `a` and `b`: NVLink count × per-link rate when they
/// share NVLinks (`per_link`, GB/s, when it was measured, e.g. by NVML; else by `a`'s compute
/// capability, and the label says when that rate is assumed), else the slower PCIe link and
/// the class of the path between them.
pub fn gpu_pair(topo: &Topology, a: &Device, b: &Device, per_link: Option<f64>) -> Option<Ceiling> {
    let links = topo.nvlinks_between(a, b);
    if links > 0 {
        let (per, assumed) = match per_link {
            Some(p) => (p, false),
            None => {
                let cc = a.gpu.as_ref().and_then(|g| g.compute_capability.as_deref());
                nvlink_gbps_per_link(cc)
            }
        };
        return Some(Ceiling {
            gbps: f64::from(links) * per,
            basis: format!(
                "NV{links} x {per:.2} GB/s{}",
                if assumed {
                    ", per-link rate assumed"
                } else {
                    ""
                }
            ),
            caveat: None,
        });
    }
    let mut c = slower_pcie(a, b)?;
    c.basis = format!("{}, {}", c.basis, topo.path_class(a, b));
    Some(c)
}
