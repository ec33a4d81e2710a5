//! The QoS verdicts on synthetic trees built from the documented layouts: DCB state as the
//! kernel's RTM_GETDCB reply carries it (captured as `gdx/dcb/<netdev>.json`), mlx5's `ecn/`
//! tree, RoCE v2 GIDs on the netdev.

use super::*;
use crate::testutil::{run, Tree};
use crate::Status;
use gdx_topo::dcb::{Captured, Dcb, DcbApp, APP_SEL_DSCP};

/// The settings of one scenario.
struct Qos {
    pfc_en: u8,
    dscp_map: Vec<(u16, u8)>,
    rp: u8,
    np: u8,
}

impl Qos {
    /// The lossless setup: PFC on 3, DSCP 26 → 3 (so trust dscp), ECN on 3 at both points.
    fn good() -> Qos {
        Qos {
            pfc_en: 1 << 3,
            dscp_map: vec![(26, 3), (48, 6)],
            rp: 1 << 3,
            np: 1 << 3,
        }
    }
}

fn tree(q: &Qos) -> Tree {
    let t = Tree::new();
    t.roce_nic();
    let pd = "sys/class/infiniband/mlx5_0/ports/1";
    let ll = "fe80:0000:0000:0000:0ae0:d4ff:fe5a:1b2c";
    let ip = "0000:0000:0000:0000:0000:ffff:c0a8:f238";
    for (i, g, ty) in [
        (0, ll, "IB/RoCE v1"),
        (1, ll, "RoCE v2"),
        (2, ip, "IB/RoCE v1"),
        (3, ip, "RoCE v2"),
    ] {
        t.file(&format!("{pd}/gids/{i}"), format!("{g}\n"));
        t.file(&format!("{pd}/gid_attrs/types/{i}"), format!("{ty}\n"));
        t.file(&format!("{pd}/gid_attrs/ndevs/{i}"), "eth2\n");
    }
    let dcb = Dcb {
        pfc_cap: 8,
        pfc_en: q.pfc_en,
        apps: q
            .dscp_map
            .iter()
            .map(|&(dscp, priority)| DcbApp {
                selector: APP_SEL_DSCP,
                priority,
                protocol: dscp,
            })
            .collect(),
        trust: None,
    };
    t.file(
        &gdx_topo::dcb::capture_path("eth2"),
        serde_json::to_string(&Captured::State(dcb)).unwrap(),
    );
    let ecn = "sys/class/net/eth2/ecn";
    for p in 0..8 {
        t.file(
            &format!("{ecn}/roce_rp/enable/{p}"),
            format!("{}\n", q.rp >> p & 1),
        );
        t.file(
            &format!("{ecn}/roce_np/enable/{p}"),
            format!("{}\n", q.np >> p & 1),
        );
    }
    t.file(&format!("{ecn}/roce_np/cnp_802p_prio"), "6\n");
    t.file(&format!("{ecn}/roce_np/cnp_dscp"), "48\n");
    t
}

fn one(check: &dyn Check, t: &Tree, env: &[(&str, &str)]) -> Finding {
    let mut b = t.ctx();
    for (k, v) in env {
        b = b.env(k, v);
    }
    let fs = run(check, &b.build());
    assert_eq!(fs.len(), 1, "{fs:#?}");
    fs.into_iter().next().unwrap()
}

use crate::checks::Check;

const NCCL_TC_106: &[(&str, &str)] = &[("NCCL_IB_TC", "106")];

#[test]
fn the_lossless_setup_passes_every_check() {
    let t = tree(&Qos::good());
    for c in [&RoceTc as &dyn Check, &RoceTrust, &RocePfc, &RoceEcn] {
        let f = one(c, &t, NCCL_TC_106);
        assert_eq!(f.status, Status::Pass, "{}: {f:#?}", c.id());
        assert_eq!(f.subject, "mlx5_0/1");
        assert!(
            f.evidence
                .iter()
                .any(|e| e.contains("ToS 106 (DSCP 26) from NCCL_IB_TC=106")),
            "{f:#?}"
        );
        assert!(
            f.evidence
                .iter()
                .any(|e| e.contains("maps DSCP 26 to priority 3")),
            "{f:#?}"
        );
    }
    let tc = one(&RoceTc, &t, NCCL_TC_106);
    assert!(tc.message.contains("gets priority 3"), "{}", tc.message);
    let ecn = one(&RoceEcn, &t, NCCL_TC_106);
    assert!(
        ecn.evidence
            .iter()
            .any(|e| e.contains("CNPs go out on priority 6 with DSCP 48")),
        "{ecn:#?}"
    );
}

#[test]
fn pfc_off_fails_with_the_dcb_command() {
    let t = tree(&Qos {
        pfc_en: 0,
        ..Qos::good()
    });
    let f = one(&RocePfc, &t, NCCL_TC_106);
    assert_eq!(f.status, Status::Fail, "{f:#?}");
    assert!(
        f.message.contains("PFC is off on every priority of eth2"),
        "{}",
        f.message
    );
    assert_eq!(
        f.fix.as_deref().unwrap().split(" (or").next().unwrap(),
        "`dcb pfc set dev eth2 prio-pfc 3:on`"
    );
    assert!(
        f.evidence
            .iter()
            .any(|e| e.contains("pfc 0:off 1:off 2:off 3:off")),
        "{f:#?}"
    );
}

#[test]
fn ecn_off_on_one_side_names_that_side() {
    let t = tree(&Qos {
        np: 0,
        ..Qos::good()
    });
    let f = one(&RoceEcn, &t, NCCL_TC_106);
    assert_eq!(f.status, Status::Fail, "{f:#?}");
    assert!(f.message.contains("notification point"), "{}", f.message);
    assert!(!f.message.contains("reaction point"), "{}", f.message);
    let fix = f.fix.as_deref().unwrap();
    assert!(
        fix.starts_with("echo 1 > /sys/class/net/eth2/ecn/roce_np/enable/3"),
        "{fix}"
    );
    assert!(
        f.evidence
            .iter()
            .any(|e| e.ends_with("roce_np/enable/3: 0")),
        "{f:#?}"
    );
    // The other side alone.
    let t = tree(&Qos {
        rp: 0,
        ..Qos::good()
    });
    let f = one(&RoceEcn, &t, NCCL_TC_106);
    assert_eq!(f.status, Status::Fail);
    assert!(f.message.contains("reaction point") && !f.message.contains("notification"));
}

#[test]
fn a_priority_mismatch_fails_pfc_and_ecn_and_says_how_to_mark_for_the_lossless_one() {
    // NCCL_IB_TC=160: DSCP 40, no app entry, so priority 5; PFC and ECN are on 3.
    let t = tree(&Qos::good());
    let env = &[("NCCL_IB_TC", "160")];
    let f = one(&RocePfc, &t, env);
    assert_eq!(f.status, Status::Fail, "{f:#?}");
    assert!(
        f.message.contains(
            "priority mismatch: RoCE traffic gets priority 5 but PFC is on priority 3 only"
        ),
        "{}",
        f.message
    );
    assert!(
        f.fix
            .as_deref()
            .unwrap()
            .starts_with("mark RoCE for priority 3: export NCCL_IB_TC=104"),
        "{:?}",
        f.fix
    );
    let e = one(&RoceEcn, &t, env);
    assert_eq!(e.status, Status::Fail, "{e:#?}");
    assert!(e.message.contains("priority 5"), "{}", e.message);
    assert_eq!(one(&RoceTc, &t, env).status, Status::Pass);
}

#[test]
fn trust_pcp_with_dscp_marking_fails_trust_and_sends_roce_to_priority_0() {
    let t = tree(&Qos {
        dscp_map: vec![],
        ..Qos::good()
    });
    let f = one(&RoceTrust, &t, NCCL_TC_106);
    assert_eq!(f.status, Status::Fail, "{f:#?}");
    assert!(
        f.message
            .contains("trust pcp, but RoCE v2 is marked with DSCP 26"),
        "{}",
        f.message
    );
    assert!(f.message.contains("priority 0"), "{}", f.message);
    assert!(
        f.fix
            .as_deref()
            .unwrap()
            .starts_with("classify by DSCP: `dcb app add dev eth2 dscp-prio 26:3`"),
        "{:?}",
        f.fix
    );
    assert_eq!(one(&RocePfc, &t, NCCL_TC_106).status, Status::Fail);
    // The same trust with no marking is consistent.
    assert_eq!(one(&RoceTrust, &t, &[]).status, Status::Pass);
}

#[test]
fn stacks_asking_for_different_classes_warn() {
    let t = tree(&Qos::good());
    let f = one(
        &RoceTc,
        &t,
        &[("NCCL_IB_TC", "106"), ("UCX_IB_TRAFFIC_CLASS", "96")],
    );
    assert_eq!(f.status, Status::Warn, "{f:#?}");
    assert!(
        f.message
            .contains("UCX_IB_TRAFFIC_CLASS=96 (ToS 96, DSCP 24)"),
        "{}",
        f.message
    );
    assert!(f
        .fix
        .as_deref()
        .unwrap()
        .contains("NCCL_IB_TC=106 UCX_IB_TRAFFIC_CLASS=106"));
}

#[test]
fn a_netdev_without_dcb_or_ecn_tree_is_skipped_with_the_reason() {
    let t = tree(&Qos::good());
    std::fs::write(
        t.root().join(gdx_topo::dcb::capture_path("eth2")),
        "\"not_supported\"",
    )
    .unwrap();
    std::fs::remove_dir_all(t.root().join("sys/class/net/eth2/ecn")).unwrap();
    let f = one(&RocePfc, &t, NCCL_TC_106);
    assert_eq!(f.status, Status::Skip, "{f:#?}");
    assert!(
        f.reason
            .as_deref()
            .unwrap()
            .contains("eth2 has no DCB support"),
        "{f:#?}"
    );
    let f = one(&RoceEcn, &t, NCCL_TC_106);
    assert_eq!(f.status, Status::Skip);
    assert!(f
        .reason
        .as_deref()
        .unwrap()
        .contains("exports no ecn/ tree"));
    // Trust unknown without DCB: a warning with the command to look.
    let f = one(&RoceTrust, &t, NCCL_TC_106);
    assert_eq!(f.status, Status::Warn, "{f:#?}");
}

#[test]
fn software_roce_says_what_does_not_apply() {
    use gdx_topo::fixture::{RdmaPort, SysfsFixture};
    let dir = tempfile::tempdir().unwrap();
    let mut f = SysfsFixture::new(dir.path());
    f.host_bridge("0000:00", Some(0));
    f.virtual_netdev("eth0");
    f.software_rdma(
        "rxe0",
        "eth0",
        &[RdmaPort::roce(1, "eth0", [198, 51, 100, 1])],
    );
    let ctx = crate::context::Context::new(
        dir.path(),
        Default::default(),
        Err(crate::DoctorError::NoTopology),
        Err(crate::DoctorError::NoLiveFacts),
    );
    for (c, what) in [
        (&RocePfc as &dyn Check, "PFC does not apply"),
        (&RoceEcn, "no DCQCN engine"),
        (&RoceTrust, "trust mode does not apply"),
    ] {
        let fs = run(c, &ctx);
        assert_eq!(fs.len(), 1, "{fs:#?}");
        assert_eq!(fs[0].status, Status::Skip, "{}: {fs:#?}", c.id());
        let why = fs[0].reason.as_deref().unwrap();
        assert!(
            why.starts_with("rxe0/1 is software RoCE over eth0"),
            "{why}"
        );
        assert!(why.contains(what) && why.contains("hw_counters"), "{why}");
    }
    let tc = run(&RoceTc, &ctx);
    assert_eq!(tc[0].status, Status::Pass, "{tc:#?}");
    assert!(tc[0].message.contains("software RoCE"), "{}", tc[0].message);
}

#[test]
fn the_devices_own_traffic_class_wins_and_a_different_env_warns() {
    let t = tree(&Qos::good());
    // OFED's per-device class forces every QP's.
    t.file(
        "sys/class/infiniband/mlx5_0/tc/1/traffic_class",
        "Global tclass=106\n",
    );
    let f = one(&RoceTc, &t, &[]);
    assert_eq!(f.status, Status::Pass, "{f:#?}");
    assert!(
        f.evidence[0].contains("ToS 106 (DSCP 26) from ")
            && f.evidence[0].contains("tc/1/traffic_class: Global tclass=106"),
        "{f:#?}"
    );
    let f = one(&RoceTc, &t, &[("NCCL_IB_TC", "96")]);
    assert_eq!(f.status, Status::Warn, "{f:#?}");
    assert!(
        f.message.contains("NCCL_IB_TC=96 (ToS 96, DSCP 24)"),
        "{}",
        f.message
    );
}

#[test]
fn rdma_cm_default_tos_is_used_when_nothing_else_sets_one() {
    let t = tree(&Qos::good());
    t.file(
        "sys/kernel/config/rdma_cm/mlx5_0/ports/1/default_roce_tos",
        "106\n",
    );
    let f = one(&RocePfc, &t, &[]);
    assert_eq!(f.status, Status::Pass, "{f:#?}");
    assert!(
        f.evidence
            .iter()
            .any(|e| e.contains("default_roce_tos: 106")),
        "{f:#?}"
    );
}
