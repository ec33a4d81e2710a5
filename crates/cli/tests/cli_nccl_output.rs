//! `gdx nccl` takes `-q` and `--color` like every printing subcommand.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::gdx;

use predicates::prelude::*;

fn ndv5() -> std::path::PathBuf {
    gdx_topo::fixture::reference_topologies().join("nccl_topo_azure_ndv5-topo.xml")
}

#[test]
fn env_quiet_prints_only_export_lines() {
    let xml = ndv5();
    let out = gdx()
        .args(["nccl", "env", "-q", "--xml"])
        .arg(&xml)
        .assert()
        .success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).to_string();
    assert!(!text.is_empty());
    assert!(text.lines().all(|l| l.starts_with("export ")), "{text}");
    // Without -q the reasons are there as comments.
    gdx()
        .args(["nccl", "env", "--xml"])
        .arg(&xml)
        .assert()
        .success()
        .stdout(predicate::str::contains("# "));
}

#[test]
fn explain_takes_quiet_and_color() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("nccl.log");
    std::fs::write(
        &log,
        "host:1:1 [0] NCCL INFO NCCL version 2.20.5+cuda12.4\nhost:1:1 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>\n",
    )
    .unwrap();
    for args in [
        &["-q"][..],
        &["--color", "never"][..],
        &["--color", "always"][..],
    ] {
        gdx()
            .args(["nccl", "explain"])
            .arg(&log)
            .args(args)
            .assert()
            .code(predicate::in_iter([0, 1]))
            .stdout(predicate::str::contains("Judgement"));
    }
    gdx()
        .args(["nccl", "explain", "--color", "never"])
        .arg(&log)
        .assert()
        .stdout(predicate::str::contains("\x1b[").not());
}
