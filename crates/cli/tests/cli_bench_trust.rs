//! `gdx bench` / `gdx calibrate` output an engineer can trust (issue 13, items 5–7), through the
//! real binary: one size rule, one line per shared waiver, the summary table, `--compare
//! --fail-on-drop` exit codes, and the common flags. The mock backend keeps the figures
//! deterministic; nothing here asserts a speed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::{gdx, mock_compare, refused, success_text};

use predicates::prelude::*;
use serde_json::Value;

fn json_of(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON document ({e}); stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn cuda_absent() -> bool {
    gdx_sys::cuda::Cuda::load().is_err()
}

#[test]
fn bench_and_calibrate_read_gb_as_1e9_and_gib_as_2_30() {
    for cmd in ["bench", "calibrate"] {
        let out = gdx()
            .args([cmd, "--dry-run", "--json", "--size", "1GB,1GiB"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{cmd}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v = json_of(&out);
        assert_eq!(
            v["sizes_bytes"],
            serde_json::json!([1_000_000_000u64, 1_073_741_824u64]),
            "{cmd}"
        );
        gdx()
            .args([cmd, "--help"])
            .assert()
            .success()
            .stdout(predicate::str::contains("KB/MB/GB = 10^3/10^6/10^9"));
    }
    // The measured rows carry the same byte counts (mock backend: nothing is allocated).
    let out = gdx()
        .args([
            "bench",
            "--mock",
            "--json",
            "--path",
            "mock_host_to_host_fast",
            "--size",
            "1GB,1GiB",
            "--staged-chunk",
            "1MB",
        ])
        .output()
        .unwrap();
    let sizes: Vec<u64> = json_of(&out)["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["size_bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, vec![1_000_000_000, 1 << 30]);
    refused(
        gdx()
            .args(["bench", "--dry-run", "--staged-chunk", "1XB"])
            .assert(),
        "unknown unit",
    );
}

#[test]
fn cases_waived_for_one_reason_are_one_line_and_one_json_entry() {
    let out = gdx()
        .args(["bench", "--mock", "--size", "8"])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("GPU8")).collect();
    assert_eq!(
        lines,
        ["GPU8 cases: waived: GPU8 is not present (this machine has 2 GPUs) [2 cases]"],
        "{text}"
    );
    assert!(
        !text.contains("mock_host_to_gpu8"),
        "no row per invented case"
    );
    // One size only: mock_error fails after its first, so it passes here.
    assert!(text.contains("3 passed, 3 waived, 0 failed"), "{text}");

    let out = gdx()
        .args(["bench", "--mock", "--json", "--size", "8"])
        .output()
        .unwrap();
    let v = json_of(&out);
    let groups = v["waived"].as_array().unwrap();
    assert_eq!(groups.len(), 1, "{groups:?}");
    assert_eq!(groups[0]["scope"], "GPU8 cases");
    assert_eq!(groups[0]["cases"], 2);
    let keys: Vec<&str> = v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["key"].as_str().unwrap())
        .collect();
    assert!(!keys.iter().any(|k| k.contains("gpu8")), "{keys:?}");
    assert!(
        keys.contains(&"mock_waived"),
        "a case's own waiver stays a case"
    );
}

#[test]
fn without_a_cuda_driver_gpu_cases_are_one_line_with_the_fix() {
    // With a CUDA driver no GPU case is waived for its absence.
    if !gdx_base::testenv::precondition("no CUDA driver", cuda_absent()) {
        return;
    }
    let out = gdx()
        .args(["bench", "--path", "p2p,pinned-ce,staged", "--size", "8"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "waived is not failed");
    let text = String::from_utf8(out.stdout).unwrap();
    let waived: Vec<&str> = text.lines().filter(|l| l.contains("waived:")).collect();
    assert_eq!(waived.len(), 1, "{text}");
    assert!(
        waived[0].starts_with("GPU cases: waived: no CUDA driver (libcuda.so.1")
            && waived[0].contains("install the NVIDIA driver"),
        "{}",
        waived[0]
    );
    assert!(!text.contains("WAIVED"), "no case-by-case waivers: {text}");
    // The loader's search list appears once (the header's cuda line), not once per case.
    assert_eq!(
        text.matches("libcuda.so.1 unavailable: tried").count(),
        1,
        "{text}"
    );

    let out = gdx()
        .args(["bench", "--path", "p2p", "--size", "8", "--json"])
        .output()
        .unwrap();
    let v = json_of(&out);
    assert_eq!(v["cases"].as_array().unwrap().len(), 0, "no invented cases");
    let g = &v["waived"][0];
    assert_eq!(g["scope"], "GPU cases");
    assert!(g["reason"].as_str().unwrap().starts_with("no CUDA driver"));
    assert!(g["detail"].as_str().unwrap().contains("libcuda.so.1"));
    assert!(g["fix"].as_str().unwrap().contains("NVIDIA driver"));
}

/// A mock run's JSON with `f` applied to every row, written to `dir/name`.
fn crafted(dir: &std::path::Path, name: &str, f: impl Fn(&mut Value)) -> std::path::PathBuf {
    let out = gdx()
        .args([
            "bench",
            "--mock",
            "--json",
            "--path",
            "mock_host",
            "--size",
            "8,4KiB,1MiB",
        ])
        .output()
        .unwrap();
    let mut v = json_of(&out);
    for r in v["results"].as_array_mut().unwrap() {
        f(r);
    }
    let p = dir.join(name);
    std::fs::write(&p, v.to_string()).unwrap();
    p
}

fn compare_with(old: &std::path::Path, pct: &str) -> assert_cmd::assert::Assert {
    mock_compare(old, &["--fail-on-drop", pct]).assert()
}

#[test]
fn fail_on_drop_exits_1_on_a_drop_and_0_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let same = crafted(dir.path(), "same.json", |_| {});
    compare_with(&same, "5")
        .code(0)
        .stdout(predicate::str::contains("0 of 6 figures dropped"));

    // The earlier run was twice as fast: a bandwidth drop.
    let faster = crafted(dir.path(), "faster.json", |r| {
        r["bw_gbps"] = Value::from(r["bw_gbps"].as_f64().unwrap() * 2.0);
    });
    compare_with(&faster, "5")
        .code(1)
        .stdout(predicate::str::contains("DROP"))
        .stderr(predicate::str::contains("--fail-on-drop"));
    // Within a 60 % threshold it is not a drop.
    compare_with(&faster, "60").code(0);

    // The earlier run had half the latency: latency up is a drop too.
    let quicker = crafted(dir.path(), "quicker.json", |r| {
        r["lat_p50_us"] = Value::from(r["lat_p50_us"].as_f64().unwrap() / 2.0);
    });
    compare_with(&quicker, "5")
        .code(1)
        .stdout(predicate::str::contains("p50 µs"));
}

#[test]
fn figures_below_the_noise_floor_are_not_compared() {
    let dir = tempfile::tempdir().unwrap();
    // 0.00 GB/s in the earlier run: no ratio, no drop.
    let zero = crafted(dir.path(), "zero.json", |r| {
        r["bw_gbps"] = Value::from(0.0);
    });
    compare_with(&zero, "5")
        .code(0)
        .stdout(predicate::str::contains("0 of 3 figures dropped"));
}

#[test]
fn a_gate_that_compares_nothing_does_not_pass() {
    let dir = tempfile::tempdir().unwrap();
    // Other sizes than this run's: no figure in common.
    let other = crafted(dir.path(), "other.json", |r| {
        r["size_bytes"] = Value::from(r["size_bytes"].as_u64().unwrap() + 1);
    });
    compare_with(&other, "5")
        .code(1)
        .stderr(predicate::str::contains("nothing was compared"));
}

#[test]
fn list_says_when_the_gpu_cases_are_listed_for_gpus_that_are_not_there() {
    if !gdx_base::testenv::precondition("no CUDA driver", cuda_absent()) {
        return;
    }
    gdx()
        .args(["bench", "--list"])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "note: GPU cases are listed for GPU0 and GPU1; this machine has 0 GPUs, no CUDA driver",
        ));
}

#[test]
fn quiet_prints_only_the_summary_and_color_follows_the_flag() {
    let out = gdx()
        .args([
            "bench",
            "--mock",
            "-q",
            "--path",
            "mock_host_to_host_fast",
            "--size",
            "8,1MiB",
        ])
        .output()
        .unwrap();
    let text = success_text(&out);
    assert!(text.starts_with("summary\n"), "{text}");
    assert!(
        !text.contains("#bytes") && !text.contains("method:"),
        "{text}"
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let colored = |when: &str| {
        let out = gdx()
            .args([
                "bench",
                "--mock",
                "--color",
                when,
                "--path",
                "mock_host",
                "--size",
                "8",
            ])
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    assert!(colored("always").contains("\x1b[32m"), "ok is green");
    assert!(!colored("never").contains("\x1b["));
    assert!(!colored("auto").contains("\x1b["), "not a terminal");
    gdx()
        .args(["calibrate", "--color", "sometimes"])
        .assert()
        .code(2);
}

#[test]
fn a_pair_naming_a_missing_gpu_says_so() {
    gdx()
        .args(["bench", "--mock", "--pair", "0,5"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "GPU5 is not present (this machine has 2 GPUs)",
        ))
        .stderr(predicate::str::contains("no case left").not());
    refused(gdx().args(["bench", "--pair", "0,97"]).assert(), "GPU97")
        .stderr(predicate::str::contains("not present (this machine has"));
}

#[test]
fn calibrate_keeps_input_and_output_apart_and_prints_json() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("cal.json");
    std::fs::write(
        &f,
        r#"{"schema_version":1,"source":"test","crossovers":[],"staged_chunk_bytes":8388608}"#,
    )
    .unwrap();
    let out = gdx()
        .args(["calibrate", "--json", "--show"])
        .arg(&f)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(json_of(&out)["staged_chunk_bytes"], 8388608);
    // -o is only ever written: a dry run names it and touches nothing.
    let target = dir.path().join("new.json");
    gdx()
        .args(["calibrate", "--dry-run", "-o"])
        .arg(&target)
        .assert()
        .success()
        .stdout(predicate::str::contains("would write"));
    assert!(!target.exists());
    gdx()
        .args(["calibrate", "-q", "--show"])
        .arg(&f)
        .assert()
        .success()
        .stdout(predicate::str::is_empty());
}
