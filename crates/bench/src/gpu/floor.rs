//! The floor under the mailbox: the round trip between a host thread and one GPU thread through
//! mapped host memory with nothing else in the way (gdx-sys's [`PingPong`], the
//! `gdx_pingpong` kernel). The mailbox's rows are judged against it in the same run, the way
//! host transports are judged against a raw shared-memory flag (`crate::floors`): what a
//! protocol over PCIe polling can at best reach on this machine, and how much of a mailbox op
//! is the protocol rather than the bus.
//!
//! Each round trip is one sample of the one [`Timer`] (host wall clock: from the ping's store
//! to the host seeing the answer). The kernel is persistent while it runs, so [`round_trips`]
//! stops it and waits for it to exit before it returns (a running kernel would hold up module
//! loads and frees in the context).

use gdx_sys::cuda::{Context, FloorStep, Module, PingPong};
use std::time::{Duration, Instant};

use crate::error::BenchError;
use gdx_sys::timer::Timer;

/// How long one answer may take before the run is called lost (also the kernel's watchdog).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);

/// `rounds` timed round trips (after `rounds / 10` warm-up ones) with `step` on the GPU side,
/// polling one load at a time (`gap_cycles` 0) or with four loads in flight issued
/// `gap_cycles` SM clock cycles apart, on a kernel of `module` (gdx's own,
/// [`Module::gdx_kernels`], loaded before: loading it here could wait for another persistent
/// kernel). Returns one duration per timed round trip.
///
/// # Errors
/// A CUDA call failing, or an answer not arriving within two seconds (the kernel is then told
/// to stop, and its own watchdog ends it if it cannot hear that).
pub fn round_trips(
    ctx: &Context,
    module: &Module,
    step: FloorStep,
    gap_cycles: u32,
    rounds: usize,
) -> Result<Vec<Duration>, BenchError> {
    let pp = PingPong::start(ctx, module, step, gap_cycles, ANSWER_TIMEOUT)?;
    let warm = rounds / 10;
    let mut out = Vec::with_capacity(rounds);
    let mut timer = Timer::wall();
    let mut result = Ok(());
    for n in 1..=(warm + rounds) as u64 {
        // A deadline, not a measurement: it keeps `Instant` (see `gdx_sys::timer`).
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        timer.start()?;
        pp.ping(n);
        let mut lost = false;
        while pp.pong() != n {
            if Instant::now() > deadline {
                lost = true;
                break;
            }
            std::hint::spin_loop();
        }
        timer.stop()?;
        if lost {
            result = Err(BenchError::Unmeasurable(format!(
                "ping-pong floor: round trip {n} ({}) not answered within {ANSWER_TIMEOUT:?} \
                 (pong {})",
                step.name(),
                pp.pong()
            )));
            break;
        }
        if n > warm as u64 {
            out.push(timer.read()?);
        }
    }
    pp.stop()?;
    result.map(|()| out)
}
