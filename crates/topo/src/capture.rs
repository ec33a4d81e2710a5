//! `gdx topo --capture`: copy every sysfs/proc file gdx reads (for the topology and for the
//! doctor's checks) into a folder or a `.tar.gz`, so that another machine can analyse this one
//! with `--root` and get the same model.
//!
//! Files are written at their *real* paths (`sys/devices/pci0000:00/...`) and the kernel's
//! links (`sys/bus/pci/devices/*`, `sys/class/{infiniband,net,iommu}/*`, `device`, `driver`,
//! `iommu_group`) are recreated as *relative* links, so the copy resolves the same way under
//! any root. Only files are read, never written, and never the ones with side effects or no
//! end (`resource*`, `rom`, `remove`, `rescan`, `reset`): the copy is an allowlist. Unreadable
//! files (an unprivileged `config` is cut to 64 bytes, a down link has no `speed`) are listed in
//! [`CaptureSummary::skipped`], never fatal.
//!
//! The capture also records the `NCCL_*`, `GDX_*` and `CUDA_*` variables of the capturing
//! shell as `gdx/env.json` ([`ENV_PATH`]): they decide which paths NCCL and gdx take on that
//! machine, so `gdx doctor --root` judges those, never the analysing shell's.

use crate::sysfs::archive::{is_tarball_name, open_root, Require};
use crate::sysfs::rootfs::{relative_path, ReadError, RootFs, MAX_FILE_BYTES};
use crate::TopoError;

mod fabric;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Where a capture records the environment of the shell that made it.
pub const ENV_PATH: &str = "gdx/env.json";

/// Prefixes of the variables a capture records.
pub const ENV_PREFIXES: [&str; 3] = ["NCCL_", "GDX_", "CUDA_"];

/// Name parts of variables recorded by name only, value left out: a capture is shared.
const SECRET_PARTS: [&str; 4] = ["SECRET", "TOKEN", "PASSWORD", "KEY"];

/// The environment a capture recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CapturedEnv {
    /// `NCCL_*`/`GDX_*`/`CUDA_*` variables and their values.
    pub vars: BTreeMap<String, String>,
    /// Variables that were set but whose values look secret and were not recorded.
    #[serde(default)]
    pub redacted: Vec<String>,
}

impl CapturedEnv {
    /// The variables of `vars` a capture records (see [`ENV_PREFIXES`]).
    pub fn from_vars(vars: impl IntoIterator<Item = (String, String)>) -> CapturedEnv {
        let mut out = CapturedEnv::default();
        for (k, v) in vars {
            if !ENV_PREFIXES.iter().any(|p| k.starts_with(p)) {
                continue;
            }
            if SECRET_PARTS.iter().any(|s| k.contains(s)) {
                out.redacted.push(k);
            } else {
                out.vars.insert(k, v);
            }
        }
        out.redacted.sort();
        out
    }
}

/// The environment recorded in the capture under `dir` (an opened root's folder); `Ok(None)`
/// for a capture made before gdx recorded it, or a folder that is no capture.
///
/// # Errors
/// [`TopoError::Io`] when the file exists but cannot be read; [`TopoError::CaptureFile`] when it
/// is not the JSON a capture writes.
pub fn read_captured_env(dir: &Path) -> Result<Option<CapturedEnv>, TopoError> {
    let fs = RootFs::new(dir);
    match fs.read(Path::new(ENV_PATH)) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| TopoError::CaptureFile {
                path: PathBuf::from(ENV_PATH),
                message: e.to_string(),
            }),
        Err(ReadError::Missing) => Ok(None),
        Err(e) => Err(TopoError::io(ENV_PATH, std::io::Error::other(e.why()))),
    }
}

/// What a capture wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureSummary {
    /// The folder or `.tar.gz` written.
    pub out: PathBuf,
    /// Regular files written.
    pub files: usize,
    /// Symlinks written.
    pub links: usize,
    /// Files that exist but could not be read, as `path: why` (attributes the kernel says have
    /// no value now, like `speed` of a link that is down, are left out silently).
    pub skipped: Vec<String>,
}

/// Attribute files copied for every PCI function (bridges included).
const PCI_ATTRS: &[&str] = &[
    "class",
    "vendor",
    "device",
    "subsystem_vendor",
    "subsystem_device",
    "revision",
    "numa_node",
    "local_cpulist",
    "current_link_speed",
    "current_link_width",
    "max_link_speed",
    "max_link_width",
    "config",
    "reset_method",
    "power_state",
    "aer_dev_correctable",
    "aer_dev_nonfatal",
    "aer_dev_fatal",
    "sriov_numvfs",
    "sriov_totalvfs",
];
/// Links kept for every PCI function (their targets are recreated as empty folders).
const PCI_LINKS: &[&str] = &["driver", "iommu_group", "physfn"];
const RDMA_ATTRS: &[&str] = &[
    "node_type",
    "node_guid",
    "sys_image_guid",
    "fw_ver",
    "hca_type",
    "board_id",
    "node_desc",
];
const PORT_ATTRS: &[&str] = &[
    "state",
    "phys_state",
    "link_layer",
    "rate",
    "lid",
    "sm_lid",
    "lid_mask_count",
    "cap_mask",
];
const NET_ATTRS: &[&str] = &[
    "mtu",
    "speed",
    "operstate",
    "address",
    "carrier",
    "duplex",
    "type",
];
const PROC_FILES: &[&str] = &[
    "proc/cmdline",
    "proc/modules",
    "proc/self/limits",
    "proc/version",
    "proc/sys/kernel/osrelease",
    "proc/sys/kernel/hostname",
    "proc/driver/nvidia/version",
    "proc/driver/nvidia/params",
];
/// Kernel modules whose presence, version and parameters the doctor checks.
const MODULES: &[&str] = &[
    "nvidia",
    "nvidia_uvm",
    "nvidia_peermem",
    "nv_peer_mem",
    "nvidia_fs",
    "ib_core",
    "ib_uverbs",
    "mlx5_core",
    "mlx5_ib",
];
const MODULE_ATTRS: &[&str] = &["version", "refcnt", "initstate", "srcversion"];

/// Names never opened, even inside folders copied whole: reading them maps device memory,
/// has side effects, or they are write-only triggers.
fn forbidden(name: &str) -> bool {
    name.starts_with("resource") || matches!(name, "rom" | "remove" | "rescan" | "reset")
}

/// Copy what gdx reads from the tree under `root` (`/` = this machine; a capture folder or
/// `.tar.gz` also works) into `out`: a new or empty folder, or a `.tar.gz`/`.tgz` file when
/// the name ends so. On the live machine the NVML facts are stored as `gdx/nvml.json` when
/// NVML loads. `from_root(out)` then builds the same model as `from_root(root)`.
///
/// # Errors
/// The errors of [`crate::from_root`] for `root`; [`TopoError::Io`] when `out` exists and is
/// not an empty folder, or cannot be written.
pub fn capture(root: &Path, out: &Path) -> Result<CaptureSummary, TopoError> {
    let opened = open_root(root, Require::PciTree)?;
    let fs = RootFs::new(opened.dir());
    let live = std::fs::canonicalize(root).is_ok_and(|p| p == Path::new("/"));
    if is_tarball_name(out) {
        let tmp = tempfile::Builder::new()
            .prefix("gdx-capture-")
            .tempdir()
            .map_err(|e| TopoError::io(std::env::temp_dir(), e))?;
        // Registered like an unpacked root, so SIGINT/SIGTERM removes it too.
        let tmp = crate::sysfs::archive::TempFolder::new(tmp);
        let mut c = Copier::new(&fs, tmp.path());
        c.run(root, live)?;
        write_tarball(tmp.path(), out)?;
        Ok(c.summary(out))
    } else {
        prepare_folder(out)?;
        let mut c = Copier::new(&fs, out);
        c.run(root, live)?;
        Ok(c.summary(out))
    }
}

fn prepare_folder(out: &Path) -> Result<(), TopoError> {
    match std::fs::read_dir(out) {
        Ok(mut rd) => {
            if rd.next().is_some() {
                return Err(TopoError::io(
                    out,
                    std::io::Error::new(
                        std::io::ErrorKind::AlreadyExists,
                        "output folder exists and is not empty",
                    ),
                ));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(out).map_err(|e| TopoError::io(out, e))
        }
        Err(e) => Err(TopoError::io(out, e)),
    }
}

/// Copies files and links from a root into an output folder.
struct Copier<'a> {
    fs: &'a RootFs,
    out: PathBuf,
    files: usize,
    links: usize,
    skipped: Vec<String>,
}

impl<'a> Copier<'a> {
    fn new(fs: &'a RootFs, out: &Path) -> Copier<'a> {
        Copier {
            fs,
            out: out.to_path_buf(),
            files: 0,
            links: 0,
            skipped: Vec::new(),
        }
    }

    fn summary(&self, out: &Path) -> CaptureSummary {
        CaptureSummary {
            out: out.to_path_buf(),
            files: self.files,
            links: self.links,
            skipped: self.skipped.clone(),
        }
    }

    fn run(&mut self, root: &Path, live: bool) -> Result<(), TopoError> {
        self.pci()?;
        self.rdma()?;
        self.net()?;
        self.iommu()?;
        self.numa()?;
        self.proc()?;
        self.modules()?;
        self.copy_tree(Path::new("sys/kernel/mm/memory_peers"), 3)?;
        self.fabric(live)?;
        if live {
            let env = CapturedEnv::from_vars(std::env::vars());
            let text = serde_json::to_string_pretty(&env).unwrap_or_default();
            self.write(Path::new(ENV_PATH), text.as_bytes())?;
            if let Ok(snap) = crate::enrich::live_snapshot() {
                if let Ok(text) = serde_json::to_string_pretty(&snap) {
                    self.write(Path::new(crate::enrich::SNAPSHOT_PATH), text.as_bytes())?;
                }
            }
        } else {
            // A capture of a capture keeps the snapshot and the environment it was given:
            // this shell's variables say nothing about that machine.
            self.copy(
                Path::new(crate::enrich::SNAPSHOT_PATH),
                Path::new(crate::enrich::SNAPSHOT_PATH),
            )?;
            self.copy(Path::new(ENV_PATH), Path::new(ENV_PATH))?;
        }
        let manifest = serde_json::json!({
            "gdx_version": env!("CARGO_PKG_VERSION"),
            "captured_from": root.display().to_string(),
            "files": self.files,
            "skipped": self.skipped,
        });
        let text = serde_json::to_string_pretty(&manifest).unwrap_or_default();
        self.write(Path::new("gdx/capture.json"), text.as_bytes())
    }

    fn list(&self, dir: &Path) -> Vec<String> {
        self.fs.list(dir).unwrap_or_default()
    }

    fn write(&mut self, dst: &Path, bytes: &[u8]) -> Result<(), TopoError> {
        let p = self.out.join(dst);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).map_err(|e| TopoError::io(parent, e))?;
        }
        std::fs::write(&p, bytes).map_err(|e| TopoError::io(&p, e))?;
        self.files += 1;
        Ok(())
    }

    fn mkdir(&mut self, dst: &Path) -> Result<(), TopoError> {
        let p = self.out.join(dst);
        std::fs::create_dir_all(&p).map_err(|e| TopoError::io(&p, e))
    }

    /// Copy in-root file `src` to `dst`; absent files are not copied, unreadable ones are
    /// listed as skipped.
    fn copy(&mut self, src: &Path, dst: &Path) -> Result<(), TopoError> {
        if src
            .file_name()
            .is_some_and(|n| forbidden(&n.to_string_lossy()))
        {
            return Ok(());
        }
        match self.fs.read(src) {
            Ok(bytes) => self.write(dst, &bytes),
            // "Not applicable" (EINVAL from `speed` of a link that is down) is the kernel
            // saying there is no value, not a file we failed to read.
            Err(ReadError::Missing | ReadError::NotApplicable(_)) => Ok(()),
            Err(e) => {
                self.skipped.push(format!("{}: {}", src.display(), e.why()));
                Ok(())
            }
        }
    }

    /// Copy `name` inside the real folder `real` to the same place.
    fn copy_in(&mut self, real: &Path, name: &str) -> Result<(), TopoError> {
        let p = real.join(name);
        self.copy(&p, &p)
    }

    /// Recreate the link at `at` (an in-root path whose parent is real) as a relative link
    /// to where it resolves; the target folder is created (empty) so the link is not dangling.
    fn mirror_link(&mut self, at: &Path) -> Result<(), TopoError> {
        let is_link =
            std::fs::symlink_metadata(self.fs.host(at)).is_ok_and(|m| m.file_type().is_symlink());
        if !is_link {
            return Ok(());
        }
        let parent = at.parent().unwrap_or(Path::new(""));
        let Some(target) = at
            .file_name()
            .and_then(|n| self.fs.resolve_from(parent, Path::new(n)))
        else {
            self.skipped
                .push(format!("{}: dangling link", at.display()));
            return Ok(());
        };
        if self.fs.is_dir(&target) {
            self.mkdir(&target)?;
        }
        self.link(at, &target)
    }

    /// Write a relative link at `at` to the in-root path `target` (nothing when they are the
    /// same path: the source had a real folder there).
    fn link(&mut self, at: &Path, target: &Path) -> Result<(), TopoError> {
        if at == target {
            return Ok(());
        }
        let p = self.out.join(at);
        if std::fs::symlink_metadata(&p).is_ok() {
            return Ok(());
        }
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).map_err(|e| TopoError::io(parent, e))?;
        }
        let rel = relative_path(at.parent().unwrap_or(Path::new("")), target);
        std::os::unix::fs::symlink(&rel, &p).map_err(|e| TopoError::io(&p, e))?;
        self.links += 1;
        Ok(())
    }

    /// Members of a class-like folder (`sys/bus/pci/devices`, `sys/class/net`): each one's
    /// link recreated, and its real folder returned with its name.
    fn members(&mut self, dir: &Path) -> Result<Vec<(String, PathBuf)>, TopoError> {
        let mut out = Vec::new();
        for name in self.list(dir) {
            let at = dir.join(&name);
            let Some(real) = self.fs.resolve(&at) else {
                self.skipped
                    .push(format!("{}: dangling link", at.display()));
                continue;
            };
            self.mkdir(&real)?;
            self.link(&at, &real)?;
            out.push((name, real));
        }
        Ok(out)
    }

    /// Copy the small files of a folder, recursing `depth` levels; links are not followed.
    fn copy_tree(&mut self, dir: &Path, depth: u32) -> Result<(), TopoError> {
        let Some(real) = self.fs.resolve(dir) else {
            return Ok(());
        };
        for name in self.list(&real) {
            let p = real.join(&name);
            let Ok(meta) = std::fs::symlink_metadata(self.fs.host(&p)) else {
                continue;
            };
            if meta.is_dir() && depth > 0 {
                self.copy_tree(&p, depth - 1)?;
            } else if meta.is_file() && meta.len() <= MAX_FILE_BYTES {
                self.copy(&p, &p)?;
            }
        }
        Ok(())
    }

    fn pci(&mut self) -> Result<(), TopoError> {
        for (_, real) in self.members(Path::new("sys/bus/pci/devices"))? {
            for a in PCI_ATTRS {
                self.copy_in(&real, a)?;
            }
            for l in PCI_LINKS {
                self.mirror_link(&real.join(l))?;
            }
        }
        Ok(())
    }

    fn rdma(&mut self) -> Result<(), TopoError> {
        for (_, real) in self.members(Path::new("sys/class/infiniband"))? {
            self.mirror_link(&real.join("device"))?;
            for a in RDMA_ATTRS {
                self.copy_in(&real, a)?;
            }
            self.copy_tree(&real.join("tc"), 2)?;
            let ports = real.join("ports");
            for port in self.list(&ports) {
                let pd = ports.join(&port);
                for a in PORT_ATTRS {
                    self.copy_in(&pd, a)?;
                }
                self.copy_tree(&pd.join("hw_counters"), 0)?;
                for i in self.list(&pd.join("gids")) {
                    let g = pd.join("gids").join(&i);
                    // Unused GIDs are all zeros and their attributes unreadable: keep the
                    // used ones only (an IB port has 128 slots, mostly empty).
                    match self.fs.read_text(&g) {
                        Ok(t) if t.chars().all(|c| c == '0' || c == ':') => continue,
                        _ => {}
                    }
                    self.copy(&g, &g)?;
                    for kind in ["types", "ndevs"] {
                        let a = pd.join("gid_attrs").join(kind).join(&i);
                        self.copy(&a, &a)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn net(&mut self) -> Result<(), TopoError> {
        for (_, real) in self.members(Path::new("sys/class/net"))? {
            self.mirror_link(&real.join("device"))?;
            for a in NET_ATTRS {
                self.copy_in(&real, a)?;
            }
            // RoCE congestion control and trust mode, where the driver provides them.
            self.copy_tree(&real.join("ecn"), 3)?;
            self.copy_tree(&real.join("qos"), 1)?;
        }
        Ok(())
    }

    fn iommu(&mut self) -> Result<(), TopoError> {
        // The IOMMU units themselves: the doctor only asks whether there are any.
        self.members(Path::new("sys/class/iommu"))?;
        let groups = Path::new("sys/kernel/iommu_groups");
        for g in self.list(groups) {
            let gd = groups.join(&g);
            self.copy_in(&gd, "type")?;
            let devs = gd.join("devices");
            for d in self.list(&devs) {
                self.mirror_link(&devs.join(d))?;
            }
        }
        Ok(())
    }

    fn numa(&mut self) -> Result<(), TopoError> {
        let nodes = Path::new("sys/devices/system/node");
        for n in self.list(nodes) {
            if n.starts_with("node") && n[4..].chars().all(|c| c.is_ascii_digit()) {
                self.copy_in(&nodes.join(&n), "cpulist")?;
                self.copy_in(&nodes.join(&n), "distance")?;
            }
        }
        Ok(())
    }

    fn proc(&mut self) -> Result<(), TopoError> {
        // proc files keep the path asked for: `proc/self` is a link to this process.
        for f in PROC_FILES {
            self.copy(Path::new(f), Path::new(f))?;
        }
        let gpus = Path::new("proc/driver/nvidia/gpus");
        for g in self.list(gpus) {
            let p = gpus.join(g).join("information");
            self.copy(&p, &p)?;
        }
        Ok(())
    }

    fn modules(&mut self) -> Result<(), TopoError> {
        for m in MODULES {
            let md = Path::new("sys/module").join(m);
            for a in MODULE_ATTRS {
                self.copy(&md.join(a), &md.join(a))?;
            }
            self.copy_tree(&md.join("parameters"), 0)?;
        }
        Ok(())
    }
}

/// Pack `dir` into a gzip-compressed tar at `out`, links stored as links, names sorted and
/// metadata fixed so two captures of one machine give the same archive.
fn write_tarball(dir: &Path, out: &Path) -> Result<(), TopoError> {
    let file = std::fs::File::create(out).map_err(|e| TopoError::io(out, e))?;
    let gz = flate2::write::GzEncoder::new(file, flate2::Compression::default());
    let mut b = tar::Builder::new(gz);
    b.follow_symlinks(false);
    b.mode(tar::HeaderMode::Deterministic);
    append_sorted(&mut b, dir, Path::new("")).map_err(|e| TopoError::io(out, e))?;
    let gz = b.into_inner().map_err(|e| TopoError::io(out, e))?;
    gz.finish().map_err(|e| TopoError::io(out, e))?;
    Ok(())
}

fn append_sorted<W: std::io::Write>(
    b: &mut tar::Builder<W>,
    base: &Path,
    rel: &Path,
) -> std::io::Result<()> {
    let mut names: Vec<_> = std::fs::read_dir(base.join(rel))?
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect();
    names.sort();
    for n in names {
        let r = rel.join(&n);
        let host = base.join(&r);
        let meta = std::fs::symlink_metadata(&host)?;
        if meta.is_dir() {
            b.append_dir(&r, &host)?;
            append_sorted(b, base, &r)?;
        } else {
            b.append_path_with_name(&host, &r)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_env_keeps_the_prefixes_and_leaves_secret_values_out() {
        let env = CapturedEnv::from_vars(
            [
                ("NCCL_IB_HCA", "mlx5_0"),
                ("CUDA_VISIBLE_DEVICES", "1"),
                ("GDX_SECRET_FILE", "/etc/gdx/secret"),
                ("NCCL_IB_TOKEN", "t"),
                ("PATH", "/bin"),
                ("XNCCL_P2P_DISABLE", "1"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string())),
        );
        assert_eq!(
            env.vars.keys().collect::<Vec<_>>(),
            ["CUDA_VISIBLE_DEVICES", "NCCL_IB_HCA"]
        );
        assert_eq!(env.redacted, ["GDX_SECRET_FILE", "NCCL_IB_TOKEN"]);
    }
}
