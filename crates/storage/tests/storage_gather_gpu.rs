//! The gather loader (`gather_to_gpu`) on a real GPU: ranges of two files, unaligned and of
//! every size class, into poisoned device buffers at unaligned offsets, by each warm method and
//! each read path; every byte compared, the bytes around each range still poison, and the
//! pinned memory within its bound. A read-only file registration refuses to be written.
//!
//! `cargo test -p gdx-storage --test storage_gather_gpu -- --ignored`; the GPU is `GDX_TEST_GPU`
//! (default 0), the scratch folder `GDX_TEST_DIR` (default /tmp). No test asserts a speed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_base::pattern::pattern;
use gdx_base::testenv::{replay_seed as seed, test_gpu};
use gdx_storage::{gather_to_gpu, GatherOptions, GatherRange, PathChoice, StoragePath, WarmMethod};
use gdx_sys::cuda::{Context, Cuda, DeviceBuffer, PinnedHostBuffer, RegisteredFile, Stream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const POISON: u8 = 0xA5;

fn setup() -> (Context, Stream) {
    let cuda = Cuda::load().expect("libcuda");
    let ctx = cuda.context(test_gpu()).expect("context");
    let stream = Stream::new(&ctx).expect("stream");
    (ctx, stream)
}

fn read_back(ctx: &Context, stream: &Stream, dev: &DeviceBuffer) -> Vec<u8> {
    let mut host = PinnedHostBuffer::new(ctx, dev.len()).unwrap();
    stream.copy_to_host(&mut host, dev).unwrap();
    host.as_slice().unwrap().to_vec()
}

fn poisoned(ctx: &Context, stream: &Stream, len: usize) -> DeviceBuffer {
    let mut dev = DeviceBuffer::new(ctx, len).unwrap();
    stream.memset(&mut dev, 0, len, POISON).unwrap();
    stream.synchronize().unwrap();
    dev
}

fn gather(path: PathChoice, warm: WarmMethod) {
    let (ctx, stream) = setup();
    let s = seed();
    let dir = tempfile::tempdir_in(std::env::var("GDX_TEST_DIR").unwrap_or_else(|_| "/tmp".into()))
        .unwrap();
    let files = [dir.path().join("a.bin"), dir.path().join("b.bin")];
    let data = [pattern((40 << 20) + 123, s), pattern((9 << 20) + 5, s ^ 7)];
    for (f, d) in files.iter().zip(&data) {
        std::fs::write(f, d).unwrap();
    }
    // (file, offset, len, destination offset): one byte, a page, unaligned multi-chunk ranges.
    let spec = [
        (0usize, 0u64, 1u64, 0usize),
        (0, 8, (16 << 20) + 3, 5),
        (1, 4095, 4097, 4096),
        (0, (16 << 20) + 11, (20 << 20) + 1, 0),
        (1, 1 << 20, (8 << 20) + 5, 3),
    ];
    let seen = Arc::new(AtomicU64::new(0));
    let calls = Arc::new(AtomicU64::new(0));
    let (s2, c2) = (seen.clone(), calls.clone());
    let opts = GatherOptions {
        path,
        warm,
        readers: 3,
        chunk_bytes: 4 << 20,
        buffers: 2,
        progress: Some(Arc::new(move |done, _total| {
            s2.fetch_max(done, Ordering::Relaxed);
            c2.fetch_add(1, Ordering::Relaxed);
        })),
    };
    let mut kept: Vec<DeviceBuffer> = spec
        .iter()
        .map(|&(_, _, len, at)| poisoned(&ctx, &stream, at + len as usize + 9))
        .collect();
    let borrowed: Vec<GatherRange> = spec
        .iter()
        .zip(kept.iter_mut())
        .map(|(&(file, offset, len, at), d)| GatherRange {
            file,
            offset,
            len,
            // SAFETY: `d` outlives the call and nothing else uses it until the call returns,
            // which waits for every copy it queued.
            dst: unsafe { DeviceBuffer::from_raw_parts(&ctx, d.as_raw(), d.len()) },
            dst_offset: at,
        })
        .collect();
    let r = gather_to_gpu(&files, borrowed, &opts).unwrap();
    check_report(&r, path, warm, &spec);
    assert_eq!(
        seen.load(Ordering::Relaxed),
        r.bytes,
        "progress reaches the total"
    );
    assert!(calls.load(Ordering::Relaxed) >= spec.len() as u64);
    for (&(file, offset, len, at), d) in spec.iter().zip(&kept) {
        let got = read_back(&ctx, &stream, d);
        let (o, n) = (offset as usize, len as usize);
        assert!(
            got[..at].iter().all(|&b| b == POISON),
            "{path:?} {warm:?}: before"
        );
        assert!(
            got[at..at + n] == data[file][o..o + n],
            "{path:?} {warm:?}: file {file} at {offset}, {len} bytes differ"
        );
        assert!(got[at + n..].iter().all(|&b| b == POISON), "after");
    }
    ctx.check_err().unwrap();
}

/// The report: every byte counted, pinned memory within readers x buffers x chunk, each file's
/// read path as asked, registered in place only by the register method on a cached file.
fn check_report(
    r: &gdx_storage::GatherReport,
    path: PathChoice,
    warm: WarmMethod,
    spec: &[(usize, u64, u64, usize)],
) {
    assert_eq!(r.bytes, spec.iter().map(|s| s.2).sum::<u64>());
    assert!(r.pinned_bytes <= (3 * 2 * (4 << 20)) as u64, "{r:?}");
    eprintln!("{path:?} {warm:?}: {}", r.summary);
    for f in &r.files {
        match path {
            PathChoice::Buffered => assert_eq!(f.read, StoragePath::Buffered, "{}", f.reason),
            PathChoice::FileStaged => assert_eq!(f.read, StoragePath::FileStaged, "{}", f.reason),
            _ => {}
        }
        let in_place = warm == WarmMethod::Register && f.read == StoragePath::Buffered;
        assert_eq!(f.registered, in_place, "{}", f.reason);
    }
    if r.files.iter().any(|f| f.registered) {
        assert!(r.registered_peak_bytes > 0);
        assert!(r.registered_peak_bytes <= (3 * 2 * ((4 << 20) + 8192)) as u64);
    }
}

#[test]
#[ignore = "requires a GPU; cargo test -- --ignored"]
fn gather_readers_buffered() {
    gather(PathChoice::Buffered, WarmMethod::Readers);
}

#[test]
#[ignore = "requires a GPU; cargo test -- --ignored"]
fn gather_readers_direct() {
    gather(PathChoice::FileStaged, WarmMethod::Readers);
}

#[test]
#[ignore = "requires a GPU; cargo test -- --ignored"]
fn gather_register_buffered() {
    gather(PathChoice::Buffered, WarmMethod::Register);
}

#[test]
#[ignore = "requires a GPU; cargo test -- --ignored"]
fn gather_register_auto() {
    gather(PathChoice::Auto, WarmMethod::Register);
}

/// A read-only registration of a file is a copy source only.
#[test]
#[ignore = "requires a GPU; cargo test -- --ignored"]
fn a_registered_file_is_never_written() {
    let (ctx, stream) = setup();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("r.bin");
    let data = pattern(3 * 4096 + 77, seed());
    std::fs::write(&p, &data).unwrap();
    let f = std::fs::File::open(&p).unwrap();
    let mut reg = RegisteredFile::new(&ctx, &f, 100, 2 * 4096, true).unwrap();
    assert_eq!(reg.len(), 2 * 4096);
    assert_eq!(reg.locked_len(), 3 * 4096);
    let mut dev = poisoned(&ctx, &stream, 2 * 4096);
    stream.copy_to_device(&mut dev, &reg).unwrap();
    assert_eq!(read_back(&ctx, &stream, &dev), &data[100..100 + 2 * 4096]);
    let e = stream.copy_to_host(&mut reg, &dev).unwrap_err().to_string();
    assert!(e.contains("registered read-only"), "{e}");
    drop(reg);
    ctx.check_err().unwrap();
}

/// A file written from host bytes and GPU spans of every size class, unaligned, across chunk
/// boundaries: the file holds their concatenation, byte for byte, for each write path.
#[test]
#[ignore = "requires a GPU; cargo test -- --ignored"]
fn parts_from_gpu_and_host_are_written_in_order() {
    let (ctx, stream) = setup();
    let s = seed();
    let dir = tempfile::tempdir_in(std::env::var("GDX_TEST_DIR").unwrap_or_else(|_| "/tmp".into()))
        .unwrap();
    let head = pattern(4097 + 3, s);
    let spans = [1usize, 0, (4 << 20) + 1, 4096, (9 << 20) + 77];
    let data: Vec<Vec<u8>> = spans
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(n + 5, s ^ i as u64))
        .collect();
    let devs: Vec<DeviceBuffer> = data
        .iter()
        .map(|d| {
            let mut dev = poisoned(&ctx, &stream, d.len());
            let mut host = PinnedHostBuffer::new(&ctx, d.len()).unwrap();
            host.as_mut_slice().unwrap().copy_from_slice(d);
            stream.copy_to_device(&mut dev, &host).unwrap();
            stream.synchronize().unwrap();
            dev
        })
        .collect();
    let mut parts = vec![gdx_storage::Part::Host(&head)];
    let mut want = head.clone();
    for (i, (&n, dev)) in spans.iter().zip(&devs).enumerate() {
        // Each span starts `i` bytes into its buffer.
        let off = i.min(5);
        parts.push(gdx_storage::Part::Gpu {
            buf: dev,
            offset: off,
            len: n,
        });
        want.extend_from_slice(&data[i][off..off + n]);
    }
    for choice in [PathChoice::FileStaged, PathChoice::Buffered] {
        let p = dir.path().join(format!("parts-{choice:?}.bin"));
        std::fs::write(&p, vec![0xEEu8; want.len() + 4096]).unwrap();
        let opts = gdx_storage::CopyOptions {
            path: choice,
            chunk_bytes: 4 << 20,
            depth: 3,
            truncate: true,
            sync: true,
            ..Default::default()
        };
        let r = gdx_storage::copy_parts_to_file(
            &parts,
            &ctx,
            &gdx_storage::FileRange::whole(&p),
            &opts,
        )
        .unwrap();
        assert_eq!(r.bytes, want.len() as u64);
        let back = std::fs::read(&p).unwrap();
        assert_eq!(back.len(), want.len(), "{choice:?}: truncated to the parts");
        assert!(back == want, "{choice:?}: the file differs from the parts");
    }
    ctx.check_err().unwrap();
}
