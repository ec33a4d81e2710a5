//! `roce-gid`: every active RoCE (Ethernet link layer) port has a RoCE v2 GID carrying an IP
//! address. NCCL auto-selects a v2 GID matching its address family; no IP on the netdev means
//! no such GID, hence connection failures or a fallback to v1 (gdr-checks D1).

use super::Check;
use crate::context::Context;
use crate::finding::Finding;
use crate::pci::{RdmaDev, RdmaPort};

/// The `roce-gid` check.
pub struct RoceGid;

/// One non-empty GID table entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidEntry {
    /// Index.
    pub index: u32,
    /// The GID text.
    pub gid: String,
    /// `RoCE v2`, `IB/RoCE v1`, when readable.
    pub gid_type: Option<String>,
    /// Netdev, when readable.
    pub ndev: Option<String>,
}

impl GidEntry {
    /// RoCE v2.
    pub fn is_v2(&self) -> bool {
        self.gid_type.as_deref().is_some_and(|t| t.contains("v2"))
    }

    /// The IP address the GID carries: IPv4-mapped (`::ffff:a.b.c.d`) or a global IPv6;
    /// `None` for link-local (`fe80::`) GIDs, which are made from the MAC, not an IP.
    pub fn ip(&self) -> Option<String> {
        let groups: Vec<u16> = self
            .gid
            .split(':')
            .map(|g| u16::from_str_radix(g, 16))
            .collect::<Result<_, _>>()
            .ok()?;
        if groups.len() != 8 || groups.iter().all(|g| *g == 0) {
            return None;
        }
        if groups[..5].iter().all(|g| *g == 0) && groups[5] == 0xffff {
            let (a, b) = (groups[6], groups[7]);
            return Some(format!("{}.{}.{}.{}", a >> 8, a & 0xff, b >> 8, b & 0xff));
        }
        if groups[0] & 0xffc0 == 0xfe80 {
            return None;
        }
        Some(
            std::net::Ipv6Addr::new(
                groups[0], groups[1], groups[2], groups[3], groups[4], groups[5], groups[6],
                groups[7],
            )
            .to_string(),
        )
    }
}

/// Non-empty GIDs of a port.
pub fn gids(ctx: &Context, dev: &RdmaDev, port: u32) -> Vec<GidEntry> {
    let pd = dev.port_dir(port);
    ctx.fs
        .list_or_empty(&format!("{pd}/gids"))
        .into_iter()
        .filter_map(|i| i.parse::<u32>().ok())
        .filter_map(|index| {
            let gid = ctx.fs.text(&format!("{pd}/gids/{index}"))?;
            if gid.split(':').all(|g| g.trim_start_matches('0').is_empty()) {
                return None;
            }
            Some(GidEntry {
                index,
                gid,
                gid_type: ctx.fs.text(&format!("{pd}/gid_attrs/types/{index}")),
                ndev: ctx.fs.text(&format!("{pd}/gid_attrs/ndevs/{index}")),
            })
        })
        .collect()
}

/// Active Ethernet ports of every RDMA device.
pub fn roce_ports(ctx: &Context) -> Vec<(&RdmaDev, &RdmaPort)> {
    ctx.rdma()
        .iter()
        .flat_map(|d| d.ports.iter().map(move |p| (d, p)))
        .filter(|(_, p)| p.is_ethernet() && p.is_active())
        .collect()
}

impl Check for RoceGid {
    fn id(&self) -> &'static str {
        "roce-gid"
    }
    fn title(&self) -> &'static str {
        "each active RoCE port has a RoCE v2 GID with an IP address"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        let ports = roce_ports(ctx);
        if ports.is_empty() {
            return vec![Finding::skip(
                id,
                "host",
                "no active RoCE (Ethernet link layer) port",
            )];
        }
        let forced: Option<u32> = ctx
            .env("NCCL_IB_GID_INDEX")
            .and_then(|v| v.trim().parse().ok());
        ports
            .into_iter()
            .map(|(d, p)| {
                let subject = format!("{}/{}", d.name, p.port);
                let gs = gids(ctx, d, p.port);
                let ev: Vec<String> = gs
                    .iter()
                    .map(|g| {
                        format!(
                            "{}/gids/{}: {} ({}, {})",
                            ctx.fs.show(&d.port_dir(p.port)),
                            g.index,
                            g.gid,
                            g.gid_type.as_deref().unwrap_or("type ?"),
                            g.ndev.as_deref().unwrap_or("ndev ?")
                        )
                    })
                    .collect();
                let good: Vec<&GidEntry> = gs.iter().filter(|g| g.is_v2() && g.ip().is_some()).collect();
                let netdev = d.netdevs.first().cloned().unwrap_or_else(|| "<netdev>".into());
                let fix = format!("assign an IP address to {netdev} (`ip addr add <addr>/<len> dev {netdev}`); keep GID indices consistent across nodes or let NCCL auto-select");
                let f = match forced {
                    Some(ix) => match gs.iter().find(|g| g.index == ix) {
                        Some(g) if g.is_v2() && g.ip().is_some() => Finding::pass(
                            id,
                            subject.clone(),
                            format!("{subject}: NCCL_IB_GID_INDEX={ix} is RoCE v2 with IP {}", g.ip().unwrap_or_default()),
                        ),
                        _ => Finding::fail(
                            id,
                            subject.clone(),
                            format!("{subject}: NCCL_IB_GID_INDEX={ix} is not a RoCE v2 GID with an IP"),
                        )
                        .fix("unset NCCL_IB_GID_INDEX (NCCL picks a v2 GID itself) or point it at a v2 entry listed in the evidence"),
                    },
                    None => match good.first() {
                        Some(g) => Finding::pass(
                            id,
                            subject.clone(),
                            format!("{subject}: RoCE v2 GID {} carries IP {}", g.index, g.ip().unwrap_or_default()),
                        ),
                        None => Finding::fail(
                            id,
                            subject.clone(),
                            format!("{subject}: no RoCE v2 GID with an IP address: RoCE v2 connections cannot be made"),
                        )
                        .fix(fix),
                    },
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

    fn tree(with_ip: bool) -> Tree {
        let t = Tree::new();
        t.nic("pci0000:00", &[], "0000:00:03.0");
        t.rdma(
            "mlx5_0",
            "0000:00:03.0",
            &[("4: ACTIVE", "Ethernet")],
            Some("eth2"),
        );
        let pd = "sys/class/infiniband/mlx5_0/ports/1";
        let ll = "fe80:0000:0000:0000:0ae0:d4ff:fe5a:1b2c";
        let ip = "0000:0000:0000:0000:0000:ffff:c0a8:f238";
        let entries: Vec<(u32, &str, &str)> = if with_ip {
            vec![
                (0, ll, "IB/RoCE v1"),
                (1, ll, "RoCE v2"),
                (2, ip, "IB/RoCE v1"),
                (3, ip, "RoCE v2"),
            ]
        } else {
            vec![(0, ll, "IB/RoCE v1"), (1, ll, "RoCE v2")]
        };
        t.file(
            &format!("{pd}/gids/9"),
            "0000:0000:0000:0000:0000:0000:0000:0000\n",
        );
        for (i, g, ty) in entries {
            t.file(&format!("{pd}/gids/{i}"), format!("{g}\n"));
            t.file(&format!("{pd}/gid_attrs/types/{i}"), format!("{ty}\n"));
            t.file(&format!("{pd}/gid_attrs/ndevs/{i}"), "eth2\n");
        }
        t
    }

    #[test]
    fn v2_gid_with_ip_passes() {
        let fs = run(&RoceGid, &tree(true).ctx().build());
        assert_eq!(fs[0].status, Status::Pass, "{fs:#?}");
        assert!(fs[0].message.contains("GID 3 carries IP 192.168.242.56"));
        assert_eq!(fs[0].evidence.len(), 4, "the all-zero entry is not listed");
    }

    #[test]
    fn link_local_only_fails() {
        let fs = run(&RoceGid, &tree(false).ctx().build());
        assert_eq!(fs[0].status, Status::Fail);
        assert!(fs[0].fix.as_deref().unwrap().contains("dev eth2"));
    }

    #[test]
    fn forced_index_must_be_v2_with_ip() {
        let t = tree(true);
        assert_eq!(
            run(&RoceGid, &t.ctx().env("NCCL_IB_GID_INDEX", "2").build())[0].status,
            Status::Fail
        );
        assert_eq!(
            run(&RoceGid, &t.ctx().env("NCCL_IB_GID_INDEX", "3").build())[0].status,
            Status::Pass
        );
    }

    #[test]
    fn ib_ports_are_not_roce() {
        let t = Tree::new();
        t.nic("pci0000:00", &[], "0000:00:03.0");
        t.rdma(
            "mlx5_0",
            "0000:00:03.0",
            &[("4: ACTIVE", "InfiniBand")],
            None,
        );
        assert_eq!(run(&RoceGid, &t.ctx().build())[0].status, Status::Skip);
    }
}
