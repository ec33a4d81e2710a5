//! A block list over rdma: consecutive small ops of one transfer (a paged KV cache's blocks)
//! posted as one stream of work requests on one rail (`Qp::run`: chained per queue pair, one
//! `ibv_post_send` per batch of requests, as many in flight as the send queues, the completion
//! queue and the in-flight byte budget allow), waited for once, instead of one post and one wait
//! per op.
//!
//! Ops of at least `SPLIT_BYTES` keep `run_op`, which stripes an op over the rails. A batch whose
//! rail fails, or whose completion error cannot be pinned on one op (a flushed queue pair fails
//! every request after the first error), runs again op by op through `run_op`: the failover and
//! the per-op verdicts are `run_op`'s, on the same path.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use gdx_rdma::{MrHandle, RdmaOp, RemoteRegion, WorkItem};

use super::{rdma_err, region_fault, Worker};
use crate::error::{Error, Result};
use crate::region::LeaseKind;
use crate::transfer::{OpKind, XferState};
use crate::transport::tcp::SPLIT_BYTES;

/// Most ops one batch takes (its leases and work items are held until it completes).
const MAX_BATCH_OPS: usize = 16_384;

/// How many ops from `start` on go as one batch: consecutive ops of one kind, each under
/// `SPLIT_BYTES`; fewer than 2 means none (the op runs alone).
pub(super) fn batch_len(xfer: &XferState, start: usize) -> usize {
    let kind = xfer.op(start).kind;
    (start..xfer.ops.len())
        .take(MAX_BATCH_OPS)
        .take_while(|&i| {
            let op = xfer.op(i);
            op.kind == kind && op.len < SPLIT_BYTES && op.len > 0
        })
        .count()
}

impl Worker {
    /// Runs ops `start..start + n` as one batch on the best active rail and completes them.
    /// `false`: nothing completed; the caller runs them op by op (no rail, a rail failure, a
    /// region that would not resolve or register, a completion error).
    pub(super) fn run_batch(&mut self, xfer: &XferState, start: usize, n: usize) -> bool {
        let (active, _) = self.active();
        let Some(r) = self
            .stats
            .best()
            .filter(|b| active.contains(b))
            .or(active.first().copied())
        else {
            return false;
        };
        let ops = start..start + n;
        let (lease_kind, verb) = match xfer.op(start).kind {
            OpKind::Write => (LeaseKind::Source, RdmaOp::Write),
            OpKind::Read => (LeaseKind::Sink, RdmaOp::Read),
        };
        // One lease, registration and remote look-up per region, not per op.
        let mut leases = HashMap::new();
        let mut mrs: HashMap<usize, MrHandle> = HashMap::new();
        let mut remotes: HashMap<u64, RemoteRegion> = HashMap::new();
        for i in ops.clone() {
            let op = xfer.op(i);
            let at = Arc::as_ptr(op.local) as usize;
            let got = (|| -> Result<()> {
                if let std::collections::hash_map::Entry::Vacant(v) = leases.entry(at) {
                    v.insert(op.local.lease(lease_kind, self.wait)?);
                    mrs.insert(at, self.node.register(self.rails[r].ep, op.local)?);
                }
                if let std::collections::hash_map::Entry::Vacant(v) = remotes.entry(op.remote.id) {
                    v.insert(self.remote_region(r, op.remote.id, op.remote.key)?);
                }
                Ok(())
            })();
            if got.is_err() {
                return false;
            }
        }
        let items: Result<Vec<WorkItem<'_>>> = ops
            .clone()
            .map(|i| {
                let op = xfer.op(i);
                let mr = &mrs[&(Arc::as_ptr(op.local) as usize)];
                let remote = &remotes[&op.remote.id];
                WorkItem::between(mr, op.local_offset, remote, op.remote_offset, op.len)
                    .map_err(rdma_err)
            })
            .collect();
        let Ok(items) = items else {
            return false;
        };
        let Some(qp) = self.rails[r].qp.as_mut() else {
            return false;
        };
        let t0 = std::time::Instant::now();
        match qp.run(verb, &items, xfer.time_left().min(self.wait)) {
            Ok(bytes) => {
                self.stats.add_bytes(r, bytes);
                if let Some(b) = xfer.rail_bytes.get(r) {
                    b.fetch_add(bytes, Ordering::Relaxed);
                }
                if bytes >= super::MEASURE_BYTES {
                    self.stats.measured(r, bytes, t0.elapsed());
                }
                drop(items);
                drop(leases);
                for i in ops {
                    xfer.chunk_done(i, xfer.ops[i].len, Ok(()));
                }
                true
            }
            Err(e) => {
                let e: Error = rdma_err(e);
                // Either way the queue pairs are in the error state: fresh ones for an op's
                // fault, a pause (and re-probe) for the rail's.
                self.rails[r].qp = None;
                if region_fault(&e) {
                    self.reopen(r);
                } else {
                    self.stats.pause(r, &e);
                }
                log::debug!("gdx: rdma batch of {n} ops on rail {r} failed ({e}); op by op");
                false
            }
        }
    }
}
