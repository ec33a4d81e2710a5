//! The RoCE quality-of-service settings of one port's netdev, from where the kernel and the
//! drivers expose them: the DCB state ([`crate::dcb`]: PFC per priority, the DSCP → priority
//! table, the trust table), the trust mode (`sys/class/net/<if>/qos/trust` where the Mellanox
//! OFED driver provides it, else DCB), mlx5's ECN/DCQCN tree (`sys/class/net/<if>/ecn/
//! roce_rp|roce_np/enable/<prio>`, `roce_np/cnp_802p_prio`, `roce_np/cnp_dscp`) and the
//! device's default RoCE ToS (`sys/kernel/config/rdma_cm/<dev>/ports/<p>/default_roce_tos`,
//! or OFED's `sys/class/infiniband/<dev>/tc/<p>/traffic_class`). Judging them is the
//! doctor's job; this module only reads, and says where each value came from.

use super::RootFs;
use crate::dcb::{self, Dcb, DcbError, APP_SEL_DSCP, APP_SEL_PCP};

/// How the NIC classifies received and sent RoCE packets into priorities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trust {
    /// By the IP header's DSCP.
    Dscp,
    /// By the VLAN tag's PCP (untagged packets: priority 0).
    Pcp,
}

impl std::fmt::Display for Trust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Trust::Dscp => "dscp",
            Trust::Pcp => "pcp",
        })
    }
}

/// ECN (DCQCN) enablement per priority, from mlx5's `ecn/` tree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ecn {
    /// Reaction point (`roce_rp/enable/<p>`): this sender slows down on CNPs.
    pub rp: [Option<bool>; 8],
    /// Notification point (`roce_np/enable/<p>`): this receiver sends CNPs for CE marks.
    pub np: [Option<bool>; 8],
    /// `roce_np/cnp_802p_prio`: the priority CNPs are sent on.
    pub cnp_prio: Option<u8>,
    /// `roce_np/cnp_dscp`: the DSCP CNPs carry.
    pub cnp_dscp: Option<u8>,
    /// The tree, as shown to the user.
    pub dir: String,
}

/// The QoS settings of a RoCE port's netdev.
#[derive(Debug, Clone)]
pub struct PortQos {
    /// The netdev.
    pub netdev: String,
    /// The DCB state.
    pub dcb: Result<Dcb, DcbError>,
    /// Where it was read.
    pub dcb_from: String,
    /// The trust mode, when anything says.
    pub trust: Option<Trust>,
    /// Why that trust mode (evidence).
    pub trust_from: String,
    /// mlx5's ECN tree, when the driver exports one.
    pub ecn: Option<Ecn>,
    /// The device's default RoCE ToS and its file, when set.
    pub default_tos: Option<(u8, String)>,
}

/// Read the QoS settings of `device`'s port `port` on `netdev`.
pub fn read_port_qos(fs: &RootFs, device: &str, port: u32, netdev: &str) -> PortQos {
    let (dcb, dcb_from) = dcb::read(fs, netdev);
    let (trust, trust_from) = trust(fs, netdev, &dcb, &dcb_from);
    PortQos {
        netdev: netdev.to_string(),
        trust,
        trust_from,
        dcb,
        dcb_from,
        ecn: ecn(fs, netdev),
        default_tos: default_tos(fs, device, port),
    }
}

fn trust(
    fs: &RootFs,
    netdev: &str,
    dcb: &Result<Dcb, DcbError>,
    dcb_from: &str,
) -> (Option<Trust>, String) {
    let file = format!("sys/class/net/{netdev}/qos/trust");
    if let Some(t) = fs.text(&file) {
        let t = t.trim();
        let mode = match t {
            "dscp" => Some(Trust::Dscp),
            "pcp" => Some(Trust::Pcp),
            _ => None,
        };
        return (mode, format!("{}: {t}", fs.show(&file)));
    }
    match dcb {
        Ok(d) => match d.trust.as_deref().and_then(|t| t.first()) {
            Some(&APP_SEL_DSCP) => (
                Some(Trust::Dscp),
                format!("{dcb_from}: trust table starts with dscp"),
            ),
            Some(&APP_SEL_PCP) => (
                Some(Trust::Pcp),
                format!("{dcb_from}: trust table starts with pcp"),
            ),
            _ if d.has_dscp_map() => (
                Some(Trust::Dscp),
                format!(
                    "{dcb_from}: the app table maps DSCP values (mlx5 trusts DSCP once it has one)"
                ),
            ),
            _ => (
                Some(Trust::Pcp),
                format!("{dcb_from}: no DSCP entry in the app table (the default, trust pcp)"),
            ),
        },
        Err(e) => (None, format!("trust mode unknown: {e}")),
    }
}

fn ecn(fs: &RootFs, netdev: &str) -> Option<Ecn> {
    let dir = format!("sys/class/net/{netdev}/ecn");
    if !fs.is_dir(&dir) {
        return None;
    }
    let flag = |side: &str, p: usize| {
        fs.text(&format!("{dir}/{side}/enable/{p}"))
            .map(|t| t.trim() == "1")
    };
    let num = |f: &str| {
        fs.text(&format!("{dir}/roce_np/{f}"))
            .and_then(|t| t.trim().parse().ok())
    };
    let mut e = Ecn {
        dir: fs.show(&dir),
        cnp_prio: num("cnp_802p_prio"),
        cnp_dscp: num("cnp_dscp"),
        ..Ecn::default()
    };
    for p in 0..8 {
        e.rp[p] = flag("roce_rp", p);
        e.np[p] = flag("roce_np", p);
    }
    Some(e)
}

fn default_tos(fs: &RootFs, device: &str, port: u32) -> Option<(u8, String)> {
    let cm = format!("sys/kernel/config/rdma_cm/{device}/ports/{port}/default_roce_tos");
    let tc = format!("sys/class/infiniband/{device}/tc/{port}/traffic_class");
    for f in [tc, cm] {
        if let Some(t) = fs.text(&f) {
            // OFED writes `Global tclass=106`; configfs a bare number.
            let n = t
                .trim()
                .rsplit(['=', ' '])
                .next()
                .and_then(|s| s.parse::<u8>().ok());
            if let Some(n) = n {
                return Some((n, format!("{}: {}", fs.show(&f), t.trim())));
            }
        }
    }
    None
}
