//! File regions (`Location::File`) through the engine API: host regions ↔ a file range on any
//! machine, and file → GPU → file through [`LocalPeer`] where there is a GPU (skipped at run
//! time with a printed reason elsewhere, like `tests/gpu.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::*;
use gdx_engine::file::{plan_file, FileOptions, FilePath, FileRange};
use gdx_engine::{Access, Error, LocalPeer, Location, Mem, Path, Policy};

fn file_paths() -> [Path; 2] {
    [Path::FileStaged, Path::Buffered]
}

#[test]
fn host_region_to_file_range_and_back() {
    let a = agent("file-host", false);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("region.bin");
    let len = (3 << 20) + 17;
    let data = pattern(len, 7);
    let mut src = a.alloc(len as u64 + 9, Access::LOCAL, None).unwrap();
    src.bytes_mut().unwrap()[9..].copy_from_slice(&data);

    // Write the region's bytes at an unaligned offset of the file.
    let range = FileRange::new(&file, 4097, len as u64);
    let (plan, n) = src
        .copy_to_file(9, len as u64, &range, &FileOptions::default())
        .unwrap();
    assert_eq!(n, len as u64);
    assert!(file_paths().contains(&plan.path), "{plan}");
    assert!(plan.reason.starts_with("file ↔ host"), "{plan}");
    let on_disk = std::fs::read(&file).unwrap();
    assert_eq!(on_disk.len(), 4097 + len);
    assert!(on_disk[4097..] == data[..], "file bytes differ");

    // Read the range back into another region, after a poisoned prefix.
    let mut dst = a.alloc(len as u64 + 5, Access::LOCAL, None).unwrap();
    dst.bytes_mut().unwrap().fill(0xA5);
    let (plan, n) = dst
        .copy_from_file(5, &range, &FileOptions::default())
        .unwrap();
    assert_eq!(n, len as u64);
    assert!(file_paths().contains(&plan.path), "{plan}");
    let got = dst.bytes().unwrap();
    assert!(got[..5].iter().all(|&b| b == 0xA5));
    assert!(got[5..] == data[..], "region bytes differ");
    drop(got);

    // Buffered when asked; gds refused for host memory; bounds checked.
    let buffered = FileOptions {
        path: FilePath::Buffered,
        ..FileOptions::default()
    };
    let (plan, _) = dst.copy_from_file(5, &range, &buffered).unwrap();
    assert_eq!(plan.path, Path::Buffered, "{plan}");
    let gds = FileOptions {
        path: FilePath::Gds,
        ..FileOptions::default()
    };
    let e = dst.copy_from_file(0, &range, &gds).unwrap_err();
    assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
    let e = dst
        .copy_from_file(6, &range, &FileOptions::default())
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    let e = src
        .copy_to_file(10, len as u64, &range, &FileOptions::default())
        .unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { .. }), "{e:?}");
}

#[test]
fn planner_names_the_file_paths() {
    let p = plan_file(Location::Host, &FileOptions::default(), &Policy::strict()).unwrap();
    assert_eq!(p.path, Path::FileStaged);
    assert_eq!(p.path.to_string(), "file-staged");
    assert_eq!(Path::Gds.to_string(), "gds");
    assert_eq!(Path::Buffered.to_string(), "buffered");
    assert_eq!(
        serde_json::to_string(&Path::FileStaged).unwrap(),
        "\"file-staged\""
    );
    // GPU memory: gds only where cuFile runs true GDS, else file-staged with the reason; strict
    // mode agrees (no true GDS means no fallback).
    let p = plan_file(
        Location::Gpu(0),
        &FileOptions::default(),
        &Policy::default(),
    )
    .unwrap();
    assert!(matches!(p.path, Path::Gds | Path::FileStaged), "{p}");
    assert!(!p.reason.is_empty());
    let strict = plan_file(Location::Gpu(0), &FileOptions::default(), &Policy::strict()).unwrap();
    assert_eq!(strict.path, p.path);
    let e = plan_file(Location::File, &FileOptions::default(), &Policy::default()).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
}

#[test]
#[ignore = "requires a GPU: cargo test -p gdx-engine --test file -- --ignored"]
fn file_to_gpu_to_file_verified() {
    let peer = LocalPeer::open(Policy::default(), Default::default())
        .unwrap_or_else(|e| panic!("file_to_gpu_to_file_verified requires a GPU: {e}"));
    let dir = tempfile::tempdir().unwrap();
    let (src_file, dst_file) = (dir.path().join("src.bin"), dir.path().join("dst.bin"));
    for (i, len) in [1usize, 4099, (16 << 20) + 5, 64 << 20]
        .into_iter()
        .enumerate()
    {
        let data = pattern(len, 100 + i as u64);
        // The source range sits at an unaligned offset after junk.
        let mut file = pattern(513, 9);
        file.extend_from_slice(&data);
        std::fs::write(&src_file, &file).unwrap();

        let gpu = peer.alloc_device(0, len as u64 + 3).unwrap();
        let (plan, n) = peer
            .copy_file_to(
                Mem::Gpu(&gpu),
                3,
                &FileRange::new(&src_file, 513, len as u64),
                &FileOptions::default(),
            )
            .unwrap();
        assert_eq!(n, len as u64);
        assert!(
            matches!(plan.path, Path::Gds | Path::FileStaged | Path::Buffered),
            "{plan}"
        );
        eprintln!("file -> gpu0 {len} B: {plan}");

        let (plan, n) = peer
            .copy_to_file(
                Mem::Gpu(&gpu),
                3,
                len as u64,
                &FileRange::whole(&dst_file),
                &FileOptions {
                    truncate: true,
                    sync: true,
                    ..FileOptions::default()
                },
            )
            .unwrap();
        assert_eq!(n, len as u64);
        eprintln!("gpu0 -> file {len} B: {plan}");
        let back = std::fs::read(&dst_file).unwrap();
        assert_eq!(back.len(), len);
        assert!(
            back == data,
            "bytes differ after file -> GPU -> file ({len} B)"
        );
    }

    // Through a pinned region too.
    let len = (1 << 20) + 1;
    let data = pattern(len, 5);
    std::fs::write(&src_file, &data).unwrap();
    let pinned = peer.alloc_pinned(len as u64).unwrap();
    let (plan, _) = peer
        .copy_file_to(
            Mem::Pinned(&pinned),
            0,
            &FileRange::whole(&src_file),
            &FileOptions::default(),
        )
        .unwrap();
    assert!(
        matches!(plan.path, Path::FileStaged | Path::Buffered),
        "{plan}"
    );
    assert!(pinned.with_bytes(|b| b == &data[..]).unwrap());
}
