//! `roce-gid`: every active RoCE (Ethernet link layer) port has a RoCE v2 GID carrying an IP
//! address. NCCL auto-selects a v2 GID matching its address family; no IP on the netdev means
//! no such GID, hence connection failures or a fallback to v1 (gdr-checks D1).
//!
//! The GID tables, the port's netdev and the GID gdx itself would send from all come from
//! gdx-rdma ([`gdx_rdma::doctor::roce_gids_with`]) over the sysfs topology of the root, so
//! this works on a captured `--root`. `NCCL_IB_GID_INDEX` and `GDX_IB_GID_INDEX` are read
//! from the environment the doctor examines.

use super::Check;
use crate::context::Context;
use crate::finding::Finding;
use gdx_rdma::doctor::{roce_gids_with, PortGid};
use gdx_rdma::gid::{self, GidError, LinkKind, SysfsNetdevs, GID_INDEX_ENV};

/// The `roce-gid` check.
pub struct RoceGid;

/// `NCCL_IB_GID_INDEX` as NCCL reads it: a number, else not set.
fn nccl_forced(ctx: &Context) -> Option<u32> {
    ctx.env("NCCL_IB_GID_INDEX")
        .and_then(|v| v.trim().parse().ok())
}

/// `GDX_IB_GID_INDEX` from the examined environment.
fn gdx_override(ctx: &Context) -> Result<Option<u32>, GidError> {
    match ctx.env(GID_INDEX_ENV) {
        Some(v) if !v.trim().is_empty() => gid::parse_override(v).map(Some),
        _ => Ok(None),
    }
}

/// One evidence line per populated GID, and the GID gdx would use.
fn evidence(ctx: &Context, p: &PortGid) -> Vec<String> {
    let dir = ctx
        .fs
        .show(&gdx_topo::sysfs::devices::rdma_port_dir(&p.device, p.port));
    let mut ev: Vec<String> = p
        .gids
        .iter()
        .map(|g| {
            format!(
                "{dir}/gids/{}: {} ({}, {})",
                g.index,
                g.gid,
                g.kind,
                g.netdev.as_deref().unwrap_or("ndev ?")
            )
        })
        .collect();
    ev.push(match &p.choice {
        Ok(c) => format!("gdx sends from GID {} ({})", c.index, c.reason),
        Err(e) => format!("gdx: {e}"),
    });
    ev
}

fn port_finding(ctx: &Context, id: &str, p: &PortGid, forced: Option<u32>) -> Finding {
    let subject = format!("{}/{}", p.device, p.port);
    let netdev = p.netdev.as_deref().unwrap_or("<netdev>");
    let fix = format!("assign an IP address to {netdev} (`ip addr add <addr>/<len> dev {netdev}`); keep GID indices consistent across nodes or let NCCL auto-select");
    let f = match forced {
        Some(ix) => match p.gid(ix) {
            Some(g) if g.is_routable_v2() => Finding::pass(
                id,
                subject.clone(),
                format!(
                    "{subject}: NCCL_IB_GID_INDEX={ix} is RoCE v2 with IP {}",
                    g.ip().map(|a| a.to_string()).unwrap_or_default()
                ),
            ),
            _ => Finding::fail(
                id,
                subject.clone(),
                format!("{subject}: NCCL_IB_GID_INDEX={ix} is not a RoCE v2 GID with an IP"),
            )
            .fix("unset NCCL_IB_GID_INDEX (NCCL picks a v2 GID itself) or point it at a v2 entry listed in the evidence"),
        },
        None => match p.routable_v2() {
            Some(g) => Finding::pass(
                id,
                subject.clone(),
                format!(
                    "{subject}: RoCE v2 GID {} carries IP {}",
                    g.index,
                    g.ip().map(|a| a.to_string()).unwrap_or_default()
                ),
            ),
            None => Finding::fail(
                id,
                subject.clone(),
                format!("{subject}: no RoCE v2 GID with an IP address: RoCE v2 connections cannot be made"),
            )
            .fix(fix),
        },
    };
    // A GDX_IB_GID_INDEX gdx cannot use breaks gdx's own connections even when NCCL's are fine.
    let f = match (&p.choice, f.status) {
        (Err(e @ (GidError::BadOverride { .. } | GidError::OverrideNotFound { .. })), crate::Status::Pass) => {
            Finding::warn(id, subject.clone(), format!("{subject}: {e}"))
                .fix(format!("unset {GID_INDEX_ENV} (gdx then picks a RoCE v2 GID itself) or point it at an index listed in the evidence"))
        }
        _ => f,
    };
    f.evidence_all(evidence(ctx, p))
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
        let topo = match super::rdma_ports_or_skip(ctx, id) {
            Ok(t) => t,
            Err(skip) => return skip,
        };
        let root = ctx.fs.root();
        let all = roce_gids_with(&topo, &SysfsNetdevs::at_root(root), gdx_override(ctx));
        let ports: Vec<&PortGid> = all
            .iter()
            .filter(|p| p.link == LinkKind::Ethernet && p.is_active())
            .collect();
        if ports.is_empty() {
            return vec![Finding::skip(
                id,
                "host",
                "no active RoCE (Ethernet link layer) port",
            )];
        }
        let forced = nccl_forced(ctx);
        ports
            .into_iter()
            .map(|p| port_finding(ctx, id, p, forced))
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
        t.roce_nic();
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
        let gids = fs[0]
            .evidence
            .iter()
            .filter(|e| e.contains("/gids/"))
            .count();
        assert_eq!(gids, 4, "the all-zero entry is not listed: {fs:#?}");
        assert!(
            fs[0]
                .evidence
                .iter()
                .any(|e| e.starts_with("gdx sends from GID 3")),
            "{fs:#?}"
        );
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
        t.ib_nic();
        assert_eq!(run(&RoceGid, &t.ctx().build())[0].status, Status::Skip);
    }

    #[test]
    fn a_gdx_gid_index_the_port_lacks_is_a_warning() {
        let t = tree(true);
        let fs = run(&RoceGid, &t.ctx().env("GDX_IB_GID_INDEX", "7").build());
        assert_eq!(fs[0].status, Status::Warn, "{fs:#?}");
        assert!(fs[0].message.contains("GDX_IB_GID_INDEX=7"), "{fs:#?}");
        assert!(fs[0]
            .fix
            .as_deref()
            .unwrap()
            .contains("unset GDX_IB_GID_INDEX"));
        let fs = run(&RoceGid, &t.ctx().env("GDX_IB_GID_INDEX", "3").build());
        assert_eq!(fs[0].status, Status::Pass, "{fs:#?}");
    }

    #[test]
    fn no_rdma_device_is_skipped_with_the_reason() {
        let t = Tree::new();
        t.nic("pci0000:00", &[], "0000:00:03.0");
        t.dir("sys/module/mlx5_core");
        let fs = run(&RoceGid, &t.ctx().build());
        assert_eq!(fs.len(), 1);
        assert_eq!(fs[0].status, Status::Skip);
        let why = fs[0].reason.as_deref().unwrap();
        assert!(
            why.starts_with("no RDMA device: the kernel has none") && why.contains("mlx5"),
            "{why}"
        );
    }
}
