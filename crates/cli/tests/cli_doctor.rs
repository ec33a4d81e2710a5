//! End-to-end tests of `gdx doctor` through the real binary.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::{gdx, refused, success_text};

use gdx_topo::fixture::h200x2_capture as h200_capture;

#[test]
fn list_names_the_stable_check_ids() {
    let out = gdx().args(["doctor", "--list"]).output().unwrap();
    let text = success_text(&out);
    for id in [
        "driver",
        "cuda",
        "nvml",
        "rdma-devices",
        "peermem",
        "dmabuf",
        "gpu-gdr-support",
        "memlock",
        "gpu-nic-distance",
        "numa",
        "acs",
        "iommu",
        "link-downtrain",
        "bar1",
        "mrrs",
        "p2p",
        "relaxed-ordering",
        "roce-gid",
        "mtu",
        "nccl-env",
        "cufile",
        "fabric-manager",
        "fabric",
    ] {
        assert!(
            text.lines()
                .any(|l| l.split_whitespace().next() == Some(id)),
            "check {id} missing from --list:\n{text}"
        );
    }
}

#[test]
fn runs_here_and_exits_0_or_1_as_documented() {
    let out = gdx()
        .args(["doctor", "--no-probe", "--json"])
        .output()
        .unwrap();
    let code = out.status.code().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let findings = v["findings"].as_array().unwrap();
    let any_fail = findings.iter().any(|f| f["status"] == "fail");
    assert_eq!(
        code,
        i32::from(any_fail),
        "exit code must be 1 exactly when a check fails"
    );
    for f in findings {
        assert!(f["id"].is_string() && f["subject"].is_string());
        assert!(["pass", "warn", "fail", "skip"].contains(&f["status"].as_str().unwrap()));
    }
    assert!(v["verdicts"].is_array());
}

#[test]
fn captured_h200_machine_shows_p2p_over_nv18() {
    let cap = h200_capture();
    assert!(cap.is_file(), "{} missing", cap.display());
    let out = gdx()
        .args(["doctor", "--json", "--root"])
        .arg(&cap)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let verdicts = v["verdicts"].as_array().unwrap();
    let pair = verdicts
        .iter()
        .find(|x| x["subject"] == "GPU0-GPU1")
        .expect("a GPU0-GPU1 verdict");
    assert_eq!(pair["path"], "p2p");
    assert_eq!(pair["class"], "NV18");
    // Live libraries describe this machine, not the captured one: those checks skip.
    let cuda = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == "cuda")
        .unwrap();
    assert_eq!(cuda["status"], "skip");
}

#[test]
fn missing_root_exits_2() {
    refused(
        gdx()
            .args(["doctor", "--root", "/definitely/not/here"])
            .assert(),
        "/definitely/not/here",
    );
}
