//! EFA NICs in a synthetic sysfs tree: found by the `efa` driver, by Amazon's EFA PCI ids, or
//! by an RDMA device named like one, and marked in the model and in `gdx topo`'s table.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_topo::fixture::{RdmaPort, SysfsFixture, ENDPOINT};
use gdx_topo::render::{render_text, RenderOptions};
use gdx_topo::sysfs::is_efa;
use gdx_topo::{from_root, NicInfo};

fn nic<'a>(t: &'a gdx_topo::Topology, label: &str) -> &'a NicInfo {
    t.device(label).unwrap().nic.as_ref().unwrap()
}

#[test]
fn an_efa_is_marked_beside_a_connectx_that_is_not() {
    let t = tempfile::tempdir().unwrap();
    let mut f = SysfsFixture::new(t.path());
    let rp = f.root_port("0000:00", "0000:00:01.0", Some(0));
    // A p5-like EFA: Amazon 1d0f:efa1, named rdmap<bus>s<slot> by newer kernels, no netdev.
    let efa = f.function(&rp, "0000:10:00.0", 0x020000, 0x1d0f, 0xefa1, ENDPOINT);
    f.driver(&efa, "efa");
    f.rdma(&efa, "rdmap16s0", &[RdmaPort::infiniband(1)]);
    let cx = f.nic(&rp, "0000:20:00.0");
    f.driver(&cx, "mlx5_core");
    f.rdma(&cx, "mlx5_0", &[RdmaPort::infiniband(1)]);
    let topo = from_root(t.path()).unwrap();
    let labels: Vec<(String, bool)> = topo
        .nics()
        .map(|d| (d.label.clone(), d.nic.as_ref().unwrap().efa))
        .collect();
    assert_eq!(
        labels,
        [("NIC0".to_string(), false), ("NIC1".to_string(), true)]
    );
    assert_eq!(nic(&topo, "NIC1").rdma_name.as_deref(), Some("rdmap16s0"));
    let text = render_text(&topo, &RenderOptions::default());
    let efa_line = text
        .lines()
        .find(|l| l.contains("rdmap16s0") && l.contains("EFA"))
        .unwrap_or_else(|| panic!("no EFA line in\n{text}"));
    assert!(efa_line.contains("NIC1"), "{efa_line}");
    assert!(!text
        .lines()
        .any(|l| l.contains("mlx5_0") && l.contains("EFA")));
    let json = serde_json::to_value(&topo).unwrap();
    assert!(json.to_string().contains("\"efa\":true"));
}

#[test]
fn an_efa_without_its_driver_is_still_shown() {
    let t = tempfile::tempdir().unwrap();
    let mut f = SysfsFixture::new(t.path());
    let rp = f.root_port("0000:00", "0000:00:01.0", Some(0));
    // The efa module is not loaded: no driver link, no RDMA device, no netdev.
    f.function(&rp, "0000:10:00.0", 0x020000, 0x1d0f, 0xefa0, ENDPOINT);
    let topo = from_root(t.path()).unwrap();
    let n = nic(&topo, "NIC0");
    assert!(n.efa);
    assert_eq!(n.rdma_name, None);
    assert!(
        topo.notes.iter().any(|x| x.contains("efa kernel module")),
        "{:?}",
        topo.notes
    );
}

#[test]
fn the_three_signs_of_an_efa() {
    assert!(is_efa(None, None, Some("efa"), None));
    assert!(is_efa(Some(0x1d0f), Some(0xefa2), None, None));
    assert!(is_efa(None, None, None, Some("efa_0")));
    // Amazon's ENA (1d0f:ec20) is an Ethernet NIC, not an EFA.
    assert!(!is_efa(Some(0x1d0f), Some(0xec20), Some("ena"), None));
    assert!(!is_efa(
        Some(0x15b3),
        Some(0x1021),
        Some("mlx5_core"),
        Some("mlx5_0")
    ));
}
