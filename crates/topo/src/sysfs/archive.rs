//! Opening a `--root`: a folder is read in place; a `.tar.gz`/`.tgz` capture is unpacked into a
//! temporary folder that lives as long as the [`OpenRoot`]. This is the one unpacker: `gdx
//! topo`, `gdx doctor` and `--capture` of a capture all use it.
//!
//! An archive is input from another machine, so unpacking is bounded and confined:
//! - at most [`ArchiveLimits::max_bytes`] of file data (counted as written, so a lying header
//!   or a gzip bomb stops at the cap) and [`ArchiveLimits::max_entries`] entries;
//! - no entry deeper than [`ArchiveLimits::max_depth`] components;
//! - only folders, regular files and relative symlinks that stay inside the archive: absolute
//!   or `..`-escaping names and link targets, a symlink at the top level (it would make the
//!   root itself point elsewhere, e.g. at `/`), entries written *through* an earlier link,
//!   hard links, devices and FIFOs are refused with the entry's name;
//! - the temporary folder is removed when the [`OpenRoot`] is dropped, when unpacking fails,
//!   and on SIGINT/SIGTERM/SIGHUP once [`remove_unpacked_on_signal`] has been called.
//!
//! Names are shown through [`printable`], so control characters in a hostile archive never
//! reach the terminal raw.

use super::rootfs::RootFs;
use crate::TopoError;
use std::io::Read as _;
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;

/// Bounds on what unpacking an archive may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArchiveLimits {
    /// Total bytes of file data.
    pub max_bytes: u64,
    /// Entries of any kind (files, folders, links).
    pub max_entries: u64,
    /// Path components of one entry (`sys/devices/pci0000:00/...`).
    pub max_depth: usize,
}

/// A gdx capture holds a few MB in a few thousand entries at most 20 levels deep; these caps
/// leave an order of magnitude (and more) of room above that.
pub const DEFAULT_LIMITS: ArchiveLimits = ArchiveLimits {
    max_bytes: 256 << 20,
    max_entries: 100_000,
    max_depth: 64,
};

impl Default for ArchiveLimits {
    fn default() -> Self {
        DEFAULT_LIMITS
    }
}

/// What a root must hold to be accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Require {
    /// `sys/bus/pci/devices` (what the topology is built from).
    PciTree,
    /// Nothing: a folder with no sysfs at all is accepted (the doctor then skips its checks).
    Nothing,
}

/// A root ready to read: the folder itself, or a temporary folder holding an unpacked capture
/// (removed when this is dropped).
#[derive(Debug)]
pub struct OpenRoot {
    given: PathBuf,
    dir: PathBuf,
    unpacked: Option<TempFolder>,
}

impl OpenRoot {
    /// The folder to read as `/`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The root as the user gave it (the archive's path for an archive).
    pub fn given(&self) -> &Path {
        &self.given
    }

    /// True when the root is an unpacked archive: its folder is temporary and must never be
    /// shown to the user (name files as `capture:sys/...` instead).
    pub fn is_archive(&self) -> bool {
        self.unpacked.is_some()
    }
}

/// True for names gdx treats as gzip-compressed tar files.
pub fn is_tarball_name(p: &Path) -> bool {
    let n = p.to_string_lossy().to_ascii_lowercase();
    n.ends_with(".tar.gz") || n.ends_with(".tgz")
}

pub(crate) const NOT_A_ROOT: &str = "no sys/bus/pci/devices: not a sysfs root or gdx capture \
                          (make one with `gdx topo --capture OUT.tar.gz` on the machine)";

/// Check `root` and unpack it (with [`DEFAULT_LIMITS`]) when it is a capture archive.
///
/// # Errors
/// [`TopoError::RootMissing`], or [`TopoError::RootUnusable`] naming what is wrong: no PCI tree
/// (for [`Require::PciTree`]), not a folder or archive, an archive that does not unpack or
/// breaks a rule of the module docs.
pub fn open_root(root: &Path, require: Require) -> Result<OpenRoot, TopoError> {
    open_root_with(root, require, &DEFAULT_LIMITS, None)
}

/// [`open_root`] with explicit limits and, for archives, the folder to unpack under
/// (`None`: the system's temporary folder).
///
/// # Errors
/// As [`open_root`].
pub fn open_root_with(
    root: &Path,
    require: Require,
    limits: &ArchiveLimits,
    temp_parent: Option<&Path>,
) -> Result<OpenRoot, TopoError> {
    let unusable = |why: String| unusable(root, why, None);
    let meta = match std::fs::metadata(root) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(TopoError::RootMissing {
                path: root.to_path_buf(),
            })
        }
        Err(e) => return Err(TopoError::io(root, e)),
    };
    let has_pci = |d: &Path| RootFs::new(d).is_dir(Path::new("sys/bus/pci/devices"));
    if meta.is_dir() {
        if require == Require::PciTree && !has_pci(root) {
            return Err(unusable(NOT_A_ROOT.into()));
        }
        return Ok(OpenRoot {
            given: root.to_path_buf(),
            dir: root.to_path_buf(),
            unpacked: None,
        });
    }
    if !meta.is_file() || !is_tarball_name(root) {
        return Err(unusable(
            "not a folder or a .tar.gz/.tgz capture file (give the folder or archive written \
             by `gdx topo --capture`)"
                .into(),
        ));
    }
    let unpacked = unpack(root, limits, temp_parent)?;
    // Accept a tarball of the capture folder itself (one top-level folder) as well as one
    // made from inside it. The top-level entry is a real folder: unpack refuses links there.
    let mut dir = unpacked.path().to_path_buf();
    let found = |d: &Path| match require {
        Require::PciTree => has_pci(d),
        Require::Nothing => d.join("sys").is_dir(),
    };
    if !found(&dir) {
        let tops: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map_err(|e| TopoError::io(&dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        match tops.as_slice() {
            [one] if found(one) => dir = one.clone(),
            _ if require == Require::Nothing => {}
            _ => return Err(unusable(NOT_A_ROOT.into())),
        }
    }
    Ok(OpenRoot {
        given: root.to_path_buf(),
        dir,
        unpacked: Some(unpacked),
    })
}

/// `s` with control characters (and backslashes) escaped as Rust escapes them (`\n`, `\u{1b}`),
/// so a name from an archive or a file cannot move the cursor or recolour the terminal.
pub fn printable(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() || c == '\\' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// [`printable`] for multi-line text (a rendered report): line breaks and tabs stay, every other
/// control character (ESC above all) is escaped.
pub fn printable_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Temporary folders of live [`TempFolder`] values, for the signal thread to remove.
static LIVE_DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// A temporary folder (an unpacked archive, a capture being packed), removed on drop and,
/// once [`remove_unpacked_on_signal`] was called, on SIGINT/SIGTERM/SIGHUP.
#[derive(Debug)]
pub(crate) struct TempFolder {
    dir: Option<tempfile::TempDir>,
}

impl TempFolder {
    pub(crate) fn new(dir: tempfile::TempDir) -> TempFolder {
        if let Ok(mut live) = LIVE_DIRS.lock() {
            live.push(dir.path().to_path_buf());
        }
        TempFolder { dir: Some(dir) }
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.as_ref().map_or(Path::new(""), |d| d.path())
    }
}

impl Drop for TempFolder {
    fn drop(&mut self) {
        if let Some(d) = self.dir.take() {
            if let Ok(mut live) = LIVE_DIRS.lock() {
                live.retain(|p| p != d.path());
            }
            if let Err(e) = d.close() {
                log::warn!("cannot remove the unpacked archive folder: {e}");
            }
        }
    }
}

/// Remove every temporary folder (unpacked archives, captures being packed) when the process
/// gets SIGINT, SIGTERM or SIGHUP, then exit with 128 + the signal number, as a shell reports
/// a killed command.
///
/// Call it once, early, before other threads start: it blocks those signals in the calling
/// thread (and so in threads started later) and waits for them on a thread of its own. Child
/// processes inherit the block, so callers that start programs should not use it.
///
/// # Errors
/// [`TopoError::Io`] when the signal mask cannot be changed or the thread cannot start.
pub fn remove_unpacked_on_signal() -> Result<(), TopoError> {
    static INSTALLED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    if INSTALLED.get().is_some() {
        return Ok(());
    }
    // Waited for with `sigwait` on a thread of its own (gdx-sys: rustix has no signal masks).
    let set = gdx_sys::os::SignalSet::termination();
    set.block_in_this_thread()
        .map_err(|e| TopoError::io("signal mask", e))?;
    std::thread::Builder::new()
        .name("gdx-signal-cleanup".into())
        .spawn(move || {
            // `wait` fails only for an invalid set; then nothing can be waited for.
            if let Ok(sig) = set.wait() {
                if let Ok(live) = LIVE_DIRS.lock() {
                    for d in live.iter() {
                        let _ = std::fs::remove_dir_all(d);
                    }
                }
                std::process::exit(128 + sig);
            }
        })
        .map_err(|e| TopoError::io("signal thread", e))?;
    let _ = INSTALLED.set(());
    Ok(())
}

/// Unpack a gzip-compressed tar into a new temporary folder under `parent`, within `limits`.
fn unpack(
    archive: &Path,
    limits: &ArchiveLimits,
    parent: Option<&Path>,
) -> Result<TempFolder, TopoError> {
    let file = std::fs::File::open(archive).map_err(|e| TopoError::io(archive, e))?;
    let mut b = tempfile::Builder::new();
    b.prefix("gdx-root-");
    let tmp = match parent {
        Some(p) => b.tempdir_in(p).map_err(|e| TopoError::io(p, e))?,
        None => b
            .tempdir()
            .map_err(|e| TopoError::io(std::env::temp_dir(), e))?,
    };
    // From here on, an error drops `out` and so removes everything written.
    let out = TempFolder::new(tmp);
    let why = |w: String| unusable(archive, w, None);
    // The whole decompressed stream is bounded too: tar reads GNU long names and pax headers
    // into memory itself, before any entry reaches the byte cap below.
    let stream_cap = limits
        .max_bytes
        .saturating_add(limits.max_entries.saturating_mul(STREAM_BYTES_PER_ENTRY));
    let stream = Capped {
        inner: flate2::read::GzDecoder::new(file),
        left: stream_cap,
        cap: stream_cap,
    };
    let mut ar = tar::Archive::new(stream);
    let entries = ar
        .entries()
        .map_err(|e| unusable(archive, "cannot unpack as .tar.gz".into(), Some(e)))?;
    let mut u = Unpacker {
        archive: archive.to_path_buf(),
        dst: out.path().to_path_buf(),
        limits: *limits,
        written: 0,
    };
    for (n, entry) in entries.enumerate() {
        if n as u64 >= limits.max_entries {
            return Err(why(format!(
                "more than {} entries (the cap for a capture archive; a gdx capture has a few \
                 thousand): not unpacked",
                limits.max_entries
            )));
        }
        let entry =
            entry.map_err(|e| unusable(archive, "cannot unpack as .tar.gz".into(), Some(e)))?;
        u.entry(entry)?;
    }
    Ok(out)
}

/// Tar overhead per entry allowed in the decompressed stream: a header, padding and a long
/// name or pax record.
const STREAM_BYTES_PER_ENTRY: u64 = 1536;

/// A reader that fails, rather than ending, after `cap` bytes: a truncated stream would read
/// as a damaged archive, not as one that is too big.
struct Capped<R> {
    inner: R,
    left: u64,
    cap: u64,
}

impl<R: std::io::Read> std::io::Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            // One more byte means the stream goes on past the cap.
            let mut probe = [0u8; 1];
            return match self.inner.read(&mut probe)? {
                0 => Ok(0),
                _ => Err(std::io::Error::other(format!(
                    "decompresses to more than {} MiB, the cap for a capture archive",
                    self.cap >> 20
                ))),
            };
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.left -= n as u64;
        Ok(n)
    }
}

/// [`TopoError::RootUnusable`] for `archive`.
fn unusable(archive: &Path, why: String, source: Option<std::io::Error>) -> TopoError {
    TopoError::RootUnusable {
        path: archive.to_path_buf(),
        why,
        source,
    }
}

struct Unpacker {
    /// The archive, as its errors name it.
    archive: PathBuf,
    dst: PathBuf,
    limits: ArchiveLimits,
    written: u64,
}

impl Unpacker {
    fn entry<R: std::io::Read>(&mut self, mut e: tar::Entry<'_, R>) -> Result<(), TopoError> {
        let archive = self.archive.clone();
        let refuse = |why: String| unusable(&archive, why, None);
        let raw = e
            .path()
            .map_err(|err| unusable(&archive, "entry with an unreadable name".into(), Some(err)))?
            .into_owned();
        let shown = printable(&raw.to_string_lossy());
        let rel = clean_name(&raw).map_err(|w| refuse(format!("entry {shown:?}: {w}")))?;
        let kind = e.header().entry_type();
        if rel.as_os_str().is_empty() {
            // `./` itself: the folder exists already.
            return if kind.is_dir() {
                Ok(())
            } else {
                Err(refuse(format!(
                    "entry {shown:?}: not a folder but names the root"
                )))
            };
        }
        let depth = rel.components().count();
        if depth > self.limits.max_depth {
            return Err(refuse(format!(
                "entry {shown:?} is {depth} levels deep, more than the {} a capture may have",
                self.limits.max_depth
            )));
        }
        if let Some(link) = self.link_on_the_way(&rel) {
            return Err(refuse(format!(
                "entry {shown:?}: goes through or replaces the symlink {link:?}: refused"
            )));
        }
        let host = self.dst.join(&rel);
        let io = |err: std::io::Error| {
            unusable(
                &archive,
                format!("entry {shown:?}: cannot write"),
                Some(err),
            )
        };
        if kind.is_dir() {
            return std::fs::create_dir_all(&host).map_err(io);
        }
        if let Some(parent) = host.parent() {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        if kind.is_file() || kind == tar::EntryType::Continuous {
            let left = self.limits.max_bytes - self.written;
            let mut f = std::fs::File::create(&host).map_err(io)?;
            // Count what really comes out of the decoder, not what the header claims.
            let n = std::io::copy(&mut (&mut e).take(left + 1), &mut f).map_err(io)?;
            if n > left {
                return Err(refuse(format!(
                    "holds more than {} MiB of files (the cap for a capture archive; a gdx \
                     capture is a few MB): not unpacked",
                    self.limits.max_bytes >> 20
                )));
            }
            self.written += n;
            return Ok(());
        }
        if kind.is_symlink() {
            if depth == 1 {
                return Err(refuse(format!(
                    "entry {shown:?} is a symlink at the top level: refused (it would make the \
                     root point outside the archive)"
                )));
            }
            let target = e
                .link_name()
                .map_err(|err| {
                    unusable(
                        &archive,
                        format!("entry {shown:?}: unreadable link target"),
                        Some(err),
                    )
                })?
                .ok_or_else(|| refuse(format!("entry {shown:?}: symlink without a target")))?
                .into_owned();
            let shown_t = printable(&target.to_string_lossy());
            if !stays_inside(&rel, &target) {
                return Err(refuse(format!(
                    "entry {shown:?} links to {shown_t:?}, outside the archive: refused"
                )));
            }
            return std::os::unix::fs::symlink(&target, &host).map_err(io);
        }
        if kind.is_pax_global_extensions() {
            return Ok(());
        }
        let what = if kind.is_hard_link() {
            "a hard link"
        } else if kind.is_character_special() || kind.is_block_special() {
            "a device file"
        } else if kind.is_fifo() {
            "a FIFO"
        } else {
            "of a kind no capture holds"
        };
        Err(refuse(format!(
            "entry {shown:?} is {what}: refused (a capture has folders, files and symlinks)"
        )))
    }

    /// The link (as shown) that an entry at `rel` would write through or replace; `None` when
    /// there is none. Both are refused: that is how a link that stays inside would let a
    /// later entry land outside.
    fn link_on_the_way(&self, rel: &Path) -> Option<String> {
        let mut at = self.dst.clone();
        for c in rel.components() {
            at.push(c);
            match std::fs::symlink_metadata(&at) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Some(printable(
                        &at.strip_prefix(&self.dst).unwrap_or(&at).to_string_lossy(),
                    ))
                }
                Ok(_) => {}
                Err(_) => return None,
            }
        }
        None
    }
}

/// The entry name as a clean relative path (`./` and `.` components dropped); refused when it
/// is absolute or climbs with `..`.
fn clean_name(p: &Path) -> Result<PathBuf, &'static str> {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => return Err("names a parent folder (..): refused"),
            Component::RootDir | Component::Prefix(_) => {
                return Err("is an absolute path: refused")
            }
        }
    }
    Ok(out)
}

/// True when a link at `rel` (a clean relative path) to `target` resolves, by its text, to a
/// place inside the archive. Absolute targets are refused: a capture's links are relative.
fn stays_inside(rel: &Path, target: &Path) -> bool {
    let mut depth: usize = rel.components().count().saturating_sub(1);
    for c in target.components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => match depth.checked_sub(1) {
                Some(d) => depth = d,
                None => return false,
            },
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_targets_are_judged_by_their_text() {
        let rel = Path::new("sys/bus/pci/devices/0000:00:01.0");
        assert!(stays_inside(rel, Path::new("../../../devices/pci0000:00")));
        assert!(stays_inside(rel, Path::new("../../../../x")));
        assert!(!stays_inside(rel, Path::new("../../../../../x")));
        assert!(!stays_inside(rel, Path::new("/sys/devices")));
        assert!(!stays_inside(Path::new("a/b"), Path::new("../..")));
        assert!(stays_inside(Path::new("a/b"), Path::new("./c/../../d")));
    }

    #[test]
    fn names_are_cleaned_or_refused() {
        assert_eq!(clean_name(Path::new("./a/./b")).unwrap(), Path::new("a/b"));
        assert!(clean_name(Path::new("a/../../b")).is_err());
        assert!(clean_name(Path::new("/etc/passwd")).is_err());
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(printable("a\u{1b}[31mb\n"), "a\\u{1b}[31mb\\n");
        assert_eq!(printable("mlx5_0 é"), "mlx5_0 é");
    }
}
