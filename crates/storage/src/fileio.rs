//! [`FileIo`]: one open file, read and written at positions through `O_DIRECT` where the file
//! system takes it and through the page cache where it does not, saying which.
//!
//! Invariants:
//! - Two descriptors: a buffered one (always) and an `O_DIRECT` one (when asked for and the
//!   open succeeds). Aligned requests ([`align::ALIGN`] for position, length and address) go to the
//!   direct one; unaligned heads and tails go to the buffered one.
//! - No silent fallback: when the file system refuses `O_DIRECT` (at open, or `EINVAL` on a
//!   request), the request is redone buffered, later ones stay buffered, and
//!   [`FileIo::outcome`] reports [`StoragePath::Buffered`] with the reason.
//! - Reads stop only at the end of the file; a short read elsewhere is continued.

use crate::align;
use crate::residency::Residency;
use crate::{IoSplit, StorageError, StoragePath};
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// An open file (see the module docs).
#[derive(Debug)]
pub(crate) struct FileIo {
    path: PathBuf,
    buffered: File,
    direct: Option<File>,
    /// Why the direct descriptor is not (or no longer) used; `None` while it is, or when it
    /// was not asked for.
    refused: Mutex<Option<String>>,
    direct_requested: bool,
    fs: &'static str,
    /// The file's size at open.
    size_at_open: u64,
    /// Largest single read request (tests shorten it to force short reads).
    max_read: std::sync::atomic::AtomicUsize,
    /// The page cache's residency of the range being read: resident pages are read through the
    /// buffered descriptor, the others through the direct one ([`crate::residency`]).
    residency: Option<Residency>,
    /// Bytes read or written through the buffered descriptor, and through the direct one.
    via_cache: AtomicU64,
    via_direct: AtomicU64,
}

fn o_direct() -> i32 {
    rustix::fs::OFlags::DIRECT.bits() as i32
}

fn is_einval(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error())
}

impl FileIo {
    /// Open `path` for reading; through `O_DIRECT` too when `direct`.
    pub(crate) fn open_read(path: &Path, direct: bool) -> Result<FileIo, StorageError> {
        let mut opts = OpenOptions::new();
        opts.read(true);
        FileIo::open(path, direct, opts, "reading")
    }

    /// Open `path` for writing, creating it (mode 0644 less the umask) but not truncating it;
    /// through `O_DIRECT` too when `direct`.
    pub(crate) fn open_write(path: &Path, direct: bool) -> Result<FileIo, StorageError> {
        let mut opts = OpenOptions::new();
        opts.write(true).create(true).mode(0o644);
        FileIo::open(path, direct, opts, "writing")
    }

    fn open(
        path: &Path,
        direct: bool,
        opts: OpenOptions,
        purpose: &'static str,
    ) -> Result<FileIo, StorageError> {
        // O_NONBLOCK: a FIFO swapped in after the caller's checks fails to open (no reader) or
        // opens at once, and is then refused, instead of blocking the open.
        let (buffered, size_at_open) = open_checked(path, &opts, purpose, true)?;
        let fs = fs_name(&buffered);
        let mut refused = None;
        let direct_file = if direct {
            let mut dopts = opts.clone();
            // `create` is for the path; the reopen reaches the file already open.
            dopts.create(false);
            dopts.custom_flags(o_direct());
            match reopen(&buffered, &dopts) {
                Ok(f) => Some(f),
                Err(e) => {
                    refused = Some(format!(
                        "the file system ({fs}) refuses O_DIRECT: open failed with {e}"
                    ));
                    None
                }
            }
        } else {
            None
        };
        Ok(FileIo {
            path: path.to_path_buf(),
            buffered,
            direct: direct_file,
            refused: Mutex::new(refused),
            direct_requested: direct,
            fs,
            size_at_open,
            max_read: std::sync::atomic::AtomicUsize::new(usize::MAX),
            residency: None,
            via_cache: AtomicU64::new(0),
            via_direct: AtomicU64::new(0),
        })
    }

    /// The buffered descriptor (for a mapping of the file).
    pub(crate) fn buffered_file(&self) -> &File {
        &self.buffered
    }

    /// Count `n` bytes as read through the page cache by other means than [`FileIo::read_full`]
    /// (a copy straight out of a mapping of the file).
    pub(crate) fn count_cached(&self, n: u64) {
        self.via_cache.fetch_add(n, Ordering::Relaxed);
    }

    /// The file's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Read the pages `residency` finds in the page cache through it, the others with
    /// `O_DIRECT` (when the direct descriptor is in use).
    pub(crate) fn set_residency(&mut self, residency: Option<Residency>) {
        self.residency = residency;
    }

    /// Whether a residency map splits this file's reads.
    pub(crate) fn is_split(&self) -> bool {
        self.residency.is_some()
    }

    /// The bytes that went through the page cache and with `O_DIRECT` so far.
    pub(crate) fn split(&self) -> IoSplit {
        IoSplit {
            page_cache: self.via_cache.load(Ordering::Relaxed),
            direct: self.via_direct.load(Ordering::Relaxed),
        }
    }

    /// The file's size when it was opened.
    pub(crate) fn size_at_open(&self) -> u64 {
        self.size_at_open
    }

    fn refused(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.refused.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The direct descriptor, while it is in use.
    fn direct(&self) -> Option<&File> {
        match &self.direct {
            Some(f) if self.refused().is_none() => Some(f),
            _ => None,
        }
    }

    /// Stop using `O_DIRECT` after `what` failed with `EINVAL`.
    fn refuse(&self, what: String) {
        let mut r = self.refused();
        if r.is_none() {
            log::warn!(
                "{}: {what}; continuing with buffered I/O",
                self.path.display()
            );
            *r = Some(what);
        }
    }

    /// Which path the I/O took, and why.
    pub(crate) fn outcome(&self) -> (StoragePath, String) {
        if !self.direct_requested {
            return (
                StoragePath::Buffered,
                format!("buffered I/O through the page cache ({})", self.fs),
            );
        }
        match self.refused().as_ref() {
            None => (StoragePath::FileStaged, format!("O_DIRECT on {}", self.fs)),
            Some(why) => (
                StoragePath::Buffered,
                format!("O_DIRECT was asked for but {why}; buffered I/O through the page cache"),
            ),
        }
    }

    /// Read into `buf` at `pos` until at least `need` bytes (at most `buf.len()`) are in, or
    /// the file ends. Returns the bytes read.
    pub(crate) fn read_full(
        &self,
        buf: &mut [u8],
        pos: u64,
        need: usize,
    ) -> Result<usize, StorageError> {
        let need = need.min(buf.len());
        let mut got = 0usize;
        while got < need {
            let at = pos + got as u64;
            let cap = self.max_read.load(std::sync::atomic::Ordering::Relaxed);
            let mut end = buf.len().min(got.saturating_add(cap));
            // A run of resident pages is read through the page cache; a run of others stops
            // where the next resident page starts.
            let mut cached = false;
            if let Some((resident, run_end)) = self.residency.as_ref().and_then(|r| r.run_at(at)) {
                cached = resident;
                let run = usize::try_from(run_end - at).unwrap_or(usize::MAX);
                end = end.min(got.saturating_add(run));
            }
            let req = &mut buf[got..end];
            let aligned = align::is_aligned(at)
                && align::is_aligned(req.len() as u64)
                && align::ptr_aligned(req);
            let direct = self.direct().filter(|_| aligned && !cached);
            let mut through_cache = direct.is_none();
            let r = match direct {
                Some(f) => match f.read_at(req, at) {
                    Err(e) if is_einval(&e) => {
                        self.refuse(format!(
                            "the file system ({}) refuses O_DIRECT: a {}-byte read at offset {at} \
                             failed with {e}",
                            self.fs,
                            req.len()
                        ));
                        through_cache = true;
                        self.buffered.read_at(req, at)
                    }
                    r => r,
                },
                None => self.buffered.read_at(req, at),
            };
            match r {
                Ok(0) => break,
                Ok(n) => {
                    let counter = if through_cache {
                        &self.via_cache
                    } else {
                        &self.via_direct
                    };
                    counter.fetch_add(n as u64, Ordering::Relaxed);
                    got += n;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(StorageError::Read {
                        path: self.path.clone(),
                        offset: at,
                        len: req.len() as u64,
                        source,
                    })
                }
            }
        }
        Ok(got)
    }

    /// Write all of `data` at `pos`: the aligned middle through `O_DIRECT` (when in use and
    /// `data`'s address lines up with `pos`), the unaligned head and tail buffered.
    pub(crate) fn write_all(&self, data: &[u8], pos: u64) -> Result<(), StorageError> {
        let end = pos + data.len() as u64;
        let head_end = align::align_up(pos).min(end);
        let tail_start = align::align_down(end).max(head_end);
        let mid = &data[(head_end - pos) as usize..(tail_start - pos) as usize];
        let direct = match self.direct() {
            Some(f) if !mid.is_empty() && align::ptr_aligned(mid) => f,
            _ => return self.write_buffered(data, pos),
        };
        self.write_buffered(&data[..(head_end - pos) as usize], pos)?;
        match direct.write_all_at(mid, head_end) {
            Ok(()) => {
                self.via_direct
                    .fetch_add(mid.len() as u64, Ordering::Relaxed);
            }
            Err(e) if is_einval(&e) => {
                self.refuse(format!(
                    "the file system ({}) refuses O_DIRECT: a {}-byte write at offset {head_end} \
                     failed with {e}",
                    self.fs,
                    mid.len()
                ));
                self.write_buffered(mid, head_end)?;
            }
            Err(source) => {
                return Err(StorageError::Write {
                    path: self.path.clone(),
                    offset: head_end,
                    len: mid.len() as u64,
                    source,
                })
            }
        }
        self.write_buffered(&data[(tail_start - pos) as usize..], tail_start)
    }

    fn write_buffered(&self, data: &[u8], pos: u64) -> Result<(), StorageError> {
        if data.is_empty() {
            return Ok(());
        }
        self.buffered
            .write_all_at(data, pos)
            .map_err(|source| StorageError::Write {
                path: self.path.clone(),
                offset: pos,
                len: data.len() as u64,
                source,
            })?;
        self.via_cache
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Set the file's length (`ftruncate`).
    pub(crate) fn set_len(&self, len: u64) -> Result<(), StorageError> {
        self.buffered
            .set_len(len)
            .map_err(|source| StorageError::File {
                call: "ftruncate",
                path: self.path.clone(),
                source,
            })
    }

    /// Flush written data to the disk (`fdatasync`).
    pub(crate) fn sync(&self) -> Result<(), StorageError> {
        self.buffered
            .sync_data()
            .map_err(|source| StorageError::File {
                call: "fdatasync",
                path: self.path.clone(),
                source,
            })
    }

    /// Ask the kernel to drop the file's clean pages from the page cache
    /// (`posix_fadvise(POSIX_FADV_DONTNEED)` over the whole file); dirty pages stay, so
    /// [`FileIo::sync`] first.
    pub(crate) fn drop_cache(&self) -> Result<(), StorageError> {
        rustix::fs::fadvise(&self.buffered, 0, None, rustix::fs::Advice::DontNeed).map_err(|e| {
            StorageError::File {
                call: "posix_fadvise(DONTNEED)",
                path: self.path.clone(),
                source: e.into(),
            }
        })
    }

    /// Make every read request at most `bytes` long, as if the kernel returned short reads.
    #[cfg(test)]
    pub(crate) fn simulate_short_reads(&self, bytes: usize) {
        self.max_read
            .store(bytes.max(1), std::sync::atomic::Ordering::Relaxed);
    }

    #[cfg(test)]
    pub(crate) fn simulate_direct_refusal(&self) {
        self.refuse("the file system (test) refuses O_DIRECT: simulated EINVAL".to_string());
    }
}

/// The name of the file system `file` is on, from `fstatfs`'s magic number.
pub(crate) fn fs_name(file: &File) -> &'static str {
    let Ok(st) = rustix::fs::fstatfs(file) else {
        return "unknown file system";
    };
    match st.f_type as u64 {
        0xEF53 => "ext4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x0102_1994 => "tmpfs",
        0x794C_7630 => "overlayfs",
        0x6969 => "nfs",
        0xFF53_4D42 => "cifs",
        0x6573_5546 => "fuse",
        0x2FC1_2FC1 => "zfs",
        0x0BD0_0BD0 => "lustre",
        0x4244 => "hfs",
        0x4d44 => "vfat",
        0x5346_544E => "ntfs",
        0x1980_0202 => "nfsd",
        0x6462_6720 => "debugfs",
        0x6265_6572 => "sysfs",
        0x9FA0 => "proc",
        _ => "an unrecognised file system",
    }
}

/// Opens `path` with `opts` without ever blocking on what it turns out to be, and checks the
/// type on the descriptor (never on the path, which can be swapped after a check): a regular
/// file, or a block device when `block_ok`. A FIFO (even one swapped in after the caller's
/// checks), a socket, a character device (`/dev/zero` behind a symlink) or a folder is
/// [`StorageError::NotAFile`]. Returns the descriptor, still non-blocking (regular files and
/// block devices ignore the flag), and its size.
pub(crate) fn open_checked(
    path: &Path,
    opts: &OpenOptions,
    purpose: &'static str,
    block_ok: bool,
) -> Result<(File, u64), StorageError> {
    let open_err = |source| StorageError::Open {
        path: path.to_path_buf(),
        purpose,
        source,
    };
    let mut nb = opts.clone();
    nb.custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32);
    let f = nb.open(path).map_err(open_err)?;
    let meta = f.metadata().map_err(open_err)?;
    let ft = meta.file_type();
    let size = if ft.is_file() {
        meta.len()
    } else if ft.is_block_device() && block_ok {
        (&f).seek(SeekFrom::End(0))
            .map_err(|source| StorageError::File {
                call: "lseek(SEEK_END)",
                path: path.to_path_buf(),
                source,
            })?
    } else {
        return Err(StorageError::NotAFile {
            path: path.to_path_buf(),
            kind: not_a_file_kind(ft),
        });
    };
    Ok((f, size))
}

/// A regular file opened for reading ([`open_checked`]), for inputs that must be files
/// (checkpoint headers, indexes).
pub(crate) fn open_regular(
    path: &Path,
    purpose: &'static str,
) -> Result<(File, u64), StorageError> {
    let mut o = OpenOptions::new();
    o.read(true);
    open_checked(path, &o, purpose, false)
}

/// The same open file again, through `/proc/self/fd` (with `opts`' flags, `O_DIRECT` say):
/// never a path lookup, so nothing swapped in at `path` since `f` was opened is reached.
pub(crate) fn reopen(f: &File, opts: &OpenOptions) -> std::io::Result<File> {
    use std::os::fd::AsRawFd;
    opts.open(format!("/proc/self/fd/{}", f.as_raw_fd()))
}

/// What a path that is neither a regular file nor a block device is, for
/// [`StorageError::NotAFile`].
pub(crate) fn not_a_file_kind(ft: std::fs::FileType) -> &'static str {
    if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_char_device() {
        "a character device"
    } else {
        "not a regular file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::align::AlignedBuf;

    fn temp_file(bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.bin");
        std::fs::write(&p, bytes).unwrap();
        (dir, p)
    }

    fn pattern(n: usize) -> Vec<u8> {
        gdx_base::pattern::pattern(n, 31)
    }

    #[test]
    fn direct_reads_stop_at_the_end_of_the_file() {
        let data = pattern(3 * 4096 + 100);
        let (_d, p) = temp_file(&data);
        let io = FileIo::open_read(&p, true).unwrap();
        assert_eq!(io.size_at_open(), data.len() as u64);
        let mut buf = AlignedBuf::new(8 * 4096);
        let got = io.read_full(buf.as_mut_slice(), 4096, 8 * 4096).unwrap();
        assert_eq!(got, 2 * 4096 + 100);
        assert_eq!(&buf.as_slice()[..got], &data[4096..]);
        let (path, reason) = io.outcome();
        // Every file system this runs on in CI takes O_DIRECT; the reason names it either way.
        eprintln!("{path}: {reason}");
        assert!(reason.contains(io.fs), "{reason}");
    }

    #[test]
    fn short_reads_are_continued_until_the_end_of_the_file() {
        let data = pattern(5 * 4096 + 17);
        let (_d, p) = temp_file(&data);
        // 4096 keeps O_DIRECT requests aligned; 1000 makes them unaligned, so the rest of each
        // request goes through the buffered descriptor.
        for cap in [4096, 1000, 1] {
            let io = FileIo::open_read(&p, true).unwrap();
            io.simulate_short_reads(cap);
            let mut buf = AlignedBuf::new(8 * 4096);
            let got = io.read_full(buf.as_mut_slice(), 0, 8 * 4096).unwrap();
            assert_eq!(got, data.len(), "cap {cap}");
            assert_eq!(&buf.as_slice()[..got], &data[..], "cap {cap}");
            assert_eq!(io.outcome().0, StoragePath::FileStaged);
        }
    }

    #[test]
    fn refusal_is_reported_as_buffered_with_the_reason_and_reads_still_work() {
        let data = pattern(10_000);
        let (_d, p) = temp_file(&data);
        let io = FileIo::open_read(&p, true).unwrap();
        io.simulate_direct_refusal();
        let mut buf = AlignedBuf::new(12_288);
        assert_eq!(io.read_full(buf.as_mut_slice(), 0, 10_000).unwrap(), 10_000);
        assert_eq!(&buf.as_slice()[..10_000], &data[..]);
        let (path, reason) = io.outcome();
        assert_eq!(path, StoragePath::Buffered);
        assert!(reason.contains("O_DIRECT was asked for but"), "{reason}");
        assert!(reason.contains("simulated EINVAL"), "{reason}");
        let io = FileIo::open_read(&p, false).unwrap();
        let (path, reason) = io.outcome();
        assert_eq!(path, StoragePath::Buffered);
        assert_eq!(
            reason,
            format!("buffered I/O through the page cache ({})", io.fs)
        );
    }

    #[test]
    fn unaligned_writes_split_into_buffered_head_and_tail() {
        let (_d, p) = temp_file(&vec![0xEE; 5 * 4096]);
        let io = FileIo::open_write(&p, true).unwrap();
        let mut buf = AlignedBuf::new(4 * 4096);
        let src = pattern(4 * 4096);
        buf.as_mut_slice().copy_from_slice(&src);
        // Bytes 100..(3 * 4096 + 7) of the buffer go to the same file positions.
        io.write_all(&buf.as_slice()[100..3 * 4096 + 7], 100)
            .unwrap();
        io.sync().unwrap();
        let back = std::fs::read(&p).unwrap();
        assert_eq!(back.len(), 5 * 4096);
        assert!(back[..100].iter().all(|&b| b == 0xEE));
        assert_eq!(&back[100..3 * 4096 + 7], &src[100..3 * 4096 + 7]);
        assert!(back[3 * 4096 + 7..].iter().all(|&b| b == 0xEE));
    }

    #[test]
    fn directories_and_missing_files_are_refused_clearly() {
        let dir = tempfile::tempdir().unwrap();
        let e = FileIo::open_read(dir.path(), true).unwrap_err();
        assert!(
            e.to_string()
                .contains("is not a regular file or block device (a directory)"),
            "{e}"
        );
        let e = FileIo::open_read(&dir.path().join("missing"), true).unwrap_err();
        assert!(
            e.to_string()
                .contains("for reading: No such file or directory"),
            "{e}"
        );
    }

    #[test]
    fn file_systems_have_names() {
        let f = File::open("/proc/self/status").unwrap();
        assert_eq!(fs_name(&f), "proc");
    }
}
