//! The initiator's inline and short ring requests (`ring.rs` posts and completes them):
//! the op's bytes staged or copied into the slot, the request posted, and after `DONE` the
//! target's verdicts and a read's bytes out of the slot.

use super::ring::{ring_ops_iter, shm_op, Skip, STAGE_MAX};
use super::worker::Worker;
use crate::error::{Error, Result};
use crate::gpu::{copy_span, Dir};
use crate::region::LeaseKind;
use crate::shm_ring::{KIND_INLINE, KIND_SHORT, SHORT_MAX};
use crate::transfer::{OpKind, OpRef, XferState};

/// A one-op write's bytes read onto the stack (`stage_op`), and their length.
pub(super) type Staged = Result<([u8; STAGE_MAX], usize)>;

impl Worker {
    /// Reads the target's per-op errors of `slot` into `skip` (and fails those ops).
    pub(super) fn take_result(
        &mut self,
        xfer: &XferState,
        batch: &[usize],
        slot: usize,
        skip: &mut Skip,
    ) -> Result<()> {
        let errors = self.ring_mut()?.ring.read_result(slot)?;
        for (j, e) in errors {
            let j = j as usize;
            if j >= batch.len() {
                return Err(Error::Protocol("shm ring result index out of range".into()));
            }
            if !skip.get(j) {
                skip.set(j, batch.len());
                if matches!(e, Error::NoSuchRegion { .. } | Error::RegionGone { .. }) {
                    let gone = xfer.op(batch[j]).remote.id;
                    self.maps.remove(&gone);
                    self.imports.remove(&gone);
                }
                xfer.chunk_done(batch[j], 0, Err(e));
            }
        }
        Ok(())
    }

    /// Copies the inline bytes of the ops of `batch` going `kind` (writes: into the slot before
    /// posting; reads: out of it after `DONE`), skipping the ops in `skip`; an op whose local
    /// copy fails is failed and added to `skip` (and, before posting, withdrawn from the slot).
    /// `slot_kind` is the slot's request kind (inline or short: where its data lies).
    pub(super) fn copy_inline(
        &self,
        xfer: &XferState,
        batch: &[usize],
        (slot, slot_kind): (usize, u32),
        skip: &mut Skip,
        kind: OpKind,
    ) -> Result<()> {
        let rc = self
            .ring
            .as_ref()
            .ok_or_else(|| Error::Protocol("no shm ring".into()))?;
        let (lease_kind, dir) = match kind {
            OpKind::Write => (LeaseKind::Source, Dir::OutOfRegion),
            OpKind::Read => (LeaseKind::Sink, Dir::IntoRegion),
        };
        let mut at = 0usize;
        for (j, &i) in batch.iter().enumerate() {
            let op = xfer.op(i);
            if !skip.get(j) && op.kind == kind {
                let slot_data = rc.ring.request_data(slot, slot_kind, batch.len(), at);
                let len = op.len as usize;
                // The copy under the local region's locked lease state (no lease taken and
                // dropped); GPU memory or a conflicting user view takes a lease below.
                let quick = op.local.with_locked(lease_kind, |base| {
                    // SAFETY: local_offset + len <= the region's length (checked at submit);
                    // [at, at + len) lies in the slot's data area (the batch was cut to
                    // DATA_BYTES; a short request's one op of <= SHORT_MAX bytes in its
                    // control block); a slot and a region are distinct mappings.
                    unsafe {
                        let region = base.add(op.local_offset as usize);
                        match dir {
                            Dir::OutOfRegion => {
                                std::ptr::copy_nonoverlapping(region.cast_const(), slot_data, len)
                            }
                            Dir::IntoRegion => {
                                std::ptr::copy_nonoverlapping(slot_data.cast_const(), region, len)
                            }
                        }
                    }
                });
                let r = match quick {
                    Some(r) => r,
                    None => op.local.lease(lease_kind, self.wait).and_then(|lease| {
                        // SAFETY: [at, at + len) lies in the slot's data area (the batch was cut
                        // to DATA_BYTES); the local span is leased and bounds-checked at submit.
                        unsafe { copy_span(&lease, op.local_offset, slot_data, len, dir) }
                    }),
                };
                if let Err(e) = r {
                    skip.set(j, batch.len());
                    if kind == OpKind::Write {
                        rc.ring.skip_op(slot, j);
                    }
                    xfer.chunk_done(i, 0, Err(e));
                }
            }
            at += op.len as usize;
        }
        Ok(())
    }

    /// Takes the next slot (waiting until it is free), copies the writes' bytes into it and
    /// posts it. Returns the slot, the ops withdrawn (their local copy failed) and the slot's
    /// request kind (inline, or short for one op of up to `SHORT_MAX` bytes).
    pub(super) fn post_inline(
        &mut self,
        xfer: &XferState,
        batch: &[usize],
    ) -> Result<(usize, Skip, u32)> {
        if let [i] = *batch {
            let op = xfer.op(i);
            // A one-op read needs nothing staged: `post_one` posts it (short when it can be).
            let staged = self.stage_op(op);
            if staged.is_some() || op.kind == OpKind::Read {
                let (slot, skip, failed, kind) = self.post_one(op, xfer.id, staged)?;
                if let Some(e) = failed {
                    xfer.chunk_done(i, 0, Err(e));
                }
                return Ok((slot, skip, kind));
            }
        }
        let mut skip = Skip::default();
        let slot = self.ring_mut()?.prepare(ring_ops_iter(xfer, batch))?;
        self.copy_inline(xfer, batch, (slot, KIND_INLINE), &mut skip, OpKind::Write)?;
        self.ring_mut()?
            .post_slot(slot, KIND_INLINE, xfer.id, batch.len());
        Ok((slot, skip, KIND_INLINE))
    }

    /// One inline op posted in its own slot: its table entry, then its staged bytes (a write,
    /// `stage_op`) or none (a read), then the control block; an op of up to `SHORT_MAX` bytes
    /// as a short request, wholly in the control block. Returns the slot, the op withdrawn if
    /// its local copy failed, that failure (for the caller to record on the transfer), and the
    /// request's kind.
    pub(super) fn post_one(
        &mut self,
        op: OpRef<'_>,
        id: u64,
        staged: Option<Staged>,
    ) -> Result<(usize, Skip, Option<Error>, u32)> {
        let rc = self.ring_mut()?;
        let short = op.len <= SHORT_MAX as u64;
        match &staged {
            Some(Ok((buf, len))) if short => {
                let slot = rc.post_short(&shm_op(op), &buf[..*len])?;
                return Ok((slot, Skip::default(), None, KIND_SHORT));
            }
            None if short && op.kind == OpKind::Read => {
                let slot = rc.post_short(&shm_op(op), &[])?;
                return Ok((slot, Skip::default(), None, KIND_SHORT));
            }
            _ => {}
        }
        let slot = rc.prepare(std::iter::once(shm_op(op)))?;
        let mut skip = Skip::default();
        let mut failed = None;
        match staged {
            Some(Ok((buf, len))) => {
                // SAFETY: one op of `len` <= STAGE_MAX bytes: its data lies at the start of
                // the slot's data area; `buf` is on this stack.
                unsafe {
                    std::ptr::copy_nonoverlapping(buf.as_ptr(), rc.ring.data_ptr(slot, 1, 0), len)
                };
            }
            Some(Err(e)) => {
                skip.set(0, 1);
                rc.ring.skip_op(slot, 0);
                failed = Some(e);
            }
            None => {}
        }
        rc.post_slot(slot, KIND_INLINE, id, 1);
        Ok((slot, skip, failed, KIND_INLINE))
    }

    /// A one-op write of at most `STAGE_MAX` bytes, read out of its region onto the stack
    /// before the slot is touched: the region's lock is then let go (a full barrier) with no
    /// store to the shared slot pending, and the slot's two cache lines are written back to
    /// back and move to the target together, not one after the other. `None`: not such an op.
    pub(super) fn stage_op(&self, op: OpRef<'_>) -> Option<Staged> {
        let len = usize::try_from(op.len).ok().filter(|&l| l <= STAGE_MAX)?;
        if op.kind != OpKind::Write {
            return None;
        }
        let mut buf = [0u8; STAGE_MAX];
        let dst = buf.as_mut_ptr();
        let quick = op.local.with_locked(LeaseKind::Source, |base| {
            // SAFETY: local_offset + len <= the region's length (checked at submit); `buf`
            // holds STAGE_MAX >= len bytes.
            unsafe { std::ptr::copy_nonoverlapping(base.add(op.local_offset as usize), dst, len) }
        });
        let r = match quick {
            Some(r) => r,
            None => op
                .local
                .lease(LeaseKind::Source, self.wait)
                .and_then(|lease| {
                    // SAFETY: `buf` holds len bytes; the local span is leased and bounds-checked.
                    unsafe { copy_span(&lease, op.local_offset, dst, len, Dir::OutOfRegion) }
                }),
        };
        Some(r.map(|()| (buf, len)))
    }

    /// After `DONE` on an inline (or short) slot of request kind `kind`: the target's errors,
    /// the reads' bytes out of the slot, the slot marked for reuse (it stays `DONE`). Returns
    /// the ops of `batch` that did not complete (the rest did; the caller records them).
    pub(super) fn finish_inline(
        &mut self,
        xfer: &XferState,
        batch: &[usize],
        (slot, kind): (usize, u32),
        mut skip: Skip,
    ) -> Result<Skip> {
        let rc = self.ring_mut()?;
        // The common answer (no op failed, only writes) reads one word here.
        if rc.ring.has_result(slot) {
            self.take_result(xfer, batch, slot, &mut skip)?;
        }
        if batch.iter().any(|&i| xfer.ops[i].kind == OpKind::Read) {
            self.copy_inline(xfer, batch, (slot, kind), &mut skip, OpKind::Read)?;
        }
        self.ring_mut()?.consume(slot);
        Ok(skip)
    }
}
