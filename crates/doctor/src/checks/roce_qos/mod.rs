//! RoCE's lossless settings (gdr-checks D3-D5), one check each: `roce-tc` (the traffic class
//! and priority RoCE traffic will use), `roce-trust` (how the NIC classifies it), `roce-pfc`
//! (priority flow control on that priority), `roce-ecn` (ECN/DCQCN on that priority, both
//! reaction and notification points, and the CNP priority). Get one wrong and packet loss
//! turns into a throughput collapse that no error reports: RC retransmits go-back-N, and only
//! the NIC's counters (doctor's `probe-rdma`, `gdx bench --path rdma`) show it.
//!
//! The settings are read by gdx-topo ([`gdx_topo::sysfs::qos`], [`gdx_topo::dcb`]) from the
//! root, so a capture is judged as the live machine. Software RoCE (rxe, siw) has no DCB, no
//! classification and no DCQCN engine: each check says what does not apply there.

mod checks;
#[cfg(test)]
mod tests;

pub use checks::{RoceEcn, RocePfc, RoceTc, RoceTrust};

use crate::context::Context;
use crate::finding::Finding;
use gdx_rdma::doctor::roce_gids_with;
use gdx_rdma::gid::{LinkKind, SysfsNetdevs};
use gdx_topo::sysfs::qos::{read_port_qos, PortQos, Trust};

/// One active RoCE port and its settings.
pub(crate) struct RocePort {
    /// `mlx5_0/1`.
    pub subject: String,
    /// A software device (no PCI function): rxe, siw.
    pub software: bool,
    pub netdev: Option<String>,
    /// A RoCE v2 GID with an IP exists (v1 has no IP header, so no DSCP).
    pub v2: bool,
    pub qos: Option<PortQos>,
}

/// The active RoCE ports, or the skip findings.
pub(crate) fn roce_ports(ctx: &Context, id: &str) -> Result<Vec<RocePort>, Vec<Finding>> {
    let topo = super::rdma_ports_or_skip(ctx, id)?;
    let root = ctx.fs.root();
    let ports: Vec<RocePort> = roce_gids_with(&topo, &SysfsNetdevs::at_root(root), Ok(None))
        .into_iter()
        .filter(|p| p.link == LinkKind::Ethernet && p.is_active())
        .map(|p| {
            let software = ctx
                .rdma()
                .iter()
                .find(|d| d.name == p.device)
                .is_some_and(|d| d.bdf.is_none());
            let qos = p
                .netdev
                .as_deref()
                .map(|n| read_port_qos(&ctx.fs, &p.device, p.port, n));
            RocePort {
                subject: format!("{}/{}", p.device, p.port),
                software,
                v2: p.routable_v2().is_some(),
                netdev: p.netdev.clone(),
                qos,
            }
        })
        .collect();
    if ports.is_empty() {
        return Err(vec![Finding::skip(
            id,
            "host",
            "no active RoCE (Ethernet link layer) port",
        )]);
    }
    Ok(ports)
}

/// The traffic class RoCE traffic leaves with, and the priority the NIC gives it.
#[derive(Debug, Clone)]
pub(crate) struct Traffic {
    /// The IP ToS byte (DSCP << 2 | ECN bits).
    pub tos: u8,
    /// Where the ToS comes from.
    pub tos_from: String,
    /// Settings that disagree with the one used.
    pub conflicts: Vec<String>,
    /// The priority.
    pub prio: u8,
    /// Why that priority.
    pub prio_from: String,
}

impl Traffic {
    pub fn dscp(&self) -> u8 {
        self.tos >> 2
    }
}

/// `NCCL_IB_TC`, `UCX_IB_TRAFFIC_CLASS`, `MC_IB_TC` (Mooncake): the variables that set the
/// traffic class of RoCE traffic, in the order they are taken.
const TC_VARS: [&str; 3] = ["NCCL_IB_TC", "UCX_IB_TRAFFIC_CLASS", "MC_IB_TC"];

/// Work out the traffic class and priority for port `p`.
pub(crate) fn traffic(ctx: &Context, p: &RocePort) -> Traffic {
    let qos = p.qos.as_ref();
    let mut set: Vec<(u8, String)> = TC_VARS
        .iter()
        .filter_map(|v| {
            let val = ctx.env(v)?.trim();
            val.parse::<u8>().ok().map(|n| (n, format!("{v}={val}")))
        })
        .collect();
    // OFED's per-device traffic_class forces every QP's class; rdma_cm's default ToS is what
    // connections made through rdma_cm (UCX, NVMe-oF, gdx) get when nothing else sets one.
    let device = qos.and_then(|q| q.default_tos.clone());
    if let Some(d) = device.clone() {
        set.insert(0, d);
    }
    let (tos, tos_from) = set.first().cloned().unwrap_or((
        0,
        "nothing sets a traffic class: ToS 0 (rdma_cm's and NCCL's default)".into(),
    ));
    let conflicts = set
        .iter()
        .skip(1)
        .filter(|(n, _)| *n != tos)
        .map(|(n, from)| format!("{from} (ToS {n}, DSCP {})", n >> 2))
        .collect();
    let sl = ctx
        .env("NCCL_IB_SL")
        .and_then(|s| s.trim().parse::<u8>().ok());
    let (prio, prio_from) = priority(p, qos, tos >> 2, sl);
    Traffic {
        tos,
        tos_from,
        conflicts,
        prio,
        prio_from,
    }
}

fn priority(p: &RocePort, qos: Option<&PortQos>, dscp: u8, sl: Option<u8>) -> (u8, String) {
    let pcp = |why: &str| match sl {
        Some(s) if s < 8 => (
            s,
            format!("{why}; NCCL_IB_SL={s} sets the VLAN PCP (on a tagged netdev)"),
        ),
        _ => (0, format!("{why}; untagged RoCE has no PCP, so priority 0")),
    };
    if !p.v2 {
        return pcp("RoCE v1 has no IP header to carry DSCP: the NIC classifies by VLAN PCP");
    }
    match qos.and_then(|q| q.trust) {
        Some(Trust::Dscp) => {
            let mapped = qos
                .and_then(|q| q.dcb.as_ref().ok())
                .and_then(|d| d.dscp_priority(dscp));
            match mapped {
                Some(pr) => (pr, format!("trust dscp: the DCB app table maps DSCP {dscp} to priority {pr}")),
                None => (dscp >> 3, format!("trust dscp: DSCP {dscp} has no app-table entry; the default map gives priority {} (DSCP >> 3)", dscp >> 3)),
            }
        }
        Some(Trust::Pcp) => pcp("trust pcp: the NIC classifies by VLAN PCP, not DSCP"),
        None => pcp("trust mode unknown"),
    }
}

/// Evidence lines every QoS finding carries.
pub(crate) fn common_evidence(p: &RocePort, t: &Traffic) -> Vec<String> {
    let mut ev = vec![format!(
        "{}: ToS {} (DSCP {}) from {}",
        p.subject,
        t.tos,
        t.dscp(),
        t.tos_from
    )];
    ev.push(format!("priority {}: {}", t.prio, t.prio_from));
    if let Some(q) = &p.qos {
        ev.push(q.trust_from.clone());
        match &q.dcb {
            Ok(d) => ev.push(format!("{}: pfc {}", q.dcb_from, d.pfc_text())),
            Err(e) => ev.push(format!("{}: {e}", q.dcb_from)),
        }
    }
    ev
}

/// The skip a software RoCE port gets from `id`, saying what does not apply.
pub(crate) fn software_skip(id: &str, p: &RocePort, what: &str) -> Finding {
    let on = p.netdev.as_deref().unwrap_or("its netdev");
    Finding::skip(
        id,
        p.subject.clone(),
        format!(
            "{} is software RoCE over {on}: {what}; loss on the wire is recovered by RC retransmission and shows in its hw_counters (doctor's probe-rdma, gdx bench --path rdma)",
            p.subject
        ),
    )
}
