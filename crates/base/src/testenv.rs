//! What a test needs from the machine, said the same way by every test of the workspace.
//!
//! A test that needs hardware only some machines have is `#[ignore = "requires …"]` and runs
//! with `-- --ignored` where the hardware is. A test that must run in the default suite but
//! applies only to some machines (the tests of what gdx says *without* an RDMA device or a CUDA
//! driver, which cannot apply on a machine that has one; a driver feature a GPU test needs)
//! calls [`precondition`] first: where the precondition holds the test runs; where it does not,
//! the test says so on stderr and passes without running — unless `GDX_REQUIRE_HW=1`, where it
//! fails. CI runs the Rust suite a second time with `GDX_REQUIRE_HW=1` (its runner has no GPU
//! and no RDMA device, so every "without" test must run there), and GPU-machine runs of
//! `-- --ignored` should set it too, so a test that silently stopped applying shows as a
//! failure, never as a pass.
//!
//! The GPU the hardware tests run on is [`test_gpu`]'s, and a test that fills a buffer with a
//! pattern seed of its own run takes it from [`replay_seed`].

/// The variable that turns an unmet precondition into a failure.
pub const REQUIRE_HW: &str = "GDX_REQUIRE_HW";

/// What a test does about its precondition.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    /// It holds: run.
    Run,
    /// It does not: skip, printing this.
    Skip(String),
    /// It does not and `GDX_REQUIRE_HW=1`: fail with this.
    Fail(String),
}

/// What to do about a precondition, given whether it holds and whether `GDX_REQUIRE_HW=1`.
fn decide(what: &str, holds: bool, required: bool) -> Verdict {
    match (holds, required) {
        (true, _) => Verdict::Run,
        (false, true) => Verdict::Fail(format!(
            "this test needs {what}, which this machine lacks ({REQUIRE_HW}=1: failing instead \
             of skipping)"
        )),
        (false, false) => Verdict::Skip(format!(
            "skipped: this test needs {what}, which this machine lacks ({REQUIRE_HW}=1 makes this \
             a failure)"
        )),
    }
}

/// True when the test's precondition `what` holds (`holds`) and the test should run. When it
/// does not: prints why and returns false, or panics when `GDX_REQUIRE_HW=1`.
#[track_caller]
#[allow(clippy::panic)] // only tests call this: failing the calling test is its whole job
pub fn precondition(what: &str, holds: bool) -> bool {
    let required = std::env::var(REQUIRE_HW).is_ok_and(|v| v == "1");
    match decide(what, holds, required) {
        Verdict::Run => true,
        Verdict::Skip(skip) => {
            eprintln!("{skip}");
            false
        }
        Verdict::Fail(fail) => panic!("{fail}"),
    }
}

/// The GPU the hardware tests run on: `GDX_TEST_GPU`, default 0 (every GPU test suite of the
/// workspace reads it through here).
pub fn test_gpu() -> u32 {
    std::env::var("GDX_TEST_GPU")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The other GPU of a two-GPU test, given the driver's device `count`: the one after
/// [`test_gpu`], or `None` (said on stderr, naming `test`) where there is only one, for a test
/// that has a one-GPU part to run anyway.
pub fn peer_gpu(count: u32, test: &str) -> Option<u32> {
    if count < 2 {
        eprintln!("{test}: peer part not run, needs 2 GPUs and the driver reports {count}");
        return None;
    }
    Some((test_gpu() + 1) % count)
}

/// A pattern seed that differs per run, printed to stderr so that a failing test can be
/// replayed with the same bytes.
pub fn replay_seed() -> u64 {
    let s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    eprintln!("pattern seed {s:#x}");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_met_precondition_runs_the_test_either_way() {
        assert_eq!(decide("a GPU", true, false), Verdict::Run);
        assert_eq!(decide("a GPU", true, true), Verdict::Run);
    }

    #[test]
    fn an_unmet_one_skips_with_the_reason_or_fails_when_required() {
        let Verdict::Skip(skip) = decide("an RDMA device", false, false) else {
            panic!("not a skip")
        };
        assert!(
            skip.starts_with("skipped: this test needs an RDMA device"),
            "{skip}"
        );
        let Verdict::Fail(fail) = decide("an RDMA device", false, true) else {
            panic!("not a failure")
        };
        assert!(fail.contains("GDX_REQUIRE_HW=1"), "{fail}");
    }

    #[test]
    fn precondition_that_holds_returns_true() {
        assert!(precondition("nothing", true));
    }
}
