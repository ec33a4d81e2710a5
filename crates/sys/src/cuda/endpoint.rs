//! Copies between any two ends ([`Src`], [`Dst`]: device memory or page-locked host memory),
//! the driver call chosen from the ends: `cuMemcpyDtoDAsync_v2` within one context,
//! `cuMemcpyPeerAsync` across contexts, `cuMemcpyHtoDAsync_v2` / `cuMemcpyDtoHAsync_v2` with
//! host memory.
//!
//! Three forms, for the engine's three needs:
//! - [`Stream::copy`]: queued and tracked like the other copy methods (the buffers' last-use
//!   markers are ordered before and recorded after), returns at once.
//! - [`Stream::copy_blocking`]: ordered after the buffers' last uses, queued, and waited for
//!   with `cuStreamSynchronize` before returning; no marker is recorded (the borrow covers the
//!   copy). The thin path for small latency-bound copies: one copy call and one synchronise.
//! - [`Stream::copy_split`]: one copy cut into contiguous pieces over several streams of one
//!   context (fork and join through events), to use more copy engines.

use super::copy::{device_at, host_at, RawCopy};
use super::memory::HostBuffer;
use super::{CudaError, DeviceBuffer, Event, Stream};

/// The source of a copy.
#[derive(Clone, Copy)]
pub enum Src<'a> {
    /// Device memory.
    Device(&'a DeviceBuffer),
    /// Page-locked host memory.
    Host(&'a dyn HostBuffer),
}

/// The destination of a copy.
pub enum Dst<'a> {
    /// Device memory.
    Device(&'a mut DeviceBuffer),
    /// Page-locked host memory.
    Host(&'a mut dyn HostBuffer),
}

impl std::fmt::Debug for Src<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Src::Device(d) => write!(f, "Src::Device({d:?})"),
            Src::Host(h) => write!(f, "Src::Host({} bytes)", h.size()),
        }
    }
}

impl std::fmt::Debug for Dst<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dst::Device(d) => write!(f, "Dst::Device({d:?})"),
            Dst::Host(h) => write!(f, "Dst::Host({} bytes)", h.size()),
        }
    }
}

impl Src<'_> {
    fn pending(&self) -> &super::event::Pending {
        match self {
            Src::Device(d) => &d.pending,
            Src::Host(h) => h.pending(),
        }
    }
}

impl Dst<'_> {
    fn pending(&self) -> &super::event::Pending {
        match self {
            Dst::Device(d) => &d.pending,
            Dst::Host(h) => h.pending(),
        }
    }
}

/// The raw copy for `len` bytes from `src` at `src_off` to `dst` at `dst_off`, ranges checked.
fn build(
    dst: &Dst<'_>,
    dst_off: usize,
    src: &Src<'_>,
    src_off: usize,
    len: usize,
) -> Result<RawCopy, CudaError> {
    let dev = |what, b: &DeviceBuffer, off: usize| device_at(what, b.as_raw(), b.len(), off, len);
    let host = |what, b: &dyn HostBuffer, off: usize| host_at(what, b.host_range(), off, len);
    const D: &str = "destination device buffer";
    const S: &str = "source device buffer";
    Ok(match (dst, src) {
        (Dst::Device(d), Src::Device(s)) if d.context().same(s.context()) => RawCopy::DtoD {
            dst: dev(D, d, dst_off)?,
            src: dev(S, s, src_off)?,
            len,
        },
        (Dst::Device(d), Src::Device(s)) => RawCopy::Peer {
            dst: dev(D, d, dst_off)?,
            dst_ctx: d.context().as_raw(),
            src: dev(S, s, src_off)?,
            src_ctx: s.context().as_raw(),
            len,
        },
        (Dst::Device(d), Src::Host(s)) => RawCopy::HtoD {
            dst: dev(D, d, dst_off)?,
            src: host("source host buffer", *s, src_off)?,
            len,
        },
        (Dst::Host(d), _) if d.read_only() => {
            return Err(CudaError::InvalidArgument {
                call: "copy",
                reason: "the destination host memory is registered read-only (a file mapping)"
                    .to_string(),
            })
        }
        (Dst::Host(d), Src::Device(s)) => RawCopy::DtoH {
            dst: host("destination host buffer", &**d, dst_off)?,
            src: dev(S, s, src_off)?,
            len,
        },
        (Dst::Host(_), Src::Host(_)) => {
            return Err(CudaError::InvalidArgument {
                call: "copy",
                reason: "both ends are host memory: no CUDA copy applies".to_string(),
            })
        }
    })
}

impl Stream {
    /// Queue a copy of `len` bytes from `src` at `src_off` to `dst` at `dst_off`, ordered after
    /// both buffers' last uses; host access to either buffer and their `Drop` wait for it.
    pub fn copy(
        &self,
        dst: Dst<'_>,
        dst_off: usize,
        src: Src<'_>,
        src_off: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        let op = build(&dst, dst_off, &src, src_off, len)?;
        self.tracked(&[dst.pending(), src.pending()], op)
    }

    /// Copy like [`Stream::copy`], then wait for the stream (`cuStreamSynchronize`) before
    /// returning, so no marker is needed: the borrows cover the copy.
    pub fn copy_blocking(
        &self,
        dst: Dst<'_>,
        dst_off: usize,
        src: Src<'_>,
        src_off: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        let op = build(&dst, dst_off, &src, src_off, len)?;
        if len == 0 {
            return Ok(());
        }
        self.context().make_current()?;
        dst.pending().order_before(self)?;
        src.pending().order_before(self)?;
        // SAFETY: `op` was built from buffers borrowed for this whole call (the destination
        // `&mut`) after checking the ranges, and the stream is synchronised below before the
        // borrows end; the context is current.
        let queued = unsafe { self.enqueue_raw(op) };
        let waited = self.synchronize();
        queued?;
        waited?;
        // Both last uses are complete now: later copies on this stream skip the wait.
        dst.pending().completed_on(self);
        src.pending().completed_on(self);
        Ok(())
    }

    /// Copy like [`Stream::copy`], cut into `helpers.len() + 1` contiguous pieces: the first on
    /// this stream, the others on `helpers` (streams of the same context), which first wait for
    /// this stream (fork) and are then waited for by it (join). The buffers' markers are recorded
    /// on this stream after the join, so later uses wait for every piece.
    pub fn copy_split(
        &self,
        helpers: &[&Stream],
        dst: Dst<'_>,
        dst_off: usize,
        src: Src<'_>,
        src_off: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        if helpers.is_empty() || len < 2 * (helpers.len() + 1) {
            return self.copy(dst, dst_off, src, src_off, len);
        }
        if let Some(h) = helpers.iter().find(|h| !h.context().same(self.context())) {
            return Err(CudaError::InvalidArgument {
                call: "copy_split",
                reason: format!(
                    "helper stream of GPU {} with a main stream of GPU {}",
                    h.context().ordinal(),
                    self.context().ordinal()
                ),
            });
        }
        // Check the whole range once; the pieces lie inside it.
        build(&dst, dst_off, &src, src_off, len)?;
        self.context().make_current()?;
        dst.pending().order_before(self)?;
        src.pending().order_before(self)?;
        let fork = Event::without_timing(self.context())?;
        let joins = helpers
            .iter()
            .map(|_| Event::without_timing(self.context()))
            .collect::<Result<Vec<_>, _>>()?;
        fork.record(self)?;
        let n = helpers.len() + 1;
        // Pieces of a multiple of 4 KiB (except the last), so each stays aligned.
        let piece = (len / n).next_multiple_of(4096).min(len);
        let mut done = 0usize;
        let mut queued = 0usize;
        let mut result = Ok(());
        for i in 0..n {
            if done >= len {
                break;
            }
            let this = if i + 1 == n {
                len - done
            } else {
                piece.min(len - done)
            };
            let stream = if i == 0 { self } else { helpers[i - 1] };
            let step = (|| {
                if i > 0 {
                    stream.wait_event(&fork)?;
                }
                let op = build(&dst, dst_off + done, &src, src_off + done, this)?;
                // SAFETY: `op` lies inside the buffers (checked by `build`); the pieces'
                // streams are joined into this stream below and the buffers' markers recorded
                // after the join (or every stream is synchronised on failure), so host access
                // and `Drop` wait for every piece; the context is current.
                unsafe { stream.enqueue_raw(op) }?;
                if i > 0 {
                    joins[i - 1].record(stream)?;
                    self.wait_event(&joins[i - 1])?;
                }
                Ok(())
            })();
            if let Err(e) = step {
                result = Err(e);
                break;
            }
            queued = i + 1;
            done += this;
        }
        let marked = result
            .clone()
            .and_then(|()| dst.pending().mark(self))
            .and_then(|()| src.pending().mark(self));
        if let Err(e) = marked {
            // Nothing would wait for the pieces already queued: wait for them here.
            for s in std::iter::once(self)
                .chain(helpers.iter().copied())
                .take(queued.max(1))
            {
                if let Err(sync) = s.synchronize() {
                    self.context().record_err(sync);
                }
            }
            return Err(e);
        }
        Ok(())
    }
}
