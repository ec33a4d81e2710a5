//! `gdx calibrate` writes the engine's calibration format, and the engine's planner, reading
//! the file, chooses accordingly: staged below the measured crossover, p2p from there on.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_bench::calibrate::{decide, detail_of, from_report, to_json};
use gdx_bench::{header, CaseSpec, End, Params, PathKind, Report, Row, SCHEMA_VERSION};
use gdx_engine::planner::{plan_local, EndFacts, GpuLink, OpFacts, PeerStatus, Policy};
use gdx_engine::{Calibration, Location, Path};

fn row(key: &str, path: PathKind, size: u64, lat_us: f64) -> Row {
    let spec = CaseSpec {
        key: key.into(),
        description: String::new(),
        path,
        src: End::Gpu(0),
        dst: End::Gpu(1),
        bidir: false,
    };
    let mut r = Row::new(&spec, size);
    r.lat_p50_us = Some(lat_us);
    r.bw_gbps = Some(size as f64 / (lat_us * 1e3));
    r
}

/// Staged is faster below 64 KiB (lower latency), p2p from 64 KiB on.
fn synthetic() -> Report {
    let mut results = Vec::new();
    for (size, p2p, staged) in [
        (4096u64, 30.0, 12.0),
        (16384, 31.0, 20.0),
        (65536, 32.0, 40.0),
        (1 << 20, 40.0, 90.0),
        (64 << 20, 200.0, 1300.0),
    ] {
        results.push(row("gpu0_to_gpu1_p2p", PathKind::P2p, size, p2p));
        results.push(row("gpu0_to_gpu1_staged", PathKind::Staged, size, staged));
    }
    Report {
        schema_version: SCHEMA_VERSION,
        header: header::mock_header(&Params::default()),
        cases: vec![],
        waived: vec![],
        results,
    }
}

fn facts(len: u64) -> OpFacts {
    OpFacts {
        src: EndFacts::at(Location::Gpu(0)),
        dst: EndFacts::at(Location::Gpu(1)),
        len,
        link: Some(GpuLink {
            class: Some("NV18".into()),
            class_expects_p2p: true,
            peer: PeerStatus::Enabled,
        }),
    }
}

#[test]
fn the_crossover_is_the_first_size_from_which_the_large_winner_always_wins() {
    let (d, c) = decide(
        &synthetic(),
        "gpu0->gpu1",
        "gpu0_to_gpu1_p2p",
        "gpu0_to_gpu1_staged",
    )
    .unwrap();
    let c = c.unwrap();
    assert_eq!(
        (c.below_bytes, c.prefer, c.over),
        (65536, Path::Staged, Path::P2p)
    );
    assert_eq!(d.evidence.len(), 5);
    assert!(d.summary.contains("staged is faster below 65536 bytes"));
}

#[test]
fn the_planner_reads_the_file_and_chooses_accordingly() {
    let outcome = from_report(
        synthetic(),
        2,
        vec![(8 << 20, 50.0), (16 << 20, 52.0)],
        "test run".into(),
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("calibration.json");
    std::fs::write(&file, to_json(&outcome).unwrap()).unwrap();

    let cal = Calibration::load(&file).unwrap();
    assert_eq!(cal.staged_chunk(), 16 << 20);
    let policy = Policy::default();
    let small = plan_local(&facts(4096), &policy, &cal).unwrap();
    assert_eq!(small.path, Path::Staged, "{}", small.reason);
    assert!(small.reason.contains("test run"), "{}", small.reason);
    let large = plan_local(&facts(1 << 20), &policy, &cal).unwrap();
    assert_eq!(large.path, Path::P2p, "{}", large.reason);
    // Without the calibration the planner takes p2p at every size.
    let none = plan_local(&facts(4096), &policy, &Calibration::default()).unwrap();
    assert_eq!(none.path, Path::P2p);
    // The evidence travels in the same file, ignored by the engine.
    let text = std::fs::read_to_string(&file).unwrap();
    let detail = detail_of(&text).unwrap();
    assert_eq!(detail.decisions.len(), 1);
}

/// tcp faster than shm at small sizes on one host: a warning, and no crossover preferring tcp.
#[test]
fn tcp_beating_shm_is_a_warning_not_a_preference() {
    let mut results = Vec::new();
    for (size, shm, tcp) in [
        (8u64, 60.0, 50.0),
        (4096, 62.0, 55.0),
        (1 << 20, 100.0, 400.0),
    ] {
        results.push(row("host_to_host_shm", PathKind::Shm, size, shm));
        results.push(row("host_to_host_tcp", PathKind::Tcp, size, tcp));
    }
    let report = Report {
        schema_version: SCHEMA_VERSION,
        header: header::mock_header(&Params::default()),
        cases: vec![],
        waived: vec![],
        results,
    };
    // decide() alone still sees the crossover ...
    let (_, c) = decide(
        &report,
        "host->host",
        "host_to_host_shm",
        "host_to_host_tcp",
    )
    .unwrap();
    assert_eq!(c.map(|c| c.prefer), Some(Path::Tcp));
    // ... but the calibration does not record it, and says why.
    let o = from_report(report, 0, vec![], "test".into());
    assert!(o.calibration.crossovers.is_empty(), "{:?}", o.calibration);
    assert_eq!(o.detail.warnings.len(), 1);
    assert!(
        o.detail.warnings[0].contains("tcp beat shm"),
        "{}",
        o.detail.warnings[0]
    );
    assert!(o.detail.warnings[0].contains("8 B"));
    let shown = gdx_bench::calibrate::show(&o.calibration, Some(&o.detail));
    assert!(shown.contains("warning: tcp beat shm"));
}
