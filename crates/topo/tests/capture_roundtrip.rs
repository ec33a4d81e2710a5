//! Capture: a synthetic machine (and this one) copied to a folder and to a `.tar.gz` reads
//! back as the same model, with the files the doctor needs and nothing it must not touch.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_topo::capture::CaptureSummary;
use gdx_topo::enrich::{NvmlGpu, NvmlLink, NvmlSnapshot};
use gdx_topo::fixture::{ConfigSpace, RdmaPort, SysfsFixture, DOWNSTREAM_PORT};
use gdx_topo::{capture, from_root, NvLinkTarget, TopoError, Topology};
use std::path::Path;

/// Two sockets, two switch levels, RDMA NICs, a plain NIC, NVMe, NVLinks and doctor files.
fn rich_machine(root: &Path) {
    let mut f = SysfsFixture::new(root);
    f.numa_node(0, "0-31").numa_node(1, "32-63");
    let rp0 = f.root_port("0000:00", "0000:00:01.0", Some(0));
    let outer = f.switch_below(&rp0, "0000:01:00.0", &["0000:02:00.0", "0000:02:01.0"]);
    let inner = f.switch_below(&outer.downstream[0], "0000:03:00.0", &["0000:04:00.0"]);
    let g0 = f.gpu(&inner.downstream[0], "0000:05:00.0");
    f.nvidia_gpu_info(&g0, "NVIDIA H200");
    f.driver(&g0, "nvidia").iommu_group(&g0, 17, "identity");
    let n0 = f.nic(&outer.downstream[1], "0000:06:00.0");
    f.rdma(
        &n0,
        "mlx5_0",
        &[RdmaPort::roce(1, "ens6np0", [10, 0, 0, 5])],
    );
    f.netdev(&n0, "ens6np0", Some(400_000));
    f.link(&n0, (16.0, 8), (32.0, 16));
    // The second socket has full config space (a root capture) with ACS on a switch port.
    f.full_config(true);
    let rp1 = f.root_port("0000:80", "0000:80:01.0", Some(1));
    let sw = f.switch_below(&rp1, "0000:81:00.0", &["0000:82:00.0", "0000:82:01.0"]);
    let acs = ConfigSpace::new(0x10b5, 0xc010, 0x060400)
        .pcie(DOWNSTREAM_PORT)
        .acs(0x001d);
    f.config(&sw.downstream[0], acs.as_bytes());
    let g1 = f.gpu(&sw.downstream[0], "0000:83:00.0");
    let n1 = f.nic(&sw.downstream[1], "0000:84:00.0");
    f.rdma(&n1, "mlx5_10", &[RdmaPort::infiniband(1)]);
    let eth = f.nic(&rp1, "0000:85:00.0");
    f.netdev(&eth, "eno1", Some(1000)).virtual_netdev("lo");
    f.nvme(&rp1, "0000:86:00.0");
    // Files a sysfs reader must never open.
    f.file(g1.dir().join("resource0"), "BAR contents\n");
    f.file(g1.dir().join("rom"), "ROM\n");
    // What the doctor reads.
    f.file("proc/cmdline", "BOOT_IMAGE=/vmlinuz iommu=pt\n")
        .file("proc/modules", "nvidia_peermem 16384 0 - Live 0x0\n")
        .file(
            "proc/self/limits",
            "Max locked memory         unlimited            unlimited            bytes\n",
        )
        .file(
            "proc/driver/nvidia/version",
            "NVRM version: NVIDIA UNIX Open Kernel Module  580.159.04\n",
        )
        .file("proc/driver/nvidia/params", "EnableStreamMemOPs: 1\n")
        .module(
            "nvidia_peermem",
            Some("580.159.04"),
            &[("peerdirect_support", "0")],
        )
        .module(
            "nvidia",
            Some("580.159.04"),
            &[("NVreg_EnableStreamMemOPs", "1")],
        )
        .file("sys/kernel/mm/memory_peers/nv_mem/version", "1.3-0\n")
        .file(
            "sys/devices/virtual/iommu/dmar0/intel-iommu/version",
            "1:0\n",
        )
        .symlink("sys/class/iommu/dmar0", "../../devices/virtual/iommu/dmar0");
    let links = |to: &str| -> Vec<NvmlLink> {
        (0..18)
            .map(|link| NvmlLink {
                link,
                remote: NvLinkTarget::Gpu(to.parse().unwrap()),
            })
            .collect()
    };
    f.nvml(&NvmlSnapshot {
        driver_version: Some("580.159.04".into()),
        cuda_driver_version: Some(13000),
        gpus: vec![
            NvmlGpu {
                index: 0,
                bdf: "0000:05:00.0".parse().unwrap(),
                nvlinks: links("0000:83:00.0"),
                bar1_bytes: Some(256 << 30),
                ..Default::default()
            },
            NvmlGpu {
                index: 1,
                bdf: "0000:83:00.0".parse().unwrap(),
                nvlinks: links("0000:05:00.0"),
                ..Default::default()
            },
        ],
    });
}

/// Everything but the source must match.
fn assert_same_model(a: &Topology, b: &Topology) {
    assert_eq!(a.devices, b.devices);
    assert_eq!(a.switches, b.switches);
    assert_eq!(a.host_bridges, b.host_bridges);
    assert_eq!(a.numa_nodes, b.numa_nodes);
    assert_eq!(a.nvml_enriched, b.nvml_enriched);
    assert_eq!(a.matrix(), b.matrix());
    assert_eq!(a.notes, b.notes);
}

#[test]
fn capture_to_folder_reads_back_the_same() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("machine");
    rich_machine(&src);
    let before = from_root(&src).unwrap();
    assert!(before.notes.is_empty(), "{:?}", before.notes);
    assert_eq!(
        before.class_between("GPU0", "GPU1").unwrap().to_string(),
        "NV18"
    );
    assert_eq!(
        before.class_between("GPU0", "NIC0").unwrap().to_string(),
        "PXB"
    );
    assert_eq!(
        before.class_between("GPU1", "NIC1").unwrap().to_string(),
        "PIX"
    );

    let out = t.path().join("cap");
    let sum: CaptureSummary = capture(&src, &out).unwrap();
    assert_eq!(sum.out, out);
    assert!(sum.files > 50, "{sum:?}");
    assert!(sum.links > 10, "{sum:?}");
    assert!(sum.skipped.is_empty(), "{:?}", sum.skipped);
    let after = from_root(&out).unwrap();
    assert_same_model(&before, &after);

    // Links are relative, so the capture reads the same wherever it is moved.
    let l = std::fs::read_link(out.join("sys/bus/pci/devices/0000:05:00.0")).unwrap();
    assert!(l.is_relative(), "{}", l.display());
    let moved = t.path().join("moved");
    std::fs::rename(&out, &moved).unwrap();
    assert_same_model(&before, &from_root(&moved).unwrap());

    // Doctor inputs are there.
    for p in [
        "proc/cmdline",
        "proc/modules",
        "proc/self/limits",
        "proc/driver/nvidia/version",
        "proc/driver/nvidia/params",
        "proc/driver/nvidia/gpus/0000:05:00.0/information",
        "sys/module/nvidia_peermem/version",
        "sys/module/nvidia/parameters/NVreg_EnableStreamMemOPs",
        "sys/kernel/mm/memory_peers/nv_mem/version",
        "sys/kernel/iommu_groups/17/type",
        "sys/devices/system/node/node1/cpulist",
        "sys/class/net/ens6np0/mtu",
        "sys/class/infiniband/mlx5_0/ports/1/gid_attrs/types/3",
        "sys/bus/pci/devices/0000:05:00.0/iommu_group/type",
        "gdx/nvml.json",
        "gdx/capture.json",
    ] {
        assert!(moved.join(p).is_file(), "missing {p}");
    }
    assert!(moved.join("sys/class/iommu/dmar0").is_dir());
    assert!(moved
        .join("sys/kernel/iommu_groups/17/devices/0000:05:00.0/class")
        .is_file());
    let drv = std::fs::read_link(moved.join("sys/bus/pci/devices/0000:05:00.0/driver")).unwrap();
    assert_eq!(drv.file_name().unwrap(), "nvidia");
    // Full config (ACS capability at 0x100) is kept whole.
    let cfg = std::fs::read(moved.join("sys/bus/pci/devices/0000:82:00.0/config")).unwrap();
    assert_eq!(cfg.len(), 4096);
    assert_eq!(&cfg[0x100..0x102], &[0x0d, 0x00]);
    // And nothing with side effects was read.
    let g1 = moved.join("sys/bus/pci/devices/0000:83:00.0");
    assert!(!g1.join("resource0").exists());
    assert!(!g1.join("rom").exists());
}

#[test]
fn capture_to_tarball_reads_back_the_same() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("machine");
    rich_machine(&src);
    let before = from_root(&src).unwrap();
    for name in ["m.tar.gz", "m.tgz"] {
        let out = t.path().join(name);
        let sum = capture(&src, &out).unwrap();
        assert!(out.is_file());
        assert!(sum.files > 50);
        let after = from_root(&out).unwrap();
        assert_same_model(&before, &after);
        assert_eq!(
            after.source,
            gdx_topo::Source::Sysfs(out.display().to_string())
        );
        // A capture of the capture is the same again (and keeps the NVML snapshot).
        let again = t.path().join(format!("again-{name}"));
        capture(&out, &again).unwrap();
        assert_same_model(&before, &from_root(&again).unwrap());
    }
}

#[test]
fn unreadable_files_are_skipped_and_listed() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("machine");
    let mut f = SysfsFixture::new(&src);
    let rp = f.root_port("0000:00", "0000:00:01.0", Some(0));
    let g = f.gpu(&rp, "0000:01:00.0");
    let fifo = src.join(g.dir()).join("local_cpulist");
    std::fs::remove_file(&fifo).unwrap();
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    std::fs::remove_file(src.join(g.dir()).join("numa_node")).unwrap();
    f.file(g.dir().join("numa_node/oops"), "a folder, not a file");
    let sum = capture(&src, &t.path().join("cap")).unwrap();
    let s = sum.skipped.join("\n");
    assert!(s.contains("local_cpulist: not a regular file"), "{s}");
    assert!(s.contains("numa_node: is a folder"), "{s}");
    let topo = from_root(&t.path().join("cap")).unwrap();
    assert_eq!(topo.gpus().count(), 1);
}

#[test]
fn capture_refuses_a_non_empty_folder_and_a_missing_root() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("machine");
    SysfsFixture::new(&src);
    let out = t.path().join("busy");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("keep.txt"), "mine").unwrap();
    assert!(matches!(capture(&src, &out), Err(TopoError::Io { .. })));
    assert_eq!(
        std::fs::read_to_string(out.join("keep.txt")).unwrap(),
        "mine"
    );
    assert!(matches!(
        capture(&t.path().join("none"), &t.path().join("x")),
        Err(TopoError::RootMissing { .. })
    ));
    // An existing empty folder is fine.
    let empty = t.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    capture(&src, &empty).unwrap();
}

#[test]
fn capture_of_this_machine_reads_back_the_same() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("live.tar.gz");
    capture(Path::new("/"), &out).unwrap();
    let live = from_root(Path::new("/")).unwrap();
    let cap = from_root(&out).unwrap();
    // Only what cannot change between two reads: an idle GPU retrains its link at will, and
    // on a GPU machine the capture also holds NVML's names and labels, which `from_root("/")`
    // does not ask for.
    type Place = (
        Option<gdx_topo::PciAddr>,
        gdx_topo::DeviceKind,
        gdx_topo::Attachment,
        Option<u32>,
    );
    let places = |t: &Topology| -> Vec<Place> {
        let mut v: Vec<Place> = t
            .devices
            .iter()
            .map(|d| (d.bdf, d.kind, d.attach.clone(), d.numa))
            .collect();
        v.sort_by_key(|p| p.0);
        v
    };
    assert_eq!(places(&live), places(&cap));
    let shape = |t: &Topology| -> Vec<_> {
        t.switches
            .iter()
            .map(|s| (s.upstream, s.downstream.clone(), s.parent, s.is_virtual))
            .collect()
    };
    assert_eq!(shape(&live), shape(&cap));
    assert_eq!(live.host_bridges, cap.host_bridges);
    assert_eq!(live.numa_nodes, cap.numa_nodes);
}
