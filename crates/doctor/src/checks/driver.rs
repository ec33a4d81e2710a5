//! `driver`: the NVIDIA kernel driver is loaded, which version, open or proprietary module,
//! and every GPU is bound to it (not nouveau, not vfio-pci).
//!
//! The open/proprietary distinction matters because CUDA's dma-buf attribute is typically 1
//! only with the open kernel modules (gdr-checks A2).

use super::Check;
use crate::context::Context;
use crate::finding::Finding;
use gdx_topo::sysfs::devices::dev_dir;

/// The `driver` check.
pub struct Driver;

/// What `/proc/driver/nvidia/version` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverVersion {
    /// `580.159.04`.
    pub version: Option<String>,
    /// "Open Kernel Module" in the banner.
    pub open: bool,
    /// The first line, for evidence.
    pub banner: String,
}

/// Parse the NVRM banner, e.g.
/// `NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ...`.
pub fn parse_version_file(text: &str) -> Option<DriverVersion> {
    let line = text.lines().find(|l| l.contains("NVRM version"))?;
    let version = line
        .split_whitespace()
        .find(|t| {
            t.contains('.')
                && t.split('.').count() >= 2
                && t.split('.')
                    .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
        })
        .map(str::to_string);
    Some(DriverVersion {
        version,
        open: line.contains("Open Kernel Module"),
        banner: line.trim().to_string(),
    })
}

/// The driver as read from the root: `Some` when the module is loaded.
pub fn read(ctx: &Context) -> (Option<DriverVersion>, Vec<String>) {
    let mut ev = Vec::new();
    let proc_rel = "proc/driver/nvidia/version";
    let from_proc = ctx.fs.file_text(proc_rel).ok().and_then(|t| {
        let v = parse_version_file(&t)?;
        ev.push(format!("{}: {}", ctx.fs.show(proc_rel), v.banner));
        Some(v)
    });
    let mod_rel = "sys/module/nvidia/version";
    let from_sys = ctx.fs.text(mod_rel).inspect(|v| {
        ev.push(format!("{}: {v}", ctx.fs.show(mod_rel)));
    });
    let loaded = ctx.fs.exists("sys/module/nvidia");
    if from_proc.is_none() && from_sys.is_none() && loaded {
        ev.push(format!("{} exists", ctx.fs.show("sys/module/nvidia")));
    }
    let dv = match (from_proc, from_sys) {
        (Some(mut v), s) => {
            if v.version.is_none() {
                v.version = s;
            }
            Some(v)
        }
        (None, Some(s)) => Some(DriverVersion {
            version: Some(s),
            open: false,
            banner: String::new(),
        }),
        (None, None) if loaded => Some(DriverVersion {
            version: None,
            open: false,
            banner: String::new(),
        }),
        (None, None) => None,
    };
    (dv, ev)
}

impl Check for Driver {
    fn id(&self) -> &'static str {
        "driver"
    }
    fn title(&self) -> &'static str {
        "NVIDIA kernel driver loaded, version, open vs proprietary module"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        let (dv, ev) = read(ctx);
        if ctx.gpus().is_empty() {
            return vec![Finding::skip(id, "host", ctx.no_gpu_reason()).evidence_all(ev)];
        }
        let mut out = Vec::new();
        match &dv {
            None => out.push(
                Finding::fail(id, "host", "NVIDIA kernel driver is not loaded")
                    .evidence(format!(
                        "{} and {}: not found",
                        ctx.fs.show("proc/driver/nvidia/version"),
                        ctx.fs.show("sys/module/nvidia")
                    ))
                    .fix("install the NVIDIA driver (open kernel modules recommended) and run `modprobe nvidia`"),
            ),
            Some(v) => {
                let kind = if v.open {
                    "open kernel module"
                } else if v.banner.is_empty() {
                    "module flavour unknown"
                } else {
                    "proprietary kernel module (CUDA dma-buf is usually unavailable with it)"
                };
                let ver = v.version.as_deref().unwrap_or("version unknown");
                out.push(
                    Finding::pass(id, "host", format!("NVIDIA driver {ver}, {kind}"))
                        .evidence_all(ev),
                );
            }
        }
        for g in ctx.gpus() {
            let rel = format!("{}/driver", dev_dir(g.bdf));
            match ctx.fs.link_name(&rel) {
                Some(d) if d == "nvidia" => {}
                Some(d) => {
                    let (why, fix) = match d.as_str() {
                        "nouveau" => (
                            "bound to nouveau, which has no CUDA",
                            "blacklist nouveau (`echo blacklist nouveau > /etc/modprobe.d/blacklist-nouveau.conf`), update the initramfs and reboot",
                        ),
                        "vfio-pci" => (
                            "bound to vfio-pci (handed to a VM), so CUDA here cannot use it",
                            "unbind it from vfio-pci and bind it to nvidia if this host should use it",
                        ),
                        _ => ("bound to a driver other than nvidia", "bind the GPU to the nvidia driver"),
                    };
                    out.push(
                        Finding::fail(
                            id,
                            g.label.clone(),
                            format!("{} ({}) is {why}", g.label, g.bdf),
                        )
                        .evidence(format!("{} -> {d}", ctx.fs.show(&rel)))
                        .fix(fix),
                    );
                }
                // No driver link: either nothing bound (covered by "not loaded") or a
                // capture without symlinks; nothing more to say per GPU.
                None => {}
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{run, Tree};
    use crate::Status;

    const OPEN: &str = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U22)  Thu Jul 24 2025\nGCC version:  gcc version 12.3.0\n";
    const PROP: &str =
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n";

    #[test]
    fn banner_parses() {
        let v = parse_version_file(OPEN).unwrap();
        assert_eq!(v.version.as_deref(), Some("580.159.04"));
        assert!(v.open);
        let v = parse_version_file(PROP).unwrap();
        assert_eq!(v.version.as_deref(), Some("535.104.05"));
        assert!(!v.open);
        assert!(parse_version_file("garbage").is_none());
    }

    #[test]
    fn pass_with_open_module() {
        let t = Tree::new();
        t.gpu("pci0000:00", &[], "0000:00:06.0");
        t.file("proc/driver/nvidia/version", OPEN);
        let fs = run(&Driver, &t.ctx().build());
        assert_eq!(fs.len(), 1);
        assert_eq!(fs[0].status, Status::Pass);
        assert!(
            fs[0].message.contains("580.159.04, open kernel module"),
            "{}",
            fs[0].message
        );
    }

    #[test]
    fn fail_when_gpu_but_no_driver_and_when_bound_to_nouveau() {
        let t = Tree::new();
        t.gpu("pci0000:00", &[], "0000:00:06.0");
        let fs = run(&Driver, &t.ctx().build());
        assert_eq!(fs[0].status, Status::Fail);
        assert!(fs[0].fix.as_deref().unwrap().contains("modprobe nvidia"));

        t.file("sys/module/nvidia/version", "580.159.04\n");
        t.dir("sys/bus/pci/drivers/nouveau");
        t.link(
            "sys/bus/pci/devices/0000:00:06.0/driver",
            "sys/bus/pci/drivers/nouveau",
        );
        let fs = run(&Driver, &t.ctx().build());
        assert_eq!(fs[0].status, Status::Pass);
        let g = fs.iter().find(|f| f.subject == "GPU0").unwrap();
        assert_eq!(g.status, Status::Fail);
        assert!(g.message.contains("nouveau"));
    }

    #[test]
    fn skip_without_gpu() {
        let t = Tree::new();
        let fs = run(&Driver, &t.ctx().build());
        assert_eq!(fs[0].status, Status::Skip);
        assert!(fs[0]
            .reason
            .as_deref()
            .unwrap()
            .contains("PCI tree unreadable"));
        t.nic("pci0000:00", &[], "0000:00:03.0");
        let fs = run(&Driver, &t.ctx().build());
        assert_eq!(
            fs[0].reason.as_deref(),
            Some("no NVIDIA GPU in the PCI tree")
        );
    }
}
