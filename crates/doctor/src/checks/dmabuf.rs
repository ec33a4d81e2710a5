//! `dmabuf`: the dma-buf registration path (NCCL >= 2.13; NVIDIA's recommended alternative to
//! peermem). Needs all of: CUDA's `DMA_BUF_SUPPORTED` attribute on the GPU, a kernel with RDMA
//! dma-buf umem (>= 5.12), and an rdma-core exporting `ibv_reg_dmabuf_mr` whose provider
//! accepts it (NCCL's probe: `ibv_reg_dmabuf_mr(fd=-1)` → EBADF = supported) (gdr-checks A2).
//!
//! Findings: one for the kernel/rdma-core side (`host`), one per GPU for the CUDA side.

use super::peermem;
use super::Check;
use crate::context::Context;
use crate::facts::DmabufProbe;
use crate::finding::{Finding, Status};

/// The `dmabuf` check.
pub struct DmaBuf;

/// What is known about dma-buf on this machine, with the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outlook {
    /// Every part confirmed.
    Works(String),
    /// Not confirmed by the libraries but the static signs are good.
    Likely(String),
    /// Some part is known missing.
    No(String),
    /// Not enough information.
    Unknown(String),
}

/// `(major, minor)` of a kernel release string like `6.8.0-45-generic`.
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut it = release.trim().split(['.', '-']);
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

/// The kernel release under the root, with the file it came from.
fn kernel(ctx: &Context) -> Option<(String, (u32, u32))> {
    let rel = "proc/sys/kernel/osrelease";
    let r = ctx.fs.text(rel)?;
    let v = kernel_version(&r)?;
    Some((format!("{}: {r}", ctx.fs.show(rel)), v))
}

/// Kernel/rdma-core side: `Ok(Some(evidence))` confirmed, `Ok(None)` not contradicted,
/// `Err(why)` known missing.
fn host_side(ctx: &Context) -> Result<(bool, Vec<String>), (String, Vec<String>)> {
    let mut ev = Vec::new();
    let mut confirmed = false;
    match kernel(ctx) {
        Some((e, v)) => {
            ev.push(e);
            if v < (5, 12) {
                return Err((
                    format!("kernel {}.{} < 5.12 has no RDMA dma-buf support", v.0, v.1),
                    ev,
                ));
            }
        }
        None => ev.push(format!(
            "{}: unreadable",
            ctx.fs.show("proc/sys/kernel/osrelease")
        )),
    }
    if let Ok(Ok(v)) = ctx.live().map(|l| &l.verbs) {
        if let Some(has) = v.has_reg_dmabuf_mr {
            ev.push(format!("libibverbs exports ibv_reg_dmabuf_mr: {has}"));
            if !has {
                return Err((
                    "libibverbs lacks ibv_reg_dmabuf_mr (rdma-core < v34)".into(),
                    ev,
                ));
            }
        }
        match &v.dmabuf_probe {
            Some(DmabufProbe::Supported) => {
                ev.push("ibv_reg_dmabuf_mr(fd=-1) = EBADF: supported".into());
                confirmed = true;
            }
            Some(DmabufProbe::NotSupported(e)) => {
                ev.push(format!("ibv_reg_dmabuf_mr(fd=-1) = {e}"));
                return Err(("the RDMA provider rejects dma-buf MRs".into(), ev));
            }
            Some(DmabufProbe::Error(e)) => ev.push(format!("dma-buf probe: {e}")),
            None => {}
        }
    }
    Ok((confirmed, ev))
}

/// The overall outlook, used by `peermem` and the verdicts.
pub fn outlook(ctx: &Context) -> Outlook {
    let gpu = gpu_side(ctx);
    let host = host_side(ctx);
    if let Some((label, false)) = gpu.iter().find(|(_, v)| !v) {
        return Outlook::No(format!("CUDA reports DMA_BUF_SUPPORTED=0 on {label}"));
    }
    let (host_ok, _) = match host {
        Err((why, _)) => return Outlook::No(why),
        Ok(x) => x,
    };
    let gpu_ok = !gpu.is_empty() && gpu.len() == ctx.gpus().len();
    let open = super::driver::read(ctx).0.is_some_and(|d| d.open);
    let kernel_ok = kernel(ctx).is_some_and(|(_, v)| v >= (5, 12));
    match (gpu_ok, host_ok) {
        (true, true) => Outlook::Works("CUDA attribute and RDMA provider both confirm".into()),
        (true, false) if kernel_ok => {
            Outlook::Likely("CUDA attribute is 1 and the kernel is >= 5.12".into())
        }
        (false, _) if open && kernel_ok => Outlook::Likely(
            "open kernel module and kernel >= 5.12 (CUDA attribute not read)".into(),
        ),
        _ => Outlook::Unknown("CUDA attribute not read and static signs inconclusive".into()),
    }
}

/// `(GPU label, DMA_BUF_SUPPORTED)` for GPUs whose attribute is known.
fn gpu_side(ctx: &Context) -> Vec<(String, bool)> {
    ctx.gpus()
        .iter()
        .filter_map(|g| {
            let d = ctx.live().ok()?.cuda_device(g.bdf)?;
            Some((g.label.clone(), d.dmabuf_supported?))
        })
        .collect()
}

impl Check for DmaBuf {
    fn id(&self) -> &'static str {
        "dmabuf"
    }
    fn title(&self) -> &'static str {
        "dma-buf registration: CUDA attribute, kernel >= 5.12, rdma-core ibv_reg_dmabuf_mr"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        if ctx.gpus().is_empty() {
            return vec![Finding::skip(id, "host", ctx.no_gpu_reason())];
        }
        let peer = peermem::loaded(ctx).is_some();
        let has_rdma = !ctx.rdma().is_empty();
        // Missing dma-buf only breaks GPUDirect RDMA when peermem does not cover it.
        let missing_status = if has_rdma && !peer {
            Status::Fail
        } else {
            Status::Warn
        };
        let consequence = if !has_rdma {
            " (no RDMA device here, so nothing depends on it now)"
        } else if peer {
            " (peermem covers GPUDirect RDMA)"
        } else {
            " and no peermem either: GPUDirect RDMA is off"
        };
        let mut out = Vec::new();
        // Host side only matters with an RDMA device to register with.
        if has_rdma {
            out.push(match host_side(ctx) {
                Ok((true, ev)) => Finding::pass(id, "host", "kernel and RDMA provider support dma-buf MRs").evidence_all(ev),
                Ok((false, ev)) => Finding::pass(id, "host", "kernel >= 5.12 supports RDMA dma-buf (provider not probed)").evidence_all(ev),
                Err((why, ev)) => Finding::with_status(id, missing_status, "host", format!("{why}{consequence}"))
                    .evidence_all(ev)
                    .fix("use kernel >= 5.12 (distro 5.15+/6.x) and rdma-core >= v34 or current MOFED/DOCA; else load nvidia-peermem"),
            });
        }
        let nccl_off = ctx.env("NCCL_DMABUF_ENABLE") == Some("0");
        let live = ctx.live();
        for g in ctx.gpus() {
            let subject = g.label.clone();
            let dev = live.ok().and_then(|l| l.cuda_device(g.bdf));
            let f = match (live, dev.and_then(|d| d.dmabuf_supported)) {
                (Err(why), _) => {
                    let open = super::driver::read(ctx).0.is_some_and(|d| d.open);
                    Finding::skip(id, subject, format!("CUDA_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED needs libcuda: {why}"))
                        .evidence(format!("open kernel module: {open} (dma-buf is usually available only with it)"))
                }
                (Ok(_), None) => Finding::skip(
                    id,
                    subject,
                    "CUDA did not report DMA_BUF_SUPPORTED for this GPU (driver < 11.7 or CUDA unavailable)",
                ),
                (Ok(_), Some(true)) => {
                    let mut f = Finding::pass(id, subject, format!("{} supports dma-buf export", g.label))
                        .evidence("cuDeviceGetAttribute(DMA_BUF_SUPPORTED=124) = 1");
                    if nccl_off {
                        f = Finding::warn(id, g.label.clone(), format!("{} supports dma-buf but NCCL_DMABUF_ENABLE=0 turns it off for NCCL", g.label))
                            .evidence("cuDeviceGetAttribute(DMA_BUF_SUPPORTED=124) = 1")
                            .evidence("NCCL_DMABUF_ENABLE=0")
                            .fix("unset NCCL_DMABUF_ENABLE");
                    }
                    f
                }
                (Ok(_), Some(false)) => Finding::with_status(
                    id,
                    missing_status,
                    subject,
                    format!("{} cannot export dma-buf{consequence}", g.label),
                )
                .evidence("cuDeviceGetAttribute(DMA_BUF_SUPPORTED=124) = 0")
                .fix("use the open GPU kernel modules (nvidia-open) on a supported GPU, or load nvidia-peermem"),
            };
            out.push(f);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::VerbsFacts;
    use crate::testutil::{cuda_facts, run, subject, Tree};

    fn tree() -> Tree {
        let t = Tree::with_gpu_and_ib_nic();
        t.file("proc/sys/kernel/osrelease", "6.8.0-45-generic\n");
        t
    }

    #[test]
    fn kernel_versions() {
        assert_eq!(kernel_version("6.8.0-45-generic"), Some((6, 8)));
        assert_eq!(kernel_version("5.4.0"), Some((5, 4)));
        assert_eq!(kernel_version("x"), None);
    }

    #[test]
    fn pass_when_everything_confirms() {
        let t = tree();
        let mut f = cuda_facts(&["0000:00:06.0"]);
        f.verbs = Ok(VerbsFacts {
            devices: vec![],
            has_reg_dmabuf_mr: Some(true),
            dmabuf_probe: Some(DmabufProbe::Supported),
        });
        let ctx = t.ctx().live(f).build();
        let fs = run(&DmaBuf, &ctx);
        assert_eq!(subject(&fs, "host").status, Status::Pass);
        assert_eq!(subject(&fs, "GPU0").status, Status::Pass);
        assert!(matches!(outlook(&ctx), Outlook::Works(_)));
    }

    #[test]
    fn fail_when_gpu_cannot_and_no_peermem_warn_with_peermem() {
        let t = tree();
        let mut f = cuda_facts(&["0000:00:06.0"]);
        if let Ok(c) = f.cuda.as_mut() {
            c.devices[0].dmabuf_supported = Some(false);
        }
        let fs = run(&DmaBuf, &t.ctx().live(f.clone()).build());
        assert_eq!(subject(&fs, "GPU0").status, Status::Fail);
        t.file("sys/module/nvidia_peermem/version", "1\n");
        let fs = run(&DmaBuf, &t.ctx().live(f).build());
        assert_eq!(subject(&fs, "GPU0").status, Status::Warn);
    }

    #[test]
    fn old_kernel_fails_host_side() {
        let t = tree();
        t.file("proc/sys/kernel/osrelease", "5.4.0-150-generic\n");
        let ctx = t.ctx().live(cuda_facts(&["0000:00:06.0"])).build();
        let fs = run(&DmaBuf, &ctx);
        assert_eq!(subject(&fs, "host").status, Status::Fail);
        assert!(subject(&fs, "host").message.contains("5.4 < 5.12"));
        assert!(matches!(outlook(&ctx), Outlook::No(_)));
    }

    #[test]
    fn provider_rejecting_dmabuf_fails() {
        let t = tree();
        let mut f = cuda_facts(&["0000:00:06.0"]);
        f.verbs = Ok(VerbsFacts {
            devices: vec![],
            has_reg_dmabuf_mr: Some(true),
            dmabuf_probe: Some(DmabufProbe::NotSupported("EOPNOTSUPP".into())),
        });
        let fs = run(&DmaBuf, &t.ctx().live(f).build());
        assert_eq!(subject(&fs, "host").status, Status::Fail);
    }

    #[test]
    fn offline_gpu_side_skips() {
        let t = tree();
        let fs = run(&DmaBuf, &t.ctx().build());
        assert_eq!(subject(&fs, "GPU0").status, Status::Skip);
        assert_eq!(subject(&fs, "host").status, Status::Pass);
    }
}
