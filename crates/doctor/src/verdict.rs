//! Verdicts: for every GPU pair and GPU↔RDMA-NIC pair, which path data will take and which
//! findings decide it. Computed from the findings plus the topology, after all checks ran, so
//! a verdict never contradicts a finding.

use crate::checks::dmabuf::{self, Outlook};
use crate::checks::{acs, distance};
use crate::context::{pair, Context, GpuRef};
use crate::finding::{Finding, Status};
use crate::probe::ProbeState;
use crate::report::{DataPath, FindingRef, Verdict};
use gdx_topo::sysfs::devices::RdmaDev;

fn find<'a>(fs: &'a [Finding], id: &str, subject: &str) -> Option<&'a Finding> {
    fs.iter().find(|f| f.id == id && f.subject == subject)
}

fn failing<'a>(fs: &'a [Finding], id: &str, subject: &str) -> Option<&'a Finding> {
    find(fs, id, subject).filter(|f| f.status == Status::Fail)
}

/// ACS findings that fail on the bridges between two devices.
fn acs_failures<'a>(
    ctx: &Context,
    fs: &'a [Finding],
    a: gdx_topo::PciAddr,
    b: gdx_topo::PciAddr,
) -> Vec<&'a Finding> {
    acs::pair_bridges(ctx, a, b)
        .unwrap_or_default()
        .iter()
        .filter_map(|br| failing(fs, "acs", &br.to_string()))
        .collect()
}

fn best_gbps(ctx: &Context, a: &str, b: &str) -> Option<f64> {
    let ProbeState::Ran(r) = ctx.probes() else {
        return None;
    };
    [r.copy(a, b), r.copy(b, a)]
        .into_iter()
        .flatten()
        .filter(|c| c.error.is_none())
        .filter_map(|c| c.gbps)
        .max_by(|x, y| x.total_cmp(y))
}

fn gpu_pair(ctx: &Context, fs: &[Finding], a: &GpuRef, b: &GpuRef) -> Verdict {
    let subject = pair(&a.label, &b.label);
    let mut by: Vec<FindingRef> = Vec::new();
    let nvl = ctx.nvlinks_between(a.bdf, b.bdf).filter(|n| *n > 0);
    let class = match nvl {
        Some(n) => Some(format!("NV{n}")),
        None => ctx.class_between(a.bdf, b.bdf).map(|c| c.to_string()),
    };
    let measured = best_gbps(ctx, &a.label, &b.label);
    let p2p = find(fs, "p2p", &subject);
    if let Some(f) = p2p {
        by.push(FindingRef::to(f));
    }
    let over = match (&nvl, &class) {
        (Some(n), _) => format!("NV{n}"),
        (None, Some(c)) => format!("PCIe ({c})"),
        (None, None) => "PCIe".to_string(),
    };
    let (path, mut summary) = match p2p.map(|f| f.status) {
        Some(Status::Fail) => (
            DataPath::Staged,
            format!(
                "staged through host: {}",
                p2p.map(|f| f.message.as_str()).unwrap_or("")
            ),
        ),
        Some(Status::Pass) | Some(Status::Warn) => {
            let mut s = format!("p2p over {over}");
            if nvl.is_none() {
                let acs = acs_failures(ctx, fs, a.bdf, b.bdf);
                if !acs.is_empty() {
                    let names: Vec<&str> = acs.iter().map(|f| f.subject.as_str()).collect();
                    s = format!(
                        "p2p over PCIe through the root complex (ACS redirect on {})",
                        names.join(", ")
                    );
                    by.extend(acs.into_iter().map(FindingRef::to));
                }
            }
            if p2p.is_some_and(|f| f.status == Status::Warn) {
                s.push_str(" (degraded: see p2p)");
            }
            (DataPath::P2p, s)
        }
        _ => (
            DataPath::Unknown,
            match nvl {
                Some(n) => {
                    format!("p2p expected over NV{n} (not confirmed: needs CUDA/NVML or a probe)")
                }
                None => {
                    "unknown: P2P support not confirmed (needs CUDA/NVML or a probe)".to_string()
                }
            },
        ),
    };
    if let Some(g) = measured {
        summary.push_str(&format!(", measured {g:.1} GB/s"));
    }
    for var in ["NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL"] {
        if let Some(f) = find(fs, "nccl-env", var).filter(|f| f.status != Status::Pass) {
            summary.push_str(&format!("; for NCCL: {}", f.message));
            by.push(FindingRef::to(f));
        }
    }
    Verdict {
        subject,
        kind: "gpu-gpu".into(),
        path,
        class,
        summary,
        measured_gbps: measured,
        decided_by: by,
    }
}

/// How GPU memory gets registered with a NIC, as far as the findings show.
enum Registration {
    /// By this method (`dma-buf`, `peermem`).
    By(&'static str),
    /// Neither way, and why.
    Neither(String),
}

/// How GPU memory gets registered with a NIC; `None` when unknown.
fn registration(
    ctx: &Context,
    fs: &[Finding],
    g: &GpuRef,
    nic_label: &str,
    by: &mut Vec<FindingRef>,
) -> Option<Registration> {
    if let Some(f) = find(fs, "probe-register", &pair(&g.label, nic_label)) {
        by.push(FindingRef::to(f));
        return Some(match f.status {
            Status::Fail => {
                Registration::Neither("the probe could not register GPU memory either way".into())
            }
            _ if f.message.contains("via dma-buf") => Registration::By("dma-buf"),
            _ => Registration::By("peermem"),
        });
    }
    let dmabuf_gpu = find(fs, "dmabuf", &g.label);
    let dmabuf_host = find(fs, "dmabuf", "host");
    let peermem = find(fs, "peermem", "host");
    by.extend(
        [dmabuf_gpu, dmabuf_host, peermem]
            .into_iter()
            .flatten()
            .map(FindingRef::to),
    );
    let dmabuf_ok = dmabuf_gpu.is_some_and(|f| f.status == Status::Pass)
        && dmabuf_host.is_none_or(|f| f.status == Status::Pass);
    if dmabuf_ok {
        return Some(Registration::By("dma-buf"));
    }
    if peermem.is_some_and(|f| f.status == Status::Pass) {
        return Some(Registration::By("peermem"));
    }
    match dmabuf::outlook(ctx) {
        Outlook::Works(_) => Some(Registration::By("dma-buf")),
        Outlook::Likely(_) => Some(Registration::By("dma-buf (likely; not confirmed by CUDA)")),
        Outlook::No(why) => Some(Registration::Neither(format!(
            "no peermem and no dma-buf ({why})"
        ))),
        Outlook::Unknown(_) if peermem.is_some_and(|f| f.status == Status::Fail) => Some(
            Registration::Neither("no peermem, and dma-buf not shown to work".into()),
        ),
        Outlook::Unknown(_) => None,
    }
}

fn gpu_nic(ctx: &Context, fs: &[Finding], g: &GpuRef, nic: &RdmaDev) -> Verdict {
    let nl = ctx.nic_label(nic);
    let subject = pair(&g.label, &nl);
    let mut by = Vec::new();
    let class = nic.bdf.and_then(|b| ctx.class_between(g.bdf, b));
    let v = |path, summary: String, by: Vec<FindingRef>| Verdict {
        subject: subject.clone(),
        kind: "gpu-nic".into(),
        path,
        class: class.map(|c| c.to_string()),
        summary,
        measured_gbps: None,
        decided_by: by,
    };
    if let Some(f) = failing(fs, "rdma-devices", &nic.name) {
        return v(
            DataPath::None,
            format!("no path: {}", f.message),
            vec![FindingRef::to(f)],
        );
    }
    for (id, subj) in [("nccl-env", "NCCL_IB_DISABLE"), ("nccl-env", "NCCL_NET")] {
        if let Some(f) = failing(fs, id, subj) {
            by.push(FindingRef::to(f));
        }
    }
    if let Some(f) = failing(fs, "gpu-gdr-support", &g.label) {
        by.push(FindingRef::to(f));
        return v(
            DataPath::Staged,
            format!(
                "staged through host: {} does not support GPUDirect RDMA",
                g.label
            ),
            by,
        );
    }
    let reg = registration(ctx, fs, g, &nl, &mut by);
    if let Some(Registration::Neither(why)) = &reg {
        return v(DataPath::Staged, format!("staged through host: {why}"), by);
    }
    if let Some(c) = class {
        if let Some(f) = find(fs, "gpu-nic-distance", &subject) {
            by.push(FindingRef::to(f));
        }
        if !distance::gdr_allowed(ctx, c) {
            return v(
                DataPath::Staged,
                format!("staged through host: {nl} is {c} from {}, beyond NCCL's GPUDirect RDMA level (PXB)", g.label),
                by,
            );
        }
    }
    let how = match &reg {
        Some(Registration::By(m)) => format!("gdr via {m}"),
        _ => "gdr (registration method unconfirmed)".to_string(),
    };
    let at = class.map(|c| format!(" over {c}")).unwrap_or_default();
    let mut summary = format!("{how}{at}");
    if let Some(b) = nic.bdf {
        let acs = acs_failures(ctx, fs, g.bdf, b);
        if !acs.is_empty() {
            summary.push_str(", through the root complex (ACS redirect)");
            by.extend(acs.into_iter().map(FindingRef::to));
        }
    }
    let translated: Vec<&Finding> = [g.label.as_str(), nl.as_str()]
        .into_iter()
        .filter_map(|l| failing(fs, "iommu", l))
        .collect();
    if !translated.is_empty() {
        let who: Vec<&str> = translated.iter().map(|f| f.subject.as_str()).collect();
        summary.push_str(&format!(
            "; at risk: the IOMMU translates DMA for {}",
            who.join(" and ")
        ));
        by.extend(translated.into_iter().map(FindingRef::to));
    }
    let path = if reg.is_some() {
        DataPath::Gdr
    } else {
        DataPath::Unknown
    };
    v(path, summary, by)
}

/// All verdicts: GPU pairs first, then GPU↔NIC pairs (or one "network" verdict per GPU when
/// there is no RDMA device).
pub fn compute(ctx: &Context, fs: &[Finding]) -> Vec<Verdict> {
    let gpus = ctx.gpus();
    let mut out = Vec::new();
    for (i, a) in gpus.iter().enumerate() {
        for b in &gpus[i + 1..] {
            out.push(gpu_pair(ctx, fs, a, b));
        }
    }
    for g in gpus {
        if ctx.rdma().is_empty() {
            out.push(Verdict {
                subject: pair(&g.label, "network"),
                kind: "gpu-nic".into(),
                path: DataPath::Staged,
                class: None,
                summary: "no RDMA device: network traffic is staged through host memory (tcp)"
                    .into(),
                measured_gbps: None,
                decided_by: fs
                    .iter()
                    .filter(|f| f.id == "rdma-devices")
                    .map(FindingRef::to)
                    .collect(),
            });
            continue;
        }
        for nic in ctx.rdma() {
            out.push(gpu_nic(ctx, fs, g, nic));
        }
    }
    out
}
