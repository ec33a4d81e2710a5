//! The `ipc` path's mappings and its batched copies: a peer's GPU allocation is mapped once
//! per connection (`ipc_mapping`), and the ipc ops of one ring slot move as one batched copy
//! (`copy_ipc_batch`: one kernel launch for a whole KV-cache block list) instead of one
//! copy-engine copy, and one completion wait, per op.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::sync::Arc;

use super::worker::Worker;
use crate::error::{Error, Result};
use crate::gpu::{DeviceRegion, LocalPeer, Span, BATCH_SPAN_MAX};
use crate::region::{Lease, LeaseKind};
use crate::routing::path::Path;
use crate::transfer::{OpKind, XferState};

/// A mapped allocation: its pieces, each at its offset into the allocation.
pub(super) type Pieces = Vec<(u64, DeviceRegion)>;

impl Worker {
    /// The local peer that copies op `i` and the mapping of its remote GPU allocation, made
    /// on the op's first use on this connection (mapping a CUDA IPC handle costs far more than
    /// a copy's set-up, so it is done once per remote allocation).
    pub(super) fn ipc_mapping(
        &mut self,
        xfer: &XferState,
        i: usize,
    ) -> Result<(LocalPeer, Pieces)> {
        let op = xfer.op(i);
        let peer = match op.local.device() {
            Some(dev) => dev.peer.clone(),
            None => self.cuda.get().cloned().ok_or_else(|| {
                Error::unavailable(
                    Path::Ipc,
                    "an ipc op from host memory needs this process's CUDA (Agent::use_cuda)",
                )
            })?,
        };
        let ipc = op.remote.ipc.as_ref().ok_or_else(|| {
            Error::unavailable(
                Path::Ipc,
                format!("remote region {} has no IPC handle", op.remote.id),
            )
        })?;
        if let Some(r) = self.imports.get(&op.remote.id) {
            return Ok((peer, r.clone()));
        }
        let (id, key) = (op.remote.id, op.remote.key);
        let r = if !ipc.pieces.is_empty() {
            // A caller's VMM range: one fd per mapped piece, asked for in turn.
            peer.import_fd_pieces(ipc, |i| Ok(self.request_fd(id, key, false, i)?.0))?
        } else {
            let one = match ipc.posix_fd_alloc_len {
                None => peer.import_ipc(ipc)?,
                Some(_) => match peer.imported(ipc) {
                    Some(r) => r,
                    None => {
                        // A VMM region gdx allocated: ask the target for its fd.
                        let (fd, _, _) = self.request_fd(id, key, false, 0)?;
                        peer.import_fd(ipc, fd.as_fd())?
                    }
                },
            };
            vec![(0, one)]
        };
        self.imports.insert(op.remote.id, r.clone());
        Ok((peer, r))
    }

    /// The ipc ops `batch` of a leased slot (the target accepted them): every op between
    /// GPU memory here and one piece of its mapping, under `BATCH_SPAN_MAX`, joins one batched
    /// copy per local peer; the rest are copied one by one (`copy_ipc`). Returns the ops done
    /// and the error that broke the connection, if one did.
    pub(super) fn copy_ipc_ops(
        &mut self,
        xfer: &XferState,
        batch: &[usize],
    ) -> (Vec<usize>, Option<Error>) {
        let mut done = Vec::with_capacity(batch.len());
        let mut one_by_one = Vec::new();
        let mut batched: Vec<(usize, u64)> = Vec::with_capacity(batch.len());
        let mut peer: Option<LocalPeer> = None;
        for &i in batch {
            if let Some(e) = xfer.halt() {
                xfer.chunk_done(i, 0, Err(e));
                continue;
            }
            match self.batch_piece(xfer, i) {
                Ok(Some(k)) => {
                    // `batch_piece` took only ops from GPU memory here.
                    let Some(dev) = xfer.op(i).local.device() else {
                        one_by_one.push(i);
                        continue;
                    };
                    match &peer {
                        None => {
                            peer = Some(dev.peer.clone());
                            batched.push((i, k));
                        }
                        Some(q) if q.same(&dev.peer) => batched.push((i, k)),
                        Some(_) => one_by_one.push(i),
                    }
                }
                Ok(None) => one_by_one.push(i),
                Err(e) if e.is_fatal_for_stream() => return (done, Some(e)),
                Err(e) => xfer.chunk_done(i, 0, Err(e)),
            }
        }
        if let Some(p) = peer {
            match self.run_ipc_batch(xfer, &p, &batched) {
                Ok(()) => done.extend(batched.iter().map(|b| b.0)),
                Err(e) if e.is_fatal_for_stream() => return (done, Some(e)),
                Err(e) => {
                    for &(i, _) in &batched {
                        xfer.chunk_done(i, 0, Err(e.clone()));
                    }
                }
            }
        }
        for i in one_by_one {
            match self.copy_ipc(xfer, i) {
                Ok(()) => done.push(i),
                Err(e) if e.is_fatal_for_stream() => return (done, Some(e)),
                Err(e) => xfer.chunk_done(i, 0, Err(e)),
            }
        }
        (done, None)
    }

    /// Whether op `i` can join a batched copy: GPU memory on this side, under `BATCH_SPAN_MAX`,
    /// inside one piece of the mapping. `Some(k)`: piece `k` holds its remote span. The
    /// mapping is looked up in place (made on the region's first op): a block list's 1,000 ops
    /// cost 1,000 look-ups, not 1,000 copies of it.
    fn batch_piece(&mut self, xfer: &XferState, i: usize) -> Result<Option<u64>> {
        let op = xfer.op(i);
        if op.local.device().is_none() || op.len >= BATCH_SPAN_MAX || op.len == 0 {
            return Ok(None);
        }
        let Some(ipc) = op.remote.ipc.as_ref() else {
            return Ok(None);
        };
        if !self.imports.contains_key(&op.remote.id) {
            self.ipc_mapping(xfer, i)?;
        }
        let Some(pieces) = self.imports.get(&op.remote.id) else {
            return Ok(None);
        };
        let start = ipc.offset + op.remote_offset;
        let end = start + op.len;
        Ok(pieces
            .iter()
            .position(|(at, r)| start >= *at && end <= at + r.len())
            .map(|k| k as u64))
    }

    /// One batched copy of `ops` (each with the index of its mapping piece), waited for while
    /// the local leases are held (the target holds its own until `END`).
    fn run_ipc_batch(
        &self,
        xfer: &XferState,
        peer: &LocalPeer,
        ops: &[(usize, u64)],
    ) -> Result<()> {
        // One lease per local region (a block pool is one region, or one per layer).
        let mut leases: HashMap<usize, Lease> = HashMap::new();
        let mut spans = Vec::with_capacity(ops.len());
        for &(i, piece) in ops {
            let op = xfer.op(i);
            let key = Arc::as_ptr(op.local) as usize;
            if let std::collections::hash_map::Entry::Vacant(v) = leases.entry(key) {
                let kind = match op.kind {
                    OpKind::Write => LeaseKind::Source,
                    OpKind::Read => LeaseKind::Sink,
                };
                v.insert(op.local.lease(kind, self.wait)?);
            }
            let (Some(dev), Some(ipc)) = (op.local.device(), op.remote.ipc.as_ref()) else {
                return Err(Error::unavailable(
                    Path::Ipc,
                    format!("op {i} lost its GPU memory or IPC handle"),
                ));
            };
            let Some((at, remote)) = self
                .imports
                .get(&op.remote.id)
                .and_then(|p| p.get(piece as usize))
            else {
                return Err(Error::NoSuchRegion {
                    region: op.remote.id,
                });
            };
            let remote_off = ipc.offset + op.remote_offset - at;
            spans.push(match op.kind {
                OpKind::Write => Span {
                    dst: remote,
                    dst_off: remote_off,
                    src: &dev.region,
                    src_off: op.local_offset,
                    len: op.len,
                },
                OpKind::Read => Span {
                    dst: &dev.region,
                    dst_off: op.local_offset,
                    src: remote,
                    src_off: remote_off,
                    len: op.len,
                },
            });
        }
        peer.transfer_batch(&spans)?.wait()?;
        xfer.note_batched(ops.len());
        drop(leases);
        Ok(())
    }
}
