//! [`timed_copy`]: copy between two places (GPU memory or pinned host memory) and time each
//! copy with events, then check every byte: the measurement `gdx doctor` and `gdx bench`
//! build on.
//!
//! Protocol (nvbandwidth's, in small):
//! 1. Allocate both ends (`cuMemAlloc_v2` and portable pinned memory, never the stream-ordered
//!    pool); for GPU↔GPU enable peer access both ways.
//! 2. Fill the source with a seeded pattern ([`fill_pattern`]; a GPU source through a pinned
//!    staging buffer), and poison the destination ([`POISON`]).
//! 3. On one stream (of the source GPU, or of the GPU end for host copies): hold the stream
//!    ([`Stream::hold`], when the driver has `cuLaunchHostFunc`), enqueue one warm-up copy and
//!    then `reps` copies, each between two timing events, release, and wait.
//! 4. Copy the destination back to pinned host memory and compare it with the pattern,
//!    reporting the first differing byte.

use super::copy::RawCopy;
use super::memory::HostMemory;
use super::{Context, Cuda, CudaError, DeviceBuffer, Event, PinnedHostBuffer, Stream};
use std::fmt;
use std::time::Duration;

// The pattern, its check and the poison live in `crate::pattern` (the one pattern of gdx);
// re-exported here because the probe's users found them here first.
pub use crate::pattern::{fill_pattern, find_mismatch, pattern, Mismatch, POISON};

/// The seed [`timed_copy`] fills the source with.
pub const SEED: u64 = 0x6764_785f_7072_6f62; // "gdx_prob"

/// One end of a timed copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Loc {
    /// Device memory of the GPU with this CUDA ordinal.
    Gpu(u32),
    /// Pinned (page-locked, portable) host memory.
    PinnedHost,
}

impl fmt::Display for Loc {
    /// `GPU 0` or `pinned host`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Loc::Gpu(o) => write!(f, "GPU {o}"),
            Loc::PinnedHost => f.write_str("pinned host"),
        }
    }
}

/// What [`timed_copy`] measured.
#[derive(Debug, Clone, PartialEq)]
pub struct TimedCopy {
    /// Source.
    pub from: Loc,
    /// Destination.
    pub to: Loc,
    /// Bytes per copy.
    pub bytes: usize,
    /// Each timed copy's duration, between device events (warm-up excluded).
    pub samples: Vec<Duration>,
    /// Whether enqueueing was kept out of the timings by holding the stream.
    pub held: bool,
    /// True when the destination held the pattern afterwards.
    pub verified: bool,
    /// The first differing byte when not verified.
    pub mismatch: Option<Mismatch>,
}

impl TimedCopy {
    /// The median sample's rate in GB/s (1e9 bytes per second); `None` without samples.
    pub fn median_gbps(&self) -> Option<f64> {
        crate::stats::median_rate_gbps(self.bytes as u64, &self.samples)
    }
}

/// The GPU the hardware tests run on: `GDX_TEST_GPU`, default 0 (every GPU test suite of the
/// workspace reads it through here).
pub fn test_gpu() -> u32 {
    std::env::var("GDX_TEST_GPU")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A pattern seed that differs per run, printed to stderr so that a failing test can be
/// replayed with the same bytes.
pub fn replay_seed() -> u64 {
    let s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    eprintln!("pattern seed {s:#x}");
    s
}

/// One end, allocated.
enum End {
    Gpu(DeviceBuffer),
    Host(PinnedHostBuffer),
}

/// Waits for a stream when dropped, so that no early return frees memory under a copy queued
/// with [`Stream::enqueue_raw`].
struct SyncOnDrop<'a>(&'a Stream);

impl Drop for SyncOnDrop<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.0.synchronize() {
            self.0.context().record_err(e);
        }
    }
}

/// Copy `bytes` from `from` to `to` once to warm up and then `reps` times, timing each copy
/// with events, and verify the destination (see the module docs). Host to host is refused.
pub fn timed_copy(
    cuda: &Cuda,
    from: Loc,
    to: Loc,
    bytes: usize,
    reps: u32,
) -> Result<TimedCopy, CudaError> {
    let ordinal = match (from, to) {
        (Loc::Gpu(o), _) | (Loc::PinnedHost, Loc::Gpu(o)) => o,
        (Loc::PinnedHost, Loc::PinnedHost) => {
            return Err(CudaError::InvalidArgument {
                call: "timed_copy",
                reason: "host to host copies are not probed: one end must be a GPU".to_string(),
            })
        }
    };
    if bytes == 0 {
        return Err(CudaError::InvalidArgument {
            call: "timed_copy",
            reason: "at least one byte must be copied".to_string(),
        });
    }
    let ctx = Context::new(&cuda.device(ordinal)?)?;
    let ctx_of = |loc: Loc| -> Result<Context, CudaError> {
        match loc {
            Loc::Gpu(o) if o != ordinal => Context::new(&cuda.device(o)?),
            _ => Ok(ctx.clone()),
        }
    };
    let (src_ctx, dst_ctx) = (ctx_of(from)?, ctx_of(to)?);
    if let (Loc::Gpu(a), Loc::Gpu(b)) = (from, to) {
        if a != b {
            src_ctx.enable_peer_access(&dst_ctx)?;
            dst_ctx.enable_peer_access(&src_ctx)?;
        }
    }
    let stream = Stream::new(&ctx)?;

    // The source: the pattern, written through a pinned staging buffer for a GPU.
    let mut pattern = PinnedHostBuffer::new(&ctx, bytes)?;
    let mut staging = None;
    fill_pattern(pattern.as_mut_slice()?, SEED);
    let src = match from {
        Loc::Gpu(_) => {
            let mut buf = DeviceBuffer::new(&src_ctx, bytes)?;
            stream.copy_to_device(&mut buf, &pattern)?;
            // Reused below, once the upload has read it.
            staging = Some(pattern);
            End::Gpu(buf)
        }
        Loc::PinnedHost => End::Host(pattern),
    };
    // The destination, poisoned.
    let dst = match to {
        Loc::Gpu(_) => {
            let mut buf = DeviceBuffer::new(&dst_ctx, bytes)?;
            stream.memset(&mut buf, 0, bytes, POISON)?;
            End::Gpu(buf)
        }
        Loc::PinnedHost => {
            let mut buf = match staging.take() {
                Some(b) => b,
                None => PinnedHostBuffer::new(&ctx, bytes)?,
            };
            buf.as_mut_slice()?.fill(POISON);
            End::Host(buf)
        }
    };
    let op = match (&src, &dst) {
        (End::Gpu(s), End::Gpu(d)) if s.context().same(d.context()) => RawCopy::DtoD {
            dst: d.as_raw(),
            src: s.as_raw(),
            len: bytes,
        },
        (End::Gpu(s), End::Gpu(d)) => RawCopy::Peer {
            dst: d.as_raw(),
            dst_ctx: d.context().as_raw(),
            src: s.as_raw(),
            src_ctx: s.context().as_raw(),
            len: bytes,
        },
        (End::Host(s), End::Gpu(d)) => RawCopy::HtoD {
            dst: d.as_raw(),
            src: s.host_range().0,
            len: bytes,
        },
        (End::Gpu(s), End::Host(d)) => RawCopy::DtoH {
            dst: d.host_range().0,
            src: s.as_raw(),
            len: bytes,
        },
        (End::Host(_), End::Host(_)) => return Err(unreachable_host_pair()),
    };
    let events = (0..=reps)
        .map(|_| Event::new(&ctx))
        .collect::<Result<Vec<_>, _>>()?;

    let held = {
        // Queued work must finish before `src`, `dst` or `staging` can go.
        let _sync = SyncOnDrop(&stream);
        stream.synchronize()?;
        ctx.make_current()?;
        let hold = if stream.can_hold() {
            Some(stream.hold()?)
        } else {
            None
        };
        // SAFETY: `op` addresses `bytes` bytes of `src` and `dst`, which live until `_sync`
        // has waited for the stream; the host touches neither meanwhile (the setup above was
        // synchronised, and the check below comes after `_sync`); both contexts are held by
        // the buffers; `ctx` is current.
        unsafe { stream.enqueue_raw(op) }?;
        events[0].record(&stream)?;
        for ev in &events[1..] {
            // SAFETY: as above.
            unsafe { stream.enqueue_raw(op) }?;
            ev.record(&stream)?;
        }
        let held = hold.is_some();
        drop(hold);
        stream.synchronize()?;
        held
    };
    let samples = events
        .windows(2)
        .map(|w| w[0].elapsed(&w[1]))
        .collect::<Result<Vec<_>, _>>()?;

    // Check: the destination, read back through pinned memory for a GPU.
    let mismatch = match &dst {
        End::Host(d) => find_mismatch(d.as_slice()?, SEED),
        End::Gpu(d) => {
            let mut check = match staging.take() {
                Some(b) => b,
                None => PinnedHostBuffer::new(&ctx, bytes)?,
            };
            check.as_mut_slice()?.fill(POISON);
            stream.copy_to_host(&mut check, d)?;
            find_mismatch(check.as_slice()?, SEED)
        }
    };
    Ok(TimedCopy {
        from,
        to,
        bytes,
        samples,
        held,
        verified: mismatch.is_none(),
        mismatch,
    })
}

/// The error for a host-to-host pair, which `timed_copy` refuses up front.
fn unreachable_host_pair() -> CudaError {
    CudaError::InvalidArgument {
        call: "timed_copy",
        reason: "host to host copies are not probed".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_rate_is_in_gb_per_second() {
        let mut t = TimedCopy {
            from: Loc::Gpu(0),
            to: Loc::Gpu(1),
            bytes: 1_000_000_000,
            samples: vec![
                Duration::from_millis(10),
                Duration::from_millis(1000),
                Duration::from_millis(5),
            ],
            held: true,
            verified: true,
            mismatch: None,
        };
        assert!((t.median_gbps().unwrap() - 100.0).abs() < 1e-9);
        t.samples.clear();
        assert_eq!(t.median_gbps(), None);
        assert_eq!(Loc::Gpu(1).to_string(), "GPU 1");
        assert_eq!(Loc::PinnedHost.to_string(), "pinned host");
    }

    #[test]
    fn host_to_host_is_refused_before_loading_anything() {
        // No driver call happens before the check, so any handle will do; without libcuda
        // there is none, and the check is the same code path either way.
        if let Ok(cuda) = Cuda::load() {
            let e = timed_copy(&cuda, Loc::PinnedHost, Loc::PinnedHost, 8, 1).unwrap_err();
            assert!(e.to_string().contains("host to host"), "{e}");
            let e = timed_copy(&cuda, Loc::Gpu(0), Loc::PinnedHost, 0, 1).unwrap_err();
            assert!(e.to_string().contains("at least one byte"), "{e}");
        }
    }
}
