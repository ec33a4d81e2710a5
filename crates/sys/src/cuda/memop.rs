//! Stream memory operations (GPUDirect Async's building block): [`Stream::write_value64`]
//! (`cuStreamWriteValue64_v2`: when the stream reaches this point, write a word) and
//! [`Stream::wait_value64`] (`cuStreamWaitValue64_v2`: hold the stream until a word satisfies a
//! condition), on mapped host memory or device memory ([`Word`]); [`StreamMemOps`], what a GPU
//! supports; and [`Signal`], a counter word built on them.
//!
//! A write queued behind a kernel lands only after the kernel's writes (the default flags keep
//! the memory barrier), so a host thread that sees the word may read what the kernel wrote:
//! the host learns that queued work is done without `cuStreamSynchronize`, and another agent can
//! start a transfer at that moment. A wait lets a stream start its next kernel when a transfer's
//! completion word arrives, again without the host in the loop.

use super::api::CuDevicePtr;
use super::device::Attribute;
use super::{CudaError, Device, DeviceBuffer, MappedHostBuffer, Stream};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// `CU_STREAM_WAIT_VALUE_GEQ` and friends: when a wait is satisfied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitCondition {
    /// `(int64_t)(*addr - value) >= 0`: the counter reached `value` (wrap-around safe).
    Geq,
    /// `*addr == value`.
    Eq,
    /// `(*addr & value) != 0`.
    And,
    /// `~(*addr | value) != 0`; needs [`StreamMemOps::wait_nor`].
    Nor,
}

impl WaitCondition {
    fn raw(self) -> u32 {
        match self {
            WaitCondition::Geq => 0,
            WaitCondition::Eq => 1,
            WaitCondition::And => 2,
            WaitCondition::Nor => 3,
        }
    }
}

/// One 8-byte word a stream memory operation targets.
#[derive(Debug, Clone, Copy)]
pub enum Word<'a> {
    /// Word `index` of mapped host memory.
    Mapped(&'a MappedHostBuffer, usize),
    /// The 8 bytes at byte `offset` (a multiple of 8) of device memory.
    Device(&'a DeviceBuffer, usize),
}

impl Word<'_> {
    /// The device address, after checking bounds and alignment.
    fn address(&self, call: &'static str) -> Result<CuDevicePtr, CudaError> {
        match *self {
            Word::Mapped(b, i) => {
                if i >= b.words() {
                    return Err(CudaError::OutOfBounds {
                        what: "mapped host buffer",
                        offset: i.saturating_mul(8),
                        len: 8,
                        size: b.len(),
                    });
                }
                Ok(b.device_ptr() + (i as u64) * 8)
            }
            Word::Device(b, off) => {
                if off.checked_add(8).is_none_or(|end| end > b.len()) {
                    return Err(CudaError::OutOfBounds {
                        what: "device buffer",
                        offset: off,
                        len: 8,
                        size: b.len(),
                    });
                }
                let addr = b.as_raw() + off as u64;
                if !addr.is_multiple_of(8) {
                    return Err(CudaError::InvalidArgument {
                        call,
                        reason: format!("address {addr:#x} is not 8-byte aligned"),
                    });
                }
                Ok(addr)
            }
        }
    }

    fn mark(&self, stream: &Stream) -> Result<(), CudaError> {
        match self {
            Word::Mapped(b, _) => b.pending.mark(stream),
            Word::Device(b, _) => b.pending.mark(stream),
        }
    }
}

/// Which stream memory operations a GPU supports (`cuDeviceGetAttribute`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamMemOps {
    /// `CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS`: the 64-bit write and wait.
    pub ops_64bit: bool,
    /// `CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR`.
    pub wait_nor: bool,
    /// `CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES`: `CU_STREAM_WAIT_VALUE_FLUSH`.
    pub flush_remote_writes: bool,
    /// `CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY`: mapped host memory (the mailbox's ring).
    pub map_host_memory: bool,
    /// Whether the driver exports `cuStreamWriteValue64_v2` and `cuStreamWaitValue64_v2`.
    pub symbols: bool,
}

impl StreamMemOps {
    /// Whether [`Stream::write_value64`] and [`Stream::wait_value64`] can be used.
    pub fn usable(&self) -> bool {
        self.ops_64bit && self.symbols
    }
}

impl Device {
    /// The stream-memory-operation support of this GPU.
    pub fn stream_mem_ops(&self) -> Result<StreamMemOps, CudaError> {
        let flag = |a: Attribute| -> Result<bool, CudaError> { Ok(self.attribute(a)? != 0) };
        let api = self.cuda().api();
        Ok(StreamMemOps {
            ops_64bit: flag(Attribute::CanUse64BitStreamMemOps)?,
            wait_nor: flag(Attribute::CanUseStreamWaitValueNor)?,
            flush_remote_writes: flag(Attribute::CanFlushRemoteWrites)?,
            map_host_memory: flag(Attribute::CanMapHostMemory)?,
            symbols: api.cuStreamWriteValue64_v2.is_some() && api.cuStreamWaitValue64_v2.is_some(),
        })
    }
}

impl Stream {
    /// When the stream reaches this point (every operation queued before is done, their
    /// writes visible), write `value` to `word` (`cuStreamWriteValue64_v2`, default flags).
    pub fn write_value64(&self, word: Word<'_>, value: u64) -> Result<(), CudaError> {
        const CALL: &str = "cuStreamWriteValue64_v2";
        let Some(f) = self.context().api().cuStreamWriteValue64_v2 else {
            return Err(CudaError::MissingSymbol { call: CALL });
        };
        let addr = word.address(CALL)?;
        self.enter()?;
        // SAFETY: `addr` is 8 aligned bytes of live memory the GPU can address; `mark` below
        // keeps the buffer alive (its Drop waits) until the operation has run.
        let status = unsafe { f(self.raw(), addr, value, 0) };
        self.context().check(status, CALL)?;
        word.mark(self)
    }

    /// Hold the work queued after this call until `word` satisfies `cond` against `value`
    /// (`cuStreamWaitValue64_v2`). The host (or another stream, or a NIC) releases it by
    /// writing the word.
    pub fn wait_value64(
        &self,
        word: Word<'_>,
        value: u64,
        cond: WaitCondition,
    ) -> Result<(), CudaError> {
        const CALL: &str = "cuStreamWaitValue64_v2";
        let Some(f) = self.context().api().cuStreamWaitValue64_v2 else {
            return Err(CudaError::MissingSymbol { call: CALL });
        };
        let addr = word.address(CALL)?;
        self.enter()?;
        // SAFETY: as in `write_value64`.
        let status = unsafe { f(self.raw(), addr, value, cond.raw()) };
        self.context().check(status, CALL)?;
        word.mark(self)
    }
}

/// A 64-bit counter in mapped host memory that streams raise and wait on, and the host reads
/// and raises: [`Signal::arm`] queues "raise to n when the stream gets here", [`Signal::wait`]
/// spins (then yields) on the host until it reaches n, [`Signal::raise`] sets it from the host,
/// [`Signal::gate`] makes a stream wait for it.
#[derive(Debug)]
pub struct Signal {
    word: MappedHostBuffer,
    next: std::sync::atomic::AtomicU64,
}

/// How long [`Signal::wait`] spins before it starts yielding the thread.
pub const SPIN_BEFORE_YIELD: Duration = Duration::from_micros(50);

impl Signal {
    /// A counter at 0 in mapped memory of `ctx`.
    pub fn new(ctx: &super::Context) -> Result<Signal, CudaError> {
        Ok(Signal {
            word: MappedHostBuffer::new(ctx, 64)?,
            next: std::sync::atomic::AtomicU64::new(1),
        })
    }

    /// The current value.
    pub fn value(&self) -> u64 {
        self.word
            .word(0)
            .map(|w| w.load(Ordering::Acquire))
            .unwrap_or(0)
    }

    /// Queue on `stream`: raise the counter to the next ticket when the stream gets here.
    /// Returns the ticket.
    pub fn arm(&self, stream: &Stream) -> Result<u64, CudaError> {
        let t = self.next.fetch_add(1, Ordering::Relaxed);
        stream.write_value64(Word::Mapped(&self.word, 0), t)?;
        Ok(t)
    }

    /// Take the next ticket for the host to [`Signal::raise`] (and streams to [`Signal::gate`]
    /// on).
    pub fn ticket(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Set the counter to `ticket` from the host (releases streams gated on it).
    pub fn raise(&self, ticket: u64) {
        if let Some(w) = self.word.word(0) {
            w.store(ticket, Ordering::Release);
        }
    }

    /// Queue on `stream`: wait until the counter reaches `ticket`.
    pub fn gate(&self, stream: &Stream, ticket: u64) -> Result<(), CudaError> {
        stream.wait_value64(Word::Mapped(&self.word, 0), ticket, WaitCondition::Geq)
    }

    /// Whether the counter has reached `ticket` (wrap-around safe, as the GPU's GEQ).
    pub fn reached(&self, ticket: u64) -> bool {
        (self.value().wrapping_sub(ticket) as i64) >= 0
    }

    /// Wait on the host until the counter reaches `ticket`: spin for [`SPIN_BEFORE_YIELD`],
    /// then yield between looks. `false` when `timeout` passed first.
    pub fn wait(&self, ticket: u64, timeout: Duration) -> bool {
        let start = Instant::now();
        loop {
            if self.reached(ticket) {
                return true;
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return false;
            }
            if waited < SPIN_BEFORE_YIELD {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// The mapped word (e.g. for a kernel to poll).
    pub fn buffer(&self) -> &MappedHostBuffer {
        &self.word
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_conditions_match_cuda_h() {
        use cudarc::driver::sys::CUstreamWaitValue_flags as F;
        assert_eq!(WaitCondition::Geq.raw(), F::CU_STREAM_WAIT_VALUE_GEQ as u32);
        assert_eq!(WaitCondition::Eq.raw(), F::CU_STREAM_WAIT_VALUE_EQ as u32);
        assert_eq!(WaitCondition::And.raw(), F::CU_STREAM_WAIT_VALUE_AND as u32);
        assert_eq!(WaitCondition::Nor.raw(), F::CU_STREAM_WAIT_VALUE_NOR as u32);
    }
}
