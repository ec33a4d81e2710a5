//! Block transfers, the shape of a paged KV cache (`docs/blocks.md`): a [`BlockPool`] is
//! `layers × segments` runs of `num_blocks` equal blocks; a [`BlockTransfer`] (checked once per
//! pool pair by [`crate::Peer::prepare_blocks`]) moves a list of (source block, destination
//! block) pairs, in all layers or some, as one transfer. Adjacent pairs merge into one op; on
//! the GPU the ops of a slot are one batched copy (`transport::shm::ipc`), over the other
//! transports one request.
//!
//! Every check that can fail on a list is made before any op exists: a post that is refused
//! moves nothing.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

pub use crate::error::BlockList;
use crate::error::{Error, Result};
use crate::peer::Peer;
use crate::region::{Region, RegionDesc, RegionInner};
use crate::transfer::{OpKind, Transfer, TransferHandle};

/// The memory one segment of a pool lives in: a region of this agent, or a peer's.
#[derive(Debug, Clone)]
enum SegmentMemory {
    Local(Arc<RegionInner>),
    Remote(Box<RegionDesc>),
}

#[derive(Debug, Clone)]
struct Segment {
    memory: SegmentMemory,
    /// Where block 0 starts.
    offset: u64,
    /// From one block to the next.
    stride: u64,
}

impl Segment {
    fn at(&self, block: u64) -> u64 {
        self.offset + block * self.stride
    }
}

/// A pool of `num_blocks` blocks of `block_bytes` bytes in every segment of every layer: block
/// `b` of a segment lies at `offset + b * stride` in that segment's region. One tensor per
/// layer is one segment a layer; K and V apart are two; one tensor for all layers is one
/// segment a layer, each at its own offset. Built from local regions ([`BlockPool::local_layer`])
/// or from a peer's descriptors ([`BlockPool::remote_layer`]), never a mix.
#[derive(Debug, Clone)]
pub struct BlockPool {
    num_blocks: u64,
    block_bytes: u64,
    layers: Vec<Vec<Segment>>,
}

impl BlockPool {
    /// An empty pool of `num_blocks` blocks of `block_bytes` bytes; add its layers next.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if either is zero.
    pub fn new(num_blocks: u64, block_bytes: u64) -> Result<BlockPool> {
        if num_blocks == 0 || block_bytes == 0 {
            return Err(Error::InvalidArgument(format!(
                "a block pool needs at least one block of at least one byte \
                 (got {num_blocks} blocks of {block_bytes} B)"
            )));
        }
        Ok(BlockPool {
            num_blocks,
            block_bytes,
            layers: Vec::new(),
        })
    }

    /// Adds a layer of local segments, each `(region, offset, stride)`.
    ///
    /// # Errors
    /// As [`BlockPool::remote_layer`].
    pub fn local_layer(&mut self, segments: &[(&Region<'_>, u64, u64)]) -> Result<&mut Self> {
        let segs = segments
            .iter()
            .map(|(r, offset, stride)| Segment {
                memory: SegmentMemory::Local(Arc::clone(&r.inner)),
                offset: *offset,
                stride: *stride,
            })
            .collect();
        self.push_layer(segs)
    }

    /// Adds a layer of a peer's segments, each `(descriptor, offset, stride)`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the layer and segment: no segment, a segment count
    /// unlike the first layer's, local and remote memory mixed, a stride under `block_bytes`
    /// (blocks would overlap), or a region too short for `num_blocks` blocks.
    pub fn remote_layer(&mut self, segments: &[(&RegionDesc, u64, u64)]) -> Result<&mut Self> {
        let segs = segments
            .iter()
            .map(|(d, offset, stride)| Segment {
                memory: SegmentMemory::Remote(Box::new((*d).clone())),
                offset: *offset,
                stride: *stride,
            })
            .collect();
        self.push_layer(segs)
    }

    fn push_layer(&mut self, segs: Vec<Segment>) -> Result<&mut Self> {
        let l = self.layers.len();
        let bad = |why: String| Err(Error::InvalidArgument(format!("layer {l}: {why}")));
        if segs.is_empty() {
            return bad("a layer needs at least one segment".into());
        }
        if let Some(first) = self.layers.first() {
            if first.len() != segs.len() {
                return bad(format!(
                    "{} segments, layer 0 has {}: every layer has the same segments",
                    segs.len(),
                    first.len()
                ));
            }
        }
        for (s, seg) in segs.iter().enumerate() {
            let local = matches!(seg.memory, SegmentMemory::Local(_));
            if self.is_local().is_some_and(|was| was != local)
                || (s > 0 && local != segs[0].is_local())
            {
                return bad(format!(
                    "segment {s} mixes local and remote memory: a pool is one side's"
                ));
            }
            if seg.stride < self.block_bytes {
                return bad(format!(
                    "segment {s}: stride {} B is under the block size {} B (blocks would overlap)",
                    seg.stride, self.block_bytes
                ));
            }
            let need = (self.num_blocks - 1)
                .checked_mul(seg.stride)
                .and_then(|x| x.checked_add(seg.offset))
                .and_then(|x| x.checked_add(self.block_bytes));
            let len = seg.len();
            if need.is_none_or(|n| n > len) {
                return bad(format!(
                    "segment {s}: {} blocks of {} B at offset {} with stride {} need {} B; \
                     the region has {len} B",
                    self.num_blocks,
                    self.block_bytes,
                    seg.offset,
                    seg.stride,
                    need.map_or("more than 2^64".to_string(), |n| n.to_string())
                ));
            }
        }
        self.layers.push(segs);
        Ok(self)
    }

    /// `Some(true)` for a pool of local regions, `Some(false)` for a peer's, `None` while empty.
    fn is_local(&self) -> Option<bool> {
        self.layers.first().map(|l| l[0].is_local())
    }

    /// Blocks per segment.
    pub fn num_blocks(&self) -> u64 {
        self.num_blocks
    }
    /// Bytes per block.
    pub fn block_bytes(&self) -> u64 {
        self.block_bytes
    }
    /// Layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }
    /// Segments per layer (0 while the pool has no layer).
    pub fn segments(&self) -> usize {
        self.layers.first().map_or(0, Vec::len)
    }
}

impl Segment {
    fn is_local(&self) -> bool {
        matches!(self.memory, SegmentMemory::Local(_))
    }
    fn len(&self) -> u64 {
        match &self.memory {
            SegmentMemory::Local(r) => r.len,
            SegmentMemory::Remote(d) => d.len,
        }
    }
}

/// A local pool and a peer's, checked to match, and the direction: what
/// [`crate::Peer::prepare_blocks`] returns. Post block lists with [`BlockTransfer::post`].
#[derive(Debug)]
pub struct BlockTransfer {
    peer: Peer,
    kind: OpKind,
    local: BlockPool,
    remote: BlockPool,
    timeout: Option<Duration>,
}

impl Peer {
    /// Checks a local block pool against the peer's once, for block lists posted again and
    /// again ([`BlockTransfer::post`]): same layers, segments and block size, and the access
    /// `kind` needs (see `docs/blocks.md`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming what differs.
    pub fn prepare_blocks(
        &self,
        local: &BlockPool,
        remote: &BlockPool,
        kind: OpKind,
    ) -> Result<BlockTransfer> {
        BlockTransfer::new(self.clone(), local, remote, kind)
    }
}

impl BlockTransfer {
    /// Checks that `local` (of this agent's regions) and `remote` (the peer's) have the same
    /// layers, segments and block size, and the access `kind` needs on the peer's regions.
    pub(crate) fn new(
        peer: Peer,
        local: &BlockPool,
        remote: &BlockPool,
        kind: OpKind,
    ) -> Result<Self> {
        let bad = |why: String| Err(Error::InvalidArgument(why));
        match (local.is_local(), remote.is_local()) {
            (Some(true), Some(false)) => {}
            (None, _) | (_, None) => return bad("a block pool without layers".into()),
            (Some(false), _) => return bad("the local pool is built from a peer's regions".into()),
            (_, Some(true)) => return bad("the remote pool is built from local regions".into()),
        }
        if local.block_bytes != remote.block_bytes {
            return bad(format!(
                "block sizes differ: {} B here, {} B at the peer",
                local.block_bytes, remote.block_bytes
            ));
        }
        if (local.num_layers(), local.segments()) != (remote.num_layers(), remote.segments()) {
            return bad(format!(
                "layouts differ: {} layers × {} segments here, {} × {} at the peer",
                local.num_layers(),
                local.segments(),
                remote.num_layers(),
                remote.segments()
            ));
        }
        for (l, layer) in remote.layers.iter().enumerate() {
            for (s, seg) in layer.iter().enumerate() {
                let SegmentMemory::Remote(d) = &seg.memory else {
                    continue;
                };
                let ok = match kind {
                    OpKind::Write => d.access.remote_write,
                    OpKind::Read => d.access.remote_read,
                };
                if !ok {
                    return bad(format!(
                        "layer {l} segment {s}: the peer's region {} is not {} by peers",
                        d.id,
                        if kind == OpKind::Write {
                            "writable"
                        } else {
                            "readable"
                        }
                    ));
                }
            }
        }
        Ok(BlockTransfer {
            peer,
            kind,
            local: local.clone(),
            remote: remote.clone(),
            timeout: None,
        })
    }

    /// The deadline of each post (else the agent's transfer timeout).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = Some(timeout);
    }

    /// Moves block `src[i]` to block `dst[i]` for every `i`, in every segment of `layers`, as
    /// one transfer; returns once it is posted. For a write `src` are local blocks and `dst`
    /// the peer's, for a read the other way round. `notify` reaches the peer after the bytes.
    ///
    /// # Errors
    /// Before anything moves: [`Error::InvalidArgument`] for lists of different lengths, an
    /// empty list or layer range, a layer out of range; [`Error::BadBlock`] naming the entry
    /// for a block out of range or a destination block given twice. Then as
    /// [`crate::Peer::submit`].
    pub fn post(
        &self,
        src: &[u64],
        dst: &[u64],
        layers: Range<usize>,
        notify: Option<Vec<u8>>,
    ) -> Result<TransferHandle> {
        let t = self.transfer(src, dst, layers, notify)?;
        self.peer.submit(t)
    }

    /// The transfer a post submits (see [`BlockTransfer::post`]).
    pub(crate) fn transfer(
        &self,
        src: &[u64],
        dst: &[u64],
        layers: Range<usize>,
        notify: Option<Vec<u8>>,
    ) -> Result<Transfer> {
        check_lists(src, dst, self.local.num_blocks)?;
        if layers.is_empty() || layers.end > self.local.num_layers() {
            return Err(Error::InvalidArgument(format!(
                "layers {}..{}: the pools have {} layers",
                layers.start,
                layers.end,
                self.local.num_layers()
            )));
        }
        let (lb, rb) = match self.kind {
            OpKind::Write => (src, dst),
            OpKind::Read => (dst, src),
        };
        let runs = runs(lb, rb);
        let bs = self.local.block_bytes;
        let mut t = Transfer::with_capacity(runs.len() * layers.len() * self.local.segments());
        for l in layers {
            for (ls, rs) in self.local.layers[l].iter().zip(&self.remote.layers[l]) {
                let (SegmentMemory::Local(region), SegmentMemory::Remote(desc)) =
                    (&ls.memory, &rs.memory)
                else {
                    continue;
                };
                // Runs merge only where both sides' blocks are back to back.
                let merge = ls.stride == bs && rs.stride == bs;
                for &(lo, ro, n) in &runs {
                    if merge {
                        t.push_inner(self.kind, region, ls.at(lo), desc, rs.at(ro), n * bs);
                    } else {
                        for k in 0..n {
                            t.push_inner(self.kind, region, ls.at(lo + k), desc, rs.at(ro + k), bs);
                        }
                    }
                }
            }
        }
        if let Some(n) = notify {
            t.notify(n);
        }
        if let Some(d) = self.timeout {
            t.timeout(d);
        }
        Ok(t)
    }
}

/// Refuses, naming the entry, what no transfer should carry: lists of different lengths, an
/// empty list, a block out of range, a destination block given twice.
fn check_lists(src: &[u64], dst: &[u64], blocks: u64) -> Result<()> {
    if src.len() != dst.len() {
        return Err(Error::InvalidArgument(format!(
            "{} source blocks and {} destination blocks: give one destination per source",
            src.len(),
            dst.len()
        )));
    }
    if src.is_empty() {
        return Err(Error::InvalidArgument("an empty block list".into()));
    }
    let mut seen = vec![u32::MAX; blocks as usize];
    for (list, ids) in [(BlockList::Src, src), (BlockList::Dst, dst)] {
        for (index, &block) in ids.iter().enumerate() {
            if block >= blocks {
                return Err(Error::BadBlock {
                    list,
                    index,
                    block,
                    why: format!("out of range: the pool has {blocks} blocks"),
                });
            }
            if list == BlockList::Dst {
                let first = &mut seen[block as usize];
                if *first != u32::MAX {
                    return Err(Error::BadBlock {
                        list,
                        index,
                        block,
                        why: format!(
                            "given twice (first at dst[{}]): two sources would race for it",
                            *first
                        ),
                    });
                }
                *first = index as u32;
            }
        }
    }
    Ok(())
}

/// The pairs as runs of back-to-back blocks on both sides: `(local, remote, count)`.
fn runs(local: &[u64], remote: &[u64]) -> Vec<(u64, u64, u64)> {
    let mut out: Vec<(u64, u64, u64)> = Vec::new();
    for (&l, &r) in local.iter().zip(remote) {
        match out.last_mut() {
            Some((lo, ro, n)) if *lo + *n == l && *ro + *n == r => *n += 1,
            _ => out.push((l, r, 1)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adjacent_pairs_merge_and_others_do_not() {
        assert_eq!(
            runs(&[3, 4, 5, 9], &[7, 8, 9, 1]),
            vec![(3, 7, 3), (9, 1, 1)]
        );
        // Reversed lists are back to back on neither side's order.
        assert_eq!(runs(&[5, 4], &[1, 0]), vec![(5, 1, 1), (4, 0, 1)]);
        // Adjacent on one side only.
        assert_eq!(runs(&[1, 2], &[5, 7]), vec![(1, 5, 1), (2, 7, 1)]);
    }

    #[test]
    fn bad_lists_are_refused_by_entry() {
        let e = check_lists(&[1, 9000], &[2, 3], 8192).unwrap_err();
        assert!(
            matches!(
                e,
                Error::BadBlock {
                    list: BlockList::Src,
                    index: 1,
                    block: 9000,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("src[1] = 9000"), "{e}");
        let e = check_lists(&[1, 2, 3], &[4, 5, 4], 8192).unwrap_err();
        assert!(
            matches!(
                e,
                Error::BadBlock {
                    list: BlockList::Dst,
                    index: 2,
                    block: 4,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("first at dst[0]"), "{e}");
        // A source given twice is a broadcast, not a race.
        assert!(check_lists(&[1, 1], &[2, 3], 8).is_ok());
        assert!(check_lists(&[1], &[2, 3], 8).is_err());
        assert!(check_lists(&[], &[], 8).is_err());
    }
}
