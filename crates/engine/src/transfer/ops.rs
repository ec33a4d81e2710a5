//! A transfer's ops and the regions they join.
//!
//! Each op names its two regions by index into the transfer's region table, which holds one
//! reference per distinct region: a batch of a thousand ops between two regions takes two
//! references, not two thousand (each an atomic increment at `write` and a decrement at drop,
//! on the submitting thread's path). `OpRef` is an op with its regions looked up.

use std::sync::Arc;

use smallvec::SmallVec;

use super::OpKind;
use crate::region::{RegionDesc, RegionInner};

/// One op of a batch (not `Clone`: its indices mean something only in its own transfer's
/// table).
#[derive(Debug)]
pub(crate) struct Op {
    pub(crate) kind: OpKind,
    pub(crate) local_offset: u64,
    pub(crate) remote_offset: u64,
    pub(crate) len: u64,
    /// Index of its local region in `Regions::local`.
    local: u32,
    /// Index of its remote region in `Regions::remote`.
    remote: u32,
}

impl Op {
    /// A copy for a copy of its whole transfer (whose region table is copied with it: the
    /// indices mean nothing in another table).
    pub(super) fn copy_with_table(&self) -> Op {
        Op {
            kind: self.kind,
            local_offset: self.local_offset,
            remote_offset: self.remote_offset,
            len: self.len,
            local: self.local,
            remote: self.remote,
        }
    }

    /// Whether `other` (of the same transfer) joins the same two regions as this op.
    pub(crate) fn same_regions(&self, other: &Op) -> bool {
        self.local == other.local && self.remote == other.remote
    }
}

/// The distinct regions a transfer's ops join, each referenced once.
#[derive(Debug, Default, Clone)]
pub(crate) struct Regions {
    local: SmallVec<[Arc<RegionInner>; 1]>,
    /// Shared by consecutive ops on the same remote region (a batch clones it once).
    remote: SmallVec<[Arc<RegionDesc>; 1]>,
}

impl Regions {
    /// The op of `kind` between `local` and `remote`: the last regions added are reused when
    /// they are the op's (a batch's ops mostly join the same two), else the op's are added.
    pub(crate) fn op(
        &mut self,
        kind: OpKind,
        local: &Arc<RegionInner>,
        local_offset: u64,
        remote: &RegionDesc,
        remote_offset: u64,
        len: u64,
    ) -> Op {
        let l = match self.local.last() {
            Some(last) if Arc::ptr_eq(last, local) => self.local.len() - 1,
            _ => {
                self.local.push(Arc::clone(local));
                self.local.len() - 1
            }
        };
        let r = match self.remote.last() {
            Some(last) if **last == *remote => self.remote.len() - 1,
            _ => {
                self.remote.push(super::builder::shared_desc(remote));
                self.remote.len() - 1
            }
        };
        Op {
            kind,
            local_offset,
            remote_offset,
            len,
            local: u32::try_from(l).unwrap_or(u32::MAX),
            remote: u32::try_from(r).unwrap_or(u32::MAX),
        }
    }

    /// `op` (made by this table's `op`, so its indices are in range) with its regions.
    pub(crate) fn get<'a>(&'a self, op: &'a Op) -> OpRef<'a> {
        OpRef {
            op,
            local: &self.local[op.local as usize],
            remote: &self.remote[op.remote as usize],
        }
    }
}

/// An op with its two regions.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OpRef<'a> {
    pub(crate) op: &'a Op,
    pub(crate) local: &'a Arc<RegionInner>,
    pub(crate) remote: &'a Arc<RegionDesc>,
}

impl std::ops::Deref for OpRef<'_> {
    type Target = Op;

    fn deref(&self) -> &Op {
        self.op
    }
}

/// The ops of a transfer with their regions, in order.
pub(crate) fn with_regions<'a>(
    ops: &'a [Op],
    regions: &'a Regions,
) -> impl ExactSizeIterator<Item = OpRef<'a>> + Clone + 'a {
    ops.iter().map(move |op| regions.get(op))
}
