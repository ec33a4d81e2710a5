//! `gdx nccl env` against the real NCCL topology files in crates/topo/tests/data/topologies and the
//! synthetic machines of tests/common.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use gdx_nccl::env::{recommend, EnvAdvice, EnvInput};
use gdx_rdma::gid::SysfsNetdevs;
use gdx_topo::PathClass;

fn advise(topo: &gdx_topo::Topology, root: Option<&std::path::Path>) -> EnvAdvice {
    let netdevs = SysfsNetdevs::at_root(root.unwrap_or(std::path::Path::new("/nonexistent")));
    recommend(&EnvInput {
        topology: topo,
        netdevs: &netdevs,
        findings: &[],
    })
}

/// The advice for a synthetic machine of tests/common, built in a fresh directory whose
/// sysfs the advice also reads the netdevs from.
fn advise_on(machine: fn(&std::path::Path) -> gdx_topo::Topology) -> EnvAdvice {
    let dir = tempfile::tempdir().unwrap();
    let topo = machine(dir.path());
    advise(&topo, Some(dir.path()))
}

fn value<'a>(a: &'a EnvAdvice, name: &str) -> (Option<&'a str>, &'a str) {
    let v = a.vars.iter().find(|v| v.name == name).unwrap();
    (v.value.as_deref(), v.reason.as_str())
}

#[test]
fn nd_h100_v5_every_gpu_has_its_nic_at_pix() {
    let dir = gdx_topo::fixture::reference_topologies();
    let xml = dir.join("nccl_topo_azure_ndv5-topo.xml");
    let topo = gdx_topo::from_nccl_xml(&xml).unwrap();
    let a = advise(&topo, None);
    assert_eq!(a.gpus.len(), 8);
    for g in &a.gpus {
        assert_eq!(g.nearest.len(), 1, "{g:?}");
        assert_eq!(g.nearest[0].class, PathClass::Pix, "{g:?}");
    }
    // GPU0 (0001:00:00.0) shares its switch with the NIC at 0101:00:00.0.
    assert_eq!(a.gpus[0].nearest[0].bdf.as_deref(), Some("0101:00:00.0"));
    let (v, why) = value(&a, "NCCL_NET_GDR_LEVEL");
    assert_eq!(v, None);
    assert!(
        why.contains("worst: GPU0 at PIX") || why.contains("at PIX"),
        "{why}"
    );
    let (v, why) = value(&a, "NCCL_IB_HCA");
    assert_eq!(v, None, "the XML does not name HCAs");
    assert!(why.contains("GPU0 → NIC"), "{why}");
    let (v, _) = value(&a, "NCCL_TOPO_FILE");
    assert_eq!(v, Some(xml.display().to_string().as_str()));
}

#[test]
fn every_reference_topology_gets_advice_without_panicking() {
    let dir = gdx_topo::fixture::reference_topologies();
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "xml") || p.to_string_lossy().contains("graph") {
            continue;
        }
        let topo = gdx_topo::from_nccl_xml(&p).unwrap();
        let a = advise(&topo, None);
        assert_eq!(a.vars.len(), 5, "{}", p.display());
        assert!(a.vars.iter().all(|v| !v.reason.is_empty()));
        n += 1;
    }
    assert!(n >= 8);
}

#[test]
fn nd_v2_nic_on_one_socket_is_not_pix_for_every_gpu() {
    let dir = gdx_topo::fixture::reference_topologies();
    let topo = gdx_topo::from_nccl_xml(&dir.join("nccl_topo_azure_ndv2-topo.xml")).unwrap();
    let a = advise(&topo, None);
    let worst = a
        .gpus
        .iter()
        .map(|g| g.nearest[0].class.rank())
        .max()
        .unwrap();
    assert!(worst >= PathClass::Phb.rank(), "{:#?}", a.gpus);
    let (v, why) = value(&a, "NCCL_NET_GDR_LEVEL");
    assert!(v.is_none() || v == Some("PHB"), "{v:?}: {why}");
}

#[test]
fn rail_machine_pins_the_pix_hca_and_the_roce_v2_gid() {
    let a = advise_on(common::rail_machine);
    let (v, why) = value(&a, "NCCL_IB_HCA");
    assert_eq!(v, Some("=mlx5_0:1"));
    assert!(why.contains("leaves out mlx5_1"), "{why}");
    let (v, why) = value(&a, "NCCL_IB_GID_INDEX");
    assert_eq!(v, Some("3"), "{why}");
    assert!(why.contains("RoCE v2"), "{why}");
    assert_eq!(value(&a, "NCCL_SOCKET_IFNAME").0, Some("=eth2,eth3"));
    assert_eq!(value(&a, "NCCL_NET_GDR_LEVEL").0, None);
    assert_eq!(value(&a, "NCCL_TOPO_FILE").0, None);
}

#[test]
fn flat_vm_gets_a_topology_file_not_a_forced_gdr_level() {
    let a = advise_on(common::flat_vm);
    let (v, why) = value(&a, "NCCL_TOPO_FILE");
    assert_eq!(v, Some("gdx-nccl-topo.xml"));
    assert!(why.contains("gdx topo --export-xml"), "{why}");
    let (v, why) = value(&a, "NCCL_NET_GDR_LEVEL");
    assert_eq!(v, None, "{why}");
    assert!(why.contains("flat PCI bus"), "{why}");
    let (v, why) = value(&a, "NCCL_IB_GID_INDEX");
    assert_eq!(v, None);
    assert!(why.contains("InfiniBand"), "{why}");
}

#[test]
fn machine_without_rdma_has_no_hca_to_name() {
    let a = advise_on(common::two_gpu_switch_machine);
    assert_eq!(value(&a, "NCCL_SOCKET_IFNAME").0, Some("=ens1"));
    let (v, _) = value(&a, "NCCL_IB_GID_INDEX");
    assert_eq!(v, None);
    let (v, why) = value(&a, "NCCL_NET_GDR_LEVEL");
    assert_eq!(v, None);
    assert!(why.contains("no GPU with an RDMA NIC"), "{why}");
    assert_eq!(value(&a, "NCCL_IB_HCA").1, "no RDMA NIC in the topology");
    let shell = gdx_nccl::env::render_shell(&a);
    assert!(
        shell.contains("export NCCL_SOCKET_IFNAME='=ens1'"),
        "{shell}"
    );
    assert!(shell.contains("# NCCL_TOPO_FILE: leave unset"), "{shell}");
}
