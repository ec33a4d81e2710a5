//! NIC choice from topology fixtures: nearest by PCIe class for GPU memory (rails on ties),
//! same NUMA node for host memory, down ports skipped.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_rdma::nic::{choose_nics, split_across_rails, GpuRef, MemPlace, NicError};
use gdx_topo::fixture::{RdmaPort, SysfsFixture};
use gdx_topo::{PathClass, Topology};

/// Node 0: GPU0 + mlx5_0 + mlx5_1 below one switch (PIX); GPU1 two switches below mlx5_2's
/// switch (PXB). Node 1: mlx5_3 and GPU2 on separate root ports of one host bridge (PHB).
fn machine(mlx5_1_down: bool) -> (tempfile::TempDir, Topology) {
    let dir = tempfile::tempdir().unwrap();
    let mut f = SysfsFixture::new(dir.path());
    f.numa_node(0, "0-15").numa_node(1, "16-31");
    let ib = |p| RdmaPort::infiniband(p);

    let rp = f.root_port("0000:00", "0000:00:01.0", Some(0));
    let sw = f.switch_below(
        &rp,
        "0000:01:00.0",
        &["0000:02:00.0", "0000:02:01.0", "0000:02:02.0"],
    );
    f.gpu(&sw.downstream[0], "0000:03:00.0");
    let n0 = f.nic(&sw.downstream[1], "0000:04:00.0");
    f.rdma(&n0, "mlx5_0", &[ib(1)]);
    let n1 = f.nic(&sw.downstream[2], "0000:05:00.0");
    let p1 = if mlx5_1_down { ib(1).down() } else { ib(1) };
    f.rdma(&n1, "mlx5_1", &[p1]);

    let rp2 = f.root_port("0000:00", "0000:00:02.0", Some(0));
    let a = f.switch_below(&rp2, "0000:10:00.0", &["0000:11:00.0", "0000:11:01.0"]);
    let b = f.switch_below(&a.downstream[0], "0000:12:00.0", &["0000:13:00.0"]);
    f.gpu(&b.downstream[0], "0000:14:00.0");
    let n2 = f.nic(&a.downstream[1], "0000:20:00.0");
    f.rdma(&n2, "mlx5_2", &[ib(1)]);

    let rp3 = f.root_port("0000:80", "0000:80:01.0", Some(1));
    let n3 = f.nic(&rp3, "0000:81:00.0");
    f.rdma(&n3, "mlx5_3", &[ib(1)]);
    let rp4 = f.root_port("0000:80", "0000:80:02.0", Some(1));
    f.gpu(&rp4, "0000:82:00.0");

    // A plain Ethernet NIC (no RDMA device) is never chosen.
    let rp5 = f.root_port("0000:00", "0000:00:03.0", Some(0));
    let eth = f.nic(&rp5, "0000:30:00.0");
    f.netdev(&eth, "eno1", Some(1000));

    let topo = gdx_topo::from_root(dir.path()).unwrap();
    (dir, topo)
}

fn gpu(label: &str) -> MemPlace {
    MemPlace::Gpu(GpuRef::Label(label.into()))
}

fn devices(c: &gdx_rdma::NicChoice) -> Vec<&str> {
    c.rails.iter().map(|r| r.device.as_str()).collect()
}

#[test]
fn gpu_with_two_pix_nics_gets_two_rails() {
    let (_d, t) = machine(false);
    let c = choose_nics(&t, &gpu("GPU0")).unwrap();
    assert_eq!(devices(&c), ["mlx5_0", "mlx5_1"]);
    assert!(c.rails.iter().all(|r| r.class == Some(PathClass::Pix)));
    assert_eq!(c.gpu_direct, Some(true));
    assert!(c.reason.contains("2 rails"), "{}", c.reason);
    // Also found by PCI address.
    let by_bdf = choose_nics(
        &t,
        &MemPlace::Gpu(GpuRef::Bdf("0000:03:00.0".parse().unwrap())),
    )
    .unwrap();
    assert_eq!(by_bdf, c);
}

#[test]
fn a_down_port_removes_its_nic() {
    let (_d, t) = machine(true);
    let c = choose_nics(&t, &gpu("GPU0")).unwrap();
    assert_eq!(devices(&c), ["mlx5_0"]);
}

#[test]
fn pxb_is_still_direct() {
    let (_d, t) = machine(false);
    let c = choose_nics(&t, &gpu("GPU1")).unwrap();
    assert_eq!(devices(&c), ["mlx5_2"]);
    assert_eq!(c.rails[0].class, Some(PathClass::Pxb));
    assert_eq!(c.gpu_direct, Some(true));
}

#[test]
fn phb_is_chosen_but_not_direct() {
    let (_d, t) = machine(false);
    let c = choose_nics(&t, &gpu("GPU2")).unwrap();
    assert_eq!(devices(&c), ["mlx5_3"]);
    assert_eq!(c.rails[0].class, Some(PathClass::Phb));
    assert_eq!(c.gpu_direct, Some(false));
    assert!(
        c.reason.contains("stage through host memory"),
        "{}",
        c.reason
    );
}

#[test]
fn host_memory_uses_the_nics_of_its_numa_node() {
    let (_d, t) = machine(false);
    let c = choose_nics(&t, &MemPlace::Host { numa: Some(1) }).unwrap();
    assert_eq!(devices(&c), ["mlx5_3"]);
    assert_eq!(c.gpu_direct, None);
    let c = choose_nics(&t, &MemPlace::Host { numa: Some(0) }).unwrap();
    assert_eq!(devices(&c), ["mlx5_0", "mlx5_1", "mlx5_2"]);
    let c = choose_nics(&t, &MemPlace::Host { numa: None }).unwrap();
    assert_eq!(c.rails.len(), 4);
    let c = choose_nics(&t, &MemPlace::Host { numa: Some(7) }).unwrap();
    assert_eq!(c.rails.len(), 4);
    assert!(c.reason.contains("no RDMA NIC"), "{}", c.reason);
}

#[test]
fn missing_gpu_and_missing_rdma_are_named() {
    let (_d, t) = machine(false);
    assert!(matches!(
        choose_nics(&t, &gpu("GPU9")),
        Err(NicError::NoSuchGpu { .. })
    ));

    let dir = tempfile::tempdir().unwrap();
    let mut f = SysfsFixture::new(dir.path());
    let rp = f.root_port("0000:00", "0000:00:01.0", Some(0));
    f.gpu(&rp, "0000:03:00.0");
    let eth = f.nic(&rp, "0000:04:00.0");
    f.netdev(&eth, "eno1", Some(1000));
    let no_rdma = gdx_topo::from_root(dir.path()).unwrap();
    assert_eq!(
        choose_nics(&no_rdma, &gpu("GPU0")),
        Err(NicError::NoRdmaNic)
    );

    let dir = tempfile::tempdir().unwrap();
    let mut f = SysfsFixture::new(dir.path());
    let rp = f.root_port("0000:00", "0000:00:01.0", Some(0));
    let n = f.nic(&rp, "0000:04:00.0");
    f.rdma(&n, "mlx5_0", &[RdmaPort::infiniband(1).down()]);
    let all_down = gdx_topo::from_root(dir.path()).unwrap();
    let e = choose_nics(&all_down, &MemPlace::Host { numa: None }).unwrap_err();
    assert!(matches!(e, NicError::NoActivePort { .. }), "{e:?}");
    assert!(e.to_string().contains("mlx5_0"), "{e}");
}

#[test]
fn a_large_transfer_splits_over_the_rails() {
    let (_d, t) = machine(false);
    let c = choose_nics(&t, &gpu("GPU0")).unwrap();
    let s = split_across_rails(1 << 30, c.rails.len(), 4096);
    assert_eq!(s.len(), 2);
    assert_eq!(
        (s[0].len, s[1].offset, s[1].len),
        (1 << 29, 1 << 29, 1 << 29)
    );
}
