//! GPU tests of the memory, stream and copy layer, through the public API only (no `unsafe`).
//! All need a GPU: `cargo test -p gdx-sys --test cuda_gpu -- --ignored`. The GPU is
//! `GDX_TEST_GPU` (default 0). Tests that need a second GPU are named `two_gpus_*` and fail,
//! naming what is missing, on a one-GPU machine (run the rest with `--skip two_gpus_`); the
//! one-GPU timing tests add peer pairs when a second GPU is there and say so when it is not.
//! No test asserts a speed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::verified_peer_copy;

use gdx_base::pattern::{fill_pattern, find_mismatch, POISON};
use gdx_base::testenv::{peer_gpu, replay_seed as seed, test_gpu};
use gdx_sys::cuda::{
    Context, Cuda, CudaError, DeviceBuffer, Event, MemoryType, PinnedHostBuffer, RegisteredHost,
    Stream,
};

fn setup() -> (Cuda, Context, Stream) {
    let cuda = Cuda::load().expect("libcuda");
    let ctx = cuda.context(test_gpu()).expect("context");
    let stream = Stream::new(&ctx).expect("stream");
    (cuda, ctx, stream)
}

#[test]
#[ignore = "requires a GPU; cargo test -- --ignored"]
fn allocations_are_device_and_host_memory_of_the_right_gpu() {
    let (cuda, ctx, _stream) = setup();
    let dev = DeviceBuffer::new(&ctx, 1 << 20).unwrap();
    let info = cuda.pointer_info(dev.as_raw()).unwrap();
    assert_eq!(info.memory_type, MemoryType::Device);
    assert_eq!(info.device_ordinal, Some(test_gpu()));
    let host = PinnedHostBuffer::new(&ctx, 4096).unwrap();
    assert!(host.as_slice().unwrap().iter().all(|&b| b == 0));
    let addr = host.as_slice().unwrap().as_ptr() as u64;
    assert_eq!(
        cuda.pointer_info(addr).unwrap().memory_type,
        MemoryType::Host
    );
    // An address CUDA never handed out: an error, not a crash.
    let stack = 0u64;
    assert!(cuda.pointer_info(&stack as *const u64 as u64).is_err());
    assert!(DeviceBuffer::new(&ctx, 0).is_err());
    drop(dev);
    drop(host);
    ctx.check_err().unwrap();
}

#[test]
#[ignore = "requires a GPU; cargo test -- --ignored"]
fn round_trips_keep_every_byte_at_any_size_and_offset() {
    let (_cuda, ctx, stream) = setup();
    let seed = seed();
    for len in [1usize, 7, 4096 + 3, 64 << 20] {
        let mut up = PinnedHostBuffer::new(&ctx, len).unwrap();
        fill_pattern(up.as_mut_slice().unwrap(), seed);
        let mut dev = DeviceBuffer::new(&ctx, len).unwrap();
        stream.memset(&mut dev, 0, len, POISON).unwrap();
        stream.copy_to_device(&mut dev, &up).unwrap();
        let mut down = PinnedHostBuffer::new(&ctx, len).unwrap();
        down.as_mut_slice().unwrap().fill(POISON);
        stream.copy_to_host(&mut down, &dev).unwrap();
        // as_slice waits for the copy.
        assert_eq!(
            find_mismatch(down.as_slice().unwrap(), seed),
            None,
            "{len} B"
        );
    }
    // Unaligned offsets on both sides: 1000 bytes from host offset 3 to device offset 5,
    // back from device offset 5 to host offset 11.
    let mut up = PinnedHostBuffer::new(&ctx, 4096).unwrap();
    fill_pattern(up.as_mut_slice().unwrap(), seed);
    let mut dev = DeviceBuffer::new(&ctx, 4096).unwrap();
    stream.memset(&mut dev, 0, 4096, POISON).unwrap();
    stream.copy_to_device_at(&mut dev, 5, &up, 3, 1000).unwrap();
    let mut down = PinnedHostBuffer::new(&ctx, 2048).unwrap();
    stream
        .copy_to_host_at(&mut down, 11, &dev, 5, 1000)
        .unwrap();
    stream.copy_to_host_at(&mut down, 1100, &dev, 0, 5).unwrap();
    let got = down.as_slice().unwrap();
    assert_eq!(&got[11..1011], &up.as_slice().unwrap()[3..1003]);
    assert_eq!(&got[1100..1105], &[POISON; 5]);
    assert!(got[..11].iter().all(|&b| b == 0));
}

#[test]
#[ignore = "requires a GPU; cargo test -- --ignored"]
fn bad_ranges_are_refused_and_leave_the_buffers_alone() {
    let (_cuda, ctx, stream) = setup();
    let mut host = PinnedHostBuffer::new(&ctx, 64).unwrap();
    host.as_mut_slice().unwrap().fill(1);
    let mut dev = DeviceBuffer::new(&ctx, 64).unwrap();
    stream.memset(&mut dev, 0, 64, 2).unwrap();
    let oob = |r: Result<(), CudaError>| matches!(r, Err(CudaError::OutOfBounds { .. }));
    assert!(oob(stream.copy_to_device_at(&mut dev, 60, &host, 0, 5)));
    assert!(oob(stream.copy_to_device_at(&mut dev, 0, &host, 60, 5)));
    assert!(oob(stream.copy_to_host_at(
        &mut host,
        usize::MAX,
        &dev,
        0,
        2
    )));
    assert!(oob(stream.memset(&mut dev, 64, 1, 0)));
    let mut small = DeviceBuffer::new(&ctx, 32).unwrap();
    assert!(oob(stream.copy_device(&mut small, 0, &dev, 0, 33)));
    assert!(oob(stream.copy_peer(&mut small, 1, &dev, 0, 32)));
    assert!(matches!(
        stream.copy_to_device(&mut small, &host),
        Err(CudaError::LengthMismatch { dst: 32, src: 64 })
    ));
    stream.copy_to_host(&mut host, &dev).unwrap();
    assert!(host.as_slice().unwrap().iter().all(|&b| b == 2));
    ctx.check_err().unwrap();
}

#[test]
#[ignore = "requires a GPU; cargo test -- --ignored"]
fn registered_caller_memory_round_trips() {
    let (_cuda, ctx, stream) = setup();
    let seed = seed();
    let mut mine = vec![0u8; 1 << 20];
    fill_pattern(&mut mine, seed);
    let mut back = vec![POISON; 1 << 20];
    {
        let src = RegisteredHost::new(&ctx, &mut mine).unwrap();
        let mut dst = RegisteredHost::new(&ctx, &mut back).unwrap();
        let mut dev = DeviceBuffer::new(&ctx, 1 << 20).unwrap();
        stream.copy_to_device(&mut dev, &src).unwrap();
        stream.copy_to_host(&mut dst, &dev).unwrap();
        assert_eq!(find_mismatch(dst.as_slice().unwrap(), seed), None);
    }
    assert_eq!(find_mismatch(&back, seed), None);
}

#[test]
#[ignore = "requires a GPU; cargo test -- --ignored"]
fn device_copies_and_events_work_on_one_gpu() {
    let (_cuda, ctx, stream) = setup();
    let seed = seed();
    let len = 8 << 20;
    let mut host = PinnedHostBuffer::new(&ctx, len).unwrap();
    fill_pattern(host.as_mut_slice().unwrap(), seed);
    let mut a = DeviceBuffer::new(&ctx, len).unwrap();
    let mut b = DeviceBuffer::new(&ctx, len).unwrap();
    stream.copy_to_device(&mut a, &host).unwrap();
    stream.memset(&mut b, 0, len, POISON).unwrap();
    let (start, end) = (Event::new(&ctx).unwrap(), Event::new(&ctx).unwrap());
    start.record(&stream).unwrap();
    stream.copy_device(&mut b, 0, &a, 0, len).unwrap();
    end.record(&stream).unwrap();
    end.synchronize().unwrap();
    assert!(!start.elapsed(&end).unwrap().is_zero());
    host.as_mut_slice().unwrap().fill(0);
    stream.copy_to_host(&mut host, &b).unwrap();
    assert_eq!(find_mismatch(host.as_slice().unwrap(), seed), None);
    // Ordering-only events cannot time.
    let plain = Event::without_timing(&ctx).unwrap();
    assert!(plain.elapsed(&end).is_err());
}

#[test]
#[ignore = "requires a GPU; cargo test -- --ignored"]
fn a_hold_delays_the_stream_until_released() {
    let (_cuda, ctx, stream) = setup();
    if !gdx_base::testenv::precondition("a driver with cuLaunchHostFunc", stream.can_hold()) {
        return;
    }
    let mut host = PinnedHostBuffer::new(&ctx, 4096).unwrap();
    host.as_mut_slice().unwrap().fill(3);
    let mut dev = DeviceBuffer::new(&ctx, 4096).unwrap();
    let hold = stream.hold().unwrap();
    stream.copy_to_device(&mut dev, &host).unwrap();
    let done = Event::without_timing(&ctx).unwrap();
    done.record(&stream).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50));
    // Nothing ran while held (the event is still pending).
    hold.release();
    done.synchronize().unwrap();
    host.as_mut_slice().unwrap().fill(0);
    stream.copy_to_host(&mut host, &dev).unwrap();
    assert!(host.as_slice().unwrap().iter().all(|&b| b == 3));
}

#[test]
#[ignore = "requires a GPU; cargo test -- --ignored"]
fn dma_buf_export_gives_a_descriptor_or_says_unsupported() {
    let (_cuda, ctx, _stream) = setup();
    let dev = DeviceBuffer::new(&ctx, 2 << 20).unwrap();
    match dev.dma_buf() {
        Ok(d) => {
            use std::os::fd::AsRawFd;
            assert!(d.fd().as_raw_fd() >= 0);
            assert_eq!(d.len(), 2 << 20);
            eprintln!("dma-buf fd {}", d.fd().as_raw_fd());
        }
        Err(e) => {
            eprintln!("dma-buf export: {e}");
            assert!(matches!(
                e,
                CudaError::Unsupported { .. } | CudaError::MissingSymbol { .. }
            ));
        }
    }
    let odd = DeviceBuffer::new(&ctx, 4097).unwrap();
    assert!(matches!(
        odd.dma_buf(),
        Err(CudaError::InvalidArgument { .. } | CudaError::MissingSymbol { .. })
    ));
}

#[test]
#[ignore = "requires 2 GPUs; cargo test -- --ignored"]
fn two_gpus_peer_copy_is_verified() {
    let (cuda, ctx, stream) = setup();
    let other = peer_gpu(
        cuda.device_count().unwrap(),
        "two_gpus_peer_copy_is_verified",
    )
    .unwrap_or_else(|| {
        panic!(
            "two_gpus_peer_copy_is_verified requires 2 GPUs: run the others with --skip two_gpus_"
        )
    });
    let peer = cuda.context(other).unwrap();
    eprintln!(
        "GPU {} -> GPU {other}: can access peer = {}",
        test_gpu(),
        cuda.can_access_peer(test_gpu(), other).unwrap()
    );
    ctx.enable_peer_access(&peer).unwrap();
    // Twice is fine (CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED is Ok).
    ctx.enable_peer_access(&peer).unwrap();
    let seed = seed();
    let len = (64 << 20) + 13;
    let mut src = DeviceBuffer::new(&ctx, len).unwrap();
    let mut dst = DeviceBuffer::new(&peer, len).unwrap();
    verified_peer_copy(&ctx, &peer, &stream, &mut src, &mut dst, len, seed);
    assert_eq!(
        cuda.pointer_info(dst.as_raw()).unwrap().device_ordinal,
        Some(other)
    );
}
