//! Path classes from synthetic sysfs trees: one test per `nvidia-smi topo -m` class, plus the
//! shapes that make classification hard (flattened VMs, config-only port types, Broadcom PEX
//! fusing, hypervisor bridges).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_topo::enrich::{NvmlGpu, NvmlLink, NvmlSnapshot};
use gdx_topo::fixture::{RdmaPort, SysfsFixture, DOWNSTREAM_PORT, UPSTREAM_PORT};
use gdx_topo::{from_root, NvLinkTarget, PciAddr, SwitchId, Topology};

fn class(t: &Topology, a: &str, b: &str) -> String {
    t.class_between(a, b)
        .unwrap_or_else(|| panic!("no {a} or {b} in {:?}", labels(t)))
        .to_string()
}

fn labels(t: &Topology) -> Vec<String> {
    t.devices.iter().map(|d| d.label.clone()).collect()
}

fn pci(s: &str) -> PciAddr {
    s.parse().unwrap()
}

fn rdma_nic(f: &mut SysfsFixture, parent: &gdx_topo::fixture::PciNode, bdf: &str, name: &str) {
    let nic = f.nic(parent, bdf);
    f.rdma(&nic, name, &[RdmaPort::infiniband(1)]);
}

/// `n` NVLinks from one GPU to `target`.
fn links(n: u32, target: NvLinkTarget) -> Vec<NvmlLink> {
    (0..n)
        .map(|link| NvmlLink {
            link,
            remote: target.clone(),
        })
        .collect()
}

fn nvml_gpu(index: u32, bdf: &str, nvlinks: Vec<NvmlLink>) -> NvmlGpu {
    NvmlGpu {
        index,
        name: Some("NVIDIA H200".into()),
        bdf: pci(bdf),
        nvlinks,
        ..Default::default()
    }
}

#[test]
fn pix_gpu_and_nic_below_one_switch() {
    let t = tempfile::tempdir().unwrap();
    let mut f = SysfsFixture::new(t.path());
    f.numa_node(0, "0-31");
    let rp = f.root_port("0000:00", "0000:00:01.0", Some(0));
    let sw = f.switch_below(&rp, "0000:01:00.0", &["0000:02:00.0", "0000:02:01.0"]);
    f.gpu(&sw.downstream[0], "0000:03:00.0");
    rdma_nic(&mut f, &sw.downstream[1], "0000:04:00.0", "mlx5_0");

    let topo = from_root(t.path()).unwrap();
    assert_eq!(labels(&topo), ["GPU0", "NIC0"]);
    assert_eq!(class(&topo, "GPU0", "NIC0"), "PIX");
    assert_eq!(class(&topo, "GPU0", "GPU0"), "X");
    assert_eq!(topo.switches.len(), 1, "{:?}", topo.switches);
    let s = &topo.switches[0];
    assert_eq!(s.upstream, pci("0000:01:00.0"));
    assert_eq!(s.downstream, [pci("0000:02:00.0"), pci("0000:02:01.0")]);
    assert_eq!(s.parent, None);
    assert!(!s.is_virtual);
    let gpu = topo.device("GPU0").unwrap();
    assert_eq!(gpu.attach.host_bridge.as_deref(), Some("pci0000:00"));
    assert_eq!(gpu.attach.switches, [SwitchId(0)]);
    assert_eq!(gpu.numa, Some(0));
    assert_eq!(gpu.cpu_affinity.as_deref(), Some("0-31"));
    assert_eq!(topo.host_bridges.len(), 1);
    assert_eq!(topo.host_bridges[0].numa, Some(0));
    assert!(topo.notes.is_empty(), "{:?}", topo.notes);
}

#[test]
fn pxb_through_two_switch_levels() {
    let t = tempfile::tempdir().unwrap();
    let mut f = SysfsFixture::new(t.path());
    let rp = f.root_port("0000:00", "0000:00:01.0", Some(0));
    let outer = f.switch_below(&rp, "0000:01:00.0", &["0000:02:00.0", "0000:02:01.0"]);
    let inner = f.switch_below(&outer.downstream[0], "0000:03:00.0", &["0000:04:00.0"]);
    f.gpu(&inner.downstream[0], "0000:05:00.0");
    rdma_nic(&mut f, &outer.downstream[1], "0000:06:00.0", "mlx5_0");
    rdma_nic(&mut f, &inner.downstream[0], "0000:05:00.1", "mlx5_1");

    let topo = from_root(t.path()).unwrap();
    assert_eq!(class(&topo, "GPU0", "NIC0"), "PXB");
    assert_eq!(class(&topo, "GPU0", "NIC1"), "PIX");
    assert_eq!(class(&topo, "NIC0", "NIC1"), "PXB");
    assert_eq!(topo.switches.len(), 2);
    assert_eq!(topo.switches[1].parent, Some(SwitchId(0)));
    assert_eq!(
        topo.device("GPU0").unwrap().attach.switches,
        [SwitchId(0), SwitchId(1)]
    );
}

#[test]
fn phb_different_root_ports_of_one_host_bridge() {
    let t = tempfile::tempdir().unwrap();
    let mut f = SysfsFixture::new(t.path());
    let rp1 = f.root_port("0000:00", "0000:00:01.0", Some(0));
    let rp2 = f.root_port("0000:00", "0000:00:02.0", Some(0));
    let sw = f.switch_below(&rp1, "0000:01:00.0", &["0000:02:00.0"]);
    f.gpu(&sw.downstream[0], "0000:03:00.0");
    rdma_nic(&mut f, &rp2, "0000:10:00.0", "mlx5_0");

    let topo = from_root(t.path()).unwrap();
    assert_eq!(class(&topo, "GPU0", "NIC0"), "PHB");
    // Root ports are not switches.
    assert_eq!(topo.switches.len(), 1);
    assert!(topo.device("NIC0").unwrap().attach.switches.is_empty());
}

#[test]
fn node_two_host_bridges_one_numa_node() {
    let t = tempfile::tempdir().unwrap();
    let mut f = SysfsFixture::new(t.path());
    let rp1 = f.root_port("0000:00", "0000:00:01.0", Some(0));
    let rp2 = f.root_port("0000:40", "0000:40:01.0", Some(0));
    f.gpu(&rp1, "0000:01:00.0");
    rdma_nic(&mut f, &rp2, "0000:41:00.0", "mlx5_0");

    let topo = from_root(t.path()).unwrap();
    assert_eq!(class(&topo, "GPU0", "NIC0"), "NODE");
    let ids: Vec<&str> = topo.host_bridges.iter().map(|h| h.id.as_str()).collect();
    assert_eq!(ids, ["pci0000:00", "pci0000:40"]);
}

#[test]
fn sys_across_numa_nodes() {
    let t = tempfile::tempdir().unwrap();
    let mut f = SysfsFixture::new(t.path());
    f.numa_node(0, "0-31").numa_node(1, "32-63");
    let rp1 = f.root_port("0000:00", "0000:00:01.0", Some(0));
    let rp2 = f.root_port("0000:80", "0000:80:01.0", Some(1));
    f.gpu(&rp1, "0000:01:00.0");
    f.gpu(&rp2, "0000:81:00.0");
    rdma_nic(&mut f, &rp2, "0000:82:00.0", "mlx5_0");

    let topo = from_root(t.path()).unwrap();
    assert_eq!(class(&topo, "GPU0", "GPU1"), "SYS");
    assert_eq!(class(&topo, "GPU0", "NIC0"), "SYS");
    assert_eq!(class(&topo, "GPU1", "NIC0"), "PHB");
    assert_eq!(
        topo.device("GPU1").unwrap().cpu_affinity.as_deref(),
        Some("32-63")
    );
    assert_eq!(topo.numa_nodes.len(), 2);
    assert_eq!(topo.numa_nodes[1].cpus, "32-63");
}

#[test]
fn nv18_from_captured_nvml_snapshot() {
    let t = tempfile::tempdir().unwrap();
    let mut f = SysfsFixture::new(t.path());
    let rp1 = f.root_port("0000:00", "0000:00:01.0", Some(0));
    let rp2 = f.root_port("0000:80", "0000:80:01.0", Some(1));
    f.gpu(&rp1, "0000:01:00.0");
    f.gpu(&rp2, "0000:81:00.0");
    f.nvml(&NvmlSnapshot {
        driver_version: Some("580.159.04".into()),
        gpus: vec![
            nvml_gpu(
                0,
                "0000:01:00.0",
                links(18, NvLinkTarget::Gpu(pci("0000:81:00.0"))),
            ),
            nvml_gpu(
                1,
                "0000:81:00.0",
                links(18, NvLinkTarget::Gpu(pci("0000:01:00.0"))),
            ),
        ],
        ..Default::default()
    });

    let topo = from_root(t.path()).unwrap();
    assert!(topo.nvml_enriched);
    assert_eq!(class(&topo, "GPU0", "GPU1"), "NV18");
    let (a, b) = (topo.device("GPU0").unwrap(), topo.device("GPU1").unwrap());
    assert_eq!(topo.pcie_class(a, b).to_string(), "SYS");
    assert_eq!(a.name.as_deref(), Some("NVIDIA H200"));
}

#[test]
fn nvswitch_links_reach_every_gpu() {
    let t = tempfile::tempdir().unwrap();
    let mut f = SysfsFixture::new(t.path());
    let bdfs = [
        "0000:18:00.0",
        "0000:2a:00.0",
        "0000:9a:00.0",
        "0000:ab:00.0",
    ];
    let mut gpus = Vec::new();
    for (i, b) in bdfs.iter().enumerate() {
        let hb = f.host_bridge(&b[..7], Some(i as u32 / 2));
        f.gpu(&hb, b);
        gpus.push(nvml_gpu(i as u32, b, links(18, NvLinkTarget::NvSwitch)));
    }
    f.nvml(&NvmlSnapshot {
        gpus,
        ..Default::default()
    });

    let topo = from_root(t.path()).unwrap();
    assert_eq!(topo.gpus().count(), 4);
    for a in 0..4 {
        for b in 0..4 {
            let want = if a == b { "X" } else { "NV18" };
            assert_eq!(class(&topo, &format!("GPU{a}"), &format!("GPU{b}")), want);
        }
    }
}

/// The GPU test machine: a Firecracker VM with both GPUs on the root bus, no NUMA, a virtio NIC.
fn flattened_vm(f: &mut SysfsFixture) {
    let hb = f.host_bridge("0000:00", None);
    f.function(&hb, "0000:00:00.0", 0x060000, 0x8086, 0x0d57, 0);
    let eth = f.function(&hb, "0000:00:03.0", 0x020000, 0x1af4, 0x1041, 0);
    f.netdev(&eth, "eth0", None);
    f.gpu(&hb, "0000:00:06.0");
    f.gpu(&hb, "0000:00:07.0");
    f.virtual_netdev("lo");
}

#[test]
fn flattened_vm_gives_phb_and_no_numa() {
    let t = tempfile::tempdir().unwrap();
    let mut f = SysfsFixture::new(t.path());
    flattened_vm(&mut f);

    let topo = from_root(t.path()).unwrap();
    assert_eq!(labels(&topo), ["GPU0", "GPU1", "NIC0"]);
    assert_eq!(class(&topo, "GPU0", "GPU1"), "PHB");
    assert_eq!(class(&topo, "GPU0", "NIC0"), "PHB");
    let g = topo.device("GPU0").unwrap();
    assert_eq!(g.bdf, Some(pci("0000:00:06.0")));
    assert_eq!(g.numa, None);
    assert!(g.attach.switches.is_empty());
    assert_eq!(topo.host_bridges[0].numa, None);
    assert!(topo.switches.is_empty());
    assert_eq!(
        topo.device("NIC0").unwrap().nic.as_ref().unwrap().netdevs,
        ["eth0"]
    );
    assert!(topo.notes.is_empty(), "{:?}", topo.notes);
}

#[test]
fn flattened_vm_with_nvml_snapshot_gives_nv18() {
    let t = tempfile::tempdir().unwrap();
    let mut f = SysfsFixture::new(t.path());
    flattened_vm(&mut f);
    f.nvml(&NvmlSnapshot {
        gpus: vec![
            nvml_gpu(
                0,
                "00000000:00:06.0",
                links(18, NvLinkTarget::Gpu(pci("0000:00:07.0"))),
            ),
            nvml_gpu(
                1,
                "00000000:00:07.0",
                links(18, NvLinkTarget::Gpu(pci("0000:00:06.0"))),
            ),
        ],
        ..Default::default()
    });
    let topo = from_root(t.path()).unwrap();
    assert_eq!(class(&topo, "GPU0", "GPU1"), "NV18");
    assert_eq!(class(&topo, "GPU1", "NIC0"), "PHB");
    assert_eq!(
        topo.device("GPU1").unwrap().gpu.as_ref().unwrap().index,
        Some(1)
    );
}

#[test]
fn upstream_port_on_the_root_bus_needs_config() {
    // A hypervisor that exposes a switch but no root port: the shape alone would take the
    // upstream port for a root port and each downstream port for a switch (GPU-NIC PHB);
    // the PCIe capability in a full `config` says what each bridge is (PIX).
    let build = |full: bool| {
        let t = tempfile::tempdir().unwrap();
        let mut f = SysfsFixture::new(t.path());
        f.full_config(full);
        let hb = f.host_bridge("0000:00", Some(0));
        let up = f.bridge(&hb, "0000:00:02.0", UPSTREAM_PORT, 0x10b5, 0x8796);
        let d1 = f.bridge(&up, "0000:01:00.0", DOWNSTREAM_PORT, 0x10b5, 0x8796);
        let d2 = f.bridge(&up, "0000:01:01.0", DOWNSTREAM_PORT, 0x10b5, 0x8796);
        f.gpu(&d1, "0000:02:00.0");
        rdma_nic(&mut f, &d2, "0000:03:00.0", "mlx5_0");
        let topo = from_root(t.path()).unwrap();
        (class(&topo, "GPU0", "NIC0"), topo.switches.len())
    };
    assert_eq!(build(true), ("PIX".to_string(), 1));
    assert_eq!(build(false), ("PHB".to_string(), 2));
}

#[test]
fn broadcom_pex_two_levels_fuse_into_one_switch() {
    let t = tempfile::tempdir().unwrap();
    let mut f = SysfsFixture::new(t.path());
    let rp = f.root_port("0000:00", "0000:00:01.0", Some(0));
    let outer = f.switch_below(&rp, "0000:01:00.0", &["0000:02:00.0", "0000:02:01.0"]);
    let inner = f.switch_below(&outer.downstream[0], "0000:03:00.0", &["0000:04:00.0"]);
    for (node, sub) in [(&outer.upstream, "0x00a1"), (&inner.upstream, "0x10a1")] {
        f.set(node, "vendor", "0x1000")
            .set(node, "device", "0xc030")
            .set(node, "subsystem_vendor", "0x1000")
            .set(node, "subsystem_device", sub);
    }
    f.gpu(&inner.downstream[0], "0000:05:00.0");
    rdma_nic(&mut f, &outer.downstream[1], "0000:06:00.0", "mlx5_0");

    let topo = from_root(t.path()).unwrap();
    assert_eq!(class(&topo, "GPU0", "NIC0"), "PIX");
    assert_eq!(topo.switches.len(), 1);
    assert!(topo.switches[0].downstream.contains(&pci("0000:04:00.0")));

    // The same tree with a PLX switch inside: two levels, PXB.
    f.set(&inner.upstream, "device", "0x8796");
    let topo = from_root(t.path()).unwrap();
    assert_eq!(class(&topo, "GPU0", "NIC0"), "PXB");
}

#[test]
fn hypervisor_bridges_are_virtual() {
    let t = tempfile::tempdir().unwrap();
    let mut f = SysfsFixture::new(t.path());
    let rp = f.root_port("0000:00", "0000:00:01.0", None);
    f.set(&rp, "vendor", "0x1b36");
    let sw = f.switch_below(&rp, "0000:01:00.0", &["0000:02:00.0"]);
    f.set(&sw.upstream, "vendor", "0x1b36");
    f.gpu(&sw.downstream[0], "0000:03:00.0");
    let rp2 = f.root_port("0000:00", "0000:00:02.0", None);
    let sw2 = f.switch_below(&rp2, "0000:10:00.0", &["0000:11:00.0"]);
    f.gpu(&sw2.downstream[0], "0000:12:00.0");

    let topo = from_root(t.path()).unwrap();
    assert_eq!(topo.switches.len(), 2);
    assert!(topo.switches[0].is_virtual);
    assert!(!topo.switches[1].is_virtual);
}

#[test]
fn machine_without_gpus_is_valid() {
    let t = tempfile::tempdir().unwrap();
    let mut f = SysfsFixture::new(t.path());
    let rp = f.root_port("0000:00", "0000:00:01.0", Some(0));
    let nic = f.nic(&rp, "0000:01:00.0");
    f.netdev(&nic, "eno1", Some(25_000));
    f.nvme(&rp, "0000:02:00.0");

    let topo = from_root(t.path()).unwrap();
    assert_eq!(topo.gpus().count(), 0);
    assert_eq!(labels(&topo), ["NIC0", "NVME0"]);
    assert_eq!(topo.matrix().len(), 1);
}
