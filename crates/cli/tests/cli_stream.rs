//! End-to-end tests of `gdx stream` through the real binary, host-only (no GPU needed; no
//! timing asserts: only counts, names and the checksums).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::{gdx, refused, success_json};

use predicates::prelude::*;

#[test]
fn host_only_json_report_counts_every_frame_and_says_where_the_kernel_ran() {
    let dir = tempfile::tempdir().unwrap();
    let plot = dir.path().join("lat.svg");
    let out = gdx()
        .args([
            "stream",
            "--frame",
            "4KiB",
            "--frames",
            "400",
            "--duration",
            "60s",
        ])
        .args(["--slots", "4", "--json", "-q", "--plot"])
        .arg(&plot)
        .output()
        .unwrap();
    let v = success_json(&out);
    let r = &v["report"];
    assert_eq!(r["frames_produced"], 400);
    assert_eq!(r["frames_delivered"], 400);
    assert_eq!(r["drops"], 0);
    assert_eq!(r["gaps"], 0);
    assert_eq!(r["bytes_delivered"], 400 * 4096);
    assert_eq!(r["stage"], "cpu");
    assert_eq!(r["stop"], "frames");
    assert_eq!(r["ring_bytes"], 4 * 4096);
    assert!(r["max_slots_in_use"].as_u64().unwrap() <= 4);
    assert!(v["stage_note"].as_str().unwrap().contains("host-only"));
    let lat = &r["latency"];
    for k in ["p50_us", "p99_us", "p999_us", "max_us"] {
        assert!(lat[k].as_f64().unwrap() >= 0.0, "{k}");
    }
    assert_eq!(lat["frames"], 400);
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(svg.contains("<svg") && svg.contains("p99.9"));
}

#[test]
fn a_file_sink_gets_one_checked_line_per_frame() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.bin");
    let data = gdx_base::pattern::pattern(10_000, 7);
    std::fs::write(&input, &data).unwrap();
    let res = dir.path().join("r.tsv");
    gdx()
        .args(["stream", "--frame", "4000", "-q"])
        .arg(format!("--source=file:{}", input.display()))
        .arg(format!("--sink=file:{}", res.display()))
        .assert()
        .success()
        .stdout(predicate::str::contains("3 delivered, 0 dropped"));
    let text = std::fs::read_to_string(&res).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    for (i, chunk) in data.chunks(4000).enumerate() {
        let [a, b] = gdx_stream::checksum(chunk).0;
        assert_eq!(
            lines[i + 1],
            format!("{i}\t{}\t{a:#018x}\t{b:#018x}", chunk.len())
        );
    }
}

#[test]
fn asking_for_a_gpu_never_runs_quietly_on_the_cpu() {
    // On this machine there is no GPU (or, on a GPU machine, no GPU stage in this build): the
    // command must fail and say how to get the host-only pipeline, not run on the CPU.
    gdx()
        .args(["stream", "--gpu", "7", "--frames", "10", "--json"])
        .assert()
        .failure()
        .stdout(predicate::str::is_empty())
        .stderr(
            predicate::str::contains("--gpu 7").and(predicate::str::contains("run without --gpu")),
        );
}

#[test]
fn bad_rates_sources_and_sinks_are_named() {
    refused(
        gdx().args(["stream", "--rate", "40GB"]).assert(),
        "is not a rate",
    );
    gdx()
        .args(["stream", "--source", "camera", "--frames", "1"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("unknown --source \"camera\""));
    gdx()
        .args(["stream", "--sink", "void", "--frames", "1"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("unknown --sink \"void\""));
    refused(
        gdx().args(["stream", "--policy", "sometimes"]).assert(),
        "block",
    );
}

#[test]
fn a_sink_that_fails_stops_the_stream_with_exit_1_and_names_it() {
    if !std::path::Path::new("/dev/full").exists() {
        panic!("/dev/full is missing on this Linux machine");
    }
    gdx()
        .args([
            "stream",
            "--frame",
            "64",
            "--frames",
            "100000",
            "-q",
            "--sink",
            "file:/dev/full",
        ])
        .assert()
        .code(1)
        .stderr(predicate::str::contains(
            "sink 'file:/dev/full' failed at frame",
        ));
}
