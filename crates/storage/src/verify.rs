//! Checksums for `--verify`: CRC-32 (IEEE) of a file range, of host bytes, or of GPU memory
//! (read back through a pinned buffer), with the byte count. Not timed, never part of a copy's
//! figures.

use crate::{read_file, CopyOptions, FileRange, PathChoice, StorageError};
use gdx_sys::cuda::{DeviceBuffer, PinnedHostBuffer, Stream};
use serde::Serialize;
use std::fmt;

/// A CRC-32 over a number of bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Checksum {
    /// CRC-32 (IEEE 802.3, as zlib computes it).
    pub crc32: u32,
    /// Bytes covered.
    pub len: u64,
}

impl fmt::Display for Checksum {
    /// `crc32 1a2b3c4d over 4096 bytes`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "crc32 {:08x} over {} bytes", self.crc32, self.len)
    }
}

/// The checksum of `bytes`.
pub fn checksum_bytes(bytes: &[u8]) -> Checksum {
    Checksum {
        crc32: crc32fast::hash(bytes),
        len: bytes.len() as u64,
    }
}

/// The checksum of a file range, read from the disk with `O_DIRECT` where the file system
/// takes it (so a copy's destination is checked as stored, not as cached).
pub fn checksum_file(range: &FileRange) -> Result<Checksum, StorageError> {
    let mut h = crc32fast::Hasher::new();
    let opts = CopyOptions {
        path: PathChoice::Auto,
        ..Default::default()
    };
    let r = read_file(range, &opts, |_, bytes| {
        h.update(bytes);
        Ok(())
    })?;
    Ok(Checksum {
        crc32: h.finalize(),
        len: r.bytes,
    })
}

/// The checksum of `len` bytes of `buf` at `offset`, copied back to the host in 16 MiB pieces.
pub fn checksum_gpu(
    buf: &DeviceBuffer,
    offset: usize,
    len: usize,
) -> Result<Checksum, StorageError> {
    crate::gpu::check_range("GPU buffer", offset, len as u64, buf.len())?;
    let mut h = crc32fast::Hasher::new();
    if len > 0 {
        let ctx = buf.context();
        let gpu = ctx.ordinal();
        let piece = len.min(16 << 20);
        let ctx_err = |what: &str| StorageError::cuda(format!("{what} for reading GPU {gpu} back"));
        let stream = Stream::new(ctx).map_err(ctx_err("creating a stream"))?;
        let mut host =
            PinnedHostBuffer::new(ctx, piece).map_err(ctx_err("allocating a pinned buffer"))?;
        let mut done = 0usize;
        while done < len {
            let n = piece.min(len - done);
            stream
                .copy_to_host_at(&mut host, 0, buf, offset + done, n)
                .map_err(ctx_err("copying"))?;
            let bytes = host.as_slice().map_err(ctx_err("waiting for a copy"))?;
            h.update(&bytes[..n]);
            done += n;
        }
    }
    Ok(Checksum {
        crc32: h.finalize(),
        len: len as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_the_standard_check_value() {
        // The CRC-32/ISO-HDLC check value for "123456789".
        let c = checksum_bytes(b"123456789");
        assert_eq!(c.crc32, 0xCBF4_3926);
        assert_eq!(c.to_string(), "crc32 cbf43926 over 9 bytes");
    }

    #[test]
    fn a_file_checksum_equals_the_bytes_checksum() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let data = gdx_base::pattern::pattern(100_003, 7);
        std::fs::write(&p, &data).unwrap();
        assert_eq!(
            checksum_file(&FileRange::whole(&p)).unwrap(),
            checksum_bytes(&data)
        );
        assert_eq!(
            checksum_file(&FileRange::new(&p, 4095, 10_000)).unwrap(),
            checksum_bytes(&data[4095..14_095])
        );
    }
}
