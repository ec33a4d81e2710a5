//! The measurements behind the active probes, timed with gdx-sys's one [`Timer`] and
//! gdx-base's wall clock: a pattern-verified copy between two places ([`timed_copy`]) and
//! mailbox round trips ([`mailbox_round_trips`]). [`crate::probe`] decides what to probe and
//! judges the figures; the bytes are moved and timed here, with the clocks every `gdx bench`
//! case times with.
//!
//! Copy protocol (nvbandwidth's, in small):
//! 1. Allocate both ends (`cuMemAlloc_v2` and pinned memory, never the stream-ordered pool,
//!    whose peer copies silently take a slow path); for GPU↔GPU enable peer access both ways.
//! 2. Fill the source with the seeded pattern ([`gdx_base::pattern`]; a GPU source through a
//!    pinned staging buffer), and poison the destination.
//! 3. On one stream (of the source GPU, or of the GPU end for host copies): one warm-up copy,
//!    then `reps` copies, each between the timer's two events while the stream is held (when
//!    the driver has `cuLaunchHostFunc`), so enqueue cost stays out of the sample.
//! 4. Copy the destination back to pinned host memory and compare it with the pattern.

use std::fmt;
use std::time::Duration;

use gdx_base::pattern::{fill_pattern, find_mismatch, Mismatch, POISON};
use gdx_sys::cuda::{
    Cuda, CudaError, DeviceBuffer, Mailbox, MailboxConfig, PinnedHostBuffer, Stream,
};

use gdx_base::clock::wall;
use gdx_sys::timer::Timer;

/// The seed the copy probe fills its source with (gdx-base's one probe seed).
pub use gdx_base::pattern::SEED;

/// One end of a timed copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Loc {
    /// Device memory of the GPU with this CUDA ordinal.
    Gpu(u32),
    /// Pinned (page-locked) host memory.
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
pub struct ProbeCopy {
    /// Bytes per copy.
    pub bytes: usize,
    /// Each timed copy's device time (warm-up excluded).
    pub samples: Vec<Duration>,
    /// Whether the stream was held while each copy was queued.
    pub held: bool,
    /// The first byte that differs from the pattern afterwards; `None` when all match.
    pub mismatch: Option<Mismatch>,
}

/// One end of the copy, allocated.
enum End {
    Gpu(DeviceBuffer),
    Host(PinnedHostBuffer),
}

fn refuse(reason: &str) -> CudaError {
    CudaError::InvalidArgument {
        call: "timed_copy",
        reason: reason.to_string(),
    }
}

/// Queue one copy of all of `src` into `dst` on `stream`.
fn copy(stream: &Stream, src: &End, dst: &mut End, bytes: usize) -> Result<(), CudaError> {
    match (src, dst) {
        (End::Gpu(s), End::Gpu(d)) if s.context().same(d.context()) => {
            stream.copy_device(d, 0, s, 0, bytes)
        }
        (End::Gpu(s), End::Gpu(d)) => stream.copy_peer(d, 0, s, 0, bytes),
        (End::Host(s), End::Gpu(d)) => stream.copy_to_device(d, s),
        (End::Gpu(s), End::Host(d)) => stream.copy_to_host(d, s),
        (End::Host(_), End::Host(_)) => Err(refuse("one end must be a GPU")),
    }
}

/// Copy `bytes` from `from` to `to` once to warm up and then `reps` times, each timed with
/// device events, and check the destination against the pattern (see the module docs). Host
/// to host, and an empty copy, are refused.
pub fn timed_copy(
    cuda: &Cuda,
    from: Loc,
    to: Loc,
    bytes: usize,
    reps: u32,
) -> Result<ProbeCopy, CudaError> {
    let ordinal = match (from, to) {
        (Loc::Gpu(o), _) | (Loc::PinnedHost, Loc::Gpu(o)) => o,
        (Loc::PinnedHost, Loc::PinnedHost) => {
            return Err(refuse(
                "host to host copies are not probed: one end must be a GPU",
            ))
        }
    };
    if bytes == 0 {
        return Err(refuse("at least one byte must be copied"));
    }
    let ctx = cuda.context(ordinal)?;
    let ctx_of = |loc: Loc| match loc {
        Loc::Gpu(o) if o != ordinal => cuda.context(o),
        _ => Ok(ctx.clone()),
    };
    let (src_ctx, dst_ctx) = (ctx_of(from)?, ctx_of(to)?);
    if let (Loc::Gpu(a), Loc::Gpu(b)) = (from, to) {
        if a != b {
            src_ctx.enable_peer_access(&dst_ctx)?;
            dst_ctx.enable_peer_access(&src_ctx)?;
        }
    }
    let stream = Stream::new(&ctx)?;

    // The source: the pattern, uploaded through pinned memory for a GPU (which is then free
    // to be the destination or the read-back buffer).
    let mut pattern = PinnedHostBuffer::new(&ctx, bytes)?;
    fill_pattern(pattern.as_mut_slice()?, SEED);
    let mut spare = None;
    let src = match from {
        Loc::Gpu(_) => {
            let mut buf = DeviceBuffer::new(&src_ctx, bytes)?;
            stream.copy_to_device(&mut buf, &pattern)?;
            stream.synchronize()?;
            spare = Some(pattern);
            End::Gpu(buf)
        }
        Loc::PinnedHost => End::Host(pattern),
    };
    let mut dst = match to {
        Loc::Gpu(_) => {
            let mut buf = DeviceBuffer::new(&dst_ctx, bytes)?;
            stream.memset(&mut buf, 0, bytes, POISON)?;
            End::Gpu(buf)
        }
        Loc::PinnedHost => {
            let mut buf = match spare.take() {
                Some(b) => b,
                None => PinnedHostBuffer::new(&ctx, bytes)?,
            };
            buf.as_mut_slice()?.fill(POISON);
            End::Host(buf)
        }
    };

    copy(&stream, &src, &mut dst, bytes)?;
    stream.synchronize()?;
    let mut timer = Timer::events(&[&stream])?;
    let mut samples = Vec::with_capacity(reps as usize);
    let mut held = true;
    for _ in 0..reps {
        let hold = if stream.can_hold() {
            Some(stream.hold()?)
        } else {
            held = false;
            None
        };
        timer.start()?;
        copy(&stream, &src, &mut dst, bytes)?;
        timer.stop()?;
        drop(hold);
        samples.push(timer.read()?);
    }
    stream.synchronize()?;

    let mismatch = match &dst {
        End::Host(d) => find_mismatch(d.as_slice()?, SEED),
        End::Gpu(d) => {
            let mut check = match spare.take() {
                Some(b) => b,
                None => PinnedHostBuffer::new(&ctx, bytes)?,
            };
            check.as_mut_slice()?.fill(POISON);
            stream.copy_to_host(&mut check, d)?;
            stream.synchronize()?;
            find_mismatch(check.as_slice()?, SEED)
        }
    };
    Ok(ProbeCopy {
        bytes,
        samples,
        held,
        mismatch,
    })
}

/// What [`mailbox_round_trips`] measured.
#[derive(Debug, Clone, PartialEq)]
pub struct MailboxTrips {
    /// Each round trip (an 8-byte write, then its read back), host wall time.
    pub samples: Vec<Duration>,
    /// The first round whose read differed from its write: (round, wrote, read). The trips stop
    /// there.
    pub mismatch: Option<(u64, [u8; 8], [u8; 8])>,
}

/// `reps` round trips through GPU `gpu`'s mailbox: 8 bytes written to device memory and read
/// back, each timed on the host's clock and checked.
pub fn mailbox_round_trips(cuda: &Cuda, gpu: u32, reps: u32) -> Result<MailboxTrips, CudaError> {
    let ctx = cuda.context(gpu)?;
    let dev = DeviceBuffer::new(&ctx, 8)?;
    let mb = Mailbox::start(&ctx, MailboxConfig::default())?;
    let mut out = MailboxTrips {
        samples: Vec::with_capacity(reps as usize),
        mismatch: None,
    };
    let mut back = [0u8; 8];
    for i in 0..u64::from(reps) {
        let want = (i ^ 0x6764_785f_6d62_6f78).to_le_bytes();
        let (done, d) = wall(|| -> Result<(), CudaError> {
            mb.write(&dev, 0, &want)?;
            mb.read(&dev, 0, &mut back)
        });
        done?;
        out.samples.push(d);
        if back != want {
            out.mismatch = Some((i, want, back));
            break;
        }
    }
    mb.stop()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ends_name_themselves() {
        assert_eq!(Loc::Gpu(1).to_string(), "GPU 1");
        assert_eq!(Loc::PinnedHost.to_string(), "pinned host");
    }

    #[test]
    fn host_to_host_and_empty_copies_are_refused_before_any_driver_call() {
        // The checks come first, so any handle will do; without libcuda there is none.
        if let Ok(cuda) = Cuda::load() {
            let e = timed_copy(&cuda, Loc::PinnedHost, Loc::PinnedHost, 8, 1).unwrap_err();
            assert!(e.to_string().contains("one end must be a GPU"), "{e}");
            let e = timed_copy(&cuda, Loc::Gpu(0), Loc::PinnedHost, 0, 1).unwrap_err();
            assert!(e.to_string().contains("at least one byte"), "{e}");
        }
    }
}
