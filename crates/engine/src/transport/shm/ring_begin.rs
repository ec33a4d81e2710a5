//! Transfers the worker thread runs through the shm ring slot by slot (`run_ring`), a leased
//! transfer posted in parts (`start_begin`), and the leased (`BEGIN`) slots' copies through the
//! mappings; the submitting thread's posts are in `ring.rs`, inline and short requests in
//! `ring_inline.rs`.

use std::collections::VecDeque;
use std::sync::Arc;

use super::ring::{ring_class, ring_ops_iter, Skip, Started};
use super::worker::Worker;
use crate::error::{Error, Result};
use crate::gpu::{copy_span, Dir, BATCH_SPAN_MAX};
use crate::region::LeaseKind;
use crate::routing::plan::Path;
use crate::shm_ring::{
    DATA_BYTES, DONE, END, IDENTITY, INLINE_MAX, KIND_BEGIN, KIND_INLINE, MAX_RING_OPS,
};
use crate::transfer::{OpKind, XferState};

/// Inline slots `run_ring` keeps posted ahead of the one it completes.
const RING_AHEAD: usize = 8;
/// Leased (`BEGIN`) slots `run_ring` keeps posted ahead: each holds up to `MAX_RING_OPS`
/// leases at the target until its `END` (2 × 1024, well under `max_leases_per_conn`).
const BEGIN_AHEAD: usize = 2;

/// A slot `run_ring` posted: its ops (a range of the transfer's op list), where, what the
/// local copy withdrew, its kind (inline, short or begin).
struct Posted {
    ops: std::ops::Range<usize>,
    slot: usize,
    skip: Skip,
    kind: u32,
}

/// Most slots one leased transfer is cut into (`start_begin`).
const BEGIN_PARTS: usize = 8;
/// Fewest ops in a part: a smaller batch goes in one slot (a part costs a round trip of its
/// own, paid back only by the copies of the part before it).
const MIN_PART_OPS: usize = 64;

/// Ops per slot for a leased transfer of `n` ops (`n` itself: one slot).
fn begin_chunk(n: usize) -> usize {
    if n < 2 * MIN_PART_OPS {
        return n.max(1);
    }
    n.div_ceil(BEGIN_PARTS).max(MIN_PART_OPS)
}

impl Worker {
    /// Runs `xfer` through the ring when every op fits it; `Ok(false)` when some op does not
    /// (the caller runs the transfer over the socket).
    pub(super) fn run_ring(
        &mut self,
        xfer: &XferState,
        plans: &[Path],
        ok: &[bool],
    ) -> Result<bool> {
        if self.ring.is_none() {
            return Ok(false);
        }
        let idx: Vec<usize> = (0..xfer.ops.len()).filter(|&i| ok[i]).collect();
        let mut classes = Vec::with_capacity(idx.len());
        let big = idx.iter().map(|&i| xfer.ops[i].len).sum::<u64>() > INLINE_MAX;
        for &i in &idx {
            match ring_class(self, xfer, &plans[i], i, big) {
                Some(k) => classes.push(k),
                None => return Ok(false),
            }
        }
        // Consecutive ops of one class share a slot, up to its op and data limits. Up to
        // `RING_AHEAD` slots are posted before the oldest is completed: the target serves one
        // while this side stages the next (inline) or copies the one before (begin), so a
        // block list of many slots costs one round trip, not one per slot.
        let mut posted: VecDeque<Posted> = VecDeque::new();
        let mut start = 0;
        while start < idx.len() {
            let kind = classes[start];
            let mut end = start;
            let mut data = 0u64;
            while end < idx.len() && classes[end] == kind && end - start < MAX_RING_OPS {
                let len = xfer.ops[idx[end]].len;
                if kind == KIND_INLINE && data + len > DATA_BYTES as u64 {
                    break;
                }
                data += len;
                end += 1;
            }
            let ahead = if kind == KIND_INLINE {
                RING_AHEAD
            } else {
                BEGIN_AHEAD
            };
            while posted.len() >= ahead {
                if let Some(p) = posted.pop_front() {
                    self.finish_posted(xfer, &idx, p)?;
                }
            }
            posted.push_back(self.post_batch(xfer, &idx, start..end, kind)?);
            start = end;
        }
        while let Some(p) = posted.pop_front() {
            self.finish_posted(xfer, &idx, p)?;
        }
        if let Some(n) = xfer.notification() {
            self.send_notify(xfer, n)?;
        }
        Ok(true)
    }

    /// Posts one slot of `run_ring` (ops `idx[ops]`, of class `kind`).
    fn post_batch(
        &mut self,
        xfer: &XferState,
        idx: &[usize],
        ops: std::ops::Range<usize>,
        kind: u32,
    ) -> Result<Posted> {
        let batch = &idx[ops.clone()];
        if kind == KIND_INLINE {
            let (slot, skip, kind) = self.post_inline(xfer, batch)?;
            return Ok(Posted {
                ops,
                slot,
                skip,
                kind,
            });
        }
        let rc = self.ring_mut()?;
        let slot = rc.prepare(ring_ops_iter(xfer, batch))?;
        rc.post_slot(slot, kind, xfer.id, batch.len());
        Ok(Posted {
            ops,
            slot,
            skip: Skip::default(),
            kind,
        })
    }

    /// Waits for a posted slot's `DONE`, then completes it (inline) or copies and `END`s it
    /// (begin: the target holds a lease on every accepted op until then).
    fn finish_posted(&mut self, xfer: &XferState, idx: &[usize], p: Posted) -> Result<()> {
        let batch = &idx[p.ops];
        self.ring_mut()?.wait_state(p.slot, DONE, Some(xfer))?;
        if p.kind == KIND_BEGIN {
            return self.finish_begin(xfer, batch, p.slot, p.skip);
        }
        let skip = self.finish_inline(xfer, batch, (p.slot, p.kind), p.skip)?;
        xfer.ops_done(
            batch
                .iter()
                .enumerate()
                .filter(|(j, _)| !skip.get(*j))
                .map(|(_, &i)| i),
        );
        Ok(())
    }

    /// Posts the `n` ops of `xfer` (`direct_kind`: every one leased, `n <= MAX_RING_OPS`) as
    /// `BEGIN` requests: a batch of many ops in up to `BEGIN_PARTS` slots back to back (when
    /// that many are free now), so the target checks and leases one part while the initiator
    /// copies the one before (`Worker::reap` completes them in order), else in one slot.
    pub(super) fn start_begin(&mut self, xfer: &XferState, n: usize) -> Result<Started> {
        // `cma` ops go in one slot: their copy is one system call per slot, and the kernel
        // moves a call of 1,024 spans faster than eight of 128; the target's leasing, which
        // parts would overlap with the copies, costs little beside a kernel copy.
        // Small `ipc` ops go in one slot too: the slot's copy is one kernel launch, and a part
        // costs a launch and a completion wait of its own (8 parts cost a 1,000-block list
        // more than the target's leasing they would overlap).
        let one_slot = (0..n).all(|i| xfer.path(i) == Path::Cma)
            || (0..n).all(|i| xfer.path(i) == Path::Ipc && xfer.ops[i].len < BATCH_SPAN_MAX);
        let rc = self.ring_mut()?;
        let chunk = if one_slot { n } else { begin_chunk(n) };
        let chunk = if chunk < n && rc.free_ahead(n.div_ceil(chunk)) {
            chunk
        } else {
            n
        };
        let mut first = None;
        let mut start = 0;
        while start < n {
            let end = (start + chunk).min(n);
            let part = &IDENTITY[start..end];
            let slot = rc.prepare(ring_ops_iter(xfer, part))?;
            rc.post_slot(slot, KIND_BEGIN, xfer.id, part.len());
            first.get_or_insert(slot);
            start = end;
        }
        Ok(Started {
            slot: first.unwrap_or(0),
            kind: KIND_BEGIN,
            skip: Skip::default(),
            chunk,
        })
    }

    /// The copies of a `BEGIN` slot that holds ops to a peer's GPU memory (`ipc`, through its
    /// IPC mapping: `copy_ipc_ops`) and maybe ops to mapped host memory (`copy_runs`).
    fn copy_with_ipc(
        &mut self,
        xfer: &XferState,
        batch: &[usize],
        skip: &Skip,
    ) -> (Vec<usize>, Option<Error>) {
        let mut ipc = Vec::with_capacity(batch.len());
        let mut mapped = Vec::new();
        for (j, &i) in batch.iter().enumerate() {
            if skip.get(j) {
                continue;
            }
            if xfer.path(i) == Path::Ipc {
                ipc.push(i);
            } else {
                mapped.push(i);
            }
        }
        let (mut done, fatal) = self.copy_ipc_ops(xfer, &ipc);
        if fatal.is_some() {
            return (done, fatal);
        }
        if !mapped.is_empty() {
            let (more, fatal) = self.copy_runs(xfer, &mapped, &Skip::default());
            done.extend(more);
            if fatal.is_some() {
                return (done, fatal);
            }
        }
        (done, None)
    }

    /// The copies of a `BEGIN` slot through the mappings: consecutive ops between the same
    /// local region and the same remote region, in the same direction, share one local lease and
    /// one mapping look-up (a batch of small ops costs its copies, not per-op bookkeeping).
    /// Returns the ops copied and the error that broke the connection, if one did.
    pub(super) fn copy_runs(
        &self,
        xfer: &XferState,
        batch: &[usize],
        skip: &Skip,
    ) -> (Vec<usize>, Option<Error>) {
        if let Some(r) = self.copy_runs_cma(xfer, batch, skip) {
            return r;
        }
        let mut done = Vec::with_capacity(batch.len());
        let mut j = 0;
        while j < batch.len() {
            if skip.get(j) {
                j += 1;
                continue;
            }
            let first = xfer.op(batch[j]);
            let mut end = j + 1;
            while end < batch.len() && !skip.get(end) {
                let op = xfer.op(batch[end]);
                if !Arc::ptr_eq(op.local, first.local)
                    || op.remote.id != first.remote.id
                    || op.kind != first.kind
                {
                    break;
                }
                end += 1;
            }
            let run = &batch[j..end];
            j = end;
            let fail_run = |e: &Error| {
                for &i in run {
                    xfer.chunk_done(i, 0, Err(e.clone()));
                }
            };
            if let Some(e) = xfer.halt() {
                fail_run(&e);
                continue;
            }
            let Some((m, writable)) = self.maps.get(&first.remote.id) else {
                fail_run(&Error::NoSuchRegion {
                    region: first.remote.id,
                });
                continue;
            };
            let (kind, dir) = match first.kind {
                OpKind::Write if !writable => {
                    fail_run(&Error::ReadOnly {
                        region: first.remote.id,
                    });
                    continue;
                }
                OpKind::Write => (LeaseKind::Source, Dir::OutOfRegion),
                OpKind::Read => (LeaseKind::Sink, Dir::IntoRegion),
            };
            let lease = match first.local.lease(kind, self.wait) {
                Ok(l) => l,
                Err(e) if e.is_fatal_for_stream() => return (done, Some(e)),
                Err(e) => {
                    fail_run(&e);
                    continue;
                }
            };
            for &i in run {
                // A cancel stops a run between its copies (one load: no clock read per op).
                if xfer.is_cancelled() {
                    xfer.chunk_done(i, 0, Err(Error::Cancelled));
                    continue;
                }
                let op = xfer.op(i);
                if let Err(e) =
                    crate::region::check_bounds(op.remote_offset, op.len, m.len() as u64)
                {
                    xfer.chunk_done(i, 0, Err(e));
                    continue;
                }
                // SAFETY: remote_offset + len <= m.len() (checked above).
                let remote = unsafe { m.ptr().add(op.remote_offset as usize) };
                // SAFETY: the remote span is checked above, mapped (writable for a write) and
                // leased by the target since BEGIN; the local span was bounds-checked at submit
                // and is held by the lease; distinct mappings do not overlap.
                match unsafe { copy_span(&lease, op.local_offset, remote, op.len as usize, dir) } {
                    Ok(()) => done.push(i),
                    Err(e) if e.is_fatal_for_stream() => return (done, Some(e)),
                    Err(e) => xfer.chunk_done(i, 0, Err(e)),
                }
            }
        }
        (done, None)
    }

    /// An answered `BEGIN` slot: the target's verdicts, the copies through the mappings, `END`
    /// (the target then drops the leases), the ops completed.
    pub(super) fn finish_begin(
        &mut self,
        xfer: &XferState,
        batch: &[usize],
        slot: usize,
        mut skip: Skip,
    ) -> Result<()> {
        self.take_result(xfer, batch, slot, &mut skip)?;
        let (done, fatal) = if batch.iter().any(|&i| xfer.path(i) == Path::Ipc) {
            self.copy_with_ipc(xfer, batch, &skip)
        } else {
            self.copy_runs(xfer, batch, &skip)
        };
        self.ring_mut()?.publish(slot, END);
        if let Some(e) = fatal {
            return Err(e);
        }
        xfer.ops_done(done);
        Ok(())
    }
}
