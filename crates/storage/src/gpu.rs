//! File ↔ GPU memory: [`copy_file_to_gpu`] and [`copy_gpu_to_file`]. Each asks the planner,
//! runs cuFile (`gds`) or the staged pipeline through pinned bounce buffers, and reports the
//! path.
//!
//! Staged, file → GPU: I/O threads read chunks with `O_DIRECT` into pinned buffers; the calling
//! thread queues each chunk's host→GPU copy on one stream and hands the buffer back for the next
//! read, which starts as soon as that copy is done (the buffer's first access waits for it).
//! GPU → file is the mirror: the calling thread queues GPU→host copies into free buffers and the
//! I/O threads write each once its copy is done.

use crate::align::Piece;
use crate::fileio::FileIo;
use crate::gds::{self, GdsError};
use crate::host::{dest_len, report, resolve, wants_direct, Staged};
use crate::plan::{cufile_status, cufile_status_for_auto, plan, CufileStatus, MemoryEnd};
use crate::residency::{plan_read, ReadPlan};
use crate::{
    pipeline, CopyOptions, CopyReport, Direction, FileRange, PathChoice, StorageError, StoragePath,
};
use gdx_sys::cuda::{Context, DeviceBuffer, PinnedHostBuffer, Stream};
use std::time::Duration;

/// `offset..offset + len` must lie inside a buffer of `size` bytes.
pub(crate) fn check_range(
    what: &'static str,
    offset: usize,
    len: u64,
    size: usize,
) -> Result<(), StorageError> {
    let fits = (offset as u64)
        .checked_add(len)
        .is_some_and(|end| end <= size as u64);
    if fits {
        Ok(())
    } else {
        Err(StorageError::OutOfBounds {
            what,
            offset: offset as u64,
            len,
            size: size as u64,
        })
    }
}

/// The plan (with the page cache's residency for a read of `read_src`), and the open cuFile
/// driver when the plan is `gds`. cuFile is loaded and its driver opened only when the plan
/// depends on it (see [`plan_read`]): a read of a cached range never touches it.
fn plan_gpu(
    opts: &CopyOptions,
    read_src: Option<&FileRange>,
) -> Result<(ReadPlan, Option<gdx_sys::cufile::Driver>), StorageError> {
    let mut driver = None;
    let mut status = || match opts.path {
        PathChoice::Auto => {
            let (status, d) = cufile_status_for_auto();
            driver = d;
            status
        }
        PathChoice::Gds => {
            let (status, d) = cufile_status();
            driver = d;
            status
        }
        _ => CufileStatus::NotNeeded,
    };
    let p = match read_src {
        Some(src) => plan_read(src, opts.path, MemoryEnd::Gpu, status)?,
        None => {
            let p = plan(opts.path, MemoryEnd::Gpu, &status())?;
            ReadPlan {
                path: p.path,
                reason: p.reason,
                residency: None,
            }
        }
    };
    Ok((p, driver))
}

/// Plan a GPU copy and, when the plan is `gds`, run it through cuFile (`gds_copy`). `Ok(Ok)` is
/// cuFile's report; `Ok(Err)` hands the staged pipeline its plan: the planner's, or, when
/// cuFile could not be set up and the path was `auto`, `file-staged` and why it falls back.
fn planned_gds(
    opts: &CopyOptions,
    read_src: Option<&FileRange>,
    gds_copy: impl FnOnce(&gdx_sys::cufile::Driver) -> Result<CopyReport, GdsError>,
) -> Result<Result<CopyReport, ReadPlan>, StorageError> {
    let (mut p, driver) = plan_gpu(opts, read_src)?;
    if let (StoragePath::Gds, Some(driver)) = (p.path, driver) {
        match gds_copy(&driver) {
            Ok(mut r) => {
                r.reason = format!("{}; {}", p.reason, r.reason);
                return Ok(Ok(r));
            }
            Err(GdsError::Setup(e)) if opts.path == PathChoice::Auto => {
                p.reason = format!("cuFile could not be used ({e}); the O_DIRECT staged pipeline");
            }
            Err(GdsError::Setup(e) | GdsError::Io(e)) => return Err(e),
        }
    }
    // The staged pipeline stands in for a `gds` plan that cuFile could not run.
    if p.path == StoragePath::Gds {
        p.path = StoragePath::FileStaged;
    }
    Ok(Err(p))
}

/// Copy the range `src` (to the end of the file when its length is `None`) into `dst` at
/// `dst_offset`.
pub fn copy_file_to_gpu(
    src: &FileRange,
    dst: &mut DeviceBuffer,
    dst_offset: usize,
    opts: &CopyOptions,
) -> Result<CopyReport, StorageError> {
    opts.validate()?;
    match planned_gds(opts, Some(src), |driver| {
        gds::read(driver, src, dst, dst_offset, opts)
    })? {
        Ok(r) => Ok(r),
        Err(p) => staged_read(src, dst, dst_offset, opts, p),
    }
}

/// Copy `len` bytes of `src` at `src_offset` to the range `dst` (whose length, if given, must
/// be `len`), creating the file if needed. With [`CopyOptions::truncate`] the file ends where
/// the range does.
pub fn copy_gpu_to_file(
    src: &DeviceBuffer,
    src_offset: usize,
    len: u64,
    dst: &FileRange,
    opts: &CopyOptions,
) -> Result<CopyReport, StorageError> {
    opts.validate()?;
    check_range("source GPU buffer", src_offset, len, src.len())?;
    dest_len(dst, len)?;
    match planned_gds(opts, None, |driver| {
        gds::write(driver, src, src_offset, len, dst, opts)
    })? {
        Ok(r) => Ok(r),
        Err(p) => staged_write(src, src_offset, len, dst, opts, p.path, p.reason),
    }
}

/// One part of a file written by [`copy_parts_to_file`].
#[derive(Debug, Clone, Copy)]
pub enum Part<'a> {
    /// Bytes in host memory.
    Host(&'a [u8]),
    /// `len` bytes of a GPU buffer at `offset`.
    Gpu {
        /// The buffer.
        buf: &'a DeviceBuffer,
        /// Where the bytes start in it.
        offset: usize,
        /// How many.
        len: usize,
    },
}

impl Part<'_> {
    /// Bytes in the part.
    pub fn len(&self) -> usize {
        match self {
            Part::Host(b) => b.len(),
            Part::Gpu { len, .. } => *len,
        }
    }

    /// Whether the part has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Write the concatenation of `parts` (host bytes and spans of GPU `ctx`'s memory: a
/// checkpoint's header and its tensors) to the range `dst`, creating the file if needed: each
/// chunk is gathered into a pinned bounce buffer (GPU spans by asynchronous copies on one
/// stream, host bytes by the CPU) and written (`O_DIRECT` where the file system takes it) while
/// the next chunks are gathered; nothing is staged whole in host memory. With
/// [`CopyOptions::truncate`] the file ends where the range does; [`CopyOptions::sync`] adds
/// `fdatasync` (timed).
pub fn copy_parts_to_file(
    parts: &[Part<'_>],
    ctx: &Context,
    dst: &FileRange,
    opts: &CopyOptions,
) -> Result<CopyReport, StorageError> {
    opts.validate()?;
    for p in parts {
        if let Part::Gpu { buf, offset, len } = *p {
            check_range("source GPU buffer", offset, len as u64, buf.len())?;
            if !buf.context().same(ctx) {
                return Err(StorageError::InvalidOption(format!(
                    "every GPU part must be on GPU {}",
                    ctx.ordinal()
                )));
            }
        }
    }
    if opts.path == PathChoice::Gds {
        return Err(StorageError::PathUnavailable {
            path: StoragePath::Gds,
            reason: "a write of many parts goes through pinned buffers, not cuFile: ask for \
                     auto, file-staged or buffered"
                .to_string(),
        });
    }
    let total = parts.iter().map(|p| p.len() as u64).sum();
    let len = dest_len(dst, total)?;
    let p = plan(opts.path, MemoryEnd::Host, &CufileStatus::NotNeeded)?;
    let reason = p.reason.replace(
        "host memory: the O_DIRECT staged pipeline without the GPU step",
        "GPU memory gathered into pinned buffers, written with O_DIRECT",
    );
    let io = FileIo::open_write(&dst.path, wants_direct(p.path))?;
    if opts.truncate {
        io.set_len(dst.offset)?;
    }
    if len == 0 {
        return Ok(empty(Direction::GpuToFile, &io, &reason));
    }
    let gpu = ctx.ordinal();
    let (stream, staged) = staging(ctx, (dst.offset, len), opts)?;
    let starts: Vec<u64> = parts
        .iter()
        .scan(0u64, |at, p| {
            let s = *at;
            *at += p.len() as u64;
            Some(s)
        })
        .collect();
    staged.run(
        Direction::GpuToFile,
        &io,
        Some(&reason),
        opts,
        |geo, bufs, progress| {
            let fill = |piece: &Piece, buf: &mut PinnedHostBuffer| {
                let (mut rel, mut done) = (piece.rel, 0usize);
                // The part holding `rel`: the last that starts at or before it.
                let mut i = starts.partition_point(|&s| s <= rel).saturating_sub(1);
                while done < piece.len {
                    let part = parts.get(i).ok_or_else(|| {
                        StorageError::Internal("a write chunk runs past its parts".to_string())
                    })?;
                    let from = (rel - starts[i]) as usize;
                    let n = (part.len() - from.min(part.len())).min(piece.len - done);
                    let at = piece.skip + done;
                    match *part {
                        Part::Host(b) => {
                            let bytes = buf.as_mut_slice().map_err(StorageError::cuda(
                                "waiting for a bounce buffer's GPU copies",
                            ))?;
                            bytes[at..at + n].copy_from_slice(&b[from..from + n]);
                        }
                        Part::Gpu { buf: d, offset, .. } => stream
                            .copy_to_host_at(buf, at, d, offset + from, n)
                            .map_err(StorageError::cuda(format!(
                                "copying {n} bytes from GPU {gpu} at offset {}",
                                offset + from
                            )))?,
                    }
                    done += n;
                    rel += n as u64;
                    i += 1;
                }
                Ok(())
            };
            pipeline::write(&io, geo, bufs, &|| make_current(ctx), fill, progress)
        },
    )
}

fn make_current(ctx: &Context) -> Result<(), StorageError> {
    ctx.make_current().map_err(StorageError::cuda(format!(
        "making GPU {}'s context current on an I/O thread",
        ctx.ordinal()
    )))
}

/// The staged pipeline's parts on GPU `ctx` for the file range `(offset, len)`: a stream and
/// pinned bounce buffers.
fn staging(
    ctx: &Context,
    range: (u64, u64),
    opts: &CopyOptions,
) -> Result<(Stream, Staged<PinnedHostBuffer>), StorageError> {
    let gpu = ctx.ordinal();
    let stream = Stream::new(ctx).map_err(StorageError::cuda(format!(
        "creating a stream on GPU {gpu}"
    )))?;
    let staged = Staged::new(range, opts, "pinned", |len| {
        PinnedHostBuffer::new(ctx, len).map_err(StorageError::cuda(format!(
            "allocating a pinned bounce buffer of {len} bytes"
        )))
    })?;
    Ok((stream, staged))
}

/// The report of a staged copy of nothing.
fn empty(direction: Direction, io: &FileIo, reason: &str) -> CopyReport {
    report(
        direction,
        0,
        io,
        Some(reason),
        "nothing to copy".into(),
        Duration::ZERO,
    )
}

fn staged_read(
    src: &FileRange,
    dst: &mut DeviceBuffer,
    dst_offset: usize,
    opts: &CopyOptions,
    plan: ReadPlan,
) -> Result<CopyReport, StorageError> {
    let ReadPlan {
        path,
        reason,
        residency,
    } = plan;
    let mut io = FileIo::open_read(&src.path, wants_direct(path))?;
    io.set_residency(residency);
    let (offset, len) = resolve(src, io.size_at_open())?;
    check_range("destination GPU buffer", dst_offset, len, dst.len())?;
    if len == 0 {
        return Ok(empty(Direction::FileToGpu, &io, &reason));
    }
    let ctx = dst.context().clone();
    let gpu = ctx.ordinal();
    let (stream, staged) = staging(&ctx, (offset, len), opts)?;
    staged.run(
        Direction::FileToGpu,
        &io,
        Some(&reason),
        opts,
        |geo, bufs, progress| {
            let to_gpu = |piece: &Piece, buf: &PinnedHostBuffer| {
                let at = dst_offset + piece.rel as usize;
                stream
                    .copy_to_device_at(dst, at, buf, piece.skip, piece.len)
                    .map_err(StorageError::cuda(format!(
                        "copying {} bytes to GPU {gpu} at offset {at}",
                        piece.len
                    )))
            };
            pipeline::read(&io, geo, bufs, &|| make_current(&ctx), to_gpu, progress)?;
            stream.synchronize().map_err(StorageError::cuda(format!(
                "waiting for the copies to GPU {gpu}"
            )))
        },
    )
}

fn staged_write(
    src: &DeviceBuffer,
    src_offset: usize,
    len: u64,
    dst: &FileRange,
    opts: &CopyOptions,
    path: StoragePath,
    reason: String,
) -> Result<CopyReport, StorageError> {
    let io = FileIo::open_write(&dst.path, wants_direct(path))?;
    if opts.truncate {
        io.set_len(dst.offset)?;
    }
    if len == 0 {
        return Ok(empty(Direction::GpuToFile, &io, &reason));
    }
    let ctx = src.context().clone();
    let gpu = ctx.ordinal();
    let (stream, staged) = staging(&ctx, (dst.offset, len), opts)?;
    staged.run(
        Direction::GpuToFile,
        &io,
        Some(&reason),
        opts,
        |geo, bufs, progress| {
            let from_gpu = |piece: &Piece, buf: &mut PinnedHostBuffer| {
                let at = src_offset + piece.rel as usize;
                stream
                    .copy_to_host_at(buf, piece.skip, src, at, piece.len)
                    .map_err(StorageError::cuda(format!(
                        "copying {} bytes from GPU {gpu} at offset {at}",
                        piece.len
                    )))
            };
            pipeline::write(&io, geo, bufs, &|| make_current(&ctx), from_gpu, progress)
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_ranges_are_checked() {
        assert!(check_range("b", 0, 16, 16).is_ok());
        assert!(check_range("b", 16, 0, 16).is_ok());
        let e = check_range("destination GPU buffer", 10, 7, 16).unwrap_err();
        assert_eq!(
            e.to_string(),
            "7 byte(s) at offset 10 do not fit in the 16-byte destination GPU buffer"
        );
        assert!(check_range("b", 1, u64::MAX, 16).is_err());
    }
}
