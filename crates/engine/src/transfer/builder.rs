//! [`Transfer`]: the batch of ops a caller builds and submits.

use std::sync::Arc;
use std::time::Duration;

use super::ops;
use super::{Op, OpKind, OpRef, Regions};
use crate::error::{Error, Result};
use crate::region::{check_bounds, Region, RegionDesc};

/// A batch of ops to one peer, built with [`Transfer::write`] / [`Transfer::read`] and handed to
/// [`crate::Peer::submit`].
#[derive(Debug, Default)]
pub struct Transfer {
    pub(crate) ops: smallvec::SmallVec<[Op; 1]>,
    pub(crate) regions: Regions,
    pub(crate) notify: Option<Vec<u8>>,
    pub(crate) timeout: Option<Duration>,
}

impl Transfer {
    /// An empty batch.
    pub fn new() -> Self {
        Transfer::default()
    }

    /// Adds an op that copies `len` bytes from `local[local_offset..]` to `remote[remote_offset..]`.
    pub fn write(
        &mut self,
        local: &Region<'_>,
        local_offset: u64,
        remote: &RegionDesc,
        remote_offset: u64,
        len: u64,
    ) -> &mut Self {
        self.push(
            OpKind::Write,
            local,
            local_offset,
            remote,
            remote_offset,
            len,
        )
    }

    /// Adds an op that copies `len` bytes from `remote[remote_offset..]` to `local[local_offset..]`.
    pub fn read(
        &mut self,
        local: &Region<'_>,
        local_offset: u64,
        remote: &RegionDesc,
        remote_offset: u64,
        len: u64,
    ) -> &mut Self {
        self.push(
            OpKind::Read,
            local,
            local_offset,
            remote,
            remote_offset,
            len,
        )
    }

    /// An op from a region's shared state (a block pool keeps that, not the `Region`).
    pub(crate) fn push_inner(
        &mut self,
        kind: OpKind,
        local: &Arc<crate::region::RegionInner>,
        lo: u64,
        remote: &RegionDesc,
        ro: u64,
        len: u64,
    ) -> &mut Self {
        let op = self.regions.op(kind, local, lo, remote, ro, len);
        self.ops.push(op);
        self
    }

    fn push(
        &mut self,
        kind: OpKind,
        local: &Region<'_>,
        lo: u64,
        remote: &RegionDesc,
        ro: u64,
        len: u64,
    ) -> &mut Self {
        let op = self.regions.op(kind, &local.inner, lo, remote, ro, len);
        self.ops.push(op);
        self
    }

    /// Delivers `msg` (≤ [`crate::MAX_NOTIFICATION_BYTES`], 64 KiB) to the peer's agent after every op's bytes are in place; see
    /// [`crate::Agent::wait_notification`].
    pub fn notify(&mut self, msg: impl Into<Vec<u8>>) -> &mut Self {
        self.notify = Some(msg.into());
        self
    }

    /// Overrides the agent's default transfer deadline.
    pub fn timeout(&mut self, t: Duration) -> &mut Self {
        self.timeout = Some(t);
        self
    }

    /// Number of ops.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// True when no op was added.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// An empty batch with room for `n` ops (a large batch then grows its op list once).
    pub fn with_capacity(n: usize) -> Self {
        Transfer {
            ops: smallvec::SmallVec::with_capacity(n),
            ..Transfer::default()
        }
    }

    /// Each op with its regions.
    pub(crate) fn op_refs(&self) -> impl ExactSizeIterator<Item = OpRef<'_>> + Clone + '_ {
        ops::with_regions(&self.ops, &self.regions)
    }

    /// Checks every op against what the initiator knows (local region, remote descriptor) before
    /// anything is sent; the target checks again.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.ops.is_empty() {
            return Err(Error::InvalidArgument(
                "a transfer needs at least one op".into(),
            ));
        }
        if let Some(n) = self.notify.as_ref() {
            crate::notifications::check_size(n.len())?;
        }
        for op in self.op_refs() {
            if op.len == 0 {
                return Err(Error::InvalidArgument("op of length 0".into()));
            }
            check_bounds(op.local_offset, op.len, op.local.len)?;
            check_bounds(op.remote_offset, op.len, op.remote.len)?;
            match op.kind {
                OpKind::Write if !op.remote.access.remote_write => {
                    return Err(Error::ReadOnly {
                        region: op.remote.id,
                    })
                }
                OpKind::Read if !op.remote.access.remote_read => {
                    return Err(Error::NotReadable {
                        region: op.remote.id,
                    })
                }
                _ => {}
            }
        }
        Ok(())
    }
}

thread_local! {
    /// The remote descriptor this thread's last transfer shared (see `shared_desc`).
    static LAST_DESC: std::cell::RefCell<Option<Arc<RegionDesc>>> =
        const { std::cell::RefCell::new(None) };
}

/// An `Arc` of `remote`: this thread's last one when equal (a stream of transfers to one
/// remote region clones its descriptor, name included, once, not once per transfer).
pub(super) fn shared_desc(remote: &RegionDesc) -> Arc<RegionDesc> {
    LAST_DESC.with(|last| {
        let mut last = last.borrow_mut();
        match last.as_ref() {
            Some(a) if **a == *remote => Arc::clone(a),
            _ => {
                let a = Arc::new(remote.clone());
                *last = Some(Arc::clone(&a));
                a
            }
        }
    })
}
