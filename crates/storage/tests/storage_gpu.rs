//! File ↔ GPU through cuFile (`gds`) and through the staged pipeline (`file-staged`), with
//! random data, a poisoned destination, and every byte read back and compared. All need a GPU:
//! `cargo test -p gdx-storage --test storage_gpu -- --ignored`; the GPU is `GDX_TEST_GPU` (default 0).
//! The `gds` tests need libcufile too and print a skip without it. No test asserts a speed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_base::pattern::pattern;
use gdx_base::testenv::{replay_seed as seed, test_gpu};
use gdx_storage::{
    checksum_bytes, checksum_gpu, copy_file_to_gpu, copy_gpu_to_file, cufile_status, CopyOptions,
    CufileStatus, FileRange, PathChoice, StoragePath,
};
use gdx_sys::cuda::{Context, Cuda, DeviceBuffer, PinnedHostBuffer, Stream};
use gdx_sys::cufile::{BufferRegistration, Cufile, Driver, FileHandle};

const POISON: u8 = 0xA5;

fn setup() -> (Context, Stream) {
    let cuda = Cuda::load().expect("libcuda");
    let ctx = cuda.context(test_gpu()).expect("context");
    let stream = Stream::new(&ctx).expect("stream");
    (ctx, stream)
}

/// All of `dev`, copied back to the host.
fn read_back(ctx: &Context, stream: &Stream, dev: &DeviceBuffer) -> Vec<u8> {
    let mut host = PinnedHostBuffer::new(ctx, dev.len()).unwrap();
    stream.copy_to_host(&mut host, dev).unwrap();
    host.as_slice().unwrap().to_vec()
}

/// A device buffer holding `bytes`.
fn upload(ctx: &Context, stream: &Stream, bytes: &[u8]) -> DeviceBuffer {
    let mut host = PinnedHostBuffer::new(ctx, bytes.len()).unwrap();
    host.as_mut_slice().unwrap().copy_from_slice(bytes);
    let mut dev = DeviceBuffer::new(ctx, bytes.len()).unwrap();
    stream.copy_to_device(&mut dev, &host).unwrap();
    stream.synchronize().unwrap();
    dev
}

fn poisoned(ctx: &Context, stream: &Stream, len: usize) -> DeviceBuffer {
    let mut dev = DeviceBuffer::new(ctx, len).unwrap();
    stream.memset(&mut dev, 0, len, POISON).unwrap();
    stream.synchronize().unwrap();
    dev
}

/// Whether cuFile runs here; prints the skip when not.
fn cufile_ready(test: &str) -> bool {
    let status = cufile_status().0;
    if let CufileStatus::Available(mode) = &status {
        eprintln!("{test}: cuFile runs {mode}");
    }
    let ready = matches!(status, CufileStatus::Available(_));
    gdx_base::testenv::precondition(&format!("cuFile that runs ({status:?})"), ready)
}

/// File → GPU over `choice`: sizes from 1 byte to 64 MiB + 3, unaligned file and GPU offsets,
/// the destination poisoned and compared byte for byte, including the bytes around the range.
fn file_to_gpu(choice: PathChoice, expect: StoragePath) {
    let (ctx, stream) = setup();
    let s = seed();
    let dir = tempfile::tempdir_in(std::env::var("GDX_TEST_DIR").unwrap_or_else(|_| "/tmp".into()))
        .unwrap();
    let p = dir.path().join("src.bin");
    for (len, file_off, dev_off) in [
        (1usize, 0u64, 0usize),
        (4096, 0, 0),
        (4097 + 3, 4095, 5),
        ((16 << 20) + 1, 1, 4096),
        ((64 << 20) + 3, 4096 * 3, 7),
    ] {
        let data = pattern(file_off as usize + len + 17, s ^ len as u64);
        std::fs::write(&p, &data).unwrap();
        let total = dev_off + len + 11;
        let mut dev = poisoned(&ctx, &stream, total);
        let opts = CopyOptions {
            path: choice,
            chunk_bytes: 4 << 20,
            ..Default::default()
        };
        let r = copy_file_to_gpu(
            &FileRange::new(&p, file_off, len as u64),
            &mut dev,
            dev_off,
            &opts,
        )
        .unwrap();
        eprintln!("{len} bytes: {} ({})", r.path, r.reason);
        assert_eq!(r.path, expect, "{}", r.reason);
        assert_eq!(r.bytes, len as u64);
        let back = read_back(&ctx, &stream, &dev);
        assert!(
            back[..dev_off].iter().all(|&b| b == POISON),
            "{len}: bytes before the range changed"
        );
        assert!(
            back[dev_off..dev_off + len] == data[file_off as usize..file_off as usize + len],
            "{len}: copied bytes differ"
        );
        assert!(
            back[dev_off + len..].iter().all(|&b| b == POISON),
            "{len}: bytes after the range changed"
        );
        assert_eq!(
            checksum_gpu(&dev, dev_off, len).unwrap(),
            checksum_bytes(&data[file_off as usize..file_off as usize + len])
        );
    }
    ctx.check_err().unwrap();
}

/// GPU → file over `choice`: into a fresh file and into the middle of an existing one (bytes
/// around the range kept), read back with std and compared.
fn gpu_to_file(choice: PathChoice, expect: StoragePath) {
    let (ctx, stream) = setup();
    let s = seed();
    let dir = tempfile::tempdir_in(std::env::var("GDX_TEST_DIR").unwrap_or_else(|_| "/tmp".into()))
        .unwrap();
    let p = dir.path().join("dst.bin");
    for (len, dev_off, file_off) in [
        (1usize, 0usize, 0u64),
        (4096, 0, 0),
        (4097 + 3, 5, 4095),
        ((16 << 20) + 1, 4096, 1),
        ((64 << 20) + 3, 7, 4096 * 3),
    ] {
        let data = pattern(dev_off + len + 9, s ^ len as u64);
        let dev = upload(&ctx, &stream, &data);
        let old = vec![POISON; file_off as usize + len + 4099];
        std::fs::write(&p, &old).unwrap();
        let opts = CopyOptions {
            path: choice,
            chunk_bytes: 4 << 20,
            sync: true,
            ..Default::default()
        };
        let r = copy_gpu_to_file(
            &dev,
            dev_off,
            len as u64,
            &FileRange::new(&p, file_off, len as u64),
            &opts,
        )
        .unwrap();
        eprintln!("{len} bytes: {} ({})", r.path, r.reason);
        assert_eq!(r.path, expect, "{}", r.reason);
        assert_eq!(r.bytes, len as u64);
        let back = std::fs::read(&p).unwrap();
        assert_eq!(back.len(), old.len(), "{len}: the file length changed");
        let f = file_off as usize;
        assert!(
            back[..f].iter().all(|&b| b == POISON),
            "{len}: bytes before the range changed"
        );
        assert!(
            back[f..f + len] == data[dev_off..dev_off + len],
            "{len}: written bytes differ"
        );
        assert!(
            back[f + len..].iter().all(|&b| b == POISON),
            "{len}: bytes after the range changed"
        );

        // Replacing the whole file: it ends where the copy does.
        let whole = CopyOptions {
            truncate: true,
            ..opts.clone()
        };
        copy_gpu_to_file(&dev, dev_off, len as u64, &FileRange::whole(&p), &whole).unwrap();
        assert!(
            std::fs::read(&p).unwrap() == data[dev_off..dev_off + len],
            "{len}: replaced file differs"
        );
    }
    ctx.check_err().unwrap();
}

#[test]
#[ignore = "requires a GPU; cargo test -- --ignored"]
fn file_to_gpu_file_staged() {
    file_to_gpu(PathChoice::FileStaged, StoragePath::FileStaged);
}

#[test]
#[ignore = "requires a GPU; cargo test -- --ignored"]
fn gpu_to_file_file_staged() {
    gpu_to_file(PathChoice::FileStaged, StoragePath::FileStaged);
}

#[test]
#[ignore = "requires a GPU; cargo test -- --ignored"]
fn file_to_gpu_buffered() {
    file_to_gpu(PathChoice::Buffered, StoragePath::Buffered);
}

#[test]
#[ignore = "requires a GPU; cargo test -- --ignored"]
fn file_to_gpu_gds() {
    if cufile_ready("file_to_gpu_gds") {
        file_to_gpu(PathChoice::Gds, StoragePath::Gds);
    }
}

#[test]
#[ignore = "requires a GPU; cargo test -- --ignored"]
fn gpu_to_file_gds() {
    if cufile_ready("gpu_to_file_gds") {
        gpu_to_file(PathChoice::Gds, StoragePath::Gds);
    }
}

#[test]
#[ignore = "requires a GPU; cargo test -- --ignored"]
fn auto_reports_its_choice_and_why() {
    let (ctx, stream) = setup();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("f.bin");
    let data = pattern(1 << 20, seed());
    std::fs::write(&p, &data).unwrap();
    // Twice: as written (in the page cache), then after the kernel was asked to drop it. What
    // `mincore` says just before each read decides the expected choice (the kernel may keep a
    // page it was asked to drop).
    for evicted in [false, true] {
        if evicted {
            gdx_storage::evict(&p).unwrap();
        }
        let cached = gdx_storage::residency(&p, 0, None)
            .unwrap()
            .resident_bytes();
        let mut dev = poisoned(&ctx, &stream, data.len());
        let r =
            copy_file_to_gpu(&FileRange::whole(&p), &mut dev, 0, &CopyOptions::default()).unwrap();
        eprintln!(
            "auto (evicted {evicted}, {cached} B cached): {} ({})",
            r.path, r.reason
        );
        if cached == data.len() as u64 {
            assert_eq!(r.path, StoragePath::Buffered);
            assert!(
                r.reason
                    .contains("all of the 1 MiB range is in the page cache"),
                "{}",
                r.reason
            );
        } else if cached > 0 {
            assert_eq!(r.path, StoragePath::FileStaged);
            assert!(
                r.reason
                    .contains("in the page cache (mincore): those pages"),
                "{}",
                r.reason
            );
        } else {
            match cufile_status().0 {
                CufileStatus::Available(mode) if mode.is_gds() => {
                    assert_eq!(r.path, StoragePath::Gds)
                }
                CufileStatus::Available(_) => {
                    assert_eq!(r.path, StoragePath::FileStaged);
                    assert!(r.reason.contains("compatibility mode"), "{}", r.reason);
                }
                _ => assert!(r.reason.contains("cuFile cannot run"), "{}", r.reason),
            }
        }
        assert!(read_back(&ctx, &stream, &dev) == data);
    }
}

#[test]
#[ignore = "requires a GPU; cargo test -- --ignored"]
fn cufile_handles_and_registrations_release_on_drop() {
    if !cufile_ready("cufile_handles_and_registrations_release_on_drop") {
        return;
    }
    let (ctx, stream) = setup();
    let cufile = Cufile::load().unwrap();
    let driver = Driver::open(&cufile).unwrap();
    eprintln!("properties: {:?}", driver.properties());
    // A second open shares the driver.
    let again = Driver::open(&cufile).unwrap();
    assert_eq!(again.mode(), driver.mode());
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("f.bin");
    let data = pattern(3 << 20, seed());
    std::fs::write(&p, &data).unwrap();
    let mut dev = poisoned(&ctx, &stream, data.len());
    for round in 0..3 {
        // Register, read, and drop everything each round: a leaked registration would make the
        // next cuFileBufRegister of the same address fail with MEMORY_ALREADY_REGISTERED.
        let handle =
            FileHandle::register(&driver, std::fs::File::open(&p).unwrap(), "f.bin").unwrap();
        let mut reg = BufferRegistration::new(&driver, &mut dev).unwrap();
        let got = handle.read(reg.buffer_mut(), 0, data.len(), 0).unwrap();
        assert_eq!(got, data.len(), "round {round}");
        // Past the end of the file: a short count, not an error.
        let got = handle
            .read(reg.buffer_mut(), 0, 4096, data.len() as u64 - 100)
            .unwrap();
        assert_eq!(got, 100);
    }
    assert!(read_back(&ctx, &stream, &dev)[100..] == data[100..]);
    // Out of range: refused before cuFile is called.
    let handle = FileHandle::register(&driver, std::fs::File::open(&p).unwrap(), "f.bin").unwrap();
    assert!(handle.read(&mut dev, 1, data.len(), 0).is_err());
    ctx.check_err().unwrap();
}

/// A checkpoint's data section lands on the GPU byte for byte over each read path, and a
/// partly cached file splits its reads (what the split is, the host test checks against
/// mincore; here every byte is compared).
#[test]
#[ignore = "requires a GPU; cargo test -- --ignored"]
fn safetensors_data_sections_load_to_the_gpu() {
    use gdx_storage::safetensors::{load_into_gpu, read_header, save, Dtype, TensorSpec};
    let (ctx, stream) = setup();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let p = dir.path().join("m.safetensors");
    let specs: Vec<TensorSpec> = (0..5)
        .map(|i| TensorSpec {
            name: format!("t{i}"),
            dtype: Dtype::BF16,
            shape: vec![3 << 20, 1 + i],
            len: (3 << 21) * (1 + i),
        })
        .collect();
    let base = seed();
    let data: Vec<Vec<u8>> = specs
        .iter()
        .map(|s| pattern(s.len as usize, base ^ s.len))
        .collect();
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    save(
        &p,
        &specs,
        &refs,
        &Default::default(),
        &CopyOptions::default(),
    )
    .unwrap();
    let h = read_header(&p).unwrap();
    for choice in [
        PathChoice::Auto,
        PathChoice::Buffered,
        PathChoice::FileStaged,
    ] {
        let mut dev = poisoned(&ctx, &stream, h.data_len as usize);
        let opts = CopyOptions {
            path: choice,
            chunk_bytes: 1 << 20,
            ..Default::default()
        };
        let r = load_into_gpu(&p, &h, &mut dev, 0, &opts).unwrap();
        eprintln!("{choice:?}: {} ({})", r.path, r.reason);
        let back = read_back(&ctx, &stream, &dev);
        for (s, d) in specs.iter().zip(&data) {
            let t = h.tensors.iter().find(|t| t.name == s.name).unwrap();
            assert!(
                &back[t.begin as usize..t.end as usize] == d.as_slice(),
                "{}",
                t.name
            );
        }
    }
}
