//! The reader threads of [`super::gather_to_gpu`]: each takes the next chunk, reads it into one
//! of its pinned buffers (or page-locks it in place), and queues its copy on its own stream.
//!
//! A buffer is reused only once its last copy is done (its first access waits for it), so with
//! two buffers a reader fills one while the copy engine drains the other. Copies into one
//! destination are ordered after each other (the destination's last-use marker), which costs
//! nothing here: one copy engine carries host-to-GPU copies at the link's rate.

use super::{GatherOptions, GatherRange, Job, Source};
use crate::align::Piece;
use crate::StorageError;
use gdx_sys::cuda::{Context, DeviceBuffer, PinnedHostBuffer, RegisteredFile, Stream};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// What every reader shares.
struct Shared<'a> {
    ctx: &'a Context,
    sources: &'a [Source],
    /// Per range: (file, destination offset).
    meta: Vec<(usize, usize)>,
    dsts: Vec<Mutex<&'a mut DeviceBuffer>>,
    jobs: &'a [Job],
    next: AtomicUsize,
    stop: AtomicBool,
    /// Page-cache bytes page-locked now, and the most at once.
    locked: AtomicU64,
    peak: AtomicU64,
    /// Registrations (or buffers) per reader.
    depth: usize,
    /// Bytes queued so far, of `total`, for the progress callback.
    queued: AtomicU64,
    total: u64,
    progress: Option<crate::ProgressFn>,
}

impl Shared<'_> {
    fn queued(&self, n: usize) {
        let done = self.queued.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
        if let Some(p) = &self.progress {
            p(done, self.total);
        }
    }
}

/// Run `readers` threads over `jobs`; `bufs` (empty when no file needs bounce buffers) are
/// split evenly among them. Returns the most page-cache bytes page-locked at once.
pub(super) fn run(
    ctx: &Context,
    sources: &[Source],
    ranges: &mut [GatherRange],
    jobs: &[Job],
    bufs: &mut [PinnedHostBuffer],
    readers: usize,
    opts: &GatherOptions,
) -> Result<u64, StorageError> {
    let meta = ranges.iter().map(|r| (r.file, r.dst_offset)).collect();
    let total = ranges.iter().map(|r| r.len).sum();
    let dsts = ranges.iter_mut().map(|r| Mutex::new(&mut r.dst)).collect();
    let shared = Shared {
        ctx,
        sources,
        meta,
        dsts,
        jobs,
        next: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        locked: AtomicU64::new(0),
        peak: AtomicU64::new(0),
        depth: opts.buffers,
        queued: AtomicU64::new(0),
        total,
        progress: opts.progress.clone(),
    };
    let per = opts.buffers.max(1);
    let errors: Mutex<Vec<StorageError>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        let mut slices = bufs.chunks_mut(per);
        for _ in 0..readers {
            let mine: &mut [PinnedHostBuffer] = slices.next().unwrap_or_default();
            let (shared, errors) = (&shared, &errors);
            s.spawn(move || {
                if let Err(e) = reader(shared, mine) {
                    shared.stop.store(true, Ordering::Relaxed);
                    errors.lock().unwrap_or_else(|p| p.into_inner()).push(e);
                }
            });
        }
    });
    match errors
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .into_iter()
        .next()
    {
        Some(e) => Err(e),
        None => Ok(shared.peak.load(Ordering::Relaxed)),
    }
}

/// One reader thread: jobs until none is left or another reader failed.
fn reader(sh: &Shared<'_>, bufs: &mut [PinnedHostBuffer]) -> Result<(), StorageError> {
    let gpu = sh.ctx.ordinal();
    sh.ctx.make_current().map_err(StorageError::cuda(format!(
        "making GPU {gpu}'s context current"
    )))?;
    let stream = Stream::new(sh.ctx).map_err(StorageError::cuda(format!(
        "creating a stream on GPU {gpu}"
    )))?;
    let mut regs: VecDeque<RegisteredFile> = VecDeque::new();
    let mut slot = 0usize;
    let result = (|| {
        while !sh.stop.load(Ordering::Relaxed) {
            let Some(job) = sh.jobs.get(sh.next.fetch_add(1, Ordering::Relaxed)) else {
                break;
            };
            let (file, dst_offset) = sh.meta[job.range];
            let at = dst_offset + job.piece.rel as usize;
            let src = &sh.sources[file];
            if src.register {
                regs.push_back(register(sh, &stream, src, job, at)?);
                sh.queued(job.piece.len);
                while regs.len() > sh.depth {
                    release(sh, regs.pop_front());
                }
                continue;
            }
            let n = bufs.len();
            let buf = bufs.get_mut(slot % n.max(1)).ok_or_else(|| {
                StorageError::Internal("a reader has no bounce buffer".to_string())
            })?;
            slot += 1;
            read_chunk(src, &job.piece, buf)?;
            let mut dst = sh.dsts[job.range].lock().unwrap_or_else(|p| p.into_inner());
            stream
                .copy_to_device_at(&mut dst, at, &*buf, job.piece.skip, job.piece.len)
                .map_err(copy_err(gpu, &job.piece, at))?;
            drop(dst);
            sh.queued(job.piece.len);
        }
        stream.synchronize().map_err(StorageError::cuda(format!(
            "waiting for the copies to GPU {gpu}"
        )))
    })();
    // Each registration waits for its copy before it is undone.
    while let Some(r) = regs.pop_front() {
        release(sh, Some(r));
    }
    result
}

fn copy_err(
    gpu: u32,
    piece: &Piece,
    at: usize,
) -> impl FnOnce(gdx_sys::cuda::CudaError) -> StorageError {
    StorageError::cuda(format!(
        "copying {} bytes to GPU {gpu} at offset {at}",
        piece.len
    ))
}

/// Read `piece` into `buf` (once its last copy is done).
fn read_chunk(src: &Source, piece: &Piece, buf: &mut PinnedHostBuffer) -> Result<(), StorageError> {
    let bytes = buf.as_mut_slice().map_err(StorageError::cuda(
        "waiting for a GPU copy out of a bounce buffer",
    ))?;
    let span = bytes.len().min(piece.span);
    let got = src
        .io
        .read_full(&mut bytes[..span], piece.file_pos, piece.need())?;
    if got < piece.need() {
        return Err(StorageError::Shrunk {
            path: src.io.path().to_path_buf(),
            eof: piece.file_pos + got as u64,
            expected_end: piece.data_pos() + piece.len as u64,
            size_at_start: src.io.size_at_open(),
        });
    }
    Ok(())
}

/// Page-lock `job`'s bytes in place and queue their copy.
fn register(
    sh: &Shared<'_>,
    stream: &Stream,
    src: &Source,
    job: &Job,
    at: usize,
) -> Result<RegisteredFile, StorageError> {
    let p = &job.piece;
    let gpu = sh.ctx.ordinal();
    let reg = RegisteredFile::new(sh.ctx, src.io.buffered_file(), p.data_pos(), p.len, true)
        .map_err(StorageError::cuda(format!(
            "page-locking {} bytes of {} at offset {} in place",
            p.len,
            src.io.path().display(),
            p.data_pos()
        )))?;
    let now = sh
        .locked
        .fetch_add(reg.locked_len() as u64, Ordering::Relaxed)
        + reg.locked_len() as u64;
    sh.peak.fetch_max(now, Ordering::Relaxed);
    src.io.count_cached(p.len as u64);
    let mut dst = sh.dsts[job.range].lock().unwrap_or_else(|p| p.into_inner());
    stream
        .copy_to_device_at(&mut dst, at, &reg, 0, p.len)
        .map_err(copy_err(gpu, p, at))?;
    Ok(reg)
}

/// Undo a registration (its drop waits for its copy first).
fn release(sh: &Shared<'_>, reg: Option<RegisteredFile>) {
    if let Some(r) = reg {
        let n = r.locked_len() as u64;
        drop(r);
        sh.locked.fetch_sub(n, Ordering::Relaxed);
    }
}
