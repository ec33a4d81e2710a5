//! `iommu`: GPUs and RDMA NICs must not sit in translated IOMMU domains. GPUDirect RDMA
//! assumes every device sees the same physical addresses, so translation other than 1:1 breaks
//! or slows it (gdr-checks B4). Read per device from `iommu_group/type` (`identity` = passthrough,
//! `DMA`/`DMA-FQ` = translated), with `/sys/class/iommu` and `/proc/cmdline` as context.

use super::Check;
use crate::context::Context;
use crate::finding::Finding;
use gdx_topo::sysfs::devices::dev_dir;
use gdx_topo::PciAddr;

/// The `iommu` check.
pub struct Iommu;

/// The IOMMU-related words of a kernel command line.
pub fn cmdline_iommu(cmdline: &str) -> Vec<String> {
    cmdline
        .split_whitespace()
        .filter(|t| t.contains("iommu"))
        .map(str::to_string)
        .collect()
}

/// True when the command line asks for passthrough (`iommu=pt`, `iommu.passthrough=1`).
pub fn cmdline_passthrough(words: &[String]) -> bool {
    words
        .iter()
        .any(|w| w == "iommu=pt" || w == "iommu.passthrough=1" || w == "iommu.passthrough=on")
}

const FIX: &str = "add `iommu=pt` (x86) or `iommu.passthrough=1` (arm64) to the kernel command line, or disable VT-d/AMD-Vi if no VMs or SR-IOV need it; inside VMs use ATS with ACS DirectTrans";

impl Check for Iommu {
    fn id(&self) -> &'static str {
        "iommu"
    }
    fn title(&self) -> &'static str {
        "GPUs and RDMA NICs in identity (passthrough) IOMMU domains"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        let units = ctx.fs.names_or_empty("sys/class/iommu");
        let words = ctx.fs.text("proc/cmdline").map(|c| cmdline_iommu(&c));
        let pt = words.as_deref().is_some_and(cmdline_passthrough);
        let mut ctx_ev = vec![if units.is_empty() {
            format!(
                "{}: empty or missing (no IOMMU active)",
                ctx.fs.show("sys/class/iommu")
            )
        } else {
            format!("{}: {}", ctx.fs.show("sys/class/iommu"), units.join(" "))
        }];
        match &words {
            Some(w) if !w.is_empty() => {
                ctx_ev.push(format!("{}: {}", ctx.fs.show("proc/cmdline"), w.join(" ")))
            }
            Some(_) => ctx_ev.push(format!("{}: no iommu options", ctx.fs.show("proc/cmdline"))),
            None => {}
        }
        let mut devs: Vec<(String, PciAddr)> = ctx
            .gpus()
            .iter()
            .map(|g| (g.label.clone(), g.bdf))
            .collect();
        for d in ctx.rdma() {
            if let Some(b) = d.bdf {
                if !devs.iter().any(|(_, x)| *x == b) {
                    devs.push((ctx.nic_label(d), b));
                }
            }
        }
        if devs.is_empty() {
            return vec![Finding::skip(
                id,
                "host",
                format!("{} and no RDMA device", ctx.no_gpu_reason()),
            )
            .evidence_all(ctx_ev)];
        }
        devs.into_iter()
            .map(|(label, bdf)| {
                let grp_rel = format!("{}/iommu_group", dev_dir(bdf));
                let group = ctx.fs.link_name(&grp_rel);
                let ty_rel = format!("{grp_rel}/type");
                let ty = ctx.fs.text(&ty_rel);
                let mut ev = Vec::new();
                if let Some(g) = &group {
                    ev.push(format!("{} -> {g}", ctx.fs.show(&grp_rel)));
                }
                if let Some(t) = &ty {
                    ev.push(format!("{}: {t}", ctx.fs.show(&ty_rel)));
                }
                ev.extend(ctx_ev.iter().cloned());
                let f = match (group.is_some() || ctx.fs.exists(&grp_rel), ty.as_deref()) {
                    (_, Some("identity")) => Finding::pass(id, label.clone(), format!("{label} is in an identity (passthrough) IOMMU domain")),
                    (_, Some(t)) if t.starts_with("DMA") => Finding::fail(
                        id,
                        label.clone(),
                        format!("{label} is in a translated IOMMU domain ({t}): GPUDirect RDMA needs 1:1 addresses"),
                    )
                    .fix(FIX),
                    (_, Some(t)) => Finding::warn(
                        id,
                        label.clone(),
                        format!("{label} IOMMU domain type is {t} (assigned to VFIO/a VM?)"),
                    )
                    .fix("bind the device to its host driver if this host should use it"),
                    (true, None) if pt => Finding::pass(id, label.clone(), format!("{label} has an IOMMU group and the kernel runs passthrough")),
                    (true, None) => Finding::warn(
                        id,
                        label.clone(),
                        format!("{label} is in an IOMMU group of unknown type and the command line does not ask for passthrough"),
                    )
                    .fix(FIX),
                    (false, None) if units.is_empty() => Finding::pass(id, label.clone(), format!("no IOMMU active: {label}'s DMA is untranslated")),
                    (false, None) => Finding::pass(id, label.clone(), format!("{label} is not in an IOMMU group: its DMA is untranslated")),
                };
                f.evidence_all(ev)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{run, Tree};
    use crate::Status;

    fn tree(ty: Option<&str>) -> Tree {
        let t = Tree::new();
        t.gpu("pci0000:00", &[], "0000:00:06.0");
        t.dir("sys/class/iommu/dmar0");
        t.file(
            "proc/cmdline",
            "BOOT_IMAGE=/vmlinuz root=/dev/sda1 intel_iommu=on quiet\n",
        );
        t.dir("sys/kernel/iommu_groups/17/devices");
        if let Some(ty) = ty {
            t.file("sys/kernel/iommu_groups/17/type", format!("{ty}\n"));
        }
        t.link(
            "sys/bus/pci/devices/0000:00:06.0/iommu_group",
            "sys/kernel/iommu_groups/17",
        );
        t
    }

    #[test]
    fn translated_group_fails() {
        let t = tree(Some("DMA-FQ"));
        let fs = run(&Iommu, &t.ctx().build());
        assert_eq!(fs[0].status, Status::Fail);
        assert!(fs[0].evidence.iter().any(|e| e.ends_with("type: DMA-FQ")));
        assert!(fs[0].evidence.iter().any(|e| e.contains("intel_iommu=on")));
    }

    #[test]
    fn identity_group_passes() {
        let t = tree(Some("identity"));
        assert_eq!(run(&Iommu, &t.ctx().build())[0].status, Status::Pass);
    }

    #[test]
    fn untyped_group_follows_cmdline_and_no_iommu_passes() {
        let t = tree(None);
        assert_eq!(run(&Iommu, &t.ctx().build())[0].status, Status::Warn);
        t.file("proc/cmdline", "root=/dev/sda1 intel_iommu=on iommu=pt\n");
        assert_eq!(run(&Iommu, &t.ctx().build())[0].status, Status::Pass);

        let t = Tree::new();
        t.gpu("pci0000:00", &[], "0000:00:06.0");
        let fs = run(&Iommu, &t.ctx().build());
        assert_eq!(fs[0].status, Status::Pass);
        assert!(fs[0].message.contains("no IOMMU active"));
    }

    #[test]
    fn cmdline_words() {
        let w = cmdline_iommu("a iommu.passthrough=1 amd_iommu=on b");
        assert_eq!(w, ["iommu.passthrough=1", "amd_iommu=on"]);
        assert!(cmdline_passthrough(&w));
    }
}
