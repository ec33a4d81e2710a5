//! End-to-end tests of `gdx nccl` through the real binary, on the real NCCL logs of
//! crates/nccl/tests/fixtures, the shared NCCL topology files and synthetic machines.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::{gdx, refused, shows, success_json};

// The synthetic machines of gdx-nccl's own tests, so both suites judge the same trees.
#[path = "../../nccl/tests/common/mod.rs"]
mod machines;

use machines::rail_machine;
use predicates::prelude::*;
use std::path::PathBuf;

fn log(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../nccl/tests/fixtures")
        .join(name)
}

#[test]
fn help_names_the_three_subcommands() {
    shows(
        gdx().args(["nccl", "--help"]).assert(),
        &["explain", "env", "run"],
    );
    shows(
        gdx().args(["nccl", "run", "--help"]).assert(),
        &["--size", "NCCL_NVLS_ENABLE=0"],
    );
}

#[test]
fn explain_against_a_captured_machine_exits_1_when_gdr_was_left_unused() {
    let dir = tempfile::tempdir().unwrap();
    rail_machine(dir.path());
    gdx()
        .args(["nccl", "explain"])
        .arg(log("gdr_disabled_roce_nccl1537.log"))
        .arg("--root")
        .arg(dir.path())
        .assert()
        .code(1)
        .stdout(predicate::str::contains("NOT BEST  GDR on mlx5_0"))
        .stdout(predicate::str::contains(
            "GPU0↔mlx5_0 is PIX: GDRDMA expected",
        ))
        .stdout(predicate::str::contains("why: doctor peermem"))
        .stdout(predicate::str::contains("best      GDR on mlx5_1"));
}

#[test]
fn explain_json_carries_the_log_the_classes_and_the_judgement() {
    let out = gdx()
        .args(["nccl", "explain", "--json"])
        .arg(log("p2p_cumem_gdrdma_h20_nccl1189.log"))
        .arg(log("socket_shm_mpirun_nccl1232.log"))
        .args(["--xml"])
        .arg(gdx_topo::fixture::reference_topologies().join("nccl_topo_azure_ndv5-topo.xml"))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["log"]["sources"].as_array().unwrap().len(), 2);
    let classes = v["pair_classes"].as_array().unwrap();
    assert!(classes
        .iter()
        .any(|c| c["transport"] == "P2P/CUMEM" && c["scope"] == "same-host"));
    assert!(classes
        .iter()
        .any(|c| c["transport"] == "NET/Socket" && c["scope"] == "inter-node"));
    assert!(v["judged"]["judgements"]
        .as_array()
        .unwrap()
        .iter()
        .any(|j| j["verdict"] == "best"));
}

#[test]
fn explain_of_garbage_says_nothing_was_found_and_a_missing_file_is_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    rail_machine(dir.path());
    let junk = dir.path().join("junk.log");
    std::fs::write(&junk, b"\xff\xfe not a log \n\x00\x01\n").unwrap();
    gdx()
        .args(["nccl", "explain"])
        .arg(&junk)
        .args(["--root"])
        .arg(dir.path())
        .assert()
        .success()
        .stdout(predicate::str::contains("no NCCL lines found"));
    gdx()
        .args(["nccl", "explain"])
        .arg(dir.path().join("missing.log"))
        .assert()
        .code(2)
        .stderr(predicate::str::starts_with("gdx: error:"))
        .stderr(predicate::str::contains("missing.log"));
}

#[test]
fn env_for_a_captured_machine_prints_export_lines_with_reasons() {
    let dir = tempfile::tempdir().unwrap();
    rail_machine(dir.path());
    shows(
        gdx()
            .args(["nccl", "env", "--root"])
            .arg(dir.path())
            .assert(),
        &[
            "export NCCL_IB_HCA='=mlx5_0:1'",
            "leaves out mlx5_1",
            "export NCCL_IB_GID_INDEX=3",
        ],
    )
    .stdout(predicate::str::contains(
        "# NCCL_NET_GDR_LEVEL: leave unset",
    ));
}

#[test]
fn env_for_nd_h100_v5_json_names_each_gpus_pix_nic() {
    let dir = gdx_topo::fixture::reference_topologies();
    let out = gdx()
        .args(["nccl", "env", "--json", "--xml"])
        .arg(dir.join("nccl_topo_azure_ndv5-topo.xml"))
        .output()
        .unwrap();
    let v = success_json(&out);
    let gpus = v["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 8);
    assert!(gpus.iter().all(|g| g["nearest"][0]["class"] == "PIX"));
    let vars = v["vars"].as_array().unwrap();
    assert!(vars.iter().any(|x| x["name"] == "NCCL_TOPO_FILE"
        && x["value"].as_str().unwrap().ends_with("ndv5-topo.xml")));
}

#[test]
fn run_is_waived_without_a_gpu_or_reports_busbw() {
    let out = gdx()
        .args([
            "nccl", "run", "--size", "1MiB", "--iters", "1", "--warmup", "0", "--gpus", "1",
        ])
        .env("NCCL_NVLS_ENABLE", "0")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    if text.starts_with("waived:") {
        assert_eq!(out.status.code(), Some(0));
        assert!(
            text.contains("no GPU") || text.contains("no libnccl"),
            "{text}"
        );
    } else {
        assert!(text.contains("busbw(GB/s)"), "{text}");
        assert!(text.contains("NCCL's log, explained"), "{text}");
    }
}

#[test]
fn run_refuses_unknown_collectives_and_bad_sizes() {
    refused(
        gdx().args(["nccl", "run", "--ops", "bcast"]).assert(),
        "unknown collective",
    );
    gdx()
        .args(["nccl", "run", "--size", "12XB"])
        .assert()
        .code(2);
}

/// `/dev/zero` once read until memory ran out and a FIFO without a writer hung: both are refused
/// (exit 2) before they are opened. The bound is generous for a loaded machine; either way a
/// read of /dev/zero or a blocked open would never end within it.
#[test]
fn explain_refuses_devices_and_fifos_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo.log");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    for (path, says) in [
        (PathBuf::from("/dev/zero"), "a device"),
        (fifo.clone(), "a FIFO"),
        (dir.path().to_path_buf(), "a directory"),
    ] {
        let t0 = std::time::Instant::now();
        gdx()
            .args(["nccl", "explain"])
            .arg(&path)
            .timeout(std::time::Duration::from_secs(10))
            .assert()
            .code(2)
            .stderr(predicate::str::contains(says))
            .stderr(predicate::str::contains("cannot read"));
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(5),
            "{} took {:?}",
            path.display(),
            t0.elapsed()
        );
    }
}

/// A 200 MB line once cost 2 GB: lines are cut at MAX_LINE_BYTES, a warning says so, and the
/// lines around it are still read.
#[test]
fn explain_cuts_a_huge_line_and_reads_on() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("long.log");
    let mut text = String::from("h1:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n");
    text.push_str(&"x".repeat(gdx_nccl::parse::MAX_LINE_BYTES * 3));
    text.push('\n');
    text.push_str(
        "h1:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [RO]; OOB eth0:10.0.0.1<0>\n",
    );
    std::fs::write(&f, text).unwrap();
    let out = gdx()
        .args(["nccl", "explain", "--json"])
        .arg(&f)
        .timeout(std::time::Duration::from_secs(30))
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        s.contains("only their first"),
        "no long-line warning in {s}"
    );
    assert!(
        s.contains("mlx5_0"),
        "the line after the long one was not read: {s}"
    );
}

/// ESC bytes in a log (here in an HCA name) come out escaped, never as raw terminal escapes.
#[test]
fn explain_escapes_control_characters_from_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("esc.log");
    std::fs::write(
        &f,
        "h1:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n\
         h1:1:1 [0] NCCL INFO NET/IB : Using [0]ml\x1b[2Jx5_0:1/IB [RO]; OOB eth0:10.0.0.1<0>\n",
    )
    .unwrap();
    let out = gdx()
        .args(["nccl", "explain", "--color", "never"])
        .arg(&f)
        .timeout(std::time::Duration::from_secs(30))
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(!s.contains('\x1b'), "a raw ESC reached the terminal: {s:?}");
    assert!(
        s.contains("\\u{1b}[2J"),
        "the escape is not shown escaped: {s}"
    );
}
