//! Running planned local copies: [`LocalPeer::transfer`] (queued, a [`LocalTransfer`] to wait
//! on), [`LocalPeer::copy_blocking`] (the thin path for small copies: one copy call and one
//! stream synchronisation on the caller's thread), [`Ordering`] (GPUDirect Async: wait for a
//! caller's event, join a caller's stream, signal a caller's event), and the staged pipeline.
//!
//! Streams: a p2p, ipc, device-local or GPU-to-host copy runs on the source GPU's copy stream, a
//! host-to-GPU copy on the destination's. The staged pipeline cuts the copy into chunks through
//! `depth` pinned bounce buffers: chunk k goes device-to-host on the source GPU's stream, then
//! host-to-device on the destination's; the buffers' last-use markers order each reuse of a
//! bounce buffer after the copy that last read it, so the D2H of chunk k+1 overlaps the H2D of
//! chunk k.

use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use gdx_sys::cuda::{DeviceBuffer, Dst, Event, PinnedHostBuffer, Src, Stream};

use super::region::Mem;
use super::{Gpu, LocalPeer};
use crate::error::{Error, Result};
use crate::region::check_bounds;
use crate::routing::plan::{Path, Plan};

/// Stream ordering for [`LocalPeer::transfer_with`] (GPUDirect Async): the copy can wait for a
/// caller's event, be ordered inside a caller's stream (it starts after the work queued there
/// so far, and work queued there later starts after it), and record a caller's event when done.
///
/// Another framework's handles (PyTorch's `torch.cuda.current_stream().cuda_stream`, a raw
/// `CUstream`, or a `CUevent`) are borrowed with `gdx_sys::cuda::Stream::from_raw` /
/// `Event::from_raw` (the one `unsafe` step: gdx cannot check that a raw handle is live) and
/// are never destroyed by gdx.
#[derive(Debug, Default, Clone, Copy)]
pub struct Ordering<'a> {
    /// Start only after this event (`cuStreamWaitEvent`); any GPU's event.
    pub after: Option<&'a Event>,
    /// Order the copy inside this stream (fork and join through events).
    pub stream: Option<&'a Stream>,
    /// Record this event when the copy is done.
    pub signal: Option<&'a Event>,
}

/// A queued local copy. Dropping it does not cancel or wait; the regions stay valid until the
/// copy is done in any case.
pub struct LocalTransfer {
    plan: Plan,
    len: u64,
    done: Option<Event>,
    gpu: Arc<Gpu>,
}

impl std::fmt::Debug for LocalTransfer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalTransfer")
            .field("plan", &self.plan)
            .field("len", &self.len)
            .finish()
    }
}

impl LocalTransfer {
    /// A copy queued on `gpu`'s stream, done when `done` has passed.
    pub(crate) fn queued(plan: Plan, len: u64, done: Event, gpu: Arc<Gpu>) -> LocalTransfer {
        LocalTransfer {
            plan,
            len,
            done: Some(done),
            gpu,
        }
    }

    /// The path and the reason.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }
    /// Bytes.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// Whether the copy has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Wait until the copy is done (`cuEventSynchronize`); the plan it ran on.
    pub fn wait(mut self) -> Result<Plan> {
        if let Some(ev) = &self.done {
            ev.synchronize()?;
        }
        Ok(std::mem::replace(
            &mut self.plan,
            Plan {
                path: Path::P2p,
                reason: String::new().into(),
            },
        ))
    }
}

impl Drop for LocalTransfer {
    fn drop(&mut self) {
        if let Some(ev) = self.done.take() {
            self.gpu
                .events
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(ev);
        }
    }
}

/// What [`LocalPeer::tune_staged`] measured.
#[derive(Debug, Clone, PartialEq)]
pub struct StagedTuning {
    /// (chunk bytes, GB/s) for each chunk size tried.
    pub results: Vec<(u64, f64)>,
    /// The fastest chunk size.
    pub best_chunk_bytes: u64,
}

pub(crate) enum Guard<'a> {
    D(MutexGuard<'a, DeviceBuffer>),
    P(MutexGuard<'a, PinnedHostBuffer>),
}

fn lock(m: Mem<'_>) -> Guard<'_> {
    match m {
        Mem::Gpu(r) => Guard::D(r.inner.lock()),
        Mem::Pinned(r) => Guard::P(r.inner.lock()),
    }
}

impl Guard<'_> {
    fn dst(&mut self) -> Dst<'_> {
        match self {
            Guard::D(g) => Dst::Device(g),
            Guard::P(g) => Dst::Host(&mut **g),
        }
    }
    fn src(&self) -> Src<'_> {
        match self {
            Guard::D(g) => Src::Device(g),
            Guard::P(g) => Src::Host(&**g),
        }
    }
    fn device(&mut self) -> Result<&mut DeviceBuffer> {
        match self {
            Guard::D(g) => Ok(g),
            Guard::P(_) => Err(Error::InvalidArgument("expected device memory".to_string())),
        }
    }
}

/// Lock both ends in a fixed order (so two opposite copies never deadlock): (dst, src).
pub(crate) fn lock_pair<'a>(dst: Mem<'a>, src: Mem<'a>) -> Result<(Guard<'a>, Guard<'a>)> {
    if dst.id() == src.id() {
        return Err(Error::InvalidArgument(
            "source and destination are the same region".to_string(),
        ));
    }
    Ok(if dst.id() < src.id() {
        let d = lock(dst);
        (d, lock(src))
    } else {
        let s = lock(src);
        (lock(dst), s)
    })
}

impl LocalPeer {
    /// Queue a copy of `len` bytes from `src` at `src_off` to `dst` at `dst_off` on the planned
    /// path; returns once it is queued.
    pub fn transfer<'a>(
        &self,
        dst: impl Into<Mem<'a>>,
        dst_off: u64,
        src: impl Into<Mem<'a>>,
        src_off: u64,
        len: u64,
    ) -> Result<LocalTransfer> {
        self.transfer_with(dst, dst_off, src, src_off, len, Ordering::default())
    }

    /// [`LocalPeer::transfer`] with stream ordering (see [`Ordering`]).
    pub fn transfer_with<'a>(
        &self,
        dst: impl Into<Mem<'a>>,
        dst_off: u64,
        src: impl Into<Mem<'a>>,
        src_off: u64,
        len: u64,
        ord: Ordering<'_>,
    ) -> Result<LocalTransfer> {
        let (dst, src) = (dst.into(), src.into());
        check_bounds(dst_off, len, dst.len())?;
        check_bounds(src_off, len, src.len())?;
        let ordered = ord.after.is_some() || ord.stream.is_some() || ord.signal.is_some();
        let plan = self.plan_for(dst, src, len, ordered)?;
        if plan.path == Path::Mailbox {
            // Not ordered with any stream (else not planned here): done on return.
            let (first, _) = self.streams_for(&plan, dst, src)?;
            self.run_mailbox(dst, dst_off, src, src_off, len)?;
            return Ok(LocalTransfer {
                plan,
                len,
                done: None,
                gpu: first,
            });
        }
        let (first, last) = self.streams_for(&plan, dst, src)?;
        // Fork: our streams start after the caller's event and the caller's stream.
        let mut waits: Vec<Event> = Vec::new();
        if let Some(s) = ord.stream {
            let ev = Event::without_timing(s.context())?;
            ev.record(s)?;
            waits.push(ev);
        }
        for g in [&first, &last] {
            if let Some(ev) = ord.after {
                g.stream.wait_event(ev)?;
            }
            for ev in &waits {
                g.stream.wait_event(ev)?;
            }
            if Arc::ptr_eq(&first, &last) {
                break;
            }
        }
        self.enqueue(&plan, &first, &last, dst, dst_off, src, src_off, len, None)?;
        let done = {
            let pooled = last.events.lock().unwrap_or_else(|p| p.into_inner()).pop();
            match pooled {
                Some(ev) => ev,
                None => Event::without_timing(&last.ctx)?,
            }
        };
        done.record(&last.stream)?;
        // Join: the caller's stream and event follow the copy.
        if let Some(s) = ord.stream {
            s.wait_event(&done)?;
        }
        if let Some(sig) = ord.signal {
            if sig.context().same(&last.ctx) {
                sig.record(&last.stream)?;
            } else {
                let g = self.gpu(sig.context().ordinal())?;
                g.stream.wait_event(&done)?;
                sig.record(&g.stream)?;
            }
        }
        Ok(LocalTransfer {
            plan,
            len,
            done: Some(done),
            gpu: last,
        })
    }

    /// Copy and wait, on the caller's thread: for small copies, one copy call and one
    /// `cuStreamSynchronize` (the staged path queues its pipeline and waits for it). Returns the
    /// plan it ran on.
    pub fn copy_blocking<'a>(
        &self,
        dst: impl Into<Mem<'a>>,
        dst_off: u64,
        src: impl Into<Mem<'a>>,
        src_off: u64,
        len: u64,
    ) -> Result<Plan> {
        let (dst, src) = (dst.into(), src.into());
        check_bounds(dst_off, len, dst.len())?;
        check_bounds(src_off, len, src.len())?;
        let plan = self.plan(dst, src, len)?;
        if plan.path == Path::Mailbox {
            self.run_mailbox(dst, dst_off, src, src_off, len)?;
            return Ok(plan);
        }
        if plan.path == Path::Staged {
            return self.transfer(dst, dst_off, src, src_off, len)?.wait();
        }
        let (first, _) = self.streams_for(&plan, dst, src)?;
        let (mut d, s) = lock_pair(dst, src)?;
        first.stream.copy_blocking(
            d.dst(),
            dst_off as usize,
            s.src(),
            src_off as usize,
            len as usize,
        )?;
        Ok(plan)
    }

    /// Copy `bytes` from ordinary host memory into `region` at `offset` and wait (through the
    /// driver's own staging: for set-up and checks, not a data path).
    pub fn upload(&self, region: &super::DeviceRegion, offset: u64, bytes: &[u8]) -> Result<()> {
        let g = self.gpu(region.gpu())?;
        region.write_from_host(&g.stream, offset, bytes)
    }

    /// Copy `out.len()` bytes of `region` at `offset` into ordinary host memory, after the
    /// copies queued on it, and wait.
    pub fn download(
        &self,
        region: &super::DeviceRegion,
        offset: u64,
        out: &mut [u8],
    ) -> Result<()> {
        let g = self.gpu(region.gpu())?;
        region.read_to_host(&g.stream, offset, out)
    }

    /// The GPUs whose streams start and finish a planned copy.
    fn streams_for(&self, plan: &Plan, dst: Mem<'_>, src: Mem<'_>) -> Result<(Arc<Gpu>, Arc<Gpu>)> {
        let gpu = |m: Mem<'_>| match m {
            Mem::Gpu(r) => Some(r.gpu()),
            Mem::Pinned(_) => None,
        };
        let (s, d) = (gpu(src), gpu(dst));
        let pick = |o: Option<u32>| -> Result<Arc<Gpu>> {
            self.gpu(o.ok_or_else(|| Error::InvalidArgument("no GPU end".to_string()))?)
        };
        match plan.path {
            Path::HostToGpu => {
                let g = pick(d)?;
                Ok((g.clone(), g))
            }
            Path::Staged => Ok((pick(s)?, pick(d)?)),
            Path::Mailbox => {
                let g = pick(s.or(d))?;
                Ok((g.clone(), g))
            }
            _ => {
                let g = pick(s)?;
                Ok((g.clone(), g))
            }
        }
    }

    /// Enqueue the copy on its path's streams. `staged` overrides (chunk, depth).
    #[allow(clippy::too_many_arguments)]
    fn enqueue(
        &self,
        plan: &Plan,
        first: &Gpu,
        last: &Gpu,
        dst: Mem<'_>,
        dst_off: u64,
        src: Mem<'_>,
        src_off: u64,
        len: u64,
        staged: Option<(u64, u32)>,
    ) -> Result<()> {
        let (mut d, s) = lock_pair(dst, src)?;
        let cal = &self.shared.calibration;
        match plan.path {
            Path::Staged => {
                let (chunk, depth) = staged.unwrap_or((cal.staged_chunk(), cal.staged_depth()));
                let (Guard::D(sbuf), dbuf) = (&s, d.device()?) else {
                    return Err(Error::InvalidArgument(
                        "staged needs two GPU ends".to_string(),
                    ));
                };
                self.staged(first, last, dbuf, dst_off, sbuf, src_off, len, chunk, depth)
            }
            Path::P2p | Path::Ipc if cal.p2p_streams_for(len) > 1 => {
                let helpers = self.helpers(first, cal.p2p_streams_for(len) - 1)?;
                let refs: Vec<&Stream> = helpers.iter().map(|h| &**h).collect();
                Ok(first.stream.copy_split(
                    &refs,
                    d.dst(),
                    dst_off as usize,
                    s.src(),
                    src_off as usize,
                    len as usize,
                )?)
            }
            _ => Ok(first.stream.copy(
                d.dst(),
                dst_off as usize,
                s.src(),
                src_off as usize,
                len as usize,
            )?),
        }
    }

    fn helpers(&self, g: &Gpu, n: u32) -> Result<Vec<Arc<Stream>>> {
        let mut h = g.helpers.lock().unwrap_or_else(|p| p.into_inner());
        while h.len() < n as usize {
            h.push(Arc::new(Stream::new(&g.ctx)?));
        }
        Ok(h[..n as usize].to_vec())
    }

    /// The staged pipeline (see the module docs).
    #[allow(clippy::too_many_arguments)]
    fn staged(
        &self,
        from: &Gpu,
        to: &Gpu,
        dst: &mut DeviceBuffer,
        dst_off: u64,
        src: &DeviceBuffer,
        src_off: u64,
        len: u64,
        chunk: u64,
        depth: u32,
    ) -> Result<()> {
        let chunk = chunk.min(len.max(1));
        let mut bounce = self.shared.bounce.lock().unwrap_or_else(|p| p.into_inner());
        let want = depth as usize;
        if bounce.len() < want || bounce.first().is_some_and(|b| (b.len() as u64) < chunk) {
            bounce.clear();
            for _ in 0..want {
                bounce.push(PinnedHostBuffer::new(&from.ctx, chunk as usize)?);
            }
        }
        let mut off = 0u64;
        let mut k = 0usize;
        while off < len {
            let n = chunk.min(len - off) as usize;
            let b = &mut bounce[k % want];
            from.stream.copy(
                Dst::Host(b),
                0,
                Src::Device(src),
                (src_off + off) as usize,
                n,
            )?;
            to.stream.copy(
                Dst::Device(dst),
                (dst_off + off) as usize,
                Src::Host(&*b),
                0,
                n,
            )?;
            off += n as u64;
            k += 1;
        }
        Ok(())
    }

    /// Measure the staged pipeline from GPU `a` to GPU `b` with `len`-byte copies at several
    /// chunk sizes (`depth` bounce buffers), best of 3 each; the caller keeps the best in a
    /// [`crate::Calibration`]. Allocates its own buffers.
    pub fn tune_staged(
        &self,
        a: u32,
        b: u32,
        len: u64,
        chunks: &[u64],
        depth: u32,
    ) -> Result<StagedTuning> {
        let src = self.alloc_device(a, len)?;
        let dst = self.alloc_device(b, len)?;
        let (ga, gb) = (self.gpu(a)?, self.gpu(b)?);
        let plan = Plan {
            path: Path::Staged,
            reason: "staged: tuning".to_string().into(),
        };
        let mut results = Vec::new();
        for &chunk in chunks {
            let mut best = Duration::MAX;
            for _ in 0..4 {
                let t = Instant::now();
                self.enqueue(
                    &plan,
                    &ga,
                    &gb,
                    Mem::Gpu(&dst),
                    0,
                    Mem::Gpu(&src),
                    0,
                    len,
                    Some((chunk, depth)),
                )?;
                dst.synchronize()?;
                best = best.min(t.elapsed());
            }
            results.push((chunk, len as f64 / best.as_secs_f64() / 1e9));
        }
        let best_chunk_bytes = results
            .iter()
            .max_by(|x, y| x.1.total_cmp(&y.1))
            .map(|r| r.0)
            .unwrap_or(crate::routing::calibration::DEFAULT_STAGED_CHUNK);
        Ok(StagedTuning {
            results,
            best_chunk_bytes,
        })
    }
}
