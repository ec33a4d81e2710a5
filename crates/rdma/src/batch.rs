//! Cutting a batch of work items into work requests: range checks before anything is posted
//! ([`check_ranges`]) and the chunk plan ([`plan_chunks`]) that spreads large items
//! round-robin over a connection's queue pairs without overflowing any send queue. Pure
//! functions, so the data path's book-keeping is tested without a device.

use crate::cache::MemRange;
use crate::error::RdmaError;

/// Check one work item's ranges: `len` bytes at `local_addr` inside the registered `range`,
/// a non-empty length, and a remote range that does not wrap.
pub(crate) fn check_ranges(
    range: MemRange,
    local_addr: u64,
    remote_addr: u64,
    len: u64,
) -> Result<(), RdmaError> {
    let off = local_addr.wrapping_sub(range.addr);
    if len == 0 || local_addr < range.addr || off.checked_add(len).is_none_or(|e| e > range.len) {
        return Err(RdmaError::OutOfBounds {
            what: format!("local registration ({range})"),
            offset: off,
            len,
            size: range.len,
        });
    }
    if remote_addr.checked_add(len).is_none() {
        return Err(RdmaError::OutOfBounds {
            what: "remote address space".into(),
            offset: remote_addr,
            len,
            size: u64::MAX,
        });
    }
    Ok(())
}

/// One work request of a planned batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Chunk {
    pub(crate) item: usize,
    pub(crate) qp: usize,
    pub(crate) offset: u64,
    pub(crate) len: u64,
}

/// How a batch is cut into work requests and spread over queue pairs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) chunks: Vec<Chunk>,
    pub(crate) per_item: Vec<usize>,
    /// Where the next batch starts its round-robin.
    pub(crate) next: usize,
}

/// Cut items of `lens` bytes into chunks of at most `chunk` bytes and deal them round-robin,
/// from queue pair `next`, over queue pairs with `free` slots each. The whole batch or
/// nothing: [`RdmaError::QueueFull`] when the slots do not suffice.
pub(crate) fn plan_chunks(
    lens: &[u64],
    chunk: u64,
    free: &[usize],
    next: usize,
) -> Result<Plan, RdmaError> {
    let chunk = chunk.max(1);
    if lens.is_empty() {
        return Err(RdmaError::InvalidArgument("an empty batch".into()));
    }
    let per_item: Vec<usize> = lens.iter().map(|l| l.div_ceil(chunk) as usize).collect();
    let needed: usize = per_item.iter().sum();
    let total: usize = free.iter().sum();
    if needed > total {
        return Err(RdmaError::QueueFull {
            free: total,
            needed,
        });
    }
    let mut free = free.to_vec();
    let mut next = next;
    let mut chunks = Vec::with_capacity(needed);
    for (item, &len) in lens.iter().enumerate() {
        let mut offset = 0;
        while offset < len {
            let this = (len - offset).min(chunk);
            // A queue pair with a free slot exists: needed <= total.
            while free[next % free.len()] == 0 {
                next += 1;
            }
            let qp = next % free.len();
            next += 1;
            free[qp] -= 1;
            chunks.push(Chunk {
                item,
                qp,
                offset,
                len: this,
            });
            offset += this;
        }
    }
    Ok(Plan {
        chunks,
        per_item,
        next: next % free.len().max(1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::MemKind;

    fn range() -> MemRange {
        MemRange {
            kind: MemKind::Gpu(0),
            addr: 0x7000_0000,
            len: 1 << 20,
        }
    }

    #[test]
    fn local_and_remote_ranges_are_checked_before_posting() {
        let r = range();
        assert!(check_ranges(r, r.addr, 0x1000, r.len).is_ok());
        assert!(check_ranges(r, r.addr + 10, 0x1000, r.len - 10).is_ok());
        for (local, len) in [
            (r.addr, r.len + 1),
            (r.addr - 1, 1),
            (r.addr + r.len, 1),
            (r.addr, 0),
            (u64::MAX, 2),
        ] {
            let e = check_ranges(r, local, 0x1000, len).unwrap_err();
            assert!(
                matches!(e, RdmaError::OutOfBounds { .. }),
                "{local:#x}+{len}: {e}"
            );
        }
        let e = check_ranges(r, r.addr, u64::MAX - 1, 16).unwrap_err();
        assert!(e.to_string().contains("remote address space"), "{e}");
    }

    #[test]
    fn large_items_are_chunked_round_robin_over_the_queue_pairs() {
        let p = plan_chunks(&[10 << 20, 1], 4 << 20, &[8, 8], 0).unwrap();
        assert_eq!(p.per_item, vec![3, 1]);
        let qps: Vec<usize> = p.chunks.iter().map(|c| c.qp).collect();
        assert_eq!(qps, [0, 1, 0, 1]);
        let first: Vec<(u64, u64)> = p
            .chunks
            .iter()
            .filter(|c| c.item == 0)
            .map(|c| (c.offset, c.len))
            .collect();
        assert_eq!(
            first,
            [(0, 4 << 20), (4 << 20, 4 << 20), (8 << 20, 2 << 20)]
        );
        assert_eq!(p.next, 0);
        // The next batch continues the rotation.
        let p2 = plan_chunks(&[1], 4 << 20, &[8, 8], 1).unwrap();
        assert_eq!(p2.chunks[0].qp, 1);
    }

    #[test]
    fn full_queue_pairs_are_skipped_and_a_batch_that_does_not_fit_is_refused_whole() {
        let p = plan_chunks(&[1, 1, 1], 4096, &[0, 2, 1], 0).unwrap();
        let qps: Vec<usize> = p.chunks.iter().map(|c| c.qp).collect();
        assert_eq!(qps, [1, 2, 1]);
        let e = plan_chunks(&[1, 1, 1, 1], 4096, &[0, 2, 1], 0).unwrap_err();
        assert!(
            matches!(e, RdmaError::QueueFull { free: 3, needed: 4 }),
            "{e}"
        );
        assert!(plan_chunks(&[], 4096, &[4], 0).is_err());
    }
}
