//! A captured machine is judged on its own facts: the environment its capture recorded (never
//! the analysing shell's), evidence that names files inside the capture (never a deleted
//! temporary folder), and an archive that cannot point the doctor at this machine.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::gdx;

use gdx_topo::fixture::h200x2_capture as h200_capture;
use std::path::{Path, PathBuf};

fn doctor_json(root: &Path, env: &[(&str, &str)]) -> (serde_json::Value, i32) {
    let mut c = gdx();
    c.args(["doctor", "--json", "--no-probe", "--root"])
        .arg(root);
    for k in ["NCCL_P2P_DISABLE", "NCCL_IB_DISABLE", "NCCL_NET"] {
        c.env_remove(k);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (v, out.status.code().unwrap_or(-1))
}

fn findings<'a>(v: &'a serde_json::Value, id: &str) -> Vec<&'a serde_json::Value> {
    v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["id"] == id)
        .collect()
}

/// The H200 capture unpacked to a folder by `gdx topo --capture` (a capture of a capture
/// keeps what the source recorded: here, no environment).
fn h200_folder(dir: &Path) -> PathBuf {
    let out = dir.join("h200");
    gdx()
        .args(["topo", "--root"])
        .arg(h200_capture())
        .arg("--capture")
        .arg(&out)
        .assert()
        .success();
    out
}

#[test]
fn the_live_shells_nccl_variables_do_not_judge_a_capture() {
    let (v, code) = doctor_json(&h200_capture(), &[("NCCL_P2P_DISABLE", "1")]);
    for f in findings(&v, "nccl-env") {
        assert_ne!(f["status"], "fail", "{f}");
    }
    let pair = v["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["subject"] == "GPU0-GPU1")
        .expect("GPU0-GPU1 verdict");
    assert_eq!(pair["path"], "p2p", "{pair}");
    assert_ne!(code, 2);
    assert!(
        v["header"]["environment"]
            .as_str()
            .unwrap()
            .contains("not captured"),
        "{}",
        v["header"]
    );
    assert!(
        v["header"]["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().contains("environment not captured")),
        "{}",
        v["header"]
    );
}

#[test]
fn the_recorded_environment_is_judged() {
    let d = tempfile::tempdir().unwrap();
    let cap = h200_folder(d.path());
    std::fs::write(
        cap.join("gdx/env.json"),
        r#"{"vars":{"NCCL_P2P_DISABLE":"1"},"redacted":[]}"#,
    )
    .unwrap();
    // The analysing shell has nothing set; the captured machine had P2P disabled.
    let (v, code) = doctor_json(&cap, &[]);
    let f = findings(&v, "nccl-env");
    let bad = f
        .iter()
        .find(|f| f["subject"] == "NCCL_P2P_DISABLE")
        .expect("NCCL_P2P_DISABLE finding");
    assert_eq!(bad["status"], "fail");
    assert!(
        bad["evidence"][0]
            .as_str()
            .unwrap()
            .starts_with("capture:gdx/env.json: NCCL_P2P_DISABLE=1"),
        "{bad}"
    );
    assert_eq!(code, 1);
    assert_eq!(v["header"]["environment"], "capture:gdx/env.json");
}

#[test]
fn capture_records_the_shells_nccl_gdx_cuda_variables() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("live");
    gdx()
        .args(["topo", "--capture"])
        .arg(&out)
        .env("NCCL_P2P_DISABLE", "1")
        .env("CUDA_VISIBLE_DEVICES", "0,1")
        .env("GDX_SECRET_KEY", "hunter2")
        .env("UNRELATED_VAR", "x")
        .assert()
        .success();
    let text = std::fs::read_to_string(out.join("gdx/env.json")).unwrap();
    let env: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(env["vars"]["NCCL_P2P_DISABLE"], "1");
    assert_eq!(env["vars"]["CUDA_VISIBLE_DEVICES"], "0,1");
    assert!(env["vars"].get("UNRELATED_VAR").is_none(), "{text}");
    assert!(!text.contains("hunter2"), "a secret was recorded: {text}");
    assert_eq!(env["redacted"][0], "GDX_SECRET_KEY");
    // The doctor judges what the capture recorded, with nothing set in its own shell.
    let (v, code) = doctor_json(&out, &[]);
    let f = findings(&v, "nccl-env");
    assert!(
        f.iter()
            .any(|f| f["subject"] == "NCCL_P2P_DISABLE" && f["status"] == "fail"),
        "{f:?}"
    );
    assert_eq!(code, 1);
}

#[test]
fn evidence_names_files_inside_the_archive() {
    let (v, _) = doctor_json(&h200_capture(), &[]);
    let text = v.to_string();
    let tmp = std::env::temp_dir().display().to_string();
    assert!(
        !text.contains("gdx-root-") && !text.contains(&format!("{tmp}/gdx")),
        "a temporary folder is named in the report"
    );
    let evidence: Vec<&str> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|f| f["evidence"].as_array().unwrap().iter())
        .filter_map(|e| e.as_str())
        .collect();
    assert!(
        evidence.iter().any(|e| e.starts_with("capture:sys/")),
        "{evidence:#?}"
    );
    // The source names the archive, not the folder it was unpacked into (the archive itself
    // may well live under the temp dir, e.g. a checkout in /tmp).
    let topology = v["header"]["topology"].as_str().unwrap();
    assert!(
        topology.contains("h200x2-capture.tar.gz") && !topology.contains("gdx-root-"),
        "{topology}"
    );
}

#[test]
fn an_archive_that_points_at_this_machine_is_refused() {
    let d = tempfile::tempdir().unwrap();
    // A one-entry archive, `cap -> /`, made with the system's tar as an attacker would.
    std::os::unix::fs::symlink("/", d.path().join("cap")).unwrap();
    let a = d.path().join("top.tar.gz");
    let st = std::process::Command::new("tar")
        .arg("-czf")
        .arg(&a)
        .arg("-C")
        .arg(d.path())
        .arg("cap")
        .status()
        .unwrap();
    assert!(st.success());
    let tmp = d.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let out = gdx()
        .args(["doctor", "--no-probe", "--root"])
        .arg(&a)
        .env("TMPDIR", &tmp)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("symlink at the top level"), "{err}");
    assert_eq!(
        std::fs::read_dir(&tmp).unwrap().count(),
        0,
        "left in TMPDIR"
    );
}
