//! The GPU stage for small frames: a persistent service kernel (`gdx_stream_service` in
//! `kernels/stream_checksum.cu`, one block, so one SM) reads each frame straight from its slot
//! in mapped pinned host memory and writes the checksum back into mapped memory. A frame costs
//! the host two stores and a poll, no driver call: at 4 KiB the copy-engine stage spends more
//! host time in `cuMemcpyHtoDAsync`, `cuLaunchKernel` and `cuStreamWriteValue64` than the frame
//! takes to move (issue #21's "the mailbox for small ones").
//!
//! Protocol (the ring words are 64-bit, written whole):
//! - the host fills slot `s` (the source's bytes), then writes submission word
//!   `sq[k % depth] = (k + 1) << 32 | s << 20 | len` for its `k`-th frame (release);
//! - the kernel serves frames in order `k = 0, 1, …`; for each it waits for the tag `k + 1`,
//!   reads the frame (16-byte loads that bypass the GPU caches), and writes
//!   `out[3 (k % depth) ..] = {checksum, sum_sq, k + 1}`, the tag last behind a system fence;
//! - a slot goes back to the source only after its frame's tag is seen, so the kernel never
//!   reads a slot the source is writing.
//!
//! The kernel stops on `Drop` (the stop word, then the stream is synchronised) and by itself
//! when the heartbeat thread stops advancing its word (the process died or hung). Memory is
//! allocated before the kernel starts and freed after it stopped: a `cuMemFreeHost` while it
//! runs would wait for it (see `gpu::mailbox`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gdx_sys::cuda::{
    Context, DeviceBuffer, Heartbeat, Kernel as CudaKernel, KernelArgs, LaunchDims,
    MappedHostBuffer, Module, Stream,
};

use super::gpu::STREAM_CHECKSUM_PTX;
use super::kernel::Output;
use super::stage::{SlotMem, Stage};
use gdx_engine::{Error, Result};

/// Frames up to this size take the service kernel: a 4 KiB frame is one 16-byte read per
/// thread; beyond two such rounds the copy engine moves the bytes faster than one block reads
/// them over PCIe.
pub const SERVICE_MAX_FRAME: usize = 8 << 10;
// The submission word packs the slot in 12 bits and the length in 20.
const _: () = assert!(SERVICE_MAX_FRAME < 1 << 20);

/// Threads of the service block (the `THREADS` of the .cu).
const THREADS: u32 = 256;
/// Control words (the `SVC_*` of the .cu).
const CTL_STOP: usize = 0;
const CTL_HEARTBEAT: usize = 8;
const CTL_STATE: usize = 16;
const CTL_SERVED: usize = 24;
/// Slot stride: slots start 256-byte aligned (16-byte loads, whole PCIe reads).
const ALIGN: usize = 256;
/// The kernel exits when the heartbeat has not moved for this long.
const WATCHDOG: Duration = Duration::from_secs(2);
/// A frame in flight longer than this is a stalled stage.
const STALL: Duration = Duration::from_secs(10);

/// The service-kernel stage on one GPU (see the module docs).
pub(crate) struct ServiceStage {
    gpu: u32,
    name: String,
    slots: Vec<Arc<MappedHostBuffer>>,
    /// Slots handed out by `alloc` so far.
    given: usize,
    sq: MappedHostBuffer,
    out: MappedHostBuffer,
    depth: usize,
    /// Frames submitted, and the oldest not yet seen done (its submit time).
    submitted: u64,
    done: u64,
    since: std::collections::VecDeque<Instant>,
    beat: Heartbeat,
    // Drop order after `Drop::drop` stopped the kernel: the stream, then the memory.
    stream: Stream,
    ctl: Arc<MappedHostBuffer>,
    _table: DeviceBuffer,
    _kernel: CudaKernel,
    _ctx: Context,
}

impl std::fmt::Debug for ServiceStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceStage")
            .field("gpu", &self.gpu)
            .field("submitted", &self.submitted)
            .field("done", &self.done)
            .finish()
    }
}

fn stage_err(gpu: u32, what: String) -> Error {
    Error::unavailable(None, format!("GPU{gpu} stream service kernel: {what}"))
}

impl ServiceStage {
    /// Open the stage on GPU `gpu` for `slots` slots of `slot_bytes` (at most
    /// [`SERVICE_MAX_FRAME`]): allocate every slot and ring in mapped host memory, load the
    /// PTX, start the kernel and wait until it runs.
    pub(crate) fn open(gpu: u32, slots: usize, slot_bytes: usize) -> Result<ServiceStage> {
        if slots == 0 || slots > 4096 || slot_bytes == 0 || slot_bytes > SERVICE_MAX_FRAME {
            return Err(Error::InvalidArgument(format!(
                "the service stage takes 1 to 4096 slots of 1 to {SERVICE_MAX_FRAME} bytes, not {slots} x {slot_bytes}"
            )));
        }
        let ctx = super::gpu::context_for(gpu)?;
        let module = Module::load_ptx(&ctx, STREAM_CHECKSUM_PTX)?;
        let kernel = module.kernel("gdx_stream_service")?;
        let stream = Stream::new(&ctx)?;
        let stride = slot_bytes.div_ceil(ALIGN) * ALIGN;
        // One allocation per slot (the source writes one while the kernel reads another);
        // their device addresses in a table in device memory the kernel indexes.
        let bufs = (0..slots)
            .map(|_| MappedHostBuffer::new(&ctx, stride).map(Arc::new))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let table_bytes: Vec<u8> = bufs
            .iter()
            .flat_map(|b| b.device_ptr().to_le_bytes())
            .collect();
        let mut table = DeviceBuffer::new(&ctx, table_bytes.len())?;
        stream.copy_from_pageable(&mut table, 0, &table_bytes)?;
        stream.synchronize()?;
        let depth = slots;
        let sq = MappedHostBuffer::new(&ctx, 8 * depth)?;
        let out = MappedHostBuffer::new(&ctx, 24 * depth)?;
        let ctl = Arc::new(MappedHostBuffer::new(&ctx, 8 * 32)?);
        let name = ctx
            .device()
            .info()
            .map(|i| i.name)
            .unwrap_or_else(|_| "GPU".into());
        let beat = Heartbeat::start(
            Arc::clone(&ctl),
            CTL_HEARTBEAT,
            WATCHDOG / 8,
            "gdx-stream-heartbeat",
        )
        .map_err(|e| stage_err(gpu, format!("cannot start the heartbeat thread: {e}")))?;
        let stage = ServiceStage {
            gpu,
            name,
            slots: bufs,
            given: 0,
            sq,
            out,
            depth,
            submitted: 0,
            done: 0,
            since: std::collections::VecDeque::new(),
            beat,
            stream,
            ctl,
            _table: table,
            _kernel: kernel,
            _ctx: ctx,
        };
        let mut args = KernelArgs::new();
        args.push_u64(stage.ctl.device_ptr())
            .push_u64(stage._table.as_raw())
            .push_u64(stage.sq.device_ptr())
            .push_u64(stage.out.device_ptr())
            .push_u32(depth as u32)
            .push_u64(WATCHDOG.as_nanos() as u64);
        // SAFETY: gdx_stream_service(u64* ctl, const u64* slot_table, u64* sq, u64* out,
        // u32 depth, u64 watchdog_ns) matches the arguments; ctl holds 32 words, the table
        // `slots` device addresses of slots of `stride` >= slot_bytes bytes, sq `depth` words,
        // out 3 x `depth`; the kernel reads at most `len` <= slot_bytes bytes of a slot named
        // in a submission word this stage wrote. All of it belongs to `stage`, whose Drop
        // stops the kernel and synchronises the stream before anything is freed (the slots
        // the pipeline holds are Arcs, freed only after this stage dropped its own).
        unsafe {
            stage
                .stream
                .launch(&stage._kernel, LaunchDims::single_block(THREADS), &mut args)?
        };
        let start = Instant::now();
        while stage.ctl_word(CTL_STATE) != 1 {
            if stage.stream.is_idle()? {
                return Err(stage_err(
                    gpu,
                    format!("exited at start (state {})", stage.ctl_word(CTL_STATE)),
                ));
            }
            if start.elapsed() > Duration::from_secs(5) {
                return Err(stage_err(gpu, "did not start within 5 s".into()));
            }
            std::thread::yield_now();
        }
        Ok(stage)
    }

    fn ctl_word(&self, i: usize) -> u64 {
        self.ctl.word(i).map_or(0, |w| w.load(Ordering::Acquire))
    }
}

impl Stage for ServiceStage {
    fn place(&self) -> String {
        format!(
            "gpu{} ({}): persistent service kernel reading frames from mapped pinned host memory (zero-copy, ≤ {} KiB frames, 1 SM reserved)",
            self.gpu,
            self.name,
            SERVICE_MAX_FRAME >> 10
        )
    }

    fn kernel_name(&self) -> String {
        "checksum".into()
    }

    fn alloc(&mut self, bytes: usize) -> Result<SlotMem> {
        let Some(b) = self.slots.get(self.given) else {
            return Err(Error::InvalidArgument(format!(
                "the service stage was opened for {} slots",
                self.slots.len()
            )));
        };
        if bytes > b.len() {
            return Err(Error::InvalidArgument(format!(
                "a slot of {bytes} bytes: the service stage was opened for {}",
                b.len()
            )));
        }
        self.given += 1;
        Ok(SlotMem::Mapped {
            buf: Arc::clone(b),
            index: self.given - 1,
            len: bytes,
        })
    }

    fn submit(&mut self, slot: &SlotMem, len: usize) -> Result<()> {
        let SlotMem::Mapped {
            index, len: cap, ..
        } = slot
        else {
            return Err(Error::InvalidArgument(
                "the service stage reads its own mapped slots only".into(),
            ));
        };
        if len == 0 || len > *cap {
            return Err(Error::InvalidArgument(format!(
                "a frame of {len} bytes does not fit the slot of {cap} bytes"
            )));
        }
        if self.submitted - self.done >= self.depth as u64 {
            return Err(stage_err(
                self.gpu,
                "more frames in flight than slots (a bug)".into(),
            ));
        }
        let k = self.submitted;
        let word = ((k + 1) << 32) | ((*index as u64) << 20) | len as u64;
        let w = self
            .sq
            .word((k % self.depth as u64) as usize)
            .ok_or_else(|| stage_err(self.gpu, "submission ring out of range".into()))?;
        // Release: the source's bytes (written through the slot's slice) before the word.
        w.store(word, Ordering::Release);
        self.submitted += 1;
        self.since.push_back(Instant::now());
        Ok(())
    }

    fn poll(&mut self) -> Result<Option<Output>> {
        if self.done == self.submitted {
            return Ok(None);
        }
        let k = self.done;
        let at = 3 * (k % self.depth as u64) as usize;
        let word = |i: usize| {
            self.out
                .word(at + i)
                .map_or(0, |w| w.load(Ordering::Acquire))
        };
        if word(2) != k + 1 {
            let state = self.ctl_word(CTL_STATE);
            if state != 1 {
                return Err(stage_err(
                    self.gpu,
                    format!(
                        "stopped (state {state}, {} frames served) with frame {k} in flight",
                        self.ctl_word(CTL_SERVED)
                    ),
                ));
            }
            if self.since.front().is_some_and(|t| t.elapsed() > STALL) {
                return Err(stage_err(
                    self.gpu,
                    format!("frame {k} not done after {STALL:?} (the kernel still runs)"),
                ));
            }
            return Ok(None);
        }
        // The tag was written after the two result words, behind a system fence.
        let out = Output([word(0), word(1)]);
        self.done += 1;
        self.since.pop_front();
        Ok(Some(out))
    }
}

impl Drop for ServiceStage {
    fn drop(&mut self) {
        if let Some(w) = self.ctl.word(CTL_STOP) {
            w.store(1, Ordering::Release);
        }
        if let Err(e) = self.stream.synchronize() {
            log::warn!("gdx stream: the service kernel did not stop cleanly: {e}");
        }
        self.beat.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_source_and_this_side_agree_on_the_layout() {
        let cu = include_str!("../kernels/stream_checksum.cu");
        for (name, v) in [
            ("SVC_STOP", CTL_STOP),
            ("SVC_HEARTBEAT", CTL_HEARTBEAT),
            ("SVC_STATE", CTL_STATE),
            ("SVC_SERVED", CTL_SERVED),
        ] {
            assert!(
                cu.contains(&format!("#define {name} {v}\n")),
                "{name} = {v}"
            );
        }
        assert!(cu.contains(&format!("#define THREADS {THREADS}\n")));
        assert!(STREAM_CHECKSUM_PTX.contains(".visible .entry gdx_stream_service("));
    }

    #[test]
    fn opening_refuses_what_the_submission_word_cannot_carry() {
        for (slots, bytes) in [(0, 64), (4097, 64), (8, 0), (8, SERVICE_MAX_FRAME + 1)] {
            let e = ServiceStage::open(0, slots, bytes).unwrap_err();
            assert!(
                matches!(e, Error::InvalidArgument(_)),
                "{slots} x {bytes}: {e}"
            );
        }
    }
}
