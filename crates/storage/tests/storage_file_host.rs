//! File ↔ host memory through the staged pipeline, end to end through the public API: every
//! size class, unaligned ranges, a range across 4 GiB of a sparse file, a file that shrinks
//! during the copy, a read-only destination, a missing file. Every copied byte is compared.
//! No test asserts a speed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_base::pattern::pattern;
use gdx_storage::{
    checksum_bytes, checksum_file, copy_file_to_host, copy_host_to_file, read_file, CopyOptions,
    FileRange, PathChoice, ProgressFn, StorageError, StoragePath,
};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Small chunks and a few in flight, so that even small files cross several chunks.
fn small_chunks() -> CopyOptions {
    CopyOptions {
        chunk_bytes: 64 << 10,
        depth: 3,
        ..Default::default()
    }
}

fn check_path(path: StoragePath, reason: &str) {
    // CI's file systems take O_DIRECT; should one not, the report must say so.
    match path {
        StoragePath::FileStaged => assert!(reason.contains("O_DIRECT on"), "{reason}"),
        // Or the planner found the range in the page cache (a file just written is).
        StoragePath::Buffered => assert!(
            reason.contains("O_DIRECT was asked for but")
                || reason.contains("range is in the page cache (mincore): read through it"),
            "{reason}"
        ),
        StoragePath::Gds => panic!("host copies never take gds: {reason}"),
    }
}

#[test]
fn every_size_round_trips_through_the_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("f.bin");
    for (i, len) in [
        0usize,
        1,
        7,
        4095,
        4096,
        4097,
        65_536,
        65_537,
        (1 << 20) + 123,
    ]
    .into_iter()
    .enumerate()
    {
        let data = pattern(len, i as u64 + 1);
        let opts = CopyOptions {
            truncate: true,
            ..small_chunks()
        };
        let w = copy_host_to_file(&data, &FileRange::whole(&p), &opts).unwrap();
        assert_eq!(w.bytes, len as u64);
        check_path(w.path, &w.reason);
        assert_eq!(std::fs::read(&p).unwrap(), data, "len {len}: file contents");

        let mut back = vec![0xA5u8; len + 3];
        let r = copy_file_to_host(&FileRange::whole(&p), &mut back, &small_chunks()).unwrap();
        assert_eq!(r.bytes, len as u64);
        check_path(r.path, &r.reason);
        assert_eq!(&back[..len], &data[..], "len {len}: read back");
        assert!(
            back[len..].iter().all(|&b| b == 0xA5),
            "len {len}: wrote past the range"
        );
        if len == 0 {
            assert_eq!(r.gbps(), None);
        }
    }
}

#[test]
fn unaligned_ranges_read_and_write_exactly_their_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("f.bin");
    let base = pattern(300_000, 9);
    std::fs::write(&p, &base).unwrap();
    for (offset, len) in [
        (1u64, 1u64),
        (4095, 2),
        (4097, 65_536),
        (100, 200_000),
        (0, 4097),
    ] {
        let mut out = vec![0u8; len as usize];
        let r =
            copy_file_to_host(&FileRange::new(&p, offset, len), &mut out, &small_chunks()).unwrap();
        assert_eq!(r.bytes, len);
        assert_eq!(
            &out[..],
            &base[offset as usize..(offset + len) as usize],
            "read {offset}+{len}"
        );
    }
    // Writes into the middle keep every byte around the range.
    let mut expected = base.clone();
    for (offset, len) in [(3u64, 10usize), (4095, 4098), (12_345, 70_001)] {
        let patch = pattern(len, offset);
        expected[offset as usize..offset as usize + len].copy_from_slice(&patch);
        copy_host_to_file(
            &patch,
            &FileRange::new(&p, offset, len as u64),
            &small_chunks(),
        )
        .unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), expected, "write {offset}+{len}");
    }
}

#[test]
fn buffered_path_is_taken_when_asked_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("f.bin");
    let data = pattern(100_003, 3);
    let opts = CopyOptions {
        path: PathChoice::Buffered,
        ..small_chunks()
    };
    let w = copy_host_to_file(&data, &FileRange::whole(&p), &opts).unwrap();
    assert_eq!(w.path, StoragePath::Buffered);
    assert!(
        w.reason
            .contains("buffered I/O through the page cache was asked for"),
        "{}",
        w.reason
    );
    let mut back = vec![0u8; data.len()];
    let r = copy_file_to_host(&FileRange::whole(&p), &mut back, &opts).unwrap();
    assert_eq!(r.path, StoragePath::Buffered);
    assert_eq!(back, data);
}

#[test]
fn gds_is_refused_for_host_memory() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("f.bin");
    std::fs::write(&p, b"abc").unwrap();
    let opts = CopyOptions {
        path: PathChoice::Gds,
        ..Default::default()
    };
    let e = copy_file_to_host(&FileRange::whole(&p), &mut [0u8; 3], &opts).unwrap_err();
    assert!(
        matches!(
            e,
            StorageError::PathUnavailable {
                path: StoragePath::Gds,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn a_range_across_4_gib_of_a_sparse_file() {
    const GIB4: u64 = 4 << 30;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("sparse.bin");
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(GIB4 + (1 << 30) + 12_345).unwrap();
    drop(f);
    // Marker blocks just below, across and above the 4 GiB line, written unaligned through the
    // pipeline itself.
    let markers = [
        (GIB4 - (1 << 20) - 3, pattern(5000, 1)),
        (GIB4 - 5, pattern(10, 2)),
        (GIB4 + 70_000, pattern(4096, 3)),
    ];
    for (at, bytes) in &markers {
        let r = copy_host_to_file(
            bytes,
            &FileRange::new(&p, *at, bytes.len() as u64),
            &small_chunks(),
        )
        .unwrap();
        assert_eq!(r.bytes, bytes.len() as u64);
    }
    let start = GIB4 - (1 << 20) - 10;
    let len = (2 << 20) + 11;
    let mut expected = vec![0u8; len as usize];
    for (at, bytes) in &markers {
        let rel = (at - start) as usize;
        expected[rel..rel + bytes.len()].copy_from_slice(bytes);
    }
    let mut out = vec![0xA5u8; len as usize];
    let r = copy_file_to_host(&FileRange::new(&p, start, len), &mut out, &small_chunks()).unwrap();
    assert_eq!(r.bytes, len);
    assert!(out == expected, "bytes across 4 GiB differ");
    assert_eq!(
        checksum_file(&FileRange::new(&p, start, len)).unwrap(),
        checksum_bytes(&expected)
    );
    // The file stayed sparse: only the markers' blocks are allocated.
    use std::os::unix::fs::MetadataExt;
    let blocks = std::fs::metadata(&p).unwrap().blocks();
    assert!(blocks * 512 < 64 << 20, "{blocks} blocks allocated");
}

#[test]
fn a_file_that_shrinks_during_the_copy_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("shrinks.bin");
    std::fs::write(&p, pattern(8 << 20, 4)).unwrap();
    // Another writer truncates the file as soon as the first chunk has arrived; 3 chunks of
    // 64 KiB are in flight at most, so most of the file is still to be read.
    let victim: PathBuf = p.clone();
    let cut = Arc::new(AtomicBool::new(false));
    let progress: ProgressFn = {
        let cut = Arc::clone(&cut);
        Arc::new(move |_, _| {
            if !cut.swap(true, Ordering::SeqCst) {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&victim)
                    .unwrap();
                f.set_len(100_000).unwrap();
            }
        })
    };
    let opts = CopyOptions {
        progress: Some(progress),
        ..small_chunks()
    };
    let mut out = vec![0u8; 8 << 20];
    let e = copy_file_to_host(&FileRange::whole(&p), &mut out, &opts).unwrap_err();
    match &e {
        StorageError::Shrunk {
            path,
            eof,
            expected_end,
            size_at_start,
        } => {
            assert_eq!(path, &p);
            assert_eq!(*size_at_start, 8 << 20);
            assert!(*eof < *expected_end, "{e}");
        }
        other => panic!("expected Shrunk, got {other}"),
    }
    let msg = e.to_string();
    assert!(msg.contains("shrank during the copy"), "{msg}");
    assert!(msg.contains("shrinks.bin"), "{msg}");
}

/// A destination this process cannot open for writing: a read-only file, or (when running as
/// root, which may write read-only files) a read-only sysfs attribute.
fn unwritable(dir: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let ro = dir.join("read-only.bin");
    std::fs::write(&ro, b"keep me").unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o444)).unwrap();
    [ro, PathBuf::from("/sys/kernel/uevent_seqnum")]
        .into_iter()
        .find(|c| c.exists() && std::fs::OpenOptions::new().write(true).open(c).is_err())
}

#[test]
fn a_read_only_destination_is_a_clear_error_and_nothing_changes() {
    let dir = tempfile::tempdir().unwrap();
    let dst = unwritable(dir.path());
    if !gdx_base::testenv::precondition("a destination that refuses writing", dst.is_some()) {
        return;
    }
    let dst = dst.unwrap();
    let before = std::fs::read(&dst).ok();
    let opts = CopyOptions {
        truncate: true,
        ..Default::default()
    };
    let e = copy_host_to_file(b"new bytes", &FileRange::whole(&dst), &opts).unwrap_err();
    assert!(
        matches!(
            e,
            StorageError::Open {
                purpose: "writing",
                ..
            }
        ),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.starts_with(&format!("cannot open {} for writing: ", dst.display())),
        "{msg}"
    );
    assert!(
        msg.contains("Permission denied") || msg.contains("Read-only file system"),
        "{msg}"
    );
    if dst.starts_with(dir.path()) {
        assert_eq!(std::fs::read(&dst).ok(), before);
    }
}

#[test]
fn a_missing_file_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such.bin");
    let e = copy_file_to_host(
        &FileRange::whole(&missing),
        &mut [],
        &CopyOptions::default(),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "cannot open {} for reading: No such file or directory (os error 2)",
            missing.display()
        )
    );
    let e = copy_host_to_file(
        b"x",
        &FileRange::whole(dir.path().join("no/dir/f")),
        &CopyOptions::default(),
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("for writing: No such file or directory"),
        "{e}"
    );
}

#[test]
fn ranges_and_buffers_are_checked_before_any_io() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("f.bin");
    std::fs::write(&p, pattern(1000, 5)).unwrap();
    let e = copy_file_to_host(
        &FileRange::new(&p, 900, 101),
        &mut [0u8; 200],
        &CopyOptions::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("is 1000 byte(s) long"), "{e}");
    let e = copy_file_to_host(
        &FileRange::whole(&p),
        &mut [0u8; 999],
        &CopyOptions::default(),
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("999-byte destination host buffer"),
        "{e}"
    );
    let e = copy_host_to_file(
        &[1, 2, 3],
        &FileRange::new(&p, 0, 4),
        &CopyOptions::default(),
    )
    .unwrap_err();
    assert!(
        matches!(e, StorageError::LengthMismatch { dst: 4, src: 3, .. }),
        "{e}"
    );
    let bad = CopyOptions {
        chunk_bytes: 4097,
        ..Default::default()
    };
    assert!(matches!(
        copy_file_to_host(&FileRange::whole(&p), &mut [0u8; 1000], &bad),
        Err(StorageError::InvalidOption(_))
    ));
}

#[test]
fn truncate_replaces_and_its_absence_keeps_the_tail() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("f.bin");
    std::fs::write(&p, vec![7u8; 50_000]).unwrap();
    copy_host_to_file(&[1u8; 10], &FileRange::whole(&p), &CopyOptions::default()).unwrap();
    let kept = std::fs::read(&p).unwrap();
    assert_eq!(kept.len(), 50_000);
    assert_eq!(&kept[..10], &[1u8; 10]);
    let opts = CopyOptions {
        truncate: true,
        sync: true,
        ..Default::default()
    };
    copy_host_to_file(&[2u8; 10], &FileRange::whole(&p), &opts).unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), vec![2u8; 10]);
}

#[test]
fn read_file_streams_contiguous_chunks_in_order_with_progress() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("f.bin");
    let data = pattern(1_000_003, 6);
    std::fs::write(&p, &data).unwrap();
    let last = Arc::new(std::sync::Mutex::new((0u64, 0u64)));
    let progress: ProgressFn = {
        let last = Arc::clone(&last);
        Arc::new(move |done, total| *last.lock().unwrap() = (done, total))
    };
    let opts = CopyOptions {
        progress: Some(progress),
        ..small_chunks()
    };
    let mut seen = Vec::new();
    let r = read_file(&FileRange::new(&p, 5, 999_990), &opts, |rel, bytes| {
        assert_eq!(rel, seen.len() as u64);
        seen.extend_from_slice(bytes);
        Ok(())
    })
    .unwrap();
    assert_eq!(r.bytes, 999_990);
    assert_eq!(seen, &data[5..999_995]);
    assert_eq!(*last.lock().unwrap(), (999_990, 999_990));
}
