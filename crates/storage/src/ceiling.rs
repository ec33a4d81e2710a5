//! The hardware ceiling of a copy: the PCIe link of the disk behind a file and of the GPU,
//! read from sysfs; the lower one bounds the copy.
//!
//! The disk is found from the file's device number (`/sys/dev/block/MAJ:MIN`, then up the
//! device tree to the first PCI function with `current_link_speed`). A file on tmpfs or
//! overlayfs has no block device, and a virtio disk has no meaningful link: those are reported
//! as unknown, with the reason, never guessed. Throughput per lane comes from topo's one
//! bandwidth model ([`gdx_topo::bandwidth::pcie_gbps`]).

use crate::error::LinkGap;
use crate::StorageError;
use gdx_topo::sysfs::devices::{block_dev, dev_dir, link_at};
use gdx_topo::sysfs::RootFs;
use gdx_topo::{Link, PciAddr};
use serde::{Serialize, Serializer};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The link of the PCI function in the in-root sysfs folder `dir` (read through topo's sysfs
/// layer, so a captured root's links never lead to this machine's files).
/// Its current link, when both its speed and its width are known and not zero.
fn link_in(fs: &RootFs, dir: &Path) -> Option<Link> {
    let l = link_at(fs, &dir.to_string_lossy()).current;
    let known = l.speed_gts.is_some_and(|g| g > 0.0) && l.width.is_some_and(|w| w > 0);
    known.then_some(l)
}

/// The PCIe link of the GPU at `bus_id` (CUDA's `0000:06:00.0` or NVML's `00000000:06:00.0`)
/// on the machine whose root is `root`.
///
/// # Errors
/// [`StorageError::BusId`] for a bus id that is not a PCI address,
/// [`StorageError::LinkUnknown`] when sysfs shows no link speed for it.
pub fn gpu_link(root: &Path, bus_id: &str) -> Result<Link, StorageError> {
    let id = bus_id.trim().to_ascii_lowercase();
    let id = match id.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 => {
            format!("{}:{rest}", &domain[domain.len() - 4..])
        }
        _ => id,
    };
    let fs = RootFs::new(root);
    let bdf: PciAddr = match id.parse() {
        Ok(b) => b,
        Err(source) => return Err(StorageError::BusId { id, source }),
    };
    let dir = dev_dir(bdf);
    link_in(&fs, Path::new(&dir)).ok_or_else(|| StorageError::LinkUnknown {
        why: LinkGap::NoSpeed { dir: fs.show(&dir) },
        device: id,
    })
}

/// The disk behind `file`: its name and PCIe link.
///
/// # Errors
/// [`StorageError::Stat`] when the file cannot be looked at, [`StorageError::LinkUnknown`]
/// when its disk has no PCIe link to find (tmpfs, virtio, none above it in sysfs).
pub fn disk_link(root: &Path, file: &Path) -> Result<(String, Link), StorageError> {
    let meta = std::fs::metadata(file).map_err(|source| StorageError::Stat {
        path: file.to_path_buf(),
        source,
    })?;
    let dev = if meta.file_type().is_block_device() {
        meta.rdev()
    } else {
        meta.dev()
    };
    let (major, minor) = (rustix::fs::major(dev), rustix::fs::minor(dev));
    if major == 0 {
        return Err(StorageError::LinkUnknown {
            device: file.display().to_string(),
            why: LinkGap::NoBlockDevice { major, minor },
        });
    }
    let fs = RootFs::new(root);
    let link = block_dev(major, minor);
    let dir = fs.resolve(&link).ok_or_else(|| StorageError::LinkUnknown {
        device: fs.show(&link),
        why: LinkGap::NotFound,
    })?;
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| format!("{major}:{minor}"));
    let devices = Path::new("sys/devices");
    let mut at: Option<PathBuf> = Some(dir.clone());
    while let Some(d) = at {
        if !d.starts_with(devices) {
            break;
        }
        if d.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("virtio"))
        {
            return Err(StorageError::LinkUnknown {
                device: name,
                why: LinkGap::Virtio,
            });
        }
        if let Some(l) = link_in(&fs, &d) {
            return Ok((name, l));
        }
        at = d.parent().map(Path::to_path_buf);
    }
    Err(StorageError::LinkUnknown {
        device: name,
        why: LinkGap::NoneAbove {
            dir: fs.show(&dir.to_string_lossy()),
        },
    })
}

/// A link lookup serialised as before errors were typed: `{"Ok": link}` or `{"Err": "why"}`.
fn disk_as_text<S: Serializer>(
    r: &Result<(String, Link), Arc<StorageError>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    r.as_ref().map_err(|e| e.to_string()).serialize(s)
}

/// [`disk_as_text`] for the GPU's link.
fn gpu_as_text<S: Serializer>(
    r: &Option<Result<Link, Arc<StorageError>>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    r.as_ref()
        .map(|r| r.as_ref().map_err(|e| e.to_string()))
        .serialize(s)
}

/// The ceiling of a copy between `file` and, when given, the GPU at `gpu_bus_id`: the lower
/// of two links, each known or with why not (not a [`gdx_topo::ceiling::Ceiling`], which is
/// one known figure).
#[derive(Debug, Clone, Serialize)]
pub struct CopyCeiling {
    /// The lower of the known links, GB/s; `None` when neither is known.
    pub gbps: Option<f64>,
    /// Which bounds it: `disk` or `pcie`; `None` when unknown.
    pub bound: Option<&'static str>,
    /// The disk's link, or why it is unknown (shared, so that the ceiling stays cloneable).
    #[serde(serialize_with = "disk_as_text")]
    pub disk: Result<(String, Link), Arc<StorageError>>,
    /// The GPU's link, or why it is unknown; `None` for host-memory copies.
    #[serde(serialize_with = "gpu_as_text")]
    pub gpu: Option<Result<Link, Arc<StorageError>>>,
}

impl CopyCeiling {
    /// Look both links up on this machine.
    pub fn find(file: &Path, gpu_bus_id: Option<&str>) -> CopyCeiling {
        CopyCeiling::from_links(
            disk_link(Path::new("/"), file).map_err(Arc::new),
            gpu_bus_id.map(|id| gpu_link(Path::new("/"), id).map_err(Arc::new)),
        )
    }

    /// The ceiling from the two links.
    pub fn from_links(
        disk: Result<(String, Link), Arc<StorageError>>,
        gpu: Option<Result<Link, Arc<StorageError>>>,
    ) -> CopyCeiling {
        let d = disk.as_ref().ok().and_then(|(_, l)| l.raw_gbps());
        let g = gpu
            .as_ref()
            .and_then(|g| g.as_ref().ok())
            .and_then(Link::raw_gbps);
        let (gbps, bound) = match (d, g) {
            (Some(d), Some(g)) if d <= g => (Some(d), Some("disk")),
            (Some(_), Some(g)) => (Some(g), Some("pcie")),
            (Some(d), None) => (Some(d), Some("disk")),
            (None, Some(g)) => (Some(g), Some("pcie")),
            (None, None) => (None, None),
        };
        CopyCeiling {
            gbps,
            bound,
            disk,
            gpu,
        }
    }

    /// One line: `63.02 GB/s, bound by the GPU's PCIe Gen5 x16 (63.02 GB/s); disk: unknown (...)`.
    pub fn describe(&self) -> String {
        let disk = match &self.disk {
            Ok((name, l)) => format!("disk {name}: {l}"),
            Err(why) => format!("disk link unknown: {why}"),
        };
        let gpu = match &self.gpu {
            Some(Ok(l)) => Some(format!("GPU: {l}")),
            Some(Err(why)) => Some(format!("GPU link unknown: {why}")),
            None => None,
        };
        let parts = match gpu {
            Some(g) => format!("{g}; {disk}"),
            None => disk,
        };
        match (self.gbps, self.bound) {
            (Some(v), Some(b)) => format!("{v:.2} GB/s ({b}); {parts}"),
            _ => format!("unknown; {parts}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(gts: f64, width: u32) -> Link {
        Link {
            speed_gts: Some(gts),
            width: Some(width),
        }
    }

    #[test]
    fn unknown_or_zero_links_are_no_links() {
        let root = tempfile::tempdir().unwrap();
        let dev = root.path().join("sys/bus/pci/devices/0000:06:00.0");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("current_link_speed"), "Unknown\n").unwrap();
        std::fs::write(dev.join("current_link_width"), "16\n").unwrap();
        assert!(gpu_link(root.path(), "0000:06:00.0").is_err());
        std::fs::write(dev.join("current_link_speed"), "5.0 GT/s PCIe\n").unwrap();
        std::fs::write(dev.join("current_link_width"), "0\n").unwrap();
        assert!(gpu_link(root.path(), "0000:06:00.0").is_err());
        std::fs::write(dev.join("current_link_width"), "4\n").unwrap();
        let l = gpu_link(root.path(), "0000:06:00.0").unwrap();
        assert!((l.raw_gbps().unwrap() - 2.0).abs() < 1e-9);
        assert_eq!(l.to_string(), "PCIe Gen2 x4 (2.00 GB/s)");
    }

    #[test]
    fn gpu_links_come_from_sysfs_by_bus_id() {
        let root = tempfile::tempdir().unwrap();
        let dev = root.path().join("sys/bus/pci/devices/0000:06:00.0");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("current_link_speed"), "32.0 GT/s PCIe\n").unwrap();
        std::fs::write(dev.join("current_link_width"), "16\n").unwrap();
        assert_eq!(
            gpu_link(root.path(), "00000000:06:00.0").unwrap().width,
            Some(16)
        );
        assert_eq!(
            gpu_link(root.path(), "0000:06:00.0").unwrap().generation(),
            Some(5)
        );
        assert!(gpu_link(root.path(), "0000:07:00.0").is_err());
    }

    #[test]
    fn an_absolute_link_in_a_captured_root_is_followed_inside_it() {
        // As a careless copy leaves it: `/sys/devices/...`, which must not reach this
        // machine's own sysfs (where that function does not exist).
        let root = tempfile::tempdir().unwrap();
        let real = root
            .path()
            .join("sys/devices/pci0000:00/0000:00:01.0/0000:66:00.0");
        std::fs::create_dir_all(&real).unwrap();
        std::fs::write(real.join("current_link_speed"), "16.0 GT/s PCIe\n").unwrap();
        std::fs::write(real.join("current_link_width"), "8\n").unwrap();
        std::fs::create_dir_all(root.path().join("sys/bus/pci/devices")).unwrap();
        std::os::unix::fs::symlink(
            "/sys/devices/pci0000:00/0000:00:01.0/0000:66:00.0",
            root.path().join("sys/bus/pci/devices/0000:66:00.0"),
        )
        .unwrap();
        let l = gpu_link(root.path(), "0000:66:00.0").unwrap();
        assert_eq!((l.generation(), l.width), (Some(4), Some(8)));
        assert!(gpu_link(root.path(), "not-a-bdf").is_err());
    }

    #[test]
    fn the_lower_link_bounds_and_unknowns_are_said() {
        let (gen5, gen4x4) = (link(32.0, 16), link(16.0, 4));
        let c = CopyCeiling::from_links(Ok(("nvme0n1".into(), gen4x4)), Some(Ok(gen5)));
        assert_eq!(c.bound, Some("disk"));
        assert!((c.gbps.unwrap() - gen4x4.raw_gbps().unwrap()).abs() < 1e-9);
        let c = CopyCeiling::from_links(Err(unknown("vda", LinkGap::Virtio)), Some(Ok(gen5)));
        assert_eq!(c.bound, Some("pcie"));
        assert!(
            c.describe()
                .contains("disk link unknown: vda is a virtio disk"),
            "{}",
            c.describe()
        );
        let c = CopyCeiling::from_links(
            Err(unknown(
                "/tmp/x",
                LinkGap::NoBlockDevice {
                    major: 0,
                    minor: 42,
                },
            )),
            None,
        );
        // Serialised as it was when the reasons were strings.
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(
            v["disk"],
            serde_json::json!({"Err": "/tmp/x is on a file system without a block device (device 0:42, e.g. tmpfs or overlayfs)"})
        );
        assert_eq!(v["gpu"], serde_json::Value::Null);
        assert_eq!(c.gbps, None);
        assert!(c.describe().starts_with("unknown; "));
    }

    fn unknown(device: &str, why: LinkGap) -> Arc<StorageError> {
        Arc::new(StorageError::LinkUnknown {
            device: device.into(),
            why,
        })
    }

    #[test]
    fn a_bus_id_that_is_no_pci_address_keeps_the_parse_error() {
        let root = tempfile::tempdir().unwrap();
        let e = gpu_link(root.path(), "GPU-7").unwrap_err();
        assert!(matches!(e, StorageError::BusId { .. }), "{e}");
        assert!(std::error::Error::source(&e).is_some());
        assert!(
            e.to_string()
                .starts_with("GPU bus id gpu-7 is not a PCI address: "),
            "{e}"
        );
    }

    #[test]
    fn this_machine_disk_is_found_or_explained() {
        let exe = std::env::current_exe().unwrap();
        match disk_link(Path::new("/"), &exe) {
            Ok((name, l)) => eprintln!("{name}: {l}"),
            Err(why) => {
                eprintln!("{why}");
                assert!(!why.to_string().is_empty());
            }
        }
    }
}
