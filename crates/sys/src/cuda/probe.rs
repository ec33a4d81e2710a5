//! What the hardware probes and tests of every crate share: the one test pattern, re-exported
//! from [`crate::pattern`] where its users first found it, the GPU the hardware tests run on
//! ([`test_gpu`]) and a per-run pattern seed ([`replay_seed`]).
//!
//! The timed, pattern-verified copy that `gdx doctor` probes with is gdx-bench's
//! (`gdx_bench::probe::timed_copy`), timed with its one timer: measurements live above the FFI.

// The pattern, its check and the poison live in `crate::pattern` (the one pattern of gdx);
// re-exported here because the probe's users found them here first.
pub use crate::pattern::{fill_pattern, find_mismatch, pattern, Mismatch, POISON};

/// A seed for probes and tests that fill a source with the pattern (`gdx cp --verify`'s).
pub const SEED: u64 = 0x6764_785f_7072_6f62; // "gdx_prob"

/// The GPU the hardware tests run on: `GDX_TEST_GPU`, default 0 (every GPU test suite of the
/// workspace reads it through here).
pub fn test_gpu() -> u32 {
    std::env::var("GDX_TEST_GPU")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
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
