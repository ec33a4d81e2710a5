//! [`PingPong`]: the GPU side of the floor under the mailbox. One GPU thread of `gdx_pingpong`
//! (`kernels/gdx_kernels.cu`) polls a ping word in mapped host memory and answers each new
//! ping on a pong word, with the [`FloorStep`] in between and nothing else in the way. Timing
//! the round trips is gdx-bench's (`gdx_bench::gpu::floor`): this module only launches,
//! pings and stops the kernel.
//!
//! Invariants: the ping and pong words are words 0 and 16 of one [`MappedHostBuffer`] (on
//! different 128-byte lines, so the host's stores to one do not disturb its polls of the
//! other), and the device word is 8 bytes of a [`DeviceBuffer`]; both are owned here and freed
//! only after the kernel has exited (dropping stops it and waits; if the wait fails they are
//! leaked, as the mailbox leaks its ring, never freed under a kernel that may still use them).
//! The kernel also ends by itself when no new ping came for the watchdog given to
//! [`PingPong::start`].

use super::{
    Context, CudaError, DeviceBuffer, KernelArgs, LaunchDims, MappedHostBuffer, Module, Stream,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

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

/// The ping word's index in the mapped buffer.
const PING: usize = 0;
/// The pong word's index (two 128-byte lines further on).
const PONG: usize = 16;
/// The value that tells the kernel to exit (and that it writes to pong on the way out).
const STOP: u64 = u64::MAX;

/// A running `gdx_pingpong` kernel on a stream of its own. Dropping it stops the kernel and
/// waits for it to exit.
#[derive(Debug)]
pub struct PingPong {
    stream: Stream,
    words: Arc<MappedHostBuffer>,
    dev: Arc<DeviceBuffer>,
    step: FloorStep,
    running: bool,
}

impl PingPong {
    /// Launch one GPU thread answering pings with `step`, polling one load at a time
    /// (`gap_cycles` 0) or with four loads in flight issued `gap_cycles` SM clock cycles apart,
    /// from `module` (gdx's own, [`Module::gdx_kernels`], loaded before: loading it while
    /// another persistent kernel runs could wait for that kernel). The kernel exits by itself
    /// when no new ping came for `watchdog`.
    ///
    /// # Errors
    /// `module` not being gdx's own, or a CUDA call failing.
    pub fn start(
        ctx: &Context,
        module: &Module,
        step: FloorStep,
        gap_cycles: u32,
        watchdog: Duration,
    ) -> Result<PingPong, CudaError> {
        if !module.is_gdx() {
            return Err(pingpong_err(
                "the module is not gdx's own kernels (Module::gdx_kernels)".to_string(),
            ));
        }
        let kernel = module.kernel("gdx_pingpong")?;
        let words = Arc::new(MappedHostBuffer::new(ctx, (PONG + 1) * 8)?);
        if words.word(PONG).is_none() {
            return Err(pingpong_err("mapped buffer too small (a bug)".to_string()));
        }
        let stream = Stream::new(ctx)?;
        let mut dev = DeviceBuffer::new(ctx, 8)?;
        stream.memset(&mut dev, 0, 8, 0)?;
        stream.synchronize()?;
        let dev = Arc::new(dev);
        let mut args = KernelArgs::new();
        args.push_u64(words.device_ptr() + (PING * 8) as u64)
            .push_u64(words.device_ptr() + (PONG * 8) as u64)
            .push_u64(dev.as_raw())
            .push_u32(step.mode())
            .push_u64(u64::try_from(watchdog.as_nanos()).unwrap_or(u64::MAX))
            .push_u32(gap_cycles);
        // SAFETY: gdx_pingpong(u64* ping, u64* pong, u64* dev, u32 mode, u64 watchdog_ns,
        // u32 gap_cycles) matches the arguments; ping and pong are words PING and PONG of
        // `words` (checked above), dev is the 8 bytes of `dev`. Both buffers are owned by the
        // `PingPong` returned below, which frees them only after the kernel has exited (its
        // `Drop` stops the kernel and synchronizes the stream, and leaks them if that fails).
        unsafe { stream.launch(&kernel, LaunchDims::single_block(32), &mut args)? };
        Ok(PingPong {
            stream,
            words,
            dev,
            step,
            running: true,
        })
    }

    /// The step the GPU thread takes before answering.
    pub fn step(&self) -> FloorStep {
        self.step
    }

    fn word(&self, index: usize) -> Option<&AtomicU64> {
        self.words.word(index)
    }

    /// Post ping `n` (release store). Pings are answered when they are greater than the last
    /// one the kernel saw: number them 1, 2, 3, …; `u64::MAX` stops the kernel.
    pub fn ping(&self, n: u64) {
        if let Some(w) = self.word(PING) {
            w.store(n, Ordering::Release);
        }
    }

    /// The last answer the GPU thread wrote (acquire load): 0 before the first, the ping's
    /// number after each, `u64::MAX` once the kernel has exited.
    pub fn pong(&self) -> u64 {
        self.word(PONG).map_or(0, |w| w.load(Ordering::Acquire))
    }

    /// Tell the kernel to exit and wait for it.
    ///
    /// # Errors
    /// The stream's synchronisation failing (the buffers are then leaked, not freed).
    pub fn stop(mut self) -> Result<(), CudaError> {
        self.finish()
    }

    fn finish(&mut self) -> Result<(), CudaError> {
        if self.running {
            self.ping(STOP);
            self.stream.synchronize()?;
            self.running = false;
        }
        Ok(())
    }
}

impl Drop for PingPong {
    fn drop(&mut self) {
        if let Err(e) = self.finish() {
            // The kernel may still use the buffers: never free memory it polls or writes.
            log::warn!(
                "the ping-pong kernel on GPU {} did not stop ({e}); leaking its buffers",
                self.stream.context().ordinal()
            );
            std::mem::forget(Arc::clone(&self.words));
            std::mem::forget(Arc::clone(&self.dev));
        }
    }
}

fn pingpong_err(reason: String) -> CudaError {
    CudaError::InvalidArgument {
        call: "cuLaunchKernel(gdx_pingpong)",
        reason,
    }
}
