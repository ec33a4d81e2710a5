//! The copy reference of a batch row: a single-thread memcpy of the same bytes, timed in blocks
//! between the row's blocks of transfers, so "1,000 × 4 KiB over shm = 0.52× memcpy of the same
//! 4 MiB" compares two figures taken in the same state of the machine (as the latency floors
//! are set beside the small rows, [`crate::floors::NearFloor`]). A separate `--path memcpy` run
//! seconds earlier or later may have caught a VM in another phase: on the 2-vCPU CI-class VM
//! one measured the same 4 MiB copy at 21.8 and at 31.1 GB/s within a minute.

use gdx_base::pattern::fill_pattern;

use crate::report::{NearFloor, Row};
use gdx_base::clock::wall;
use gdx_base::stats::median;

/// Least bytes per transfer a batch row carries a copy reference for: below this a transfer is
/// a round trip, not a copy, and is judged by its latency.
pub const MIN_BYTES: u64 = 64 << 10;
/// Most bytes per transfer a batch row carries a copy reference for (its two buffers are
/// allocated beside the row's own).
pub const MAX_BYTES: u64 = 64 << 20;

/// Timed copies per block (after one untimed copy that brings both buffers into this core's
/// caches, as the transfers' buffers are).
const BLOCK_COPIES: usize = 9;

/// Two private host buffers of a transfer's bytes, copied one into the other.
#[derive(Debug)]
pub struct CopyRef {
    src: Vec<u8>,
    dst: Vec<u8>,
}

impl CopyRef {
    /// Buffers of `bytes` each, the source filled (written pages, not the kernel's zero page,
    /// which would flatter every read).
    pub fn new(bytes: usize) -> CopyRef {
        let mut src = vec![0u8; bytes];
        fill_pattern(&mut src, bytes as u64);
        CopyRef {
            dst: vec![0u8; bytes],
            src,
        }
    }

    /// One block: the p50 time of a copy of the whole buffer, µs.
    pub fn block(&mut self) -> Option<f64> {
        self.dst.copy_from_slice(&self.src);
        let mut t = Vec::with_capacity(BLOCK_COPIES);
        for _ in 0..BLOCK_COPIES {
            let ((), d) = wall(|| {
                self.dst.copy_from_slice(std::hint::black_box(&self.src));
                std::hint::black_box(&self.dst);
            });
            t.push(d.as_secs_f64() * 1e6);
        }
        median(&t).filter(|us| *us > 0.0)
    }
}

pub use crate::report::NearCopy;

/// Pairs copy blocks (µs per copy of `bytes`) with the row's blocks of transfer times, as the
/// floors are (a block with too few samples, or no copy, is left out).
pub fn pair(
    bytes: u64,
    copies: &[Option<f64>],
    samples: &[std::time::Duration],
) -> Option<NearCopy> {
    // Times, so the bandwidth ratio is the inverse of the time ratio (and min and max swap).
    let t = NearFloor::pair(copies, samples)?;
    let inv = |x: f64| 1.0 / x.max(1e-12);
    Some(NearCopy {
        bytes,
        copy_gbps: bytes as f64 / (t.floor_us.max(1e-12) * 1e-6) / 1e9,
        ratio: inv(t.ratio),
        ratio_min: inv(t.ratio_max),
        ratio_max: inv(t.ratio_min),
        blocks: t.blocks,
    })
}

/// One line per batch row with a copy reference: its bandwidth against the memcpy of the same
/// bytes measured beside it.
pub fn beside(rows: &[&Row]) -> String {
    let mut s = String::new();
    for r in rows {
        let (Some(n), Some(bw)) = (&r.copy_near, r.bw_gbps) else {
            continue;
        };
        s.push_str(&format!(
            "{} {} batch {bw:.2} GB/s = {:.2}× single-thread memcpy of the same {} measured \
             beside it ({:.2} GB/s; {} block(s) interleaved, {:.2}–{:.2}×)\n",
            gdx_base::bytesize::human_bytes(r.size_bytes),
            r.path.name(),
            n.ratio,
            gdx_base::bytesize::human_bytes(n.bytes),
            n.copy_gbps,
            n.blocks,
            n.ratio_min,
            n.ratio_max,
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_block_copies_the_bytes_and_a_row_is_set_beside_its_copies() {
        let mut c = CopyRef::new(1 << 20);
        assert!(c.block().is_some_and(|us| us > 0.0));
        assert_eq!(c.dst, c.src, "the block copied the bytes");

        // Two blocks of transfers at 200 µs over copies of 100 µs, one at 400 over 100.
        let b = crate::floors::BLOCK_OPS as usize;
        let mut samples = vec![Duration::from_micros(200); 2 * b];
        samples.extend(vec![Duration::from_micros(400); b]);
        let n = pair(
            4_096_000,
            &[Some(100.0), Some(100.0), Some(100.0)],
            &samples,
        )
        .expect("paired");
        assert_eq!(n.blocks, 3);
        assert!(
            (n.ratio - 0.5).abs() < 1e-9 && (n.ratio_min - 0.25).abs() < 1e-9,
            "{n:?}"
        );
        assert!((n.ratio_max - 0.5).abs() < 1e-9 && (n.copy_gbps - 40.96).abs() < 1e-9);
        assert_eq!(pair(4096, &[None], &samples), None);
        let mut row = Row::new(crate::host::cases()[1].spec(), 4096);
        row.bw_gbps = Some(20.97);
        row.copy_near = Some(n);
        assert_eq!(
            beside(&[&row]),
            "4 KiB shm batch 20.97 GB/s = 0.50× single-thread memcpy of the same 4000 KiB \
             measured beside it (40.96 GB/s; 3 block(s) interleaved, 0.25–0.50×)\n"
        );
        row.copy_near = None;
        assert_eq!(beside(&[&row]), "");
    }
}
