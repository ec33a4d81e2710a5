//! [`BatchCopy`]: a list of device-to-device spans moved by one launch of `gdx_copy_batch`
//! (`kernels/gdx_kernels.cu`), where the copy engine takes one copy, and pays its fixed cost,
//! per span. A KV-cache block list of 1,000 × 16 KiB blocks is 1,000 copy-engine copies of a
//! few microseconds each, or one kernel that moves them all at the SMs' bandwidth.
//!
//! The descriptors live in a mapped pinned host buffer the kernel reads directly (no copy of
//! the list of its own). Invariant: that buffer is rewritten only after the launch that read it
//! has finished: each launch records `done`, and the next waits for it first.

use super::{CudaError, Event, Kernel, KernelArgs, LaunchDims, MappedHostBuffer, Module, Stream};

/// One span: `len` bytes from device address `src` to device address `dst`, both addresses in
/// the launching context's address space (its GPU's memory, a peer's through P2P, or another
/// process's allocation through its CUDA IPC mapping).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopySpan {
    /// Destination address.
    pub dst: u64,
    /// Source address.
    pub src: u64,
    /// Bytes.
    pub len: u64,
}

/// Bytes of one descriptor in the kernel's table (`CopyDesc`: dst, src, len).
const DESC_BYTES: usize = 24;
/// Bytes one thread block moves of a span: a long span is spread over several blocks.
const PART_BYTES: u64 = 64 << 10;
/// Threads per block.
const THREADS: u32 = 256;
/// The grid's y extent limit (parts of one span).
const MAX_PARTS: u64 = 65_535;

/// The batched copy of one context: its kernel, the descriptor table, the event of the last
/// launch. `Send`; one launch at a time (`&mut self`).
#[derive(Debug)]
pub struct BatchCopy {
    kernel: Kernel,
    descs: MappedHostBuffer,
    /// Recorded after each launch; waited for before the table is rewritten.
    done: Event,
    launched: bool,
}

impl BatchCopy {
    /// Loads gdx's kernels into `module`'s context and takes `gdx_copy_batch`, with a table for
    /// `capacity` spans (it grows on demand).
    pub fn new(module: &Module, capacity: usize) -> Result<BatchCopy, CudaError> {
        if !module.is_gdx() {
            return Err(CudaError::InvalidArgument {
                call: "BatchCopy::new",
                reason: "the module is not gdx's own kernels (Module::gdx_kernels)".to_string(),
            });
        }
        let ctx = module.context();
        Ok(BatchCopy {
            kernel: module.kernel("gdx_copy_batch")?,
            descs: MappedHostBuffer::new(ctx, capacity.max(1) * DESC_BYTES)?,
            done: Event::without_timing(ctx)?,
            launched: false,
        })
    }

    /// Queues one kernel on `stream` that copies every span of `spans`; returns at once (order
    /// after it with an event on `stream`). An empty list queues nothing.
    ///
    /// # Safety
    ///
    /// Every span's `src..src+len` and `dst..dst+len` are device memory accessible from the
    /// stream's context and stay allocated (and mapped) until the stream has passed the
    /// launch; no destination span overlaps another span of the list (source or destination),
    /// and nothing else writes the source spans or touches the destination spans meanwhile.
    pub unsafe fn launch(&mut self, stream: &Stream, spans: &[CopySpan]) -> Result<(), CudaError> {
        if spans.is_empty() {
            return Ok(());
        }
        let ctx = self.descs.context();
        if !ctx.same(stream.context()) {
            return Err(CudaError::InvalidArgument {
                call: "BatchCopy::launch",
                reason: format!(
                    "the batch copy belongs to GPU {} and the stream to GPU {}",
                    ctx.ordinal(),
                    stream.context().ordinal()
                ),
            });
        }
        let n = u32::try_from(spans.len()).map_err(|_| CudaError::InvalidArgument {
            call: "BatchCopy::launch",
            reason: format!("{} spans in one launch (at most {})", spans.len(), u32::MAX),
        })?;
        // The last launch may still be reading the table.
        if self.launched {
            self.done.synchronize()?;
            self.launched = false;
        }
        if self.descs.len() < spans.len() * DESC_BYTES {
            self.descs = MappedHostBuffer::new(ctx, spans.len().next_power_of_two() * DESC_BYTES)?;
        }
        // SAFETY: no launch reads the table now (the last one finished above, or none was
        // made), and this `&mut self` is the only writer.
        let table = unsafe { self.descs.bytes_mut() };
        let mut longest = 0u64;
        for (d, s) in table.chunks_exact_mut(DESC_BYTES).zip(spans) {
            d[..8].copy_from_slice(&s.dst.to_le_bytes());
            d[8..16].copy_from_slice(&s.src.to_le_bytes());
            d[16..].copy_from_slice(&s.len.to_le_bytes());
            longest = longest.max(s.len);
        }
        // Blocks per span: PART_BYTES each, more per block past the grid's y limit (16-byte
        // multiples, so the parts of an aligned span stay aligned).
        let part = PART_BYTES.max(longest.div_ceil(MAX_PARTS).next_multiple_of(16));
        let parts = longest.div_ceil(part).max(1) as u32;
        let mut args = KernelArgs::new();
        args.push_u64(self.descs.device_ptr())
            .push_u32(n)
            .push_u64(part);
        let dims = LaunchDims {
            grid: (n, parts, 1),
            block: (THREADS, 1, 1),
            shared_bytes: 0,
        };
        // SAFETY: gdx_copy_batch(const CopyDesc*, u32, u64) matches `args`; the table is mapped
        // memory owned by `self` and not rewritten before `done` (recorded next) has passed;
        // the spans' validity is the caller's contract.
        unsafe { stream.launch(&self.kernel, dims, &mut args)? };
        self.done.record(stream)?;
        self.launched = true;
        Ok(())
    }
}
