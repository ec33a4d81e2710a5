//! Roots that are missing, empty or odd: errors where the root is unusable, notes (never
//! panics or hangs) for anything odd inside it, and links that must stay inside the root.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_topo::fixture::{RdmaPort, SysfsFixture};
use gdx_topo::{from_root, Source, TopoError};
use std::path::Path;

#[test]
fn missing_root_is_root_missing() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("nope");
    match from_root(&p) {
        Err(TopoError::RootMissing { path }) => assert_eq!(path, p),
        other => panic!("{other:?}"),
    }
}

#[test]
fn empty_folder_is_root_unusable() {
    let t = tempfile::tempdir().unwrap();
    match from_root(t.path()) {
        Err(e @ TopoError::RootUnusable { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("no sys/bus/pci/devices"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn plain_file_and_broken_archive_are_root_unusable() {
    let t = tempfile::tempdir().unwrap();
    let txt = t.path().join("notes.txt");
    std::fs::write(&txt, "hello").unwrap();
    assert!(matches!(
        from_root(&txt),
        Err(TopoError::RootUnusable { .. })
    ));
    let tgz = t.path().join("broken.tar.gz");
    std::fs::write(&tgz, b"\x1f\x8b not really gzip").unwrap();
    match from_root(&tgz) {
        Err(TopoError::RootUnusable { why, .. }) => assert!(why.contains("unpack"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn garbage_and_unreadable_files_become_notes() {
    let t = tempfile::tempdir().unwrap();
    let mut f = SysfsFixture::new(t.path());
    let rp = f.root_port("0000:00", "0000:00:01.0", Some(0));
    let gpu = f.gpu(&rp, "0000:01:00.0");
    f.set(&gpu, "numa_node", "\u{1}\u{2}zz")
        .set(&gpu, "current_link_speed", "very fast")
        .set(&gpu, "max_link_width", "x16");
    // A function whose class is garbage is not classified, but the rest still is.
    let odd = f.gpu(&rp, "0000:02:00.0");
    f.set(&odd, "class", "banana");
    // A folder where a file should be.
    let nic = f.nic(&rp, "0000:03:00.0");
    std::fs::remove_file(t.path().join(nic.dir()).join("vendor")).unwrap();
    std::fs::create_dir(t.path().join(nic.dir()).join("vendor")).unwrap();
    f.rdma(&nic, "mlx5_0", &[RdmaPort::infiniband(1)]);
    f.file(nic.dir().join("infiniband/mlx5_0/ports/1/rate"), "lots\n");
    // Random bytes as config of a bridge.
    f.config(&rp, &[0xff, 0x13, 0x00, 0x10, 0x77][..]);
    // A FIFO would block a careless reader forever.
    let fifo = t.path().join(gpu.dir()).join("local_cpulist");
    std::fs::remove_file(&fifo).unwrap();
    let st = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(st.success());
    // Dangling, looping and misnamed entries.
    f.symlink(
        "sys/bus/pci/devices/0000:09:00.0",
        "../../../devices/pci0000:00/gone",
    );
    f.symlink("sys/class/net/loop0", "loop0");
    f.file("sys/bus/pci/devices/README", "not a device\n");
    f.file("gdx/nvml.json", "{ not json");

    let topo = from_root(t.path()).unwrap();
    let notes = topo.notes.join("\n");
    for want in [
        "0000:01:00.0/numa_node: unexpected NUMA node",
        "current_link_speed: unexpected link speed \"very fast\"",
        "max_link_width: unexpected link width",
        "0000:02:00.0/class: unexpected class code \"banana\"",
        "0000:03:00.0/vendor: cannot read: is a folder",
        "local_cpulist: cannot read: not a regular file",
        "ports/1/rate: unexpected rate \"lots\"",
        "sys/bus/pci/devices/0000:09:00.0: dangling link",
        "sys/class/net/loop0: dangling link",
        "sys/bus/pci/devices/README: not a PCI address",
        "NVML snapshot not used",
    ] {
        assert!(notes.contains(want), "missing note {want:?} in:\n{notes}");
    }
    assert_eq!(topo.gpus().count(), 1);
    let g = topo.device("GPU0").unwrap();
    assert_eq!(g.numa, None);
    assert_eq!(g.link.current.speed_gts, None);
    assert_eq!(g.cpu_affinity, None);
    // The NIC keeps its RDMA name and port; the bad rate is only a missing figure.
    let n = topo.device("NIC0").unwrap();
    assert_eq!(n.vendor, None);
    assert_eq!(n.nic.as_ref().unwrap().ports[0].rate_gbps, None);
}

#[test]
fn absolute_link_targets_are_re_rooted() {
    // Bus numbers that also exist on a real machine (0000:00:01.0 on this one): following the
    // absolute links on the host would find the host's devices, not these.
    let t = tempfile::tempdir().unwrap();
    let mut f = SysfsFixture::new(t.path());
    f.absolute_links(true);
    let rp = f.root_port("0000:00", "0000:00:01.0", Some(0));
    let sw = f.switch_below(&rp, "0000:01:00.0", &["0000:02:00.0", "0000:02:01.0"]);
    f.gpu(&sw.downstream[0], "0000:03:00.0");
    let nic = f.nic(&sw.downstream[1], "0000:04:00.0");
    f.netdev(&nic, "eth9", None);
    let link = std::fs::read_link(t.path().join("sys/bus/pci/devices/0000:03:00.0")).unwrap();
    assert!(link.is_absolute(), "{}", link.display());

    let topo = from_root(t.path()).unwrap();
    assert_eq!(topo.gpus().count(), 1);
    assert_eq!(
        topo.class_between("GPU0", "NIC0").unwrap().to_string(),
        "PIX"
    );
    assert!(topo.notes.is_empty(), "{:?}", topo.notes);
}

#[test]
fn a_flat_copy_without_links_still_reads() {
    // Someone copied sys/bus/pci/devices with `cp -rL`: folders, no tree.
    let t = tempfile::tempdir().unwrap();
    let mut f = SysfsFixture::new(t.path());
    let dir = Path::new("sys/bus/pci/devices/0000:00:06.0");
    for (k, v) in [
        ("class", "0x030200"),
        ("vendor", "0x10de"),
        ("device", "0x2335"),
    ] {
        f.file(dir.join(k), format!("{v}\n"));
    }
    let topo = from_root(t.path()).unwrap();
    let g = topo.device("GPU0").unwrap();
    assert_eq!(g.attach.host_bridge.as_deref(), Some("pci0000:00"));
    assert!(topo.notes.iter().any(|n| n.contains("host bridge assumed")));
}

#[test]
fn the_live_machine_reads() {
    let topo = from_root(Path::new("/")).unwrap();
    assert_eq!(topo.source, Source::Sysfs("/".into()));
    // Every device is placed under some host bridge.
    for d in &topo.devices {
        assert!(d.attach.host_bridge.is_some(), "{d:?}");
    }
    let m = topo.matrix();
    assert_eq!(m.len(), topo.gpus().count() + topo.nics().count());
}
