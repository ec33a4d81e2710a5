//! The GPU stage: each frame is copied host → GPU on the copy engine from its pinned slot, the
//! checksum kernel (`kernels/stream_checksum.cu`, shipped as PTX; the same math as
//! [`super::checksum`]) reduces it and writes its two result words into mapped host memory,
//! and a stream memory operation (`cuStreamWriteValue64`, through gdx-sys's [`Signal`]) raises a
//! counter behind it. The host never synchronises the stream: a frame is done, and its slot goes
//! back to the source, when the counter has reached the frame's ticket.
//!
//! Copies run on a stream of their own, back to back, so the copy engine never waits for a
//! kernel; each kernel waits for its frame's copy (an event) on the compute stream, where
//! kernels and signals run in frame order and one reduction scratch buffer serves every frame. Frames of at most 8 KiB take the service
//! kernel instead (`gpu_service`), unless the pipeline is told to use the copy engine only.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use gdx_sys::cuda::{
    Context, Cuda, DeviceBuffer, Event, Kernel as CudaKernel, KernelArgs, LaunchDims,
    MappedHostBuffer, Module, PinnedHostBuffer, Signal, Stream,
};

use super::kernel::Output;
use super::stage::{SlotMem, Stage};
use gdx_engine::{Error, Result};

/// The checksum kernel's PTX (regenerate with `scripts/gen-ptx.sh`).
pub const STREAM_CHECKSUM_PTX: &str = include_str!("../kernels/stream_checksum.ptx");

/// Threads per block (the `THREADS` of the .cu).
const THREADS: u32 = 256;
/// Most blocks per frame: enough to fill an H200 several times over; also the size of the
/// partials buffer.
const MAX_BLOCKS: u32 = 1024;
/// Words each thread reduces at least before another block is worth launching.
const WORDS_PER_THREAD: u64 = 8;
/// A frame in flight longer than this is a stalled stage, reported with what the GPU side
/// shows (the signal word, whether the stream is idle): even a 1 GiB frame takes well under a
/// second at PCIe rates, so this never trips on a healthy stage.
const STALL: Duration = Duration::from_secs(10);

/// Blocks for a frame of `len` bytes.
fn blocks_for(len: usize) -> u32 {
    let words = (len as u64).div_ceil(4);
    let b = words.div_ceil(u64::from(THREADS) * WORDS_PER_THREAD);
    u32::try_from(b.clamp(1, u64::from(MAX_BLOCKS))).unwrap_or(MAX_BLOCKS)
}

/// A GPU stage on one device (see the module docs).
pub struct GpuStage {
    gpu: u32,
    name: String,
    // Field order is drop order after `Drop::drop` synchronised the streams.
    stream: Stream,
    copies: Stream,
    /// Per GPU slot: recorded on `copies` after the slot's copy, waited for by `stream`.
    copied: Vec<Event>,
    kernel: CudaKernel,
    dev: Vec<DeviceBuffer>,
    partials: DeviceBuffer,
    counter: DeviceBuffer,
    out: MappedHostBuffer,
    signal: Signal,
    /// (ticket, result index, submit time) of each frame in flight, oldest first.
    inflight: VecDeque<(u64, usize, Instant)>,
    submitted: usize,
    /// Polls since the last stream check (see [`Stage::poll`]).
    polls: u32,
    /// Host time spent in each submit step (copy, launch, signal), from submitted to seen
    /// done, and frames, for
    /// `GDX_STREAM_PROFILE=1` (printed when the stage is dropped).
    profile: Option<([Duration; 4], u64)>,
    ctx: Context,
}

impl std::fmt::Debug for GpuStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuStage")
            .field("gpu", &self.gpu)
            .field("inflight", &self.inflight.len())
            .finish()
    }
}

impl GpuStage {
    /// Open the stage on CUDA device `gpu` for up to `slots` frames in flight of at most
    /// `slot_bytes` each: load the PTX, allocate one device buffer per slot, the reduction
    /// scratch, the mapped result words and the signal.
    ///
    /// # Errors
    /// [`Error::Unavailable`] without a CUDA driver or without that GPU (the message says how to
    /// run host-only); [`Error::Cuda`] when a CUDA call fails (the PTX does not load, out of
    /// memory, no stream memory operations).
    pub fn open(gpu: u32, slots: usize, slot_bytes: usize) -> Result<GpuStage> {
        if slots == 0 || slot_bytes == 0 {
            return Err(Error::InvalidArgument(
                "the GPU stage needs at least one slot of at least one byte".into(),
            ));
        }
        let ctx = context_for(gpu)?;
        let module = Module::load_ptx(&ctx, STREAM_CHECKSUM_PTX)?;
        let kernel = module.kernel("gdx_stream_checksum")?;
        let stream = Stream::new(&ctx)?;
        let copies = Stream::new(&ctx)?;
        let copied = (0..slots)
            .map(|_| Event::without_timing(&ctx))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let dev = (0..slots)
            .map(|_| DeviceBuffer::new(&ctx, slot_bytes))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let partials = DeviceBuffer::new(&ctx, 16 * MAX_BLOCKS as usize)?;
        let mut counter = DeviceBuffer::new(&ctx, 8)?;
        stream.memset(&mut counter, 0, 8, 0)?;
        stream.synchronize()?;
        let out = MappedHostBuffer::new(&ctx, 16 * slots)?;
        let signal = Signal::new(&ctx)?;
        let name = ctx
            .device()
            .info()
            .map(|i| i.name)
            .unwrap_or_else(|_| "GPU".into());
        Ok(GpuStage {
            gpu,
            name,
            stream,
            copies,
            copied,
            kernel,
            dev,
            partials,
            counter,
            out,
            signal,
            inflight: VecDeque::new(),
            submitted: 0,
            polls: 0,
            profile: std::env::var_os("GDX_STREAM_PROFILE").map(|_| ([Duration::ZERO; 4], 0)),
            ctx,
        })
    }
}

/// The context of GPU `gpu`, or an error saying what is missing (the driver, that GPU) and how
/// to run without it.
pub(super) fn context_for(gpu: u32) -> Result<Context> {
    let cuda = Cuda::load().map_err(|e| {
        Error::unavailable(
            None,
            format!(
                "--gpu {gpu}: no CUDA driver ({e}); run without --gpu for the host-only pipeline"
            ),
        )
    })?;
    let count = cuda.device_count()?;
    if gpu >= count {
        return Err(Error::unavailable(None, format!(
            "--gpu {gpu}: GPU{gpu} is not present (this machine has {count} GPU{}); run without --gpu for the host-only pipeline",
            if count == 1 { "" } else { "s" }
        )));
    }
    Ok(cuda.context(gpu)?)
}

impl Stage for GpuStage {
    fn place(&self) -> String {
        format!(
            "gpu{} ({}): H2D on the copy engine from pinned slots, PTX kernel, slots released by stream signals",
            self.gpu, self.name
        )
    }

    fn kernel_name(&self) -> String {
        "checksum".into()
    }

    fn alloc(&mut self, bytes: usize) -> Result<SlotMem> {
        Ok(SlotMem::Pinned(PinnedHostBuffer::new(&self.ctx, bytes)?))
    }

    fn submit(&mut self, slot: &SlotMem, len: usize) -> Result<()> {
        let SlotMem::Pinned(src) = slot else {
            return Err(Error::InvalidArgument(
                "the GPU stage reads pinned slots only".into(),
            ));
        };
        let i = self.submitted % self.dev.len();
        let dst = &mut self.dev[i];
        if len == 0 || len > dst.len() {
            return Err(Error::InvalidArgument(format!(
                "a frame of {len} bytes does not fit the GPU slot of {} bytes",
                dst.len()
            )));
        }
        // Host time per step only when profiling (`GDX_STREAM_PROFILE`): no clock reads on
        // the hot path otherwise.
        let clock = |on: bool| on.then(Instant::now);
        let on = self.profile.is_some();
        let t0 = clock(on);
        self.copies.copy_to_device_at(dst, 0, src, 0, len)?;
        self.copied[i].record(&self.copies)?;
        self.stream.wait_event(&self.copied[i])?;
        let t1 = clock(on);
        let mut args = KernelArgs::new();
        args.push_u64(dst.as_raw())
            .push_u64(len as u64)
            .push_u64(self.partials.as_raw())
            .push_u64(self.counter.as_raw())
            .push_u64(self.out.device_ptr() + 16 * i as u64);
        // SAFETY: the arguments match gdx_stream_checksum(const u8*, u64, u64*, u32*, u64*) in
        // number, order and size (pointers as u64); the frame buffer holds `len` bytes, the
        // partials 2 x MAX_BLOCKS words (the grid is at most MAX_BLOCKS), the counter one word,
        // and result slot `i` two words of the mapped buffer. All belong to `self`, and `Drop`
        // synchronises both streams before any is freed; the kernel starts after the slot's
        // copy (the event), and slot `i` is not copied into again before this frame's signal
        // (at most `slots` frames are in flight).
        unsafe {
            self.stream.launch(
                &self.kernel,
                LaunchDims::linear(blocks_for(len), THREADS),
                &mut args,
            )?;
        }
        let t2 = clock(on);
        let ticket = self.signal.arm(&self.stream)?;
        let t3 = Instant::now();
        if let (Some((steps, frames)), Some(t0), Some(t1), Some(t2)) =
            (&mut self.profile, t0, t1, t2)
        {
            steps[0] += t1 - t0;
            steps[1] += t2 - t1;
            steps[2] += t3 - t2;
            *frames += 1;
        }
        self.inflight.push_back((ticket, i, t3));
        self.submitted = self.submitted.wrapping_add(1);
        Ok(())
    }

    fn poll(&mut self) -> Result<Option<Output>> {
        let Some(&(ticket, i, since)) = self.inflight.front() else {
            return Ok(None);
        };
        if !self.signal.reached(ticket) {
            // A stream that failed (a kernel fault, a copy error) never writes its signals:
            // every so often ask the stream, so a failure is an error, never a silent hang.
            self.polls = self.polls.wrapping_add(1);
            if !self.polls.is_multiple_of(256) {
                return Ok(None);
            }
            let idle = self.stream.is_idle()?;
            if self.signal.reached(ticket) {
                return Ok(None);
            }
            if !idle {
                if since.elapsed() < STALL {
                    return Ok(None);
                }
                return Err(Error::unavailable(
                    None,
                    format!(
                    "GPU{}: frame ticket {ticket} has been in flight for {:.1} s and its stream \
                     is still busy (signal word {}, {} frames in flight, {} submitted): the \
                     copy or the checksum kernel does not finish",
                    self.gpu,
                    since.elapsed().as_secs_f64(),
                    self.signal.value(),
                    self.inflight.len(),
                    self.submitted
                ),
                ));
            }
            return Err(Error::unavailable(
                None,
                format!(
                    "GPU{}: the stream finished its queued work but the signal for frame ticket \
                 {ticket} never arrived (signal word {}): stream memory operations did not \
                 land in mapped host memory",
                    self.gpu,
                    self.signal.value()
                ),
            ));
        }
        self.inflight.pop_front();
        if let Some((steps, _)) = &mut self.profile {
            steps[3] += since.elapsed();
        }
        // The signal is written after the kernel (stream order, with its memory barrier), and
        // the kernel fenced its result words to the system first: they are final.
        let word = |k: usize| {
            self.out
                .word(k)
                .map(|w| w.load(std::sync::atomic::Ordering::Acquire))
                .ok_or_else(|| Error::unavailable(None, "GPU result word out of range"))
        };
        Ok(Some(Output([word(2 * i)?, word(2 * i + 1)?])))
    }
}

impl Drop for GpuStage {
    fn drop(&mut self) {
        // Nothing may be freed while a copy or kernel still uses it.
        for s in [&self.copies, &self.stream] {
            if let Err(e) = s.synchronize() {
                log::warn!("gdx stream: GPU stage stream did not finish cleanly: {e}");
            }
        }
        if let Some((steps, frames)) = self.profile.filter(|p| p.1 > 0) {
            let us = |d: Duration| d.as_secs_f64() * 1e6 / frames as f64;
            eprintln!(
                "gdx stream profile: {frames} frames, host µs per frame: copy {:.2}, launch {:.2}, signal {:.2}; submitted → seen done {:.2}",
                us(steps[0]),
                us(steps[1]),
                us(steps[2]),
                us(steps[3])
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ptx_has_the_entry_point_and_the_grid_stays_within_the_scratch() {
        assert!(STREAM_CHECKSUM_PTX.contains(".visible .entry gdx_stream_checksum("));
        assert_eq!(blocks_for(1), 1);
        assert_eq!(blocks_for(4096), 1);
        assert_eq!(blocks_for(4 << 20), 512);
        assert_eq!(blocks_for(1 << 30), MAX_BLOCKS);
    }

    /// One frame through the stage step by step, on the thread that opened it and then on
    /// another thread (as the pipeline runs it), each wait bounded: a stage that never
    /// completes fails here with the signal word and the stream state, not a hang.
    #[test]
    #[ignore = "requires a CUDA GPU"]
    fn one_frame_at_a_time_on_the_opening_thread_and_on_another() {
        let gpu = std::env::var("GDX_TEST_GPU")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut stage = GpuStage::open(gpu, 2, 4096 + 3).unwrap();
        let mut slots = [
            stage.alloc(4096 + 3).unwrap(),
            stage.alloc(4096 + 3).unwrap(),
        ];
        let one = |stage: &mut GpuStage, slot: &mut SlotMem, len: usize, tag: u8| {
            let bytes = slot.bytes_mut().unwrap();
            gdx_base::pattern::fill_pattern(&mut bytes[..len], u64::from(tag));
            let want = super::super::checksum(&bytes[..len]);
            stage.submit(slot, len).unwrap();
            let start = Instant::now();
            loop {
                if let Some(out) = stage.poll().unwrap() {
                    assert_eq!(out, want, "frame {tag} of {len} bytes");
                    return;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "frame {tag}: no completion after 20 s (signal word {}, stream idle {:?})",
                    stage.signal.value(),
                    stage.stream.is_idle()
                );
                std::hint::spin_loop();
            }
        };
        let [a, b] = &mut slots;
        one(&mut stage, a, 4096, 1);
        one(&mut stage, b, 7, 2);
        std::thread::scope(|s| {
            s.spawn(|| {
                one(&mut stage, a, 4096 + 3, 3);
                one(&mut stage, b, 1, 4);
            });
        });
    }
}
