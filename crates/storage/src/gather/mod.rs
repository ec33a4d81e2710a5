//! Many file ranges into GPU memory in one call ([`gather_to_gpu`]): the checkpoint loader's
//! engine (every tensor or data section of every shard, loaded by one set of readers).
//!
//! Each file is planned once, like every gdx read (`crate::residency`): in the page cache, it
//! is read through it; on the disk, with `O_DIRECT`; partly cached, page by page. The ranges are
//! cut into chunks, and `readers` threads take them in file order. Each reader has its own
//! stream and either
//! - [`WarmMethod::Readers`]: `buffers` pinned bounce buffers it fills with `pread` (through the
//!   page cache or `O_DIRECT`) and copies from while it fills the next, or
//! - [`WarmMethod::Register`] (files all in the page cache only): maps each chunk of the file
//!   read-only and page-locks it ([`RegisteredFile`]), so the copy engine reads the page
//!   cache's pages with no CPU copy; `buffers` registrations stay alive per reader, the oldest
//!   released (after its copy) when a new one is made. Files not all cached use pinned buffers.
//!
//! Invariants:
//! - Pinned host memory is bounded: `readers x buffers x chunk` bytes, allocated only when a
//!   file is read through bounce buffers, reported in [`GatherReport::pinned_bytes`], and kept
//!   for the next call in a small cache (`pinned`, at most [`PINNED_KEEP_BYTES`]).
//! - No GPU memory beyond the destinations: copies go straight into them.
//! - Destinations are disjoint: each range owns its borrowed [`DeviceBuffer`].
//! - The first error stops every reader after the chunk it holds; it is returned.

mod pinned;
mod worker;

pub use pinned::{release_pinned_cache, PINNED_KEEP_BYTES};

use crate::fileio::FileIo;
use crate::host::wants_direct;
use crate::plan::{CufileStatus, MemoryEnd};
use crate::residency::{plan_read, ReadPlan};
use crate::{FileRange, IoSplit, PathChoice, StorageError, StoragePath, ALIGN};
use gdx_base::bytesize::human_bytes;
use gdx_sys::cuda::DeviceBuffer;
use serde::Serialize;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How page-cache-resident files reach the GPU (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WarmMethod {
    /// Reader threads `pread` into pinned bounce buffers; each copies from its own stream.
    Readers,
    /// Chunks of the file mapped and page-locked in place; the copy engine reads them.
    Register,
}

impl WarmMethod {
    /// `readers` or `register`.
    pub fn key(self) -> &'static str {
        match self {
            WarmMethod::Readers => "readers",
            WarmMethod::Register => "register",
        }
    }

    /// The method named `s`, or an error listing the names.
    pub fn parse(s: &str) -> Result<WarmMethod, StorageError> {
        match s {
            "readers" | "threads" => Ok(WarmMethod::Readers),
            "register" => Ok(WarmMethod::Register),
            other => Err(StorageError::InvalidOption(format!(
                "warm method {other:?}: expected \"readers\" or \"register\""
            ))),
        }
    }
}

/// Default reader threads: one per CPU, 4 to 16. A warm read is a CPU copy out of the page
/// cache at a few GB/s per thread; on the 16-core H100 host 16 readers loaded 28.3/29.7 GB/s
/// where 12 gave 24.2/27.9 and 8 gave 21.0/24.3 (same run, the `ckpt` stage of `scripts/device/run.sh`).
pub fn default_readers() -> usize {
    let cpus = std::thread::available_parallelism().map_or(4, |n| n.get());
    cpus.clamp(4, 16)
}

/// How to gather.
#[derive(Clone)]
pub struct GatherOptions {
    /// `Auto` (by residency), `Buffered` or `FileStaged`; cuFile is not used here.
    pub path: PathChoice,
    /// How cached files reach the GPU.
    pub warm: WarmMethod,
    /// Reader threads (1 to 64).
    pub readers: usize,
    /// Bytes per chunk: per read, per bounce buffer, per registration. A multiple of [`ALIGN`].
    pub chunk_bytes: usize,
    /// Bounce buffers (or live registrations) per reader (1 to 8).
    pub buffers: usize,
    /// Called with (bytes queued to the GPU, bytes in all) after each chunk, from a reader.
    pub progress: Option<crate::ProgressFn>,
}

impl Default for GatherOptions {
    fn default() -> Self {
        GatherOptions {
            path: PathChoice::Auto,
            warm: WarmMethod::Readers,
            readers: default_readers(),
            chunk_bytes: 16 << 20,
            buffers: 2,
            progress: None,
        }
    }
}

impl std::fmt::Debug for GatherOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatherOptions")
            .field("path", &self.path)
            .field("warm", &self.warm)
            .field("readers", &self.readers)
            .field("chunk_bytes", &self.chunk_bytes)
            .field("buffers", &self.buffers)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

impl GatherOptions {
    /// Refuse options out of range, before any I/O.
    pub fn validate(&self) -> Result<(), StorageError> {
        let bad = |m: String| Err(StorageError::InvalidOption(m));
        if self.chunk_bytes == 0 || !(self.chunk_bytes as u64).is_multiple_of(ALIGN) {
            return bad(format!(
                "the chunk size must be a non-zero multiple of {ALIGN} bytes, not {}",
                self.chunk_bytes
            ));
        }
        if !(1..=64).contains(&self.readers) {
            return bad(format!("readers must be 1 to 64, not {}", self.readers));
        }
        if !(1..=8).contains(&self.buffers) {
            return bad(format!(
                "buffers per reader must be 1 to 8, not {}",
                self.buffers
            ));
        }
        if self.path == PathChoice::Gds {
            return bad(
                "the gather loader reads with O_DIRECT or through the page cache, not \
                        cuFile: ask for \"auto\", \"buffered\" or \"file-staged\""
                    .to_string(),
            );
        }
        Ok(())
    }
}

/// One range to copy: `len` bytes of file `file` (an index into the file list) at `offset`,
/// into `dst` at `dst_offset`.
#[derive(Debug)]
pub struct GatherRange {
    /// Index into the file list.
    pub file: usize,
    /// File offset of the first byte.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
    /// The destination (usually borrowed from the caller's tensor).
    pub dst: DeviceBuffer,
    /// Where in `dst` the first byte goes.
    pub dst_offset: usize,
}

/// What happened to one file.
#[derive(Debug, Clone, Serialize)]
pub struct FileOutcome {
    /// The file.
    pub path: PathBuf,
    /// Bytes copied from it.
    pub bytes: u64,
    /// How its bytes were read: `buffered` (page cache), `file-staged` (`O_DIRECT`, perhaps
    /// split with the page cache).
    pub read: StoragePath,
    /// Whether its cached bytes were page-locked in place ([`WarmMethod::Register`]).
    pub registered: bool,
    /// Why: the plan and how the reads went.
    pub reason: String,
    /// Bytes through the page cache and with `O_DIRECT`.
    pub split: IoSplit,
}

/// What a gather did.
#[derive(Debug, Clone, Serialize)]
pub struct GatherReport {
    /// Bytes copied.
    pub bytes: u64,
    /// Reader threads, chunk bytes, buffers per reader.
    pub readers: usize,
    /// Bytes per chunk.
    pub chunk_bytes: usize,
    /// Bounce buffers (or live registrations) per reader.
    pub buffers: usize,
    /// The warm method asked for.
    pub warm: WarmMethod,
    /// Pinned bounce-buffer bytes used (0 when none was needed).
    pub pinned_bytes: u64,
    /// Of those, bytes reused from an earlier call's cache (no allocation).
    pub pinned_reused_bytes: u64,
    /// Most page-cache bytes page-locked at once ([`WarmMethod::Register`]).
    pub registered_peak_bytes: u64,
    /// Planning, opening and buffer allocation.
    #[serde(serialize_with = "seconds")]
    pub setup: Duration,
    /// From the first read to the last byte landing.
    #[serde(serialize_with = "seconds")]
    pub elapsed: Duration,
    /// Per file.
    pub files: Vec<FileOutcome>,
    /// One line: what ran and why.
    pub summary: String,
}

fn seconds<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl GatherReport {
    /// Bytes over `elapsed`, in GB/s; `None` for nothing copied.
    pub fn gbps(&self) -> Option<f64> {
        let s = self.elapsed.as_secs_f64();
        (self.bytes > 0 && s > 0.0).then(|| self.bytes as f64 / s / 1e9)
    }
}

/// One chunk of one range: what a reader takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Job {
    /// Index into the ranges.
    pub(crate) range: usize,
    /// The chunk (positions are the file's).
    pub(crate) piece: crate::align::Piece,
}

/// The chunks of every range, in range order (callers sort ranges by file and offset).
pub(crate) fn jobs(ranges: &[(u64, u64)], chunk: usize) -> Vec<Job> {
    let mut out = Vec::new();
    for (i, &(offset, len)) in ranges.iter().enumerate() {
        let geo = crate::align::Geometry::new(offset, len, chunk);
        out.extend((0..geo.count()).map(|k| Job {
            range: i,
            piece: geo.piece(k),
        }));
    }
    out
}

/// An opened, planned file.
pub(crate) struct Source {
    pub(crate) io: FileIo,
    pub(crate) plan: ReadPlan,
    /// Cached bytes are page-locked in place.
    pub(crate) register: bool,
}

/// Plan and open every file over the span its ranges cover.
fn open_sources(
    files: &[PathBuf],
    ranges: &[GatherRange],
    opts: &GatherOptions,
) -> Result<Vec<Source>, StorageError> {
    let mut out = Vec::with_capacity(files.len());
    for (i, path) in files.iter().enumerate() {
        let mine = ranges.iter().filter(|r| r.file == i && r.len > 0);
        let (lo, hi) = mine.fold((u64::MAX, 0u64), |(lo, hi), r| {
            (lo.min(r.offset), hi.max(r.offset + r.len))
        });
        let span = if lo == u64::MAX {
            FileRange::new(path, 0, 0)
        } else {
            FileRange::new(path, lo, hi - lo)
        };
        let mut plan = plan_read(&span, opts.path, MemoryEnd::Host, || {
            CufileStatus::NotNeeded
        })?;
        // The planner speaks of host memory; here the bytes go on to a GPU.
        plan.reason = plan.reason.replace(
            "host memory: the O_DIRECT staged pipeline without the GPU step",
            "O_DIRECT into pinned buffers (cuFile is not used: without nvidia-fs its \
             compatibility mode stages through host memory the same way)",
        );
        let mut io = FileIo::open_read(path, wants_direct(plan.path))?;
        io.set_residency(plan.residency.clone());
        let register = opts.warm == WarmMethod::Register && plan.path == StoragePath::Buffered;
        out.push(Source { io, plan, register });
    }
    Ok(out)
}

/// Copy every range of `files` into its destination (see the module docs). The destinations
/// must be on one GPU; ranges must lie inside their files and destinations (checked first).
pub fn gather_to_gpu(
    files: &[PathBuf],
    mut ranges: Vec<GatherRange>,
    opts: &GatherOptions,
) -> Result<GatherReport, StorageError> {
    opts.validate()?;
    let t0 = Instant::now();
    check_ranges(files, &ranges)?;
    ranges.sort_by_key(|r| (r.file, r.offset));
    let sources = open_sources(files, &ranges, opts)?;
    for r in &ranges {
        let size = sources[r.file].io.size_at_open();
        if r.offset.checked_add(r.len).is_none_or(|end| end > size) {
            return Err(StorageError::RangePastEnd {
                path: files[r.file].clone(),
                offset: r.offset,
                len: r.len,
                size,
            });
        }
    }
    let spans: Vec<(u64, u64)> = ranges.iter().map(|r| (r.offset, r.len)).collect();
    let jobs = jobs(&spans, opts.chunk_bytes);
    let bytes: u64 = ranges.iter().map(|r| r.len).sum();
    let readers = opts.readers.min(jobs.len()).max(1);
    let need_bounce = ranges
        .iter()
        .any(|r| r.len > 0 && !sources[r.file].register);
    let ctx = match ranges.first() {
        Some(r) => r.dst.context().clone(),
        None => return Ok(empty_report(files, &sources, opts, t0.elapsed())),
    };
    let mut pool = if need_bounce {
        pinned::take(&ctx, readers * opts.buffers, opts.chunk_bytes)?
    } else {
        pinned::Taken::default()
    };
    let setup = t0.elapsed();
    let start = Instant::now();
    let run = worker::run(
        &ctx,
        &sources,
        &mut ranges,
        &jobs,
        &mut pool.bufs,
        readers,
        opts,
    );
    let elapsed = start.elapsed();
    let (pinned_bytes, reused) = (pool.bytes(), pool.reused_bytes);
    pinned::give_back(pool.bufs);
    let peak = run?;
    let outcomes = outcomes(files, &sources, &ranges);
    let summary = summary(&outcomes, opts, readers, pinned_bytes, peak);
    Ok(GatherReport {
        bytes,
        readers,
        chunk_bytes: opts.chunk_bytes,
        buffers: opts.buffers,
        warm: opts.warm,
        pinned_bytes,
        pinned_reused_bytes: reused,
        registered_peak_bytes: peak,
        setup,
        elapsed,
        files: outcomes,
        summary,
    })
}

/// Files exist in the list, destinations hold their ranges, and all are on one GPU.
fn check_ranges(files: &[PathBuf], ranges: &[GatherRange]) -> Result<(), StorageError> {
    let first = ranges.first().map(|r| r.dst.context().clone());
    for r in ranges {
        if r.file >= files.len() {
            return Err(StorageError::InvalidOption(format!(
                "a range names file {} of {}",
                r.file,
                files.len()
            )));
        }
        crate::gpu::check_range("destination GPU buffer", r.dst_offset, r.len, r.dst.len())?;
        if let Some(c) = &first {
            if !c.same(r.dst.context()) {
                return Err(StorageError::InvalidOption(
                    "every destination must be on the same GPU".to_string(),
                ));
            }
        }
    }
    Ok(())
}

fn outcomes(files: &[PathBuf], sources: &[Source], ranges: &[GatherRange]) -> Vec<FileOutcome> {
    files
        .iter()
        .zip(sources)
        .enumerate()
        .map(|(i, (path, s))| {
            let (read, why) = s.io.outcome();
            let split = s.io.split();
            let how = if s.register {
                "cached pages page-locked in place (cuMemHostRegister, read-only) and copied by \
                 the copy engine"
                    .to_string()
            } else if s.io.is_split() {
                format!("{why}; {split}")
            } else {
                why
            };
            FileOutcome {
                path: path.clone(),
                bytes: ranges.iter().filter(|r| r.file == i).map(|r| r.len).sum(),
                read,
                registered: s.register,
                reason: format!("{}; {how}", s.plan.reason),
                split,
            }
        })
        .collect()
}

fn empty_report(
    files: &[PathBuf],
    sources: &[Source],
    opts: &GatherOptions,
    setup: Duration,
) -> GatherReport {
    GatherReport {
        bytes: 0,
        readers: 0,
        chunk_bytes: opts.chunk_bytes,
        buffers: opts.buffers,
        warm: opts.warm,
        pinned_bytes: 0,
        pinned_reused_bytes: 0,
        registered_peak_bytes: 0,
        setup,
        elapsed: Duration::ZERO,
        files: outcomes(files, sources, &[]),
        summary: "nothing to copy".to_string(),
    }
}

/// `8 readers x 2 x 16 MiB pinned buffers (256 MiB): 2 files through the page cache, ...`.
fn summary(
    files: &[FileOutcome],
    opts: &GatherOptions,
    readers: usize,
    pinned: u64,
    peak: u64,
) -> String {
    let count = |p: &dyn Fn(&FileOutcome) -> bool| files.iter().filter(|f| p(f)).count();
    let reg = count(&|f| f.registered);
    let cached = count(&|f| !f.registered && f.read == StoragePath::Buffered);
    let direct = count(&|f| f.read == StoragePath::FileStaged);
    let mut parts = Vec::new();
    if reg > 0 {
        parts.push(format!(
            "{reg} file(s) page-locked in place, {} at most at once",
            human_bytes(peak)
        ));
    }
    if cached > 0 {
        parts.push(format!("{cached} file(s) through the page cache"));
    }
    if direct > 0 {
        parts.push(format!(
            "{direct} file(s) with O_DIRECT (not left in the page cache)"
        ));
    }
    format!(
        "{readers} reader(s), {} chunks, {} x {} per reader, {} pinned; {}",
        human_bytes(opts.chunk_bytes as u64),
        opts.buffers,
        if reg > 0 && cached + direct == 0 {
            "registrations"
        } else {
            "buffers"
        },
        human_bytes(pinned),
        parts.join(", ")
    )
}

#[cfg(test)]
mod tests;
