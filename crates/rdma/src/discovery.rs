//! Discovery: the RDMA devices libibverbs lists, with ports (state, link layer, active MTU,
//! rate) and GID tables (types, IPv4-mapped addresses), or a typed "unavailable" with the
//! reason. No libibverbs, and a device list that fails with `ENOSYS` / `EOPNOTSUPP` (a kernel
//! without RDMA), both mean "no RDMA here", never an error or a panic.
//!
//! When libibverbs lists nothing, [`explain_none`] looks at sysfs (under any `--root`) to say
//! why: no RDMA device in the kernel at all, or kernel devices that libibverbs cannot see (a
//! missing provider library, or `/dev/infiniband` not visible in a container).

use gdx_sys::verbs::{self, VerbsDevice};
use gdx_sys::Unavailable;
use gdx_topo::sysfs::devices::RDMA_CLASS;
use gdx_topo::sysfs::RootFs;
use serde::Serialize;
use std::fmt;
use std::path::Path;

/// Why there is no RDMA here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum UnavailableKind {
    /// libibverbs is not installed or cannot be loaded.
    NoLibrary,
    /// libibverbs loads but lists no device.
    NoDevices,
    /// Listing the devices failed for another reason.
    ListFailed,
}

impl fmt::Display for UnavailableKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UnavailableKind::NoLibrary => "no libibverbs",
            UnavailableKind::NoDevices => "no RDMA device",
            UnavailableKind::ListFailed => "RDMA device listing failed",
        })
    }
}

/// No RDMA on this machine, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[error("{kind}: {reason}")]
pub struct RdmaUnavailable {
    /// The kind.
    pub kind: UnavailableKind,
    /// Why, in words, with what to do.
    pub reason: String,
}

/// RDMA devices of the running machine through the real libibverbs; explanations read from
/// `/sys`.
pub fn discover() -> Result<Vec<VerbsDevice>, RdmaUnavailable> {
    classify(verbs::devices(), Path::new("/"))
}

/// Turn libibverbs' answer into devices or a typed unavailable, explaining an empty list from
/// sysfs under `root`.
pub fn classify(
    listing: Result<Vec<VerbsDevice>, Unavailable>,
    root: &Path,
) -> Result<Vec<VerbsDevice>, RdmaUnavailable> {
    match listing {
        Ok(devs) if !devs.is_empty() => Ok(devs),
        Ok(_) => Err(RdmaUnavailable {
            kind: UnavailableKind::NoDevices,
            reason: explain_none(root),
        }),
        Err(u) if u.reason.contains("ibv_get_device_list failed") => Err(RdmaUnavailable {
            kind: UnavailableKind::ListFailed,
            reason: u.to_string(),
        }),
        Err(u) => Err(RdmaUnavailable {
            kind: UnavailableKind::NoLibrary,
            reason: format!(
                "{u} (install rdma-core's libibverbs1 and ibverbs-providers, or MOFED/DOCA)"
            ),
        }),
    }
}

/// Names in an in-root folder, sorted; empty when it is absent or unreadable. Read through
/// topo's sysfs layer, so a capture's absolute links stay inside the capture.
fn list_dir(root: &Path, rel: &str) -> Vec<String> {
    RootFs::new(root).list(rel).unwrap_or_default()
}

/// The RDMA devices the kernel lists under `root` (`sys/class/infiniband`), sorted.
pub fn kernel_devices(root: &Path) -> Vec<String> {
    list_dir(root, RDMA_CLASS)
}

/// Why the kernel under `root` has no RDMA device, from its loaded modules: "the kernel has
/// none (...); this kernel has no RDMA stack loaded" and the like. Meant for a root whose
/// [`kernel_devices`] is empty; works on a captured `--root`.
pub fn explain_no_kernel_device(root: &Path) -> String {
    let fs = RootFs::new(root);
    let ib_core = fs.exists("sys/module/ib_core");
    let mlx = fs.exists("sys/module/mlx5_ib") || fs.exists("sys/module/mlx5_core");
    let mut s = String::from("the kernel has none (sys/class/infiniband is empty or absent)");
    if mlx {
        s.push_str("; mlx5 modules are loaded, but no RDMA function is bound to them");
    } else if ib_core {
        s.push_str("; ib_core is loaded, but no RDMA driver has registered a device");
    } else {
        s.push_str("; this kernel has no RDMA stack loaded");
    }
    s
}

/// Why libibverbs lists no device, from sysfs and `/dev` under `root`.
pub fn explain_none(root: &Path) -> String {
    let kernel = kernel_devices(root);
    if kernel.is_empty() {
        return format!(
            "libibverbs lists no devices and {}",
            explain_no_kernel_device(root)
        );
    }
    let uverbs = list_dir(root, "dev/infiniband")
        .into_iter()
        .any(|n| n.starts_with("uverbs"));
    let mut s = format!(
        "the kernel has RDMA device(s) {} but libibverbs lists none",
        kernel.join(", ")
    );
    if !uverbs {
        s.push_str(
            ": /dev/infiniband/uverbs* is missing (in a container, pass the devices through, e.g. --device /dev/infiniband)",
        );
    } else {
        s.push_str(
            ": the user-space provider for them is missing (install ibverbs-providers / rdma-core, or MOFED/DOCA)",
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_library_is_typed_and_says_what_to_install() {
        let u = Unavailable::new("libibverbs.so.1", "tried 1 candidate(s); not found");
        let e = classify(Err(u), Path::new("/nonexistent")).unwrap_err();
        assert_eq!(e.kind, UnavailableKind::NoLibrary);
        assert!(e.reason.contains("libibverbs1"), "{e}");
    }

    #[test]
    fn a_failed_listing_is_not_called_missing() {
        let u = Unavailable::new(
            "libibverbs.so.1",
            "ibv_get_device_list failed: Permission denied",
        );
        let e = classify(Err(u), Path::new("/nonexistent")).unwrap_err();
        assert_eq!(e.kind, UnavailableKind::ListFailed);
    }

    #[test]
    fn empty_listing_on_a_machine_without_rdma() {
        let dir = tempfile::tempdir().unwrap();
        let e = classify(Ok(vec![]), dir.path()).unwrap_err();
        assert_eq!(e.kind, UnavailableKind::NoDevices);
        assert!(e.reason.contains("no RDMA stack"), "{e}");
        assert_eq!(e.to_string().split(':').next(), Some("no RDMA device"));
    }

    #[test]
    fn mlx5_loaded_without_devices_is_explained() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("sys/module/mlx5_core")).unwrap();
        let e = classify(Ok(vec![]), dir.path()).unwrap_err();
        assert!(e.reason.contains("mlx5 modules are loaded"), "{e}");
    }

    #[test]
    fn kernel_devices_without_provider_or_dev_nodes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("sys/class/infiniband/mlx5_0")).unwrap();
        let e = classify(Ok(vec![]), dir.path()).unwrap_err();
        assert!(
            e.reason.contains("mlx5_0") && e.reason.contains("/dev/infiniband"),
            "{e}"
        );
        std::fs::create_dir_all(dir.path().join("dev/infiniband")).unwrap();
        std::fs::write(dir.path().join("dev/infiniband/uverbs0"), "").unwrap();
        let e = classify(Ok(vec![]), dir.path()).unwrap_err();
        assert!(e.reason.contains("provider"), "{e}");
    }
}
