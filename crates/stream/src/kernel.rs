//! Stage kernels: what the pipeline computes on every frame.
//!
//! A [`Kernel`] turns one frame into an [`Output`] (two 64-bit words). The result record is
//! fixed-size on purpose: the result ring then holds `slots` small records whatever the frame
//! size, and a `peer:` sink ships 32-byte records instead of frames.
//!
//! The built-in [`Checksum`] kernel is defined so that a GPU can compute it with one parallel
//! reduction and get the very same words (`kernels/stream_checksum.cu` is the same math):
//!
//! - `checksum` = Σ `w[i]` · (i + 1) mod 2^64, where `w[i]` is the i-th little-endian `u32` word of
//!   the frame (a last partial word is zero-padded). Position-weighted, so swapped words or a
//!   frame landing in the wrong slot change it; wrapping addition commutes, so the order in
//!   which GPU threads add does not.
//! - `sum_sq` = Σ `b[j]`² mod 2^64 over the bytes.

use gdx_engine::Result;

/// A kernel's result for one frame: two 64-bit words (the checksum kernel: checksum, sum of
/// squares).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Output(pub [u64; 2]);

/// What a stage runs on every frame. Implement it to plug your own processing in; the pipeline
/// calls it on the stage thread, one frame at a time, in sequence order.
pub trait Kernel: Send {
    /// A short name for reports (`checksum`).
    fn name(&self) -> String;

    /// Process one frame.
    ///
    /// # Errors
    /// Whatever the kernel cannot do; the pipeline stops and names the kernel and the frame.
    fn process(&mut self, frame: &[u8]) -> Result<Output>;
}

impl<K: Kernel + ?Sized> Kernel for Box<K> {
    fn name(&self) -> String {
        (**self).name()
    }
    fn process(&mut self, frame: &[u8]) -> Result<Output> {
        (**self).process(frame)
    }
}

/// The built-in checksum + sum-of-squares kernel, on the CPU.
#[derive(Debug, Clone, Copy, Default)]
pub struct Checksum;

impl Kernel for Checksum {
    fn name(&self) -> String {
        "checksum".into()
    }

    fn process(&mut self, frame: &[u8]) -> Result<Output> {
        Ok(checksum(frame))
    }
}

/// The checksum kernel's math on the CPU (the reference every GPU result is checked against).
pub fn checksum(frame: &[u8]) -> Output {
    let mut sum = 0u64;
    let mut sq = 0u64;
    let words = frame.chunks_exact(4);
    let tail = words.remainder();
    let mut i = 0u64;
    for w in words {
        i += 1;
        let v = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        sum = sum.wrapping_add(u64::from(v).wrapping_mul(i));
        sq = sq.wrapping_add(w.iter().map(|&b| u64::from(b) * u64::from(b)).sum::<u64>());
    }
    if !tail.is_empty() {
        let mut last = [0u8; 4];
        last[..tail.len()].copy_from_slice(tail);
        sum = sum.wrapping_add(u64::from(u32::from_le_bytes(last)).wrapping_mul(i + 1));
        sq = sq.wrapping_add(
            tail.iter()
                .map(|&b| u64::from(b) * u64::from(b))
                .sum::<u64>(),
        );
    }
    Output([sum, sq])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_weights_words_by_position_and_pads_the_tail() {
        assert_eq!(checksum(&[]), Output([0, 0]));
        // Words 1 and 2 (LE): 1*1 + 2*2 = 5; bytes 1,0,0,0,2,0,0,0 squared: 1 + 4.
        assert_eq!(checksum(&[1, 0, 0, 0, 2, 0, 0, 0]), Output([5, 5]));
        // Swapping the two words changes the checksum, not the sum of squares.
        assert_eq!(checksum(&[2, 0, 0, 0, 1, 0, 0, 0]), Output([4, 5]));
        // A 2-byte tail is the zero-padded word 0x0403 at position 2.
        assert_eq!(checksum(&[0, 0, 0, 0, 3, 4]), Output([0x0403 * 2, 9 + 16]));
    }
}
