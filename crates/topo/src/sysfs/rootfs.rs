//! Reading a folder as if it were `/`: path resolution that follows symlinks *inside* the root
//! and bounded, non-blocking file reads.
//!
//! A captured machine's sysfs is full of symlinks (`sys/bus/pci/devices/*`, `sys/class/*/*`,
//! `device`), relative ones that must be resolved against the *real* folder that holds them
//! (the kernel resolves `sys/class/net/eth0/device` from `sys/devices/.../net/eth0`), and
//! sometimes absolute ones (`/sys/devices/...`) that must be re-rooted under the root instead of
//! being followed on the host. [`RootFs::resolve`] does both, component by component, like
//! `openat2(RESOLVE_IN_ROOT)`: `..` never climbs above the root and symlink loops end after 40
//! hops. Paths handed around are relative to the root and already resolved ("real").
//!
//! This is gdx's one sysfs path resolver: topo, doctor and rdma all read a root through
//! [`RootFs`], so a capture is read the same way by every crate (the `files` module adds the
//! reads whose errors name the file, for evidence).

use std::ffi::OsString;
use std::fs;
use std::io::{ErrorKind, Read};
use std::path::{Component, Path, PathBuf};

/// Largest file gdx reads or copies: sysfs attributes are a page at most, `config` is 4 KiB;
/// anything bigger is not one of ours (or never ends).
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// Symlink hops allowed while resolving one path (Linux's own limit).
const MAX_HOPS: u32 = 40;

/// Why a path that loops cannot be read (the OS's own words for ELOOP).
pub(super) const LOOP: &str = "too many levels of symbolic links";

/// Why a file under the root could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    /// No such file (or a dangling link): the normal "attribute absent" case.
    Missing,
    /// The kernel says the attribute does not apply now (EINVAL, ENODEV, ENXIO, EOPNOTSUPP):
    /// e.g. `speed` of a link that is down, `gid_attrs/types/N` of an unused GID.
    NotApplicable(String),
    /// Anything else: permission, I/O error, a folder or FIFO where a file should be, too big.
    Failed(String),
}

impl ReadError {
    /// One-line reason for notes and skip lists.
    pub fn why(&self) -> String {
        match self {
            ReadError::Missing => "missing".to_string(),
            ReadError::NotApplicable(w) | ReadError::Failed(w) => w.clone(),
        }
    }
}

/// A root folder read as `/`.
#[derive(Debug, Clone)]
pub struct RootFs {
    pub(super) base: PathBuf,
    /// How paths are shown instead of `base/...`: `capture:` for an unpacked archive, whose
    /// temporary folder is gone by the time anyone reads the evidence.
    pub(super) shown_as: Option<String>,
}

/// Why a path did not resolve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unresolved {
    /// A component (or a link's target) does not exist.
    Missing,
    /// More than [`MAX_HOPS`] symlinks: a loop.
    Loop,
}

enum Step {
    Root,
    Parent,
    Name(OsString),
}

fn steps(p: &Path) -> impl DoubleEndedIterator<Item = Step> + '_ {
    p.components().filter_map(|c| match c {
        Component::RootDir | Component::Prefix(_) => Some(Step::Root),
        Component::CurDir => None,
        Component::ParentDir => Some(Step::Parent),
        Component::Normal(n) => Some(Step::Name(n.to_os_string())),
    })
}

impl RootFs {
    /// Read `base` as `/`.
    pub fn new(base: impl AsRef<Path>) -> RootFs {
        RootFs {
            base: base.as_ref().to_path_buf(),
            shown_as: None,
        }
    }

    /// Read `base` as `/`, showing its files as `{prefix}sys/...` (e.g. `capture:` for an
    /// unpacked archive) in [`RootFs::show`] and in the errors that name a file.
    pub fn shown_as(base: impl AsRef<Path>, prefix: impl Into<String>) -> RootFs {
        RootFs {
            base: base.as_ref().to_path_buf(),
            shown_as: Some(prefix.into()),
        }
    }

    /// The host path of an in-root path, without resolving anything.
    pub fn host(&self, rel: &Path) -> PathBuf {
        self.base.join(rel)
    }

    /// Resolve `rel` (relative to the root; a leading `/` is allowed) to its real path
    /// relative to the root. `None` when a component is missing or links loop.
    pub fn resolve(&self, rel: impl AsRef<Path>) -> Option<PathBuf> {
        self.resolve_from(Path::new(""), rel.as_ref())
    }

    /// Resolve `rel` against `real_dir`, a folder already resolved by this `RootFs`
    /// (so relative link targets inside it are taken from the right place).
    pub fn resolve_from(&self, real_dir: &Path, rel: &Path) -> Option<PathBuf> {
        self.walk(real_dir, rel, false).ok()
    }

    /// Resolve `rel` like [`RootFs::resolve`], but keep components that do not exist as
    /// given (the path a file *would* have; errors can then name it, and fixtures can place
    /// links in folders not made yet). `None` only for a symlink loop.
    pub fn resolve_partial(&self, rel: impl AsRef<Path>) -> Option<PathBuf> {
        self.walk(Path::new(""), rel.as_ref(), true).ok()
    }

    /// The one resolution algorithm behind [`RootFs::resolve_from`] and
    /// [`RootFs::resolve_partial`]. With `keep_missing`, a missing component is kept as a
    /// name; nothing below it can be a link, so the rest is appended as given (`..` still
    /// clamped at the root).
    pub(super) fn walk(
        &self,
        real_dir: &Path,
        rel: &Path,
        keep_missing: bool,
    ) -> Result<PathBuf, Unresolved> {
        let mut done: Vec<OsString> = Vec::new();
        for s in steps(real_dir) {
            match s {
                Step::Root => done.clear(),
                Step::Parent => {
                    done.pop();
                }
                Step::Name(n) => done.push(n),
            }
        }
        let mut todo: std::collections::VecDeque<Step> = steps(rel).collect();
        let mut hops = 0;
        while let Some(step) = todo.pop_front() {
            match step {
                Step::Root => done.clear(),
                // `..` at the root stays at the root, as it does for `/`.
                Step::Parent => {
                    done.pop();
                }
                Step::Name(name) => {
                    done.push(name);
                    let host = self.base.join(done.iter().collect::<PathBuf>());
                    let meta = match fs::symlink_metadata(&host) {
                        Ok(m) => m,
                        Err(_) if keep_missing => continue,
                        Err(_) => return Err(Unresolved::Missing),
                    };
                    if meta.file_type().is_symlink() {
                        hops += 1;
                        if hops > MAX_HOPS {
                            return Err(Unresolved::Loop);
                        }
                        let target = fs::read_link(&host).map_err(|_| Unresolved::Missing)?;
                        done.pop();
                        for s in steps(&target).rev() {
                            todo.push_front(s);
                        }
                    }
                }
            }
        }
        Ok(done.iter().collect())
    }

    /// Names in an in-root folder (resolved first), sorted; empty when it is absent.
    /// `Err` when it exists but cannot be listed.
    pub fn list(&self, rel: impl AsRef<Path>) -> Result<Vec<String>, ReadError> {
        let Some(real) = self.resolve(rel) else {
            return Err(ReadError::Missing);
        };
        let rd = fs::read_dir(self.host(&real)).map_err(|e| classify(&e))?;
        let mut names: Vec<String> = rd
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        Ok(names)
    }

    /// True when `rel` resolves to a folder.
    pub fn is_dir(&self, rel: impl AsRef<Path>) -> bool {
        self.resolve(rel)
            .and_then(|r| fs::metadata(self.host(&r)).ok())
            .is_some_and(|m| m.is_dir())
    }

    /// The root folder on the host.
    pub fn base(&self) -> &Path {
        &self.base
    }

    /// Read an in-root file (resolved first) of at most `limit` bytes; a longer file is an
    /// error. Only regular files are opened: a FIFO or device node in an odd tree would block
    /// or have side effects.
    pub fn read_limited(&self, rel: impl AsRef<Path>, limit: u64) -> Result<Vec<u8>, ReadError> {
        let buf = self.read_prefix(rel, limit + 1)?;
        if buf.len() as u64 > limit {
            return Err(ReadError::Failed(format!("larger than {limit} bytes")));
        }
        Ok(buf)
    }

    /// The first `limit` bytes of an in-root file (all of it when shorter), e.g. the part
    /// of `config` gdx understands.
    pub fn read_prefix(&self, rel: impl AsRef<Path>, limit: u64) -> Result<Vec<u8>, ReadError> {
        // A loop reads as missing here, as a dangling link does: topo notes neither.
        let real = self.resolve(rel).ok_or(ReadError::Missing)?;
        let host = self.host(&real);
        let meta = fs::metadata(&host).map_err(|e| classify(&e))?;
        if meta.is_dir() {
            return Err(ReadError::Failed("is a folder, not a file".into()));
        }
        if !meta.is_file() {
            return Err(ReadError::Failed("not a regular file".into()));
        }
        let f = fs::File::open(&host).map_err(|e| classify(&e))?;
        let mut buf = Vec::new();
        f.take(limit)
            .read_to_end(&mut buf)
            .map_err(|e| classify(&e))?;
        Ok(buf)
    }

    /// Read an in-root file of at most [`MAX_FILE_BYTES`].
    pub fn read(&self, rel: impl AsRef<Path>) -> Result<Vec<u8>, ReadError> {
        self.read_limited(rel, MAX_FILE_BYTES)
    }

    /// Read an in-root text file, trimmed (invalid UTF-8 is replaced, then fails to parse).
    pub fn read_text(&self, rel: impl AsRef<Path>) -> Result<String, ReadError> {
        let b = self.read(rel)?;
        Ok(String::from_utf8_lossy(&b).trim().to_string())
    }
}

/// True when `dir` is this machine's own `/` (it resolves there on the host): the one place
/// the host's resolution is wanted, to tell the live machine from a capture.
pub fn is_host_root(dir: &Path) -> bool {
    fs::canonicalize(dir).is_ok_and(|p| p == Path::new("/"))
}

/// Sort an I/O error into missing / not applicable / failed.
pub fn classify(e: &std::io::Error) -> ReadError {
    if e.kind() == ErrorKind::NotFound {
        return ReadError::Missing;
    }
    // EINVAL 22, ENODEV 19, ENXIO 6, EOPNOTSUPP 95, ENODATA 61: the attribute exists but has
    // no value in this state; sysfs uses these for "not now", not for real failures.
    match e.raw_os_error() {
        Some(22 | 19 | 6 | 95 | 61) => ReadError::NotApplicable(e.to_string()),
        _ => ReadError::Failed(e.to_string()),
    }
}

/// The relative path that leads from folder `from_dir` to `to` (both relative to one root),
/// e.g. from `sys/bus/pci/devices` to `sys/devices/pci0000:00/0000:00:01.0` gives
/// `../../../devices/pci0000:00/0000:00:01.0`. Used to write relative symlinks.
pub fn relative_path(from_dir: &Path, to: &Path) -> PathBuf {
    let a: Vec<Component> = from_dir
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect();
    let b: Vec<Component> = to
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect();
    let common = a.iter().zip(b.iter()).take_while(|(x, y)| x == y).count();
    let mut out = PathBuf::new();
    for _ in common..a.len() {
        out.push("..");
    }
    for c in &b[common..] {
        out.push(c.as_os_str());
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn resolves_relative_absolute_and_dotdot_inside_root() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        fs::create_dir_all(r.join("sys/devices/pci0000:00/0000:00:01.0")).unwrap();
        fs::create_dir_all(r.join("sys/bus/pci/devices")).unwrap();
        symlink(
            "../../../devices/pci0000:00/0000:00:01.0",
            r.join("sys/bus/pci/devices/0000:00:01.0"),
        )
        .unwrap();
        symlink("/sys/devices/pci0000:00", r.join("sys/bus/pci/devices/abs")).unwrap();
        symlink("../../../../../../../..", r.join("sys/bus/pci/devices/up")).unwrap();
        symlink("loop", r.join("sys/bus/pci/devices/loop")).unwrap();
        let fs = RootFs::new(r);
        assert_eq!(
            fs.resolve(Path::new("sys/bus/pci/devices/0000:00:01.0")),
            Some(PathBuf::from("sys/devices/pci0000:00/0000:00:01.0"))
        );
        assert_eq!(
            fs.resolve(Path::new("/sys/bus/pci/devices/abs/0000:00:01.0")),
            Some(PathBuf::from("sys/devices/pci0000:00/0000:00:01.0"))
        );
        assert_eq!(
            fs.resolve(Path::new("sys/bus/pci/devices/up")),
            Some(PathBuf::new())
        );
        assert_eq!(fs.resolve(Path::new("sys/bus/pci/devices/loop")), None);
        assert_eq!(fs.resolve(Path::new("sys/nope")), None);
    }

    #[test]
    fn relative_paths() {
        assert_eq!(
            relative_path(
                Path::new("sys/bus/pci/devices"),
                Path::new("sys/devices/pci0000:00/0000:00:01.0")
            ),
            PathBuf::from("../../../devices/pci0000:00/0000:00:01.0")
        );
        assert_eq!(
            relative_path(Path::new("a/b"), Path::new("a/b")),
            PathBuf::from(".")
        );
    }

    #[test]
    fn reads_are_bounded_and_refuse_folders() {
        let t = tempfile::tempdir().unwrap();
        fs::write(t.path().join("big"), vec![b'x'; 100]).unwrap();
        fs::create_dir(t.path().join("dir")).unwrap();
        let fs = RootFs::new(t.path());
        assert!(matches!(
            fs.read_limited(Path::new("big"), 10),
            Err(ReadError::Failed(_))
        ));
        assert_eq!(fs.read_limited(Path::new("big"), 100).unwrap().len(), 100);
        assert!(matches!(
            fs.read(Path::new("dir")),
            Err(ReadError::Failed(_))
        ));
        assert_eq!(fs.read(Path::new("none")), Err(ReadError::Missing));
    }
}
