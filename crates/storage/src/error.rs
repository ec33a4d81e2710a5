//! [`StorageError`]: what went wrong in a copy, with the file, the byte range and the call.

use crate::StoragePath;
use gdx_sys::cuda::CudaError;
use gdx_sys::cufile::CufileError;
use gdx_sys::Unavailable;
use std::path::PathBuf;

/// A copy between a file and GPU or host memory that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// The file could not be opened.
    #[error("cannot open {} for {purpose}: {source}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// `reading` or `writing`.
        purpose: &'static str,
        /// The system error.
        #[source]
        source: std::io::Error,
    },
    /// The path names something that is neither a regular file nor a block device.
    #[error(
        "{} is not a regular file or block device ({kind}): gdx reads and writes files by range, so copy a stream into a file first",
        path.display()
    )]
    NotAFile {
        /// The path.
        path: PathBuf,
        /// What it is, e.g. `a directory`.
        kind: &'static str,
    },
    /// A read failed.
    #[error("reading {len} byte(s) of {} at offset {offset} failed: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Where the read started.
        offset: u64,
        /// Bytes asked for.
        len: u64,
        /// The system error.
        #[source]
        source: std::io::Error,
    },
    /// A write failed.
    #[error("writing {len} byte(s) of {} at offset {offset} failed: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Where the write started.
        offset: u64,
        /// Bytes to write.
        len: u64,
        /// The system error.
        #[source]
        source: std::io::Error,
    },
    /// Flushing the file to the disk (`fdatasync`) or changing its length failed.
    #[error("{call} on {} failed: {source}", path.display())]
    File {
        /// `fdatasync`, `ftruncate` or `fstat`.
        call: &'static str,
        /// The file.
        path: PathBuf,
        /// The system error.
        #[source]
        source: std::io::Error,
    },
    /// The requested range does not lie inside the file.
    #[error(
        "{} is {size} byte(s) long: the range of {len} byte(s) at offset {offset} is past its end",
        path.display()
    )]
    RangePastEnd {
        /// The file.
        path: PathBuf,
        /// Start of the range.
        offset: u64,
        /// Length of the range.
        len: u64,
        /// The file's size.
        size: u64,
    },
    /// The file ended before the range did, although the range fitted when the copy started:
    /// the file shrank during the copy.
    #[error(
        "{} ended at byte {eof} during the copy, which needs bytes up to {expected_end} \
         (the file was {size_at_start} byte(s) when the copy started): it shrank during the copy",
        path.display()
    )]
    Shrunk {
        /// The file.
        path: PathBuf,
        /// Where reading hit the end of the file.
        eof: u64,
        /// The end of the range being copied.
        expected_end: u64,
        /// The file's size when the copy started.
        size_at_start: u64,
    },
    /// A byte range outside a memory buffer.
    #[error("{len} byte(s) at offset {offset} do not fit in the {size}-byte {what}")]
    OutOfBounds {
        /// Which buffer, e.g. `destination GPU buffer`.
        what: &'static str,
        /// Start of the range.
        offset: u64,
        /// Length of the range.
        len: u64,
        /// Size of the buffer.
        size: u64,
    },
    /// The destination range's length differs from the source's.
    #[error("the destination range of {} is {dst} byte(s) but the source has {src}", path.display())]
    LengthMismatch {
        /// The destination file.
        path: PathBuf,
        /// Destination range length.
        dst: u64,
        /// Source length.
        src: u64,
    },
    /// An option out of range, found before any I/O.
    #[error("invalid option: {0}")]
    InvalidOption(String),
    /// The requested path cannot run here.
    #[error("the {path} path is unavailable: {reason}")]
    PathUnavailable {
        /// The path asked for.
        path: StoragePath,
        /// Why it cannot run.
        reason: String,
    },
    /// A GPU bus id that is not a PCI address (for its link lookup).
    #[error("GPU bus id {id} is not a PCI address: {source}")]
    BusId {
        /// The bus id as normalised.
        id: String,
        /// The parse error.
        #[source]
        source: gdx_topo::PciAddrError,
    },
    /// A PCIe link (the disk's or the GPU's) is not known: the reason, with the device and
    /// the sysfs path looked at. The ceiling is then unknown, never guessed.
    #[error("{}", why.text(device))]
    LinkUnknown {
        /// The GPU's bus id, the disk's name, or the file.
        device: String,
        /// Why its link is not known.
        why: LinkGap,
    },
    /// `stat` of a file failed (for its disk's link).
    #[error("{}: {source}", path.display())]
    Stat {
        /// The file.
        path: PathBuf,
        /// The system error.
        #[source]
        source: std::io::Error,
    },
    /// A CUDA driver call failed.
    #[error("{context}: {source}")]
    Cuda {
        /// What gdx was doing, e.g. `copying a chunk to GPU 0`.
        context: String,
        /// The driver error.
        #[source]
        source: CudaError,
    },
    /// A cuFile call failed.
    #[error("{context}: {source}")]
    Cufile {
        /// What gdx was doing.
        context: String,
        /// The cuFile error.
        #[source]
        source: CufileError,
    },
    /// A GPU location on a machine where the CUDA driver cannot be loaded.
    #[error("gpu:{ordinal} needs the CUDA driver (install the NVIDIA driver, or copy to host): {source}")]
    NoCudaDriver {
        /// The GPU asked for.
        ordinal: u32,
        /// Why libcuda is unavailable.
        #[source]
        source: Unavailable,
    },
    /// A vendor library is missing.
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
    /// A safetensors file (or a sharded checkpoint's index) that gdx refuses, found before any
    /// tensor byte moved.
    #[error("{} is not a valid safetensors checkpoint: {reason}; nothing was loaded", path.display())]
    BadCheckpoint {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the tensor and the numbers.
        reason: String,
    },
    /// An I/O thread stopped without reporting (a bug in gdx).
    #[error("internal error: {0}")]
    Internal(String),
    /// A copy into a file failed part way; `after` says what became of the file.
    #[error("{source}; {after}: {}", path.display())]
    IntoFile {
        /// The destination file.
        path: PathBuf,
        /// Removed, or left (and why).
        after: crate::copy::PartialFile,
        /// What failed.
        #[source]
        source: Box<StorageError>,
    },
}

/// Why a PCIe link is not known ([`StorageError::LinkUnknown`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LinkGap {
    /// The GPU's sysfs folder shows no link speed.
    NoSpeed {
        /// The folder, as shown.
        dir: String,
    },
    /// The file is on a file system without a block device.
    NoBlockDevice {
        /// Device major number.
        major: u32,
        /// Device minor number.
        minor: u32,
    },
    /// The block device's sysfs link does not resolve.
    NotFound,
    /// A virtio disk: its link says nothing about the storage.
    Virtio,
    /// No PCI function with a link above the block device.
    NoneAbove {
        /// The block device's folder, as shown.
        dir: String,
    },
}

impl LinkGap {
    /// The sentence for `device`.
    pub fn text(&self, device: &str) -> String {
        match self {
            LinkGap::NoSpeed { dir } => format!("no PCIe link speed for GPU {device} in {dir}"),
            LinkGap::NoBlockDevice { major, minor } => format!(
                "{device} is on a file system without a block device (device {major}:{minor}, e.g. tmpfs or overlayfs)"
            ),
            LinkGap::NotFound => format!("{device}: not found"),
            LinkGap::Virtio => format!(
                "{device} is a virtio disk: its link speed says nothing about the storage behind it"
            ),
            LinkGap::NoneAbove { dir } => format!("{device}: no PCIe link found above {dir}"),
        }
    }
}

impl StorageError {
    /// Whether the copy had started moving bytes when this happened (a failed transfer, exit
    /// status 1 for `gdx cp`), as opposed to a problem found before (a usage or environment
    /// error: a missing file, a bad range, no GPU).
    pub fn is_copy_failure(&self) -> bool {
        match self {
            StorageError::Shrunk { .. }
            | StorageError::Read { .. }
            | StorageError::Write { .. }
            | StorageError::File { .. }
            | StorageError::Internal(_) => true,
            StorageError::IntoFile { source, .. } => source.is_copy_failure(),
            _ => false,
        }
    }

    /// A [`StorageError::Cuda`] with `context`.
    pub(crate) fn cuda(context: impl Into<String>) -> impl FnOnce(CudaError) -> StorageError {
        let context = context.into();
        move |source| StorageError::Cuda { context, source }
    }

    /// A [`StorageError::Cufile`] with `context`.
    pub(crate) fn cufile(context: impl Into<String>) -> impl FnOnce(CufileError) -> StorageError {
        let context = context.into();
        move |source| StorageError::Cufile { context, source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_file_and_the_bytes() {
        let e = StorageError::Open {
            path: "/d/x.bin".into(),
            purpose: "reading",
            source: std::io::Error::from_raw_os_error(2),
        };
        assert!(
            e.to_string()
                .starts_with("cannot open /d/x.bin for reading: No such file or directory"),
            "{e}"
        );
        let e = StorageError::Shrunk {
            path: "/d/x.bin".into(),
            eof: 4096,
            expected_end: 1 << 20,
            size_at_start: 1 << 20,
        };
        assert!(e.to_string().contains("shrank during the copy"), "{e}");
        let e = StorageError::PathUnavailable {
            path: StoragePath::Gds,
            reason: "libcufile.so.0 unavailable".into(),
        };
        assert_eq!(
            e.to_string(),
            "the gds path is unavailable: libcufile.so.0 unavailable"
        );
    }
}
