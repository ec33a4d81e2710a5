//! The doctor never panics and never hangs on odd trees: missing files, garbage values, short
//! or random config bytes, files where folders belong, dangling links, loops, FIFOs.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_doctor::{run, Options, Status};
use std::path::Path;

fn write(root: &Path, rel: &str, data: &[u8]) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
}

fn link(root: &Path, rel: &str, target: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(target, p).unwrap();
}

/// xorshift64*: deterministic garbage without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn bytes(&mut self, max: usize) -> Vec<u8> {
        let n = (self.next() as usize) % (max + 1);
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn assert_runs(root: &Path) -> gdx_doctor::Report {
    let r = run(&Options::new(root)).unwrap_or_else(|e| panic!("{e}"));
    for c in gdx_doctor::checks::all_checks() {
        assert!(r.by_id(c.id()).next().is_some(), "{} missing", c.id());
    }
    for f in &r.findings {
        if f.status == Status::Skip {
            assert!(f.reason.as_deref().is_some_and(|s| !s.is_empty()), "{f:#?}");
        }
        assert!(
            !f.reason.as_deref().unwrap_or("").contains("doctor bug"),
            "a check panicked: {f:#?}"
        );
    }
    r
}

#[test]
fn empty_folder_and_missing_root() {
    let dir = tempfile::tempdir().unwrap();
    let r = assert_runs(dir.path());
    assert_eq!(r.exit_code(), 0);
    assert!(matches!(
        run(&Options::new(dir.path().join("nope"))),
        Err(gdx_doctor::DoctorError::RootMissing(_))
    ));
}

#[test]
fn random_garbage_in_every_file_a_check_reads() {
    let attrs = [
        "vendor",
        "device",
        "class",
        "numa_node",
        "current_link_speed",
        "max_link_speed",
        "current_link_width",
        "max_link_width",
        "config",
        "resource",
        "local_cpulist",
    ];
    for seed in 1..40u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let hb = "sys/devices/pci0000:00";
        let devs = [
            ("0000:00:01.0", "0x060400", ""),
            ("0000:01:00.0", "0x030200", "0000:00:01.0/"),
            ("0000:01:00.1", "0x020000", "0000:00:01.0/"),
        ];
        for (bdf, class, parent) in devs {
            let d = format!("{hb}/{parent}{bdf}");
            write(
                root,
                &format!("{d}/vendor"),
                if class == "0x030200" {
                    b"0x10de\n"
                } else {
                    b"0x15b3\n"
                },
            );
            write(root, &format!("{d}/class"), class.as_bytes());
            for a in attrs {
                if a == "vendor" || a == "class" || matches!(rng.next() % 3, 0) {
                    continue;
                }
                write(
                    root,
                    &format!("{d}/{a}"),
                    &rng.bytes(if a == "config" { 4096 } else { 40 }),
                );
            }
            let up = "../".repeat(3);
            link(
                root,
                &format!("sys/bus/pci/devices/{bdf}"),
                &format!("{up}devices/pci0000:00/{parent}{bdf}"),
            );
        }
        // RDMA device with garbage ports and GIDs.
        link(
            root,
            "sys/class/infiniband/mlx5_0/device",
            "../../../bus/pci/devices/0000:01:00.1",
        );
        for f in [
            "state",
            "link_layer",
            "rate",
            "gids/0",
            "gids/x",
            "gid_attrs/types/0",
        ] {
            write(
                root,
                &format!("sys/class/infiniband/mlx5_0/ports/1/{f}"),
                &rng.bytes(60),
            );
        }
        write(root, "sys/class/infiniband/mlx5_0/ports/notanumber", b"");
        for f in [
            "proc/self/limits",
            "proc/cmdline",
            "proc/driver/nvidia/version",
            "proc/sys/kernel/osrelease",
            "etc/cufile.json",
            "sys/module/nvidia_peermem/version",
        ] {
            write(root, f, &rng.bytes(200));
        }
        write(root, "sys/class/iommu/dmar0", b"x");
        assert_runs(root);
    }
}

#[test]
fn structural_oddities() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // A GPU whose bus entry is a plain folder (a capture that copied instead of linking).
    write(root, "sys/bus/pci/devices/0000:05:00.0/vendor", b"0x10de\n");
    write(
        root,
        "sys/bus/pci/devices/0000:05:00.0/class",
        b"0x030200\n",
    );
    // Dangling and looping links, a file where a folder belongs, a non-address name.
    link(
        root,
        "sys/bus/pci/devices/0000:06:00.0",
        "../../../devices/pci0000:00/gone",
    );
    link(root, "sys/bus/pci/devices/0000:07:00.0", "0000:07:00.0");
    write(root, "sys/bus/pci/devices/garbage", b"");
    write(root, "sys/class/infiniband", b"a file, not a folder");
    link(root, "sys/kernel/mm/memory_peers", "/");
    // Absolute link into the host's /sys: must be re-rooted, not followed to the host.
    link(
        root,
        "sys/bus/pci/devices/0000:08:00.0",
        "/sys/devices/pci0000:00/0000:08:00.0",
    );
    // A FIFO where a file a check reads should be: reading it would block forever.
    let fifo = root.join("proc/self/limits");
    std::fs::create_dir_all(fifo.parent().unwrap()).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .is_ok_and(|s| s.success());
    let r = assert_runs(root);
    assert_eq!(r.header.gpus.len(), 1, "{:?}", r.header.gpus);
    if made {
        let m = r.by_id("memlock").next().unwrap();
        assert_eq!(m.status, Status::Skip);
        assert!(
            m.reason.as_deref().unwrap().contains("not a regular file"),
            "{m:#?}"
        );
    }
}
