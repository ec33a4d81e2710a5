//! `--root X.tar.gz` through topo's one bounded unpacker: a capture folder tarred whole (one
//! top-level folder) opens even without a PCI tree, evidence names files as `capture:...`,
//! and the unpacked folder is gone when the run ends.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_doctor::{run, Options};

fn tarball(dir: &std::path::Path) -> std::path::PathBuf {
    let src = dir.join("cap/sys/module/nvidia");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("version"), "580.159.04\n").unwrap();
    let tgz = dir.join("cap.tar.gz");
    let gz = flate2::write::GzEncoder::new(
        std::fs::File::create(&tgz).unwrap(),
        flate2::Compression::fast(),
    );
    let mut b = tar::Builder::new(gz);
    b.append_dir_all("cap", dir.join("cap")).unwrap();
    b.into_inner().unwrap().finish().unwrap();
    tgz
}

#[test]
fn a_tarred_capture_folder_opens_and_evidence_names_the_file_inside() {
    let d = tempfile::tempdir().unwrap();
    let tgz = tarball(d.path());
    let report = run(&Options::new(&tgz)).unwrap();
    assert!(!report.header.live);
    let evidence: Vec<&String> = report
        .by_id("driver")
        .flat_map(|f| f.evidence.iter())
        .collect();
    assert!(
        evidence
            .iter()
            .any(|e| e.starts_with("capture:sys/module/nvidia/version")),
        "{evidence:?}"
    );
    assert!(
        report.header.topology.starts_with("unavailable"),
        "{}",
        report.header.topology
    );
    assert!(
        !report.header.topology.contains("gdx-root-"),
        "{}",
        report.header.topology
    );
}

#[test]
fn garbage_and_missing_archives_are_errors() {
    let d = tempfile::tempdir().unwrap();
    let bad = d.path().join("bad.tgz");
    std::fs::write(&bad, "not gzip").unwrap();
    let e = run(&Options::new(&bad)).expect_err("refused");
    assert!(e.to_string().contains("cannot unpack"), "{e}");
    let e = run(&Options::new(d.path().join("none.tgz"))).expect_err("refused");
    assert!(e.to_string().contains("no such file"), "{e}");
}
