//! [`copy`]: `gdx cp`'s whole job as one call. Between a file and GPU or host memory, with the
//! range checked before anything is allocated, the GPU (or host) side created and filled
//! here, an optional CRC-32 check of both ends, the ceiling, and no partial file left behind.
//!
//! A [`Location::Gpu`] or [`Location::Host`] *source* is this process's own memory, which
//! starts empty: it is filled with gdx-base's seeded pattern first, so [`CopyRequest::length`]
//! is required for it.

use crate::ceiling::CopyCeiling;
use crate::{
    checksum_bytes, checksum_file, checksum_gpu, copy_file_to_gpu, copy_file_to_host,
    copy_gpu_to_file, copy_host_to_file, Checksum, CopyOptions, CopyReport, FileRange,
    StorageError,
};
use gdx_base::bytesize::human_bytes;
use gdx_base::pattern::{fill_pattern, SEED};
use gdx_sys::cuda::{Context, Cuda, DeviceBuffer, PinnedHostBuffer, Stream};
use std::fmt;
use std::path::{Path, PathBuf};

/// One end of a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A file or block device.
    File(PathBuf),
    /// GPU `ordinal`'s memory (CUDA ordinal), at `offset` bytes into a fresh buffer.
    Gpu {
        /// CUDA ordinal.
        ordinal: u32,
        /// Bytes into the buffer.
        offset: u64,
    },
    /// Host memory (a fresh buffer).
    Host,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::File(p) => write!(f, "file:{}", p.display()),
            Location::Gpu { ordinal, offset: 0 } => write!(f, "gpu:{ordinal}"),
            Location::Gpu { ordinal, offset } => write!(f, "gpu:{ordinal}:{offset}"),
            Location::Host => f.write_str("host"),
        }
    }
}

/// What to copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyRequest {
    /// The source.
    pub src: Location,
    /// The destination.
    pub dst: Location,
    /// File sources: start reading here.
    pub skip: u64,
    /// Bytes to copy; default the rest of a file source; required for memory sources.
    pub length: Option<u64>,
    /// File destinations: write at this byte and keep the rest of the file (the caller then
    /// leaves [`CopyOptions::truncate`] off).
    pub seek: Option<u64>,
    /// Compare CRC-32 checksums of both ends afterwards.
    pub verify: bool,
}

/// A finished copy, its ceiling and its check.
#[derive(Debug, Clone)]
pub struct CopyOutcome {
    /// What the copy did.
    pub report: CopyReport,
    /// The lower of the disk's and the GPU's links.
    pub ceiling: CopyCeiling,
    /// (source, destination) checksums, with [`CopyRequest::verify`].
    pub verify: Option<(Checksum, Checksum)>,
}

impl CopyOutcome {
    /// `Some(true)` when both checksums agree, `Some(false)` when they differ, `None` without
    /// a check.
    pub fn verified(&self) -> Option<bool> {
        self.verify.map(|(a, b)| a == b)
    }
}

/// What became of a destination file when a copy into it failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartialFile {
    /// The copy created it; it was removed.
    Removed,
    /// It existed before; it is now partly written.
    Existing,
    /// The copy created it and removing it failed (why).
    LeftBehind(String),
}

impl fmt::Display for PartialFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PartialFile::Removed => f.write_str("removed the partial file"),
            PartialFile::Existing => {
                f.write_str("the file existed before and is now partly written")
            }
            PartialFile::LeftBehind(why) => {
                write!(
                    f,
                    "the partial file is left behind (removing it failed: {why})"
                )
            }
        }
    }
}

/// Copy `req.src` to `req.dst`. One side must be a file.
pub fn copy(req: &CopyRequest, opts: &CopyOptions) -> Result<CopyOutcome, StorageError> {
    opts.validate()?;
    match (&req.src, &req.dst) {
        (Location::File(p), Location::Gpu { ordinal, offset }) => {
            file_to_gpu(req, p, *ordinal, *offset, opts)
        }
        (Location::Gpu { ordinal, offset }, Location::File(p)) => {
            dest_check(p, req.seek, need_length(req, "gpu:")?)?;
            into_file(p, || gpu_to_file(req, *ordinal, *offset, p, opts))
        }
        (Location::File(p), Location::Host) => file_to_host(req, p, opts),
        (Location::Host, Location::File(p)) => {
            dest_check(p, req.seek, need_length(req, "host")?)?;
            into_file(p, || host_to_file(req, p, opts))
        }
        (Location::File(_), Location::File(_)) => Err(StorageError::InvalidOption(
            "file -> file is not what gdx cp is for (use cp(1)); it moves files into and out of GPU or host memory".into(),
        )),
        (src, dst) => Err(StorageError::InvalidOption(format!(
            "{src} -> {dst} is not supported: one side must be a file (GPU <-> GPU and host <-> GPU copies are the engine's)"
        ))),
    }
}

/// The bytes a file source covers, checked before anything is allocated: a `--length 100T`
/// on a 1 MiB file, or an offset past the end, is refused here rather than as a 100 TB
/// allocation. Only regular files and block devices are sources: a FIFO or a character
/// device has no size to check, and opening a FIFO blocks until a writer appears.
pub fn source_len(path: &Path, skip: u64, length: Option<u64>) -> Result<u64, StorageError> {
    // Checked on the descriptor, opened without blocking (a FIFO swapped in after a stat would
    // hang a blocking open); a block device's size is where its end is.
    let mut o = std::fs::OpenOptions::new();
    o.read(true);
    let (_f, size) = crate::fileio::open_checked(path, &o, "reading", true)?;
    let len = length.unwrap_or(size.saturating_sub(skip));
    match skip.checked_add(len) {
        Some(end) if end <= size => Ok(len),
        _ => Err(StorageError::RangePastEnd {
            path: path.to_path_buf(),
            offset: skip,
            len,
            size,
        }),
    }
}

/// A file destination, checked before anything is opened or allocated: the range
/// `seek..seek + len` must be a valid file offset range (a `--seek` near 2^64 once wrapped
/// around, wrote nothing and reported success), and an existing path must be a regular file or a
/// block device (opening a FIFO for writing blocks until a reader appears; a character device
/// has no range to write).
pub fn dest_check(path: &Path, seek: Option<u64>, len: u64) -> Result<(), StorageError> {
    use std::os::unix::fs::FileTypeExt;
    let seek = seek.unwrap_or(0);
    // File offsets are signed 64-bit (off_t): the end must fit in i64, not only in u64.
    let fits = seek
        .checked_add(len)
        .is_some_and(|end| i64::try_from(end).is_ok());
    if !fits {
        return Err(StorageError::InvalidOption(format!(
            "--length {len} at --seek {seek} ends past the largest file offset ({}): pick a smaller --seek or --length",
            i64::MAX
        )));
    }
    match std::fs::metadata(path) {
        Ok(m) if m.file_type().is_file() || m.file_type().is_block_device() => Ok(()),
        Ok(m) => Err(StorageError::NotAFile {
            path: path.to_path_buf(),
            kind: crate::fileio::not_a_file_kind(m.file_type()),
        }),
        // Not there yet: the copy creates it.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(StorageError::Open {
            path: path.to_path_buf(),
            purpose: "writing",
            source,
        }),
    }
}

fn need_length(req: &CopyRequest, what: &str) -> Result<u64, StorageError> {
    req.length.ok_or_else(|| {
        StorageError::InvalidOption(format!(
            "a {what} source needs a length (gdx cp --length): it is this process's own memory, filled with a seeded pattern"
        ))
    })
}

fn gpu_extent(offset: u64, len: u64) -> Result<usize, StorageError> {
    offset
        .checked_add(len)
        .and_then(|e| usize::try_from(e.max(1)).ok())
        .ok_or_else(|| {
            StorageError::InvalidOption(format!(
                "GPU offset {offset} + length {len} does not fit in this machine's address space"
            ))
        })
}

fn usize_of(n: u64, what: &str) -> Result<usize, StorageError> {
    usize::try_from(n)
        .map_err(|_| StorageError::InvalidOption(format!("{what} {n} does not fit in memory here")))
}

fn cuda_context(ordinal: u32) -> Result<Context, StorageError> {
    let cuda = Cuda::load().map_err(|source| StorageError::NoCudaDriver { ordinal, source })?;
    cuda.context(ordinal)
        .map_err(StorageError::cuda(format!("opening GPU {ordinal}")))
}

fn gpu_buffer(ctx: &Context, bytes: usize) -> Result<DeviceBuffer, StorageError> {
    DeviceBuffer::new(ctx, bytes).map_err(StorageError::cuda(format!(
        "allocating {} on GPU {}",
        human_bytes(bytes as u64),
        ctx.ordinal()
    )))
}

/// A zeroed host buffer, or an error naming the size (never an allocation abort).
fn host_buffer(len: u64) -> Result<Vec<u8>, StorageError> {
    let n = usize_of(len, "the host buffer size")?;
    let mut buf = Vec::new();
    buf.try_reserve_exact(n).map_err(|_| {
        StorageError::InvalidOption(format!(
            "cannot allocate {} of host memory for this copy; give a smaller length",
            human_bytes(len)
        ))
    })?;
    buf.resize(n, 0);
    Ok(buf)
}

fn gpu_bus(ctx: &Context) -> Option<String> {
    ctx.device().pci_bus_id().ok()
}

/// The outcome of a copy between `path` and GPU `ctx`'s memory (host memory when `None`).
fn outcome(
    report: CopyReport,
    path: &Path,
    ctx: Option<&Context>,
    verify: Option<(Checksum, Checksum)>,
) -> CopyOutcome {
    CopyOutcome {
        report,
        ceiling: CopyCeiling::find(path, ctx.and_then(gpu_bus).as_deref()),
        verify,
    }
}

fn file_to_gpu(
    req: &CopyRequest,
    path: &Path,
    gpu: u32,
    offset: u64,
    opts: &CopyOptions,
) -> Result<CopyOutcome, StorageError> {
    let len = source_len(path, req.skip, req.length)?;
    let extent = gpu_extent(offset, len)?;
    let ctx = cuda_context(gpu)?;
    let mut dev = gpu_buffer(&ctx, extent)?;
    let off = usize_of(offset, "the GPU offset")?;
    let range = FileRange::new(path, req.skip, len);
    let report = copy_file_to_gpu(&range, &mut dev, off, opts)?;
    let verify = if req.verify {
        let got = usize_of(report.bytes, "the copy size")?;
        Some((checksum_file(&range)?, checksum_gpu(&dev, off, got)?))
    } else {
        None
    };
    Ok(outcome(report, path, Some(&ctx), verify))
}

fn gpu_to_file(
    req: &CopyRequest,
    gpu: u32,
    offset: u64,
    path: &Path,
    opts: &CopyOptions,
) -> Result<CopyOutcome, StorageError> {
    let len = need_length(req, "gpu:")?;
    let extent = gpu_extent(offset, len)?;
    let ctx = cuda_context(gpu)?;
    let mut dev = gpu_buffer(&ctx, extent)?;
    let off = usize_of(offset, "the GPU offset")?;
    let n = usize_of(len, "the length")?;
    fill_gpu(&ctx, &mut dev, off, n)?;
    let range = FileRange::new(path, req.seek.unwrap_or(0), len);
    let report = copy_gpu_to_file(&dev, off, len, &range, opts)?;
    let verify = if req.verify {
        Some((checksum_gpu(&dev, off, n)?, checksum_file(&range)?))
    } else {
        None
    };
    Ok(outcome(report, path, Some(&ctx), verify))
}

fn file_to_host(
    req: &CopyRequest,
    path: &Path,
    opts: &CopyOptions,
) -> Result<CopyOutcome, StorageError> {
    let len = source_len(path, req.skip, req.length)?;
    let mut buf = host_buffer(len)?;
    let range = FileRange::new(path, req.skip, len);
    let report = copy_file_to_host(&range, &mut buf, opts)?;
    let verify = if req.verify {
        let got = usize_of(report.bytes, "the copy size")?;
        Some((checksum_file(&range)?, checksum_bytes(&buf[..got])))
    } else {
        None
    };
    Ok(outcome(report, path, None, verify))
}

fn host_to_file(
    req: &CopyRequest,
    path: &Path,
    opts: &CopyOptions,
) -> Result<CopyOutcome, StorageError> {
    let len = need_length(req, "host")?;
    let mut buf = host_buffer(len)?;
    fill_pattern(&mut buf, SEED);
    let range = FileRange::new(path, req.seek.unwrap_or(0), len);
    let report = copy_host_to_file(&buf, &range, opts)?;
    let verify = if req.verify {
        Some((checksum_bytes(&buf), checksum_file(&range)?))
    } else {
        None
    };
    Ok(outcome(report, path, None, verify))
}

/// Run a copy into `path`; when it fails, remove the file if this copy created it (so an
/// ENOSPC half way leaves no partial file behind), or say that an existing one is now partly
/// written. Errors before the file was touched (bad options, no GPU) pass through unchanged.
fn into_file(
    path: &Path,
    copy: impl FnOnce() -> Result<CopyOutcome, StorageError>,
) -> Result<CopyOutcome, StorageError> {
    let existed = path.exists();
    copy().map_err(|e| {
        let created = !existed && path.exists();
        if !(created || existed) || !e.is_copy_failure() {
            if created {
                // Made by this copy before the failure: not the user's file.
                let _ = std::fs::remove_file(path);
            }
            return e;
        }
        let after = if existed {
            PartialFile::Existing
        } else {
            match std::fs::remove_file(path) {
                Ok(()) => PartialFile::Removed,
                Err(r) => PartialFile::LeftBehind(r.to_string()),
            }
        };
        StorageError::IntoFile {
            path: path.to_path_buf(),
            after,
            source: Box::new(e),
        }
    })
}

/// Fill `len` bytes of `dev` at `off` with the seeded pattern, through a pinned buffer.
fn fill_gpu(
    ctx: &Context,
    dev: &mut DeviceBuffer,
    off: usize,
    len: usize,
) -> Result<(), StorageError> {
    if len == 0 {
        return Ok(());
    }
    let what = || format!("filling GPU {} with the source pattern", ctx.ordinal());
    let piece = len.min(16 << 20);
    let stream = Stream::new(ctx).map_err(StorageError::cuda(what()))?;
    let mut host = PinnedHostBuffer::new(ctx, piece).map_err(StorageError::cuda(what()))?;
    let mut done = 0;
    while done < len {
        let n = piece.min(len - done);
        let slice = host.as_mut_slice().map_err(StorageError::cuda(what()))?;
        fill_pattern(&mut slice[..n], SEED ^ done as u64);
        stream
            .copy_to_device_at(dev, off + done, &host, 0, n)
            .map_err(StorageError::cuda(what()))?;
        done += n;
    }
    stream.synchronize().map_err(StorageError::cuda(what()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(src: Location, dst: Location) -> CopyRequest {
        CopyRequest {
            src,
            dst,
            skip: 0,
            length: None,
            seek: None,
            verify: true,
        }
    }

    #[test]
    fn host_round_trip_verifies_and_ranges_are_checked_first() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.bin");
        let mut r = req(Location::Host, Location::File(p.clone()));
        r.length = Some(100_000);
        let out = copy(&r, &CopyOptions::default()).unwrap();
        assert_eq!(out.verified(), Some(true));
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 100_000);
        let mut back = req(Location::File(p.clone()), Location::Host);
        back.skip = 1;
        let out = copy(&back, &CopyOptions::default()).unwrap();
        assert_eq!(out.report.bytes, 99_999);
        assert_eq!(out.verified(), Some(true));
        back.length = Some(u64::MAX);
        assert!(matches!(
            copy(&back, &CopyOptions::default()),
            Err(StorageError::RangePastEnd { .. })
        ));
    }

    #[test]
    fn gpu_extent_overflow_is_an_error() {
        assert!(gpu_extent(u64::MAX, 2).is_err());
        assert_eq!(gpu_extent(0, 0).unwrap(), 1);
    }

    #[test]
    fn memory_sources_need_a_length_and_file_to_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x");
        let e = copy(
            &req(Location::Host, Location::File(p.clone())),
            &CopyOptions::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("needs a length"), "{e}");
        assert!(!p.exists());
        let e = copy(
            &req(Location::File(p.clone()), Location::File(p)),
            &CopyOptions::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("use cp(1)"), "{e}");
    }
}
