//! [`bench_file_row`]: one row of the file benchmark (`gdx bench --path file` runs them as
//! gdx-bench cases): file → GPU and GPU → file over every path that runs here, against the naive
//! baseline (`read()` of the whole file into a `Vec`, then one synchronous copy from pageable
//! memory; and the mirror for writes), plus the two ceilings measured: the disk alone
//! (`O_DIRECT` reads into host memory) and PCIe (pinned host → GPU copy engine).
//!
//! Protocol: the file is written once from a seeded pattern on the GPU; every read sample starts
//! with the page cache dropped for the file (`fdatasync`, then `posix_fadvise(DONTNEED)`) or
//! bypassed (`O_DIRECT`), each row says which; every write sample truncates the file and
//! includes `fdatasync`, so the bytes are on the disk. The median of `samples` runs is reported
//! with every sample. The first sample of each file → GPU row is verified against the pattern's
//! checksum, and the first of each GPU → file row by reading the file back. One row's error
//! never stops the others.

use crate::fileio::FileIo;
use crate::plan::{cufile_status, CufileStatus};
use crate::{
    checksum_file, checksum_gpu, copy_file_to_gpu, copy_gpu_to_file, read_file, Checksum,
    CopyOptions, CopyReport, Direction, FileRange, PathChoice, StorageError, StoragePath,
    DEFAULT_CHUNK_BYTES, DEFAULT_DEPTH,
};
use gdx_sys::cuda::probe;
use gdx_sys::cuda::{Context, Cuda, DeviceBuffer, PinnedHostBuffer, Stream};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchOptions {
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

impl BenchOptions {
    /// Defaults for `file` on GPU `gpu`.
    pub fn new(file: impl Into<PathBuf>, gpu: u32) -> BenchOptions {
        BenchOptions {
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
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "status", content = "reason", rename_all = "snake_case")]
pub enum BenchStatus {
    /// Measured (and verified).
    Passed,
    /// Not runnable here, and why.
    Waived(String),
    /// Failed, with the message.
    Error(String),
}

/// One measured row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchRow {
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
    #[serde(flatten)]
    pub status: BenchStatus,
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
    fn new(cuda: &Cuda, gpu: u32, size: usize) -> Result<Rig, StorageError> {
        let e = |what: &str| StorageError::cuda(format!("{what} on GPU {gpu}"));
        let ctx = cuda.context(gpu).map_err(e("retaining the context"))?;
        let stream = Stream::new(&ctx).map_err(e("creating a stream"))?;
        let mut src = DeviceBuffer::new(&ctx, size).map_err(e("allocating the source"))?;
        let dst = DeviceBuffer::new(&ctx, size).map_err(e("allocating the destination"))?;
        let piece = size.min(16 << 20);
        let mut host = PinnedHostBuffer::new(&ctx, piece).map_err(e("allocating pinned memory"))?;
        let mut hasher = crc32fast::Hasher::new();
        let mut done = 0usize;
        while done < size {
            let n = piece.min(size - done);
            let bytes = host.as_mut_slice().map_err(e("waiting for an upload"))?;
            probe::fill_pattern(&mut bytes[..n], SEED ^ done as u64);
            hasher.update(&bytes[..n]);
            stream
                .copy_to_device_at(&mut src, done, &host, 0, n)
                .map_err(e("uploading the pattern"))?;
            done += n;
        }
        stream.synchronize().map_err(e("uploading the pattern"))?;
        Ok(Rig {
            _ctx: ctx,
            stream,
            src,
            dst,
            expected: Checksum {
                crc32: hasher.finalize(),
                len: size as u64,
            },
        })
    }

    fn poison(&mut self) -> Result<(), StorageError> {
        let n = self.dst.len();
        self.stream
            .memset(&mut self.dst, 0, n, probe::POISON)
            .and_then(|()| self.stream.synchronize())
            .map_err(StorageError::cuda("poisoning the destination"))
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

/// Flush and drop the file's pages from the page cache.
fn drop_cache(file: &std::path::Path) -> Result<(), StorageError> {
    let io = FileIo::open_read(file, false)?;
    io.sync()?;
    io.drop_cache()
}

const DROPPED: &str = "page cache dropped via posix_fadvise(DONTNEED) before each sample";
const BYPASSED: &str = "page cache bypassed via O_DIRECT";

fn cache_note(r: &CopyReport) -> &'static str {
    match r.path {
        StoragePath::FileStaged => BYPASSED,
        _ => DROPPED,
    }
}

/// One row of the file benchmark, measured on its own by [`bench_file_row`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BenchKind {
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

impl BenchKind {
    /// Every row, in [`bench_file`]'s order.
    pub const ALL: [BenchKind; 7] = [
        BenchKind::FileToHostStaged,
        BenchKind::FileToGpuGds,
        BenchKind::FileToGpuStaged,
        BenchKind::FileToGpuNaive,
        BenchKind::GpuToFileGds,
        BenchKind::GpuToFileStaged,
        BenchKind::GpuToFileNaive,
    ];

    /// The row's key in [`BenchReport`] (`file_to_gpu_file_staged`).
    pub fn key(self) -> &'static str {
        match self {
            BenchKind::FileToHostStaged => "file_to_host_file_staged",
            BenchKind::FileToGpuGds => "file_to_gpu_gds",
            BenchKind::FileToGpuStaged => "file_to_gpu_file_staged",
            BenchKind::FileToGpuNaive => "file_to_gpu_naive",
            BenchKind::GpuToFileGds => "gpu_to_file_gds",
            BenchKind::GpuToFileStaged => "gpu_to_file_file_staged",
            BenchKind::GpuToFileNaive => "gpu_to_file_naive",
        }
    }

    /// Which way it moves.
    pub fn direction(self) -> Direction {
        match self {
            BenchKind::FileToHostStaged => Direction::FileToHost,
            BenchKind::FileToGpuGds | BenchKind::FileToGpuStaged | BenchKind::FileToGpuNaive => {
                Direction::FileToGpu
            }
            _ => Direction::GpuToFile,
        }
    }

    /// `gds`, `file-staged` or `naive`.
    pub fn path(self) -> &'static str {
        match self {
            BenchKind::FileToGpuGds | BenchKind::GpuToFileGds => "gds",
            BenchKind::FileToGpuNaive | BenchKind::GpuToFileNaive => "naive",
            _ => "file-staged",
        }
    }

    /// Whether it needs a GPU (all but [`BenchKind::FileToHostStaged`]).
    pub fn needs_gpu(self) -> bool {
        self != BenchKind::FileToHostStaged
    }
}

fn new_row(
    opts: &BenchOptions,
    key: &str,
    direction: Direction,
    path: &str,
    method: &str,
) -> BenchRow {
    BenchRow {
        key: key.to_string(),
        direction,
        path: path.to_string(),
        method: method.to_string(),
        bytes: opts.size,
        samples_gbps: Vec::new(),
        median_gbps: None,
        detail: String::new(),
        status: BenchStatus::Passed,
    }
}

fn copy_opts(opts: &BenchOptions, path: PathChoice, sync: bool) -> CopyOptions {
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
/// written first (from a host pattern for [`BenchKind::FileToHostStaged`], which needs no GPU;
/// from a pattern on GPU `opts.gpu` for the others), and the first sample is verified. A GPU
/// row fails here when CUDA or the GPU cannot be set up; a `gds` row is returned
/// [`BenchStatus::Waived`] with cuFile's reason when cuFile cannot run. `log` gets a line as
/// the scratch file is written.
pub fn bench_file_row(
    opts: &BenchOptions,
    kind: BenchKind,
    log: &mut dyn FnMut(&str),
) -> Result<BenchRow, StorageError> {
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
        probe::fill_pattern(&mut data, SEED);
        let expected = crate::checksum_bytes(&data);
        crate::copy_host_to_file(&data, &file, &copy_opts(opts, PathChoice::FileStaged, true))?;
        drop(data);
        return Ok(file_to_host_row(opts, samples, expected));
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

/// The disk alone: `O_DIRECT` reads into host memory, the first sample checked against
/// `expected` (the file's checksum).
fn file_to_host_row(opts: &BenchOptions, samples: usize, expected: Checksum) -> BenchRow {
    let kind = BenchKind::FileToHostStaged;
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
        drop_cache(&opts.file)?;
        let mut hasher = (i == 0).then(crc32fast::Hasher::new);
        let mut len = 0u64;
        let rep = read_file(
            &file,
            &copy_opts(opts, PathChoice::FileStaged, false),
            |_, b| {
                if let Some(h) = hasher.as_mut() {
                    h.update(b);
                }
                len += b.len() as u64;
                Ok(())
            },
        )?;
        if let Some(h) = hasher {
            let got = Checksum {
                crc32: h.finalize(),
                len,
            };
            verify(got, expected, "the bytes read")?;
        }
        Ok((rep.gbps(), rep.reason.clone(), cache_note(&rep)))
    });
    r
}

/// One GPU row of [`bench_file`] on `rig` (the scratch file already holds the pattern).
fn gpu_row(
    rig: &mut Rig,
    opts: &BenchOptions,
    kind: BenchKind,
    samples: usize,
    gds_waived: Option<&str>,
) -> BenchRow {
    let size = opts.size as usize;
    let file = FileRange::whole(&opts.file);
    let mut r = new_row(opts, kind.key(), kind.direction(), kind.path(), "");
    if let (Some(why), "gds") = (gds_waived, kind.path()) {
        r.status = BenchStatus::Waived(why.to_string());
        return r;
    }
    let choice = match kind.path() {
        "gds" => PathChoice::Gds,
        _ => PathChoice::FileStaged,
    };
    match kind {
        BenchKind::FileToGpuGds | BenchKind::FileToGpuStaged => {
            run_samples(&mut r, samples, |i| {
                drop_cache(&opts.file)?;
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
        BenchKind::FileToGpuNaive => {
            r.method = format!("read() of the whole file into a Vec, then one synchronous copy from pageable memory (cudaMemcpy); {DROPPED}");
            run_samples(&mut r, samples, |i| {
                drop_cache(&opts.file)?;
                if i == 0 {
                    rig.poison()?;
                }
                let start = Instant::now();
                let data = std::fs::read(&opts.file).map_err(|source| StorageError::Read {
                    path: opts.file.clone(),
                    offset: 0,
                    len: opts.size,
                    source,
                })?;
                rig.stream
                    .copy_from_pageable(&mut rig.dst, 0, &data[..size.min(data.len())])
                    .map_err(StorageError::cuda("the naive copy to the GPU"))?;
                let t = start.elapsed().as_secs_f64();
                if i == 0 {
                    rig.verify_dst(size)?;
                }
                Ok((Some(opts.size as f64 / t / 1e9), String::new(), DROPPED))
            });
        }
        BenchKind::GpuToFileGds | BenchKind::GpuToFileStaged => {
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
        BenchKind::GpuToFileNaive => {
            r.method = "one synchronous copy into a pageable Vec, then write() of it and fdatasync (inside the timing, so the bytes are on the disk)".to_string();
            run_samples(&mut r, samples, |i| {
                let start = Instant::now();
                let mut data = vec![0u8; size];
                rig.stream
                    .copy_to_pageable(&mut data, &rig.src, 0)
                    .map_err(StorageError::cuda("the naive copy from the GPU"))?;
                let werr = |source| StorageError::Write {
                    path: opts.file.clone(),
                    offset: 0,
                    len: opts.size,
                    source,
                };
                std::fs::write(&opts.file, &data).map_err(werr)?;
                std::fs::File::open(&opts.file)
                    .and_then(|f| f.sync_data())
                    .map_err(werr)?;
                let t = start.elapsed().as_secs_f64();
                if i == 0 {
                    verify(checksum_file(&file)?, rig.expected, "the file")?;
                }
                Ok((Some(opts.size as f64 / t / 1e9), String::new(), ""))
            });
        }
        BenchKind::FileToHostStaged => {
            return file_to_host_row(opts, samples, rig.expected);
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
/// the row with [`BenchStatus::Error`].
fn run_samples(
    row: &mut BenchRow,
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
                row.status = BenchStatus::Error(e.to_string());
                break;
            }
        }
    }
    row.median_gbps = gdx_sys::stats::median(&row.samples_gbps);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_serialise_status_flat() {
        let r = BenchRow {
            key: "file_to_gpu_gds".into(),
            direction: Direction::FileToGpu,
            path: "gds".into(),
            method: "m".into(),
            bytes: 1,
            samples_gbps: vec![],
            median_gbps: None,
            detail: String::new(),
            status: BenchStatus::Waived("libcufile.so.0 unavailable".into()),
        };
        let j = serde_json::to_value(&r).unwrap();
        assert_eq!(j["status"], "waived");
        assert_eq!(j["reason"], "libcufile.so.0 unavailable");
        assert_eq!(j["median_gbps"], serde_json::Value::Null);
    }

    #[test]
    fn without_a_gpu_a_gpu_row_is_an_error_not_a_panic() {
        if !gdx_sys::testenv::precondition("no CUDA driver", Cuda::load().is_err()) {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let opts = BenchOptions::new(dir.path().join("b"), 0);
        let kind = BenchKind::ALL.into_iter().find(|k| k.needs_gpu()).unwrap();
        let e = bench_file_row(&opts, kind, &mut |_| {}).unwrap_err();
        assert!(e.to_string().contains("libcuda.so.1 unavailable"), "{e}");
    }
}
