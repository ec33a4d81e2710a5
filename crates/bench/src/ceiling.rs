//! Ceilings: the fastest a path could go on this machine, from the topology, and the judgement
//! of a measured figure against it.
//!
//! | path | ceiling |
//! |---|---|
//! | host ↔ GPU (pinned, pageable) | the GPU's PCIe link ([`gdx_topo::ceiling::pcie`]) |
//! | GPU ↔ GPU (p2p, ipc) | NVLink count × per-link rate, else the slower PCIe link ([`gdx_topo::ceiling::gpu_pair`]) |
//! | GPU → host → GPU (staged) | the slower of the two GPUs' PCIe links ([`gdx_topo::ceiling::slower_pcie`]) |
//! | host ↔ host (shm, tcp loopback, memcpy) | the best host `memcpy` over working sets and thread counts, measured once per run ([`crate::hostceil`]) |
//! | tcp to a remote peer | the fastest NIC's link rate |
//! | rdma | the fastest RDMA port's rate |
//!
//! Bidirectional cases double the one-direction ceiling. A figure under
//! [`FAR_BELOW_PCT`] % of its ceiling at [`JUDGE_MIN_BYTES`] or more gets a note with the
//! likely cause ("GPU0↔GPU1 is SYS; expect ≤ ..."). A figure above [`OVER_CEILING_PCT`] % is
//! never shown as a plain percentage: the row says the ceiling is wrong for it.

// Device and GPU-pair ceilings are topo's, the one rule in the tree.
use gdx_topo::ceiling::{self as topo_ceiling, Ceiling};
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

/// A path's ceiling: the figure and its label (topo's [`Ceiling`]), the class of the path
/// between its ends, and for host paths the measured host ceiling by size.
#[derive(Debug, Clone, PartialEq)]
pub struct PathCeiling {
    /// GB/s (one direction unless the case is bidirectional), label and caveat.
    pub hw: Ceiling,
    /// The path class between the ends, when both are devices.
    pub class: Option<PathClass>,
    /// Host paths: the measured host ceiling, which picks the figure by transfer size.
    pub host: Option<HostCeiling>,
}

impl PathCeiling {
    fn plain(gbps: f64, basis: String) -> PathCeiling {
        PathCeiling {
            hw: Ceiling {
                gbps,
                basis,
                caveat: None,
            },
            class: None,
            host: None,
        }
    }
}

fn gpu<'t>(topo: &'t Topology, end: &End) -> Option<&'t Device> {
    topo.device(&end.topo_label()?)
}

/// The ceiling of `spec` on this machine, if the topology (or the memcpy baseline) gives one.
pub fn ceiling(ctx: &Ctx, spec: &CaseSpec) -> Option<PathCeiling> {
    // A fabric row is judged as tcp (loopback providers) or rdma (a NIC provider).
    let one = match (
        crate::fabric::judged_as(ctx, spec.path),
        &spec.src,
        &spec.dst,
    ) {
        (PathKind::Mock, _, _) => ctx
            .mock_ceiling_gbps
            .map(|g| PathCeiling::plain(g, "mock ceiling".into())),
        (PathKind::Memcpy | PathKind::Shm | PathKind::Tcp, End::Host, End::Host) => {
            ctx.host_ceiling().map(|h| PathCeiling {
                host: Some(h.clone()),
                ..PathCeiling::plain(
                    h.dram_gbps,
                    "host memcpy best, 256 MiB buffers (DRAM)".into(),
                )
            })
        }
        (PathKind::Tcp | PathKind::Shm, _, End::Remote(_)) => {
            let topo = ctx.topo.as_ref()?;
            let best = topo
                .nics()
                .filter_map(|n| Some((n, n.nic.as_ref()?.speed_mbps?)))
                .max_by_key(|(_, s)| *s)?;
            Some(PathCeiling::plain(
                best.1 as f64 / 8000.0,
                format!("{} {} Gb/s", best.0.label, best.1 / 1000),
            ))
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
            Some(PathCeiling::plain(
                best.1 / 8.0,
                format!("{} RDMA port {:.0} Gb/s", best.0.label, best.1),
            ))
        }
        (PathKind::PinnedCe | PathKind::PageableCe, a, b) => {
            let topo = ctx.topo.as_ref()?;
            let g = gpu(topo, a).or_else(|| gpu(topo, b))?;
            Some(PathCeiling {
                hw: topo_ceiling::pcie(g)?,
                class: None,
                host: None,
            })
        }
        (PathKind::P2p | PathKind::Ipc | PathKind::Staged, a, b) => {
            let topo = ctx.topo.as_ref()?;
            let (da, db) = (gpu(topo, a)?, gpu(topo, b)?);
            let hw = if spec.path == PathKind::Staged {
                let mut c = topo_ceiling::slower_pcie(da, db)?;
                c.basis = format!("{}, through host memory", c.basis);
                c
            } else {
                topo_ceiling::gpu_pair(topo, da, db, None)?
            };
            Some(PathCeiling {
                hw,
                class: Some(topo.path_class(da, db)),
                host: None,
            })
        }
        _ => None,
    }?;
    Some(if spec.bidir {
        PathCeiling {
            hw: Ceiling {
                gbps: one.hw.gbps * 2.0,
                basis: format!("2 x {}", one.hw.basis),
                caveat: one.hw.caveat.clone(),
            },
            ..one
        }
    } else {
        one
    })
}

/// The likely cause of a figure far below the ceiling of `spec`.
fn likely_cause(spec: &CaseSpec, c: &PathCeiling, row: &Row) -> String {
    if let Some(cav) = &c.hw.caveat {
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
                "{a}→{b} is {cl}: the copy crosses {}; expect ≤ {:.1} GB/s",
                cl.meaning(),
                c.hw.gbps
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
pub fn apply(spec: &CaseSpec, c: Option<&PathCeiling>, row: &mut Row) {
    let Some(c) = c else { return };
    let (gbps, basis) = match &c.host {
        Some(h) => h.for_size(row.size_bytes),
        None => (c.hw.gbps, c.hw.basis.clone()),
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
        let c = PathCeiling::plain(63.0, "PCIe Gen5 x16 (GPU0)".into());
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
        let c = PathCeiling {
            host: Some(h),
            ..PathCeiling::plain(10.0, String::new())
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
