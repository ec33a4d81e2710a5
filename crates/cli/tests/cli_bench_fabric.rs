//! `gdx bench --path fabric` through the real binary over libfabric's tcp provider (bound to
//! 127.0.0.1 only): the loopback pair in one process, and against a `gdx serve` with fabric
//! enabled (`--peer`). Rows must exist with verified bytes; no figure is judged (no timing
//! asserts).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use assert_cmd::Command;
use common::{gdx, gdx_serve, spawn_lines};
use serde_json::Value;

const SMALL: &[&str] = &[
    "--size",
    "8,64KiB",
    "--duration",
    "20ms",
    "--max-samples",
    "20",
    "--json",
];

fn rows<'a>(v: &'a Value, key: &str) -> Vec<&'a Value> {
    v["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["key"] == key)
        .collect()
}

fn run_json(cmd: &mut Command) -> Value {
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.code() == Some(0),
        "exit {:?}\nstdout: {stdout}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn assert_verified(v: &Value, key: &str, sizes: &[u64]) {
    let r = rows(v, key);
    let got: Vec<u64> = r
        .iter()
        .map(|r| r["size_bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(got, sizes, "{key}: {r:#?}");
    for row in r {
        assert_eq!(row["verified"], true, "{row:#}");
        assert_eq!(row["status"], "passed", "{row:#}");
        assert!(row["bw_gbps"].as_f64().is_some_and(|b| b > 0.0), "{row:#}");
        assert!(row["msg_rate_mops"].as_f64().is_some(), "{row:#}");
    }
}

#[test]
fn fabric_over_the_tcp_provider_beside_gdx_tcp() {
    let v = run_json(
        gdx()
            .args(["bench", "--path", "fabric", "--provider", "tcp"])
            .args(SMALL)
            .env_remove("GDX_TRANSPORTS"),
    );
    assert_verified(&v, "host_to_host_fabric", &[8, 65536]);
    let note = rows(&v, "host_to_host_fabric")[0]["note"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(note.contains("tcp"), "{note}");
    assert!(note.contains("the tcp loopback floor"), "{note}");
    // gdx's own tcp transport, added as the same-run comparison.
    assert_verified(&v, "host_to_host_tcp", &[8, 65536]);
    // The header names the provider.
    let notes = v["header"].to_string();
    assert!(notes.contains("fabric cases: provider tcp"), "{notes}");
    // GPU memory: waived with the reason (no CUDA here, or no FI_HMEM), never measured.
    assert!(rows(&v, "gpu0_to_host_fabric").is_empty());
    let waived_case = v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["key"] == "gpu0_to_host_fabric");
    let grouped = v["waived"]
        .as_array()
        .unwrap()
        .iter()
        .any(|g| g["scope"] == "GPU cases");
    assert!(
        grouped || waived_case.is_some_and(|c| c["status"] == "waived"),
        "{:#}",
        v["cases"]
    );
}

#[test]
fn a_provider_without_fabric_cases_is_refused() {
    let out = gdx()
        .args(["bench", "--path", "host_to_host_tcp", "--provider", "tcp"])
        .args(["--dry-run"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--path fabric"), "{err}");
    let bad = gdx()
        .args(["bench", "--path", "fabric", "--provider", "tcp;ofi_rxm"])
        .output()
        .unwrap();
    assert_ne!(bad.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("provider name"));
}

#[test]
fn unknown_provider_waives_the_fabric_cases_naming_it() {
    let v = run_json(
        gdx()
            .args(["bench", "--path", "host_to_host_fabric"])
            .args(["--provider", "nosuchprov"])
            .args(SMALL),
    );
    assert!(rows(&v, "host_to_host_fabric").is_empty());
    let w = v["waived"].to_string();
    assert!(w.contains("nosuchprov"), "{w}");
}

#[test]
fn fabric_against_a_gdx_serve_peer() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    gdx_engine::Secret::generate()
        .unwrap()
        .write_file(&secret)
        .unwrap();
    let (_server, mut lines) = spawn_lines(
        gdx_serve()
            .args(["--listen", "127.0.0.1:0", "--size", "1MiB"])
            .arg("--secret-file")
            .arg(&secret)
            .env("GDX_TRANSPORTS", "tcp,fabric")
            .env("GDX_FABRIC_PROVIDER", "tcp"),
    );
    let line = lines
        .by_ref()
        .map(|l| l.unwrap())
        .find(|l| l.starts_with("GDX_SERVE "))
        .expect("GDX_SERVE line");
    let addr = line
        .split_whitespace()
        .find_map(|f| f.strip_prefix("addr="))
        .unwrap()
        .to_string();
    let v = run_json(
        gdx()
            .args([
                "bench",
                "--path",
                "fabric",
                "--provider",
                "tcp",
                "--peer",
                &addr,
            ])
            .args(SMALL)
            .env("GDX_SECRET_FILE", &secret),
    );
    assert_verified(&v, "host_to_remote_host_fabric", &[8, 65536]);
    assert_verified(&v, "host_to_remote_tcp", &[8, 65536]);
}
