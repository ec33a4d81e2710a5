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
        .arg(gdx_topo::fixture::reference_topologies().map_or_else(
            || PathBuf::from("/nonexistent.xml"),
            |d| d.join("nccl_topo_azure_ndv5-topo.xml"),
        ))
        .output()
        .unwrap();
    if gdx_topo::fixture::reference_topologies().is_none() {
        return;
    }
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
    let Some(dir) = gdx_topo::fixture::reference_topologies() else {
        return;
    };
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
