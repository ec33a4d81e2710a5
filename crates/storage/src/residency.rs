//! Page-cache residency: which pages of a file range the kernel holds ([`Residency`], from
//! `mincore(2)` through gdx-sys), and the read planner that uses it ([`plan_read`]).
//!
//! With [`PathChoice::Auto`], a read asks the kernel first:
//!
//! | the range in the page cache | path | why |
//! |---|---|---|
//! | all of it | `buffered` | a copy out of the page cache runs at memory speed; `O_DIRECT` or cuFile would read the disk again |
//! | part of it | `file-staged`, split | the cached pages through the page cache and the rest with `O_DIRECT`, page by page, in one pipeline |
//! | none of it | the planner's choice ([`crate::plan`]) | `gds` with true GPUDirect Storage, else `file-staged` |
//!
//! The residency is asked before cuFile: only a range with nothing cached can take `gds`, so a
//! cached or partly cached range never loads cuFile or opens its driver (`cuFileDriverOpen`
//! and its close cost a few hundred milliseconds, more than a warm 4 GiB read).
//!
//! Every report of such a read says how many bytes went each way ([`crate::IoSplit`]) and why.
//! Residency can change while a copy runs (pages are evicted or read in); that only moves bytes
//! between the two ways, never changes what is read.

use crate::host::resolve;
use crate::plan::{plan, CufileStatus, MemoryEnd};
use crate::{FileRange, PathChoice, StorageError, StoragePath};
use gdx_base::bytesize::human_bytes;
use std::fs::File;
use std::os::fd::AsFd;
use std::path::Path;

/// Which pages of a file range are in the page cache, as `mincore(2)` said when asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Residency {
    page: u64,
    /// The file position of the first page (the page holding `offset`).
    first: u64,
    pages: Vec<bool>,
    offset: u64,
    len: u64,
}

impl Residency {
    /// Ask the kernel about `len` bytes of `file` at `offset`.
    pub fn of_file(file: &File, offset: u64, len: u64) -> std::io::Result<Residency> {
        let page = gdx_sys::os::page_size();
        let pages = gdx_sys::os::page_residency(file.as_fd(), offset, len)?;
        Ok(Residency {
            page,
            first: offset - offset % page,
            pages,
            offset,
            len,
        })
    }

    /// The bytes of the range.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The page size the map counts in.
    pub fn page_size(&self) -> u64 {
        self.page
    }

    /// The bytes of the range that lie in resident pages.
    pub fn resident_bytes(&self) -> u64 {
        let end = self.offset + self.len;
        self.pages
            .iter()
            .enumerate()
            .filter(|(_, &r)| r)
            .map(|(i, _)| {
                let a = (self.first + i as u64 * self.page).max(self.offset);
                let b = (self.first + (i as u64 + 1) * self.page).min(end);
                b.saturating_sub(a)
            })
            .sum()
    }

    /// Whether the page holding `pos` is resident, and where the run of pages like it ends
    /// (a page boundary, or the end of the map); `None` outside the map.
    pub(crate) fn run_at(&self, pos: u64) -> Option<(bool, u64)> {
        let i = usize::try_from(pos.checked_sub(self.first)? / self.page).ok()?;
        let here = *self.pages.get(i)?;
        let same = self.pages[i..].iter().take_while(|&&r| r == here).count();
        Some((here, self.first + (i + same) as u64 * self.page))
    }
}

/// Write the file's dirty pages to the disk (`fdatasync`), then ask the kernel to drop its
/// pages from the page cache (`posix_fadvise(DONTNEED)`), so the next read comes from the disk.
/// A benchmark calls it before each cold read sample.
pub fn evict(path: &Path) -> Result<(), StorageError> {
    let io = crate::fileio::FileIo::open_read(path, false)?;
    io.sync()?;
    io.drop_cache()
}

/// The residency of `len` bytes (to the end of the file when `None`) of `path` at `offset`.
pub fn residency(path: &Path, offset: u64, len: Option<u64>) -> Result<Residency, StorageError> {
    let (file, size) = open_sized(path)?;
    let (offset, len) = resolve(
        &FileRange {
            path: path.to_path_buf(),
            offset,
            len,
        },
        size,
    )?;
    Residency::of_file(&file, offset, len).map_err(|source| StorageError::File {
        call: "mmap + mincore",
        path: path.to_path_buf(),
        source,
    })
}

fn open_sized(path: &Path) -> Result<(File, u64), StorageError> {
    // Never blocks on a FIFO; a regular file or a block device, checked on the descriptor.
    let mut o = std::fs::OpenOptions::new();
    o.read(true);
    crate::fileio::open_checked(path, &o, "reading", true)
}

/// A read's plan: the path, why, and the residency map that splits a `file-staged` read.
#[derive(Debug, Clone)]
pub(crate) struct ReadPlan {
    pub(crate) path: StoragePath,
    pub(crate) reason: String,
    pub(crate) residency: Option<Residency>,
}

/// Plan a read of `src` into `memory` (see the module docs): [`plan`] for an explicit
/// choice, the page cache's residency first for [`PathChoice::Auto`]. `cufile` is called (at
/// most once) only when the plan depends on it: an explicit choice, or an `auto` read of a
/// range with nothing in the page cache (or whose residency is unknown).
pub(crate) fn plan_read(
    src: &FileRange,
    choice: PathChoice,
    memory: MemoryEnd,
    cufile: impl FnOnce() -> CufileStatus,
) -> Result<ReadPlan, StorageError> {
    let plain = |cufile: &CufileStatus, reason: &dyn Fn(String) -> String| {
        plan(choice, memory, cufile).map(|base| ReadPlan {
            path: base.path,
            reason: reason(base.reason),
            residency: None,
        })
    };
    if choice != PathChoice::Auto {
        return plain(&cufile(), &|r| r);
    }
    let (file, size) = open_sized(&src.path)?;
    let (offset, len) = resolve(src, size)?;
    if len == 0 {
        return plain(&cufile(), &|r| r);
    }
    let res = match Residency::of_file(&file, offset, len) {
        Ok(r) => r,
        Err(e) => {
            return plain(&cufile(), &|r| {
                format!(
                    "page-cache residency unknown (mincore: {e}), so cached pages are not \
                     told apart; {r}"
                )
            })
        }
    };
    let cached = res.resident_bytes();
    let total = human_bytes(len);
    if cached == 0 {
        return plain(&cufile(), &|r| {
            format!("none of the {total} range is in the page cache (mincore); {r}")
        });
    }
    if cached == len {
        return Ok(ReadPlan {
            path: StoragePath::Buffered,
            reason: format!(
                "all of the {total} range is in the page cache (mincore): read through it \
                 (O_DIRECT or cuFile would read the disk again)"
            ),
            residency: None,
        });
    }
    let passed_over = if memory == MemoryEnd::Gpu {
        " (cuFile not consulted: it would read the cached part from the disk again)"
    } else {
        ""
    };
    Ok(ReadPlan {
        path: StoragePath::FileStaged,
        reason: format!(
            "{} of the {total} range is in the page cache (mincore): those pages through the \
             page cache, the other {} with O_DIRECT, in one pipeline{passed_over}",
            human_bytes(cached),
            human_bytes(len - cached)
        ),
        residency: Some(res),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(first: u64, pages: &[bool], offset: u64, len: u64) -> Residency {
        Residency {
            page: 4096,
            first,
            pages: pages.to_vec(),
            offset,
            len,
        }
    }

    #[test]
    fn resident_bytes_count_only_the_range() {
        // Range 100..(3 * 4096 + 50): pages 0 (partly), 1, 2, 3 (partly).
        let r = map(0, &[true, false, true, true], 100, 3 * 4096 - 50);
        assert_eq!(r.resident_bytes(), (4096 - 100) + 4096 + 50);
        assert_eq!(map(0, &[false; 3], 0, 3 * 4096).resident_bytes(), 0);
        assert_eq!(map(0, &[true; 3], 0, 3 * 4096).resident_bytes(), 3 * 4096);
    }

    #[test]
    fn runs_end_at_the_next_change() {
        let r = map(8192, &[true, true, false, true], 8192, 4 * 4096);
        assert_eq!(r.run_at(8192), Some((true, 8192 + 2 * 4096)));
        assert_eq!(r.run_at(8192 + 4096 + 7), Some((true, 8192 + 2 * 4096)));
        assert_eq!(r.run_at(8192 + 2 * 4096), Some((false, 8192 + 3 * 4096)));
        assert_eq!(r.run_at(8192 + 3 * 4096), Some((true, 8192 + 4 * 4096)));
        assert_eq!(r.run_at(0), None);
        assert_eq!(r.run_at(8192 + 4 * 4096), None);
    }

    #[test]
    fn explicit_choices_do_not_look_at_the_cache() {
        let p = plan_read(
            &FileRange::whole("/nonexistent/gdx"),
            PathChoice::FileStaged,
            MemoryEnd::Host,
            || CufileStatus::NotNeeded,
        )
        .unwrap();
        assert_eq!(p.path, StoragePath::FileStaged);
        assert!(p.residency.is_none());
    }

    #[test]
    fn a_file_just_written_is_read_through_the_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, vec![1u8; 5 * 4096]).unwrap();
        let r = residency(&p, 0, None).unwrap();
        // What mincore says decides; a just-written file is in the page cache on every fs.
        assert_eq!(r.resident_bytes(), 5 * 4096, "{r:?}");
        let plan = plan_read(
            &FileRange::whole(&p),
            PathChoice::Auto,
            MemoryEnd::Host,
            || CufileStatus::NotNeeded,
        )
        .unwrap();
        assert_eq!(plan.path, StoragePath::Buffered);
        assert!(
            plan.reason.contains("all of the 20 KiB range"),
            "{}",
            plan.reason
        );
    }

    /// cuFile's status (loading the library, opening its driver) is asked for only when the
    /// plan depends on it: never for a cached range, once for an explicit choice.
    #[test]
    fn cufile_is_consulted_only_when_the_plan_depends_on_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, vec![7u8; 9 * 4096]).unwrap();
        let calls = std::cell::Cell::new(0);
        let status = || {
            calls.set(calls.get() + 1);
            CufileStatus::Available(gdx_sys::cufile::CufileMode::Gds {
                detail: "nvidia-fs 2.17".into(),
            })
        };
        // Cached (just written): buffered, and cuFile never asked, although it would run GDS.
        let plan = plan_read(
            &FileRange::new(&p, 100, 5 * 4096),
            PathChoice::Auto,
            MemoryEnd::Gpu,
            status,
        )
        .unwrap();
        assert_eq!(plan.path, StoragePath::Buffered, "{}", plan.reason);
        assert_eq!(calls.get(), 0);
        // An explicit gds choice asks once and takes it.
        let plan = plan_read(
            &FileRange::whole(&p),
            PathChoice::Gds,
            MemoryEnd::Gpu,
            status,
        )
        .unwrap();
        assert_eq!(plan.path, StoragePath::Gds);
        assert_eq!(calls.get(), 1);
        // An empty range has no residency to decide by: the planner's choice, cuFile asked.
        let plan = plan_read(
            &FileRange::new(&p, 9 * 4096, 0),
            PathChoice::Auto,
            MemoryEnd::Gpu,
            status,
        )
        .unwrap();
        assert_eq!(plan.path, StoragePath::Gds);
        assert_eq!(calls.get(), 2);
    }
}
