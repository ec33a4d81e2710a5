//! `gdx bench --path rdma` and `gdx serve --rdma-listen` through the real binary, on a machine
//! without RDMA (every machine this project has): the rdma cases are waived with gdx-rdma's
//! discovery reason, in the table and in JSON, with exit code 0; `gdx serve` parses its RDMA
//! options, prints its RDMA listener and tells a bench client why it cannot serve it.
//!
//! On a machine with an RDMA device the waiver assertions do not apply: those tests say so and
//! pass without running, or fail under `GDX_REQUIRE_HW=1` (`gdx_base::testenv`); the hardware
//! path is `crates/rdma/tests/hardware.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::{gdx, gdx_serve, spawn_lines};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Why gdx-rdma finds no RDMA here, or `None` on a machine that has it (the test's
/// precondition: see `gdx_base::testenv`).
fn no_rdma_reason() -> Option<String> {
    let reason = gdx_rdma::discover().err().map(|u| u.to_string());
    gdx_base::testenv::precondition("no RDMA device (the waiver applies)", reason.is_some())
        .then_some(reason)
        .flatten()
}

#[test]
fn bench_path_rdma_is_waived_with_the_reason_in_the_table() {
    let Some(reason) = no_rdma_reason() else {
        return;
    };
    let out = gdx()
        .args(["bench", "--path", "rdma", "--size", "4KiB"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "waived is not a failure: {text}"
    );
    // Cases that cannot exist here are one line with the reason, not a row each.
    assert!(
        text.contains(&format!("RDMA cases: waived: {reason}")),
        "{text}"
    );
    assert_eq!(text.matches(&reason).count(), 1, "the reason once: {text}");
    assert!(
        reason.starts_with("no RDMA device") || reason.starts_with("no libibverbs"),
        "{reason}"
    );
    let summary = text.lines().last().unwrap_or("");
    assert!(
        summary.starts_with("0 passed,") && summary.ends_with("waived, 0 failed"),
        "{summary}"
    );
}

#[test]
fn bench_path_rdma_is_waived_with_the_reason_in_json() {
    let Some(reason) = no_rdma_reason() else {
        return;
    };
    for extra in [&[][..], &["--peer", "127.0.0.1:9"][..]] {
        let out = gdx()
            .args(["bench", "--path", "rdma", "--size", "4KiB,1MiB", "--json"])
            .args(extra)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0));
        let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
        // One waived group for the RDMA cases, with the reason and the fix, no invented rows.
        let waived = v["waived"].as_array().unwrap();
        let rdma = waived
            .iter()
            .find(|w| w["scope"] == "RDMA cases")
            .unwrap_or_else(|| panic!("no RDMA group in {waived:?}"));
        assert_eq!(rdma["reason"], reason.as_str(), "{rdma}");
        assert!(rdma["cases"].as_u64().unwrap() >= 4, "{rdma}");
        assert!(
            rdma["fix"].as_str().is_some_and(|f| !f.is_empty()),
            "{rdma}"
        );
        assert_eq!(v["cases"].as_array().unwrap().len(), 0);
        assert_eq!(v["results"].as_array().unwrap().len(), 0);
    }
}

#[test]
fn rdma_cases_are_listed_but_opt_in() {
    let out = gdx().args(["bench", "--list"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("host_to_remote_host_rdma_write"), "{text}");
    assert!(text.contains("remote_gpu0_to_host_rdma_read"), "{text}");
    // The default selection leaves them out: a plain `gdx bench` never reports them.
    let out = gdx()
        .args(["bench", "--path", "memcpy", "--size", "8", "--json"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["path"] != "rdma"));
}

#[test]
fn peer_for_both_engine_and_rdma_cases_is_refused() {
    let out = gdx()
        .args([
            "bench",
            "--path",
            "tcp,rdma",
            "--peer",
            "127.0.0.1:9",
            "--size",
            "8",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--rdma-peer"), "{err}");
}

#[test]
fn serve_rdma_options_parse() {
    let out = gdx().args(["serve", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("--rdma-listen <IP:PORT>"), "{help}");
    assert!(help.contains("--rdma-device <NAME>"), "{help}");
    let out = gdx()
        .args(["serve", "--rdma-listen", "not-an-address"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--rdma-listen"));
    // --rdma-device without --rdma-listen is a usage error.
    let out = gdx()
        .args(["serve", "--rdma-device", "mlx5_0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = gdx().args(["bench", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("--rdma-peer <HOST:PORT>") && help.contains("rdma"));
}

fn frame(s: &mut TcpStream, v: &Value) {
    let b = serde_json::to_vec(v).unwrap();
    s.write_all(&(b.len() as u32).to_le_bytes()).unwrap();
    s.write_all(&b).unwrap();
}

fn read_frame(s: &mut TcpStream) -> Value {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut b = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut b).unwrap();
    serde_json::from_slice(&b).unwrap()
}

#[test]
fn serve_rdma_listen_answers_a_bench_client_with_the_reason() {
    let (_server, mut lines) = spawn_lines(gdx_serve().args([
        "--listen",
        "127.0.0.1:0",
        "--size",
        "1MiB",
        "--rdma-listen",
        "127.0.0.1:0",
    ]));
    let line = lines
        .find_map(|l| l.ok().filter(|l| l.starts_with("GDX_SERVE_RDMA ")))
        .expect("a GDX_SERVE_RDMA line");
    let addr = line.strip_prefix("GDX_SERVE_RDMA addr=").unwrap();
    let Some(reason) = no_rdma_reason() else {
        return;
    };
    // A client's hello, as gdx-bench's rdma cases send it (connection data is never looked at
    // when this side has no device).
    let conn = gdx_rdma::ConnData {
        device: "mlx5_0".into(),
        port: 1,
        link: gdx_rdma::LinkKind::Ethernet,
        lid: 0,
        gid: "::ffff:10.0.0.1".parse().unwrap(),
        gid_index: 3,
        mtu_bytes: 4096,
        max_rd_atomic: 16,
        qps: vec![gdx_rdma::QpInfo { qpn: 0x11, psn: 1 }],
        regions: vec![],
    };
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    frame(
        &mut s,
        &json!({
            "msg": "hello",
            "version": gdx_bench::rdma::BENCH_VERSION,
            "op": "write",
            "mem": "host",
            "len": 4096,
            "qps": 1,
            "conn": conn,
        }),
    );
    let reply = read_frame(&mut s);
    assert_eq!(reply["msg"], "error", "{reply}");
    assert_eq!(reply["reason"], reason.as_str(), "{reply}");
}
