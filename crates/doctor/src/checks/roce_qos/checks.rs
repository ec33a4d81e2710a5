//! The four RoCE QoS checks; see the module above for what they share.

use super::{common_evidence, roce_ports, software_skip, traffic, RocePort, Traffic};
use crate::checks::Check;
use crate::context::Context;
use crate::finding::Finding;
use gdx_topo::dcb::Dcb;
use gdx_topo::sysfs::qos::{PortQos, Trust};

/// `roce-tc`: the traffic class and priority RoCE traffic will use.
pub struct RoceTc;
/// `roce-trust`: the NIC classifies RoCE by what it is marked with.
pub struct RoceTrust;
/// `roce-pfc`: PFC is on for RoCE's priority.
pub struct RocePfc;
/// `roce-ecn`: ECN (DCQCN) on RoCE's priority at both ends of a flow, and the CNP priority.
pub struct RoceEcn;

fn per_port(
    ctx: &Context,
    id: &str,
    software: &str,
    judge: impl Fn(&RocePort, &PortQos, &Traffic) -> Finding,
) -> Vec<Finding> {
    let ports = match roce_ports(ctx, id) {
        Ok(p) => p,
        Err(skip) => return skip,
    };
    ports
        .iter()
        .map(|p| {
            let t = traffic(ctx, p);
            if p.software {
                return software_skip(id, p, software);
            }
            let Some(q) = &p.qos else {
                return Finding::skip(
                    id,
                    p.subject.clone(),
                    format!("{}: no netdev found for the port (no GID names one, no net/ under its PCI function)", p.subject),
                );
            };
            let f = judge(p, q, &t);
            let mut ev = common_evidence(p, &t);
            ev.extend(f.evidence.iter().cloned());
            Finding { evidence: ev, ..f }
        })
        .collect()
}

/// A ToS whose DSCP the port maps to `prio`: an app-table entry, else DSCP = prio << 3.
fn tos_for(prio: u8, dcb: Option<&Dcb>) -> (u8, u8) {
    let dscp = dcb
        .and_then(|d| {
            d.apps
                .iter()
                .find(|a| a.selector == gdx_topo::dcb::APP_SEL_DSCP && a.priority == prio)
                .map(|a| a.protocol as u8)
        })
        .unwrap_or(prio << 3);
    (dscp << 2, dscp)
}

impl Check for RoceTc {
    fn id(&self) -> &'static str {
        "roce-tc"
    }
    fn title(&self) -> &'static str {
        "the traffic class and priority RoCE traffic uses, set consistently"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        let ports = match roce_ports(ctx, id) {
            Ok(p) => p,
            Err(skip) => return skip,
        };
        ports
            .iter()
            .map(|p| {
                let t = traffic(ctx, p);
                let ev = common_evidence(p, &t);
                let head = format!(
                    "{}: RoCE traffic leaves with ToS {} (DSCP {}) and gets priority {}",
                    p.subject,
                    t.tos,
                    t.dscp(),
                    t.prio
                );
                let f = if !t.conflicts.is_empty() {
                    Finding::warn(
                        id,
                        p.subject.clone(),
                        format!(
                            "{head}, but other settings ask for another class: {}",
                            t.conflicts.join("; ")
                        ),
                    )
                    .fix(format!(
                        "give every stack the same class: export NCCL_IB_TC={0} UCX_IB_TRAFFIC_CLASS={0} (and MC_IB_TC={0} for Mooncake), matching the switch's lossless class",
                        t.tos
                    ))
                } else if p.software {
                    Finding::pass(
                        id,
                        p.subject.clone(),
                        format!("{head} (software RoCE: the ToS is written into the IP header; only the host's qdisc and the switches act on it)"),
                    )
                } else {
                    Finding::pass(id, p.subject.clone(), head)
                };
                f.evidence_all(ev)
            })
            .collect()
    }
}

impl Check for RoceTrust {
    fn id(&self) -> &'static str {
        "roce-trust"
    }
    fn title(&self) -> &'static str {
        "the NIC classifies RoCE by the marking it carries (trust dscp for DSCP-marked RoCE v2)"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        per_port(
            ctx,
            id,
            "there is no NIC classifier, so the trust mode does not apply",
            |p, q, t| {
                let nd = &q.netdev;
                match q.trust {
                Some(Trust::Pcp) if p.v2 && t.dscp() != 0 => Finding::fail(
                    id,
                    p.subject.clone(),
                    format!(
                        "{}: trust pcp, but RoCE v2 is marked with DSCP {}: the NIC ignores the marking and puts RoCE on priority {} (the lossless class is never used)",
                        p.subject,
                        t.dscp(),
                        t.prio
                    ),
                )
                .fix(format!(
                    "classify by DSCP: `dcb app add dev {nd} dscp-prio {}:{}` (mlx5 then trusts DSCP), or `mlnx_qos -i {nd} --trust dscp`; the switch ports must trust DSCP too",
                    t.dscp(),
                    t.dscp() >> 3
                )),
                Some(Trust::Pcp) => Finding::pass(
                    id,
                    p.subject.clone(),
                    format!("{}: trust pcp and RoCE is not DSCP-marked (ToS {}): classification follows the VLAN PCP", p.subject, t.tos),
                ),
                Some(Trust::Dscp) => Finding::pass(
                    id,
                    p.subject.clone(),
                    format!("{}: trust dscp: DSCP {} is classified to priority {}", p.subject, t.dscp(), t.prio),
                ),
                None => Finding::warn(
                    id,
                    p.subject.clone(),
                    format!("{}: the trust mode of {nd} cannot be read", p.subject),
                )
                .fix(format!("check it with `dcb app show dev {nd}` or `mlnx_qos -i {nd}` (as root)")),
            }
            },
        )
    }
}

impl Check for RocePfc {
    fn id(&self) -> &'static str {
        "roce-pfc"
    }
    fn title(&self) -> &'static str {
        "priority flow control is on for the priority RoCE traffic uses"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        per_port(
            ctx,
            id,
            "there is no DCB, so PFC does not apply",
            |p, q, t| {
                let nd = &q.netdev;
                let d = match &q.dcb {
                    Ok(d) => d,
                    Err(e) => {
                        return Finding::skip(
                            id,
                            p.subject.clone(),
                            format!("{}: PFC state unknown: {e}", p.subject),
                        )
                    }
                };
                let on = d.pfc_priorities();
                if d.pfc_on(t.prio) {
                    return Finding::pass(
                        id,
                        p.subject.clone(),
                        format!(
                            "{}: PFC is on for priority {}, the one RoCE uses",
                            p.subject, t.prio
                        ),
                    );
                }
                let collapse = "a drop under congestion becomes an RC retransmission (go-back-N) and throughput collapses with no error";
                if on.is_empty() {
                    return Finding::fail(
                    id,
                    p.subject.clone(),
                    format!("{}: PFC is off on every priority of {nd}: {collapse}", p.subject),
                )
                .fix(format!(
                    "`dcb pfc set dev {nd} prio-pfc {}:on` (or `mlnx_qos -i {nd} --pfc` with a 1 at position {}), with the same lossless priority on the switch",
                    t.prio, t.prio
                ));
                }
                let target = on[0];
                let (tos, dscp) = tos_for(target, Some(d));
                Finding::fail(
                id,
                p.subject.clone(),
                format!(
                    "{}: priority mismatch: RoCE traffic gets priority {} but PFC is on priority {} only: {collapse}",
                    p.subject,
                    t.prio,
                    on.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")
                ),
            )
            .fix(format!(
                "mark RoCE for priority {target}: export NCCL_IB_TC={tos} UCX_IB_TRAFFIC_CLASS={tos} (DSCP {dscp}); or turn PFC on where it goes: `dcb pfc set dev {nd} prio-pfc {}:on` (and on the switch)",
                t.prio
            ))
            },
        )
    }
}

impl Check for RoceEcn {
    fn id(&self) -> &'static str {
        "roce-ecn"
    }
    fn title(&self) -> &'static str {
        "ECN/DCQCN on RoCE's priority: reaction point, notification point, CNP priority"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        per_port(ctx, id, "rxe has no DCQCN engine: it neither sends CNPs nor slows down on them, so ECN does not apply", |p, q, t| {
            let Some(e) = &q.ecn else {
                return Finding::skip(
                    id,
                    p.subject.clone(),
                    format!("{}: the driver of {} exports no ecn/ tree (mlx5 with the OFED driver does), so DCQCN's state cannot be read", p.subject, q.netdev),
                );
            };
            let pr = t.prio as usize;
            let cnp = format!(
                "{}/roce_np: CNPs go out on priority {} with DSCP {}",
                e.dir,
                e.cnp_prio.map(|x| x.to_string()).unwrap_or("?".into()),
                e.cnp_dscp.map(|x| x.to_string()).unwrap_or("?".into())
            );
            let state = |v: Option<bool>| match v {
                Some(true) => "1",
                Some(false) => "0",
                None => "missing",
            };
            let ev = vec![
                format!("{}/roce_rp/enable/{pr}: {}", e.dir, state(e.rp[pr])),
                format!("{}/roce_np/enable/{pr}: {}", e.dir, state(e.np[pr])),
                cnp,
            ];
            let mut off = Vec::new();
            let mut fixes = Vec::new();
            if e.rp[pr] != Some(true) {
                off.push("the reaction point (this NIC ignores CNPs and never slows its sends)");
                fixes.push(format!("echo 1 > /sys/class/net/{}/ecn/roce_rp/enable/{pr}", q.netdev));
            }
            if e.np[pr] != Some(true) {
                off.push("the notification point (this NIC never answers CE-marked packets with CNPs, so its senders are never slowed)");
                fixes.push(format!("echo 1 > /sys/class/net/{}/ecn/roce_np/enable/{pr}", q.netdev));
            }
            let f = if off.is_empty() {
                Finding::pass(
                    id,
                    p.subject.clone(),
                    format!("{}: ECN is on for priority {pr} at both the reaction and the notification point", p.subject),
                )
            } else {
                Finding::fail(
                    id,
                    p.subject.clone(),
                    format!("{}: ECN is off on priority {pr} at {}: DCQCN cannot throttle, so congestion ends in PFC pauses or drops", p.subject, off.join(" and at ")),
                )
                .fix(format!("{} (on every node; and ECN marking on the switch's RoCE queue)", fixes.join("; ")))
            };
            f.evidence_all(ev)
        })
    }
}
