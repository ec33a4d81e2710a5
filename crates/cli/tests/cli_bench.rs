//! End-to-end tests of `gdx bench` and `gdx calibrate` through the real binary. The mock
//! backend (`--mock`) makes the output deterministic: these tests check shape, flags and exit
//! codes, never speed. One test runs the real loopback host paths at two tiny sizes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::{gdx, mock_compare, refused, shows, success_json, success_text};

use predicates::prelude::*;
use serde_json::Value;

/// The fields every result row has, per docs/bench/README.md.
const ROW_FIELDS: &[&str] = &[
    "key",
    "path",
    "src",
    "dst",
    "bidir",
    "size_bytes",
    "bw_gbps",
    "msg_rate_mops",
    "lat_p50_us",
    "lat_p99_us",
    "cpu_s_per_gb",
    "gpu_util_pct",
    "ceiling_gbps",
    "ceiling_basis",
    "pct_of_ceiling",
    "iters",
    "samples_s",
    "lat_samples_s",
    "verified",
    "status",
    "note",
];

fn mock_json(extra: &[&str]) -> (Value, i32) {
    let mut args = vec!["bench", "--mock", "--json", "--size", "8,4KiB,1MiB"];
    args.extend_from_slice(extra);
    let out = gdx().args(&args).output().unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).expect("stdout is one JSON document");
    (v, out.status.code().unwrap_or(-1))
}

#[test]
fn json_has_the_documented_shape() {
    let (v, code) = mock_json(&["--path", "mock_host_to_host_fast,mock_gpu0_to_gpu1_p2p"]);
    assert_eq!(code, 0);
    assert_eq!(v["schema_version"], 1);
    for f in [
        "tool",
        "gdx_version",
        "host",
        "command_line",
        "method",
        "devices",
    ] {
        assert!(v["header"].get(f).is_some(), "header.{f} missing");
    }
    assert_eq!(
        v["header"]["method"]["bandwidth_unit"],
        "GB/s = 1e9 bytes/s"
    );
    let rows = v["results"].as_array().unwrap();
    assert_eq!(rows.len(), 6);
    for r in rows {
        for f in ROW_FIELDS {
            assert!(r.get(*f).is_some(), "results[].{f} missing in {r}");
        }
        assert_eq!(r["status"], "passed");
        assert_eq!(r["verified"], true);
        assert!(r["bw_gbps"].as_f64().unwrap() > 0.0);
        assert!(r["ceiling_gbps"].as_f64().is_some());
    }
    let big = rows
        .iter()
        .find(|r| r["key"] == "mock_gpu0_to_gpu1_p2p" && r["size_bytes"] == 1048576)
        .unwrap();
    // 40 GB/s peak, half at 1 MiB: 20 GB/s, 40% of the 50 GB/s mock ceiling.
    assert!((big["bw_gbps"].as_f64().unwrap() - 20.0).abs() < 1e-3);
    assert!((big["pct_of_ceiling"].as_f64().unwrap() - 40.0).abs() < 1e-3);
    assert_eq!(v["cases"].as_array().unwrap().len(), 2);
}

#[test]
fn waived_and_failed_cases_are_reported_and_set_the_exit_code() {
    let (v, code) = mock_json(&[]);
    assert_eq!(code, 1, "a failed case makes the exit code 1");
    let cases = v["cases"].as_array().unwrap();
    let by = |k: &str| cases.iter().find(|c| c["key"] == k).unwrap().clone();
    assert_eq!(by("mock_waived")["status"], "waived");
    assert!(by("mock_waived")["reason"]
        .as_str()
        .unwrap()
        .contains("always waived"));
    assert_eq!(by("mock_error")["status"], "error");
    assert!(by("mock_error")["reason"]
        .as_str()
        .unwrap()
        .contains("injected failure"));
    assert_eq!(by("mock_host_to_host_fast")["status"], "passed");
    // The failing case keeps the row it measured before failing.
    assert!(v["results"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["key"] == "mock_error" && r["size_bytes"] == 8));
}

#[test]
fn table_csv_and_plot() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("r.csv");
    let svg = dir.path().join("r.svg");
    let json = dir.path().join("r.json");
    let md = dir.path().join("r.md");
    let out = gdx()
        .args(["bench", "--mock", "--path", "mock_host", "--size", "8:1MiB"])
        .arg("--export-csv")
        .arg(&csv)
        .arg("--export-md")
        .arg(&md)
        .arg("--export-json")
        .arg(&json)
        .arg("--plot")
        .arg(&svg)
        .output()
        .unwrap();
    let text = success_text(&out);
    assert!(text.contains("gdx bench"));
    assert!(text.contains("GB/s = 1e9 bytes/s"));
    assert!(text.contains("mock_host_to_host_fast [mock, host → host]"));
    assert!(text.contains("#bytes"));
    assert!(text.contains("ceiling 50.00 GB/s (mock ceiling)"));
    // The prefix also selects mock_host_to_gpu8, waived in a group of its own.
    assert!(text.contains("1 passed, 1 waived, 0 failed"), "{text}");
    assert!(text.contains("Mop/s"));
    // The closing summary: peak 9.41 GB/s at 1 MiB, p50 at 8 B.
    let summary = text.split("\nsummary\n").nth(1).expect("a summary table");
    let line = summary
        .lines()
        .find(|l| l.contains("mock_host_to_host_fast"))
        .unwrap();
    assert!(
        line.contains("9.41") && line.contains("1 MiB") && line.contains("8 B"),
        "{line}"
    );
    let csv = std::fs::read_to_string(&csv).unwrap();
    let mut lines = csv.lines();
    assert!(lines
        .next()
        .unwrap()
        .starts_with("key,path,src,dst,bidir,size_bytes,bw_gbps"));
    assert_eq!(lines.count(), 10);
    // The Markdown table: the same ten rows under a header and a rule.
    let md = std::fs::read_to_string(&md).unwrap();
    let table: Vec<&str> = md.lines().filter(|l| l.starts_with('|')).collect();
    assert_eq!(table.len(), 12, "{md}");
    assert!(table[0].starts_with("| key | path | src | dst |"), "{md}");
    assert!(table[2].contains("mock_host_to_host_fast"), "{md}");
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("mock_host_to_host_fast"));
    assert!(serde_json::from_str::<Value>(&std::fs::read_to_string(&json).unwrap()).is_ok());
}

#[test]
fn compare_shows_bandwidth_and_latency_and_flags_drops() {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("old.json");
    let (mut v, _) = mock_json(&["--path", "mock_host"]);
    for r in v["results"].as_array_mut().unwrap() {
        let bw = r["bw_gbps"].as_f64().unwrap();
        r["bw_gbps"] = Value::from(bw * 2.0);
    }
    std::fs::write(&old, v.to_string()).unwrap();
    // Without --fail-on-drop the drops are shown and the exit code stays 0.
    shows(
        mock_compare(&old, &[]).assert(),
        &["50.0%  DROP", "p50 µs", "3 of 6 figures dropped"],
    );
}

#[test]
fn list_names_the_cases() {
    shows(
        gdx().args(["bench", "--list"]).assert(),
        &[
            "host_to_host_shm",
            "host_to_host_tcp",
            "gpu0_to_gpu1_p2p",
            "gpu0_gpu1_p2p_bidir",
            "host_to_gpu0_pinned_ce",
        ],
    );
}

#[test]
fn bad_flags_get_clear_errors() {
    let cases: &[(&[&str], &str)] = &[
        (&["--size", "0"], "0 bytes"),
        (&["--size", "8KiB:1KiB"], "0 < LO <= HI"),
        (&["--size", "12XB"], "unknown unit"),
        (&["--duration", "fast"], "invalid duration"),
        (&["--pair", "1,1"], "must differ"),
        (&["--path", "nope"], "matches no case"),
        (&["--plot", "x.pdf"], ".svg or .png"),
        (&["--json", "--csv"], "cannot be used with"),
        (&["--iters", "5", "--duration", "1s"], "cannot be used with"),
        (
            &["--compare", "/nonexistent/old.json"],
            "reading /nonexistent/old.json",
        ),
        (
            &["--export-json", "/nonexistent/dir/x.json"],
            "creating /nonexistent/dir/x.json",
        ),
    ];
    for (args, msg) in cases {
        gdx()
            .args(["bench", "--mock"])
            .args(*args)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(*msg));
    }
}

#[test]
fn compare_refuses_a_file_that_is_not_a_report() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("x.json");
    std::fs::write(&f, "{\"a\": 1}").unwrap();
    refused(
        gdx()
            .args(["bench", "--mock", "--compare"])
            .arg(&f)
            .assert(),
        "schema_version",
    );
}

#[test]
fn loopback_host_paths_run_and_verify() {
    let out = gdx()
        .args([
            "bench",
            "--path",
            "shm,tcp",
            "--size",
            "8,64KiB",
            "--duration",
            "20ms",
            "--json",
        ])
        .output()
        .unwrap();
    let v = success_json(&out);
    let rows = v["results"].as_array().unwrap();
    assert_eq!(rows.len(), 4);
    assert!(rows
        .iter()
        .all(|r| r["verified"] == true && r["status"] == "passed"));
}

#[test]
fn tcp_rows_carry_their_rails() {
    let out = gdx()
        .args([
            "bench",
            "--path",
            "host_to_host_tcp",
            "--size",
            "4MiB",
            "--iters",
            "3",
            "--nics",
            "127.0.0.1,127.0.0.2",
            "--json",
        ])
        .output()
        .unwrap();
    let v = success_json(&out);
    let rows = v["results"].as_array().unwrap();
    assert_eq!(rows.len(), 1);
    let r = &rows[0];
    assert_eq!(r["verified"], true, "{r}");
    let rails = r["rails"].as_array().unwrap();
    assert_eq!(rails.len(), 2, "{r}");
    for (rail, local) in rails.iter().zip(["127.0.0.1", "127.0.0.2"]) {
        assert_eq!(rail["local"], local, "{r}");
        assert!(rail["remote"].as_str().unwrap().starts_with("127.0.0.1:"));
        assert!(rail["bytes"].as_u64().unwrap() > 0, "{r}");
        assert_eq!(rail["state"], "active");
        assert!(rail["cause"].is_null());
    }
    let moved: u64 = rails.iter().map(|x| x["bytes"].as_u64().unwrap()).sum();
    assert!(moved >= 3 * (4 << 20), "{r}");
}

#[test]
fn calibrate_show_prints_a_calibration_file() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("cal.json");
    std::fs::write(
        &f,
        r#"{"schema_version":1,"source":"test","crossovers":[{"below_bytes":65536,"prefer":"staged","over":"p2p"}],"staged_chunk_bytes":8388608}"#,
    )
    .unwrap();
    shows(
        gdx().args(["calibrate", "--show"]).arg(&f).assert(),
        &["staged   over p2p", "65536 bytes", "chunk 8388608 bytes"],
    );
    // The old spelling still reads the file, with a note.
    gdx()
        .args(["calibrate", "--show", "-o"])
        .arg(&f)
        .assert()
        .success()
        .stdout(predicate::str::contains("staged   over p2p"))
        .stderr(predicate::str::contains("deprecated"));
    refused(
        gdx()
            .args(["calibrate", "--show", "/nonexistent/cal.json"])
            .assert(),
        "/nonexistent/cal.json",
    );
}

#[test]
fn ipc_child_speaks_one_json_line_and_exits() {
    use gdx_bench::gpu::ipc::{child_args, parse_child_line, CHILD_FLAG};
    // A bad argument: the error line, exit 2.
    let out = gdx().args(["bench", CHILD_FLAG, "zz"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let line = String::from_utf8(out.stdout).unwrap();
    assert_eq!(line.lines().count(), 1, "{line}");
    let e = parse_child_line(&line).unwrap_err().to_string();
    assert!(
        e.starts_with("ipc child: ") && e.contains("want GPU:LEN"),
        "{e}"
    );
    // A real request: without CUDA (or GPU 1) the error line and exit 2; with it the
    // descriptor, then exit 0 once stdin closes (empty stdin here).
    let out = gdx().args(child_args(1, 4096)).output().unwrap();
    let line = String::from_utf8(out.stdout).unwrap();
    assert_eq!(line.lines().count(), 1, "{line}");
    match parse_child_line(&line) {
        Ok(d) => {
            assert_eq!(d.len, 4096);
            assert_eq!(out.status.code(), Some(0));
        }
        Err(e) => {
            let e = e.to_string();
            assert!(e.starts_with("ipc child: "), "{e}");
            assert_eq!(out.status.code(), Some(2));
        }
    }
    // Hidden from --help.
    gdx()
        .args(["bench", "--help"])
        .assert()
        .success()
        .stdout(predicate::str::contains("ipc-child").not());
}
