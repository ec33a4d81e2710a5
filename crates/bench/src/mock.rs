//! The mock backend (hyperfine's `MockExecutor` idea): cases with synthetic, deterministic
//! figures and no timing, so that the CLI's tables, JSON, CSV, plots and exit codes can be
//! tested exactly. Selected with `gdx bench --mock` (hidden flag).
//!
//! Figures: bandwidth `peak × size / (size + half)` GB/s, latency `base + size / peak`.

use std::time::Duration;

use crate::case::{BenchCase, CaseSpec, Cause, End, Params, PathKind, Waived};
use crate::ctx::gpu_missing;
use crate::error::BenchError;
use crate::figures::fill_row;
use crate::report::Row;
use crate::Ctx;

/// The ceiling mock rows are judged against, GB/s (set by [`Ctx::mock`]).
pub use crate::ctx::MOCK_CEILING_GBPS as CEILING_GBPS;

/// What a mock case does.
#[derive(Debug, Clone, Copy)]
enum Behaviour {
    /// Measures: peak GB/s, half-bandwidth size, base latency µs.
    Curve(f64, f64, f64),
    /// Always waived.
    Waive,
    /// Waived for a shared reason: GPU8 is not present.
    NoGpu8,
    /// Fails after the first size.
    FailAfterFirst,
}

struct MockCase {
    spec: CaseSpec,
    behaviour: Behaviour,
}

impl BenchCase for MockCase {
    fn spec(&self) -> &CaseSpec {
        &self.spec
    }

    fn applicable(&self, ctx: &Ctx) -> Result<(), Waived> {
        match self.behaviour {
            Behaviour::NoGpu8 => Err(Waived::shared(Cause {
                scope: "GPU8 cases".into(),
                reason: gpu_missing(8, ctx.gpu_count()),
                detail: None,
                fix: None,
            })),
            Behaviour::Waive => Err(Waived::new(
                "mock: always waived, to show how a reason is reported",
            )),
            _ => Ok(()),
        }
    }

    fn run(
        &self,
        _ctx: &Ctx,
        params: &Params,
        sink: &mut dyn FnMut(Row),
    ) -> Result<(), BenchError> {
        let (peak, half, base) = match self.behaviour {
            Behaviour::Curve(p, h, b) => (p, h, b),
            Behaviour::FailAfterFirst => (1.0, 1024.0, 50.0),
            Behaviour::Waive | Behaviour::NoGpu8 => {
                return Err(BenchError::Unmeasurable("mock: waived case ran".into()))
            }
        };
        for (i, &size) in params.sizes.iter().enumerate() {
            if i > 0 && matches!(self.behaviour, Behaviour::FailAfterFirst) {
                return Err(BenchError::Unmeasurable(format!(
                    "mock: injected failure at {size} bytes, after the first size"
                )));
            }
            let s = size as f64;
            let gbps = peak * s / (s + half);
            let per_op = Duration::from_secs_f64(s / (gbps * 1e9));
            let lat = Duration::from_secs_f64(base * 1e-6 + s / (peak * 1e9));
            let mut row = Row::new(&self.spec, size);
            let n = params.min_samples.max(1) as usize;
            fill_row(&mut row, s, &vec![per_op; n], &vec![lat; n], n as u64);
            row.cpu_s_per_gb = Some(0.25);
            if matches!(self.spec.dst, End::Gpu(_)) {
                row.gpu_util_pct = Some(100.0);
            }
            row.verified = params.verify.then_some(true);
            sink(row);
        }
        Ok(())
    }
}

/// The mock cases: two that measure, one waived, one that fails after its first size, and two
/// waived for one shared reason (GPU8 is not present), which the runner reports as one group.
pub fn cases() -> Vec<Box<dyn BenchCase>> {
    let mk = |key: &str, desc: &str, src: End, dst: End, b: Behaviour| -> Box<dyn BenchCase> {
        Box::new(MockCase {
            spec: CaseSpec {
                key: key.into(),
                description: desc.into(),
                path: PathKind::Mock,
                src,
                dst,
                bidir: false,
            },
            behaviour: b,
        })
    };
    vec![
        mk(
            "mock_host_to_host_fast",
            "mock: host to host, 10 GB/s peak, 5 µs base latency",
            End::Host,
            End::Host,
            Behaviour::Curve(10.0, 65536.0, 5.0),
        ),
        mk(
            "mock_gpu0_to_gpu1_p2p",
            "mock: GPU0 to GPU1, 40 GB/s peak, 8 µs base latency",
            End::Gpu(0),
            End::Gpu(1),
            Behaviour::Curve(40.0, 1048576.0, 8.0),
        ),
        mk(
            "mock_waived",
            "mock: always waived",
            End::Host,
            End::Gpu(0),
            Behaviour::Waive,
        ),
        mk(
            "mock_error",
            "mock: fails after its first size",
            End::Host,
            End::Host,
            Behaviour::FailAfterFirst,
        ),
        mk(
            "mock_host_to_gpu8",
            "mock: host to GPU8, which no machine here has",
            End::Host,
            End::Gpu(8),
            Behaviour::NoGpu8,
        ),
        mk(
            "mock_gpu8_to_host",
            "mock: GPU8 to host, which no machine here has",
            End::Gpu(8),
            End::Host,
            Behaviour::NoGpu8,
        ),
    ]
}
