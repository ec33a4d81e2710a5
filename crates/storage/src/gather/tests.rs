//! The gather loader's parts that need no GPU: options, chunking, naming.

use super::*;

#[test]
fn options_are_checked_before_any_io() {
    assert!(GatherOptions::default().validate().is_ok());
    let e = |o: GatherOptions| o.validate().unwrap_err().to_string();
    let chunk = e(GatherOptions {
        chunk_bytes: 1000,
        ..Default::default()
    });
    assert!(chunk.contains("multiple of 4096"), "{chunk}");
    let readers = e(GatherOptions {
        readers: 0,
        ..Default::default()
    });
    assert!(readers.contains("readers must be 1 to 64"), "{readers}");
    let bufs = e(GatherOptions {
        buffers: 9,
        ..Default::default()
    });
    assert!(bufs.contains("1 to 8"), "{bufs}");
    let gds = e(GatherOptions {
        path: PathChoice::Gds,
        ..Default::default()
    });
    assert!(gds.contains("not cuFile"), "{gds}");
}

#[test]
fn default_readers_fit_the_host() {
    let n = default_readers();
    assert!((4..=16).contains(&n), "{n}");
}

#[test]
fn warm_methods_parse_by_name() {
    assert_eq!(WarmMethod::parse("readers").unwrap(), WarmMethod::Readers);
    assert_eq!(WarmMethod::parse("threads").unwrap(), WarmMethod::Readers);
    assert_eq!(WarmMethod::parse("register").unwrap(), WarmMethod::Register);
    let e = WarmMethod::parse("mmap").unwrap_err().to_string();
    assert!(e.contains("\"readers\" or \"register\""), "{e}");
    for m in [WarmMethod::Readers, WarmMethod::Register] {
        assert_eq!(WarmMethod::parse(m.key()).unwrap(), m);
    }
}

/// Every byte of every range is in exactly one chunk, in order, and chunks never cross ranges.
#[test]
fn jobs_cover_every_range_once() {
    let ranges = [
        (100u64, 3 * 4096),
        (8192 * 5 + 7, 1),
        (0, 0),
        (4096, 10 * 4096),
    ];
    let jobs = jobs(&ranges, 8192);
    for (i, &(offset, len)) in ranges.iter().enumerate() {
        let mine: Vec<_> = jobs.iter().filter(|j| j.range == i).collect();
        let mut rel = 0u64;
        for j in &mine {
            assert_eq!(j.piece.rel, rel, "range {i}");
            assert_eq!(j.piece.data_pos(), offset + rel);
            assert!(j.piece.need() <= j.piece.span && j.piece.span <= 8192);
            assert_eq!(j.piece.file_pos % 4096, 0);
            rel += j.piece.len as u64;
        }
        assert_eq!(rel, len, "range {i}");
    }
    assert!(
        jobs.iter().all(|j| j.range != 2),
        "an empty range has no chunk"
    );
    // In range order, so readers walk each file forwards.
    assert!(jobs.windows(2).all(|w| w[0].range <= w[1].range));
}

#[test]
fn the_summary_says_what_ran() {
    let f = |read, registered| FileOutcome {
        path: "a".into(),
        bytes: 1,
        read,
        registered,
        reason: String::new(),
        split: IoSplit::default(),
    };
    let o = GatherOptions::default();
    let s = summary(
        &[
            f(StoragePath::Buffered, false),
            f(StoragePath::FileStaged, false),
        ],
        &o,
        8,
        256 << 20,
        0,
    );
    assert_eq!(
        s,
        "8 reader(s), 16 MiB chunks, 2 x buffers per reader, 256 MiB pinned; 1 file(s) through \
         the page cache, 1 file(s) with O_DIRECT (not left in the page cache)"
    );
    let s = summary(&[f(StoragePath::Buffered, true)], &o, 4, 0, 128 << 20);
    assert!(
        s.contains("2 x registrations per reader, 0 B pinned"),
        "{s}"
    );
    assert!(
        s.contains("1 file(s) page-locked in place, 128 MiB at most at once"),
        "{s}"
    );
}
