//! Reads under a [`RootFs`] whose errors name the file, as it is shown to the user, and say
//! whether it was missing or unreadable: what the doctor's checks turn into a `skip` with a
//! reason, and what they quote as evidence (`/sys/...` on this machine, `capture:sys/...`
//! for an unpacked archive).
//!
//! Paths are in-root strings (`sys/bus/pci/devices/0000:01:00.0/vendor`; a leading `/` is
//! allowed). Everything is resolved by [`RootFs`]'s one algorithm, so an absolute link inside
//! a capture is re-rooted and a path that does not resolve is an error: nothing here ever
//! lets the host's own kernel follow a capture's link.

use super::rootfs::{RootFs, Unresolved, LOOP, MAX_FILE_BYTES};
use std::fmt;
use std::io::{ErrorKind, Read};
use std::path::{Path, PathBuf};

/// Why a file under the root could not be read, naming the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileError {
    /// The path as shown to the user ([`RootFs::show`]).
    pub path: String,
    /// The OS error kind (NotFound, PermissionDenied, ...).
    pub kind: ErrorKind,
    /// The OS message.
    pub message: String,
}

impl FileError {
    /// True when the file or folder does not exist.
    pub fn is_missing(&self) -> bool {
        self.kind == ErrorKind::NotFound
    }
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

impl std::error::Error for FileError {}

impl RootFs {
    /// The root folder on the host (the same as [`RootFs::base`]).
    pub fn root(&self) -> &Path {
        &self.base
    }

    /// How an in-root path is shown in evidence: `/sys/...` on the live machine, the prefix
    /// and the path inside the capture for an unpacked archive (`capture:sys/...`), the full
    /// path inside a captured folder otherwise.
    pub fn show(&self, rel: &str) -> String {
        let rel = rel.trim_start_matches('/');
        if let Some(prefix) = &self.shown_as {
            format!("{prefix}{rel}")
        } else if self.base == Path::new("/") {
            format!("/{rel}")
        } else {
            self.base.join(rel).display().to_string()
        }
    }

    fn named_err(&self, rel: &str, kind: ErrorKind, message: String) -> FileError {
        FileError {
            path: self.show(rel),
            kind,
            message,
        }
    }

    fn io_err(&self, rel: &str, e: &std::io::Error) -> FileError {
        let message = match e.kind() {
            ErrorKind::NotFound => "not found".to_string(),
            ErrorKind::PermissionDenied => "permission denied".to_string(),
            _ => e.to_string(),
        };
        self.named_err(rel, e.kind(), message)
    }

    /// The host path of `rel`, resolved inside the root; missing components are kept (so
    /// the OS reports them missing), a loop is an error.
    fn host_path(&self, rel: &str) -> Result<PathBuf, FileError> {
        match self.walk(Path::new(""), Path::new(rel), true) {
            Ok(real) => Ok(self.base.join(real)),
            Err(Unresolved::Loop) => Err(self.named_err(rel, ErrorKind::InvalidInput, LOOP.into())),
            Err(Unresolved::Missing) => {
                Err(self.named_err(rel, ErrorKind::NotFound, "not found".into()))
            }
        }
    }

    /// Raw bytes of a regular file (at most [`MAX_FILE_BYTES`]; FIFOs and folders are
    /// refused rather than read, so an odd tree cannot hang the reader).
    ///
    /// # Errors
    /// [`FileError`] naming the file: missing, not a regular file, unreadable.
    pub fn file_bytes(&self, rel: &str) -> Result<Vec<u8>, FileError> {
        let p = self.host_path(rel)?;
        let m = std::fs::metadata(&p).map_err(|e| self.io_err(rel, &e))?;
        if !m.is_file() {
            return Err(self.named_err(rel, ErrorKind::InvalidInput, "not a regular file".into()));
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
    ///
    /// # Errors
    /// As [`RootFs::file_bytes`].
    pub fn file_text(&self, rel: &str) -> Result<String, FileError> {
        let bytes = self.file_bytes(rel)?;
        Ok(String::from_utf8_lossy(&bytes).trim().to_string())
    }

    /// A text file, `None` when it is missing or unreadable.
    pub fn text(&self, rel: &str) -> Option<String> {
        self.file_text(rel).ok()
    }

    /// Whether a path exists (following symlinks inside the root).
    pub fn exists(&self, rel: &str) -> bool {
        self.resolve(rel).is_some()
    }

    /// Names in a folder, sorted naturally (`b9` before `b10`); unreadable names skipped.
    ///
    /// # Errors
    /// [`FileError`] naming the folder when it is missing or cannot be listed.
    pub fn names(&self, rel: &str) -> Result<Vec<String>, FileError> {
        let p = self.host_path(rel)?;
        let rd = std::fs::read_dir(p).map_err(|e| self.io_err(rel, &e))?;
        let mut names: Vec<String> = rd
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort_by(|a, b| crate::natural_cmp(a, b));
        Ok(names)
    }

    /// Names in a folder, empty when it is missing or unreadable.
    pub fn names_or_empty(&self, rel: &str) -> Vec<String> {
        self.names(rel).unwrap_or_default()
    }

    /// The last component of where a symlink leads (`iommu_group` → `17`, `device` → a BDF),
    /// resolved inside the root, so `../..`-style and absolute targets work; `None` when
    /// `rel` is not a symlink.
    pub fn link_name(&self, rel: &str) -> Option<String> {
        let rel_p = Path::new(rel.trim_start_matches('/'));
        let parent = self.resolve_partial(rel_p.parent()?)?;
        let host = self.base.join(parent).join(rel_p.file_name()?);
        if !std::fs::symlink_metadata(host)
            .ok()?
            .file_type()
            .is_symlink()
        {
            return None;
        }
        self.resolve_partial(rel)?
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_string)
    }

    /// The real path of `rel`, relative to the root, when it exists.
    pub fn canonical_rel(&self, rel: &str) -> Option<PathBuf> {
        self.resolve(rel)
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
        assert_eq!(fs.file_text("sys/x/a").unwrap(), "7");
        let e = fs.file_text("/sys/x/nope").unwrap_err();
        assert!(e.is_missing());
        assert!(e.to_string().ends_with("sys/x/nope: not found"), "{e}");
        assert_eq!(fs.names("sys/x").unwrap(), ["a", "b9", "b10"]);
        assert!(fs.names_or_empty("sys/none").is_empty());
        assert_eq!(RootFs::new("/").show("proc/cmdline"), "/proc/cmdline");
        assert_eq!(
            RootFs::shown_as(dir.path(), "capture:").show("/sys/x/a"),
            "capture:sys/x/a"
        );
        assert!(fs.file_bytes("sys/x").is_err(), "a folder is not read");
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
        // An absolute link to a host file the root does not hold: missing, not the host's.
        std::os::unix::fs::symlink("/proc/self/status", r.join("sys/host")).unwrap();
        let fs = RootFs::new(r);
        assert_eq!(
            fs.file_text("sys/bus/pci/devices/0000:00:01.0/vendor")
                .unwrap(),
            "0x10de"
        );
        assert_eq!(
            fs.canonical_rel("sys/bus/pci/devices/0000:00:01.0")
                .unwrap(),
            Path::new("sys/devices/pci0000:00/0000:00:01.0")
        );
        assert_eq!(fs.resolve_partial("sys/esc").unwrap(), Path::new("etc"));
        assert!(fs.resolve_partial("sys/loop").is_none());
        let e = fs.file_text("sys/loop").unwrap_err();
        assert!(e.message.contains("symbolic links"), "{e}");
        assert!(fs.file_text("sys/host").unwrap_err().is_missing());
        assert_eq!(
            fs.link_name("sys/bus/pci/devices/0000:00:01.0").as_deref(),
            Some("0000:00:01.0")
        );
    }
}
