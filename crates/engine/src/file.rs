//! File regions ([`Location::File`]): a file, or a byte range of one ([`FileRange`]), as the
//! source or destination of a transfer with GPU memory ([`crate::LocalPeer::copy_file_to`],
//! [`crate::LocalPeer::copy_to_file`]) or host memory ([`Region::copy_from_file`],
//! [`Region::copy_to_file`]).
//!
//! The bytes move through `gdx-storage`, whose planner picks the path: [`Path::Gds`] (cuFile)
//! when cuFile runs true GPUDirect Storage, else [`Path::FileStaged`] (`O_DIRECT` through
//! pinned bounce buffers), or [`Path::Buffered`] when the file system refuses `O_DIRECT`. Every
//! copy returns the [`Plan`] of the path it took and why.
//!
//! Strict mode ([`Policy::strict`]): a copy with GPU memory that would leave cuFile while cuFile
//! runs true GPUDirect Storage (the planner or a cuFile setup failure falling back to the
//! staged pipeline) fails with [`Error::Strict`] and the reason instead.

use gdx_storage::{CufileStatus, MemoryEnd, StorageError, StoragePath};
use gdx_sys::cufile::CufileMode;

pub use gdx_storage::{CopyOptions as FileOptions, FileRange, PathChoice as FilePath};

use crate::error::{Error, Result};
use crate::region::{Location, Region};
use crate::routing::plan::{Path, Plan};
use crate::routing::planner::Policy;

/// The engine's name for a storage path.
pub(crate) fn path_of(p: StoragePath) -> Path {
    match p {
        StoragePath::Gds => Path::Gds,
        StoragePath::FileStaged => Path::FileStaged,
        StoragePath::Buffered => Path::Buffered,
    }
}

impl From<StorageError> for Error {
    /// A storage error as an engine error.
    fn from(e: StorageError) -> Error {
        storage_err(e)
    }
}

/// A storage error as an engine error.
pub(crate) fn storage_err(e: StorageError) -> Error {
    match e {
        StorageError::PathUnavailable { path, reason } => {
            Error::unavailable(path_of(path), format!("{path}: {reason}"))
        }
        e @ (StorageError::InvalidOption(_)
        | StorageError::OutOfBounds { .. }
        | StorageError::LengthMismatch { .. }
        | StorageError::RangePastEnd { .. }) => Error::InvalidArgument(e.to_string()),
        e => Error::Storage(std::sync::Arc::new(e)),
    }
}

/// What the planner decided for one file copy, and what to ask `gdx-storage` for.
pub(crate) struct FilePlan {
    /// The plan as reported.
    pub(crate) plan: Plan,
    /// The options to copy with: in strict mode a `gds` plan is pinned to cuFile, so a cuFile
    /// setup failure is an error rather than a fallback.
    pub(crate) opts: FileOptions,
    /// Strict mode with true GPUDirect Storage: a copy that does not run on cuFile fails.
    pub(crate) must_gds: bool,
}

/// Plan a copy between a file and memory at `memory` (`Location::Gpu(_)` or host) under
/// `policy` (see the module docs).
///
/// # Errors
/// [`Error::Unavailable`] for a path that cannot run (cuFile asked for and missing, cuFile
/// with host memory), [`Error::Strict`] when strict mode refuses a fallback from true GDS,
/// [`Error::InvalidArgument`] for a file location.
pub fn plan_file(memory: Location, opts: &FileOptions, policy: &Policy) -> Result<Plan> {
    plan_inner(memory, opts, policy).map(|p| p.plan)
}

pub(crate) fn plan_inner(
    memory: Location,
    opts: &FileOptions,
    policy: &Policy,
) -> Result<FilePlan> {
    let end = match memory {
        Location::Gpu(_) => MemoryEnd::Gpu,
        Location::Host | Location::PinnedHost => MemoryEnd::Host,
        Location::File => {
            return Err(Error::InvalidArgument(
                "a file-to-file copy has no memory side".to_string(),
            ))
        }
    };
    let status = match (end, opts.path) {
        (MemoryEnd::Gpu, FilePath::Auto | FilePath::Gds) => gdx_storage::cufile_status().0,
        _ => CufileStatus::NotNeeded,
    };
    decide(memory, end, &status, opts, policy)
}

/// [`plan_inner`] given cuFile's status (pure, for tests).
fn decide(
    memory: Location,
    end: MemoryEnd,
    status: &CufileStatus,
    opts: &FileOptions,
    policy: &Policy,
) -> Result<FilePlan> {
    let p = gdx_storage::plan(opts.path, end, status).map_err(storage_err)?;
    let true_gds = matches!(status, CufileStatus::Available(CufileMode::Gds { .. }));
    if policy.strict && true_gds && opts.path == FilePath::Auto && p.path != StoragePath::Gds {
        return Err(Error::strict(
            path_of(p.path),
            format!(
                "cuFile runs true GPUDirect Storage but the plan is {}: {}",
                p.path, p.reason
            ),
        ));
    }
    let must_gds = policy.strict && true_gds && p.path == StoragePath::Gds;
    let mut opts = opts.clone();
    if must_gds {
        opts.path = FilePath::Gds;
    }
    Ok(FilePlan {
        plan: Plan {
            path: path_of(p.path),
            reason: format!("file ↔ {memory}: {}", p.reason).into(),
        },
        opts,
        must_gds,
    })
}

/// The plan a finished copy reports (the path it ran on, which may be `buffered` where the
/// file system refused `O_DIRECT`), or the strict-mode error when it left cuFile.
pub(crate) fn finish(
    fp: &FilePlan,
    got: std::result::Result<gdx_storage::CopyReport, StorageError>,
    memory: Location,
) -> Result<(Plan, u64)> {
    let rep = match got {
        Ok(r) => r,
        Err(e) if fp.must_gds => {
            return Err(Error::strict(
                None,
                format!("cuFile runs true GPUDirect Storage but the copy could not use it: {e}"),
            ))
        }
        Err(e) => return Err(storage_err(e)),
    };
    if fp.must_gds && rep.path != StoragePath::Gds {
        return Err(Error::strict(
            path_of(rep.path),
            format!(
                "cuFile runs true GPUDirect Storage but the copy ran {}: {}",
                rep.path, rep.reason
            ),
        ));
    }
    Ok((
        Plan {
            path: path_of(rep.path),
            reason: format!("file ↔ {memory}: {}", rep.reason).into(),
        },
        rep.bytes,
    ))
}

impl Region<'_> {
    /// Copy the file range `src` (to the end of the file when its length is `None`) into this
    /// host region at `offset`, through `gdx-storage` (`file-staged`, or `buffered` where the
    /// file system refuses `O_DIRECT` or it is asked for). Returns the plan taken and the bytes
    /// copied.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] when the range does not fit at `offset`; the storage error
    /// (open, read, `gds` asked for host memory) otherwise.
    pub fn copy_from_file(
        &mut self,
        offset: u64,
        src: &FileRange,
        opts: &FileOptions,
    ) -> Result<(Plan, u64)> {
        let fp = plan_inner(Location::Host, opts, &Policy::default())?;
        let len = self.len();
        if offset > len {
            return Err(Error::OutOfBounds {
                offset,
                len: 0,
                region_len: len,
            });
        }
        let mut bytes = self.bytes_mut()?;
        let got = gdx_storage::copy_file_to_host(src, &mut bytes[offset as usize..], &fp.opts);
        finish(&fp, got, Location::Host)
    }

    /// Copy `len` bytes of this host region at `offset` to the file range `dst` (created if
    /// needed; its length, if given, must be `len`). Returns the plan taken and the bytes copied.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] when `offset + len` passes the region's end; the storage error
    /// otherwise.
    pub fn copy_to_file(
        &self,
        offset: u64,
        len: u64,
        dst: &FileRange,
        opts: &FileOptions,
    ) -> Result<(Plan, u64)> {
        let fp = plan_inner(Location::Host, opts, &Policy::default())?;
        crate::region::check_bounds(offset, len, self.len())?;
        let bytes = self.bytes()?;
        let got = gdx_storage::copy_host_to_file(
            &bytes[offset as usize..(offset + len) as usize],
            dst,
            &fp.opts,
        );
        finish(&fp, got, Location::Host)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gds() -> CufileStatus {
        CufileStatus::Available(CufileMode::Gds {
            detail: "nvidia-fs 2.17".into(),
        })
    }

    fn compat() -> CufileStatus {
        CufileStatus::Available(CufileMode::Compat {
            reason: "the nvidia-fs kernel module is not loaded".into(),
        })
    }

    fn auto() -> FileOptions {
        FileOptions::default()
    }

    #[test]
    fn true_gds_plans_gds_and_strict_pins_it() {
        let gpu = Location::Gpu(0);
        let p = decide(gpu, MemoryEnd::Gpu, &gds(), &auto(), &Policy::default()).unwrap();
        assert_eq!(p.plan.path, Path::Gds);
        assert!(!p.must_gds);
        assert_eq!(p.opts.path, FilePath::Auto);
        let s = decide(gpu, MemoryEnd::Gpu, &gds(), &auto(), &Policy::strict()).unwrap();
        assert_eq!(s.plan.path, Path::Gds);
        assert!(s.must_gds);
        assert_eq!(
            s.opts.path,
            FilePath::Gds,
            "no silent fallback in strict mode"
        );
    }

    #[test]
    fn compat_or_missing_cufile_plans_file_staged_even_when_strict() {
        let gpu = Location::Gpu(0);
        for st in [
            compat(),
            CufileStatus::Unavailable("libcufile.so.0 missing".into()),
        ] {
            let p = decide(gpu, MemoryEnd::Gpu, &st, &auto(), &Policy::strict()).unwrap();
            assert_eq!(p.plan.path, Path::FileStaged, "{}", p.plan);
            assert!(!p.must_gds);
        }
    }

    #[test]
    fn strict_refuses_a_fallback_from_true_gds() {
        let fp = decide(
            Location::Gpu(0),
            MemoryEnd::Gpu,
            &gds(),
            &auto(),
            &Policy::strict(),
        )
        .unwrap();
        let e = finish(
            &fp,
            Err(StorageError::Internal("cuFileHandleRegister failed".into())),
            Location::Gpu(0),
        )
        .unwrap_err();
        assert!(
            matches!(&e, Error::Strict { reason: m, .. } if m.contains("cuFileHandleRegister")),
            "{e:?}"
        );
        let staged = gdx_storage::CopyReport {
            direction: gdx_storage::Direction::FileToGpu,
            bytes: 1,
            path: StoragePath::FileStaged,
            reason: "O_DIRECT on ext4".into(),
            elapsed: std::time::Duration::from_millis(1),
            split: None,
        };
        let e = finish(&fp, Ok(staged.clone()), Location::Gpu(0)).unwrap_err();
        assert!(matches!(e, Error::Strict { .. }), "{e:?}");
        // Not strict: the report's path is the plan.
        let lax = decide(
            Location::Gpu(0),
            MemoryEnd::Gpu,
            &gds(),
            &auto(),
            &Policy::default(),
        )
        .unwrap();
        let (plan, n) = finish(&lax, Ok(staged), Location::Gpu(0)).unwrap();
        assert_eq!((plan.path, n), (Path::FileStaged, 1));
    }

    #[test]
    fn storage_errors_map_to_engine_errors() {
        let e = storage_err(StorageError::PathUnavailable {
            path: StoragePath::Gds,
            reason: "no cuFile".into(),
        });
        assert!(
            matches!(&e, Error::Unavailable { path: Some(Path::Gds), why: m } if m == "gds: no cuFile"),
            "{e:?}"
        );
        let e = storage_err(StorageError::InvalidOption("bad chunk".into()));
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    }
}
