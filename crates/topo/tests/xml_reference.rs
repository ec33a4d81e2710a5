//! The real NCCL topology files under `crates/topo/tests/data/topologies`: every one loads (or is
//! refused for the right reason), path classes match what the hardware is known to be, and
//! parse → export → parse keeps the matrix and the devices.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_topo::xml::to_nccl_xml_with;
use gdx_topo::{
    from_nccl_xml, parse_nccl_xml, to_nccl_xml, DeviceKind, NvLinkTarget, PathClass, TopoError,
    Topology,
};
use std::path::{Path, PathBuf};

fn reference_dir() -> PathBuf {
    gdx_topo::fixture::reference_topologies()
}

fn load(name: &str) -> Topology {
    from_nccl_xml(&reference_dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn class(t: &Topology, a: &str, b: &str) -> PathClass {
    t.class_between(a, b)
        .unwrap_or_else(|| panic!("no {a} or {b} in {:?}", t.source))
}

fn count(t: &Topology, kind: DeviceKind) -> usize {
    t.of_kind(kind).count()
}

#[test]
fn every_reference_file_loads() {
    let dir = reference_dir();
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "xml"))
        .collect();
    names.sort();
    assert!(
        names.len() >= 10,
        "expected the 10 reference files, got {names:?}"
    );
    for path in names {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        match from_nccl_xml(&path) {
            Ok(t) => {
                assert_eq!(
                    t.source,
                    gdx_topo::Source::NcclXml(path.display().to_string())
                );
                assert!(!t.numa_nodes.is_empty(), "{name}: no NUMA nodes");
            }
            Err(TopoError::NotATopology { why, .. }) => {
                assert!(name.contains("graph"), "{name} refused: {why}");
                assert!(why.contains("NCCL_GRAPH_FILE"), "{why}");
                assert!(why.contains("NCCL_TOPO_FILE"), "{why}");
            }
            Err(e) => panic!("{name}: {e}"),
        }
    }
}

#[test]
fn graph_file_is_not_a_topology() {
    let dir = reference_dir();
    let err = from_nccl_xml(&dir.join("nccl_topo_azure_ncv4-graph.xml")).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, TopoError::NotATopology { .. }), "{msg}");
    assert!(
        msg.contains(
            "an NCCL graph file (NCCL_GRAPH_FILE: rings/trees), not a topology (NCCL_TOPO_FILE)"
        ),
        "{msg}"
    );
}

#[test]
fn azure_ndv5_one_nic_per_gpu_switch() {
    let t = load("nccl_topo_azure_ndv5-topo.xml");
    assert_eq!(count(&t, DeviceKind::Gpu), 8);
    assert_eq!(count(&t, DeviceKind::Nic), 8);
    assert_eq!(t.switches.len(), 8);
    assert!(t.switches.iter().all(|s| s.is_virtual));
    assert_eq!(t.numa_nodes.len(), 2);
    assert_eq!(t.numa_nodes[0].cpus, "0-47");
    assert_eq!(t.numa_nodes[1].cpus, "48-95");
    let gpu0 = t.device("GPU0").unwrap();
    assert_eq!(gpu0.bdf.unwrap().to_string(), "0001:00:00.0");
    assert_eq!(gpu0.link.current.speed_gts, Some(32.0));
    assert_eq!(gpu0.link.current.width, Some(16));
    assert_eq!(gpu0.cpu_affinity.as_deref(), Some("0-47"));
    assert_eq!(
        t.device("GPU3").unwrap().bdf.unwrap().to_string(),
        "0008:00:00.0"
    );
    for g in 0..8 {
        let gpu = format!("GPU{g}");
        for n in 0..8 {
            let nic = format!("NIC{n}");
            let want = if g == n {
                PathClass::Pix
            } else if g / 4 == n / 4 {
                PathClass::Phb
            } else {
                PathClass::Sys
            };
            assert_eq!(class(&t, &gpu, &nic), want, "{gpu}-{nic}");
        }
        let nearest = t.nearest_nics(t.device(&gpu).unwrap());
        assert_eq!(nearest.len(), 1);
        assert_eq!(nearest[0].0.label, format!("NIC{g}"));
    }
    assert_eq!(class(&t, "GPU0", "GPU1"), PathClass::Phb);
    assert_eq!(class(&t, "GPU0", "GPU4"), PathClass::Sys);
    assert_eq!(class(&t, "GPU0", "GPU0"), PathClass::X);
}

#[test]
fn aws_p4d_two_gpus_and_a_nic_per_switch() {
    for file in [
        "nccl_topo_aws_p4d-24xl-topo.xml",
        "nccl_topo_aws_p4de-24xl-topo.xml",
    ] {
        let t = load(file);
        assert_eq!(count(&t, DeviceKind::Gpu), 8, "{file}");
        assert_eq!(count(&t, DeviceKind::Nic), 4, "{file}");
        assert_eq!(t.switches.len(), 4);
        assert!(t.switches.iter().all(|s| s.is_virtual));
        assert_eq!(t.switches[0].link.current.speed_gts, Some(8.0));
        assert_eq!(t.numa_nodes[0].cpus, "0-23,48-71");
        let gpu0 = t.device("GPU0").unwrap();
        assert_eq!(gpu0.vendor, Some(0x10de));
        assert_eq!(gpu0.class, Some(0x030200));
        let nic0 = t.device("NIC0").unwrap();
        assert_eq!(nic0.bdf.unwrap().to_string(), "0000:10:1b.0");
        assert_eq!(nic0.device_id, Some(0xefa0));
        assert_eq!(class(&t, "GPU0", "GPU1"), PathClass::Pix);
        assert_eq!(class(&t, "GPU0", "NIC0"), PathClass::Pix);
        assert_eq!(class(&t, "GPU1", "NIC0"), PathClass::Pix);
        assert_eq!(class(&t, "GPU0", "GPU2"), PathClass::Phb);
        assert_eq!(class(&t, "GPU0", "NIC1"), PathClass::Phb);
        assert_eq!(class(&t, "GPU0", "GPU4"), PathClass::Sys);
        assert_eq!(class(&t, "GPU0", "NIC2"), PathClass::Sys);
        assert_eq!(class(&t, "GPU7", "NIC3"), PathClass::Pix);
        assert_eq!(class(&t, "NIC0", "NIC3"), PathClass::Sys);
    }
}

#[test]
fn azure_ndv4_two_gpus_two_nics_per_numa_node() {
    let t = load("nccl_topo_azure_ndv4-topo.xml");
    assert_eq!(count(&t, DeviceKind::Gpu), 8);
    assert_eq!(count(&t, DeviceKind::Nic), 8);
    assert_eq!(t.numa_nodes.len(), 4);
    // Labels follow bus ids: GPU0/1 = 0001/0002 with NIC0/1 = 0101/0102 on NUMA node 1.
    assert_eq!(t.device("GPU0").unwrap().numa, Some(1));
    assert_eq!(
        t.device("NIC0").unwrap().bdf.unwrap().to_string(),
        "0101:00:00.0"
    );
    assert_eq!(class(&t, "GPU0", "GPU1"), PathClass::Pix);
    assert_eq!(class(&t, "GPU0", "NIC0"), PathClass::Pix);
    assert_eq!(class(&t, "GPU0", "NIC1"), PathClass::Pix);
    assert_eq!(class(&t, "GPU0", "GPU2"), PathClass::Sys);
    assert_eq!(class(&t, "GPU0", "NIC2"), PathClass::Sys);
    assert_eq!(class(&t, "GPU2", "NIC2"), PathClass::Pix);
    for g in t.gpus() {
        assert_eq!(t.nearest_nics(g).len(), 2, "{}", g.label);
    }
}

#[test]
fn azure_ndv2_gpus_directly_under_the_cpus() {
    let t = load("nccl_topo_azure_ndv2-topo.xml");
    assert_eq!(count(&t, DeviceKind::Gpu), 8);
    assert_eq!(count(&t, DeviceKind::Nic), 1);
    assert!(t.switches.is_empty());
    assert_eq!(t.numa_nodes[0].cpus, "0-19");
    assert_eq!(t.numa_nodes[1].cpus, "20-39");
    let nic = t.device("NIC0").unwrap();
    assert_eq!(nic.class, Some(0x020700));
    assert_eq!(nic.nic.as_ref().unwrap().rdma_name, None);
    assert_eq!(class(&t, "GPU0", "GPU1"), PathClass::Phb);
    assert_eq!(class(&t, "GPU0", "NIC0"), PathClass::Phb);
    assert_eq!(class(&t, "GPU3", "NIC0"), PathClass::Phb);
    assert_eq!(class(&t, "GPU4", "NIC0"), PathClass::Sys);
    assert_eq!(class(&t, "GPU0", "GPU4"), PathClass::Sys);
}

#[test]
fn azure_ncv4_self_target_quirk_gives_no_nvlink() {
    let t = load("nccl_topo_azure_ncv4-topo.xml");
    assert_eq!(count(&t, DeviceKind::Gpu), 4);
    for g in t.gpus() {
        let info = g.gpu.as_ref().unwrap();
        assert!(info.nvlinks.is_empty(), "{}: {:?}", g.label, info.nvlinks);
        assert_eq!(info.compute_capability.as_deref(), Some("8.0"));
    }
    let quirks: Vec<&String> = t
        .notes
        .iter()
        .filter(|n| n.contains("is its own bus id"))
        .collect();
    assert_eq!(quirks.len(), 4, "{:?}", t.notes);
    assert!(quirks[0].starts_with("GPU0 (0001:00:00.0): <nvlink target> is its own bus id"));
    assert!(quirks[0].contains("Azure NC A100 v4"));
    assert!(quirks[0].contains("NVLink peer unknown"));
    assert_eq!(class(&t, "GPU0", "GPU1"), PathClass::Sys);
    assert_eq!(class(&t, "GPU2", "GPU3"), PathClass::Sys);
    ncv4_common(&t);
}

#[test]
fn azure_ncv4_peer_targets_give_nv12_pairs() {
    let t = load("nccl_topo_azure_ncv4-topo_v2023-06_peer-targets.xml");
    assert!(
        !t.notes.iter().any(|n| n.contains("own bus id")),
        "{:?}",
        t.notes
    );
    let gpu0 = t.device("GPU0").unwrap().gpu.as_ref().unwrap();
    assert_eq!(gpu0.nvlinks.len(), 1);
    assert_eq!(
        gpu0.nvlinks[0].target,
        NvLinkTarget::Gpu("0002:00:00.0".parse().unwrap())
    );
    assert_eq!(class(&t, "GPU0", "GPU1"), PathClass::Nv(12));
    assert_eq!(class(&t, "GPU1", "GPU0"), PathClass::Nv(12));
    assert_eq!(class(&t, "GPU2", "GPU3"), PathClass::Nv(12));
    assert_eq!(class(&t, "GPU0", "GPU2"), PathClass::Sys);
    assert_eq!(class(&t, "GPU1", "GPU3"), PathClass::Sys);
    ncv4_common(&t);
}

/// What both NC A100 v4 files say alike: dev indices, one Ethernet net on CPU 0.
fn ncv4_common(t: &Topology) {
    for (i, g) in t.gpus().enumerate() {
        assert_eq!(g.gpu.as_ref().unwrap().index, Some(i as u32));
        assert_eq!(g.numa, Some(i as u32));
        // link_speed="" link_width="0" is NCCL's "unknown".
        assert_eq!(g.link.current.speed_gts, None);
        assert_eq!(g.link.current.width, None);
    }
    assert_eq!(count(t, DeviceKind::Nic), 1);
    let nic = t.device("NIC0").unwrap();
    assert_eq!(nic.bdf, None);
    assert_eq!(nic.attach.host_bridge.as_deref(), Some("cpu0"));
    let info = nic.nic.as_ref().unwrap();
    assert_eq!(info.rdma_name.as_deref(), Some("eth0"));
    assert_eq!(info.netdevs, ["eth0"]);
    assert_eq!(info.speed_mbps, Some(100_000));
    assert_eq!(info.ports.len(), 1);
    assert_eq!(info.ports[0].rate_gbps, Some(100.0));
    assert_eq!(t.numa_nodes[3].cpus, "72-95");
    assert_eq!(class(t, "GPU0", "NIC0"), PathClass::Phb);
    assert_eq!(class(t, "GPU1", "NIC0"), PathClass::Sys);
}

#[test]
fn aws_p5_lists_bus_ids_only() {
    let t = load("nccl_topo_aws_p5-48xl-topo.xml");
    // Eight real switches (4 per socket), each with four leaves of unknown kind: the file
    // names neither class nor <gpu>/<nic>, so nothing is guessed.
    assert!(t.devices.is_empty(), "{:?}", t.devices);
    assert_eq!(t.switches.len(), 8);
    assert!(t
        .switches
        .iter()
        .all(|s| !s.is_virtual && s.parent.is_none()));
    assert_eq!(t.switches[0].upstream.to_string(), "0000:45:00.0");
    assert_eq!(t.numa_nodes.len(), 2);
    assert!(t.numa_nodes.iter().all(|n| n.cpus.is_empty()));
    let note = t
        .notes
        .iter()
        .find(|n| n.starts_with("32 PCI devices without class or <gpu>/<nic> child: kind unknown"))
        .unwrap_or_else(|| panic!("{:?}", t.notes));
    assert!(note.contains("0000:4f:00.0"), "{note}");
    assert!(note.contains("0000:c9:00.0"), "{note}");
    assert!(t.matrix().is_empty());
}

#[test]
fn aws_g5_lists_bus_ids_only() {
    let t = load("nccl_topo_aws_g5.48xl-topo.xml");
    assert!(t.devices.is_empty());
    assert!(t.switches.is_empty());
    assert_eq!(t.host_bridges.len(), 2);
    assert_eq!(t.host_bridges[1].id, "cpu1");
    assert_eq!(t.host_bridges[1].numa, Some(1));
    let note = t
        .notes
        .iter()
        .find(|n| n.starts_with("9 PCI devices without class"))
        .unwrap_or_else(|| panic!("{:?}", t.notes));
    assert!(
        note.contains("0000:00:16.0") && note.contains("0000:00:15.0"),
        "{note}"
    );
}

#[test]
fn every_reference_file_round_trips() {
    let dir = reference_dir();
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "xml") {
            continue;
        }
        let Ok(first) = from_nccl_xml(&path) else {
            continue;
        };
        let xml = to_nccl_xml(&first);
        let second = parse_nccl_xml(&xml, Path::new("exported.xml"))
            .unwrap_or_else(|e| panic!("{}: re-reading the export: {e}\n{xml}", path.display()));
        let name = path.display();
        assert_eq!(first.matrix(), second.matrix(), "{name}\n{xml}");
        let ids = |t: &Topology| -> Vec<_> {
            t.devices
                .iter()
                .map(|d| (d.label.clone(), d.bdf, d.kind, d.numa))
                .collect()
        };
        assert_eq!(ids(&first), ids(&second), "{name}\n{xml}");
        assert_eq!(first.numa_nodes, second.numa_nodes, "{name}");
        for (a, b) in first.devices.iter().zip(&second.devices) {
            assert_eq!(a.gpu, b.gpu, "{name} {}", a.label);
            assert_eq!(a.link, b.link, "{name} {}", a.label);
            assert_eq!(a.attach.host_bridge, b.attach.host_bridge, "{name}");
            let nic = |d: &gdx_topo::Device| {
                d.nic
                    .as_ref()
                    .map(|n| (n.rdma_name.clone(), n.speed_mbps, n.ports.len()))
            };
            assert_eq!(nic(a), nic(b), "{name} {}", a.label);
        }
        // The export is stable: writing the re-read model gives the same text.
        assert_eq!(xml, to_nccl_xml(&second), "{name}");
        checked += 1;
    }
    assert!(checked >= 9, "only {checked} files round-tripped");
}

#[test]
fn export_of_ndv5_is_what_nccl_reads() {
    let t = load("nccl_topo_azure_ndv5-topo.xml");
    let xml = to_nccl_xml_with(&t, None);
    // NCCL's parser takes no XML declaration and no tabs.
    assert!(!xml.contains("<?xml"));
    assert!(!xml.contains('\t'));
    assert!(xml.contains("<system version=\"1\">"));
    // Every affinity attribute comes back exactly as the file had it.
    let original =
        std::fs::read_to_string(reference_dir().join("nccl_topo_azure_ndv5-topo.xml")).unwrap();
    for line in xml.lines().filter(|l| l.contains("affinity=")) {
        let attr = line
            .split_whitespace()
            .nth(2)
            .unwrap()
            .trim_end_matches('>');
        assert!(original.contains(attr), "{attr}");
    }
    assert!(xml.contains("<cpu numaid=\"0\" affinity=\"00000000,0000ffff,ffffffff\">"));
    assert!(xml.contains(
        "<pci busid=\"ffff:ff:01.0\" class=\"0x060400\" vendor=\"0x0000\" device=\"0x0000\" link_speed=\"32.0 GT/s PCIe\" link_width=\"16\">"
    ));
    assert!(xml.contains(
        "<pci busid=\"0001:00:00.0\" class=\"0x030200\" link_speed=\"32.0 GT/s PCIe\" link_width=\"16\"/>"
    ));
}

#[test]
fn export_of_ncv4_keeps_nvlinks_and_nets() {
    let t = load("nccl_topo_azure_ncv4-topo_v2023-06_peer-targets.xml");
    let xml = to_nccl_xml_with(&t, None);
    assert!(xml.contains("<gpu dev=\"0\" sm=\"80\">"), "{xml}");
    assert!(
        xml.contains("<nvlink target=\"0002:00:00.0\" count=\"12\" tclass=\"0x030200\"/>"),
        "{xml}"
    );
    assert!(
        xml.contains("<net name=\"eth0\" dev=\"0\" speed=\"100000\" port=\"0\"/>"),
        "{xml}"
    );
    // Unknown PCI link figures are left for NCCL to read from sysfs.
    assert!(!xml.contains("link_width=\"0\""), "{xml}");
}
