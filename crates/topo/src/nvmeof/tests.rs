use super::*;
use crate::fixture::{NvmeofCtrl, RdmaPort, SysfsFixture};

/// VM a of the RDMA suite: rxe0 on eth0 (198.51.100.1), connected to VM b's target.
fn vm_a(cm_id: Option<&str>) -> (tempfile::TempDir, RootFs) {
    let t = tempfile::tempdir().unwrap();
    let mut f = SysfsFixture::new(t.path());
    f.virtual_netdev("eth0");
    f.software_rdma(
        "rxe0",
        "eth0",
        &[RdmaPort::roce(1, "eth0", [198, 51, 100, 1])],
    );
    f.nvmeof_controller(&NvmeofCtrl::rdma("198.51.100.2"));
    f.ipv4_routes(&[("eth0", [198, 51, 100, 0], 24), ("lo", [127, 0, 0, 0], 8)]);
    // A local PCIe controller is no fabric controller.
    f.file("sys/class/nvme/nvme1/transport", "pcie\n");
    if let Some(j) = cm_id {
        f.file(CM_ID_PATH, j);
    }
    let fs = RootFs::new(t.path());
    (t, fs)
}

/// `rdma -j res show cm_id` as iproute2 writes it (rdma/res-cmid.c): the address and port in
/// one string, kernel owners without brackets.
const CM_JSON: &str = r#"[{"ifindex":0,"ifname":"rxe0","port":1,"lqpn":17,"qp-type":"RC","state":"CONNECT","ps":"TCP","pid":0,"comm":"nvme_rdma","cm-idn":0,"src-addr":"198.51.100.1:43959","dst-addr":"198.51.100.2:4420"},
{"ifindex":0,"ifname":"rxe0","port":1,"lqpn":18,"qp-type":"RC","state":"CONNECT","ps":"TCP","pid":0,"comm":"nvme_rdma","cm-idn":1,"src-addr":"198.51.100.1:39780","dst-addr":"198.51.100.2:4420"},
{"ifindex":0,"ifname":"rxe0","port":1,"state":"LISTEN","ps":"TCP","pid":77,"comm":"gdx","cm-idn":2,"src-addr":"0.0.0.0:7448"}]"#;

#[test]
fn a_fabric_controller_is_listed_with_its_namespace_target_and_timeouts() {
    let (_t, fs) = vm_a(Some(CM_JSON));
    let cs = controllers(&fs);
    assert_eq!(cs.len(), 1, "the pcie controller is left out: {cs:#?}");
    let c = &cs[0];
    assert_eq!(c.name, "nvme0");
    assert_eq!(c.transport, "rdma");
    assert_eq!(c.traddr.as_deref(), Some("198.51.100.2"));
    assert_eq!(c.trsvcid.as_deref(), Some("4420"));
    assert_eq!(c.state.as_deref(), Some("live"));
    assert_eq!(c.ctrl_loss_tmo, Some(Timeout::Secs(600)));
    assert_eq!(c.fast_io_fail_tmo, Some(Timeout::Off));
    assert_eq!(c.reconnect_delay, Some(10));
    assert_eq!(c.namespaces, vec!["nvme0n1"]);
    assert_eq!(c.subsystem.as_deref(), Some("nvme-subsys0"));
    assert_eq!(c.paths, vec!["nvme0"]);
    assert_eq!(c.iopolicy.as_deref(), Some("numa"));
}

#[test]
fn the_carrier_comes_from_cm_ids_and_the_route() {
    let (_t, fs) = vm_a(Some(CM_JSON));
    let c = &controllers(&fs)[0];
    assert_eq!(c.carrier.rdma_device.as_deref(), Some("rxe0"));
    assert_eq!(c.carrier.port, Some(1));
    assert_eq!(c.carrier.netdev.as_deref(), Some("eth0"));
    assert!(
        c.carrier.evidence[0].contains("2 queue(s) of nvme_rdma on rxe0/1"),
        "{:?}",
        c.carrier.evidence
    );
    assert_eq!(
        c.fabric_path(),
        "nvme0 over rdma via rxe0/1 (eth0) to 198.51.100.2:4420"
    );
}

#[test]
fn without_cm_ids_the_route_and_the_gid_table_name_the_device() {
    let (_t, fs) = vm_a(None);
    let c = &controllers(&fs)[0];
    assert_eq!(c.carrier.netdev.as_deref(), Some("eth0"));
    assert_eq!(c.carrier.rdma_device.as_deref(), Some("rxe0"));
    let ev = c.carrier.evidence.join("\n");
    assert!(ev.contains("is not in the capture"), "{ev}");
    assert!(
        ev.contains("198.51.100.2 leaves through eth0 (/24 route)"),
        "{ev}"
    );
    assert!(ev.contains("rxe0/1 sits on eth0"), "{ev}");
}

#[test]
fn cm_ids_parse_from_text_too() {
    let text = "link rxe0/1 cm-idn 3 lqpn 17 qp-type RC state CONNECT ps TCP comm [nvme_rdma] src-addr 198.51.100.1:38000 dst-addr 198.51.100.2:4420\n";
    let ids = parse_cm_ids(text).unwrap();
    assert_eq!(
        ids,
        vec![CmId {
            device: "rxe0".into(),
            port: Some(1),
            comm: "[nvme_rdma]".into(),
            dst_addr: "198.51.100.2".into(),
            dst_port: Some(4420),
        }]
    );
    assert!(parse_cm_ids("garbage without links").is_err());
    assert_eq!(
        split_addr("fe80::1:4420"),
        ("fe80::1".to_string(), Some(4420))
    );
    assert_eq!(
        split_addr("198.51.100.2"),
        ("198.51.100.2".to_string(), None)
    );
    assert_eq!(parse_cm_ids("[]").unwrap(), vec![]);
}

#[test]
fn a_block_device_maps_to_its_controller() {
    let (_t, fs) = vm_a(Some(CM_JSON));
    assert_eq!(disk_of(&fs, 259, 0).as_deref(), Some("nvme0n1"));
    assert_eq!(disk_of(&fs, 8, 0), None);
    let cs = controllers(&fs);
    assert_eq!(controller_of_disk(&cs, "nvme0n1").unwrap().name, "nvme0");
    assert!(controller_of_disk(&cs, "sda").is_none());
}

#[test]
fn a_software_carrier_has_no_pcie_class_to_a_gpu() {
    let t = tempfile::tempdir().unwrap();
    let mut f = SysfsFixture::new(t.path());
    let rp = f.root_port("0000:00", "0000:00:01.0", Some(0));
    f.gpu(&rp, "0000:01:00.0");
    f.virtual_netdev("eth0");
    f.software_rdma(
        "rxe0",
        "eth0",
        &[RdmaPort::roce(1, "eth0", [198, 51, 100, 1])],
    );
    f.nvmeof_controller(&NvmeofCtrl::rdma("198.51.100.2"));
    f.ipv4_routes(&[("eth0", [198, 51, 100, 0], 24)]);
    let topo = crate::from_root(t.path()).unwrap();
    let c = &controllers(&RootFs::new(t.path()))[0];
    assert_eq!(c.gpu_classes(&topo), vec![("GPU0".to_string(), None)]);
}

#[test]
fn topo_lists_the_controller_in_text_and_json() {
    let (t, fs) = vm_a(Some(CM_JSON));
    let topo = crate::from_root(t.path()).unwrap();
    let cs = controllers(&fs);
    let text = render_text(&cs, &topo);
    assert!(
        text.contains("nvme0  rdma 198.51.100.2:4420  live  namespaces nvme0n1  via rxe0/1 (eth0) to 198.51.100.2:4420"),
        "{text}"
    );
    let j = json(&cs, &topo);
    assert_eq!(j[0]["transport"], "rdma");
    assert_eq!(j[0]["carrier"]["rdma_device"], "rxe0");
    assert_eq!(j[0]["namespaces"][0], "nvme0n1");
    assert_eq!(render_text(&[], &topo), "");
}

#[test]
fn dev_t_splits_as_glibc_does() {
    // makedev(259, 0) and makedev(8, 17), and a large minor.
    assert_eq!(dev_major_minor(259 << 8), (259, 0));
    assert_eq!(dev_major_minor((8 << 8) | 17), (8, 17));
    let big = ((0x12345u64 & !0xff) << 12) | (0x45 & 0xff) | ((7u64 & 0xfff) << 8);
    assert_eq!(dev_major_minor(big), (7, 0x12345));
}

#[test]
fn a_file_on_no_fabric_is_not_on_one() {
    let (_t, fs) = vm_a(Some(CM_JSON));
    // This test file's own disk is not in the fixture's sys/dev/block.
    assert!(fabric_of_path(&fs, std::path::Path::new(file!())).is_none());
}
