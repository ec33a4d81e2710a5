//! The planner: GDS (cuFile) or the staged pipeline, with the reason.
//!
//! | asked | GPU memory | host memory |
//! |---|---|---|
//! | auto | `gds` when cuFile runs true GPUDirect Storage; else `file-staged`, saying why (cuFile missing, or only in compatibility mode) | `file-staged` |
//! | gds | `gds` (in whatever mode cuFile runs, reported), or an error when cuFile cannot run | an error: cuFile moves GPU memory |
//! | file-staged, buffered | as asked | as asked |
//!
//! Why auto passes over cuFile's compatibility mode: there cuFile itself reads into host bounce
//! buffers with POSIX I/O and copies them to the GPU, which is what `file-staged` does, while
//! gdx's pipeline keeps [`crate::CopyOptions::depth`] reads in flight overlapped with the
//! copies. `gdx bench --path file` measures both, so the choice can be checked on each machine.

use crate::{PathChoice, StorageError, StoragePath};
use gdx_sys::cufile::{Cufile, CufileMode, Driver};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// The memory end of a copy between a file and memory (not an "endpoint": that word is a
/// transport's own, `docs/architecture.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryEnd {
    /// GPU memory.
    Gpu,
    /// Host memory.
    Host,
}

/// What the planner knows about cuFile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CufileStatus {
    /// Not looked at (the copy cannot use it).
    NotNeeded,
    /// Missing or unusable, and why.
    Unavailable(String),
    /// The driver opened, in this mode.
    Available(CufileMode),
}

/// The planner's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The path to take.
    pub path: StoragePath,
    /// Why, in a sentence.
    pub reason: String,
}

/// Whether [`cufile_status`] keeps the driver it opens open for the rest of the process.
static KEEP_OPEN: AtomicBool = AtomicBool::new(false);
/// The driver kept open (a clone; [`Driver::open`] shares the live one).
static KEPT: Mutex<Option<Driver>> = Mutex::new(None);

/// From now on, keep the cuFile driver that [`cufile_status`] opens open until the process
/// exits, instead of closing it when the last copy using it ends. For a process that makes many
/// copies (the Python binding, a checkpoint of many shards): `cuFileDriverOpen` and its close
/// cost a few hundred milliseconds each time, which a long-lived process pays once.
pub fn keep_cufile_open() {
    KEEP_OPEN.store(true, Ordering::Relaxed);
}

/// Load cuFile and open its driver: the status for [`plan`], and the open driver.
pub fn cufile_status() -> (CufileStatus, Option<Driver>) {
    let cufile = match Cufile::load() {
        Ok(c) => c,
        Err(e) => return (CufileStatus::Unavailable(e.to_string()), None),
    };
    match Driver::open(&cufile) {
        Ok(d) => {
            if KEEP_OPEN.load(Ordering::Relaxed) {
                KEPT.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert_with(|| d.clone());
            }
            (CufileStatus::Available(d.mode().clone()), Some(d))
        }
        Err(e) => (
            CufileStatus::Unavailable(format!("{} loaded, but {e}", cufile.path())),
            None,
        ),
    }
}

/// [`cufile_status`] for an automatic choice: without the `nvidia-fs` kernel module cuFile can
/// only run in compatibility mode, which stages through host buffers as gdx's O_DIRECT pipeline
/// does, so the plan cannot be `gds` and the driver is not opened at all (`cuFileDriverOpen`
/// costs 0.4-0.5 s on an H100 machine, a third of a cold 4 GiB load). `GDX_CUFILE_PROBE=1` opens
/// it anyway (cuFile builds that reach GPUDirect without nvidia-fs, through P2PDMA).
pub fn cufile_status_for_auto() -> (CufileStatus, Option<Driver>) {
    let forced = std::env::var("GDX_CUFILE_PROBE").is_ok_and(|v| v == "1");
    if !forced && !std::path::Path::new("/sys/module/nvidia_fs").exists() {
        return (
            CufileStatus::Unavailable(
                "the nvidia-fs kernel module is not loaded (no /sys/module/nvidia_fs), so cuFile \
                 could only run in compatibility mode, staging through host buffers as gdx's \
                 pipeline does; its driver was not opened (GDX_CUFILE_PROBE=1 opens it)"
                    .into(),
            ),
            None,
        );
    }
    cufile_status()
}

/// Choose the path for a copy between a file and `memory` (see the module docs).
pub fn plan(
    choice: PathChoice,
    memory: MemoryEnd,
    cufile: &CufileStatus,
) -> Result<Plan, StorageError> {
    let plan = |path, reason: String| Ok(Plan { path, reason });
    match (choice, memory) {
        (PathChoice::Buffered, _) => plan(
            StoragePath::Buffered,
            "buffered I/O through the page cache was asked for".to_string(),
        ),
        (PathChoice::FileStaged, _) => plan(
            StoragePath::FileStaged,
            "the O_DIRECT staged pipeline was asked for".to_string(),
        ),
        (PathChoice::Gds, MemoryEnd::Host) => Err(StorageError::PathUnavailable {
            path: StoragePath::Gds,
            reason: "cuFile moves GPU memory; host memory takes file-staged or buffered"
                .to_string(),
        }),
        (PathChoice::Auto, MemoryEnd::Host) => plan(
            StoragePath::FileStaged,
            "host memory: the O_DIRECT staged pipeline without the GPU step".to_string(),
        ),
        (PathChoice::Gds, MemoryEnd::Gpu) => match cufile {
            CufileStatus::Available(mode) => plan(
                StoragePath::Gds,
                format!("cuFile was asked for; it runs {mode}"),
            ),
            CufileStatus::Unavailable(why) => Err(StorageError::PathUnavailable {
                path: StoragePath::Gds,
                reason: why.clone(),
            }),
            CufileStatus::NotNeeded => Err(StorageError::PathUnavailable {
                path: StoragePath::Gds,
                reason: "cuFile was not loaded".to_string(),
            }),
        },
        (PathChoice::Auto, MemoryEnd::Gpu) => match cufile {
            CufileStatus::Available(mode @ CufileMode::Gds { .. }) => {
                plan(StoragePath::Gds, format!("cuFile runs {mode}"))
            }
            CufileStatus::Available(CufileMode::Compat { reason }) => plan(
                StoragePath::FileStaged,
                format!(
                    "cuFile is present but only in compatibility mode ({reason}), where it \
                     stages through host buffers too; gdx's pipeline keeps several reads in \
                     flight (--path gds uses cuFile anyway)"
                ),
            ),
            CufileStatus::Unavailable(why) => plan(
                StoragePath::FileStaged,
                format!("cuFile cannot run ({why})"),
            ),
            CufileStatus::NotNeeded => plan(
                StoragePath::FileStaged,
                "cuFile was not looked at".to_string(),
            ),
        },
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

    #[test]
    fn auto_takes_gds_only_when_cufile_runs_true_gds() {
        let p = plan(PathChoice::Auto, MemoryEnd::Gpu, &gds()).unwrap();
        assert_eq!(p.path, StoragePath::Gds);
        assert!(
            p.reason.contains("true GPUDirect Storage (nvidia-fs 2.17)"),
            "{}",
            p.reason
        );

        let p = plan(PathChoice::Auto, MemoryEnd::Gpu, &compat()).unwrap();
        assert_eq!(p.path, StoragePath::FileStaged);
        assert!(p.reason.contains("compatibility mode"), "{}", p.reason);
        assert!(
            p.reason.contains("nvidia-fs kernel module is not loaded"),
            "{}",
            p.reason
        );

        let missing = CufileStatus::Unavailable("libcufile.so.0 unavailable: not found".into());
        let p = plan(PathChoice::Auto, MemoryEnd::Gpu, &missing).unwrap();
        assert_eq!(p.path, StoragePath::FileStaged);
        assert!(
            p.reason.contains("libcufile.so.0 unavailable"),
            "{}",
            p.reason
        );
    }

    #[test]
    fn asking_for_gds_runs_it_in_either_mode_or_fails_with_the_reason() {
        let p = plan(PathChoice::Gds, MemoryEnd::Gpu, &compat()).unwrap();
        assert_eq!(p.path, StoragePath::Gds);
        assert!(p.reason.contains("compatibility mode"), "{}", p.reason);
        let missing = CufileStatus::Unavailable("libcufile.so.0 unavailable: not found".into());
        let e = plan(PathChoice::Gds, MemoryEnd::Gpu, &missing).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the gds path is unavailable: libcufile.so.0 unavailable: not found"
        );
        let e = plan(PathChoice::Gds, MemoryEnd::Host, &gds()).unwrap_err();
        assert!(e.to_string().contains("cuFile moves GPU memory"), "{e}");
    }

    #[test]
    fn host_memory_and_explicit_choices() {
        let none = CufileStatus::NotNeeded;
        let p = plan(PathChoice::Auto, MemoryEnd::Host, &none).unwrap();
        assert_eq!(p.path, StoragePath::FileStaged);
        let p = plan(PathChoice::Buffered, MemoryEnd::Gpu, &gds()).unwrap();
        assert_eq!(p.path, StoragePath::Buffered);
        assert!(p.reason.contains("asked for"));
        let p = plan(PathChoice::FileStaged, MemoryEnd::Gpu, &gds()).unwrap();
        assert_eq!(p.path, StoragePath::FileStaged);
    }

    #[test]
    fn live_status_is_available_or_explained() {
        match cufile_status() {
            (CufileStatus::Available(mode), Some(d)) => {
                eprintln!("cuFile: {mode}; {:?}", d.properties());
            }
            (CufileStatus::Unavailable(why), None) => assert!(!why.is_empty()),
            other => panic!("inconsistent status {other:?}"),
        }
    }
}
