//! Ceilings: the fastest a path could go on this machine, from the topology, and the judgement
//! of a measured figure against it.
//!
//! | path | ceiling |
//! |---|---|
//! | host ↔ GPU (pinned, pageable) | the GPU's PCIe link: generation × width after encoding ([`gdx_topo::Link::raw_gbps`]) |
//! | GPU ↔ GPU (p2p, ipc) | NVLink count × per-link rate (by compute capability), else the slower PCIe link |
//! | GPU → host → GPU (staged) | the slower of the two GPUs' PCIe links |
//! | host ↔ host (shm, tcp loopback, memcpy) | the best host `memcpy` over working sets and thread counts, measured once per run ([`crate::hostceil`]) |
//! | tcp to a remote peer | the fastest NIC's link rate |
//! | rdma | the fastest RDMA port's rate |
//!
//! Bidirectional cases double the one-direction ceiling. A figure under
//! [`FAR_BELOW_PCT`] % of its ceiling at [`JUDGE_MIN_BYTES`] or more gets a note with the
//! likely cause ("GPU0↔GPU1 is SYS; expect ≤ ..."). A figure above [`OVER_CEILING_PCT`] % is
//! never shown as a plain percentage: the row says the ceiling is wrong for it.

// NVLink per-link rates come from topo's bandwidth model, the one in the tree.
use gdx_topo::bandwidth::nvlink_gbps_per_link;
use gdx_topo::{Device, PathClass, Topology};

use crate::case::{CaseSpec, End, PathKind};
use crate::hostceil::HostCeiling;
use crate::report::Row;
use crate::Ctx;

/// Below this percentage of the ceiling a large transfer is flagged.
pub const FAR_BELOW_PCT: f64 = 50.0;

/// Above this percentage of its ceiling a figure means the ceiling is wrong (timer noise
/// allows a few percent).
pub const OVER_CEILING_PCT: f64 = 105.0;

/// Smaller transfers are dominated by latency and are not judged against the ceiling.
pub const JUDGE_MIN_BYTES: u64 = 16 << 20;

/// A path's ceiling and what it is based on.
#[derive(Debug, Clone, PartialEq)]
pub struct Ceiling {
    /// GB/s (1e9 B/s), one direction unless the case is bidirectional.
    pub gbps: f64,
    /// `NV18 x 26.56 GB/s`, `PCIe Gen5 x16 (GPU0)`.
    pub basis: String,
    /// The path class between the ends, when both are devices.
    pub class: Option<PathClass>,
    /// A known reason the path is below its hardware (e.g. a downtrained link).
    pub caveat: Option<String>,
    /// Host paths: the measured host ceiling, which picks the figure by transfer size.
    pub host: Option<HostCeiling>,
}

fn gpu<'t>(topo: &'t Topology, end: &End) -> Option<&'t Device> {
    topo.device(&end.topo_label()?)
}

/// The PCIe ceiling of one device: its maximum link (its current one when the maximum is
/// unknown), with a caveat when it runs below the maximum.
fn pcie(dev: &Device) -> Option<(f64, String, Option<String>)> {
    let max = dev.link.max;
    let cur = dev.link.current;
    let link = if max.raw_gbps().is_some() { max } else { cur };
    let g = link.raw_gbps()?;
    let gen = link
        .generation()
        .map(|g| format!("Gen{g}"))
        .unwrap_or_else(|| format!("{} GT/s", link.speed_gts.unwrap_or(0.0)));
    let basis = format!("PCIe {gen} x{} ({})", link.width.unwrap_or(0), dev.label);
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
    Some((g, basis, caveat))
}

fn class_name(c: PathClass) -> String {
    match c {
        PathClass::X => "X".into(),
        PathClass::Nv(n) => format!("NV{n}"),
        PathClass::Pix => "PIX".into(),
        PathClass::Pxb => "PXB".into(),
        PathClass::Phb => "PHB".into(),
        PathClass::Node => "NODE".into(),
        PathClass::Sys => "SYS".into(),
    }
}

/// The ceiling of `spec` on this machine, if the topology (or the memcpy baseline) gives one.
pub fn ceiling(ctx: &Ctx, spec: &CaseSpec) -> Option<Ceiling> {
    // A fabric row is judged as tcp (loopback providers) or rdma (a NIC provider).
    let one = match (
        crate::fabric::judged_as(ctx, spec.path),
        &spec.src,
        &spec.dst,
    ) {
        (PathKind::Mock, _, _) => ctx.mock_ceiling_gbps.map(|g| Ceiling {
            gbps: g,
            basis: "mock ceiling".into(),
            class: None,
            caveat: None,
            host: None,
        }),
        (PathKind::Memcpy | PathKind::Shm | PathKind::Tcp, End::Host, End::Host) => {
            ctx.host_ceiling().map(|h| Ceiling {
                gbps: h.dram_gbps,
                basis: "host memcpy best, 256 MiB buffers (DRAM)".into(),
                class: None,
                caveat: None,
                host: Some(h.clone()),
            })
        }
        (PathKind::Tcp | PathKind::Shm, _, End::Remote(_)) => {
            let topo = ctx.topo.as_ref()?;
            let best = topo
                .nics()
                .filter_map(|n| Some((n, n.nic.as_ref()?.speed_mbps?)))
                .max_by_key(|(_, s)| *s)?;
            Some(Ceiling {
                gbps: best.1 as f64 / 8000.0,
                basis: format!("{} {} Gb/s", best.0.label, best.1 / 1000),
                class: None,
                caveat: None,
                host: None,
            })
        }
        (PathKind::Rdma, _, _) => {
            let topo = ctx.topo.as_ref()?;
            let best = topo
                .nics()
                .filter_map(|n| {
                    let info = n.nic.as_ref()?;
                    info.rdma_name.as_ref()?;
                    let rate = info
                        .ports
                        .iter()
                        .filter_map(|p| p.rate_gbps)
                        .reduce(f64::max)?;
                    Some((n, rate))
                })
                .max_by(|a, b| a.1.total_cmp(&b.1))?;
            Some(Ceiling {
                gbps: best.1 / 8.0,
                basis: format!("{} RDMA port {:.0} Gb/s", best.0.label, best.1),
                class: None,
                caveat: None,
                host: None,
            })
        }
        (PathKind::PinnedCe | PathKind::PageableCe, a, b) => {
            let topo = ctx.topo.as_ref()?;
            let g = gpu(topo, a).or_else(|| gpu(topo, b))?;
            let (gbps, basis, caveat) = pcie(g)?;
            Some(Ceiling {
                gbps,
                basis,
                class: None,
                caveat,
                host: None,
            })
        }
        (PathKind::P2p | PathKind::Ipc | PathKind::Staged, a, b) => {
            let topo = ctx.topo.as_ref()?;
            let (da, db) = (gpu(topo, a)?, gpu(topo, b)?);
            let class = topo.path_class(da, db);
            let links = topo.nvlinks_between(da, db);
            if links > 0 && spec.path != PathKind::Staged {
                let cc = da.gpu.as_ref().and_then(|g| g.compute_capability.clone());
                let (per, guess) = nvlink_gbps_per_link(cc.as_deref());
                Some(Ceiling {
                    gbps: f64::from(links) * per,
                    basis: format!(
                        "NV{links} x {per:.2} GB/s{}",
                        if guess { ", per-link rate assumed" } else { "" }
                    ),
                    class: Some(class),
                    caveat: None,
                    host: None,
                })
            } else {
                let (ga, ba, ca) = pcie(da)?;
                let (gb, bb, cb) = pcie(db)?;
                let (gbps, basis) = if ga <= gb { (ga, ba) } else { (gb, bb) };
                Some(Ceiling {
                    gbps,
                    basis: if spec.path == PathKind::Staged {
                        format!("{basis}, through host memory")
                    } else {
                        format!("{basis}, {}", class_name(class))
                    },
                    class: Some(class),
                    caveat: ca.or(cb),
                    host: None,
                })
            }
        }
        _ => None,
    }?;
    Some(if spec.bidir {
        Ceiling {
            gbps: one.gbps * 2.0,
            basis: format!("2 x {}", one.basis),
            ..one
        }
    } else {
        one
    })
}

/// The likely cause of a figure far below the ceiling of `spec`.
fn likely_cause(spec: &CaseSpec, c: &Ceiling, row: &Row) -> String {
    if let Some(cav) = &c.caveat {
        return cav.clone();
    }
    let (a, b) = (
        spec.src.name().to_uppercase(),
        spec.dst.name().to_uppercase(),
    );
    match spec.path {
        PathKind::PageableCe => {
            "pageable memory: the driver stages it through its own pinned buffers; pin or register the buffer".into()
        }
        PathKind::PinnedCe => {
            "copy engine or IOMMU/virtualisation overhead; check `gdx doctor` (iommu, acs, link)".into()
        }
        PathKind::P2p | PathKind::Ipc => match c.class {
            Some(PathClass::Nv(_)) => "peer copies below the NVLink rate: is peer access enabled, and are both buffers cuMemAlloc (not stream-ordered pool) memory?".into(),
            Some(cl) => format!(
                "{a}→{b} is {}: the copy crosses {}; expect ≤ {:.1} GB/s",
                class_name(cl),
                cl.meaning(),
                c.gbps
            ),
            None => "no topology class known".into(),
        },
        PathKind::Staged => "staged crosses host memory twice; the pipeline depth or chunk may be too small".into(),
        PathKind::Rdma => "check `gdx doctor` (gpu-nic-distance, peermem/dmabuf, mtu, relaxed-ordering) and the registration mechanism in the note".into(),
        PathKind::Fabric => "check `gdx doctor` (fabric: provider, MR mode, progress) and the provider in the note; the tcp and shm providers copy through the host (kernel sockets, shared memory)".into(),
        PathKind::Shm | PathKind::Tcp | PathKind::Memcpy => match row.cpu_s_per_gb {
            Some(cpu) => format!("CPU-bound host copies ({cpu:.2} CPU s per GB moved)"),
            None => "CPU-bound host copies".into(),
        },
        _ => "unknown".into(),
    }
}

/// Fill `row`'s ceiling fields from `c`, and flag a large transfer far below it.
pub fn apply(spec: &CaseSpec, c: Option<&Ceiling>, row: &mut Row) {
    let Some(c) = c else { return };
    let (gbps, basis) = match &c.host {
        Some(h) => h.for_size(row.size_bytes),
        None => (c.gbps, c.basis.clone()),
    };
    if gbps <= 0.0 {
        return;
    }
    row.ceiling_gbps = Some(gbps);
    row.ceiling_basis = Some(basis.clone());
    if let Some(bw) = row.bw_gbps {
        let pct = 100.0 * bw / gbps;
        row.pct_of_ceiling = Some(pct);
        if pct > OVER_CEILING_PCT {
            row.add_note(format!(
                "above its ceiling ({pct:.0}% of {gbps:.1} GB/s, {basis}): the ceiling is wrong \
                 for this row, so its %ceil means nothing"
            ));
        } else if pct < FAR_BELOW_PCT && row.size_bytes >= JUDGE_MIN_BYTES {
            let cause = likely_cause(spec, c, row);
            row.add_note(format!(
                "far below the ceiling ({pct:.0}% of {gbps:.1} GB/s, {basis}): {cause}"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn far_below_figures_get_a_cause() {
        let spec = CaseSpec::bare(
            "host_to_gpu0_pageable_ce",
            PathKind::PageableCe,
            End::Host,
            End::Gpu(0),
        );
        let c = Ceiling {
            gbps: 63.0,
            basis: "PCIe Gen5 x16 (GPU0)".into(),
            class: None,
            caveat: None,
            host: None,
        };
        let mut row = Row::new(&spec, 1 << 30);
        row.bw_gbps = Some(14.0);
        apply(&spec, Some(&c), &mut row);
        assert!((row.pct_of_ceiling.unwrap() - 22.2).abs() < 0.1);
        assert!(row.note.as_deref().unwrap().contains("pageable memory"));
        let mut small = Row::new(&spec, 4096);
        small.bw_gbps = Some(1.0);
        apply(&spec, Some(&c), &mut small);
        assert!(small.note.is_none());
        let mut over = Row::new(&spec, 4096);
        over.bw_gbps = Some(70.0);
        apply(&spec, Some(&c), &mut over);
        assert!(
            over.note
                .as_deref()
                .unwrap()
                .contains("the ceiling is wrong"),
            "{:?}",
            over.note
        );
    }

    #[test]
    fn host_rows_take_the_ceiling_of_their_size() {
        let spec = CaseSpec::bare(
            "host_to_host_memcpy",
            PathKind::Memcpy,
            End::Host,
            End::Host,
        );
        let mut h = HostCeiling::fixed(10.0);
        h.cache_gbps = 40.0;
        let c = Ceiling {
            gbps: 10.0,
            basis: String::new(),
            class: None,
            caveat: None,
            host: Some(h),
        };
        let mut small = Row::new(&spec, 4096);
        small.bw_gbps = Some(30.0);
        apply(&spec, Some(&c), &mut small);
        assert_eq!(small.ceiling_gbps, Some(40.0));
        assert!(small.note.is_none(), "{:?}", small.note);
        let mut big = Row::new(&spec, 1 << 30);
        big.bw_gbps = Some(9.0);
        apply(&spec, Some(&c), &mut big);
        assert_eq!(big.ceiling_gbps, Some(10.0));
        assert!((big.pct_of_ceiling.unwrap() - 90.0).abs() < 1e-9);
    }
}
