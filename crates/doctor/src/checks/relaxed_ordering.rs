//! `relaxed-ordering`: PCIe Relaxed Ordering on the RDMA NICs (Device Control bit 4) and
//! NCCL's use of it (`NCCL_IB_PCI_RELAXED_ORDERING`, default 2 = auto). Relaxed ordering on
//! RDMA writes matters most on AMD and virtualised hosts (gdr-checks C1).

use super::mrrs::nic_devctl_or_skip;
use super::Check;
use crate::context::Context;
use crate::finding::Finding;

/// The `relaxed-ordering` check.
pub struct RelaxedOrdering;

impl Check for RelaxedOrdering {
    fn id(&self) -> &'static str {
        "relaxed-ordering"
    }
    fn title(&self) -> &'static str {
        "PCIe relaxed ordering enabled on RDMA NICs and not disabled for NCCL"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        let nics = match nic_devctl_or_skip(ctx, id) {
            Ok(n) => n,
            Err(fs) => return fs,
        };
        let mut out = Vec::new();
        if let Some(v) = ctx.env("NCCL_IB_PCI_RELAXED_ORDERING") {
            if v.trim() == "0" {
                out.push(
                    Finding::fail(
                        id,
                        "host",
                        "NCCL_IB_PCI_RELAXED_ORDERING=0: NCCL registers memory without relaxed ordering",
                    )
                    .evidence("NCCL_IB_PCI_RELAXED_ORDERING=0")
                    .fix("unset it (default 2 = use relaxed ordering when rdma-core has ibv_reg_mr_iova2)"),
                );
            }
        }
        for n in nics {
            let (dc, ev) = match n.devctl {
                Ok(x) => x,
                Err(why) => {
                    out.push(Finding::skip(id, n.label, why.to_string()));
                    continue;
                }
            };
            let f = if dc.relaxed_ordering() {
                Finding::pass(
                    id,
                    n.label.clone(),
                    format!("{} has relaxed ordering enabled", n.label),
                )
            } else {
                Finding::warn(
                    id,
                    n.label.clone(),
                    format!("{} has relaxed ordering disabled in PCIe Device Control (RlxdOrd-)", n.label),
                )
                .fix(format!(
                    "enable relaxed ordering in the BIOS where it is a platform option, or `setpci -s {} CAP_EXP+8.w={:04x}`; the kernel clears it deliberately below root ports with known ordering bugs",
                    n.bdf,
                    dc.0 | 0x10
                ))
            };
            out.push(f.evidence(ev));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{run, subject, Tree};
    use crate::Status;
    use gdx_topo::sysfs::config::ConfigBuilder;

    fn tree(devctl: u16) -> Tree {
        let t = Tree::new();
        t.ib_nic();
        t.attr(
            "0000:00:03.0",
            "config",
            ConfigBuilder::new().dev_ctl(devctl).build(),
        );
        t
    }

    #[test]
    fn ro_on_passes_off_warns() {
        let fs = run(&RelaxedOrdering, &tree(0x5030).ctx().build());
        assert_eq!(subject(&fs, "NIC0").status, Status::Pass);
        let fs = run(&RelaxedOrdering, &tree(0x5020).ctx().build());
        assert_eq!(subject(&fs, "NIC0").status, Status::Warn);
        assert!(subject(&fs, "NIC0")
            .fix
            .as_deref()
            .unwrap()
            .contains("CAP_EXP+8.w=5030"));
    }

    #[test]
    fn nccl_turning_it_off_fails() {
        let t = tree(0x5030);
        let fs = run(
            &RelaxedOrdering,
            &t.ctx().env("NCCL_IB_PCI_RELAXED_ORDERING", "0").build(),
        );
        assert_eq!(subject(&fs, "host").status, Status::Fail);
    }
}
