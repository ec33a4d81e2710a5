//! `--root X.tar.gz` is input from another machine: unpacking is bounded (bytes, entries,
//! depth), confined (no top-level symlink, no link or entry that leaves the root), cleans up
//! after itself, and escapes the names it prints. Each case below was accepted before.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_topo::sysfs::archive::{open_root, open_root_with, ArchiveLimits, Require};
use gdx_topo::TopoError;
use std::path::Path;

/// An archive builder: entries are added in order, as a hostile archive would order them.
struct Tgz {
    b: tar::Builder<flate2::write::GzEncoder<Vec<u8>>>,
}

impl Tgz {
    fn new() -> Tgz {
        let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        Tgz {
            b: tar::Builder::new(gz),
        }
    }

    fn header(kind: tar::EntryType, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(0o755);
        h
    }

    fn dir(mut self, name: &str) -> Tgz {
        let mut h = Tgz::header(tar::EntryType::Directory, 0);
        self.b
            .append_data(&mut h, name, std::io::empty())
            .expect("dir");
        self
    }

    fn file(mut self, name: &str, data: &[u8]) -> Tgz {
        let mut h = Tgz::header(tar::EntryType::Regular, data.len() as u64);
        self.b.append_data(&mut h, name, data).expect("file");
        self
    }

    fn zeros(mut self, name: &str, len: u64) -> Tgz {
        let mut h = Tgz::header(tar::EntryType::Regular, len);
        self.b
            .append_data(&mut h, name, std::io::repeat(0).take(len))
            .expect("zeros");
        self
    }

    fn symlink(mut self, name: &str, target: &str) -> Tgz {
        let mut h = Tgz::header(tar::EntryType::Symlink, 0);
        self.b.append_link(&mut h, name, target).expect("symlink");
        self
    }

    fn special(mut self, name: &str, kind: tar::EntryType) -> Tgz {
        let mut h = Tgz::header(kind, 0);
        self.b
            .append_data(&mut h, name, std::io::empty())
            .expect("special");
        self
    }

    /// Write the archive as `name` in `dir`.
    fn write(self, dir: &Path, name: &str) -> std::path::PathBuf {
        let gz = self.b.into_inner().expect("tar");
        let bytes = gz.finish().expect("gzip");
        let p = dir.join(name);
        std::fs::write(&p, bytes).expect("write archive");
        p
    }
}

use std::io::Read as _;

/// The smallest tree `from_root` accepts.
fn valid() -> Tgz {
    Tgz::new()
        .dir("sys")
        .dir("sys/bus")
        .dir("sys/bus/pci")
        .dir("sys/bus/pci/devices")
}

/// Open with a private temporary parent; return the error and assert nothing is left there.
fn refused(archive: &Path, limits: &ArchiveLimits) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let r = open_root_with(archive, Require::PciTree, limits, Some(tmp.path()));
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert!(left.is_empty(), "unpacked files left behind: {left:?}");
    match r {
        // The message as shown: the reason and, for a read error, its cause.
        Err(e @ TopoError::RootUnusable { .. }) => e.to_string(),
        Err(e) => panic!("unexpected error {e}"),
        Ok(o) => panic!("accepted, unpacked at {}", o.dir().display()),
    }
}

#[test]
fn a_valid_archive_opens_and_its_folder_goes_away_on_drop() {
    let d = tempfile::tempdir().unwrap();
    let a = valid().file("sys/x", b"1\n").write(d.path(), "ok.tar.gz");
    let tmp = tempfile::tempdir().unwrap();
    let o = open_root_with(
        &a,
        Require::PciTree,
        &ArchiveLimits::default(),
        Some(tmp.path()),
    )
    .unwrap();
    assert!(o.is_archive());
    assert_eq!(o.given(), a.as_path());
    assert_eq!(std::fs::read(o.dir().join("sys/x")).unwrap(), b"1\n");
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
    drop(o);
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
}

#[test]
fn byte_cap_stops_a_bomb_and_removes_what_it_wrote() {
    let d = tempfile::tempdir().unwrap();
    // 4 MiB of zeros compress to a few KiB: the cap counts bytes written, not archive size.
    let a = valid()
        .zeros("sys/bomb", 4 << 20)
        .write(d.path(), "bomb.tgz");
    assert!(std::fs::metadata(&a).unwrap().len() < 64 << 10);
    let limits = ArchiveLimits {
        max_bytes: 1 << 20,
        ..ArchiveLimits::default()
    };
    let why = refused(&a, &limits);
    assert!(why.contains("more than 1 MiB"), "{why}");
    // Within the cap the same archive opens.
    let roomy = ArchiveLimits {
        max_bytes: 8 << 20,
        ..ArchiveLimits::default()
    };
    assert!(open_root_with(&a, Require::PciTree, &roomy, None).is_ok());
}

#[test]
fn entry_cap() {
    let d = tempfile::tempdir().unwrap();
    let mut t = valid();
    for i in 0..40 {
        t = t.file(&format!("sys/f{i}"), b"x");
    }
    let a = t.write(d.path(), "many.tar.gz");
    let limits = ArchiveLimits {
        max_entries: 20,
        ..ArchiveLimits::default()
    };
    let why = refused(&a, &limits);
    assert!(why.contains("more than 20 entries"), "{why}");
}

#[test]
fn depth_cap_refuses_deep_trees_with_the_default_limits() {
    let d = tempfile::tempdir().unwrap();
    let mut t = valid();
    let mut name = String::from("sys/deep");
    for _ in 0..100 {
        t = t.dir(&name);
        name.push_str("/d");
    }
    let a = t.write(d.path(), "deep.tar.gz");
    let why = refused(&a, &ArchiveLimits::default());
    assert!(why.contains("levels deep, more than the 64"), "{why}");
}

#[test]
fn a_top_level_symlink_is_refused() {
    let d = tempfile::tempdir().unwrap();
    // Before: the one top-level entry was followed to the analysing machine's own `/`.
    let a = Tgz::new().symlink("cap", "/").write(d.path(), "top.tar.gz");
    let why = refused(&a, &ArchiveLimits::default());
    assert!(why.contains("symlink at the top level"), "{why}");
    let a = Tgz::new().symlink("cap", ".").write(d.path(), "dot.tar.gz");
    assert!(refused(&a, &ArchiveLimits::default()).contains("top level"));
}

#[test]
fn links_that_leave_the_root_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let a = valid()
        .symlink("sys/esc", "../../etc")
        .write(d.path(), "esc.tar.gz");
    let why = refused(&a, &ArchiveLimits::default());
    assert!(why.contains("outside the archive"), "{why}");
    let a = valid()
        .symlink("sys/abs", "/etc/passwd")
        .write(d.path(), "abs.tar.gz");
    assert!(refused(&a, &ArchiveLimits::default()).contains("outside the archive"));
    // A link inside is fine (captures are full of them).
    let a = valid()
        .dir("sys/devices")
        .symlink("sys/bus/pci/devices/x", "../../../devices")
        .write(d.path(), "in.tar.gz");
    assert!(open_root(&a, Require::PciTree).is_ok());
}

#[test]
fn entries_written_through_a_link_are_refused() {
    let d = tempfile::tempdir().unwrap();
    // `sys/a` stays inside, but `sys/a/..` is not where its text says: nothing may be written
    // through a link.
    let a = valid()
        .dir("sys/b")
        .symlink("sys/a", "b")
        .file("sys/a/f", b"x")
        .write(d.path(), "through.tar.gz");
    let why = refused(&a, &ArchiveLimits::default());
    assert!(
        why.contains("goes through or replaces the symlink"),
        "{why}"
    );
}

#[test]
fn devices_fifos_and_hard_links_are_refused_with_escaped_names() {
    let d = tempfile::tempdir().unwrap();
    let a = valid()
        .special("sys/\u{1b}[2Jfifo", tar::EntryType::Fifo)
        .write(d.path(), "fifo.tar.gz");
    let why = refused(&a, &ArchiveLimits::default());
    assert!(why.contains("is a FIFO"), "{why}");
    assert!(
        !why.contains('\u{1b}'),
        "raw escape reached the message: {why:?}"
    );
    assert!(why.contains("\\u{1b}[2Jfifo"), "{why}");
    let a = valid()
        .special("sys/dev", tar::EntryType::Char)
        .write(d.path(), "dev.tar.gz");
    assert!(refused(&a, &ArchiveLimits::default()).contains("device file"));
}

#[test]
fn from_root_uses_the_bounded_unpacker() {
    let d = tempfile::tempdir().unwrap();
    let a = Tgz::new().symlink("cap", "/").write(d.path(), "top.tar.gz");
    let e = gdx_topo::from_root(&a).unwrap_err();
    assert!(e.to_string().contains("symlink at the top level"), "{e}");
}

#[test]
fn the_decompressed_stream_is_capped_even_for_names_tar_reads_into_memory() {
    let d = tempfile::tempdir().unwrap();
    // A GNU long-name record tar itself reads whole into memory: 4 MiB of 'a'.
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::GNULongName);
    let len = 4u64 << 20;
    h.set_size(len);
    h.set_path("././@LongLink").unwrap();
    h.set_cksum();
    b.append(&h, std::io::repeat(b'a').take(len)).unwrap();
    let bytes = b.into_inner().unwrap().finish().unwrap();
    let a = d.path().join("longname.tar.gz");
    std::fs::write(&a, bytes).unwrap();
    let limits = ArchiveLimits {
        max_bytes: 1 << 20,
        max_entries: 10,
        ..ArchiveLimits::default()
    };
    let why = refused(&a, &limits);
    assert!(why.contains("decompresses to more than 1 MiB"), "{why}");
}

#[test]
fn a_fifo_named_like_an_archive_is_refused_without_being_opened() {
    let d = tempfile::tempdir().unwrap();
    let fifo = d.path().join("cap.tar.gz");
    let st = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(st.success());
    // Before, File::open blocked here waiting for a writer.
    let why = refused(&fifo, &ArchiveLimits::default());
    assert!(
        why.contains("not a folder or a .tar.gz/.tgz capture file"),
        "{why}"
    );
}
