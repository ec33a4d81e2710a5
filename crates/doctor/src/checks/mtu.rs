//! `mtu`: the RDMA path MTU. NCCL uses the smaller `active_mtu` of both ends; on RoCE it derives
//! from the netdev MTU (1500 → 1024, 9000 → 4096), so a default 1500 MTU quarters the packet
//! size (gdr-checks D2). The switch MTU cannot be seen from the host.

use super::roce_gid;
use super::Check;
use crate::context::Context;
use crate::finding::Finding;

/// The `mtu` check.
pub struct Mtu;

/// The RoCE active MTU a netdev MTU gives (IB MTUs: 1024, 2048, 4096; headers take ~100 B).
pub fn roce_active_mtu(netdev_mtu: u32) -> u32 {
    if netdev_mtu >= 4200 {
        4096
    } else if netdev_mtu >= 2200 {
        2048
    } else {
        1024
    }
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
        let verbs = ctx.live().ok().and_then(|l| l.verbs.as_ref().ok());
        let active_mtu = |dev: &str, port: u32| {
            verbs?
                .devices
                .iter()
                .find(|d| d.name == dev)?
                .ports
                .iter()
                .find(|p| p.port == port)?
                .active_mtu
        };
        let mut out = Vec::new();
        for d in ctx.rdma() {
            for p in d.ports.iter().filter(|p| p.is_active()) {
                let subject = format!("{}/{}", d.name, p.port);
                let am = active_mtu(&d.name, p.port);
                let am_ev = am.map(|m| format!("ibv_query_port({subject}).active_mtu = {m}"));
                if !p.is_ethernet() {
                    let f = match am {
                        None => Finding::skip(id, subject, "InfiniBand path MTU is only visible through libibverbs (ibv_query_port)"),
                        Some(m) if m >= 4096 => Finding::pass(id, subject.clone(), format!("{subject}: active MTU {m}")),
                        Some(m) => Finding::warn(id, subject.clone(), format!("{subject}: active MTU {m} (4096 is best)"))
                            .fix("set the subnet manager / partition MTU to 4096"),
                    };
                    out.push(f.evidence_all(am_ev));
                    continue;
                }
                let ndev = roce_gid::gids(ctx, d, p.port)
                    .into_iter()
                    .find(|g| g.is_v2() && g.ndev.is_some())
                    .and_then(|g| g.ndev)
                    .or_else(|| d.netdevs.first().cloned());
                let Some(ndev) = ndev else {
                    out.push(
                        Finding::skip(id, subject, "no netdev found for this RoCE port")
                            .evidence_all(am_ev),
                    );
                    continue;
                };
                let rel = format!("sys/class/net/{ndev}/mtu");
                let Some(mtu) = ctx.fs.text(&rel).and_then(|m| m.parse::<u32>().ok()) else {
                    out.push(
                        Finding::skip(id, subject, format!("{} unreadable", ctx.fs.show(&rel)))
                            .evidence_all(am_ev),
                    );
                    continue;
                };
                let active = am.unwrap_or_else(|| roce_active_mtu(mtu));
                let ev = format!("{}: {mtu}", ctx.fs.show(&rel));
                let fix = format!("`ip link set {ndev} mtu 9000` (persist it in the network config) and set the switch ports to MTU >= 9216");
                let f = if active >= 4096 {
                    Finding::pass(
                        id,
                        subject.clone(),
                        format!("{subject} ({ndev}): MTU {mtu}, RoCE path MTU {active}"),
                    )
                } else if active >= 2048 {
                    Finding::warn(id, subject.clone(), format!("{subject} ({ndev}): MTU {mtu} gives RoCE path MTU {active} (4096 is best)")).fix(fix)
                } else {
                    Finding::fail(id, subject.clone(), format!("{subject} ({ndev}): MTU {mtu} gives RoCE path MTU {active}: a quarter of the best packet size")).fix(fix)
                };
                out.push(f.evidence(ev).evidence_all(am_ev));
            }
        }
        if out.is_empty() {
            out.push(Finding::skip(id, "host", "no active RDMA port"));
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
        t.nic("pci0000:00", &[], "0000:00:03.0");
        t.rdma(
            "mlx5_0",
            "0000:00:03.0",
            &[("4: ACTIVE", "Ethernet")],
            Some("eth2"),
        );
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
        assert_eq!(roce_active_mtu(1500), 1024);
        assert_eq!(roce_active_mtu(9000), 4096);
        assert_eq!(roce_active_mtu(4200), 4096);
    }
}
