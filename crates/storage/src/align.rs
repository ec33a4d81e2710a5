//! Alignment for `O_DIRECT`: the block size, aligned host buffers without `unsafe`, and the
//! split of a byte range into aligned chunks ([`Geometry`], [`Piece`]).
//!
//! A range `[offset, offset + len)` of a file is covered by chunks that start at
//! `align_down(offset)` and are `chunk` bytes apart; the last ends at `align_up(offset + len)`.
//! Every chunk's file position and length are multiples of [`ALIGN`], so it can be read or
//! written with `O_DIRECT` into an aligned buffer, where byte `k` of the buffer is byte
//! `file_pos + k` of the file. Of each chunk only `[skip, skip + len)` belongs to the range
//! (the head of the first chunk and the tail of the last lie outside it).

/// The alignment `O_DIRECT` needs of file offsets, lengths and buffer addresses here: 4 KiB,
/// the logical block size of current NVMe drives and the page size (a multiple of 512).
pub const ALIGN: u64 = 4096;

/// `x` rounded down to a multiple of [`ALIGN`].
pub(crate) fn align_down(x: u64) -> u64 {
    x - x % ALIGN
}

/// `x` rounded up to a multiple of [`ALIGN`] (saturating near `u64::MAX`).
pub(crate) fn align_up(x: u64) -> u64 {
    match x % ALIGN {
        0 => x,
        r => x.saturating_add(ALIGN - r),
    }
}

/// Whether `x` is a multiple of [`ALIGN`].
pub(crate) fn is_aligned(x: u64) -> bool {
    x & (ALIGN - 1) == 0
}

/// Whether the slice starts at an address that is a multiple of [`ALIGN`].
pub(crate) fn ptr_aligned(s: &[u8]) -> bool {
    is_aligned(s.as_ptr() as usize as u64)
}

/// Host memory whose first byte is [`ALIGN`]-aligned: a `Vec` one block longer than needed,
/// used from its first aligned byte (safe code only).
pub(crate) struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// `len` zeroed bytes.
    pub(crate) fn new(len: usize) -> AlignedBuf {
        let raw = vec![0u8; len + ALIGN as usize];
        // `align_offset` is exact for byte pointers; should it ever decline (it may return
        // usize::MAX), the buffer is merely unaligned and O_DIRECT is not used with it.
        let start = match raw.as_ptr().align_offset(ALIGN as usize) {
            s if s <= ALIGN as usize => s,
            _ => 0,
        };
        AlignedBuf { raw, start, len }
    }

    /// The bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }

    /// The bytes, writable.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }
}

/// How a range is cut into aligned chunks (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Geometry {
    offset: u64,
    len: u64,
    base: u64,
    chunk: u64,
}

/// One chunk of a [`Geometry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    /// Chunk number, from 0.
    pub(crate) index: usize,
    /// File position of the chunk's first byte (aligned).
    pub(crate) file_pos: u64,
    /// Bytes in the chunk (aligned): what a read asks for.
    pub(crate) span: usize,
    /// Chunk bytes before the range's first byte in it.
    pub(crate) skip: usize,
    /// Range bytes in the chunk.
    pub(crate) len: usize,
    /// Offset of the chunk's first range byte from the start of the range.
    pub(crate) rel: u64,
}

impl Piece {
    /// File position of the chunk's first range byte.
    pub(crate) fn data_pos(&self) -> u64 {
        self.file_pos + self.skip as u64
    }

    /// Chunk bytes a read must return to cover the range's bytes in it.
    pub(crate) fn need(&self) -> usize {
        self.skip + self.len
    }
}

impl Geometry {
    /// Chunks of `chunk` bytes (a non-zero multiple of [`ALIGN`]) over `[offset, offset + len)`.
    pub(crate) fn new(offset: u64, len: u64, chunk: usize) -> Geometry {
        Geometry {
            offset,
            len,
            base: align_down(offset),
            chunk: (chunk as u64).max(ALIGN),
        }
    }

    /// Number of chunks; 0 for an empty range.
    pub(crate) fn count(&self) -> usize {
        if self.len == 0 {
            return 0;
        }
        let end = align_up(self.offset + self.len);
        (end - self.base).div_ceil(self.chunk) as usize
    }

    /// Chunk `index` (below [`Geometry::count`]).
    pub(crate) fn piece(&self, index: usize) -> Piece {
        let file_pos = self.base + index as u64 * self.chunk;
        let chunk_end = (file_pos + self.chunk).min(align_up(self.offset + self.len));
        let start = file_pos.max(self.offset);
        let end = chunk_end.min(self.offset + self.len);
        Piece {
            index,
            file_pos,
            span: (chunk_end - file_pos) as usize,
            skip: (start - file_pos) as usize,
            len: end.saturating_sub(start) as usize,
            rel: start - self.offset,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding() {
        assert_eq!(align_down(4097), 4096);
        assert_eq!(align_up(4097), 8192);
        assert_eq!(align_up(8192), 8192);
        assert_eq!(align_up(0), 0);
        assert!(is_aligned(0) && is_aligned(1 << 32) && !is_aligned(1));
        assert_eq!(align_up(u64::MAX), u64::MAX);
    }

    #[test]
    fn aligned_buffers_are_aligned_and_zeroed() {
        for len in [1, 4095, 4096, 1 << 20] {
            let mut b = AlignedBuf::new(len);
            assert!(ptr_aligned(b.as_slice()));
            assert_eq!(b.as_slice().len(), len);
            assert!(b.as_slice().iter().all(|&x| x == 0));
            b.as_mut_slice()[len - 1] = 7;
            assert_eq!(b.as_slice()[len - 1], 7);
        }
    }

    /// Every range byte is covered exactly once, in order, and every chunk is aligned.
    fn check(offset: u64, len: u64, chunk: usize) {
        let g = Geometry::new(offset, len, chunk);
        let mut next = 0u64;
        for i in 0..g.count() {
            let p = g.piece(i);
            assert!(is_aligned(p.file_pos) && is_aligned(p.span as u64), "{p:?}");
            assert!(p.span <= chunk.max(ALIGN as usize));
            assert!(p.skip + p.len <= p.span, "{p:?}");
            assert_eq!(p.rel, next, "{offset} {len} {chunk}: {p:?}");
            assert_eq!(p.data_pos(), offset + p.rel);
            assert!(p.len > 0, "empty chunk {p:?}");
            next += p.len as u64;
        }
        assert_eq!(next, len, "{offset} {len} {chunk}");
    }

    #[test]
    fn chunks_cover_every_range_exactly_once() {
        for offset in [0u64, 1, 4095, 4096, 5000, (4 << 30) - 7] {
            for len in [0u64, 1, 7, 4096, 4097, 3 * 4096 - 1, 1 << 20, (1 << 20) + 3] {
                for chunk in [4096usize, 8192, 65536, 1 << 20] {
                    check(offset, len, chunk);
                }
            }
        }
    }

    #[test]
    fn an_unaligned_range_has_a_head_and_a_tail() {
        let g = Geometry::new(100, 10_000, 8192);
        assert_eq!(g.count(), 2);
        let p0 = g.piece(0);
        assert_eq!(
            (p0.file_pos, p0.span, p0.skip, p0.len),
            (0, 8192, 100, 8092)
        );
        let p1 = g.piece(1);
        assert_eq!(
            (p1.file_pos, p1.span, p1.skip, p1.len),
            (8192, 4096, 0, 1908)
        );
    }
}
