//! File ↔ GPU memory: [`copy_file_to_gpu`] and [`copy_gpu_to_file`]. Each asks the planner,
//! runs cuFile (`gds`) or the staged pipeline through pinned bounce buffers, and reports the
//! path.
//!
//! Staged, file → GPU: I/O threads read chunks with `O_DIRECT` into pinned buffers; the calling
//! thread queues each chunk's host→GPU copy on one stream and hands the buffer back for the next
//! read, which starts as soon as that copy is done (the buffer's first access waits for it).
//! GPU → file is the mirror: the calling thread queues GPU→host copies into free buffers and the
//! I/O threads write each once its copy is done.

use crate::align::Geometry;
use crate::fileio::FileIo;
use crate::gds::{self, GdsError};
use crate::host::{bounce_len, describe, dest_len, resolve, wants_direct};
use crate::plan::{cufile_status, plan, CufileStatus, Endpoint};
use crate::{
    pipeline, CopyOptions, CopyReport, Direction, FileRange, PathChoice, StorageError, StoragePath,
};
use gdx_sys::cuda::{Context, DeviceBuffer, PinnedHostBuffer, Stream};
use std::time::{Duration, Instant};

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

/// The plan, and the open cuFile driver when the plan is `gds`.
fn plan_gpu(
    opts: &CopyOptions,
) -> Result<(StoragePath, String, Option<gdx_sys::cufile::Driver>), StorageError> {
    let (status, driver) = match opts.path {
        PathChoice::Auto | PathChoice::Gds => cufile_status(),
        _ => (CufileStatus::NotNeeded, None),
    };
    let p = plan(opts.path, Endpoint::Gpu, &status)?;
    Ok((p.path, p.reason, driver))
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
    let (path, mut reason, driver) = plan_gpu(opts)?;
    if let (StoragePath::Gds, Some(driver)) = (path, driver) {
        match gds::read(&driver, src, dst, dst_offset, opts) {
            Ok(mut r) => {
                r.reason = format!("{reason}; {}", r.reason);
                return Ok(r);
            }
            Err(GdsError::Setup(e)) if opts.path == PathChoice::Auto => {
                reason = format!("cuFile could not be used ({e}); the O_DIRECT staged pipeline");
            }
            Err(GdsError::Setup(e) | GdsError::Io(e)) => return Err(e),
        }
    }
    staged_read(src, dst, dst_offset, opts, path, reason)
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
    let (path, mut reason, driver) = plan_gpu(opts)?;
    if let (StoragePath::Gds, Some(driver)) = (path, driver) {
        match gds::write(&driver, src, src_offset, len, dst, opts) {
            Ok(mut r) => {
                r.reason = format!("{reason}; {}", r.reason);
                return Ok(r);
            }
            Err(GdsError::Setup(e)) if opts.path == PathChoice::Auto => {
                reason = format!("cuFile could not be used ({e}); the O_DIRECT staged pipeline");
            }
            Err(GdsError::Setup(e) | GdsError::Io(e)) => return Err(e),
        }
    }
    staged_write(src, src_offset, len, dst, opts, path, reason)
}

fn make_current(ctx: &Context) -> Result<(), StorageError> {
    ctx.make_current().map_err(StorageError::cuda(format!(
        "making GPU {}'s context current on an I/O thread",
        ctx.ordinal()
    )))
}

fn pinned_buffers(
    ctx: &Context,
    n: usize,
    len: usize,
) -> Result<Vec<PinnedHostBuffer>, StorageError> {
    (0..n)
        .map(|_| PinnedHostBuffer::new(ctx, len))
        .collect::<Result<_, _>>()
        .map_err(StorageError::cuda(format!(
            "allocating {n} pinned bounce buffers of {len} bytes"
        )))
}

fn report(
    direction: Direction,
    bytes: u64,
    io: &FileIo,
    plan_reason: &str,
    pipeline: String,
    elapsed: Duration,
) -> CopyReport {
    let (path, why) = io.outcome();
    CopyReport {
        direction,
        bytes,
        path,
        reason: format!("{plan_reason}; {why}; {pipeline}"),
        elapsed,
    }
}

fn staged_read(
    src: &FileRange,
    dst: &mut DeviceBuffer,
    dst_offset: usize,
    opts: &CopyOptions,
    path: StoragePath,
    reason: String,
) -> Result<CopyReport, StorageError> {
    let path = if path == StoragePath::Gds {
        StoragePath::FileStaged
    } else {
        path
    };
    let io = FileIo::open_read(&src.path, wants_direct(path))?;
    let (offset, len) = resolve(src, io.size_at_open())?;
    check_range("destination GPU buffer", dst_offset, len, dst.len())?;
    let gpu = dst.context().ordinal();
    if len == 0 {
        return Ok(report(
            Direction::FileToGpu,
            0,
            &io,
            &reason,
            "nothing to copy".into(),
            Duration::ZERO,
        ));
    }
    let ctx = dst.context().clone();
    let stream = Stream::new(&ctx).map_err(StorageError::cuda(format!(
        "creating a stream on GPU {gpu}"
    )))?;
    let geo = Geometry::new(offset, len, opts.chunk_bytes);
    let n = opts.depth.min(geo.count()).max(1);
    let blen = bounce_len(offset, len, opts.chunk_bytes);
    let bufs = pinned_buffers(&ctx, n, blen)?;
    let start = Instant::now();
    let mut progress = opts.counter(len);
    pipeline::read(
        &io,
        &geo,
        bufs,
        &|| make_current(&ctx),
        |piece, buf| {
            stream
                .copy_to_device_at(
                    dst,
                    dst_offset + piece.rel as usize,
                    buf,
                    piece.skip,
                    piece.len,
                )
                .map_err(StorageError::cuda(format!(
                    "copying {} bytes to GPU {gpu} at offset {}",
                    piece.len,
                    dst_offset as u64 + piece.rel
                )))
        },
        &mut progress,
    )?;
    stream.synchronize().map_err(StorageError::cuda(format!(
        "waiting for the copies to GPU {gpu}"
    )))?;
    let elapsed = start.elapsed();
    let pipeline = describe(n, blen, "pinned", "read");
    Ok(report(
        Direction::FileToGpu,
        len,
        &io,
        &reason,
        pipeline,
        elapsed,
    ))
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
    let path = if path == StoragePath::Gds {
        StoragePath::FileStaged
    } else {
        path
    };
    let io = FileIo::open_write(&dst.path, wants_direct(path))?;
    if opts.truncate {
        io.set_len(dst.offset)?;
    }
    let gpu = src.context().ordinal();
    if len == 0 {
        return Ok(report(
            Direction::GpuToFile,
            0,
            &io,
            &reason,
            "nothing to copy".into(),
            Duration::ZERO,
        ));
    }
    let ctx = src.context().clone();
    let stream = Stream::new(&ctx).map_err(StorageError::cuda(format!(
        "creating a stream on GPU {gpu}"
    )))?;
    let geo = Geometry::new(dst.offset, len, opts.chunk_bytes);
    let n = opts.depth.min(geo.count()).max(1);
    let blen = bounce_len(dst.offset, len, opts.chunk_bytes);
    let bufs = pinned_buffers(&ctx, n, blen)?;
    let start = Instant::now();
    let mut progress = opts.counter(len);
    pipeline::write(
        &io,
        &geo,
        bufs,
        &|| make_current(&ctx),
        |piece, buf| {
            stream
                .copy_to_host_at(
                    buf,
                    piece.skip,
                    src,
                    src_offset + piece.rel as usize,
                    piece.len,
                )
                .map_err(StorageError::cuda(format!(
                    "copying {} bytes from GPU {gpu} at offset {}",
                    piece.len,
                    src_offset as u64 + piece.rel
                )))
        },
        &mut progress,
    )?;
    if opts.sync {
        io.sync()?;
    }
    let elapsed = start.elapsed();
    let pipeline = describe(n, blen, "pinned", "write");
    Ok(report(
        Direction::GpuToFile,
        len,
        &io,
        &reason,
        pipeline,
        elapsed,
    ))
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
