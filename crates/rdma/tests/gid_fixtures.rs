//! GID selection from captured GID tables: synthetic sysfs trees (what `--root` reads) with
//! RoCE and InfiniBand ports, netdev state and addresses.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_rdma::doctor::roce_gids;
use gdx_rdma::gid::{
    candidates_from_topo, candidates_from_verbs, parse_override, select_gid, select_gid_for_port,
    GidChoice, GidError, GidKind, LinkKind, NetdevState, StaticNetdevs, SysfsNetdevs,
};
use gdx_topo::fixture::{GidEntry, RdmaPort, SysfsFixture};
use gdx_topo::{NicPort, Topology};
use std::net::IpAddr;

struct Machine {
    _dir: tempfile::TempDir,
    topo: Topology,
    root: std::path::PathBuf,
}

/// One RDMA NIC `mlx5_0` with `ports`, netdev `ens1f0` (up) on it.
fn machine(ports: &[RdmaPort], edit: impl FnOnce(&mut SysfsFixture)) -> Machine {
    let dir = tempfile::tempdir().unwrap();
    let mut f = SysfsFixture::new(dir.path());
    let rp = f.root_port("0000:00", "0000:00:01.0", Some(0));
    let nic = f.nic(&rp, "0000:01:00.0");
    f.rdma(&nic, "mlx5_0", ports);
    f.netdev(&nic, "ens1f0", Some(200_000));
    edit(&mut f);
    let topo = gdx_topo::from_root(dir.path()).unwrap();
    let root = dir.path().to_path_buf();
    Machine {
        _dir: dir,
        topo,
        root,
    }
}

fn port(m: &Machine, n: u32) -> NicPort {
    let nic = m.topo.nics().next().unwrap();
    let info = nic.nic.as_ref().unwrap();
    info.ports.iter().find(|p| p.port == n).unwrap().clone()
}

/// The GID gdx picks for `mlx5_0` port 1 of `m`, netdevs read from its sysfs, no override.
fn sysfs_choice(m: &Machine) -> GidChoice {
    select_gid_for_port("mlx5_0", &port(m, 1), &SysfsNetdevs::at_root(&m.root), None).unwrap()
}

fn v4_gid(a: [u8; 4]) -> String {
    format!(
        "0000:0000:0000:0000:0000:ffff:{:02x}{:02x}:{:02x}{:02x}",
        a[0], a[1], a[2], a[3]
    )
}

/// A RoCE v2 GID table entry at `index` for IPv4 address `a` on netdev `ndev`.
fn v2_entry(index: u32, a: [u8; 4], ndev: &str) -> GidEntry {
    GidEntry {
        index,
        gid: v4_gid(a),
        gid_type: Some("RoCE v2".into()),
        ndev: Some(ndev.into()),
    }
}

#[test]
fn roce_picks_the_v2_ipv4_mapped_gid_on_the_up_netdev() {
    let m = machine(&[RdmaPort::roce(1, "ens1f0", [10, 0, 0, 1])], |_| {});
    let p = port(&m, 1);
    let c = candidates_from_topo(&p);
    assert_eq!(c.len(), 4);
    assert_eq!(c[3].kind, GidKind::RoceV2);
    assert_eq!(c[3].ipv4(), Some([10, 0, 0, 1].into()));
    assert!(c[0].is_link_local() && c[0].ip().is_none());
    let g = select_gid_for_port("mlx5_0", &p, &SysfsNetdevs::at_root(&m.root), None).unwrap();
    assert_eq!(g.index, 3, "{g:?}");
    assert_eq!(g.kind, GidKind::RoceV2);
    assert_eq!(g.gid.to_string(), "::ffff:10.0.0.1");
    assert!(g.use_grh);
    assert!(
        g.reason.contains("IPv4-mapped") && g.reason.contains("ens1f0 (up"),
        "{}",
        g.reason
    );
    assert!(!g.reason.contains("warning"), "{}", g.reason);
}

#[test]
fn a_stale_address_loses_to_one_the_netdev_really_has() {
    let mut p = RdmaPort::roce(1, "ens1f0", [10, 0, 0, 1]);
    p.gids.push(v2_entry(5, [10, 0, 0, 2], "ens1f0"));
    let m = machine(&[p], |_| {});
    let mut n = StaticNetdevs::default();
    let has: Vec<IpAddr> = vec!["10.0.0.2".parse().unwrap()];
    n.netdevs
        .insert("ens1f0".into(), (NetdevState::Up, Some(has)));
    let g = select_gid_for_port("mlx5_0", &port(&m, 1), &n, None).unwrap();
    assert_eq!(g.index, 5, "{g:?}");
    assert!(g.reason.contains("has 10.0.0.2"), "{}", g.reason);
    // Without address knowledge the lowest index wins.
    let g = select_gid_for_port("mlx5_0", &port(&m, 1), &StaticNetdevs::default(), None).unwrap();
    assert_eq!(g.index, 3);
}

#[test]
fn a_gid_on_an_up_netdev_beats_one_on_a_down_netdev() {
    let mut p = RdmaPort::roce(1, "ens1f0", [10, 0, 0, 1]);
    p.gids.push(v2_entry(7, [10, 9, 0, 1], "ens1f0.100"));
    let m = machine(&[p], |f| {
        f.virtual_netdev("ens1f0.100");
        f.file("sys/class/net/ens1f0/operstate", "down\n");
    });
    let netdevs = SysfsNetdevs::at_root(&m.root);
    let g = select_gid_for_port("mlx5_0", &port(&m, 1), &netdevs, None).unwrap();
    assert_eq!(g.index, 7, "{g:?}");
    assert_eq!(g.netdev.as_deref(), Some("ens1f0.100"));
}

#[test]
fn only_a_down_netdev_still_chooses_but_warns() {
    let m = machine(&[RdmaPort::roce(1, "ens1f0", [10, 0, 0, 1])], |f| {
        f.file("sys/class/net/ens1f0/operstate", "down\n");
    });
    let g = sysfs_choice(&m);
    assert_eq!(g.index, 3);
    assert!(
        g.reason.contains("warning: its netdev is down"),
        "{}",
        g.reason
    );
}

#[test]
fn no_ipv4_falls_back_to_link_local_v2_with_a_warning() {
    let mut p = RdmaPort::roce(1, "ens1f0", [10, 0, 0, 1]);
    p.gids.retain(|g| g.index < 2);
    let m = machine(&[p], |_| {});
    let g = sysfs_choice(&m);
    assert_eq!(g.index, 1, "{g:?}");
    assert!(g.reason.contains("assign an IPv4 address"), "{}", g.reason);
}

#[test]
fn infiniband_uses_gid_0_and_lid_routing() {
    let m = machine(&[RdmaPort::infiniband(1)], |_| {});
    let p = port(&m, 1);
    assert_eq!(candidates_from_topo(&p)[0].kind, GidKind::Ib);
    let g = select_gid_for_port("mlx5_0", &p, &StaticNetdevs::default(), None).unwrap();
    assert_eq!(g.index, 0);
    assert!(!g.use_grh);
    assert!(g.reason.contains("LID"), "{}", g.reason);
}

#[test]
fn override_must_exist_and_is_explained() {
    let m = machine(&[RdmaPort::roce(1, "ens1f0", [10, 0, 0, 1])], |_| {});
    let p = port(&m, 1);
    let n = StaticNetdevs::default();
    let g = select_gid_for_port("mlx5_0", &p, &n, Some(1)).unwrap();
    assert_eq!(g.index, 1);
    assert!(g.reason.starts_with("GDX_IB_GID_INDEX=1"), "{}", g.reason);
    assert!(g.reason.contains("not a RoCE v2 IPv4 GID"), "{}", g.reason);
    let e = select_gid_for_port("mlx5_0", &p, &n, Some(9)).unwrap_err();
    assert!(
        matches!(e, GidError::OverrideNotFound { index: 9, .. }),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "GDX_IB_GID_INDEX=9, but mlx5_0 port 1 has no GID 9; populated: 0, 1, 2, 3"
    );
    assert_eq!(parse_override(" 3 ").unwrap(), 3);
    for bad in ["", "x", "-1", "256", "3.0"] {
        assert!(
            matches!(parse_override(bad), Err(GidError::BadOverride { .. })),
            "{bad:?}"
        );
    }
}

#[test]
fn an_empty_roce_table_says_to_assign_an_address() {
    let mut p = RdmaPort::roce(1, "ens1f0", [10, 0, 0, 1]);
    p.gids.clear();
    let m = machine(&[p], |_| {});
    let e =
        select_gid_for_port("mlx5_0", &port(&m, 1), &StaticNetdevs::default(), None).unwrap_err();
    assert!(matches!(e, GidError::NoUsableGid { .. }));
    assert!(e.to_string().contains("assign an IP address"), "{e}");
}

#[test]
fn the_doctor_view_covers_every_port() {
    let m = machine(
        &[
            RdmaPort::roce(1, "ens1f0", [10, 0, 0, 1]),
            RdmaPort::roce(2, "ens1f0", [10, 0, 1, 1]).down(),
        ],
        |_| {},
    );
    let v = roce_gids(&m.topo, &SysfsNetdevs::at_root(&m.root));
    assert_eq!(v.len(), 2);
    assert_eq!(v[0].link, LinkKind::Ethernet);
    assert_eq!(v[0].choice.as_ref().unwrap().index, 3);
    assert_eq!(v[1].state.as_deref(), Some("1: DOWN"));
    let j = serde_json::to_value(&v).unwrap();
    assert_eq!(j[0]["choice"]["ok"]["index"], 3, "{j}");
}

#[test]
fn verbs_gid_tables_map_like_sysfs_ones() {
    use gdx_sys::verbs::{GidEntry as VGid, GidType, LinkLayer, Port, PortState};
    let gid = |index, text: &str, kind| VGid {
        index,
        gid: text.parse().unwrap(),
        kind,
        netdev: Some("ens1f0".into()),
    };
    let port = Port {
        number: 1,
        state: PortState::Active,
        link_layer: LinkLayer::Ethernet,
        active_mtu_bytes: Some(4096),
        max_mtu_bytes: Some(4096),
        active_width_lanes: Some(4),
        active_speed: Some("HDR"),
        rate_gbps: Some(200.0),
        lid: 0,
        gids: vec![
            gid(0, "fe80::a00:27ff:fe00:1", GidType::Ib),
            gid(1, "fe80::a00:27ff:fe00:1", GidType::RoceV2),
            gid(2, "::ffff:10.0.0.1", GidType::RoceV1),
            gid(3, "::ffff:10.0.0.1", GidType::RoceV2),
        ],
        error: None,
    };
    let c = candidates_from_verbs(&port);
    assert_eq!(
        c[0].kind,
        GidKind::RoceV1,
        "IB-typed GID on Ethernet is RoCE v1"
    );
    let g = select_gid(
        "mlx5_0",
        1,
        LinkKind::Ethernet,
        &c,
        &StaticNetdevs::default(),
        None,
    )
    .unwrap();
    assert_eq!(g.index, 3);
}

#[test]
fn the_doctor_view_names_the_netdev_and_the_routable_gid() {
    use gdx_rdma::doctor::roce_gids_with;
    let m = machine(&[RdmaPort::roce(1, "ens1f0", [10, 0, 0, 1])], |_| {});
    let nd = SysfsNetdevs::at_root(&m.root);
    let v = roce_gids_with(&m.topo, &nd, Ok(None));
    assert!(v[0].is_active());
    assert_eq!(v[0].netdev.as_deref(), Some("ens1f0"));
    assert_eq!(v[0].routable_v2().map(|g| g.index), Some(3));
    assert!(v[0].gid(0).is_some_and(|g| !g.is_routable_v2()));
    // The override comes from the caller, not from this process's environment.
    let v = roce_gids_with(&m.topo, &nd, Ok(Some(2)));
    assert_eq!(v[0].choice.as_ref().unwrap().index, 2);
    let v = roce_gids_with(&m.topo, &nd, parse_override("x").map(Some));
    assert!(matches!(v[0].choice, Err(GidError::BadOverride { .. })));
}

#[test]
fn port_mtus_under_a_root_read_the_netdev_and_take_verbs_when_given() {
    use gdx_rdma::doctor::{no_rdma_port_reason, port_mtus_at_root};
    let m = machine(
        &[
            RdmaPort::roce(1, "ens1f0", [10, 0, 0, 1]),
            RdmaPort::infiniband(2),
        ],
        |f| {
            f.file("sys/class/net/ens1f0/mtu", "1500\n");
        },
    );
    assert_eq!(no_rdma_port_reason(&m.topo, &m.root), None);
    let none = |_: &str, _: u32| (None, None);
    let v = port_mtus_at_root(&m.topo, &m.root, &none);
    assert_eq!(v.len(), 2);
    assert_eq!(v[0].netdev, Some(("ens1f0".to_string(), Some(1500))));
    assert_eq!(v[0].roce_mtu_for_netdev, Some(1024));
    assert_eq!(v[0].effective_mtu(), Some(1024));
    assert!(v[0].is_active());
    assert_eq!(v[1].link, LinkKind::InfiniBand);
    assert_eq!(v[1].netdev, None);
    assert_eq!(v[1].effective_mtu(), None);
    let verbs = |d: &str, p: u32| {
        assert_eq!(d, "mlx5_0");
        (Some(if p == 1 { 2048 } else { 4096 }), Some(4096))
    };
    let v = port_mtus_at_root(&m.topo, &m.root, &verbs);
    assert_eq!(v[0].effective_mtu(), Some(2048));
    assert_eq!(v[1].effective_mtu(), Some(4096));
    assert_eq!(v[1].max_mtu, Some(4096));
}

#[test]
fn no_rdma_port_is_explained_from_the_root() {
    use gdx_rdma::doctor::no_rdma_port_reason;
    let dir = tempfile::tempdir().unwrap();
    let mut f = SysfsFixture::new(dir.path());
    let rp = f.root_port("0000:00", "0000:00:01.0", Some(0));
    let _nic = f.nic(&rp, "0000:01:00.0");
    f.module("ib_core", None, &[]);
    let topo = gdx_topo::from_root(dir.path()).unwrap();
    let why = no_rdma_port_reason(&topo, dir.path()).unwrap();
    assert!(
        why.starts_with("no RDMA device: the kernel has none") && why.contains("ib_core"),
        "{why}"
    );
    // A software device (no PCI function) is a NIC like any other: one without ports is
    // named, and once it has an active port there is something to check.
    std::fs::create_dir_all(dir.path().join("sys/class/infiniband/rxe0")).unwrap();
    let topo = gdx_topo::from_root(dir.path()).unwrap();
    let why = no_rdma_port_reason(&topo, dir.path()).unwrap();
    assert!(why.contains("rxe0") && why.contains("no ports"), "{why}");
    let dir = tempfile::tempdir().unwrap();
    let mut f = SysfsFixture::new(dir.path());
    f.virtual_netdev("dummy0");
    f.software_rdma(
        "rxe0",
        "dummy0",
        &[gdx_topo::fixture::RdmaPort::roce(
            1,
            "dummy0",
            [192, 0, 2, 1],
        )],
    );
    let topo = gdx_topo::from_root(dir.path()).unwrap();
    assert_eq!(no_rdma_port_reason(&topo, dir.path()), None);
}
