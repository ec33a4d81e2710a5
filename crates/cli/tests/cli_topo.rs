//! End-to-end tests of `gdx topo` through the real binary.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::{gdx, refused, shows, success_json};
use predicates::prelude::*;
use std::path::PathBuf;

fn topologies() -> PathBuf {
    gdx_topo::fixture::reference_topologies()
}

#[test]
fn help_explains_every_subcommand() {
    gdx()
        .arg("--help")
        .assert()
        .success()
        .stdout(predicate::str::contains("topo"));
    shows(
        gdx().args(["topo", "--help"]).assert(),
        &["--root", "--xml", "--capture", "--export-xml"],
    );
}

#[test]
fn live_machine_prints_a_report_and_exits_0() {
    shows(
        gdx().arg("topo").assert(),
        &["Source: live machine", "Devices:"],
    );
}

#[test]
fn missing_root_is_a_clear_error_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-machine");
    gdx()
        .args(["topo", "--root"])
        .arg(&missing)
        .assert()
        .code(2)
        .stderr(predicate::str::starts_with("gdx: error:"))
        .stderr(predicate::str::contains("no-such-machine"));
}

#[test]
fn empty_root_is_a_clear_error_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    refused(
        gdx().args(["topo", "--root"]).arg(dir.path()).assert(),
        "sys/bus/pci/devices",
    );
}

#[test]
fn malformed_xml_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("broken.xml");
    std::fs::write(
        &f,
        "<system version=\"1\">\n  <cpu numaid=\"0\">\n    <pci busid=",
    )
    .unwrap();
    refused(
        gdx().args(["topo", "--xml"]).arg(&f).assert(),
        "broken.xml:3",
    );
}

#[test]
fn json_contract_from_nccl_xml() {
    let dir = topologies();
    let out = gdx()
        .args(["topo", "--json", "--xml"])
        .arg(dir.join("nccl_topo_azure_ndv5-topo.xml"))
        .output()
        .unwrap();
    let v = success_json(&out);
    let devices = v["devices"].as_array().unwrap();
    assert_eq!(devices.iter().filter(|d| d["kind"] == "gpu").count(), 8);
    assert_eq!(devices[0]["label"], "GPU0");
    assert_eq!(devices[0]["bdf"], "0001:00:00.0");
    assert!(devices[0].get("numa").is_some());
    assert!(devices[0].get("name").is_some());
    // ND H100 v5: each GPU sits under one switch with its own NIC, other socket is SYS.
    assert_eq!(v["matrix"]["GPU0"]["GPU0"], "X");
    assert_eq!(v["matrix"]["GPU0"]["NIC0"], "PIX");
    assert_eq!(v["matrix"]["GPU0"]["NIC7"], "SYS");
}

#[test]
fn export_xml_round_trips_through_the_cli() {
    let dir = topologies();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("p4d.xml");
    gdx()
        .args(["topo", "--xml"])
        .arg(dir.join("nccl_topo_aws_p4d-24xl-topo.xml"))
        .arg("--export-xml")
        .arg(&out)
        .assert()
        .success();
    let a = gdx()
        .args(["topo", "--json", "--xml"])
        .arg(dir.join("nccl_topo_aws_p4d-24xl-topo.xml"))
        .output()
        .unwrap();
    let b = gdx()
        .args(["topo", "--json", "--xml"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(b.status.success(), "{}", String::from_utf8_lossy(&b.stderr));
    let (va, vb): (serde_json::Value, serde_json::Value) = (
        serde_json::from_slice(&a.stdout).unwrap(),
        serde_json::from_slice(&b.stdout).unwrap(),
    );
    assert_eq!(va["matrix"], vb["matrix"]);
    assert_eq!(va["matrix"]["GPU0"]["GPU1"], "PIX");
}

#[test]
fn capture_then_root_gives_the_same_matrix() {
    let tmp = tempfile::tempdir().unwrap();
    let cap = tmp.path().join("here.tar.gz");
    gdx()
        .args(["topo", "--capture"])
        .arg(&cap)
        .assert()
        .success();
    assert!(cap.is_file());
    let live = gdx().args(["topo", "--json"]).output().unwrap();
    let again = gdx()
        .args(["topo", "--json", "--root"])
        .arg(&cap)
        .output()
        .unwrap();
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    let (a, b): (serde_json::Value, serde_json::Value) = (
        serde_json::from_slice(&live.stdout).unwrap(),
        serde_json::from_slice(&again.stdout).unwrap(),
    );
    assert_eq!(a["matrix"], b["matrix"]);
    assert_eq!(
        a["devices"].as_array().unwrap().len(),
        b["devices"].as_array().unwrap().len()
    );
}
