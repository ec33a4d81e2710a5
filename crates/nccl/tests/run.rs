//! `gdx nccl run`. Without a GPU or libnccl the run is waived with its reason; the hardware
//! test runs on one GPU: `cargo test -p gdx-nccl --test run -- --ignored`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_nccl::run::{run, Op, RunOutcome, RunParams};

fn params(sizes: Vec<u64>) -> RunParams {
    RunParams {
        sizes,
        ops: Op::ALL.to_vec(),
        warmup: 2,
        iters: 5,
        gpus: Some(1),
        log_dir: None,
    }
}

#[test]
fn impossible_parameters_are_an_error() {
    assert!(run(&params(vec![]), None).is_err());
    let mut p = params(vec![1 << 20]);
    p.iters = 0;
    assert!(run(&p, None).is_err());
}

#[test]
fn the_run_is_waived_with_a_reason_or_it_runs() {
    match run(&params(vec![1 << 20]), None).unwrap() {
        RunOutcome::Waived { reason } => {
            assert!(
                reason.starts_with("no GPU") || reason.starts_with("no libnccl"),
                "{reason}"
            );
        }
        RunOutcome::Ran(r) => assert_eq!(r.rows.len(), 4),
    }
}

#[test]
#[ignore = "requires a GPU and libnccl"]
fn one_gpu_runs_captures_and_explains_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = params(vec![1 << 20, 64 << 20]);
    p.log_dir = Some(dir.path().to_path_buf());
    let r = match run(&p, None).unwrap() {
        RunOutcome::Ran(r) => r,
        RunOutcome::Waived { reason } => panic!("waived on the GPU machine: {reason}"),
    };
    eprintln!("{r:#?}");
    assert_eq!(r.rows.len(), 8);
    assert_eq!(r.gpus.len(), 1);
    for row in &r.rows {
        assert!(row.time_us > 0.0, "{row:?}");
        match row.op {
            Op::SendRecv => assert!(row.busbw_gbps > 0.0, "{row:?}"),
            _ => assert_eq!(row.busbw_gbps, 0.0, "one rank: busbw is 0 by definition"),
        }
    }
    assert!(!r.log_files.is_empty(), "NCCL wrote no debug file");
    assert!(r.log.version.is_some(), "{:#?}", r.log.parse_warnings);
    assert!(
        r.log
            .ranks
            .iter()
            .any(|x| x.rank == 0 && x.bus_id.is_some()),
        "{:#?}",
        r.log.ranks
    );
    // NVLink multicast stays off: set by the run unless the caller already chose.
    assert!(std::env::var_os("NCCL_NVLS_ENABLE").is_some());
    assert!(r.env_set.iter().any(|(k, _)| k == "NCCL_DEBUG_FILE"));
    assert!(r.ceiling.is_none());
    assert!(r.ceiling_note.contains("one rank"));
}
