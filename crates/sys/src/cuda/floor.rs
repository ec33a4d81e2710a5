//! The floor under the mailbox: the round trip between a host thread and one GPU thread through
//! mapped host memory with nothing else in the way (`gdx_pingpong` in `kernels/gdx_kernels.cu`).
//! The mailbox's rows are judged against it in the same run, the way host transports are
//! judged against a raw shared-memory flag: what a protocol over PCIe polling can at best reach
//! on this machine, and how much of a mailbox op is the protocol rather than the bus.
//!
//! The kernel is persistent while it runs, so [`round_trips`] waits for it to exit before it
//! returns (a running kernel would hold up module loads and frees in the context).

use super::{
    Context, CudaError, DeviceBuffer, KernelArgs, LaunchDims, MappedHostBuffer, Module, Stream,
};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// What the GPU thread does between seeing the ping and answering (see the kernel).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloorStep {
    /// Nothing: the bare poll + posted-write round trip.
    Bare,
    /// Store to device memory, then `__threadfence_system()`: a host → GPU write's completion.
    StoreFenceSystem,
    /// Store to device memory, then `__threadfence()` (GPU scope).
    StoreFenceGpu,
    /// Load from device memory into the answer: a GPU → host read's device step.
    Load,
}

impl FloorStep {
    fn mode(self) -> u32 {
        match self {
            FloorStep::Bare => 0,
            FloorStep::StoreFenceSystem => 1,
            FloorStep::StoreFenceGpu => 2,
            FloorStep::Load => 3,
        }
    }

    /// A short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            FloorStep::Bare => "bare",
            FloorStep::StoreFenceSystem => "store+fence.sys",
            FloorStep::StoreFenceGpu => "store+fence.gpu",
            FloorStep::Load => "load",
        }
    }
}

/// How long one answer may take before the run is called lost.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);

/// `rounds` timed round trips (after `rounds / 10` warm-up ones) with `step` on the GPU side,
/// polling one load at a time (`gap_cycles` 0) or with four loads in flight issued
/// `gap_cycles` SM clock cycles apart,
/// on a kernel of `module` (gdx's own, [`Module::gdx_kernels`], loaded before: loading it here
/// could wait for another persistent kernel). Returns one duration per timed round trip.
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
) -> Result<Vec<Duration>, CudaError> {
    let kernel = module.kernel("gdx_pingpong")?;
    // Ping and pong on different 128-byte lines, so the host's stores to one do not disturb
    // its polls of the other.
    let words = MappedHostBuffer::new(ctx, 256)?;
    let (Some(ping), Some(pong)) = (words.word(0), words.word(16)) else {
        return Err(floor_err("mapped buffer too small (a bug)".to_string()));
    };
    let stream = Stream::new(ctx)?;
    let mut dev = DeviceBuffer::new(ctx, 8)?;
    stream.memset(&mut dev, 0, 8, 0)?;
    stream.synchronize()?;
    let mut args = KernelArgs::new();
    args.push_u64(words.device_ptr())
        .push_u64(words.device_ptr() + 16 * 8)
        .push_u64(dev.as_raw())
        .push_u32(step.mode())
        .push_u64(ANSWER_TIMEOUT.as_nanos() as u64)
        .push_u32(gap_cycles);
    // SAFETY: gdx_pingpong(u64* ping, u64* pong, u64* dev, u32 mode, u64 watchdog_ns,
    // u32 gap_cycles) matches
    // the arguments; ping and pong are words 0 and 16 of `words`, dev is 8 bytes of `dev`; both
    // buffers outlive the kernel: every path below ends with `stream.synchronize()` (the kernel
    // exits on ~0 in ping or after its watchdog) before they are dropped.
    unsafe { stream.launch(&kernel, LaunchDims::single_block(32), &mut args)? };
    let warm = rounds / 10;
    let mut out = Vec::with_capacity(rounds);
    let mut result = Ok(());
    for n in 1..=(warm + rounds) as u64 {
        let t = Instant::now();
        ping.store(n, Ordering::Release);
        let mut lost = false;
        while pong.load(Ordering::Acquire) != n {
            if t.elapsed() > ANSWER_TIMEOUT {
                lost = true;
                break;
            }
            std::hint::spin_loop();
        }
        if lost {
            result = Err(floor_err(format!(
                "round trip {n} ({}) not answered within {ANSWER_TIMEOUT:?} (pong {})",
                step.name(),
                pong.load(Ordering::Acquire)
            )));
            break;
        }
        if n > warm as u64 {
            out.push(t.elapsed());
        }
    }
    ping.store(u64::MAX, Ordering::Release);
    stream.synchronize()?;
    result.map(|()| out)
}

fn floor_err(reason: String) -> CudaError {
    CudaError::InvalidArgument {
        call: "cuda::floor::round_trips",
        reason,
    }
}
