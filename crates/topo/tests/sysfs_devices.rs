//! Device facts read from synthetic sysfs trees: NIC naming and ports, GIDs, link figures,
//! NUMA, names, and which functions count as GPUs and NICs.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_topo::fixture::{PciNode, RdmaPort, SysfsFixture, ENDPOINT};
use gdx_topo::{from_root, DeviceKind, PciAddr, Topology};

fn pci(s: &str) -> PciAddr {
    s.parse().unwrap()
}

fn machine() -> (tempfile::TempDir, SysfsFixture, PciNode) {
    let t = tempfile::tempdir().unwrap();
    let mut f = SysfsFixture::new(t.path());
    let rp = f.root_port("0000:00", "0000:00:01.0", Some(0));
    (t, f, rp)
}

fn nic_names(t: &Topology) -> Vec<(String, Option<String>)> {
    t.nics()
        .map(|d| (d.label.clone(), d.nic.as_ref().unwrap().rdma_name.clone()))
        .collect()
}

#[test]
fn rdma_names_sort_naturally_into_nic_labels() {
    let (t, mut f, rp) = machine();
    // Bus order is the reverse of name order, so labels must come from the names.
    for (bdf, name) in [
        ("0000:01:00.0", "mlx5_10"),
        ("0000:02:00.0", "mlx5_2"),
        ("0000:03:00.0", "mlx5_0"),
    ] {
        let nic = f.nic(&rp, bdf);
        f.rdma(&nic, name, &[RdmaPort::infiniband(1)]);
    }
    let topo = from_root(t.path()).unwrap();
    let got = nic_names(&topo);
    let want: Vec<(String, Option<String>)> =
        [("NIC0", "mlx5_0"), ("NIC1", "mlx5_2"), ("NIC2", "mlx5_10")]
            .iter()
            .map(|(l, n)| (l.to_string(), Some(n.to_string())))
            .collect();
    assert_eq!(got, want);
    assert_eq!(topo.device("NIC2").unwrap().bdf, Some(pci("0000:01:00.0")));
    assert_eq!(
        topo.device("NIC2").unwrap().name.as_deref(),
        Some("mlx5_10")
    );
}

#[test]
fn rdma_ports_and_gid_types() {
    let (t, mut f, rp) = machine();
    let nic = f.nic(&rp, "0000:01:00.0");
    f.rdma(
        &nic,
        "mlx5_0",
        &[
            RdmaPort::roce(1, "ens1f0np0", [192, 168, 1, 56]),
            RdmaPort::infiniband(2).down(),
        ],
    );
    f.netdev(&nic, "ens1f0np0", Some(200_000));
    let topo = from_root(t.path()).unwrap();
    let n = topo.device("NIC0").unwrap().nic.clone().unwrap();
    assert_eq!(n.netdevs, ["ens1f0np0"]);
    assert_eq!(n.speed_mbps, Some(200_000));
    assert_eq!(n.ports.len(), 2);
    let p1 = &n.ports[0];
    assert_eq!(p1.port, 1);
    assert_eq!(p1.state.as_deref(), Some("4: ACTIVE"));
    assert_eq!(p1.link_layer.as_deref(), Some("Ethernet"));
    assert_eq!(p1.rate.as_deref(), Some("200 Gb/sec (4X HDR)"));
    assert_eq!(p1.rate_gbps, Some(200.0));
    // Four used GIDs; the all-zero slots the fixture writes after them are skipped.
    let idx: Vec<u32> = p1.gids.iter().map(|g| g.index).collect();
    assert_eq!(idx, [0, 1, 2, 3]);
    assert_eq!(p1.gids[3].gid_type.as_deref(), Some("RoCE v2"));
    assert_eq!(p1.gids[2].gid_type.as_deref(), Some("IB/RoCE v1"));
    assert!(
        p1.gids[3].gid.ends_with("ffff:c0a8:0138"),
        "{}",
        p1.gids[3].gid
    );
    assert_eq!(p1.gids[3].ndev.as_deref(), Some("ens1f0np0"));
    let p2 = &n.ports[1];
    assert_eq!(p2.state.as_deref(), Some("1: DOWN"));
    assert_eq!(p2.gids[0].ndev, None);
    assert_eq!(p2.rate_gbps, Some(400.0));
}

#[test]
fn unreadable_gid_attributes_skip_the_attribute_not_the_gid() {
    let (t, mut f, rp) = machine();
    let nic = f.nic(&rp, "0000:01:00.0");
    f.rdma(&nic, "mlx5_0", &[RdmaPort::roce(1, "eth2", [10, 0, 0, 1])]);
    let types = t
        .path()
        .join(nic.dir())
        .join("infiniband/mlx5_0/ports/1/gid_attrs/types");
    std::fs::remove_file(types.join("1")).unwrap();
    std::fs::create_dir(types.join("1")).unwrap();
    let topo = from_root(t.path()).unwrap();
    let gids = &topo.device("NIC0").unwrap().nic.as_ref().unwrap().ports[0].gids;
    assert_eq!(gids.len(), 4);
    assert_eq!(gids[1].gid_type, None);
    assert_eq!(gids[1].ndev.as_deref(), Some("eth2"));
    assert!(
        topo.notes.iter().any(|n| n.contains("gid_attrs/types/1")),
        "{:?}",
        topo.notes
    );
}

#[test]
fn downtrained_and_unknown_link_figures() {
    let (t, mut f, rp) = machine();
    let gpu = f.gpu(&rp, "0000:01:00.0");
    f.link(&gpu, (16.0, 8), (32.0, 16));
    let gpu2 = f.gpu(&rp, "0000:02:00.0");
    f.set(&gpu2, "current_link_speed", "Unknown")
        .set(&gpu2, "max_link_speed", "2.5 GT/s");
    let topo = from_root(t.path()).unwrap();
    let l = topo.device("GPU0").unwrap().link;
    assert_eq!(l.current.speed_gts, Some(16.0));
    assert_eq!(l.current.width, Some(8));
    assert_eq!(l.max.speed_gts, Some(32.0));
    assert_eq!(l.max.width, Some(16));
    assert_eq!(l.current.generation(), Some(4));
    let l2 = topo.device("GPU1").unwrap().link;
    assert_eq!(l2.current.speed_gts, None);
    assert_eq!(l2.max.speed_gts, Some(2.5));
    assert!(topo.notes.is_empty(), "{:?}", topo.notes);
}

#[test]
fn numa_minus_one_is_none_and_known_numa_is_kept() {
    let t = tempfile::tempdir().unwrap();
    let mut f = SysfsFixture::new(t.path());
    let hb = f.host_bridge("0000:00", None);
    f.gpu(&hb, "0000:00:06.0");
    let rp = f.root_port("0000:80", "0000:80:01.0", Some(1));
    f.gpu(&rp, "0000:81:00.0");
    let topo = from_root(t.path()).unwrap();
    assert_eq!(topo.device("GPU0").unwrap().numa, None);
    assert_eq!(topo.device("GPU1").unwrap().numa, Some(1));
    assert_eq!(topo.host_bridge_numa("pci0000:00"), None);
    assert_eq!(topo.host_bridge_numa("pci0000:80"), Some(1));
}

#[test]
fn gpu_names_ids_and_what_is_not_a_gpu() {
    let (t, mut f, rp) = machine();
    let g0 = f.gpu(&rp, "0000:01:00.0");
    f.nvidia_gpu_info(&g0, "NVIDIA H100 80GB HBM3");
    f.gpu(&rp, "0000:02:00.0");
    // A BMC's VGA (ASPEED) and the GPU's audio function are not GPUs.
    f.function(&rp, "0000:03:00.0", 0x030000, 0x1a03, 0x2000, ENDPOINT);
    f.function(&rp, "0000:01:00.1", 0x040300, 0x10de, 0x22a3, ENDPOINT);
    // A processing accelerator is.
    f.function(&rp, "0000:04:00.0", 0x120000, 0x1da3, 0x1020, ENDPOINT);
    // An NVMe controller.
    f.nvme(&rp, "0000:05:00.0");
    let topo = from_root(t.path()).unwrap();
    let gpus: Vec<(String, Option<String>)> = topo
        .gpus()
        .map(|d| (d.bdf.unwrap().to_string(), d.name.clone()))
        .collect();
    assert_eq!(
        gpus,
        [
            (
                "0000:01:00.0".to_string(),
                Some("NVIDIA H100 80GB HBM3".to_string())
            ),
            ("0000:02:00.0".to_string(), Some("10de:2335".to_string())),
            ("0000:04:00.0".to_string(), Some("1da3:1020".to_string())),
        ]
    );
    let nvme: Vec<_> = topo.of_kind(DeviceKind::Nvme).collect();
    assert_eq!(nvme.len(), 1);
    assert_eq!(nvme[0].label, "NVME0");
    assert_eq!(nvme[0].class, Some(0x010802));
}

#[test]
fn plain_ethernet_nic_and_interfaces_that_are_not_nics() {
    let (t, mut f, rp) = machine();
    let nic = f.nic(&rp, "0000:01:00.0");
    f.netdev(&nic, "eno2", None)
        .netdev(&nic, "eno10", Some(25_000));
    // A network function without a netdev or RDMA device is not listed.
    f.nic(&rp, "0000:02:00.0");
    // Software interfaces have no device link.
    f.virtual_netdev("lo").virtual_netdev("docker0");
    // A USB network adapter: its nearest PCI function is the USB controller.
    let usb = f.function(&rp, "0000:03:00.0", 0x0c0330, 0x8086, 0xa36d, ENDPOINT);
    let dev = usb.dir().join("usb1/1-1/1-1:1.0");
    f.file(dev.join("net/usb0/speed"), "100\n");
    f.symlink(dev.join("net/usb0/device"), "../../../1-1:1.0");
    f.symlink(
        "sys/class/net/usb0",
        format!(
            "../../{}",
            dev.join("net/usb0").strip_prefix("sys").unwrap().display()
        ),
    );
    // virtio-net: the interface hangs below a virtio device below the PCI function.
    let vnic = f.function(&rp, "0000:04:00.0", 0x020000, 0x1af4, 0x1041, ENDPOINT);
    let vdev = vnic.dir().join("virtio2");
    f.file(vdev.join("net/eth0/speed"), "-1\n");
    f.symlink(vdev.join("net/eth0/device"), "../../../virtio2");
    f.symlink(
        "sys/class/net/eth0",
        format!(
            "../../{}",
            vdev.join("net/eth0").strip_prefix("sys").unwrap().display()
        ),
    );

    let topo = from_root(t.path()).unwrap();
    let nics: Vec<(Option<String>, Vec<String>, Option<u64>)> = topo
        .nics()
        .map(|d| {
            let n = d.nic.as_ref().unwrap();
            (
                d.bdf.map(|b| b.to_string()),
                n.netdevs.clone(),
                n.speed_mbps,
            )
        })
        .collect();
    assert_eq!(
        nics,
        [
            (
                Some("0000:01:00.0".to_string()),
                vec!["eno2".to_string(), "eno10".to_string()],
                Some(25_000)
            ),
            (
                Some("0000:04:00.0".to_string()),
                vec!["eth0".to_string()],
                None
            ),
        ]
    );
    // No RDMA device: named by netdev (a virtio NIC is `eth0`, never `1af4:1041`).
    assert_eq!(topo.device("NIC0").unwrap().name.as_deref(), Some("eno2"));
    assert_eq!(topo.device("NIC1").unwrap().name.as_deref(), Some("eth0"));
    assert!(topo.notes.is_empty(), "{:?}", topo.notes);
}

#[test]
fn a_software_rdma_device_is_a_nic_marked_software_with_its_netdev() {
    let (dir, mut f, rp) = machine();
    f.gpu(&rp, "0000:01:00.0");
    f.virtual_netdev("dummy0");
    f.software_rdma(
        "rxe0",
        "dummy0",
        &[RdmaPort::roce(1, "dummy0", [192, 0, 2, 1])],
    );
    let t = from_root(dir.path()).unwrap();
    let nics: Vec<_> = t.nics().collect();
    assert_eq!(nics.len(), 1, "{:?}", t.devices);
    let n = nics[0];
    assert_eq!(n.name.as_deref(), Some("rxe0"));
    assert_eq!(n.bdf, None);
    let info = n.nic.as_ref().unwrap();
    assert!(info.software);
    assert_eq!(info.rdma_name.as_deref(), Some("rxe0"));
    assert_eq!(info.netdevs, vec!["dummy0".to_string()]);
    assert_eq!(info.ports.len(), 1);
    assert_eq!(info.ports[0].gids.len(), 4);
    // The CPU moves a software NIC's bytes: the worst class to any GPU.
    assert_eq!(
        t.class_between("GPU0", &n.label).unwrap().to_string(),
        "SYS"
    );
    assert!(
        !t.notes.iter().any(|x| x.contains("rxe0")),
        "no note calls it ignored: {:?}",
        t.notes
    );
    let text = gdx_topo::render::render_text(&t, &Default::default());
    assert!(text.contains("software RDMA"), "{text}");
}
