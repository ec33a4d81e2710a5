//! File ↔ host memory through the staged pipeline (no GPU step): [`copy_file_to_host`],
//! [`copy_host_to_file`], and [`read_file`], which streams a range to a callback in order.
//!
//! The bounce buffers are ordinary page-aligned host memory; with `O_DIRECT` the page cache is
//! bypassed both ways.

use crate::align::{self, AlignedBuf, Geometry};
use crate::fileio::FileIo;
use crate::plan::{plan, CufileStatus, MemoryEnd};
use crate::residency::plan_read;
use crate::{pipeline, CopyOptions, CopyReport, Direction, FileRange, StorageError, StoragePath};
use gdx_base::bytesize::human_bytes;
use std::time::{Duration, Instant};

/// Whether a planned path uses `O_DIRECT`.
pub(crate) fn wants_direct(path: StoragePath) -> bool {
    path != StoragePath::Buffered
}

/// The `[offset, offset + len)` that `src` names in a file of `size` bytes.
pub(crate) fn resolve(src: &FileRange, size: u64) -> Result<(u64, u64), StorageError> {
    let past = |len| StorageError::RangePastEnd {
        path: src.path.clone(),
        offset: src.offset,
        len,
        size,
    };
    match src.len {
        None if src.offset > size => Err(past(0)),
        None => Ok((src.offset, size - src.offset)),
        Some(len) => match src.offset.checked_add(len) {
            Some(end) if end <= size => Ok((src.offset, len)),
            _ => Err(past(len)),
        },
    }
}

/// The destination length for a source of `src_len` bytes.
pub(crate) fn dest_len(dst: &FileRange, src_len: u64) -> Result<u64, StorageError> {
    match dst.len {
        Some(l) if l != src_len => Err(StorageError::LengthMismatch {
            path: dst.path.clone(),
            dst: l,
            src: src_len,
        }),
        _ => Ok(src_len),
    }
}

/// Bytes one bounce buffer needs for `geo`'s chunks: the chunk size, or less for a small range.
pub(crate) fn bounce_len(offset: u64, len: u64, chunk: usize) -> usize {
    let span = align::align_up(offset + len) - align::align_down(offset);
    (chunk as u64).min(span.max(align::ALIGN)) as usize
}

/// One staged pipeline run over the file range `[offset, offset + len)`: its chunks and the
/// bounce buffers (the depth, at most one per chunk) of `kind` (`aligned host`, `pinned`).
pub(crate) struct Staged<B> {
    len: u64,
    geo: Geometry,
    bufs: Vec<B>,
    blen: usize,
    kind: &'static str,
}

impl<B> Staged<B> {
    /// The chunks and their buffers, each from `alloc(length)`.
    pub(crate) fn new(
        (offset, len): (u64, u64),
        opts: &CopyOptions,
        kind: &'static str,
        alloc: impl FnMut(usize) -> Result<B, StorageError>,
    ) -> Result<Self, StorageError> {
        let geo = Geometry::new(offset, len, opts.chunk_bytes);
        let n = opts.depth.min(geo.count()).max(1);
        let blen = bounce_len(offset, len, opts.chunk_bytes);
        let bufs = vec![blen; n]
            .into_iter()
            .map(alloc)
            .collect::<Result<_, _>>()?;
        Ok(Staged {
            len,
            geo,
            bufs,
            blen,
            kind,
        })
    }

    /// Run the pipeline (`go` hands the chunks, the buffers and the progress counter to
    /// [`pipeline::read`] or [`pipeline::write`]) over the `len` bytes of `io` and report the
    /// copy: the path its file I/O took and why, after the plan's reason when there is one. A
    /// write ends with `fdatasync` when [`CopyOptions::sync`] asks for it.
    pub(crate) fn run(
        self,
        direction: Direction,
        io: &FileIo,
        plan_reason: Option<&str>,
        opts: &CopyOptions,
        go: impl FnOnce(&Geometry, Vec<B>, &mut dyn FnMut(u64)) -> Result<(), StorageError>,
    ) -> Result<CopyReport, StorageError> {
        let (n, len) = (self.bufs.len(), self.len);
        let start = Instant::now();
        go(&self.geo, self.bufs, &mut opts.counter(len))?;
        let op = match direction {
            Direction::FileToGpu | Direction::FileToHost => "read",
            Direction::GpuToFile | Direction::HostToFile => "write",
        };
        if op == "write" && opts.sync {
            io.sync()?;
        }
        let pipeline = describe(n, self.blen, self.kind, op);
        Ok(report(
            direction,
            len,
            io,
            plan_reason,
            pipeline,
            start.elapsed(),
        ))
    }
}

/// The report of a pipeline run over `io`: the path its file I/O took and why, after the plan's
/// reason when there is one, then the `pipeline` it ran.
pub(crate) fn report(
    direction: Direction,
    bytes: u64,
    io: &FileIo,
    plan_reason: Option<&str>,
    pipeline: String,
    elapsed: Duration,
) -> CopyReport {
    let (path, why) = io.outcome();
    let split = io.split();
    let why = if io.is_split() {
        format!("{why}; {split}")
    } else {
        why
    };
    let reason = match plan_reason {
        Some(plan) => format!("{plan}; {why}; {pipeline}"),
        None => format!("{why}; {pipeline}"),
    };
    CopyReport {
        direction,
        bytes,
        path,
        reason,
        elapsed,
        split: Some(split),
    }
}

/// `4 x 16 MiB aligned host bounce buffers, 4 reads in flight`; `op` is `read` or `write`.
pub(crate) fn describe(n: usize, len: usize, kind: &str, op: &str) -> String {
    let s = if n == 1 { "" } else { "s" };
    format!(
        "{n} x {} {kind} bounce buffer{s}, {n} {op}{s} in flight",
        human_bytes(len as u64)
    )
}

/// Read `src` through the pipeline and hand its bytes, in file order, to `sink` as (offset from
/// the start of the range, bytes). `check` sees the resolved length before any read.
fn read_with(
    src: &FileRange,
    opts: &CopyOptions,
    direction: Direction,
    check: impl FnOnce(u64) -> Result<(), StorageError>,
    mut sink: impl FnMut(u64, &[u8]) -> Result<(), StorageError>,
) -> Result<CopyReport, StorageError> {
    opts.validate()?;
    let plan = plan_read(src, opts.path, MemoryEnd::Host, || CufileStatus::NotNeeded)?;
    let mut io = FileIo::open_read(&src.path, wants_direct(plan.path))?;
    io.set_residency(plan.residency.clone());
    let (offset, len) = resolve(src, io.size_at_open())?;
    check(len)?;
    let staged = Staged::new((offset, len), opts, "aligned host", |l| {
        Ok(AlignedBuf::new(l))
    })?;
    staged.run(
        direction,
        &io,
        Some(&plan.reason),
        opts,
        |geo, bufs, progress| {
            pipeline::read(
                &io,
                geo,
                bufs,
                &|| Ok(()),
                |piece, buf| sink(piece.rel, &buf.as_slice()[piece.skip..piece.need()]),
                progress,
            )
        },
    )
}

/// Read the range `src` (to the end of the file when its length is `None`) and pass its bytes
/// to `sink` in file order, as (offset from the start of the range, bytes), one chunk at a
/// time. [`PathChoice::Gds`] is refused: cuFile moves GPU memory.
pub fn read_file(
    src: &FileRange,
    opts: &CopyOptions,
    sink: impl FnMut(u64, &[u8]) -> Result<(), StorageError>,
) -> Result<CopyReport, StorageError> {
    read_with(src, opts, Direction::FileToHost, |_| Ok(()), sink)
}

/// Copy the range `src` into the start of `dst`, which must be at least as long as the range.
/// Returns the report; `report.bytes` bytes of `dst` were written.
pub fn copy_file_to_host(
    src: &FileRange,
    dst: &mut [u8],
    opts: &CopyOptions,
) -> Result<CopyReport, StorageError> {
    let size = dst.len() as u64;
    read_with(
        src,
        opts,
        Direction::FileToHost,
        |len| {
            if len > size {
                return Err(StorageError::OutOfBounds {
                    what: "destination host buffer",
                    offset: 0,
                    len,
                    size,
                });
            }
            Ok(())
        },
        |rel, bytes| {
            let at = rel as usize;
            dst[at..at + bytes.len()].copy_from_slice(bytes);
            Ok(())
        },
    )
}

/// Write all of `src` to the range `dst` (whose length, if given, must equal `src.len()`),
/// creating the file if needed. With [`CopyOptions::truncate`] the file ends where the range
/// does.
pub fn copy_host_to_file(
    src: &[u8],
    dst: &FileRange,
    opts: &CopyOptions,
) -> Result<CopyReport, StorageError> {
    copy_slices_to_file(&[src], dst, opts)
}

/// [`copy_host_to_file`] of the concatenation of `parts` (e.g. a checkpoint's header and then
/// each tensor), gathered chunk by chunk into the pipeline's buffers: one pipelined write, no
/// copy of the whole in memory.
pub fn copy_slices_to_file(
    parts: &[&[u8]],
    dst: &FileRange,
    opts: &CopyOptions,
) -> Result<CopyReport, StorageError> {
    opts.validate()?;
    let total = parts.iter().map(|p| p.len() as u64).sum();
    let len = dest_len(dst, total)?;
    let plan = plan(opts.path, MemoryEnd::Host, &CufileStatus::NotNeeded)?;
    let io = FileIo::open_write(&dst.path, wants_direct(plan.path))?;
    if opts.truncate {
        io.set_len(dst.offset)?;
    }
    let staged = Staged::new((dst.offset, len), opts, "aligned host", |l| {
        Ok(AlignedBuf::new(l))
    })?;
    staged.run(
        Direction::HostToFile,
        &io,
        Some(&plan.reason),
        opts,
        |geo, bufs, progress| {
            pipeline::write(
                &io,
                geo,
                bufs,
                &|| Ok(()),
                pipeline::fill_from(parts),
                progress,
            )
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_resolve_against_the_file_size() {
        let r = |offset, len| FileRange {
            path: "/f".into(),
            offset,
            len,
        };
        assert_eq!(resolve(&r(0, None), 100).unwrap(), (0, 100));
        assert_eq!(resolve(&r(100, None), 100).unwrap(), (100, 0));
        assert_eq!(resolve(&r(10, Some(90)), 100).unwrap(), (10, 90));
        assert!(resolve(&r(101, None), 100).is_err());
        let e = resolve(&r(10, Some(91)), 100).unwrap_err();
        assert!(e.to_string().contains("past its end"), "{e}");
        assert!(resolve(&r(u64::MAX, Some(2)), 100).is_err());
    }

    #[test]
    fn destination_lengths_must_match() {
        assert_eq!(dest_len(&FileRange::whole("/f"), 5).unwrap(), 5);
        assert_eq!(dest_len(&FileRange::new("/f", 3, 5), 5).unwrap(), 5);
        assert!(dest_len(&FileRange::new("/f", 3, 4), 5).is_err());
    }

    #[test]
    fn small_ranges_get_small_bounce_buffers() {
        assert_eq!(bounce_len(0, 1, 16 << 20), 4096);
        assert_eq!(bounce_len(4095, 2, 16 << 20), 8192);
        assert_eq!(bounce_len(0, 1 << 30, 16 << 20), 16 << 20);
        assert_eq!(bounce_len(0, 0, 16 << 20), 4096);
    }
}
