//! gdx-storage: moving bytes between files and GPU or host memory, over the fastest path that
//! works here, and saying which path ran and why.
//!
//! | path | what moves the bytes | when |
//! |---|---|---|
//! | [`StoragePath::Gds`] | cuFile (`libcufile.so.0`, loaded at run time): true GPUDirect Storage with the `nvidia-fs` module, else cuFile's compatibility mode (reported) | GPU memory, cuFile present |
//! | [`StoragePath::FileStaged`] | `O_DIRECT` reads/writes into aligned bounce buffers (pinned for a GPU), several in flight, pipelined with the host↔GPU copies | always |
//! | [`StoragePath::Buffered`] | the same pipeline through the page cache, when the file system refuses `O_DIRECT` or when asked | always |
//!
//! [`copy`] is `gdx cp` as one call (locations, range checks before allocation, the memory side
//! created and filled, verification, the ceiling, no partial file left behind). Below it, the
//! entry points are [`copy_file_to_gpu`], [`copy_gpu_to_file`], [`copy_file_to_host`],
//! [`copy_host_to_file`], [`copy_parts_to_file`] (host bytes and GPU spans gathered into one
//! file) and [`read_file`]; each returns a [`CopyReport`] with the bytes, the
//! path taken, the reason and the time. [`plan`] is the planner's decision on its own (GDS or
//! staged, with the reason), [`checksum_file`], [`checksum_gpu`] and [`checksum_bytes`] verify a
//! copy, [`evict`] drops a file from the page cache (before a cold read), and [`ceiling`] finds
//! the disk's and the GPU's PCIe links. [`gather_to_gpu`] loads many ranges of many files into
//! GPU memory with one set of reader threads (the checkpoint loader's engine). Benchmarking these paths is gdx-bench's (`gdx bench
//! --path file`); this crate only moves the bytes and reports what it did.
//!
//! No silent fallback: when `O_DIRECT` is refused the report says [`StoragePath::Buffered`] and
//! why; when cuFile runs in compatibility mode the reason says so; a path that was asked for
//! explicitly and cannot run is an error ([`StorageError::PathUnavailable`]).
//!
//! This crate has no `unsafe`: the cuFile and CUDA calls are in `gdx-sys`, and `O_DIRECT`,
//! `posix_fadvise` and `fstatfs` come through `rustix`.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod align;
pub mod ceiling;
mod copy;
mod error;
mod fileio;
mod gather;
mod gds;
mod gpu;
mod host;
mod pipeline;
mod plan;
mod residency;
pub mod safetensors;
mod verify;

pub use align::ALIGN;
pub use copy::{copy, source_len, CopyOutcome, CopyRequest, Location, PartialFile};
pub use error::{LinkGap, StorageError};
pub use gather::{
    default_readers, gather_to_gpu, release_pinned_cache, FileOutcome, GatherOptions, GatherRange,
    GatherReport, WarmMethod, PINNED_KEEP_BYTES,
};
use gdx_base::bytesize::human_bytes;
pub use gpu::{copy_file_to_gpu, copy_gpu_to_file, copy_parts_to_file, Part};
pub use host::{copy_file_to_host, copy_host_to_file, copy_slices_to_file, read_file};
pub use plan::{
    cufile_status, cufile_status_for_auto, keep_cufile_open, plan, CufileStatus, MemoryEnd, Plan,
};
pub use residency::{evict, residency, Residency};
pub use verify::{checksum_bytes, checksum_file, checksum_gpu, Checksum};

use serde::Serialize;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// A file, or a byte range of one, as a copy's source or destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRange {
    /// The file (a regular file or a block device).
    pub path: PathBuf,
    /// First byte of the range.
    pub offset: u64,
    /// Bytes in the range. `None`: as a source, to the end of the file; as a destination, as
    /// many as the source has.
    pub len: Option<u64>,
}

impl FileRange {
    /// All of `path`.
    pub fn whole(path: impl Into<PathBuf>) -> FileRange {
        FileRange {
            path: path.into(),
            offset: 0,
            len: None,
        }
    }

    /// `len` bytes of `path` at `offset`.
    pub fn new(path: impl Into<PathBuf>, offset: u64, len: u64) -> FileRange {
        FileRange {
            path: path.into(),
            offset,
            len: Some(len),
        }
    }

    /// The path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The path a copy took (see the crate docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StoragePath {
    /// cuFile (GPUDirect Storage, or its compatibility mode: the reason says which).
    Gds,
    /// `O_DIRECT` I/O through aligned (pinned, for a GPU) bounce buffers, pipelined.
    FileStaged,
    /// The staged pipeline through the page cache.
    Buffered,
}

impl StoragePath {
    /// `gds`, `file-staged` or `buffered`.
    pub fn key(self) -> &'static str {
        match self {
            StoragePath::Gds => "gds",
            StoragePath::FileStaged => "file-staged",
            StoragePath::Buffered => "buffered",
        }
    }
}

impl fmt::Display for StoragePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key())
    }
}

/// Which path a copy should take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PathChoice {
    /// The planner decides ([`plan`]).
    #[default]
    Auto,
    /// cuFile, or an error when it cannot run.
    Gds,
    /// The `O_DIRECT` pipeline (buffered, reported, where the file system refuses `O_DIRECT`).
    FileStaged,
    /// The pipeline through the page cache.
    Buffered,
}

/// Which way a copy goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// File to GPU memory.
    FileToGpu,
    /// GPU memory to file.
    GpuToFile,
    /// File to host memory.
    FileToHost,
    /// Host memory to file.
    HostToFile,
}

impl Direction {
    /// `file_to_gpu`, `gpu_to_file`, `file_to_host` or `host_to_file`.
    pub fn key(self) -> &'static str {
        match self {
            Direction::FileToGpu => "file_to_gpu",
            Direction::GpuToFile => "gpu_to_file",
            Direction::FileToHost => "file_to_host",
            Direction::HostToFile => "host_to_file",
        }
    }
}

/// Called with (bytes done, bytes in all) as chunks finish, from the calling thread or an I/O
/// thread.
pub type ProgressFn = Arc<dyn Fn(u64, u64) + Send + Sync>;

/// Default bytes per chunk: 16 MiB.
pub const DEFAULT_CHUNK_BYTES: usize = 16 << 20;
/// Default chunks in flight (and bounce buffers): 4.
pub const DEFAULT_DEPTH: usize = 4;

/// How to copy.
#[derive(Clone)]
pub struct CopyOptions {
    /// The path ([`PathChoice::Auto`] by default).
    pub path: PathChoice,
    /// Bytes per chunk: per bounce buffer, per `O_DIRECT` request, per cuFile call. A multiple
    /// of [`ALIGN`]; [`DEFAULT_CHUNK_BYTES`] by default.
    pub chunk_bytes: usize,
    /// Chunks in flight (reads or writes at once, and bounce buffers); 1 to 64,
    /// [`DEFAULT_DEPTH`] by default.
    pub depth: usize,
    /// File destinations: cut the file at the end of the written range (`ftruncate` to the
    /// range's offset before writing). Off by default: bytes outside the range are kept.
    pub truncate: bool,
    /// File destinations: `fdatasync` before returning, inside the timed part. Off by default.
    pub sync: bool,
    /// Progress callback.
    pub progress: Option<ProgressFn>,
}

impl Default for CopyOptions {
    fn default() -> Self {
        CopyOptions {
            path: PathChoice::Auto,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            depth: DEFAULT_DEPTH,
            truncate: false,
            sync: false,
            progress: None,
        }
    }
}

impl fmt::Debug for CopyOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CopyOptions")
            .field("path", &self.path)
            .field("chunk_bytes", &self.chunk_bytes)
            .field("depth", &self.depth)
            .field("truncate", &self.truncate)
            .field("sync", &self.sync)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

impl CopyOptions {
    /// Refuse options out of range, before any I/O.
    pub fn validate(&self) -> Result<(), StorageError> {
        if self.chunk_bytes == 0 || !align::is_aligned(self.chunk_bytes as u64) {
            return Err(StorageError::InvalidOption(format!(
                "the chunk size must be a non-zero multiple of {ALIGN} bytes, not {}",
                self.chunk_bytes
            )));
        }
        if !(1..=64).contains(&self.depth) {
            return Err(StorageError::InvalidOption(format!(
                "the depth (chunks in flight) must be 1 to 64, not {}",
                self.depth
            )));
        }
        Ok(())
    }

    /// A progress counter over `total` bytes for this copy.
    pub(crate) fn counter(&self, total: u64) -> impl FnMut(u64) + '_ {
        let mut done = 0u64;
        move |n| {
            done += n;
            if let Some(p) = &self.progress {
                p(done, total);
            }
        }
    }
}

/// What a copy did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CopyReport {
    /// Which way.
    pub direction: Direction,
    /// Bytes copied.
    pub bytes: u64,
    /// The path taken.
    pub path: StoragePath,
    /// Why that path, and how it ran (e.g. `O_DIRECT on ext4`, cuFile's mode, a refusal).
    pub reason: String,
    /// From the first I/O to the last byte landing (and `fdatasync` with
    /// [`CopyOptions::sync`]); opening files and allocating or registering buffers excluded.
    #[serde(serialize_with = "seconds")]
    pub elapsed: Duration,
    /// The staged pipeline's file bytes each way (`None` for cuFile): through the page cache,
    /// and with `O_DIRECT`. Whole aligned blocks are read, so the two may add up to a block
    /// more than [`CopyReport::bytes`] at either end of an unaligned range.
    pub split: Option<IoSplit>,
}

/// Bytes of a staged copy that went through the page cache and with `O_DIRECT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct IoSplit {
    /// Read or written through the page cache (buffered descriptor).
    pub page_cache: u64,
    /// Read or written with `O_DIRECT`.
    pub direct: u64,
}

impl fmt::Display for IoSplit {
    /// `1.50 GiB through the page cache, 2.50 GiB with O_DIRECT`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} through the page cache, {} with O_DIRECT",
            human_bytes(self.page_cache),
            human_bytes(self.direct)
        )
    }
}

fn seconds<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl CopyReport {
    /// Throughput in GB/s (1e9 bytes per second); `None` for an empty copy or no measurable
    /// time.
    pub fn gbps(&self) -> Option<f64> {
        let s = self.elapsed.as_secs_f64();
        (self.bytes > 0 && s > 0.0).then(|| self.bytes as f64 / s / 1e9)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_validated() {
        assert!(CopyOptions::default().validate().is_ok());
        let o = CopyOptions {
            chunk_bytes: 1000,
            ..Default::default()
        };
        assert!(o
            .validate()
            .unwrap_err()
            .to_string()
            .contains("multiple of 4096"));
        let o = CopyOptions {
            depth: 0,
            ..Default::default()
        };
        assert!(o.validate().is_err());
    }

    #[test]
    fn reports_compute_gbps_and_serialise_seconds() {
        let r = CopyReport {
            direction: Direction::FileToHost,
            bytes: 2_000_000_000,
            path: StoragePath::FileStaged,
            reason: "O_DIRECT on ext4".into(),
            elapsed: Duration::from_secs(1),
            split: Some(IoSplit {
                page_cache: 4096,
                direct: 1 << 20,
            }),
        };
        assert_eq!(r.gbps(), Some(2.0));
        let j = serde_json::to_value(&r).unwrap();
        assert_eq!(j["path"], "file-staged");
        assert_eq!(j["direction"], "file_to_host");
        assert_eq!(j["elapsed"], 1.0);
        assert_eq!(j["split"]["direct"], 1 << 20);
        assert_eq!(
            r.split.unwrap().to_string(),
            "4 KiB through the page cache, 1 MiB with O_DIRECT"
        );
        let empty = CopyReport { bytes: 0, ..r };
        assert_eq!(empty.gbps(), None);
    }
}
