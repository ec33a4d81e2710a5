//! `gdx bench --path file` through the real binary: the file cases are opt-in, file → host runs
//! anywhere (and verifies), and without a GPU the GPU cases are one waived group with the reason.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::gdx;

use serde_json::Value;

fn has_gpu() -> bool {
    gdx_sys::cuda::Cuda::load()
        .ok()
        .and_then(|c| c.device_count().ok())
        .is_some_and(|n| n > 0)
}

#[test]
fn file_bench_runs_file_to_host_and_waives_gpu_rows_without_a_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let out = gdx()
        .args([
            "bench",
            "--path",
            "file",
            "--size",
            "1MiB",
            "--json",
            "--file-dir",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is one JSON document ({e}); stderr: {stderr}"));
    assert_eq!(out.status.code(), Some(0), "stderr: {stderr}");

    let results = v["results"].as_array().unwrap();
    let host = results
        .iter()
        .find(|r| r["key"] == "file_to_host_file_staged")
        .expect("the file → host row");
    assert_eq!(host["path"], "file");
    assert_eq!(host["src"], "file");
    assert_eq!(host["dst"], "host");
    assert_eq!(host["size_bytes"], 1 << 20);
    assert_eq!(host["status"], "passed", "{host}");
    assert_eq!(host["verified"], true);
    assert!(host["bw_gbps"].as_f64().unwrap() > 0.0);
    let note = host["note"].as_str().unwrap();
    assert!(note.contains("page cache"), "{note}");

    let cases = v["cases"].as_array().unwrap();
    assert!(cases.iter().all(|c| c["path"] == "file"), "only file cases");
    let gpu_keys = [
        "file_to_gpu0_gds",
        "file_to_gpu0_file_staged",
        "file_to_gpu0_naive",
        "gpu0_to_file_gds",
        "gpu0_to_file_file_staged",
        "gpu0_to_file_naive",
    ];
    if has_gpu() {
        for key in gpu_keys {
            assert!(cases.iter().any(|c| c["key"] == key), "case {key} listed");
        }
    } else {
        // Without a GPU the six GPU cases are one waived group, not six waived cases.
        assert!(cases
            .iter()
            .all(|c| !gpu_keys.contains(&c["key"].as_str().unwrap_or(""))));
        let groups = v["waived"].as_array().unwrap();
        assert_eq!(groups.len(), 1, "{groups:?}");
        assert_eq!(groups[0]["scope"], "GPU cases");
        assert_eq!(groups[0]["cases"], gpu_keys.len());
        assert!(groups[0]["reason"]
            .as_str()
            .unwrap()
            .starts_with("no CUDA driver"));
    }
    // The scratch files are removed.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn plain_bench_list_shows_file_cases_but_a_default_run_leaves_them_out() {
    let out = gdx().args(["bench", "--list"]).output().unwrap();
    let list = String::from_utf8_lossy(&out.stdout);
    assert!(list.contains("file_to_host_file_staged"), "{list}");
    assert!(list.contains("opt-in"), "{list}");

    // A GPU-prefix selection does not pull in the file cases.
    let out = gdx()
        .args(["bench", "--path", "memcpy", "--size", "4KiB", "--json"])
        .args(["--iters", "3"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["path"] != "file"));
}

/// `gdx cp --bench FILE` is an alias: it says what it runs, and the output is gdx bench's one
/// JSON schema (the old report of its own is gone).
#[test]
fn cp_bench_is_an_alias_of_bench_path_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = gdx()
        .args(["cp", "--bench"])
        .arg(dir.path().join("scratch.bin"))
        .args(["--size", "64KiB", "--samples", "1", "--json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("note: --bench is now `gdx bench --path file_to_host,file_to_gpu0_,gpu0_to_file --file-dir"),
        "{stderr}"
    );
    assert_eq!(out.status.code(), Some(0), "stderr: {stderr}");
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is one JSON document ({e}); stderr: {stderr}"));
    assert!(v["schema_version"].is_number(), "{v}");
    let host = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"] == "file_to_host_file_staged")
        .expect("the file → host row");
    assert_eq!(host["size_bytes"], 65536);
    assert_eq!(host["verified"], true);
    // Only GPU 0's cases were asked for.
    let listed = |key: &str| {
        v["results"]
            .as_array()
            .unwrap()
            .iter()
            .chain(v["cases"].as_array().unwrap())
            .any(|r| r["key"].as_str().is_some_and(|k| k.contains(key)))
    };
    assert!(!listed("gpu1"), "{v}");
}
