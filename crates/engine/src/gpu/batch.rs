//! Batched copies: a list of spans between GPU regions moved by one kernel launch
//! (`gdx_sys::cuda::BatchCopy`), where the copy engine would take one copy, and pay its fixed
//! cost, per span. What a paged KV cache's block list needs: 1,000 blocks of 16 KiB are one
//! launch, not 1,000 copies.
//!
//! The kernel runs on the source GPU's copy stream (the stream a single ipc or p2p copy uses,
//! so it is ordered with them) and reaches the destination the way that copy would: the same
//! GPU, a peer GPU with peer access, or another process's allocation through its IPC mapping.
//! Every span is planned as a single copy would be; the batch runs only when every span's plan
//! is a direct one (ipc, p2p, device-local), else the caller copies span by span and each op
//! keeps its own plan.

use std::sync::Arc;

use gdx_sys::cuda::{BatchCopy, CopySpan, Event, Module};

use super::exec::LocalTransfer;
use super::region::{DeviceRegion, Mem};
use super::{Gpu, LocalPeer};
use crate::error::{Error, Result};
use crate::region::check_bounds;
use crate::routing::plan::{Path, Plan};

/// Spans from this size on are left to the copy engine, one copy each: at that size its
/// bandwidth is the kernel's and its fixed cost is paid back, and it leaves the SMs alone.
pub(crate) const BATCH_SPAN_MAX: u64 = 4 << 20;

/// One span of [`LocalPeer::transfer_batch`]: `len` bytes of `src` at `src_off` to `dst` at
/// `dst_off`.
#[derive(Debug, Clone, Copy)]
pub struct Span<'a> {
    /// Destination region.
    pub dst: &'a DeviceRegion,
    /// Offset into the destination.
    pub dst_off: u64,
    /// Source region.
    pub src: &'a DeviceRegion,
    /// Offset into the source.
    pub src_off: u64,
    /// Bytes.
    pub len: u64,
}

impl LocalPeer {
    /// Queue `spans` as one batched copy (one kernel launch on the source GPU's stream);
    /// returns once it is queued, with a plan that says how many spans the copy holds and why.
    ///
    /// Every span is bounds-checked and planned first. The spans share one source GPU and one
    /// destination GPU, no two destination spans overlap, and every plan is direct (`ipc`,
    /// `p2p` or `device-local`); otherwise [`Error::InvalidArgument`] names the span (copy
    /// those one by one with [`LocalPeer::transfer`]).
    pub fn transfer_batch(&self, spans: &[Span<'_>]) -> Result<LocalTransfer> {
        let first = spans
            .first()
            .ok_or_else(|| Error::InvalidArgument("an empty batch of spans".to_string()))?;
        let (sg, dg) = (first.src.gpu(), first.dst.gpu());
        let mut raw = Vec::with_capacity(spans.len());
        let mut path = None;
        let mut bytes = 0u64;
        // Addresses looked up once per region run (a device address is behind a lock).
        let mut last: Option<(&DeviceRegion, u64, &DeviceRegion, u64)> = None;
        let mut planned = None;
        for (k, s) in spans.iter().enumerate() {
            check_bounds(s.dst_off, s.len, s.dst.len())?;
            check_bounds(s.src_off, s.len, s.src.len())?;
            if s.src.gpu() != sg || s.dst.gpu() != dg {
                return Err(Error::InvalidArgument(format!(
                    "span {k} is GPU {} -> GPU {}, the batch's first is GPU {sg} -> GPU {dg}",
                    s.src.gpu(),
                    s.dst.gpu()
                )));
            }
            // A block list is spans of one size between the same two regions: planned once.
            let key = (s.dst.id(), s.src.id(), s.len);
            if planned != Some(key) {
                let plan = self.plan_for(Mem::Gpu(s.dst), Mem::Gpu(s.src), s.len, false)?;
                if !matches!(plan.path, Path::Ipc | Path::P2p | Path::DeviceLocal) {
                    return Err(Error::InvalidArgument(format!(
                        "span {k} is planned {} ({}), not a direct path a batched copy can take",
                        plan.path, plan.reason
                    )));
                }
                path.get_or_insert(plan.path);
                planned = Some(key);
            }
            let (dbase, sbase) = match last {
                Some((d, db, s2, sb)) if d.id() == s.dst.id() && s2.id() == s.src.id() => (db, sb),
                _ => {
                    let (db, sb) = (s.dst.device_ptr(), s.src.device_ptr());
                    last = Some((s.dst, db, s.src, sb));
                    (db, sb)
                }
            };
            raw.push(CopySpan {
                dst: dbase + s.dst_off,
                src: sbase + s.src_off,
                len: s.len,
            });
            bytes += s.len;
        }
        refuse_overlap(&raw)?;
        let g = self.gpu(sg)?;
        let done = self.launch_batch(&g, &raw)?;
        let path = path.unwrap_or(Path::Ipc);
        Ok(LocalTransfer::queued(
            Plan {
                path,
                reason: format!(
                    "{path}: {} spans in one batched copy (gdx_copy_batch kernel on GPU {sg}); \
                     the copy engine would take {} copies, each with its own fixed cost",
                    spans.len(),
                    spans.len()
                )
                .into(),
            },
            bytes,
            done,
            g,
        ))
    }

    /// Launches the kernel over `raw` on `g`'s stream and records the completion event.
    fn launch_batch(&self, g: &Arc<Gpu>, raw: &[CopySpan]) -> Result<Event> {
        let mut slot = g.batch.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            let module = Module::gdx_kernels(&g.ctx)?;
            *slot = Some(BatchCopy::new(&module, 1024)?);
        }
        let Some(batch) = slot.as_mut() else {
            return Err(Error::unavailable(
                None,
                "the batched copy kernel".to_string(),
            ));
        };
        // SAFETY: every span was bounds-checked against a live region of this process (its
        // own memory or a mapping of another process's), on GPUs the planner found directly
        // reachable from the launching GPU; the regions outlive the copy as for any queued
        // copy (freeing device memory waits for the work queued on it); destination spans do
        // not overlap one another or a source span (refuse_overlap).
        unsafe { batch.launch(&g.stream, raw)? };
        let done = {
            let pooled = g.events.lock().unwrap_or_else(|p| p.into_inner()).pop();
            match pooled {
                Some(ev) => ev,
                None => Event::without_timing(&g.ctx)?,
            }
        };
        done.record(&g.stream)?;
        Ok(done)
    }
}

/// Refuses a batch in which a destination span overlaps another span (destination or
/// source): the kernel moves spans in no order, so the result would depend on timing.
fn refuse_overlap(raw: &[CopySpan]) -> Result<()> {
    // Every span's two ends as half-open intervals, tagged destination or not; swept by
    // start, an interval overlaps an earlier one exactly when that one reaches past its start.
    let mut ends: Vec<(u64, u64, bool, usize)> = Vec::with_capacity(raw.len() * 2);
    for (k, s) in raw.iter().enumerate() {
        ends.push((s.dst, s.dst + s.len, true, k));
        ends.push((s.src, s.src + s.len, false, k));
    }
    ends.sort_unstable_by_key(|e| e.0);
    let (mut dsts, mut srcs) = (Reach::default(), Reach::default());
    for &(lo, hi, is_dst, k) in &ends {
        if lo == hi {
            continue;
        }
        // A destination may overlap nothing else; a source only no destination.
        let hit = if is_dst {
            dsts.hit(lo, k).or(srcs.hit(lo, k))
        } else {
            dsts.hit(lo, k)
        };
        if let Some(other) = hit {
            return Err(Error::InvalidArgument(format!(
                "span {k} overlaps span {other}'s destination or source in a batched copy \
                 (spans run in no order): give each destination span bytes of its own"
            )));
        }
        if is_dst { &mut dsts } else { &mut srcs }.push(hi, k);
    }
    Ok(())
}

/// The two furthest-reaching intervals of different spans seen so far in the sweep: enough to
/// find an overlap with a span other than the one asking.
#[derive(Default)]
struct Reach {
    best: Option<(u64, usize)>,
    second: Option<(u64, usize)>,
}

impl Reach {
    /// A span other than `k` whose interval reaches past `lo`.
    fn hit(&self, lo: u64, k: usize) -> Option<usize> {
        [self.best, self.second]
            .into_iter()
            .flatten()
            .find(|&(hi, j)| hi > lo && j != k)
            .map(|(_, j)| j)
    }

    fn push(&mut self, hi: u64, k: usize) {
        match self.best {
            Some((b, j)) if b >= hi => {
                if j != k && self.second.is_none_or(|(s, _)| s < hi) {
                    self.second = Some((hi, k));
                }
            }
            Some((b, j)) => {
                if j != k {
                    self.second = Some((b, j));
                }
                self.best = Some((hi, k));
            }
            None => self.best = Some((hi, k)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(dst: u64, src: u64, len: u64) -> CopySpan {
        CopySpan { dst, src, len }
    }

    #[test]
    fn disjoint_spans_pass_and_overlapping_destinations_are_refused() {
        assert!(refuse_overlap(&[span(0, 1000, 10), span(10, 1010, 10)]).is_ok());
        // Two spans reading the same source bytes is fine.
        assert!(refuse_overlap(&[span(0, 1000, 10), span(10, 1000, 10)]).is_ok());
        let e = refuse_overlap(&[span(0, 1000, 10), span(5, 2000, 10)]).unwrap_err();
        assert!(e.to_string().contains("overlaps"), "{e}");
        // A destination over another span's source.
        let e = refuse_overlap(&[span(0, 1000, 10), span(1005, 3000, 10)]).unwrap_err();
        assert!(e.to_string().contains("overlaps"), "{e}");
        // A span copied onto itself (dst == src) is its own business, not an overlap of two.
        assert!(refuse_overlap(&[span(0, 0, 10)]).is_ok());
    }
}
