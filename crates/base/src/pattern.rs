//! The one test pattern of gdx: seeded bytes that differ at every offset, so a misplaced,
//! repeated or never-written block shows. Every probe, benchmark and test that fills a buffer
//! to check it afterwards fills it from here, so a pattern written by one tool can be checked
//! by another (doctor's probes, bench's verify pass, the engine and storage tests).
//!
//! Byte `i` (absolute offset) is byte `i % 8` (little-endian) of word `i / 8`, and word `k` is
//! splitmix64 of the seed and `k`: any sub-range can be written or checked on its own
//! ([`fill_pattern_at`], [`find_mismatch_at`]).

use std::fmt;

/// The byte a destination is filled with before it is written, so a byte never written shows
/// as this value (and [`Mismatch`] says so).
pub const POISON: u8 = 0xA5;

/// A seed for probes and tests that fill a source with the pattern (`gdx cp --verify`'s).
pub const SEED: u64 = 0x6764_785f_7072_6f62; // "gdx_prob"

/// The pattern's 8 bytes at word `index` (splitmix64 of seed and index).
fn pattern_word(seed: u64, index: u64) -> u64 {
    let mut z = seed.wrapping_add(index.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fill `buf` with the pattern of `seed` from offset 0.
pub fn fill_pattern(buf: &mut [u8], seed: u64) {
    fill_pattern_at(buf, seed, 0);
}

/// Fill `buf` with the pattern of `seed` as it runs from absolute offset `offset` on, so a
/// large buffer can be written piece by piece (`buf[k]` is the pattern's byte `offset + k`).
pub fn fill_pattern_at(buf: &mut [u8], seed: u64, offset: usize) {
    let mut pos = offset;
    let mut rest = buf;
    // The head, up to the next word boundary.
    let skip = pos % 8;
    if skip != 0 {
        let n = (8 - skip).min(rest.len());
        let w = pattern_word(seed, (pos / 8) as u64).to_le_bytes();
        let (head, tail) = rest.split_at_mut(n);
        head.copy_from_slice(&w[skip..skip + n]);
        pos += n;
        rest = tail;
    }
    let mut word = (pos / 8) as u64;
    let mut chunks = rest.chunks_exact_mut(8);
    for c in &mut chunks {
        c.copy_from_slice(&pattern_word(seed, word).to_le_bytes());
        word += 1;
    }
    let tail = chunks.into_remainder();
    let w = pattern_word(seed, word).to_le_bytes();
    tail.copy_from_slice(&w[..tail.len()]);
}

/// `len` bytes of the pattern of `seed` from offset 0.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill_pattern(&mut v, seed);
    v
}

/// The first byte that differs from the pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch {
    /// Offset from the start of the checked buffer.
    pub offset: usize,
    /// The pattern's byte.
    pub expected: u8,
    /// The byte found.
    pub found: u8,
}

impl fmt::Display for Mismatch {
    /// `byte 4096: expected 0x3c, found 0xa5 (the poison: never written)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "byte {}: expected {:#04x}, found {:#04x}",
            self.offset, self.expected, self.found
        )?;
        if self.found == POISON {
            f.write_str(" (the poison: never written)")?;
        }
        Ok(())
    }
}

/// The first byte of `buf` that differs from the pattern of `seed` (from offset 0), if any.
pub fn find_mismatch(buf: &[u8], seed: u64) -> Option<Mismatch> {
    find_mismatch_at(buf, seed, 0)
}

/// The first byte of `buf` that differs from the pattern of `seed` as it runs from absolute
/// offset `offset` on; [`Mismatch::offset`] counts from the start of `buf`.
pub fn find_mismatch_at(buf: &[u8], seed: u64, offset: usize) -> Option<Mismatch> {
    // Compared a block at a time: no second buffer of the whole size.
    let mut want = [0u8; 4096];
    let mut base = 0;
    for got in buf.chunks(want.len()) {
        let want = &mut want[..got.len()];
        fill_pattern_at(want, seed, offset + base);
        if let Some(k) = got.iter().zip(want.iter()).position(|(g, w)| g != w) {
            return Some(Mismatch {
                offset: base + k,
                expected: want[k],
                found: got[k],
            });
        }
        base += got.len();
    }
    None
}

/// `0..n` in an order fixed by `seed` (Fisher–Yates over the pattern's words): the block
/// lists of tests and benchmarks ("1,000 blocks chosen by a fixed random permutation"), the
/// same on every machine.
pub fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (pattern_word(seed ^ 0x7065_726d, i as u64) % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_is_seeded_and_offset_independent() {
        let a = pattern(37, 1);
        assert_ne!(a, pattern(37, 2));
        let long = pattern(64, 1);
        assert_eq!(&long[..37], &a[..]);
        assert_eq!(find_mismatch(&a, 1), None);
        assert_eq!(find_mismatch(&long, 1), None);
        assert!(a.iter().any(|&x| x != 0));
    }

    #[test]
    fn any_sub_range_is_the_same_bytes_as_the_whole() {
        let whole = pattern(10_000, 42);
        for (start, len) in [
            (0, 0),
            (1, 3),
            (3, 13),
            (7, 1),
            (8, 8),
            (13, 9000),
            (4095, 4097),
        ] {
            let mut piece = vec![0u8; len];
            fill_pattern_at(&mut piece, 42, start);
            assert_eq!(piece, &whole[start..start + len], "{start}+{len}");
            assert_eq!(find_mismatch_at(&piece, 42, start), None);
        }
        // Shifted by one byte, the check fails at once.
        assert_eq!(
            find_mismatch_at(&whole[1..100], 42, 0).map(|m| m.offset),
            Some(0)
        );
    }

    #[test]
    fn first_mismatch_is_reported_with_both_bytes() {
        for len in [1usize, 7, 8, 9, 100, 5000] {
            for bad in [0, len / 2, len - 1] {
                let mut v = pattern(len, 9);
                let expected = v[bad];
                v[bad] = !expected;
                let m = find_mismatch(&v, 9).unwrap();
                assert_eq!(
                    m,
                    Mismatch {
                        offset: bad,
                        expected,
                        found: !expected
                    },
                    "len {len}"
                );
            }
        }
        let m = Mismatch {
            offset: 4096,
            expected: 0x3c,
            found: POISON,
        };
        assert_eq!(
            m.to_string(),
            "byte 4096: expected 0x3c, found 0xa5 (the poison: never written)"
        );
    }

    #[test]
    fn a_permutation_holds_every_index_once_in_a_seeded_order() {
        let p = permutation(10_000, 3);
        let mut seen = vec![false; 10_000];
        for &k in &p {
            assert!(!seen[k], "{k} twice");
            seen[k] = true;
        }
        assert_eq!(p, permutation(10_000, 3));
        assert_ne!(p, permutation(10_000, 4));
        assert_ne!(p, (0..10_000).collect::<Vec<_>>());
        assert!(permutation(0, 1).is_empty());
        assert_eq!(permutation(1, 1), vec![0]);
    }
}
