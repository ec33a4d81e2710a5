//! `mtu`: the RDMA path MTU. NCCL uses the smaller `active_mtu` of both ends; on RoCE it derives
//! from the netdev MTU (1500 → 1024, 9000 → 4096), so a default 1500 MTU quarters the packet
//! size (gdr-checks D2). The switch MTU cannot be seen from the host.
//!
//! The ports, the RoCE netdev, its MTU and the path MTU it allows come from gdx-rdma
//! ([`gdx_rdma::doctor::port_mtus_at_root`]) over the sysfs topology of the root, so this works
//! on a captured `--root`; the verbs active MTU is added from the live libibverbs facts.

use super::Check;
use crate::context::Context;
use crate::finding::Finding;
use gdx_rdma::doctor::{port_mtus_at_root, PortMtu};
use gdx_rdma::gid::LinkKind;

/// The `mtu` check.
pub struct Mtu;

fn port_finding(ctx: &Context, id: &str, p: &PortMtu) -> Finding {
    let subject = format!("{}/{}", p.device, p.port);
    let am = p.active_mtu;
    let am_ev = am.map(|m| format!("ibv_query_port({subject}).active_mtu = {m}"));
    if p.link != LinkKind::Ethernet {
        let f = match am {
            None => Finding::skip(
                id,
                subject,
                "InfiniBand path MTU is only visible through libibverbs (ibv_query_port)",
            ),
            Some(m) if m >= 4096 => {
                Finding::pass(id, subject.clone(), format!("{subject}: active MTU {m}"))
            }
            Some(m) => Finding::warn(
                id,
                subject.clone(),
                format!("{subject}: active MTU {m} (4096 is best)"),
            )
            .fix("set the subnet manager / partition MTU to 4096"),
        };
        return f.evidence_all(am_ev);
    }
    let Some((ndev, mtu)) = &p.netdev else {
        return Finding::skip(id, subject, "no netdev found for this RoCE port")
            .evidence_all(am_ev);
    };
    let rel = format!("sys/class/net/{ndev}/mtu");
    let Some(mtu) = *mtu else {
        return Finding::skip(id, subject, format!("{} unreadable", ctx.fs.show(&rel)))
            .evidence_all(am_ev);
    };
    let ev = format!("{}: {mtu}", ctx.fs.show(&rel));
    let fix = format!("`ip link set {ndev} mtu 9000` (persist it in the network config) and set the switch ports to MTU >= 9216");
    let f = match p.effective_mtu() {
        Some(active) if active >= 4096 => Finding::pass(
            id,
            subject.clone(),
            format!("{subject} ({ndev}): MTU {mtu}, RoCE path MTU {active}"),
        ),
        Some(active) if active >= 2048 => Finding::warn(
            id,
            subject.clone(),
            format!("{subject} ({ndev}): MTU {mtu} gives RoCE path MTU {active} (4096 is best)"),
        )
        .fix(fix),
        Some(active) => Finding::fail(
            id,
            subject.clone(),
            format!("{subject} ({ndev}): MTU {mtu} gives RoCE path MTU {active}: a quarter of the best packet size"),
        )
        .fix(fix),
        None => Finding::fail(
            id,
            subject.clone(),
            format!("{subject} ({ndev}): MTU {mtu} leaves no room for RoCE packets"),
        )
        .fix(fix),
    };
    f.evidence(ev).evidence_all(am_ev)
}

impl Check for Mtu {
    fn id(&self) -> &'static str {
        "mtu"
    }
    fn title(&self) -> &'static str {
        "RDMA ports run a 4096-byte path MTU (RoCE netdev MTU >= 4200)"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        let topo = match super::rdma_ports_or_skip(ctx, id) {
            Ok(t) => t,
            Err(skip) => return skip,
        };
        let root = ctx.fs.root();
        let verbs = ctx.live().ok().and_then(|l| l.verbs.as_ref().ok());
        let verbs_mtu = |dev: &str, port: u32| {
            verbs
                .and_then(|v| v.devices.iter().find(|d| d.name == dev))
                .and_then(|d| d.ports.iter().find(|p| p.port == port))
                .map_or((None, None), |p| (p.active_mtu, p.max_mtu))
        };
        let out: Vec<Finding> = port_mtus_at_root(&topo, root, &verbs_mtu)
            .iter()
            .filter(|p| p.is_active())
            .map(|p| port_finding(ctx, id, p))
            .collect();
        if out.is_empty() {
            return vec![Finding::skip(id, "host", "no active RDMA port")];
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{run, Tree};
    use crate::Status;

    fn tree(mtu: &str) -> Tree {
        let t = Tree::new();
        t.roce_nic();
        t.file("sys/class/net/eth2/mtu", format!("{mtu}\n"));
        t
    }

    #[test]
    fn jumbo_passes_default_fails() {
        let fs = run(&Mtu, &tree("9000").ctx().build());
        assert_eq!(fs[0].status, Status::Pass, "{fs:#?}");
        let fs = run(&Mtu, &tree("1500").ctx().build());
        assert_eq!(fs[0].status, Status::Fail);
        assert!(fs[0].message.contains("path MTU 1024"));
        assert_eq!(
            run(&Mtu, &tree("4000").ctx().build())[0].status,
            Status::Warn
        );
    }

    #[test]
    fn ib_needs_verbs_and_down_ports_are_ignored() {
        let t = Tree::new();
        t.nic("pci0000:00", &[], "0000:00:03.0");
        t.rdma(
            "mlx5_0",
            "0000:00:03.0",
            &[("4: ACTIVE", "InfiniBand"), ("1: DOWN", "Ethernet")],
            None,
        );
        let fs = run(&Mtu, &t.ctx().build());
        assert_eq!(fs.len(), 1);
        assert_eq!(fs[0].status, Status::Skip);
    }

    #[test]
    fn active_mtu_table() {
        // The netdev → RoCE path MTU rule is gdx-rdma's; the thresholds this check judges by.
        use gdx_rdma::doctor::roce_mtu_for_netdev;
        assert_eq!(roce_mtu_for_netdev(1500), Some(1024));
        assert_eq!(roce_mtu_for_netdev(9000), Some(4096));
        assert_eq!(roce_mtu_for_netdev(4200), Some(4096));
    }

    #[test]
    fn live_verbs_active_mtu_decides() {
        use crate::facts::{StaticFacts, VerbsDevice, VerbsFacts, VerbsPort};
        let t = tree("9000");
        let mut f = StaticFacts::none();
        f.verbs = Ok(VerbsFacts {
            devices: vec![VerbsDevice {
                name: "mlx5_0".into(),
                ports: vec![VerbsPort {
                    port: 1,
                    active_mtu: Some(1024),
                    max_mtu: Some(4096),
                }],
            }],
            ..VerbsFacts::default()
        });
        let fs = run(&Mtu, &t.ctx().live(f).build());
        assert_eq!(fs[0].status, Status::Fail, "{fs:#?}");
        assert!(fs[0]
            .evidence
            .iter()
            .any(|e| e == "ibv_query_port(mlx5_0/1).active_mtu = 1024"));
    }

    #[test]
    fn no_rdma_device_and_unreadable_mtu_are_skips_with_reasons() {
        let t = Tree::new();
        t.nic("pci0000:00", &[], "0000:00:03.0");
        let fs = run(&Mtu, &t.ctx().build());
        assert_eq!(fs[0].status, Status::Skip);
        assert!(
            fs[0]
                .reason
                .as_deref()
                .unwrap()
                .contains("no RDMA stack loaded"),
            "{fs:#?}"
        );
        let t = tree("garbage");
        let fs = run(&Mtu, &t.ctx().build());
        assert_eq!(fs[0].status, Status::Skip, "{fs:#?}");
        assert!(fs[0].reason.as_deref().unwrap().contains("unreadable"));
    }
}
