//! [`measure`]: one row of the file benchmark (the `file` cases of [`super`] run one per size):
//! file → GPU and GPU → file over every path that runs here, against the naive baseline
//! (`read()` of the whole file into a `Vec`, then one synchronous copy from pageable memory; and
//! the mirror for writes), plus the disk alone (`O_DIRECT` reads into host memory).
//!
//! Protocol: the file is written once from the seeded pattern ([`gdx_base::pattern`]) on the GPU;
//! every read sample starts with the page cache dropped for the file ([`gdx_storage::evict`]:
//! `fdatasync`, then `posix_fadvise(DONTNEED)`) or bypassed (`O_DIRECT`), each row says which;
//! every write sample truncates the file and includes `fdatasync`, so the bytes are on the disk.
//! The median of `samples` runs is reported with every sample. The first sample of each file →
//! GPU row is verified against the pattern's checksum, and the first of each GPU → file row by
//! reading the file back. One row's error never stops the others.
//!
//! Timing: the baselines are timed with gdx-base's wall clock ([`gdx_base::clock`], `read()`/`write()`
//! and the copy inside). A gdx-storage path's sample is the mover's own account of its I/O
//! ([`gdx_storage::CopyReport::elapsed`]: first I/O to last byte landed), which leaves out
//! opening the cuFile driver and registering buffers: timed from outside, each `gds` sample
//! would carry `cuFileDriverOpen` (hundreds of milliseconds) and measure set-up, not the disk.

use gdx_base::pattern::{fill_pattern, fill_pattern_at, find_mismatch_at, POISON};
use gdx_storage::{
    checksum_bytes, checksum_file, checksum_gpu, copy_file_to_gpu, copy_gpu_to_file,
    copy_host_to_file, cufile_status, evict, read_file, Checksum, CopyOptions, CopyReport,
    CufileStatus, Direction, FileRange, PathChoice, StorageError, StoragePath, DEFAULT_CHUNK_BYTES,
    DEFAULT_DEPTH,
};
use gdx_sys::cuda::{Context, Cuda, CudaError, DeviceBuffer, PinnedHostBuffer, Stream};
use std::path::PathBuf;

use gdx_base::clock::wall;

/// What to measure.
#[derive(Debug, Clone)]
pub struct Options {
    /// The scratch file: created or overwritten with `size` bytes (kept afterwards).
    pub file: PathBuf,
    /// CUDA ordinal of the GPU.
    pub gpu: u32,
    /// Bytes per transfer; 1 GiB by default.
    pub size: u64,
    /// Samples per row (at least 1); 3 by default.
    pub samples: usize,
    /// Chunk size for the pipelined paths.
    pub chunk_bytes: usize,
    /// Chunks in flight for the pipelined paths.
    pub depth: usize,
}

impl Options {
    /// Defaults for `file` on GPU `gpu`.
    pub fn new(file: impl Into<PathBuf>, gpu: u32) -> Options {
        Options {
            file: file.into(),
            gpu,
            size: 1 << 30,
            samples: 3,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            depth: DEFAULT_DEPTH,
        }
    }
}

/// How a row ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Measured (and verified).
    Passed,
    /// Not runnable here, and why.
    Waived(String),
    /// Failed, with the message.
    Error(String),
}

/// One measured row.
#[derive(Debug, Clone, PartialEq)]
pub struct FileRow {
    /// `<src>_to_<dst>_<path>`, e.g. `file_to_gpu_file_staged`.
    pub key: String,
    /// Which way.
    pub direction: Direction,
    /// `gds`, `file-staged`, `buffered`, `naive`, or `copy-engine`.
    pub path: String,
    /// How it was measured, including what happened to the page cache.
    pub method: String,
    /// Bytes per sample.
    pub bytes: u64,
    /// Every sample, GB/s (1e9 B/s).
    pub samples_gbps: Vec<f64>,
    /// The median sample, GB/s.
    pub median_gbps: Option<f64>,
    /// The copy's own account of its path (the last sample's), empty for the baselines.
    pub detail: String,
    /// Outcome.
    pub status: Outcome,
}

const SEED: u64 = 0x6764_785f_7374_6f72; // "gdx_stor"

/// GPU buffers and helpers shared by the rows.
struct Rig {
    /// Held for the buffers' lifetime (they were made in it).
    _ctx: Context,
    stream: Stream,
    /// The pattern, the source of every write.
    src: DeviceBuffer,
    /// The destination of every read.
    dst: DeviceBuffer,
    expected: Checksum,
}

impl Rig {
    fn new(driver: &Cuda, gpu: u32, size: usize) -> Result<Rig, StorageError> {
        let e = |what: &str| cuda(format!("{what} on GPU {gpu}"));
        let ctx = driver.context(gpu).map_err(e("retaining the context"))?;
        let stream = Stream::new(&ctx).map_err(e("creating a stream"))?;
        let mut src = DeviceBuffer::new(&ctx, size).map_err(e("allocating the source"))?;
        let dst = DeviceBuffer::new(&ctx, size).map_err(e("allocating the destination"))?;
        let piece = size.min(16 << 20);
        let mut host = PinnedHostBuffer::new(&ctx, piece).map_err(e("allocating pinned memory"))?;
        let mut done = 0usize;
        while done < size {
            let n = piece.min(size - done);
            let bytes = host.as_mut_slice().map_err(e("waiting for an upload"))?;
            fill_pattern_at(&mut bytes[..n], SEED, done);
            stream
                .copy_to_device_at(&mut src, done, &host, 0, n)
                .map_err(e("uploading the pattern"))?;
            done += n;
        }
        stream.synchronize().map_err(e("uploading the pattern"))?;
        // What every later copy is checked against: the source as it is on the GPU.
        let expected = checksum_gpu(&src, 0, size)?;
        Ok(Rig {
            _ctx: ctx,
            stream,
            src,
            dst,
            expected,
        })
    }

    fn poison(&mut self) -> Result<(), StorageError> {
        let n = self.dst.len();
        self.stream
            .memset(&mut self.dst, 0, n, POISON)
            .and_then(|()| self.stream.synchronize())
            .map_err(cuda("poisoning the destination"))
    }

    /// Checks that the destination's first `size` bytes are the pattern.
    fn verify_dst(&self, size: usize) -> Result<(), StorageError> {
        verify(
            checksum_gpu(&self.dst, 0, size)?,
            self.expected,
            "the GPU copy",
        )
    }
}

/// A CUDA error with what was being done.
fn cuda(context: impl Into<String>) -> impl FnOnce(CudaError) -> StorageError {
    let context = context.into();
    move |source| StorageError::Cuda { context, source }
}

const DROPPED: &str = "page cache dropped via posix_fadvise(DONTNEED) before each sample";
const BYPASSED: &str = "page cache bypassed via O_DIRECT";

fn cache_note(r: &CopyReport) -> &'static str {
    match r.path {
        StoragePath::FileStaged => BYPASSED,
        _ => DROPPED,
    }
}

/// One row of the file benchmark, measured on its own by [`measure`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `O_DIRECT` reads into host memory: the disk alone (no GPU needed).
    FileToHostStaged,
    /// File → GPU through cuFile.
    FileToGpuGds,
    /// File → GPU through the `O_DIRECT` pipeline.
    FileToGpuStaged,
    /// File → GPU: `read()` into a `Vec`, then one pageable copy (the baseline).
    FileToGpuNaive,
    /// GPU → file through cuFile.
    GpuToFileGds,
    /// GPU → file through the `O_DIRECT` pipeline.
    GpuToFileStaged,
    /// GPU → file: one pageable copy, then `write()` and `fdatasync` (the baseline).
    GpuToFileNaive,
}

impl Kind {
    /// Every row, in the order the cases list them.
    pub const ALL: [Kind; 7] = [
        Kind::FileToHostStaged,
        Kind::FileToGpuGds,
        Kind::FileToGpuStaged,
        Kind::FileToGpuNaive,
        Kind::GpuToFileGds,
        Kind::GpuToFileStaged,
        Kind::GpuToFileNaive,
    ];

    /// The row's storage key (`file_to_gpu_file_staged`; the cases add the GPU).
    pub fn key(self) -> &'static str {
        match self {
            Kind::FileToHostStaged => "file_to_host_file_staged",
            Kind::FileToGpuGds => "file_to_gpu_gds",
            Kind::FileToGpuStaged => "file_to_gpu_file_staged",
            Kind::FileToGpuNaive => "file_to_gpu_naive",
            Kind::GpuToFileGds => "gpu_to_file_gds",
            Kind::GpuToFileStaged => "gpu_to_file_file_staged",
            Kind::GpuToFileNaive => "gpu_to_file_naive",
        }
    }

    /// Which way it moves.
    pub fn direction(self) -> Direction {
        match self {
            Kind::FileToHostStaged => Direction::FileToHost,
            Kind::FileToGpuGds | Kind::FileToGpuStaged | Kind::FileToGpuNaive => {
                Direction::FileToGpu
            }
            _ => Direction::GpuToFile,
        }
    }

    /// `gds`, `file-staged` or `naive`.
    pub fn path(self) -> &'static str {
        match self {
            Kind::FileToGpuGds | Kind::GpuToFileGds => "gds",
            Kind::FileToGpuNaive | Kind::GpuToFileNaive => "naive",
            _ => "file-staged",
        }
    }

    /// Whether it needs a GPU (all but [`Kind::FileToHostStaged`]).
    pub fn needs_gpu(self) -> bool {
        self != Kind::FileToHostStaged
    }
}

fn new_row(opts: &Options, key: &str, direction: Direction, path: &str, method: &str) -> FileRow {
    FileRow {
        key: key.to_string(),
        direction,
        path: path.to_string(),
        method: method.to_string(),
        bytes: opts.size,
        samples_gbps: Vec::new(),
        median_gbps: None,
        detail: String::new(),
        status: Outcome::Passed,
    }
}

fn copy_opts(opts: &Options, path: PathChoice, sync: bool) -> CopyOptions {
    CopyOptions {
        path,
        chunk_bytes: opts.chunk_bytes,
        depth: opts.depth,
        truncate: true,
        sync,
        progress: None,
    }
}

/// Measure one row on its own (the module's protocol): the scratch file is
/// written first (from a host pattern for [`Kind::FileToHostStaged`], which needs no GPU;
/// from a pattern on GPU `opts.gpu` for the others), and the first sample is verified. A GPU
/// row fails here when CUDA or the GPU cannot be set up; a `gds` row is returned
/// [`Outcome::Waived`] with cuFile's reason when cuFile cannot run. `log` gets a line as
/// the scratch file is written.
pub fn measure(
    opts: &Options,
    kind: Kind,
    log: &mut dyn FnMut(&str),
) -> Result<FileRow, StorageError> {
    let size = usize::try_from(opts.size)
        .ok()
        .filter(|&s| s > 0)
        .ok_or_else(|| StorageError::InvalidOption(format!("bad size {}", opts.size)))?;
    let samples = opts.samples.max(1);
    let file = FileRange::whole(&opts.file);
    log(&format!(
        "writing the {size}-byte scratch file {}",
        opts.file.display()
    ));
    if !kind.needs_gpu() {
        let mut data = vec![0u8; size];
        fill_pattern(&mut data, SEED);
        let expected = checksum_bytes(&data);
        copy_host_to_file(&data, &file, &copy_opts(opts, PathChoice::FileStaged, true))?;
        drop(data);
        return Ok(file_to_host_row(opts, samples, expected.len));
    }
    let cuda = Cuda::load()?;
    let mut rig = Rig::new(&cuda, opts.gpu, size)?;
    copy_gpu_to_file(
        &rig.src,
        0,
        opts.size,
        &file,
        &copy_opts(opts, PathChoice::FileStaged, true),
    )?;
    let gds_waived = match kind.path() {
        "gds" => match cufile_status().0 {
            CufileStatus::Available(_) => None,
            CufileStatus::Unavailable(why) => Some(why),
            CufileStatus::NotNeeded => Some("cuFile was not looked at".to_string()),
        },
        _ => None,
    };
    Ok(gpu_row(
        &mut rig,
        opts,
        kind,
        samples,
        gds_waived.as_deref(),
    ))
}

/// The disk alone: `O_DIRECT` reads into host memory, the first sample checked against the
/// pattern, byte for byte, and for its length (`expected_len`).
fn file_to_host_row(opts: &Options, samples: usize, expected_len: u64) -> FileRow {
    let kind = Kind::FileToHostStaged;
    let file = FileRange::whole(&opts.file);
    let mut r = new_row(
        opts,
        kind.key(),
        kind.direction(),
        kind.path(),
        &format!(
            "O_DIRECT reads into aligned host memory, nothing else: the disk's rate; {BYPASSED}"
        ),
    );
    run_samples(&mut r, samples, |i| {
        evict(&opts.file)?;
        let mut bad = None;
        let mut len = 0u64;
        let rep = read_file(
            &file,
            &copy_opts(opts, PathChoice::FileStaged, false),
            |off, b| {
                if i == 0 && bad.is_none() {
                    bad = find_mismatch_at(b, SEED, off as usize);
                }
                len += b.len() as u64;
                Ok(())
            },
        )?;
        if i == 0 {
            if let Some(m) = bad {
                return Err(StorageError::Internal(format!(
                    "verification failed: the bytes read differ from the pattern: {m}"
                )));
            }
            if len != expected_len {
                return Err(StorageError::Internal(format!(
                    "verification failed: {len} bytes read, the file has {expected_len}"
                )));
            }
        }
        Ok((rep.gbps(), rep.reason.clone(), cache_note(&rep)))
    });
    r
}

/// One GPU row on `rig` (the scratch file already holds the pattern).
fn gpu_row(
    rig: &mut Rig,
    opts: &Options,
    kind: Kind,
    samples: usize,
    gds_waived: Option<&str>,
) -> FileRow {
    let size = opts.size as usize;
    let file = FileRange::whole(&opts.file);
    let mut r = new_row(opts, kind.key(), kind.direction(), kind.path(), "");
    if let (Some(why), "gds") = (gds_waived, kind.path()) {
        r.status = Outcome::Waived(why.to_string());
        return r;
    }
    let choice = match kind.path() {
        "gds" => PathChoice::Gds,
        _ => PathChoice::FileStaged,
    };
    match kind {
        Kind::FileToGpuGds | Kind::FileToGpuStaged => {
            run_samples(&mut r, samples, |i| {
                evict(&opts.file)?;
                if i == 0 {
                    rig.poison()?;
                }
                let rep =
                    copy_file_to_gpu(&file, &mut rig.dst, 0, &copy_opts(opts, choice, false))?;
                if i == 0 {
                    rig.verify_dst(size)?;
                }
                let note = if choice == PathChoice::Gds {
                    "cuFile on an O_DIRECT descriptor (compatibility mode reads it with POSIX I/O); \
                     page cache also dropped via posix_fadvise(DONTNEED) before each sample"
                } else {
                    cache_note(&rep)
                };
                Ok((rep.gbps(), rep.reason.clone(), note))
            });
        }
        Kind::FileToGpuNaive => {
            r.method = format!("read() of the whole file into a Vec, then one synchronous copy from pageable memory (cudaMemcpy); {DROPPED}");
            run_samples(&mut r, samples, |i| {
                evict(&opts.file)?;
                if i == 0 {
                    rig.poison()?;
                }
                let (done, t) = wall(|| -> Result<(), StorageError> {
                    let data = std::fs::read(&opts.file).map_err(|source| StorageError::Read {
                        path: opts.file.clone(),
                        offset: 0,
                        len: opts.size,
                        source,
                    })?;
                    rig.stream
                        .copy_from_pageable(&mut rig.dst, 0, &data[..size.min(data.len())])
                        .map_err(cuda("the naive copy to the GPU"))
                });
                done?;
                let t = t.as_secs_f64();
                if i == 0 {
                    rig.verify_dst(size)?;
                }
                Ok((Some(opts.size as f64 / t / 1e9), String::new(), DROPPED))
            });
        }
        Kind::GpuToFileGds | Kind::GpuToFileStaged => {
            run_samples(&mut r, samples, |i| {
                let rep = copy_gpu_to_file(
                    &rig.src,
                    0,
                    opts.size,
                    &file,
                    &copy_opts(opts, choice, true),
                )?;
                if i == 0 {
                    verify(checksum_file(&file)?, rig.expected, "the file")?;
                }
                let note = match rep.path {
                    StoragePath::Gds => {
                        "cuFile writes on an O_DIRECT descriptor; fdatasync included"
                    }
                    StoragePath::FileStaged => {
                        "O_DIRECT writes (page cache bypassed); fdatasync included"
                    }
                    StoragePath::Buffered => {
                        "buffered writes; fdatasync included, so the bytes are on the disk"
                    }
                };
                Ok((rep.gbps(), rep.reason.clone(), note))
            });
        }
        Kind::GpuToFileNaive => {
            r.method = "one synchronous copy into a pageable Vec, then write() of it and fdatasync (inside the timing, so the bytes are on the disk)".to_string();
            run_samples(&mut r, samples, |i| {
                let (done, t) = wall(|| -> Result<(), StorageError> {
                    let mut data = vec![0u8; size];
                    rig.stream
                        .copy_to_pageable(&mut data, &rig.src, 0)
                        .map_err(cuda("the naive copy from the GPU"))?;
                    let werr = |source| StorageError::Write {
                        path: opts.file.clone(),
                        offset: 0,
                        len: opts.size,
                        source,
                    };
                    std::fs::write(&opts.file, &data).map_err(werr)?;
                    std::fs::File::open(&opts.file)
                        .and_then(|f| f.sync_data())
                        .map_err(werr)
                });
                done?;
                let t = t.as_secs_f64();
                if i == 0 {
                    verify(checksum_file(&file)?, rig.expected, "the file")?;
                }
                Ok((Some(opts.size as f64 / t / 1e9), String::new(), ""))
            });
        }
        Kind::FileToHostStaged => {
            return file_to_host_row(opts, samples, rig.expected.len);
        }
    }
    r
}

fn verify(got: Checksum, expected: Checksum, what: &str) -> Result<(), StorageError> {
    if got == expected {
        Ok(())
    } else {
        Err(StorageError::Internal(format!(
            "verification failed: {what} has {got}, the pattern has {expected}"
        )))
    }
}

/// Run `samples` samples of `one` (given the sample number) into `row`; the first error ends
/// the row with [`Outcome::Error`].
fn run_samples(
    row: &mut FileRow,
    samples: usize,
    mut one: impl FnMut(usize) -> Result<(Option<f64>, String, &'static str), StorageError>,
) {
    for i in 0..samples {
        match one(i) {
            Ok((gbps, detail, note)) => {
                row.samples_gbps.push(gbps.unwrap_or(f64::NAN));
                if !detail.is_empty() {
                    row.detail = detail;
                }
                if row.method.is_empty() {
                    row.method = note.to_string();
                }
            }
            Err(e) => {
                row.status = Outcome::Error(e.to_string());
                break;
            }
        }
    }
    row.median_gbps = gdx_base::stats::median(&row.samples_gbps);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_gpu_a_gpu_row_is_an_error_not_a_panic() {
        if !gdx_base::testenv::precondition("no CUDA driver", Cuda::load().is_err()) {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let opts = Options::new(dir.path().join("b"), 0);
        let kind = Kind::ALL.into_iter().find(|k| k.needs_gpu()).unwrap();
        let e = measure(&opts, kind, &mut |_| {}).unwrap_err();
        assert!(e.to_string().contains("libcuda.so.1 unavailable"), "{e}");
    }

    #[test]
    fn the_disk_alone_reads_back_the_pattern() {
        let dir = tempfile::tempdir().unwrap();
        let opts = Options {
            size: 256 << 10,
            samples: 2,
            ..Options::new(dir.path().join("b"), 0)
        };
        let r = measure(&opts, Kind::FileToHostStaged, &mut |_| {}).unwrap();
        assert_eq!(r.status, Outcome::Passed, "{r:?}");
        assert_eq!(r.samples_gbps.len(), 2);
        assert_eq!(r.bytes, 256 << 10);
    }
}
