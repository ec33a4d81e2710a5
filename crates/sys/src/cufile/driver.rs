//! [`Driver`]: the open cuFile driver (`cuFileDriverOpen`), its properties, and whether it runs
//! true GPUDirect Storage or compatibility mode ([`CufileMode`]).
//!
//! Invariants:
//! - One driver open per process at a time: [`Driver::open`] returns the live one when there
//!   is one; the last clone (and so the last file handle or buffer registration, each holding
//!   one) closes it.
//! - Closing never panics; a failed close is logged.

use super::api::{self, DrvPropsBuf};
use super::{Cufile, CufileError};
use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex, Weak};

/// The open cuFile driver. Cheap to clone; clones share one open.
#[derive(Clone)]
pub struct Driver {
    inner: Arc<Inner>,
}

struct Inner {
    cufile: Cufile,
    properties: Option<DriverProperties>,
    mode: CufileMode,
}

impl fmt::Debug for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Driver")
            .field("library", &self.inner.cufile.path())
            .field("mode", &self.inner.mode)
            .finish()
    }
}

/// The live driver, if any, so that a second open shares it.
static OPEN: Mutex<Weak<Inner>> = Mutex::new(Weak::new());

impl Driver {
    /// Open the cuFile driver (`cuFileDriverOpen`), or share the one already open in this
    /// process, and read its properties (`cuFileDriverGetProperties`). Without the
    /// `nvidia-fs` module this succeeds only where cufile.json allows compatibility mode (the
    /// default); otherwise it fails with `CU_FILE_DRIVER_NOT_INITIALIZED`.
    pub fn open(cufile: &Cufile) -> Result<Driver, CufileError> {
        let mut slot = OPEN.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(inner) = slot.upgrade() {
            return Ok(Driver { inner });
        }
        // SAFETY: the call takes no arguments; the library is loaded for the process lifetime.
        let status = unsafe { (cufile.api().cuFileDriverOpen)() };
        if status.err != api::DRIVER_ALREADY_OPEN {
            CufileError::check(status, || "cuFileDriverOpen".to_string())?;
        }
        let mut buf = DrvPropsBuf::default();
        // SAFETY: `buf` starts with a CUfileDrvProps_t and has spare room after it, so a library
        // writing a longer struct stays inside it.
        let status = unsafe { (cufile.api().cuFileDriverGetProperties)(&mut buf.props) };
        let properties = match CufileError::check(status, || "cuFileDriverGetProperties".into()) {
            Ok(()) => Some(DriverProperties::from_raw(&buf.props)),
            Err(e) => {
                log::warn!("{e}");
                None
            }
        };
        let mode = CufileMode::decide(
            properties.as_ref(),
            nvidia_fs_loaded(Path::new("/")),
            std::env::var("CUFILE_FORCE_COMPAT_MODE").ok().as_deref(),
        );
        log::debug!("cuFile driver open: {mode}");
        let inner = Arc::new(Inner {
            cufile: cufile.clone(),
            properties,
            mode,
        });
        *slot = Arc::downgrade(&inner);
        Ok(Driver { inner })
    }

    /// The library the driver belongs to.
    pub fn cufile(&self) -> &Cufile {
        &self.inner.cufile
    }

    /// The properties `cuFileDriverGetProperties` reported; `None` when the call failed.
    pub fn properties(&self) -> Option<&DriverProperties> {
        self.inner.properties.as_ref()
    }

    /// Whether reads and writes run true GPUDirect Storage or compatibility mode.
    pub fn mode(&self) -> &CufileMode {
        &self.inner.mode
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let api = self.cufile.api();
        let (close, call) = match (api.cuFileDriverClose_v2, api.cuFileDriverClose) {
            (Some(f), _) => (f, "cuFileDriverClose_v2"),
            (None, Some(f)) => (f, "cuFileDriverClose"),
            (None, None) => {
                log::warn!("libcufile exports no cuFileDriverClose: the driver stays open");
                return;
            }
        };
        // Serialise with `Driver::open`: cuFile counts opens and closes (`cuFileUseCount`), so a
        // close that runs after another thread's new open leaves that open in force.
        let _slot = OPEN.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: this value opened the driver, and every handle and registration holds a clone
        // of the Arc around it, so none remains.
        let status = unsafe { close() };
        if let Err(e) = CufileError::check(status, || call.to_string()) {
            log::warn!("{e}");
        }
    }
}

/// What `cuFileDriverGetProperties` reports, in cufile.json's units (sizes in KiB).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverProperties {
    /// nvidia-fs major version; 0 when the module is not loaded.
    pub nvfs_major: u32,
    /// nvidia-fs minor version.
    pub nvfs_minor: u32,
    /// IOs at or above this size poll for completion (when poll mode is on), KiB.
    pub poll_threshold_kib: u64,
    /// Largest single direct IO cuFile issues, KiB.
    pub max_direct_io_kib: u64,
    /// File systems and devices the GDS path supports (`dstatusflags`), e.g. `nvme`.
    pub supported: Vec<&'static str>,
    /// `CU_FILE_USE_POLL_MODE` is set.
    pub poll_mode: bool,
    /// `CU_FILE_ALLOW_COMPAT_MODE` is set: cuFile falls back to compatibility mode where GDS
    /// cannot run.
    pub compat_allowed: bool,
    /// Library features (`fflags`), e.g. `batch-io`, `parallel-io`, `pci-p2pdma`.
    pub features: Vec<&'static str>,
    /// GPU bounce-buffer cache, KiB.
    pub max_device_cache_kib: u32,
    /// Size of one bounce buffer, KiB.
    pub per_buffer_cache_kib: u32,
    /// Most GPU memory cuFile pins for registered buffers, KiB.
    pub max_device_pinned_kib: u32,
}

impl DriverProperties {
    fn from_raw(p: &api::DrvProps) -> Self {
        let bits = |v: u32, table: &[(u32, &'static str)]| {
            table
                .iter()
                .filter(|(bit, _)| v & (1 << bit) != 0)
                .map(|(_, name)| *name)
                .collect::<Vec<_>>()
        };
        DriverProperties {
            nvfs_major: p.nvfs.major_version,
            nvfs_minor: p.nvfs.minor_version,
            poll_threshold_kib: p.nvfs.poll_thresh_size as u64,
            max_direct_io_kib: p.nvfs.max_direct_io_size as u64,
            supported: bits(p.nvfs.dstatusflags, &api::STATUS_FLAGS),
            poll_mode: p.nvfs.dcontrolflags & (1 << api::CONTROL_POLL_MODE) != 0,
            compat_allowed: p.nvfs.dcontrolflags & (1 << api::CONTROL_ALLOW_COMPAT) != 0,
            features: bits(p.fflags, &api::FEATURE_FLAGS),
            max_device_cache_kib: p.max_device_cache_size,
            per_buffer_cache_kib: p.per_buffer_cache_size,
            max_device_pinned_kib: p.max_device_pinned_mem_size,
        }
    }
}

/// How cuFile moves the bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CufileMode {
    /// True GPUDirect Storage: the `nvidia-fs` module sets up DMA between storage and GPU
    /// memory (for file systems it supports; cuFile may still use compatibility mode for
    /// others).
    Gds {
        /// e.g. `nvidia-fs 2.17`.
        detail: String,
    },
    /// Compatibility mode: cuFile reads and writes with POSIX I/O through its own host
    /// bounce buffers and copies to and from the GPU.
    Compat {
        /// Why, e.g. `the nvidia-fs kernel module is not loaded (no /sys/module/nvidia_fs)`.
        reason: String,
    },
}

impl CufileMode {
    /// Decide from the driver properties, whether the `nvidia-fs` module is loaded, and the
    /// `CUFILE_FORCE_COMPAT_MODE` environment variable.
    pub fn decide(
        props: Option<&DriverProperties>,
        nvfs_loaded: bool,
        force_compat: Option<&str>,
    ) -> CufileMode {
        if force_compat.is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1") {
            return CufileMode::Compat {
                reason: "CUFILE_FORCE_COMPAT_MODE is set".to_string(),
            };
        }
        if !nvfs_loaded {
            return CufileMode::Compat {
                reason: "the nvidia-fs kernel module is not loaded (no /sys/module/nvidia_fs)"
                    .to_string(),
            };
        }
        match props {
            Some(p) if p.nvfs_major > 0 || p.nvfs_minor > 0 => CufileMode::Gds {
                detail: format!("nvidia-fs {}.{}", p.nvfs_major, p.nvfs_minor),
            },
            Some(_) => CufileMode::Compat {
                reason: "nvidia-fs is loaded but cuFile reports no nvidia-fs version".to_string(),
            },
            None => CufileMode::Compat {
                reason: "cuFileDriverGetProperties failed, so nvidia-fs use is unconfirmed"
                    .to_string(),
            },
        }
    }

    /// Whether this is true GPUDirect Storage.
    pub fn is_gds(&self) -> bool {
        matches!(self, CufileMode::Gds { .. })
    }
}

impl fmt::Display for CufileMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CufileMode::Gds { detail } => write!(f, "true GPUDirect Storage ({detail})"),
            CufileMode::Compat { reason } => write!(f, "compatibility mode: {reason}"),
        }
    }
}

/// Whether the `nvidia-fs` kernel module is loaded on the machine whose root is `root`:
/// `sys/module/nvidia_fs` exists or `proc/modules` lists `nvidia_fs`.
pub fn nvidia_fs_loaded(root: &Path) -> bool {
    if root.join("sys/module/nvidia_fs").exists() {
        return true;
    }
    std::fs::read_to_string(root.join("proc/modules"))
        .map(|m| {
            m.lines()
                .any(|l| l.split_whitespace().next() == Some("nvidia_fs"))
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(major: u32) -> DriverProperties {
        let mut raw = api::DrvProps::default();
        raw.nvfs.major_version = major;
        raw.nvfs.minor_version = 17;
        raw.nvfs.dstatusflags = (1 << 4) | (1 << 2);
        raw.nvfs.dcontrolflags = 1 << 1;
        raw.fflags = (1 << 1) | (1 << 3);
        raw.nvfs.max_direct_io_size = 16384;
        DriverProperties::from_raw(&raw)
    }

    #[test]
    fn properties_decode_flag_bits() {
        let p = props(2);
        assert_eq!(p.supported, ["nfs", "nvme"]);
        assert!(p.compat_allowed);
        assert!(!p.poll_mode);
        assert_eq!(p.features, ["batch-io", "parallel-io"]);
        assert_eq!(p.max_direct_io_kib, 16384);
    }

    #[test]
    fn mode_is_gds_only_with_nvidia_fs_loaded_and_reported() {
        let m = CufileMode::decide(Some(&props(2)), true, None);
        assert_eq!(
            m,
            CufileMode::Gds {
                detail: "nvidia-fs 2.17".into()
            }
        );
        assert!(m.is_gds());
        let m = CufileMode::decide(Some(&props(2)), false, None);
        assert!(!m.is_gds());
        assert!(
            m.to_string()
                .contains("nvidia-fs kernel module is not loaded"),
            "{m}"
        );
        let m = CufileMode::decide(Some(&props(2)), true, Some("true"));
        assert!(m.to_string().contains("CUFILE_FORCE_COMPAT_MODE"), "{m}");
        let mut p = props(0);
        p.nvfs_minor = 0;
        assert!(!CufileMode::decide(Some(&p), true, None).is_gds());
        assert!(!CufileMode::decide(None, true, Some("false")).is_gds());
    }

    #[test]
    fn nvidia_fs_is_found_in_sysfs_or_proc_modules() {
        let dir = std::env::temp_dir().join(format!("gdx-sys-nvfs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("proc")).unwrap();
        assert!(!nvidia_fs_loaded(&dir));
        std::fs::write(dir.join("proc/modules"), "nvidia_uvm 1 0 - Live 0x0\n").unwrap();
        assert!(!nvidia_fs_loaded(&dir));
        std::fs::write(
            dir.join("proc/modules"),
            "nvidia_uvm 1 0 - Live 0x0\nnvidia_fs 253952 0 - Live 0x0\n",
        )
        .unwrap();
        assert!(nvidia_fs_loaded(&dir));
        std::fs::write(dir.join("proc/modules"), "").unwrap();
        std::fs::create_dir_all(dir.join("sys/module/nvidia_fs")).unwrap();
        assert!(nvidia_fs_loaded(&dir));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
