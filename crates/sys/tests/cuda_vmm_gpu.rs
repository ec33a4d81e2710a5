//! GPU tests of VMM allocations shared as file descriptors ([`DeviceBuffer::new_shareable`],
//! [`DeviceBuffer::export_fd`], [`DeviceBuffer::import_fd`]) and of streams and events borrowed
//! from another framework ([`Stream::from_raw`], [`Event::from_raw`], the only `unsafe` here).
//! All need a GPU: `cargo test -p gdx-sys --test cuda_vmm_gpu -- --ignored`. Each prints a skip
//! and passes where there is no driver or GPU, where the driver or GPU lacks VMM or
//! file-descriptor handles, and (peer test) where there is no second GPU that can access the
//! first. The GPU is `GDX_TEST_GPU` (default 0). No test asserts a speed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::verified_peer_copy;

use gdx_base::pattern::{fill_pattern, find_mismatch, POISON};
use gdx_base::testenv::{replay_seed as seed, test_gpu};
use gdx_sys::cuda::{
    Context, Cuda, CudaError, DeviceBuffer, Event, MemoryType, PinnedHostBuffer, Stream,
};
use std::os::fd::AsFd;

/// The driver, the test GPU's context and a stream, or a panic naming what is missing (these
/// tests run only when asked for with `--ignored`, so a missing GPU is a failure, never `ok`).
fn setup(test: &str) -> (Cuda, Context, Stream) {
    let cuda = match Cuda::load() {
        Ok(c) => c,
        Err(e) => {
            panic!("{test} requires the CUDA driver: {e}");
        }
    };
    let n = cuda.device_count().unwrap_or(0);
    if test_gpu() >= n {
        panic!(
            "{test} requires GPU {} (GDX_TEST_GPU) and the driver reports {n}",
            test_gpu()
        );
    }
    let ctx = cuda.context(test_gpu()).expect("context");
    let stream = Stream::new(&ctx).expect("stream");
    (cuda, ctx, stream)
}

/// `DeviceBuffer::new_shareable`, or a panic naming what the driver or GPU lacks (VMM
/// allocations or file-descriptor handles).
fn shareable(test: &str, ctx: &Context, len: usize, access: &[Context]) -> DeviceBuffer {
    match DeviceBuffer::new_shareable(ctx, len, access) {
        Ok(b) => b,
        Err(e @ (CudaError::Unsupported { .. } | CudaError::MissingSymbol { .. })) => {
            panic!("{test} requires shareable VMM memory: {e}")
        }
        Err(e) => panic!("{test}: new_shareable({len}) on GPU {}: {e}", ctx.ordinal()),
    }
}

#[test]
#[ignore = "requires a GPU; cargo test -- --ignored"]
fn vmm_memory_exported_as_an_fd_reads_back_through_an_imported_mapping() {
    const TEST: &str = "vmm_memory_exported_as_an_fd_reads_back_through_an_imported_mapping";
    let (cuda, ctx, stream) = setup(TEST);
    // Not a multiple of any granularity: the allocation is rounded up, the buffer is not.
    let len = (3 << 20) + 5;
    let mut a = shareable(TEST, &ctx, len, &[]);
    assert!(a.is_shareable_vmm());
    assert!(a.is_owned());
    assert_eq!(a.len(), len);
    assert!(a.alloc_len() >= len, "{} < {len}", a.alloc_len());
    eprintln!("{len} bytes requested, {} allocated", a.alloc_len());
    // VMM memory has no context; the ordinal may or may not be reported (see `vmm`).
    let info = cuda.pointer_info(a.as_raw()).unwrap();
    eprintln!("pointer_info of VMM memory: {info:?}");
    assert_eq!(info.memory_type, MemoryType::Device);
    assert!(
        info.device_ordinal.is_none_or(|g| g == test_gpu()),
        "{info:?}"
    );
    match cuda.pointer_range(a.as_raw()) {
        Ok((start, size)) => {
            eprintln!("pointer_range of VMM memory: {start:#x}, {size} bytes");
            assert!(start <= a.as_raw() && size >= len, "{start:#x} {size}");
        }
        Err(e) => eprintln!("pointer_range of VMM memory: {e}"),
    }
    // The legacy IPC handle does not name VMM memory.
    assert!(matches!(
        a.ipc_handle(),
        Err(CudaError::InvalidArgument {
            call: "cuIpcGetMemHandle",
            ..
        })
    ));

    let seed = seed();
    let mut up = PinnedHostBuffer::new(&ctx, len).unwrap();
    fill_pattern(up.as_mut_slice().unwrap(), seed);
    stream.copy_to_device(&mut a, &up).unwrap();

    let fd = a.export_fd().unwrap();
    let mut b = DeviceBuffer::import_fd(&ctx, fd.as_fd(), len, a.alloc_len()).unwrap();
    // The driver keeps no use of the descriptor.
    drop(fd);
    assert!(b.is_shareable_vmm());
    assert_eq!(b.len(), len);
    assert_eq!(b.alloc_len(), a.alloc_len());
    assert_ne!(
        b.as_raw(),
        a.as_raw(),
        "a second mapping has its own address"
    );

    // Read the bytes written through `a` through `b`. Same stream: in order after the upload.
    let mut down = PinnedHostBuffer::new(&ctx, len).unwrap();
    down.as_mut_slice().unwrap().fill(POISON);
    stream.copy_to_host(&mut down, &b).unwrap();
    assert_eq!(find_mismatch(down.as_slice().unwrap(), seed), None);

    // Write through `b`, read through `a`.
    stream.memset(&mut b, 100, 1000, 0x3c).unwrap();
    stream.copy_to_host(&mut down, &a).unwrap();
    let got = down.as_slice().unwrap();
    assert!(got[100..1100].iter().all(|&x| x == 0x3c));
    assert_eq!(&got[..100], &up.as_slice().unwrap()[..100]);
    assert_eq!(&got[1100..], &up.as_slice().unwrap()[1100..]);

    // Out-of-range imports are refused before any mapping.
    let fd = a.export_fd().unwrap();
    assert!(matches!(
        DeviceBuffer::import_fd(&ctx, fd.as_fd(), a.alloc_len() + 1, a.alloc_len()),
        Err(CudaError::InvalidArgument { .. })
    ));
    assert!(matches!(
        DeviceBuffer::import_fd(&ctx, fd.as_fd(), len, a.alloc_len() + 1),
        Err(CudaError::InvalidArgument { .. })
    ));
    drop(fd);

    // Dropping the import leaves the original mapping working.
    drop(b);
    down.as_mut_slice().unwrap().fill(POISON);
    stream.memset(&mut a, 100, 1000, 0).unwrap();
    stream.copy_to_host(&mut down, &a).unwrap();
    assert!(down.as_slice().unwrap()[100..1100].iter().all(|&x| x == 0));
    drop(a);
    ctx.check_err().unwrap();
}

#[test]
#[ignore = "requires a GPU; cargo test -- --ignored"]
fn vmm_and_plain_buffers_copy_both_ways() {
    const TEST: &str = "vmm_and_plain_buffers_copy_both_ways";
    let (_cuda, ctx, stream) = setup(TEST);
    let len = (8 << 20) + 13;
    let mut vmm = shareable(TEST, &ctx, len, &[]);
    let seed = seed();
    let mut host = PinnedHostBuffer::new(&ctx, len).unwrap();
    fill_pattern(host.as_mut_slice().unwrap(), seed);
    let mut plain = DeviceBuffer::new(&ctx, len).unwrap();
    stream.copy_to_device(&mut plain, &host).unwrap();
    stream.memset(&mut vmm, 0, len, POISON).unwrap();
    // plain -> VMM, then read the VMM buffer back.
    stream.copy_device(&mut vmm, 0, &plain, 0, len).unwrap();
    host.as_mut_slice().unwrap().fill(0);
    stream.copy_to_host(&mut host, &vmm).unwrap();
    assert_eq!(find_mismatch(host.as_slice().unwrap(), seed), None);
    // VMM -> plain, on another stream (ordered by the buffers' markers).
    let other = Stream::new(&ctx).unwrap();
    other.memset(&mut plain, 0, len, POISON).unwrap();
    other.copy_device(&mut plain, 0, &vmm, 0, len).unwrap();
    host.as_mut_slice().unwrap().fill(0);
    other.copy_to_host(&mut host, &plain).unwrap();
    assert_eq!(find_mismatch(host.as_slice().unwrap(), seed), None);
    drop(vmm);
    drop(plain);
    ctx.check_err().unwrap();
}

#[test]
#[ignore = "requires 2 GPUs; cargo test -- --ignored"]
fn two_gpus_vmm_peer_copy_with_access_granted() {
    const TEST: &str = "two_gpus_vmm_peer_copy_with_access_granted";
    let (cuda, ctx, stream) = setup(TEST);
    let n = cuda.device_count().unwrap();
    if n < 2 {
        panic!("{TEST} requires 2 GPUs and the driver reports {n}: run the others with --skip two_gpus_");
    }
    let other = (test_gpu() + 1) % n;
    if !(cuda.can_access_peer(test_gpu(), other).unwrap()
        && cuda.can_access_peer(other, test_gpu()).unwrap())
    {
        panic!(
            "{TEST} requires peer access: GPU {} and GPU {other} cannot access each other",
            test_gpu()
        );
    }
    let peer = cuda.context(other).unwrap();
    let len = (64 << 20) + 13;
    let mut src = shareable(TEST, &ctx, len, std::slice::from_ref(&peer));
    let mut dst = shareable(TEST, &peer, len, std::slice::from_ref(&ctx));
    let info = cuda.pointer_info(dst.as_raw()).unwrap();
    assert!(info.device_ordinal.is_none_or(|g| g == other), "{info:?}");
    let seed = seed();
    let (mut host, peer_stream) =
        verified_peer_copy(&ctx, &peer, &stream, &mut src, &mut dst, len, seed);
    // And the other way, plain device-to-device through unified addressing on the peer's
    // stream (the peer was granted access to `src`), ordered after the poisoning on `stream`
    // by src's marker.
    stream.memset(&mut src, 0, len, POISON).unwrap();
    peer_stream.copy_device(&mut src, 0, &dst, 0, len).unwrap();
    host.as_mut_slice().unwrap().fill(0);
    stream.copy_to_host(&mut host, &src).unwrap();
    assert_eq!(find_mismatch(host.as_slice().unwrap(), seed), None);
    drop(src);
    drop(dst);
    ctx.check_err().unwrap();
    peer.check_err().unwrap();
}

#[test]
#[ignore = "requires a GPU; cargo test -- --ignored"]
fn export_fd_of_plain_memory_is_a_typed_error() {
    const TEST: &str = "export_fd_of_plain_memory_is_a_typed_error";
    let (_cuda, ctx, _stream) = setup(TEST);
    let plain = DeviceBuffer::new(&ctx, 4096 + 1).unwrap();
    assert!(!plain.is_shareable_vmm());
    assert_eq!(plain.alloc_len(), 4097);
    let e = plain.export_fd().unwrap_err();
    assert!(
        matches!(
            e,
            CudaError::InvalidArgument {
                call: "cuMemExportToShareableHandle",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("not a VMM allocation"), "{e}");
    assert!(e.to_string().contains("ipc_handle"), "{e}");
    // Empty VMM buffers are refused before any driver call.
    assert!(matches!(
        DeviceBuffer::new_shareable(&ctx, 0, &[]),
        Err(CudaError::InvalidArgument { .. })
    ));
}

#[test]
#[ignore = "requires a GPU; cargo test -- --ignored"]
fn borrowed_streams_and_events_work_and_are_not_destroyed_on_drop() {
    const TEST: &str = "borrowed_streams_and_events_work_and_are_not_destroyed_on_drop";
    let (_cuda, ctx, owned) = setup(TEST);
    assert!(owned.is_owned());
    let seed = seed();
    let len = (1 << 20) + 7;
    let mut host = PinnedHostBuffer::new(&ctx, len).unwrap();
    fill_pattern(host.as_mut_slice().unwrap(), seed);
    let mut dev = DeviceBuffer::new(&ctx, len).unwrap();

    // SAFETY: the handle is a stream of `ctx`, and `owned` outlives the borrowed value.
    let borrowed = unsafe { Stream::from_raw(&ctx, owned.as_raw()) };
    assert!(!borrowed.is_owned());
    assert_eq!(borrowed.as_raw(), owned.as_raw());
    borrowed.copy_to_device(&mut dev, &host).unwrap();
    let event = Event::new(&ctx).unwrap();
    // SAFETY: the handle is an event of `ctx`, and `event` outlives the borrowed value.
    let borrowed_event = unsafe { Event::from_raw(&ctx, event.as_raw()) };
    assert!(!borrowed_event.is_owned());
    borrowed_event.record(&borrowed).unwrap();
    borrowed.wait_event(&borrowed_event).unwrap();
    borrowed.synchronize().unwrap();
    borrowed_event.synchronize().unwrap();
    drop(borrowed);
    drop(borrowed_event);

    // Both handles still work: had the drops destroyed them, these calls would fail.
    owned.synchronize().unwrap();
    event.record(&owned).unwrap();
    event.synchronize().unwrap();
    let mut down = PinnedHostBuffer::new(&ctx, len).unwrap();
    down.as_mut_slice().unwrap().fill(POISON);
    owned.copy_to_host(&mut down, &dev).unwrap();
    assert_eq!(find_mismatch(down.as_slice().unwrap(), seed), None);

    // Timing through borrowed handles of timing events.
    let (start, end) = (Event::new(&ctx).unwrap(), Event::new(&ctx).unwrap());
    // SAFETY: both are events of `ctx` and outlive the borrowed values.
    let (bs, be) = unsafe {
        (
            Event::from_raw(&ctx, start.as_raw()),
            Event::from_raw(&ctx, end.as_raw()),
        )
    };
    bs.record(&owned).unwrap();
    owned.memset(&mut dev, 0, len, 0).unwrap();
    be.record(&owned).unwrap();
    be.synchronize().unwrap();
    bs.elapsed(&be).unwrap();
    drop((bs, be));
    start.elapsed(&end).unwrap();

    // The null handle: the legacy default stream of `ctx`.
    // SAFETY: null names `ctx`'s default stream, which lives as long as the context.
    let legacy = unsafe { Stream::from_raw(&ctx, std::ptr::null_mut()) };
    fill_pattern(host.as_mut_slice().unwrap(), seed ^ 1);
    legacy.copy_to_device(&mut dev, &host).unwrap();
    down.as_mut_slice().unwrap().fill(POISON);
    // Another stream: ordered after the upload by dev's marker, recorded on the null stream.
    owned.copy_to_host(&mut down, &dev).unwrap();
    assert_eq!(find_mismatch(down.as_slice().unwrap(), seed ^ 1), None);
    legacy.synchronize().unwrap();
    drop(legacy);
    drop(dev);
    ctx.check_err().unwrap();
}
