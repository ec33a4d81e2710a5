//! One bench case is one small unit (nvbandwidth's testcase): a [`CaseSpec`] saying what it
//! moves where, [`BenchCase::applicable`] saying whether it can run here (or [`Waived`] with
//! the reason), and [`BenchCase::run`] measuring every requested size and handing each
//! [`Row`] to a sink as soon as it is measured, so a later failure keeps the earlier rows.
//!
//! Invariant: a case never panics on purpose and never aborts the run; every failure is a
//! [`BenchError`] (the library's error kept as its source), which the runner records as that
//! case's error.

use std::fmt;
use std::time::Duration;

pub use crate::spec::{CaseSpec, End, PathKind};

use crate::error::BenchError;
use crate::report::Row;
use crate::Ctx;

/// Why a case cannot run here. The reason is shown to the user.
///
/// A waiver with a [`Cause`] is one many cases share (no CUDA driver, GPU5 missing, no RDMA
/// device): the runner reports those cases as one [`crate::WaivedGroup`] line instead of one
/// line per case, so a machine without a GPU does not print fifteen invented GPU cases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waived {
    /// The reason, in words.
    pub reason: String,
    /// The shared cause, when the reason is not particular to this case.
    pub cause: Option<Cause>,
}

/// A reason shared by every case of a scope ("GPU cases: no CUDA driver").
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Cause {
    /// Which cases it stops: `GPU cases`, `GPU1 cases`, `RDMA cases`.
    pub scope: String,
    /// Why, short: `no CUDA driver`.
    pub reason: String,
    /// The loader's or discovery's full message, given once.
    pub detail: Option<String>,
    /// What to do about it.
    pub fix: Option<String>,
}

impl Waived {
    /// A waiver particular to one case.
    pub fn new(reason: impl Into<String>) -> Waived {
        Waived {
            reason: reason.into(),
            cause: None,
        }
    }

    /// A waiver shared by every case `cause` names.
    pub fn shared(cause: Cause) -> Waived {
        Waived {
            reason: cause.one_line(),
            cause: Some(cause),
        }
    }
}

impl Cause {
    /// `no CUDA driver (libcuda.so.1 could not be loaded; install the NVIDIA driver)`.
    pub fn one_line(&self) -> String {
        match &self.fix {
            Some(fix) => format!("{}; {fix}", self.reason),
            None => self.reason.clone(),
        }
    }
}

impl fmt::Display for Waived {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

/// The measurement protocol's knobs (see `docs/bench/README.md`, "Method").
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// Transfer sizes in bytes, ascending.
    pub sizes: Vec<u64>,
    /// Untimed runs before the timed loop, per size.
    pub warmup: u32,
    /// Target duration of the timed loop, per size (the iteration count follows from it).
    pub duration: Duration,
    /// Fewest timed samples per size.
    pub min_samples: u32,
    /// Most timed samples per size (and most latency samples).
    pub max_samples: u32,
    /// A fixed iteration count instead of `duration` (still within the bounds above).
    pub iters: Option<u32>,
    /// Check the destination against the source after the timed loop.
    pub verify: bool,
    /// Chunk of the staged pipeline in bytes.
    pub staged_chunk: u64,
    /// Ops per transfer in the host shm/tcp cases (`--batch`): each transfer carries this many
    /// ops of the row's size, and Mop/s counts ops.
    pub batch: u32,
    /// Transfers in flight at once in the host shm/tcp cases (`--window`): each timed
    /// iteration submits this many transfers, then waits for all of them; Mop/s counts ops.
    pub window: u32,
    /// Host shm/tcp cases (`--prepared`): each transfer is prepared once
    /// (`Peer::prepare`) and posted again, instead of built and submitted afresh.
    pub prepared: bool,
}

/// The default sweep: 8 B to 1 GiB in steps of ×4, plus 1 GiB.
pub fn default_sizes() -> Vec<u64> {
    let mut v: Vec<u64> = (0..14).map(|i| 8u64 << (2 * i)).collect();
    v.push(1 << 30);
    v
}

/// Bytes the buffers rotate over for sizes below it, so caches cannot serve repeats.
pub const ROTATE_BYTES: u64 = 256 << 20;

impl Default for Params {
    fn default() -> Self {
        Params {
            sizes: default_sizes(),
            warmup: 2,
            duration: Duration::from_millis(200),
            min_samples: 3,
            max_samples: 1000,
            iters: None,
            verify: true,
            staged_chunk: 16 << 20,
            batch: 1,
            window: 1,
            prepared: false,
        }
    }
}

impl Params {
    /// The largest size requested (0 when none).
    pub fn max_size(&self) -> u64 {
        self.sizes.iter().copied().max().unwrap_or(0)
    }

    /// How many timed iterations to run when one takes about `per_op`: `iters` when fixed,
    /// else what fits in `duration`, within `min_samples..=max_samples`.
    pub fn plan_iters(&self, per_op: Duration) -> u32 {
        let lo = self.min_samples.max(1);
        let hi = self.max_samples.max(lo);
        if let Some(n) = self.iters {
            return n.clamp(lo, hi);
        }
        let per = per_op.as_secs_f64().max(1e-7);
        let n = (self.duration.as_secs_f64() / per).floor();
        (n.min(f64::from(hi)) as u32).clamp(lo, hi)
    }
}

/// A benchmark case (see the module docs).
pub trait BenchCase: Send + Sync {
    /// What it measures.
    fn spec(&self) -> &CaseSpec;

    /// `Ok` when it can run here, else the reason it is waived.
    ///
    /// # Errors
    /// [`Waived`] with a reason the user can act on.
    fn applicable(&self, ctx: &Ctx) -> Result<(), Waived>;

    /// Measure every size in `params`, giving each row to `sink` as soon as it is measured.
    ///
    /// # Errors
    /// The failure that stopped the case; rows already given stay.
    fn run(&self, ctx: &Ctx, params: &Params, sink: &mut dyn FnMut(Row)) -> Result<(), BenchError>;

    /// Whether the case runs only when asked for by name (see [`crate::select`]): `false` by
    /// default; the file cases, which write large scratch files, and the rdma cases, which
    /// need a device and run long on a software one, say `true`.
    fn opt_in(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_sizes_span_8_bytes_to_1_gib() {
        let s = default_sizes();
        assert_eq!(s.first(), Some(&8));
        assert_eq!(s.last(), Some(&(1 << 30)));
        assert!(s.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn iterations_follow_the_duration_within_bounds() {
        let p = Params::default();
        assert_eq!(p.plan_iters(Duration::from_millis(100)), 3);
        assert_eq!(p.plan_iters(Duration::from_nanos(1)), 1000);
        assert_eq!(p.plan_iters(Duration::from_millis(1)), 200);
        let fixed = Params {
            iters: Some(7),
            ..Params::default()
        };
        assert_eq!(fixed.plan_iters(Duration::from_secs(1)), 7);
    }
}
