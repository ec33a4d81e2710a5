//! `gdx topo` output a platform engineer trusts: NICs named by RDMA device or netdev, the
//! matrix showing RDMA NICs (all with --all-nics), one NUMA answer per device, a P2P matrix
//! from NVML's facts, `schema_version`, XML inputs worded as XML, and the flags every printing
//! subcommand shares (-q, --color, --json).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::{gdx, success_json, success_text};
use gdx_topo::fixture::h200x2_capture as h200_capture;
use gdx_topo::fixture::{RdmaPort, SysfsFixture};
use std::path::Path;

/// A VM-like machine: one NUMA node the platform does not report (numa_node -1), a GPU, an
/// RDMA NIC `mlx5_0` and a plain virtio NIC `eth0`.
fn machine(dir: &Path) {
    let mut f = SysfsFixture::new(dir);
    f.numa_node(0, "0-31");
    let hb = f.host_bridge("0000:00", None);
    f.gpu(&hb, "0000:00:06.0");
    let ib = f.nic(&hb, "0000:00:07.0");
    f.rdma(&ib, "mlx5_0", &[RdmaPort::infiniband(1)]);
    let virtio = f.function(&hb, "0000:00:03.0", 0x020000, 0x1af4, 0x1041, 0);
    f.netdev(&virtio, "eth0", None);
}

fn json(args: &[&str], root: &Path) -> serde_json::Value {
    let out = gdx()
        .arg("topo")
        .args(args)
        .arg("--root")
        .arg(root)
        .arg("--json")
        .output()
        .unwrap();
    success_json(&out)
}

#[test]
fn rdma_nics_by_default_all_nics_adds_the_rest_and_names_are_never_bare_ids() {
    let d = tempfile::tempdir().unwrap();
    machine(d.path());
    let v = json(&[], d.path());
    assert_eq!(v["schema_version"], 1);
    let names: Vec<(String, String)> = v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["label"].as_str().unwrap().to_string(),
                d["name"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert!(
        names.contains(&("NIC0".into(), "mlx5_0".into())),
        "{names:?}"
    );
    assert!(names.contains(&("NIC1".into(), "eth0".into())), "{names:?}");
    assert!(!v.to_string().contains("\"1af4:1041\""));
    let row = v["matrix"]["GPU0"].as_object().unwrap();
    assert!(
        row.contains_key("NIC0") && !row.contains_key("NIC1"),
        "{row:?}"
    );
    assert_eq!(v["matrix_nics"], "rdma");
    assert!(
        v["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().contains("--all-nics")),
        "{}",
        v["notes"]
    );
    let all = json(&["--all-nics"], d.path());
    assert!(
        all["matrix"]["GPU0"].get("NIC1").is_some(),
        "{}",
        all["matrix"]
    );
    assert_eq!(all["matrix_nics"], "all");
}

#[test]
fn numa_columns_agree_between_matrix_and_device_table() {
    let d = tempfile::tempdir().unwrap();
    machine(d.path());
    let out = gdx()
        .args(["topo", "--color", "never", "--root"])
        .arg(d.path())
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    // Matrix row: ... CPU Affinity 0-31, NUMA Affinity 0.
    let row = text
        .lines()
        .find(|l| l.starts_with("GPU0  X"))
        .expect("matrix row");
    assert!(row.ends_with("0-31          0"), "{row}");
    let dev = text
        .lines()
        .find(|l| l.starts_with("GPU0 ") && l.contains("0000:00:06.0"))
        .expect("device row");
    let cols: Vec<&str> = dev.split_whitespace().collect();
    assert!(!dev.contains("N/A"), "device table says N/A: {dev}\n{text}");
    assert!(cols.contains(&"0"), "{dev}");
    // JSON says the same, beside the platform's raw answer (-1: null).
    let v = json(&[], d.path());
    assert_eq!(v["numa_affinity"]["GPU0"], serde_json::json!([0]));
    let gpu0 = v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["label"] == "GPU0")
        .unwrap();
    assert!(gpu0["numa"].is_null(), "{gpu0}");
}

#[test]
fn p2p_matrix_from_a_captures_nvml_facts() {
    let out = gdx()
        .args(["topo", "--p2p", "--color", "never", "--root"])
        .arg(h200_capture())
        .output()
        .unwrap();
    let text = success_text(&out);
    assert!(text.contains("GPU0  X     OK"), "{text}");
    assert!(text.contains("CNS  = Chipset not supported"), "{text}");
    let out = gdx()
        .args(["topo", "--p2p", "--json", "--root"])
        .arg(h200_capture())
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["p2p"]["GPU0"]["GPU1"], "OK");
    assert_eq!(v["p2p"]["GPU1"]["GPU1"], "X");
}

#[test]
fn p2p_without_nvml_facts_says_nvml_is_not_available() {
    let d = tempfile::tempdir().unwrap();
    machine(d.path());
    let out = gdx()
        .args(["topo", "--p2p", "--root"])
        .arg(d.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("NVML not available"), "{err}");
    assert!(err.contains("gdx/nvml.json"), "{err}");
}

#[test]
fn xml_input_errors_speak_of_xml() {
    let out = gdx().args(["topo", "--xml", "/dev/zero"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot read as an NCCL topology file: a device, not a regular file"),
        "{err}"
    );
    let d = tempfile::tempdir().unwrap();
    let out = gdx()
        .args(["topo", "--xml"])
        .arg(d.path().join("nope.xml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("NCCL_TOPO_FILE-format XML"), "{err}");
    // Said once, not doubled by a context that repeats the path.
    assert_eq!(err.matches("nope.xml").count(), 1, "{err}");
}

#[test]
fn xml_without_nvlink_marks_gpu_pairs_in_text_and_json() {
    let dir = gdx_topo::fixture::reference_topologies();
    let f = dir.join("nccl_topo_azure_ndv5-topo.xml");
    let out = gdx()
        .args(["topo", "--json", "--xml"])
        .arg(&f)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["gpu_gpu_classes"],
        "PCIe only: this file carries no NVLink facts"
    );
    let out = gdx()
        .args(["topo", "--color", "never", "--xml"])
        .arg(&f)
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("PHB*"), "{text}");
    assert!(
        text.contains("GPU\u{2194}GPU: PCIe only: this file carries no NVLink facts"),
        "{text}"
    );
    // A file with no GPUs at all (AWS p5 lists switches and bus ids only).
    let out = gdx()
        .args(["topo", "--xml"])
        .arg(dir.join("nccl_topo_aws_p5-48xl-topo.xml"))
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("No GPUs and no NICs in this file"), "{text}");
    assert!(!text.contains("/sys/class"), "{text}");
}

#[test]
fn quiet_and_color_on_topo_and_doctor() {
    let d = tempfile::tempdir().unwrap();
    machine(d.path().join("m").as_path());
    let cap = d.path().join("cap");
    let out = gdx()
        .args(["topo", "-q", "--root"])
        .arg(d.path().join("m"))
        .arg("--capture")
        .arg(&cap)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = gdx()
        .args(["topo", "--root"])
        .arg(d.path().join("m"))
        .arg("--capture")
        .arg(d.path().join("cap2"))
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("captured"));

    let topo = |when: &str| {
        gdx()
            .args(["topo", "--color", when, "--root"])
            .arg(&cap)
            .output()
            .unwrap()
            .stdout
    };
    assert!(String::from_utf8(topo("always")).unwrap().contains("\x1b["));
    assert!(!String::from_utf8(topo("never")).unwrap().contains("\x1b["));

    let doctor = |args: &[&str]| {
        let out = gdx()
            .args(["doctor", "--no-probe", "--root"])
            .arg(&cap)
            .args(args)
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    let full = doctor(&["--color", "never"]);
    let quiet = doctor(&["-q", "--color", "never"]);
    assert!(full.contains("PASS") || full.contains("SKIP"), "{full}");
    assert!(
        !quiet.contains("PASS") && !quiet.contains("SKIP"),
        "{quiet}"
    );
    assert!(!quiet.contains("GPU-direct readiness"), "{quiet}");
    assert!(quiet.contains(": exit "), "{quiet}");
    assert!(doctor(&["--color", "always"]).contains("\x1b["));
}
