//! `gpu-gdr-support`: CUDA's `GPU_DIRECT_RDMA_SUPPORTED` attribute (116) per GPU. NCCL writes
//! `<gpu gdr="...">` from it; GeForce parts, some vGPU profiles and integrated GPUs report 0
//! (gdr-checks A3).

use super::Check;
use crate::context::Context;
use crate::finding::{Finding, Status};

/// The `gpu-gdr-support` check.
pub struct GdrSupport;

impl Check for GdrSupport {
    fn id(&self) -> &'static str {
        "gpu-gdr-support"
    }
    fn title(&self) -> &'static str {
        "CUDA reports GPUDirect RDMA support on each GPU"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        if ctx.gpus().is_empty() {
            return vec![Finding::skip(id, "host", ctx.no_gpu_reason())];
        }
        let live = match super::live_or_skip(ctx, id) {
            Ok(l) => l,
            Err(fs) => return fs,
        };
        if let Err(u) = &live.cuda {
            return vec![Finding::skip(id, "host", format!("needs CUDA: {u}"))];
        }
        let no_status = if ctx.rdma().is_empty() {
            Status::Warn
        } else {
            Status::Fail
        };
        ctx.gpus()
            .iter()
            .map(|g| {
                let Some(d) = live.cuda_device(g.bdf) else {
                    return Finding::skip(
                        id,
                        g.label.clone(),
                        format!("CUDA has no device at {} (hidden by CUDA_VISIBLE_DEVICES?)", g.bdf),
                    );
                };
                let vmm = d
                    .gdr_with_vmm_supported
                    .map(|v| format!("cuDeviceGetAttribute(GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED=110) = {}", u8::from(v)));
                let f = match d.gdr_supported {
                    Some(true) => Finding::pass(id, g.label.clone(), format!("{} supports GPUDirect RDMA", g.label)),
                    Some(false) => Finding::with_status(
                        id,
                        no_status,
                        g.label.clone(),
                        format!("{} does not support GPUDirect RDMA: NICs cannot read or write its memory", g.label),
                    )
                    .fix("only a data-center GPU, a supported vGPU profile or a newer driver changes this; traffic will be staged through host memory"),
                    None => {
                        return Finding::skip(
                            id,
                            g.label.clone(),
                            "driver does not report attribute 116 (CUDA < 11.3)",
                        )
                    }
                };
                f.evidence(format!(
                    "cuDeviceGetAttribute(GPU_DIRECT_RDMA_SUPPORTED=116) = {}",
                    u8::from(d.gdr_supported == Some(true))
                ))
                .evidence_all(vmm)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{cuda_facts, run, Tree};

    fn tree() -> Tree {
        Tree::with_gpu_and_ib_nic()
    }

    #[test]
    fn pass_and_fail_from_the_attribute() {
        let t = tree();
        let fs = run(
            &GdrSupport,
            &t.ctx().live(cuda_facts(&["0000:00:06.0"])).build(),
        );
        assert_eq!(fs[0].status, Status::Pass);
        let mut f = cuda_facts(&["0000:00:06.0"]);
        if let Ok(c) = f.cuda.as_mut() {
            c.devices[0].gdr_supported = Some(false);
        }
        let fs = run(&GdrSupport, &t.ctx().live(f).build());
        assert_eq!(fs[0].status, Status::Fail);
        assert!(fs[0].evidence[0].ends_with("= 0"));
    }

    #[test]
    fn offline_skips() {
        let t = tree();
        let fs = run(&GdrSupport, &t.ctx().build());
        assert_eq!(fs[0].status, Status::Skip);
    }
}
