//! The GPU measurement protocol.
//!
//! Both time through the one [`Timer`]: its event clock for bandwidth, its wall clock for
//! latency.
//!
//! - **Bandwidth** ([`event_batches`]): per sample, each stream is held
//!   ([`gdx_sys::cuda::Stream::hold`]), the timer's start events are recorded, a batch of `b`
//!   copies and its end events are queued, the holds are released and the streams
//!   synchronised; the sample is the slowest stream's event time divided by `b`. `b` is sized from a trial batch so a
//!   batch lasts about [`BATCH_TARGET`] (at most [`MAX_BATCH`] copies, so the queue never
//!   fills behind a hold). Enqueue cost is thus excluded and launch gaps are not measured.
//! - **Latency** ([`latency`]): host wall time of one copy enqueued and synchronised.
//!
//! The op closure is told a running op index so buffers rotate across every copy; its error is
//! any that becomes a [`BenchError`] (a `CudaError` for the gdx-sys bodies, the engine's error
//! for the engine-driven ones), kept as the source.

use std::time::Duration;

use gdx_sys::cuda::{CudaError, Stream};

use crate::case::Params;
use crate::error::BenchError;
use gdx_base::clock;
use gdx_sys::timer::CpuClock;
use gdx_sys::timer::Timer;

/// How long one timed batch should last on the device.
pub const BATCH_TARGET: Duration = Duration::from_micros(200);

/// Most copies in one batch.
pub const MAX_BATCH: u64 = 64;

/// Copies in the trial batch that sizes the real ones.
const TRIAL_BATCH: u64 = 8;

/// Bandwidth samples from device events.
#[derive(Debug, Default)]
pub struct EventTimed {
    /// Device time per copy, one per batch.
    pub samples: Vec<Duration>,
    /// Copies per batch.
    pub batch: u64,
    /// CPU seconds per GB during the timed batches.
    pub cpu_s_per_gb: Option<f64>,
    /// Whether the streams were held while queueing (false when the driver lacks
    /// `cuLaunchHostFunc`: enqueue cost may then leak into small sizes).
    pub held: bool,
}

/// Running op counter shared by the warm-up, the batches and the latency loop.
#[derive(Debug, Default)]
pub struct OpCounter(pub u64);

impl OpCounter {
    /// The next op index.
    pub fn take(&mut self) -> u64 {
        self.0 += 1;
        self.0 - 1
    }
}

fn cuda(e: CudaError) -> BenchError {
    BenchError::Cuda(e)
}

/// One batch of `b` copies on the timer's streams; returns the slowest stream's device time.
fn batch<E: Into<BenchError>>(
    streams: &[&Stream],
    timer: &mut Timer<'_>,
    b: u64,
    ops: &mut OpCounter,
    enqueue: &mut dyn FnMut(u64) -> Result<(), E>,
) -> Result<(Duration, bool), BenchError> {
    let mut holds = Vec::new();
    let mut held = true;
    for s in streams {
        if s.can_hold() {
            holds.push(s.hold().map_err(cuda)?);
        } else {
            held = false;
        }
    }
    timer.start().map_err(cuda)?;
    for _ in 0..b {
        enqueue(ops.take()).map_err(Into::into)?;
    }
    timer.stop().map_err(cuda)?;
    // Released only after the end events are queued, so the batch runs back to back.
    drop(holds);
    Ok((timer.read().map_err(cuda)?, held))
}

/// Warm up, size the batches, then take the bandwidth samples (see the module docs).
/// `bytes_per_op` is what one enqueue moves in all (both directions for a bidirectional op).
pub fn event_batches<E: Into<BenchError>>(
    params: &Params,
    streams: &[&Stream],
    bytes_per_op: f64,
    ops: &mut OpCounter,
    enqueue: &mut dyn FnMut(u64) -> Result<(), E>,
) -> Result<EventTimed, BenchError> {
    if streams.is_empty() {
        return Err(BenchError::Unmeasurable("no stream to time on".into()));
    }
    let mut timer = Timer::events(streams).map_err(cuda)?;
    for _ in 0..params.warmup.max(1) {
        enqueue(ops.take()).map_err(Into::into)?;
    }
    for s in streams {
        s.synchronize().map_err(cuda)?;
    }
    let (trial, _) = batch(streams, &mut timer, TRIAL_BATCH, ops, enqueue)?;
    let per = (trial / TRIAL_BATCH as u32).max(Duration::from_nanos(100));
    let b = (BATCH_TARGET.as_nanos() / per.as_nanos()).clamp(1, u128::from(MAX_BATCH)) as u64;
    let n = params.plan_iters(per * b as u32);
    let cpu = CpuClock::now();
    let mut out = EventTimed {
        batch: b,
        held: true,
        ..EventTimed::default()
    };
    for _ in 0..n {
        let (d, held) = batch(streams, &mut timer, b, ops, enqueue)?;
        out.held &= held;
        out.samples.push(d / b as u32);
    }
    out.cpu_s_per_gb = cpu.per_gb_since(bytes_per_op * (u64::from(n) * b) as f64);
    Ok(out)
}

/// Latency samples: one op enqueued and every stream synchronised, timed on the host.
/// About half the duration is spent here, within the sample bounds (at most 200).
pub fn latency<E: Into<BenchError>>(
    params: &Params,
    streams: &[&Stream],
    ops: &mut OpCounter,
    enqueue: &mut dyn FnMut(u64) -> Result<(), E>,
) -> Result<Vec<Duration>, BenchError> {
    let mut one = || -> Result<Duration, BenchError> {
        let (done, d) = clock::wall(|| -> Result<(), BenchError> {
            enqueue(ops.take()).map_err(Into::into)?;
            for s in streams {
                s.synchronize().map_err(cuda)?;
            }
            Ok(())
        });
        done.map(|()| d)
    };
    let est = one()?;
    let half = Params {
        duration: params.duration / 2,
        max_samples: params.max_samples.min(200),
        ..params.clone()
    };
    let n = half.plan_iters(est);
    (0..n).map(|_| one()).collect()
}
