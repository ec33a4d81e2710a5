//! `nvml`: NVML loads and sees the GPUs, and its driver version matches the kernel module
//! (a mismatch after a driver upgrade without reboot breaks NVML and CUDA alike).

use super::Check;
use crate::context::Context;
use crate::finding::Finding;

/// The `nvml` check.
pub struct Nvml;

impl Check for Nvml {
    fn id(&self) -> &'static str {
        "nvml"
    }
    fn title(&self) -> &'static str {
        "NVML loads, sees every GPU, matches the kernel driver version"
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
        let fix = "install the driver's libnvidia-ml.so.1 matching the loaded kernel module; after a driver upgrade, reboot or reload the modules";
        let nvml = match super::cuda::library(ctx, id, &live.nvml, fix) {
            Ok(n) => n,
            Err(fs) => return fs,
        };
        let mut ev: Vec<String> = nvml
            .devices
            .iter()
            .map(|d| {
                format!(
                    "nvmlDeviceGetHandleByIndex({}): {} at {}",
                    d.index,
                    d.name.as_deref().unwrap_or("?"),
                    d.bdf.map(|b| b.to_string()).unwrap_or_else(|| "?".into())
                )
            })
            .collect();
        let lib_ver = nvml.driver_version.clone();
        if let Some(v) = &lib_ver {
            ev.insert(0, format!("nvmlSystemGetDriverVersion() = {v}"));
        }
        let (kmod, kev) = super::driver::read(ctx);
        let kver = kmod.and_then(|k| k.version);
        if let (Some(l), Some(k)) = (&lib_ver, &kver) {
            if l != k {
                return vec![Finding::fail(
                    id,
                    "host",
                    format!("NVML library {l} does not match kernel module {k}"),
                )
                .evidence_all(ev)
                .evidence_all(kev)
                .fix(fix)];
            }
        }
        let (n, want) = (nvml.devices.len(), ctx.gpus().len());
        let ver = lib_ver.as_deref().unwrap_or("version unknown");
        let f = if n < want {
            Finding::warn(id, "host", format!("NVML {ver} sees {n} of {want} GPUs"))
                .fix("check `nvidia-smi` and dmesg for the missing GPUs")
        } else {
            Finding::pass(id, "host", format!("NVML {ver} works, {n} GPU(s)"))
        };
        vec![f.evidence_all(ev)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::{NvmlDevice, NvmlFacts, StaticFacts, Unavailable};
    use crate::testutil::{bdf, run, Tree};
    use crate::Status;

    fn facts(ver: &str) -> StaticFacts {
        let mut f = StaticFacts::none();
        f.nvml = Ok(NvmlFacts {
            driver_version: Some(ver.into()),
            devices: vec![NvmlDevice {
                index: 0,
                bdf: Some(bdf("0000:00:06.0")),
                ..Default::default()
            }],
        });
        f
    }

    #[test]
    fn pass_and_version_mismatch_fail() {
        let t = Tree::new();
        t.gpu("pci0000:00", &[], "0000:00:06.0");
        t.file("sys/module/nvidia/version", "580.159.04\n");
        let fs = run(&Nvml, &t.ctx().live(facts("580.159.04")).build());
        assert_eq!(fs[0].status, Status::Pass, "{fs:#?}");
        let fs = run(&Nvml, &t.ctx().live(facts("575.51.03")).build());
        assert_eq!(fs[0].status, Status::Fail);
        assert!(fs[0].message.contains("does not match"));
    }

    #[test]
    fn fail_when_missing_with_gpu() {
        let t = Tree::new();
        t.gpu("pci0000:00", &[], "0000:00:06.0");
        let mut f = StaticFacts::none();
        f.nvml = Err(Unavailable::failed(
            "libnvidia-ml.so.1",
            "nvmlInit: Driver/library version mismatch",
        ));
        let fs = run(&Nvml, &t.ctx().live(f).build());
        assert_eq!(fs[0].status, Status::Fail);
    }
}
