//! The planner reads the page cache's residency: a partly cached file is read page by page,
//! the cached pages through the page cache and the rest with `O_DIRECT`, and the report's split
//! is what `mincore` says of the file. The file lives under the target folder (a real disk on
//! CI: `posix_fadvise(DONTNEED)` evicts there); on tmpfs, where every page is always resident,
//! the same assertions hold with nothing to split. No test asserts a speed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use gdx_base::pattern::pattern;
use gdx_storage::{copy_file_to_host, residency, CopyOptions, FileRange, PathChoice, StoragePath};
use std::io::Read;
use std::os::unix::fs::FileExt;

const MIB: usize = 1 << 20;
const TMPFS_MAGIC: u64 = 0x0102_1994;

fn on_tmpfs(dir: &std::path::Path) -> bool {
    rustix::fs::statfs(dir).is_ok_and(|s| s.f_type as u64 == TMPFS_MAGIC)
}

#[test]
fn a_partly_cached_file_splits_its_bytes_as_mincore_says() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let p = dir.path().join("ckpt.bin");
    let len = 16 * MIB;
    let data = pattern(len, 45);
    std::fs::write(&p, &data).unwrap();
    let f = std::fs::File::open(&p).unwrap();
    f.sync_all().unwrap();
    // Evict the file, then read two ranges back in (read-ahead may bring in more: the test
    // asserts on what mincore reports, not on what was read).
    rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).unwrap();
    let mut head = vec![0u8; MIB];
    (&f).read_exact(&mut head).unwrap();
    f.read_exact_at(&mut head[..MIB / 2], 9 * MIB as u64)
        .unwrap();

    let res = residency(&p, 0, None).unwrap();
    let cached = res.resident_bytes();
    let total = len as u64;
    eprintln!("mincore: {cached} of {total} bytes resident");
    if !on_tmpfs(dir.path()) {
        // On a disk, DONTNEED evicts clean pages and the reads above bring some back.
        assert!(cached > 0 && cached < total, "{cached} of {total}");
    }

    let opts = CopyOptions {
        chunk_bytes: 4 * MIB,
        depth: 3,
        ..Default::default()
    };
    let mut back = vec![0u8; len];
    let r = copy_file_to_host(&FileRange::whole(&p), &mut back, &opts).unwrap();
    assert!(back == data, "the bytes differ");
    let split = r.split.unwrap();
    assert_eq!(split.page_cache + split.direct, total, "{split:?}");
    if cached == total {
        assert_eq!(r.path, StoragePath::Buffered, "{}", r.reason);
        assert!(r.reason.contains("all of the 16 MiB range"), "{}", r.reason);
    } else {
        assert_eq!(r.path, StoragePath::FileStaged, "{}", r.reason);
        assert_eq!(split.page_cache, cached, "{}", r.reason);
        assert_eq!(split.direct, total - cached, "{}", r.reason);
        assert!(r.reason.contains("(mincore)"), "{}", r.reason);
    }

    // An explicit path ignores residency: O_DIRECT reads every byte.
    let staged = CopyOptions {
        path: PathChoice::FileStaged,
        ..opts
    };
    let r = copy_file_to_host(&FileRange::whole(&p), &mut back, &staged).unwrap();
    assert!(back == data, "the bytes differ");
    assert_eq!(r.split.unwrap().direct, total, "{}", r.reason);
}
