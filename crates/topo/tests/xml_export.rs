//! Writing a model that did not come from NCCL XML (a sysfs-like machine: several root
//! complexes per NUMA node, nested switches, a device of unknown NUMA node, NVMe) and
//! reading it back.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_topo::xml::{to_nccl_xml_with, CpuIdentity};
use gdx_topo::{
    parse_nccl_xml, to_nccl_xml, Attachment, Device, DeviceKind, GpuInfo, HostBridge, Link,
    LinkStatus, NicInfo, NicPort, NumaNode, NvLink, NvLinkTarget, PathClass, PciAddr, Source,
    Switch, SwitchId, Topology,
};
use std::path::Path;

fn addr(s: &str) -> PciAddr {
    s.parse().unwrap()
}

fn switch(up: &str, parent: Option<usize>, is_virtual: bool) -> Switch {
    Switch {
        upstream: addr(up),
        downstream: Vec::new(),
        vendor: Some(0x1000),
        device_id: Some(0xc030),
        link: LinkStatus::default(),
        parent: parent.map(SwitchId),
        is_virtual,
    }
}

fn device(kind: DeviceKind, bdf: &str, hb: &str, numa: Option<u32>, sw: &[usize]) -> Device {
    let mut d = Device::new(kind, Some(addr(bdf)));
    d.numa = numa;
    d.attach = Attachment {
        host_bridge: Some(hb.to_string()),
        switches: sw.iter().map(|&s| SwitchId(s)).collect(),
    };
    d
}

fn gpu(bdf: &str, index: u32, hb: &str, numa: Option<u32>, sw: &[usize]) -> Device {
    let mut d = device(DeviceKind::Gpu, bdf, hb, numa, sw);
    d.class = Some(0x030200);
    d.vendor = Some(0x10de);
    d.gpu = Some(GpuInfo {
        index: Some(index),
        compute_capability: Some("9.0".into()),
        nvlinks: vec![NvLink {
            target: NvLinkTarget::NvSwitch,
            count: 18,
        }],
        ..GpuInfo::default()
    });
    d
}

fn machine() -> Topology {
    let mut a = gpu("0000:05:00.0", 1, "pci0000:00", Some(0), &[0, 1]);
    a.link = LinkStatus {
        current: Link {
            speed_gts: Some(2.5),
            width: Some(16),
        },
        max: Link {
            speed_gts: Some(32.0),
            width: Some(16),
        },
    };
    let b = gpu("0000:06:00.0", 0, "pci0000:00", Some(0), &[0, 2]);
    let mut c = gpu("0000:c1:00.0", 2, "pci0000:c0", None, &[]);
    c.cpu_affinity = Some("0-31".into());
    c.gpu.as_mut().unwrap().nvlinks.clear();
    let mut ib = device(
        DeviceKind::Nic,
        "0000:07:00.0",
        "pci0000:00",
        Some(0),
        &[0, 1],
    );
    ib.class = Some(0x020700);
    ib.nic = Some(NicInfo {
        rdma_name: Some("mlx5_0".into()),
        netdevs: vec!["ibp7s0".into()],
        ports: vec![NicPort {
            port: 1,
            rate_gbps: Some(400.0),
            ..NicPort::default()
        }],
        speed_mbps: None,
        efa: false,
        software: false,
    });
    let mut eth = device(DeviceKind::Nic, "0000:41:00.0", "pci0000:40", Some(0), &[]);
    eth.class = Some(0x020000);
    eth.nic.as_mut().unwrap().netdevs = vec!["eth0".into()];
    let mut odd = device(DeviceKind::Nic, "0000:42:00.0", "pci0000:40", Some(0), &[3]);
    odd.nic.as_mut().unwrap().rdma_name = Some("z\"b<c&d'".into());
    let mut nvme = device(DeviceKind::Nvme, "0000:81:00.0", "pci0000:80", Some(1), &[]);
    nvme.class = Some(0x010802);
    let mut topo = Topology {
        source: Source::Sysfs("/".into()),
        devices: vec![a, b, c, ib, eth, odd, nvme],
        switches: vec![
            switch("0000:01:00.0", None, false),
            switch("0000:03:00.0", Some(0), false),
            switch("0000:04:00.0", Some(0), false),
            switch("ffff:ff:01.0", None, true),
        ],
        host_bridges: ["pci0000:00", "pci0000:40", "pci0000:80", "pci0000:c0"]
            .iter()
            .zip([Some(0), Some(0), Some(1), None])
            .map(|(id, numa)| HostBridge {
                id: id.to_string(),
                numa,
            })
            .collect(),
        numa_nodes: vec![
            NumaNode {
                id: 0,
                cpus: "0-15".into(),
            },
            NumaNode {
                id: 1,
                cpus: "16-31".into(),
            },
        ],
        nvml_enriched: true,
        notes: Vec::new(),
    };
    topo.assign_labels();
    topo
}

#[test]
fn sysfs_like_machine_exports_and_reads_back() {
    let t = machine();
    let sapphire_rapids = CpuIdentity {
        arch: "x86_64".into(),
        vendor: Some("GenuineIntel".into()),
        family: Some(6),
        model: Some(143),
    };
    let xml = to_nccl_xml_with(&t, Some(&sapphire_rapids));
    let back =
        parse_nccl_xml(&xml, Path::new("exported.xml")).unwrap_or_else(|e| panic!("{e}\n{xml}"));

    let ids = |t: &Topology| -> Vec<_> {
        t.devices
            .iter()
            .map(|d| (d.label.clone(), d.bdf, d.kind, d.numa))
            .collect()
    };
    assert_eq!(ids(&t), ids(&back), "{xml}");

    // GPU0 is index 0 (0000:06:00.0), GPU1 index 1 (0000:05:00.0).
    for (x, y, before, after) in [
        ("GPU0", "GPU1", PathClass::Nv(18), PathClass::Nv(18)),
        ("GPU1", "NIC0", PathClass::Pix, PathClass::Pix),
        ("GPU0", "NIC0", PathClass::Pxb, PathClass::Pxb),
        ("GPU2", "GPU0", PathClass::Node, PathClass::Node),
        ("NIC1", "NIC2", PathClass::Phb, PathClass::Phb),
        // Two root complexes of one NUMA node: NCCL XML knows one CPU per node.
        ("GPU1", "NIC1", PathClass::Node, PathClass::Phb),
    ] {
        assert_eq!(t.class_between(x, y), Some(before), "{x}-{y} before");
        assert_eq!(
            back.class_between(x, y),
            Some(after),
            "{x}-{y} after\n{xml}"
        );
    }

    let gpu1 = back.device("GPU1").unwrap();
    // NCCL's link_speed is the maximum, not what an idle GPU runs at.
    assert_eq!(gpu1.link.current.speed_gts, Some(32.0));
    assert_eq!(gpu1.gpu, t.device("GPU1").unwrap().gpu);
    assert_eq!(
        back.device("GPU2").unwrap().attach.host_bridge.as_deref(),
        Some("cpu-1")
    );
    assert_eq!(back.device("NVME0").unwrap().numa, Some(1));
    assert_eq!(back.numa_nodes, t.numa_nodes);
    let nic0 = back.device("NIC0").unwrap().nic.as_ref().unwrap();
    assert_eq!(nic0.rdma_name.as_deref(), Some("mlx5_0"));
    assert_eq!(nic0.ports[0].port, 1);
    assert_eq!(nic0.ports[0].rate_gbps, Some(400.0));
    // Escaped on the way out, intact on the way back.
    assert!(xml.contains("name=\"z&quot;b&lt;c&amp;d&apos;\""), "{xml}");
    assert_eq!(
        back.device("NIC1")
            .unwrap()
            .nic
            .as_ref()
            .unwrap()
            .rdma_name
            .as_deref(),
        Some("z\"b<c&d'")
    );

    for want in [
        "<cpu numaid=\"0\" affinity=\"0000ffff\" arch=\"x86_64\" vendor=\"GenuineIntel\" familyid=\"6\" modelid=\"143\">",
        "<cpu numaid=\"1\" affinity=\"ffff0000\" arch=\"x86_64\"",
        // GPU2's own CPU list stands in for the unknown node's.
        "<cpu numaid=\"-1\" affinity=\"ffffffff\" arch=\"x86_64\"",
        // A real switch of unknown link: NCCL reads the link from sysfs.
        "<pci busid=\"0000:01:00.0\" class=\"0x060400\" vendor=\"0x1000\" device=\"0xc030\">",
        // A virtual one has no sysfs entry: NCCL's own "unknown" values.
        "<pci busid=\"ffff:ff:01.0\" class=\"0x060400\" vendor=\"0x1000\" device=\"0xc030\" link_speed=\"\" link_width=\"0\">",
        "<pci busid=\"0000:05:00.0\" class=\"0x030200\" vendor=\"0x10de\" link_speed=\"32.0 GT/s PCIe\" link_width=\"16\">",
        "<gpu dev=\"1\" sm=\"90\">",
        "<nvlink target=\"fffffff:ffff:ff\" count=\"18\" tclass=\"0x068000\"/>",
        "<net name=\"mlx5_0\" dev=\"0\" speed=\"400000\" port=\"1\"/>",
        "<pci busid=\"0000:41:00.0\" class=\"0x020000\"/>",
        "<pci busid=\"0000:81:00.0\" class=\"0x010802\"/>",
    ] {
        assert!(xml.contains(want), "missing {want}\n{xml}");
    }
    // Nesting follows the switch chain: 0000:03:00.0 sits inside 0000:01:00.0.
    let outer = xml.find("busid=\"0000:01:00.0\"").unwrap();
    let inner = xml.find("busid=\"0000:03:00.0\"").unwrap();
    let gpu = xml.find("busid=\"0000:05:00.0\"").unwrap();
    assert!(outer < inner && inner < gpu, "{xml}");
    let sw = &back.switches[back.device("GPU1").unwrap().attach.switches[1].0];
    assert_eq!(sw.upstream, addr("0000:03:00.0"));
    assert_eq!(
        sw.parent,
        back.device("GPU1")
            .unwrap()
            .attach
            .switches
            .first()
            .copied()
    );
}

#[test]
fn every_cpu_carries_an_identity_for_nccl() {
    let t = machine();
    let xml = to_nccl_xml(&t);
    let cpus: Vec<&str> = xml.lines().filter(|l| l.contains("<cpu ")).collect();
    assert_eq!(cpus.len(), 3, "{xml}");
    // NCCL stops on a <cpu> without arch that it does not fill itself (seen with NCCL
    // 2.28.9: a virtio NIC attached to the file's first CPU).
    if CpuIdentity::this_machine().is_some() {
        assert!(cpus.iter().all(|l| l.contains(" arch=\"")), "{xml}");
    }
    let bare = to_nccl_xml_with(&t, None);
    assert!(!bare.contains("arch="), "{bare}");
    assert_eq!(
        parse_nccl_xml(&xml, Path::new("a.xml")).unwrap().matrix(),
        parse_nccl_xml(&bare, Path::new("b.xml")).unwrap().matrix()
    );
}

#[test]
fn empty_model_writes_an_empty_system() {
    let t = Topology {
        source: Source::Sysfs("/".into()),
        devices: Vec::new(),
        switches: Vec::new(),
        host_bridges: Vec::new(),
        numa_nodes: Vec::new(),
        nvml_enriched: false,
        notes: Vec::new(),
    };
    let xml = to_nccl_xml(&t);
    assert!(xml.ends_with("<system version=\"1\"/>\n"), "{xml}");
    let back = parse_nccl_xml(&xml, Path::new("e.xml")).unwrap();
    assert!(back.devices.is_empty());
}

#[test]
fn a_vm_with_one_node_and_unknown_device_nodes_exports_no_numaid_minus_1() {
    // VMs report numa_node -1 for every device; the machine has one node with CPUs.
    let mut g = Device::new(DeviceKind::Gpu, Some(addr("0000:00:06.0")));
    g.class = Some(0x030200);
    g.attach.host_bridge = Some("pci0000:00".into());
    let mut n = Device::new(DeviceKind::Nic, Some(addr("0000:00:03.0")));
    n.class = Some(0x020000);
    n.attach.host_bridge = Some("pci0000:00".into());
    let mut t = Topology {
        source: Source::Sysfs("/".into()),
        devices: vec![g, n],
        switches: vec![],
        host_bridges: vec![HostBridge {
            id: "pci0000:00".into(),
            numa: None,
        }],
        numa_nodes: vec![NumaNode {
            id: 0,
            cpus: "0-1".into(),
        }],
        nvml_enriched: false,
        notes: vec![],
    };
    t.assign_labels();
    let xml = to_nccl_xml_with(&t, None);
    assert!(!xml.contains("numaid=\"-1\""), "{xml}");
    assert_eq!(xml.matches("<cpu ").count(), 1, "{xml}");
    assert!(
        xml.contains("<cpu numaid=\"0\" affinity=\"00000003\">"),
        "{xml}"
    );
    let back = parse_nccl_xml(&xml, Path::new("vm.xml")).unwrap();
    assert_eq!(back.gpus().count(), 1);
    assert_eq!(back.device("GPU0").unwrap().numa, Some(0));
}
