//! The NIC ranking (`gdx_topo::nicmap`): on the real 8-GPU captures every GPU gets the NIC on
//! its own PCIe switch; on synthetic machines the order is class, then speed, then software
//! last; the settings name the chosen NICs in each library's format.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_topo::fixture::{PciNode, RdmaPort, SysfsFixture};
use gdx_topo::nicmap::{nic_map_view, render_nic_map_shell};
use gdx_topo::{from_nccl_xml, from_root, nic_map, rank_nics, Memory, PathClass, Topology};

fn load(name: &str) -> Topology {
    let path = gdx_topo::fixture::reference_topologies().join(name);
    from_nccl_xml(&path).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Labels of each GPU's preferred NICs, in GPU order.
fn preferred(t: &Topology) -> Vec<Vec<String>> {
    nic_map(t)
        .gpus
        .iter()
        .map(|g| g.preferred.iter().map(|r| r.nic.label.clone()).collect())
        .collect()
}

/// The 8-GPU captures that say which bus id is a GPU and which a NIC (p5's file lists bus ids
/// only: see `p5_names_no_device_so_nothing_is_mapped`).
const EIGHT_GPU_CAPTURES: [&str; 4] = [
    "nccl_topo_azure_ndv4-topo.xml",
    "nccl_topo_azure_ndv5-topo.xml",
    "nccl_topo_aws_p4d-24xl-topo.xml",
    "nccl_topo_aws_p4de-24xl-topo.xml",
];

#[test]
fn every_gpu_of_the_8_gpu_captures_gets_its_pix_or_pxb_nic() {
    for file in EIGHT_GPU_CAPTURES {
        let t = load(file);
        let map = nic_map(&t);
        assert_eq!(map.gpus.len(), 8, "{file}");
        for g in &map.gpus {
            assert!(!g.preferred.is_empty(), "{file} {}: no NIC", g.memory);
            for r in &g.preferred {
                assert!(
                    matches!(r.class, PathClass::Pix | PathClass::Pxb),
                    "{file} {}: {} is {}",
                    g.memory,
                    r.nic.label,
                    r.class
                );
            }
            // The ranking is sorted by class: nothing after the first is closer.
            let ranks: Vec<u8> = g.ranked.iter().map(|r| r.class.rank()).collect();
            assert!(ranks.windows(2).all(|w| w[0] <= w[1]), "{file}: {ranks:?}");
        }
    }
}

#[test]
fn every_reference_gpu_with_a_local_nic_ranks_it_first() {
    let dir = gdx_topo::fixture::reference_topologies();
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let Ok(t) = from_nccl_xml(&path) else {
            continue; // the graph file; xml_reference.rs checks it is refused for that reason
        };
        for gpu in t.gpus() {
            let ranked = rank_nics(&t, Memory::Gpu(gpu));
            let local = t.nics().any(|n| t.pcie_class(gpu, n).is_pcie_local());
            if local {
                assert!(
                    ranked[0].class.is_pcie_local(),
                    "{}: {} ranks {} ({}) first",
                    path.display(),
                    gpu.label,
                    ranked[0].nic.label,
                    ranked[0].class
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 32, "only {checked} GPUs had a local NIC");
}

#[test]
fn ndv5_gives_gpu_n_nic_n_alone() {
    let t = load("nccl_topo_azure_ndv5-topo.xml");
    let want: Vec<Vec<String>> = (0..8).map(|n| vec![format!("NIC{n}")]).collect();
    assert_eq!(preferred(&t), want);
    // Then the three other NICs of the NUMA node (PHB), then the other node's four (SYS).
    let gpu0 = t.device("GPU0").unwrap();
    let classes: Vec<String> = rank_nics(&t, Memory::Gpu(gpu0))
        .iter()
        .map(|r| r.class.to_string())
        .collect();
    assert_eq!(
        classes,
        ["PIX", "PHB", "PHB", "PHB", "SYS", "SYS", "SYS", "SYS"]
    );
}

#[test]
fn ndv4_two_gpus_below_one_switch_start_on_different_nics() {
    let t = load("nccl_topo_azure_ndv4-topo.xml");
    let p = preferred(&t);
    for pair in p.chunks(2) {
        assert_eq!(pair[0].len(), 2, "{p:?}");
        assert_eq!(pair[0][0], pair[1][1], "{p:?}");
        assert_eq!(pair[0][1], pair[1][0], "{p:?}");
    }
    let mut firsts: Vec<&String> = p.iter().map(|n| &n[0]).collect();
    firsts.sort();
    firsts.dedup();
    assert_eq!(firsts.len(), 8, "every NIC is some GPU's first: {p:?}");
}

#[test]
fn p4d_two_gpus_share_their_switch_nic() {
    let t = load("nccl_topo_aws_p4d-24xl-topo.xml");
    let want: Vec<Vec<String>> = (0..8).map(|g| vec![format!("NIC{}", g / 2)]).collect();
    assert_eq!(preferred(&t), want);
}

#[test]
fn p5_names_no_device_so_nothing_is_mapped() {
    // The file gives bus ids without class or <gpu>/<nic>: guessing which is a GPU would be
    // a guess, so the map is empty rather than wrong.
    let t = load("nccl_topo_aws_p5-48xl-topo.xml");
    let view = nic_map_view(&t);
    assert!(view.gpus.is_empty());
    assert!(view.mooncake_nic_priority_matrix.is_empty());
    assert!(view.notes.iter().any(|n| n.contains("no RDMA-capable NIC")));
}

#[test]
fn unnamed_nics_get_no_settings_and_say_why() {
    // The vendor files carry bus ids only: no RDMA device name to put in NCCL_IB_HCA.
    let t = load("nccl_topo_azure_ndv5-topo.xml");
    let view = nic_map_view(&t);
    let g0 = &view.gpus[0];
    assert_eq!(g0.use_nics.len(), 1);
    assert_eq!(g0.env, Default::default());
    assert!(
        g0.notes
            .iter()
            .any(|n| n.contains("NIC0 has no RDMA device name")),
        "{:?}",
        g0.notes
    );
    assert!(view.mooncake_nic_priority_matrix.is_empty());
    let text = render_nic_map_shell(&t, &view);
    assert!(text.contains("  0) ;; # GPU0: nothing to set"), "{text}");
}

/// GPU0 and mlx5_0 (200 Gb/s RoCE) below one switch, mlx5_1 (400 Gb/s IB) and mlx5_2 (200 Gb/s
/// RoCE) on other root ports of the same host bridge, a software rxe0, and a second GPU on
/// another NUMA node with nothing near it.
fn machine(dir: &std::path::Path) -> Topology {
    let mut f = SysfsFixture::new(dir);
    f.numa_node(0, "0-31").numa_node(1, "32-63");
    let rp = f.root_port("0000:00", "0000:00:01.0", Some(0));
    let sw = f.switch_below(&rp, "0000:01:00.0", &["0000:02:00.0", "0000:02:01.0"]);
    f.gpu(&sw.downstream[0], "0000:03:00.0");
    let roce = |f: &mut SysfsFixture, parent: &PciNode, bdf: &str, name: &str, dev: &str| {
        let nic = f.nic(parent, bdf);
        f.rdma(&nic, name, &[RdmaPort::roce(1, dev, [192, 0, 2, 1])]);
    };
    roce(&mut f, &sw.downstream[1], "0000:04:00.0", "mlx5_0", "eth0");
    let rp2 = f.root_port("0000:00", "0000:00:02.0", Some(0));
    let ib = f.nic(&rp2, "0000:05:00.0");
    f.rdma(&ib, "mlx5_1", &[RdmaPort::infiniband(1)]);
    let rp3 = f.root_port("0000:00", "0000:00:03.0", Some(0));
    roce(&mut f, &rp3, "0000:06:00.0", "mlx5_2", "eth2");
    let rp4 = f.root_port("0000:80", "0000:80:01.0", Some(1));
    f.gpu(&rp4, "0000:81:00.0");
    f.virtual_netdev("dummy0");
    f.software_rdma(
        "rxe0",
        "dummy0",
        &[RdmaPort::roce(1, "dummy0", [192, 0, 2, 9])],
    );
    from_root(dir).unwrap()
}

fn names(ranked: &[gdx_topo::RankedNic<'_>]) -> Vec<String> {
    ranked
        .iter()
        .map(|r| {
            let n = r.nic.nic.as_ref().unwrap().rdma_name.clone().unwrap();
            format!("{n} {}", r.class)
        })
        .collect()
}

#[test]
fn class_first_then_speed_then_software_last() {
    let dir = tempfile::tempdir().unwrap();
    let t = machine(dir.path());
    let gpu0 = t.device("GPU0").unwrap();
    // mlx5_0 is slower than mlx5_1 but closer; among the PHB pair the 400G one leads.
    assert_eq!(
        names(&rank_nics(&t, Memory::Gpu(gpu0))),
        ["mlx5_0 PIX", "mlx5_1 PHB", "mlx5_2 PHB", "rxe0 SYS"]
    );
    // From GPU1 (NUMA 1) every hardware NIC is SYS like rxe0, which still comes last.
    let gpu1 = t.device("GPU1").unwrap();
    assert_eq!(
        names(&rank_nics(&t, Memory::Gpu(gpu1))),
        ["mlx5_1 SYS", "mlx5_0 SYS", "mlx5_2 SYS", "rxe0 SYS"]
    );
}

#[test]
fn host_memory_prefers_the_nics_of_its_numa_node() {
    let dir = tempfile::tempdir().unwrap();
    let t = machine(dir.path());
    assert_eq!(
        names(&rank_nics(&t, Memory::Numa(0))),
        ["mlx5_1 PHB", "mlx5_0 PHB", "mlx5_2 PHB", "rxe0 SYS"]
    );
    let map = nic_map(&t);
    assert_eq!(map.numa.len(), 2);
    assert_eq!(names(&map.numa[0].preferred), ["mlx5_1 PHB"]);
    // Nothing is on node 1: the fastest hardware NIC, across the SMP link.
    assert_eq!(names(&map.numa[1].preferred), ["mlx5_1 SYS"]);
}

#[test]
fn settings_name_the_preferred_nics_in_each_library_format() {
    let dir = tempfile::tempdir().unwrap();
    let t = machine(dir.path());
    let view = nic_map_view(&t);
    let g0 = &view.gpus[0].env;
    assert_eq!(g0.nccl_ib_hca.as_deref(), Some("=mlx5_0:1"));
    assert_eq!(g0.ucx_net_devices.as_deref(), Some("mlx5_0:1"));
    assert_eq!(g0.mc_ms_filters.as_deref(), Some("mlx5_0"));
    let m = &view.mooncake_nic_priority_matrix;
    assert_eq!(m["cuda:0"][0], ["mlx5_0"]);
    assert_eq!(m["cuda:0"][1], ["mlx5_1", "mlx5_2", "rxe0"]);
    assert_eq!(m["cpu:0"][0], ["mlx5_1"]);
    let text = render_nic_map_shell(&t, &view);
    assert!(
        text.contains(
            "  0) export NCCL_IB_HCA='=mlx5_0:1' UCX_NET_DEVICES='mlx5_0:1' \
             MC_MS_AUTO_DISC=1 MC_MS_FILTERS='mlx5_0' ;;"
        ),
        "{text}"
    );
    assert!(
        text.contains("# GPU0 0000:03:00.0: use NIC0 mlx5_0 (PIX, 200 Gb/s)"),
        "{text}"
    );
}

#[test]
fn a_nic_with_every_port_down_is_ranked_last_and_never_used() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = SysfsFixture::new(dir.path());
    f.numa_node(0, "0-31");
    let rp = f.root_port("0000:00", "0000:00:01.0", Some(0));
    let sw = f.switch_below(&rp, "0000:01:00.0", &["0000:02:00.0", "0000:02:01.0"]);
    f.gpu(&sw.downstream[0], "0000:03:00.0");
    let near = f.nic(&sw.downstream[1], "0000:04:00.0");
    f.rdma(&near, "mlx5_0", &[RdmaPort::infiniband(1).down()]);
    let rp2 = f.root_port("0000:00", "0000:00:02.0", Some(0));
    let far = f.nic(&rp2, "0000:05:00.0");
    f.rdma(&far, "mlx5_1", &[RdmaPort::infiniband(1)]);
    let t = from_root(dir.path()).unwrap();
    let gpu = t.device("GPU0").unwrap();
    let ranked = rank_nics(&t, Memory::Gpu(gpu));
    assert_eq!(names(&ranked), ["mlx5_1 PHB", "mlx5_0 PIX"]);
    assert!(ranked[0].up && !ranked[1].up);
    assert_eq!(names(&nic_map(&t).gpus[0].preferred), ["mlx5_1 PHB"]);
    let text = render_nic_map_shell(&t, &nic_map_view(&t));
    assert!(
        text.contains("then NIC0 mlx5_0 (PIX, 400 Gb/s, ports down)"),
        "{text}"
    );
}

#[test]
fn a_machine_without_rdma_nics_maps_nothing_and_says_so() {
    let t = from_root(&gdx_topo::fixture::h200x2_capture()).unwrap();
    let view = nic_map_view(&t);
    assert_eq!(view.gpus.len(), 2);
    assert!(view.gpus.iter().all(|g| g.use_nics.is_empty()));
    assert!(
        view.notes.iter().any(|n| n.contains("no RDMA-capable NIC")),
        "{:?}",
        view.notes
    );
}
