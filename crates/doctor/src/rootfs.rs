//! Reading files below the doctor's root (`/` for this machine, or a captured tree), with errors
//! that name the file and say whether it was missing or unreadable, so a check can turn them
//! into a `skip` with a reason instead of failing the run.

use std::fmt;
use std::io::ErrorKind;
use std::path::{Component, Path, PathBuf};

/// Why a file under the root could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadError {
    /// The path as shown to the user.
    pub path: String,
    /// The OS error kind (NotFound, PermissionDenied, ...).
    pub kind: ErrorKind,
    /// The OS message.
    pub message: String,
}

impl ReadError {
    /// True when the file or folder does not exist.
    pub fn is_missing(&self) -> bool {
        self.kind == ErrorKind::NotFound
    }
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Largest file read: sysfs attributes are a page at most, `config` 4 KiB; anything bigger
/// is not one of ours.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// Symlink hops allowed while resolving one path (Linux's own limit).
const MAX_HOPS: u32 = 40;

/// A root folder and the helpers to read below it. Paths given to it are relative
/// (`sys/bus/pci/devices`), never absolute, so a captured tree is read the same way.
///
/// Symlinks are followed *inside* the root: an absolute target (`/sys/devices/...`, as a
/// careless copy leaves them) is re-rooted under the root, and `..` never climbs above it,
/// so a captured machine is never mixed up with the machine the doctor runs on.
#[derive(Debug, Clone)]
pub struct RootFs {
    root: PathBuf,
    /// How paths are shown instead of `root/...`: `capture:` for an unpacked archive, whose
    /// temporary folder is gone by the time anyone reads the evidence.
    shown_as: Option<String>,
}

impl RootFs {
    /// Wrap a root folder.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        RootFs {
            root: root.into(),
            shown_as: None,
        }
    }

    /// Wrap a root folder whose files are shown as `{prefix}sys/...` (e.g. `capture:`).
    pub fn shown_as(root: impl Into<PathBuf>, prefix: impl Into<String>) -> Self {
        RootFs {
            root: root.into(),
            shown_as: Some(prefix.into()),
        }
    }

    /// The root folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Resolve a relative path to its real path relative to the root, following symlinks
    /// inside the root. Missing components are kept as given (so errors name them); `None`
    /// only for a symlink loop.
    pub fn resolve(&self, rel: &str) -> Option<PathBuf> {
        let mut done = PathBuf::new();
        let mut todo: Vec<std::ffi::OsString> = Vec::new();
        let push = |todo: &mut Vec<std::ffi::OsString>, p: &Path| {
            let comps: Vec<std::ffi::OsString> = p
                .components()
                .map(|c| match c {
                    Component::RootDir | Component::Prefix(_) => "/".into(),
                    Component::CurDir => ".".into(),
                    Component::ParentDir => "..".into(),
                    Component::Normal(n) => n.to_os_string(),
                })
                .collect();
            todo.extend(comps.into_iter().rev());
        };
        push(&mut todo, Path::new(rel.trim_start_matches('/')));
        let mut hops = 0;
        while let Some(c) = todo.pop() {
            match c.to_str() {
                Some("/") => done.clear(),
                Some(".") => {}
                Some("..") => {
                    done.pop();
                }
                _ => {
                    let cand = done.join(&c);
                    let host = self.root.join(&cand);
                    match std::fs::symlink_metadata(&host) {
                        Ok(m) if m.file_type().is_symlink() => {
                            hops += 1;
                            if hops > MAX_HOPS {
                                return None;
                            }
                            let target = std::fs::read_link(&host).ok()?;
                            if target.is_absolute() {
                                done.clear();
                            }
                            push(&mut todo, &target);
                        }
                        _ => done = cand,
                    }
                }
            }
        }
        Some(done)
    }

    /// The host path of a relative one, symlinks resolved inside the root.
    pub fn path(&self, rel: &str) -> PathBuf {
        match self.resolve(rel) {
            Some(r) => self.root.join(r),
            None => self.root.join(rel.trim_start_matches('/')),
        }
    }

    /// How a relative path is shown in evidence: `/sys/...` on the live machine, the prefix
    /// and the path inside the capture for an unpacked archive (`capture:sys/...`), the full
    /// path inside a captured folder otherwise.
    pub fn show(&self, rel: &str) -> String {
        let rel = rel.trim_start_matches('/');
        if let Some(prefix) = &self.shown_as {
            format!("{prefix}{rel}")
        } else if self.root == Path::new("/") {
            format!("/{rel}")
        } else {
            self.root.join(rel).display().to_string()
        }
    }

    fn err(&self, rel: &str, kind: ErrorKind, message: String) -> ReadError {
        ReadError {
            path: self.show(rel),
            kind,
            message,
        }
    }

    fn io_err(&self, rel: &str, e: &std::io::Error) -> ReadError {
        let message = match e.kind() {
            ErrorKind::NotFound => "not found".to_string(),
            ErrorKind::PermissionDenied => "permission denied".to_string(),
            _ => e.to_string(),
        };
        self.err(rel, e.kind(), message)
    }

    /// Raw bytes of a regular file (at most 1 MiB; FIFOs and folders are refused rather than
    /// read, so an odd tree cannot hang the doctor).
    pub fn read_bytes(&self, rel: &str) -> Result<Vec<u8>, ReadError> {
        use std::io::Read;
        let p = self.path(rel);
        let m = std::fs::metadata(&p).map_err(|e| self.io_err(rel, &e))?;
        if !m.is_file() {
            return Err(self.err(rel, ErrorKind::InvalidInput, "not a regular file".into()));
        }
        let f = std::fs::File::open(&p).map_err(|e| self.io_err(rel, &e))?;
        let mut buf = Vec::new();
        f.take(MAX_FILE_BYTES)
            .read_to_end(&mut buf)
            .map_err(|e| self.io_err(rel, &e))?;
        Ok(buf)
    }

    /// A text file with surrounding whitespace trimmed (sysfs values end in a newline).
    /// Invalid UTF-8 is replaced rather than refused: odd bytes should not hide a value.
    pub fn read_text(&self, rel: &str) -> Result<String, ReadError> {
        let bytes = self.read_bytes(rel)?;
        Ok(String::from_utf8_lossy(&bytes).trim().to_string())
    }

    /// A text file, `None` when it is missing or unreadable.
    pub fn text(&self, rel: &str) -> Option<String> {
        self.read_text(rel).ok()
    }

    /// Whether a path exists (following symlinks inside the root).
    pub fn exists(&self, rel: &str) -> bool {
        self.path(rel).exists()
    }

    /// Names in a folder, sorted naturally (`b9` before `b10`); unreadable names skipped.
    pub fn list(&self, rel: &str) -> Result<Vec<String>, ReadError> {
        let rd = std::fs::read_dir(self.path(rel)).map_err(|e| self.io_err(rel, &e))?;
        let mut names: Vec<String> = rd
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort_by(|a, b| gdx_topo::natural_cmp(a, b));
        Ok(names)
    }

    /// Names in a folder, empty when it is missing or unreadable.
    pub fn list_or_empty(&self, rel: &str) -> Vec<String> {
        self.list(rel).unwrap_or_default()
    }

    /// The last component of where a symlink leads (`iommu_group` → `17`, `device` → a BDF),
    /// fully resolved inside the root, so `../..`-style targets work; `None` when `rel` is
    /// not a symlink.
    pub fn link_name(&self, rel: &str) -> Option<String> {
        let rel_p = Path::new(rel.trim_start_matches('/'));
        let parent = self.resolve(rel_p.parent()?.to_str()?)?;
        let host = self.root.join(parent).join(rel_p.file_name()?);
        if !std::fs::symlink_metadata(host)
            .ok()?
            .file_type()
            .is_symlink()
        {
            return None;
        }
        self.resolve(rel)?
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_string)
    }

    /// The real path of `rel`, relative to the root (see [`RootFs::resolve`]), when it exists.
    pub fn canonical_rel(&self, rel: &str) -> Option<PathBuf> {
        let r = self.resolve(rel)?;
        self.root.join(&r).exists().then_some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_trim_and_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("sys/x")).unwrap();
        std::fs::write(dir.path().join("sys/x/a"), "  7\n").unwrap();
        std::fs::write(dir.path().join("sys/x/b10"), "").unwrap();
        std::fs::write(dir.path().join("sys/x/b9"), "").unwrap();
        let fs = RootFs::new(dir.path());
        assert_eq!(fs.read_text("sys/x/a").unwrap(), "7");
        let e = fs.read_text("/sys/x/nope").unwrap_err();
        assert!(e.is_missing());
        assert!(e.to_string().ends_with("sys/x/nope: not found"), "{e}");
        assert_eq!(fs.list("sys/x").unwrap(), ["a", "b9", "b10"]);
        assert!(fs.list_or_empty("sys/none").is_empty());
        assert_eq!(RootFs::new("/").show("proc/cmdline"), "/proc/cmdline");
        assert_eq!(
            RootFs::shown_as(dir.path(), "capture:").show("/sys/x/a"),
            "capture:sys/x/a"
        );
        assert!(fs.read_bytes("sys/x").is_err(), "a folder is not read");
    }

    #[test]
    fn absolute_and_escaping_links_stay_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        std::fs::create_dir_all(r.join("sys/devices/pci0000:00/0000:00:01.0")).unwrap();
        std::fs::write(
            r.join("sys/devices/pci0000:00/0000:00:01.0/vendor"),
            "0x10de\n",
        )
        .unwrap();
        std::fs::create_dir_all(r.join("sys/bus/pci/devices")).unwrap();
        // Absolute, as a careless copy leaves it: must resolve inside the root.
        std::os::unix::fs::symlink(
            "/sys/devices/pci0000:00/0000:00:01.0",
            r.join("sys/bus/pci/devices/0000:00:01.0"),
        )
        .unwrap();
        // Climbing far above the root: clamped at the root.
        std::os::unix::fs::symlink("../../../../../../../../etc", r.join("sys/esc")).unwrap();
        std::os::unix::fs::symlink("loop", r.join("sys/loop")).unwrap();
        let fs = RootFs::new(r);
        assert_eq!(
            fs.read_text("sys/bus/pci/devices/0000:00:01.0/vendor")
                .unwrap(),
            "0x10de"
        );
        assert_eq!(
            fs.canonical_rel("sys/bus/pci/devices/0000:00:01.0")
                .unwrap(),
            Path::new("sys/devices/pci0000:00/0000:00:01.0")
        );
        assert_eq!(fs.resolve("sys/esc").unwrap(), Path::new("etc"));
        assert!(fs.resolve("sys/loop").is_none());
        assert!(fs.read_text("sys/loop").is_err());
        assert_eq!(
            fs.link_name("sys/bus/pci/devices/0000:00:01.0").as_deref(),
            Some("0000:00:01.0")
        );
    }
}
