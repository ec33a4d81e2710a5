//! The `gds` path: cuFile reads and writes between a file and GPU memory, several chunks in
//! flight, the buffer registered with cuFile where it accepts it.
//!
//! Errors come in two kinds ([`GdsError`]): set-up (registering the file with cuFile), after
//! which the planner may still take the staged path, saying why; and everything else, which
//! ends the copy (a missing file would be missing for the staged path too).

use crate::fileio::fs_name;
use crate::host::{dest_len, resolve};
use crate::{CopyOptions, CopyReport, Direction, FileRange, StorageError, StoragePath};
use gdx_base::bytesize::human_bytes;
use gdx_sys::cuda::DeviceBuffer;
use gdx_sys::cufile::{BufferRegistration, Driver, FileHandle, ParallelIo};
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A `gds` copy that failed.
#[derive(Debug)]
pub(crate) enum GdsError {
    /// cuFile could not take the file; nothing was moved.
    Setup(StorageError),
    /// Anything else.
    Io(StorageError),
}

impl From<StorageError> for GdsError {
    fn from(e: StorageError) -> Self {
        GdsError::Io(e)
    }
}

/// Open `path` with `O_DIRECT` (which true GDS needs), or without it where the file system
/// refuses it (compatibility mode still works then); the note says which.
fn open(path: &Path, write: bool) -> Result<(File, String), StorageError> {
    let mut opts = OpenOptions::new();
    if write {
        opts.write(true).create(true).mode(0o644);
    } else {
        opts.read(true);
    }
    let purpose = if write { "writing" } else { "reading" };
    // Opened without blocking and its type checked on the descriptor first (a FIFO swapped in
    // after the caller's checks would hang a blocking open); O_DIRECT is then asked of that
    // same file through /proc/self/fd, never of the path again.
    let (checked, _) = crate::fileio::open_checked(path, &opts, purpose, true)?;
    let mut direct = opts.clone();
    direct.create(false);
    direct.custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32);
    match crate::fileio::reopen(&checked, &direct) {
        Ok(f) => {
            let fs = fs_name(&f);
            Ok((f, format!("O_DIRECT descriptor on {fs}")))
        }
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) => {
            // cuFile wants a blocking descriptor: the same file, reopened without O_NONBLOCK.
            let mut plain = opts.clone();
            plain.create(false);
            let f =
                crate::fileio::reopen(&checked, &plain).map_err(|source| StorageError::Open {
                    path: path.to_path_buf(),
                    purpose,
                    source,
                })?;
            let fs = fs_name(&f);
            Ok((
                f,
                format!("{fs} refuses O_DIRECT ({e}), so cuFile gets a buffered descriptor"),
            ))
        }
        Err(source) => Err(StorageError::Open {
            path: path.to_path_buf(),
            purpose,
            source,
        }),
    }
}

fn size_of(file: &File, path: &Path) -> Result<u64, StorageError> {
    let err = |call, source| StorageError::File {
        call,
        path: path.to_path_buf(),
        source,
    };
    let meta = file.metadata().map_err(|e| err("fstat", e))?;
    if meta.file_type().is_block_device() {
        let mut f = file;
        return f
            .seek(SeekFrom::End(0))
            .map_err(|e| err("lseek(SEEK_END)", e));
    }
    if !meta.is_file() {
        return Err(StorageError::NotAFile {
            path: path.to_path_buf(),
            kind: if meta.is_dir() {
                "a directory"
            } else {
                "not a regular file"
            },
        });
    }
    Ok(meta.len())
}

fn register(driver: &Driver, file: File, path: &Path) -> Result<FileHandle, GdsError> {
    FileHandle::register(driver, file, path.display().to_string()).map_err(|e| {
        // cuFile identifies the file system through udev; machines without a udev database
        // (containers, microVMs) make it refuse every file, even in compatibility mode.
        let context = if e.to_string().contains("CU_FILE_HANDLE_NOT_REGISTERED") {
            "registering the file with cuFile (cuFile could not identify the file system: \
             check its log for \"udev property not found: ID_FS_USAGE\"; without udev data \
             for the block device cuFile refuses every file; --path file-staged needs no cuFile)"
        } else {
            "registering the file with cuFile"
        };
        GdsError::Setup(StorageError::cufile(context)(e))
    })
}

fn parallel(opts: &CopyOptions) -> ParallelIo {
    ParallelIo {
        chunk_bytes: opts.chunk_bytes,
        threads: opts.depth,
    }
}

/// The progress callback for cuFile's threads.
fn progress(opts: &CopyOptions, total: u64) -> impl Fn(usize) + Sync + '_ {
    let done = AtomicU64::new(0);
    move |n| {
        let d = done.fetch_add(n as u64, Ordering::AcqRel) + n as u64;
        if let Some(p) = &opts.progress {
            p(d, total);
        }
    }
}

/// The report of a cuFile copy of `len` bytes, given its time and how the GPU buffer was
/// registered; `note` says how the file was opened.
fn reporter<'a>(
    direction: Direction,
    len: u64,
    opts: &'a CopyOptions,
    note: &'a str,
) -> impl Fn(Duration, &str) -> CopyReport + 'a {
    move |elapsed, registered| CopyReport {
        direction,
        bytes: len,
        path: StoragePath::Gds,
        reason: format!(
            "{note}; {registered}; {} x {} cuFile calls in flight",
            opts.depth,
            human_bytes(opts.chunk_bytes as u64),
        ),
        elapsed,
        split: None,
    }
}

pub(crate) fn read(
    driver: &Driver,
    src: &FileRange,
    dst: &mut DeviceBuffer,
    dst_offset: usize,
    opts: &CopyOptions,
) -> Result<CopyReport, GdsError> {
    let (file, note) = open(&src.path, false)?;
    let size = size_of(&file, &src.path)?;
    let (offset, len) = resolve(src, size)?;
    crate::gpu::check_range("destination GPU buffer", dst_offset, len, dst.len())?;
    let handle = register(driver, file, &src.path)?;
    let report = reporter(Direction::FileToGpu, len, opts, &note);
    if len == 0 {
        return Ok(report(Duration::ZERO, "nothing to copy"));
    }
    let gpu = dst.context().ordinal();
    let progress = progress(opts, len);
    let run = |buf: &mut DeviceBuffer| {
        let start = Instant::now();
        let got = handle
            .read_parallel(
                buf,
                dst_offset,
                len as usize,
                offset,
                parallel(opts),
                &progress,
            )
            .map_err(StorageError::cufile(format!(
                "reading {} into GPU {gpu}",
                src.path.display()
            )));
        (got, start.elapsed())
    };
    // Registered where cuFile takes it; otherwise unregistered, and the report says why.
    let mut refused = String::new();
    let registered = match BufferRegistration::new(driver, &mut *dst) {
        Ok(mut reg) => Some(run(reg.buffer_mut())),
        Err(e) => {
            refused = format!("GPU buffer not registered ({e})");
            None
        }
    };
    let (got, elapsed, registered) = match registered {
        Some((got, t)) => (got, t, "GPU buffer registered with cuFile".to_string()),
        None => {
            let (got, t) = run(dst);
            (got, t, refused)
        }
    };
    let got = got? as u64;
    if got < len {
        return Err(GdsError::Io(StorageError::Shrunk {
            path: src.path.clone(),
            eof: offset + got,
            expected_end: offset + len,
            size_at_start: size,
        }));
    }
    Ok(report(elapsed, &registered))
}

pub(crate) fn write(
    driver: &Driver,
    src: &DeviceBuffer,
    src_offset: usize,
    len: u64,
    dst: &FileRange,
    opts: &CopyOptions,
) -> Result<CopyReport, GdsError> {
    dest_len(dst, len)?;
    let (file, note) = open(&dst.path, true)?;
    size_of(&file, &dst.path)?;
    if opts.truncate {
        file.set_len(dst.offset)
            .map_err(|source| StorageError::File {
                call: "ftruncate",
                path: dst.path.clone(),
                source,
            })?;
    }
    let handle = register(driver, file, &dst.path)?;
    let report = reporter(Direction::GpuToFile, len, opts, &note);
    if len == 0 {
        return Ok(report(Duration::ZERO, "nothing to copy"));
    }
    let gpu = src.context().ordinal();
    let progress = progress(opts, len);
    let run = |buf: &DeviceBuffer| -> Result<Duration, StorageError> {
        let start = Instant::now();
        handle
            .write_parallel(
                buf,
                src_offset,
                len as usize,
                dst.offset,
                parallel(opts),
                &progress,
            )
            .map_err(StorageError::cufile(format!(
                "writing GPU {gpu} memory to {}",
                dst.path.display()
            )))?;
        if opts.sync {
            handle
                .file()
                .sync_data()
                .map_err(|source| StorageError::File {
                    call: "fdatasync",
                    path: dst.path.clone(),
                    source,
                })?;
        }
        Ok(start.elapsed())
    };
    let (elapsed, registered) = match BufferRegistration::new(driver, src) {
        Ok(reg) => (
            run(reg.buffer())?,
            "GPU buffer registered with cuFile".to_string(),
        ),
        Err(e) => (run(src)?, format!("GPU buffer not registered ({e})")),
    };
    Ok(report(elapsed, &registered))
}
