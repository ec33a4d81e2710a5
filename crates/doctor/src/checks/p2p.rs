//! `p2p`: per GPU pair, whether peer-to-peer works: CUDA `cuDeviceCanAccessPeer`, NVML P2P
//! status (`nvidia-smi topo -p2p` legend), NVLinks that are down, and — when probes ran — the
//! measured copy bandwidth against the link ceiling. On NVLink pairs a non-OK status is a
//! hardware problem NCCL refuses to run with; on PCIe it silently falls back to host memory
//! (gdr-checks B8).

use super::Check;
use crate::context::{pair, Context, GpuRef};
use crate::finding::{Finding, Status};
use crate::probe::ProbeState;

/// The `p2p` check.
pub struct P2p;

/// Below this fraction of the link ceiling a verified copy is flagged as a silent slow path.
pub const SLOW_FRACTION: f64 = 0.5;

/// What the sources said about one pair.
#[derive(Default)]
struct Seen {
    /// Evidence lines.
    ev: Vec<String>,
    /// Each problem with its status.
    problems: Vec<(Status, String)>,
    /// Whether any source said anything.
    known: bool,
    /// Probe figures, `394.0 GB/s GPU0->GPU1`.
    measured: Vec<String>,
}

/// CUDA can-access-peer, both directions.
fn cuda_peer(ctx: &Context, a: &GpuRef, b: &GpuRef, seen: &mut Seen) {
    if let Ok(l) = ctx.live() {
        if let (Some(da), Some(db)) = (l.cuda_device(a.bdf), l.cuda_device(b.bdf)) {
            for (x, y, lx, ly) in [(da, db, &a.label, &b.label), (db, da, &b.label, &a.label)] {
                if let Some((_, ok)) = x.can_access_peer.iter().find(|(o, _)| *o == y.ordinal) {
                    seen.known = true;
                    seen.ev.push(format!(
                        "cuDeviceCanAccessPeer({lx}, {ly}) = {}",
                        u8::from(*ok)
                    ));
                    if !ok {
                        seen.problems.push((
                            Status::Fail,
                            format!("CUDA reports {lx} cannot access {ly}"),
                        ));
                    }
                }
            }
        }
    }
}

/// NVML's P2P read status: live first, else a captured snapshot in the topology.
fn nvml_status(ctx: &Context, a: &GpuRef, b: &GpuRef, nvlinked: bool, seen: &mut Seen) {
    let live = ctx.live().ok();
    let nvml = live.and_then(|l| l.nvml_device(a.bdf));
    let read = nvml
        .and_then(|d| d.p2p.iter().find(|p| p.peer == b.bdf))
        .map(|p| {
            let parts: Vec<String> = [
                ("read", &p.read),
                ("write", &p.write),
                ("nvlink", &p.nvlink),
            ]
            .iter()
            .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k} {v}")))
            .collect();
            seen.ev.push(format!(
                "nvmlDeviceGetP2PStatus({}, {}): {}",
                a.label,
                b.label,
                parts.join(", ")
            ));
            p.read.clone()
        })
        .or_else(|| {
            let s = ctx
                .topo_device(a.bdf)?
                .gpu
                .as_ref()?
                .p2p_status
                .iter()
                .find(|(p, _)| *p == b.bdf)?
                .1
                .clone();
            seen.ev.push(format!(
                "NVML snapshot: P2P read {}->{} {s}",
                a.label, b.label
            ));
            Some(Some(s))
        })
        .flatten();
    if let Some(r) = read {
        seen.known = true;
        if r != "OK" {
            let msg = if nvlinked {
                format!("NVML P2P status {r} between NVLink-connected GPUs: probably a hardware issue, NCCL will refuse to run")
            } else {
                format!(
                    "NVML P2P status {r}: P2P unsupported, traffic is staged through host memory"
                )
            };
            seen.problems.push((Status::Fail, msg));
        }
    }
}

/// NVLinks down on either GPU.
fn nvlinks_down(ctx: &Context, a: &GpuRef, b: &GpuRef, seen: &mut Seen) {
    for g in [a, b] {
        if let Some(d) = ctx.live().ok().and_then(|l| l.nvml_device(g.bdf)) {
            if !d.nvlinks_down.is_empty() {
                seen.known = true;
                seen.ev.push(format!(
                    "{}: NVLinks down: {:?} ({} up)",
                    g.label, d.nvlinks_down, d.nvlinks_active
                ));
                seen.problems.push((
                    Status::Warn,
                    format!("{} has {} NVLink(s) down", g.label, d.nvlinks_down.len()),
                ));
            }
        }
    }
}

/// The probe's copies, both directions.
fn probe_copies(ctx: &Context, a: &GpuRef, b: &GpuRef, seen: &mut Seen) {
    if let ProbeState::Ran(r) = ctx.probes() {
        for (x, y) in [(a, b), (b, a)] {
            if let Some(c) = r.copy(&x.label, &y.label) {
                seen.known = true;
                seen.ev.push(format!("probe: {}", c.describe()));
                if c.error.is_some() || !c.verified {
                    seen.problems.push((
                        Status::Fail,
                        format!("probe copy {} -> {} failed", x.label, y.label),
                    ));
                } else if c.fraction().is_some_and(|f| f < SLOW_FRACTION) {
                    seen.problems.push((
                        Status::Warn,
                        format!("probe copy {} -> {} reached only {:.0}% of the link ceiling: a silent slow path", x.label, y.label, c.fraction().unwrap_or(0.0) * 100.0),
                    ));
                }
                if let Some(g) = c.gbps {
                    seen.measured
                        .push(format!("{g:.1} GB/s {}->{}", x.label, y.label));
                }
            }
        }
    }
}

fn check_pair(ctx: &Context, a: &GpuRef, b: &GpuRef) -> Finding {
    let id = "p2p";
    let subject = pair(&a.label, &b.label);
    let nvl = ctx.nvlinks_between(a.bdf, b.bdf);
    let over = match nvl {
        Some(n) if n > 0 => format!("NV{n}"),
        _ => ctx
            .class_between(a.bdf, b.bdf)
            .map(|c| format!("PCIe {c}"))
            .unwrap_or_else(|| "PCIe".into()),
    };
    let mut seen = Seen::default();
    cuda_peer(ctx, a, b, &mut seen);
    nvml_status(ctx, a, b, nvl.is_some_and(|n| n > 0), &mut seen);
    nvlinks_down(ctx, a, b, &mut seen);
    probe_copies(ctx, a, b, &mut seen);
    let Seen {
        ev,
        problems,
        known,
        measured,
    } = seen;
    if !known {
        return Finding::skip(
            id,
            subject,
            "P2P status needs CUDA/NVML on the live machine or an NVML snapshot in the capture",
        );
    }
    let fix = if nvl.is_some_and(|n| n > 0) {
        "check `nvidia-smi nvlink -s` and `nvidia-smi -q` (Fabric State); on NVSwitch systems start nvidia-fabricmanager; reseat or RMA a GPU with links down"
    } else {
        "disable ACS on the bridges between the GPUs (see the acs check), set the IOMMU to passthrough, or use GPUs on one PCIe switch"
    };
    let worst = problems
        .iter()
        .map(|(s, _)| *s)
        .min_by_key(|s| s.severity_rank());
    match worst {
        Some(st) => {
            let msgs: Vec<&str> = problems
                .iter()
                .filter(|(s, _)| *s == st)
                .map(|(_, m)| m.as_str())
                .collect();
            Finding::with_status(
                id,
                st,
                subject,
                format!(
                    "{} <-> {} over {over}: {}",
                    a.label,
                    b.label,
                    msgs.join("; ")
                ),
            )
            .evidence_all(ev)
            .fix(fix)
        }
        None => {
            let m = if measured.is_empty() {
                String::new()
            } else {
                format!(", measured {}", measured.join(", "))
            };
            Finding::pass(
                id,
                subject,
                format!("{} <-> {} P2P works over {over}{m}", a.label, b.label),
            )
            .evidence_all(ev)
        }
    }
}

impl Check for P2p {
    fn id(&self) -> &'static str {
        "p2p"
    }
    fn title(&self) -> &'static str {
        "GPU pairs: peer access, NVML P2P status, NVLinks up, probe bandwidth"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        let gpus = ctx.gpus();
        if gpus.is_empty() {
            return vec![Finding::skip(id, "host", ctx.no_gpu_reason())];
        }
        if gpus.len() < 2 {
            return vec![Finding::skip(
                id,
                gpus[0].label.clone(),
                "only one GPU: no pair to check",
            )];
        }
        let mut out = Vec::new();
        for (i, a) in gpus.iter().enumerate() {
            for b in &gpus[i + 1..] {
                out.push(check_pair(ctx, a, b));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::{NvmlDevice, NvmlFacts, NvmlP2p};
    use crate::probe::{CopyProbe, ProbeResults};
    use crate::testutil::{bdf, cuda_facts, run, TopoBuilder, Tree};
    use gdx_topo::DeviceKind::Gpu;

    const A: &str = "0000:00:06.0";
    const B: &str = "0000:00:07.0";

    fn tree() -> Tree {
        let t = Tree::new();
        t.gpu("pci0000:00", &[], A);
        t.gpu("pci0000:00", &[], B);
        t
    }

    fn topo() -> gdx_topo::Topology {
        TopoBuilder::new(0)
            .dev("GPU0", Gpu, A, "pci0000:00", &[])
            .dev("GPU1", Gpu, B, "pci0000:00", &[])
            .nvlink(A, B, 18)
            .nvlink(B, A, 18)
            .build()
    }

    fn copy(from: &str, to: &str, gbps: f64) -> CopyProbe {
        CopyProbe {
            from: from.into(),
            to: to.into(),
            bytes: 256 << 20,
            gbps: Some(gbps),
            ceiling_gbps: Some(478.125),
            ceiling_basis: Some("NV18 x 26.56 GB/s".into()),
            verified: true,
            error: None,
        }
    }

    #[test]
    fn nvlink_pair_passes_with_probe_bandwidth() {
        let t = tree();
        let mut ctx = t.ctx().topo(topo()).live(cuda_facts(&[A, B])).build();
        ctx.set_probes(ProbeState::Ran(ProbeResults {
            copies: vec![copy("GPU0", "GPU1", 394.8), copy("GPU1", "GPU0", 394.2)],
            ..Default::default()
        }));
        let fs = run(&P2p, &ctx);
        assert_eq!(fs.len(), 1);
        assert_eq!(fs[0].status, Status::Pass, "{fs:#?}");
        assert_eq!(fs[0].subject, "GPU0-GPU1");
        assert!(
            fs[0]
                .message
                .contains("over NV18, measured 394.8 GB/s GPU0->GPU1"),
            "{}",
            fs[0].message
        );
    }

    #[test]
    fn slow_probe_warns_and_peer_access_denied_fails() {
        let t = tree();
        let mut ctx = t.ctx().topo(topo()).live(cuda_facts(&[A, B])).build();
        ctx.set_probes(ProbeState::Ran(ProbeResults {
            copies: vec![copy("GPU0", "GPU1", 37.7)],
            ..Default::default()
        }));
        assert_eq!(run(&P2p, &ctx)[0].status, Status::Warn);

        let mut f = cuda_facts(&[A, B]);
        if let Ok(c) = f.cuda.as_mut() {
            c.devices[0].can_access_peer = vec![(1, false)];
        }
        let fs = run(&P2p, &t.ctx().live(f).build());
        assert_eq!(fs[0].status, Status::Fail);
        assert!(fs[0].message.contains("cannot access GPU1"));
    }

    #[test]
    fn nvml_not_supported_fails_and_offline_skips() {
        let t = tree();
        let mut f = crate::facts::StaticFacts::none();
        f.nvml = Ok(NvmlFacts {
            driver_version: None,
            devices: vec![NvmlDevice {
                bdf: Some(bdf(A)),
                p2p: vec![NvmlP2p {
                    peer: bdf(B),
                    read: Some("NS".into()),
                    write: Some("NS".into()),
                    nvlink: Some("NS".into()),
                }],
                ..Default::default()
            }],
        });
        let fs = run(&P2p, &t.ctx().live(f).build());
        assert_eq!(fs[0].status, Status::Fail);
        assert!(fs[0].message.contains("status NS"));
        assert_eq!(run(&P2p, &t.ctx().build())[0].status, Status::Skip);
    }
}
