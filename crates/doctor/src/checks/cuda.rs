//! `cuda`: libcuda loads, `cuInit` succeeds, and CUDA sees the GPUs of the PCI tree.

use super::Check;
use crate::context::Context;
use crate::facts::{Unavailable, UnavailableKind};
use crate::finding::Finding;

/// The `cuda` check.
pub struct Cuda;

/// Turn a library result into either its facts or the findings that replace them: skip
/// when there is no GPU or nobody asked, fail when a GPU exists but the library is unusable.
pub(crate) fn library<'a, T>(
    ctx: &Context,
    id: &str,
    r: &'a Result<T, Unavailable>,
    fix: &str,
) -> Result<&'a T, Vec<Finding>> {
    match r {
        Ok(v) if !ctx.gpus().is_empty() => Ok(v),
        Ok(_) => Err(vec![Finding::skip(id, "host", ctx.no_gpu_reason())]),
        Err(u) if ctx.gpus().is_empty() => {
            Err(vec![
                Finding::skip(id, "host", ctx.no_gpu_reason()).evidence(u.to_string())
            ])
        }
        Err(u) if u.kind == UnavailableKind::NotQueried => {
            Err(vec![Finding::skip(id, "host", u.to_string())])
        }
        Err(u) => Err(vec![Finding::fail(
            id,
            "host",
            format!(
                "{} GPU(s) in the PCI tree but {} is unusable",
                ctx.gpus().len(),
                u.library
            ),
        )
        .evidence(u.to_string())
        .fix(fix)]),
    }
}

impl Check for Cuda {
    fn id(&self) -> &'static str {
        "cuda"
    }
    fn title(&self) -> &'static str {
        "libcuda loads, cuInit works, CUDA sees every GPU"
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
        let cuda = match library(
            ctx,
            id,
            &live.cuda,
            "install the driver's user-space libraries (libcuda.so.1); in containers use the NVIDIA container toolkit (`--gpus all`)",
        ) {
            Ok(c) => c,
            Err(fs) => return fs,
        };
        let ver = cuda
            .driver_version
            .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10))
            .unwrap_or_else(|| "?".into());
        let mut ev = vec![format!(
            "cuDriverGetVersion() = {}",
            cuda.driver_version.unwrap_or(0)
        )];
        if let Some(p) = &cuda.library_path {
            ev.push(format!("loaded {p}"));
        }
        for d in &cuda.devices {
            ev.push(format!(
                "device {}: {} at {}",
                d.ordinal,
                d.name.as_deref().unwrap_or("?"),
                d.bdf.map(|b| b.to_string()).unwrap_or_else(|| "?".into())
            ));
        }
        let (n, want) = (cuda.devices.len(), ctx.gpus().len());
        let cvd = ctx.env("CUDA_VISIBLE_DEVICES");
        if let Some(v) = cvd {
            ev.push(format!("CUDA_VISIBLE_DEVICES={v}"));
        }
        let f = if n == 0 {
            Finding::fail(id, "host", format!("CUDA {ver} sees no device ({want} GPU(s) in the PCI tree)"))
                .fix(if cvd.is_some() {
                    "unset or correct CUDA_VISIBLE_DEVICES"
                } else {
                    "check `nvidia-smi` and dmesg for GPUs that fell off the bus or failed to initialise"
                })
        } else if n < want && cvd.is_none() {
            Finding::warn(id, "host", format!("CUDA {ver} sees {n} of {want} GPUs"))
                .fix("check `nvidia-smi` and dmesg for the missing GPUs (Xid errors, fallen off the bus)")
        } else {
            Finding::pass(id, "host", format!("CUDA {ver} works, {n} device(s)"))
        };
        vec![f.evidence_all(ev)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::StaticFacts;
    use crate::testutil::{cuda_facts, run, Tree};
    use crate::Status;

    fn tree() -> Tree {
        let t = Tree::new();
        t.gpu("pci0000:00", &[], "0000:00:06.0");
        t.gpu("pci0000:00", &[], "0000:00:07.0");
        t
    }

    #[test]
    fn pass_when_cuda_sees_every_gpu() {
        let t = tree();
        let ctx = t
            .ctx()
            .live(cuda_facts(&["0000:00:06.0", "0000:00:07.0"]))
            .build();
        let fs = run(&Cuda, &ctx);
        assert_eq!(fs[0].status, Status::Pass, "{fs:#?}");
        assert!(fs[0].message.contains("CUDA 13.0"));
    }

    #[test]
    fn fail_when_libcuda_missing_on_a_gpu_machine() {
        let t = tree();
        let mut f = StaticFacts::none();
        f.cuda = Err(Unavailable::missing(
            "libcuda.so.1",
            "tried libcuda.so.1, libcuda.so",
        ));
        let fs = run(&Cuda, &t.ctx().live(f).build());
        assert_eq!(fs[0].status, Status::Fail);
        assert!(fs[0].evidence[0].contains("tried libcuda.so.1"));
    }

    #[test]
    fn warn_when_a_gpu_is_missing_and_skip_without_gpu_or_live() {
        let t = tree();
        let fs = run(&Cuda, &t.ctx().live(cuda_facts(&["0000:00:06.0"])).build());
        assert_eq!(fs[0].status, Status::Warn);
        let fs = run(
            &Cuda,
            &t.ctx()
                .env("CUDA_VISIBLE_DEVICES", "0")
                .live(cuda_facts(&["0000:00:06.0"]))
                .build(),
        );
        assert_eq!(fs[0].status, Status::Pass);
        let fs = run(&Cuda, &t.ctx().build());
        assert_eq!(fs[0].status, Status::Skip);
        let empty = Tree::new();
        empty.nic("pci0000:00", &[], "0000:00:03.0");
        let fs = run(&Cuda, &empty.ctx().live(StaticFacts::none()).build());
        assert_eq!(
            fs[0].reason.as_deref(),
            Some("no NVIDIA GPU in the PCI tree")
        );
    }
}
