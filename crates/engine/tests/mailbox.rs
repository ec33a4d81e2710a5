#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! GPU tests of the engine's mailbox path: with a mailbox running, small pinned-host ↔ GPU
//! copies plan to `mailbox` and keep every byte (each size 1 B – the crossover, unaligned
//! offsets); larger or stream-ordered copies take the copy engine and say why; stopping the
//! mailbox puts the copy engine back. GPU `GDX_TEST_GPU` (default 0); run with
//! `--include-ignored`.

use gdx_base::pattern::{pattern, POISON};
use gdx_engine::{LocalPeer, Ordering, Path, Policy};
use gdx_sys::cuda::mailbox::KernelState;
use gdx_sys::cuda::Stream;

const CROSSOVER: u64 = gdx_engine::DEFAULT_MAILBOX_CROSSOVER;

fn gpu() -> u32 {
    std::env::var("GDX_TEST_GPU")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn open(policy: Policy) -> LocalPeer {
    LocalPeer::open(policy, Default::default()).expect("requires a GPU with the CUDA driver")
}

#[test]
#[ignore = "requires a CUDA GPU"]
fn small_host_gpu_copies_take_the_running_mailbox_and_keep_every_byte() {
    let g = gpu();
    let peer = open(Policy::default());
    let span = CROSSOVER + 64;
    let dev = peer.alloc_device(g, span).unwrap();
    let host = peer.alloc_pinned(span).unwrap();
    let p = peer.plan((&dev).into(), (&host).into(), 8).unwrap();
    assert_eq!(p.path, Path::HostToGpu, "no mailbox yet: {p}");
    peer.start_mailbox(g).unwrap();
    assert!(peer.mailbox_running(g));
    assert!(
        peer.start_mailbox(g).is_err(),
        "a second mailbox on one GPU"
    );
    let p = peer.plan((&dev).into(), (&host).into(), 8).unwrap();
    assert_eq!(p.path, Path::Mailbox, "{p}");
    assert!(p.reason.contains("8 B ≤ 2 KiB crossover"), "{p}");
    assert!(p.reason.contains("1 SM reserved"), "{p}");
    for len in 1..=CROSSOVER {
        let (d_off, s_off) = ((len * 5) % 13, (len * 3) % 11);
        let data = pattern(len as usize, len);
        host.with_bytes_mut(|b| {
            b.fill(0);
            b[s_off as usize..(s_off + len) as usize].copy_from_slice(&data)
        })
        .unwrap();
        peer.upload(&dev, 0, &vec![POISON; span as usize]).unwrap();
        // Alternate the blocking and the queued entry points: both run on the mailbox.
        let plan = if len % 2 == 0 {
            peer.copy_blocking(&dev, d_off, &host, s_off, len).unwrap()
        } else {
            peer.transfer(&dev, d_off, &host, s_off, len)
                .unwrap()
                .wait()
                .unwrap()
        };
        assert_eq!(plan.path, Path::Mailbox, "{len} B: {plan}");
        let mut out = vec![0u8; span as usize];
        peer.download(&dev, 0, &mut out).unwrap();
        let (a, b) = (d_off as usize, (d_off + len) as usize);
        assert_eq!(&out[a..b], &data[..], "{len} B to GPU");
        assert!(
            out[..a].iter().chain(&out[b..]).all(|&x| x == POISON),
            "{len} B: neighbours"
        );
        // And back, to another offset of the pinned buffer.
        host.with_bytes_mut(|b| b.fill(POISON)).unwrap();
        let plan = peer
            .copy_blocking(&host, s_off + 1, &dev, d_off, len)
            .unwrap();
        assert_eq!(plan.path, Path::Mailbox, "{len} B back: {plan}");
        host.with_bytes(|b| {
            let (a, z) = ((s_off + 1) as usize, (s_off + 1 + len) as usize);
            assert_eq!(&b[a..z], &data[..], "{len} B to host");
            assert!(b[..a].iter().chain(&b[z..]).all(|&x| x == POISON));
        })
        .unwrap();
    }
    // Above the crossover: the copy engine, and the reason says the mailbox was considered.
    let p = peer
        .plan((&dev).into(), (&host).into(), CROSSOVER + 1)
        .unwrap();
    assert_eq!(p.path, Path::HostToGpu, "{p}");
    assert!(p.reason.contains("crossover"), "{p}");
    let report = peer.stop_mailbox(g).unwrap().unwrap();
    assert_eq!(report.state, KernelState::Stopped);
    assert!(report.kernel_gone);
    assert_eq!(report.served, 2 * CROSSOVER);
    assert_eq!(
        peer.plan((&dev).into(), (&host).into(), 8).unwrap().path,
        Path::HostToGpu
    );
    assert!(peer.stop_mailbox(g).unwrap().is_none());
}

#[test]
#[ignore = "requires a CUDA GPU"]
fn stream_ordered_copies_leave_the_mailbox_and_strict_mode_refuses_them() {
    let g = gpu();
    for strict in [false, true] {
        let peer = open(if strict {
            Policy::strict()
        } else {
            Policy::default()
        });
        let dev = peer.alloc_device(g, 64).unwrap();
        let host = peer.alloc_pinned(64).unwrap();
        host.with_bytes_mut(|b| b.fill(7)).unwrap();
        peer.start_mailbox(g).unwrap();
        let stream = Stream::new(&peer.context(g).unwrap()).unwrap();
        let ord = Ordering {
            stream: Some(&stream),
            ..Ordering::default()
        };
        let r = peer.transfer_with(&dev, 0, &host, 0, 8, ord);
        if strict {
            let e = r.unwrap_err();
            assert!(e.to_string().contains("ordered with a stream"), "{e}");
        } else {
            let plan = r.unwrap().wait().unwrap();
            assert_eq!(plan.path, Path::HostToGpu, "{plan}");
            assert!(plan.reason.contains("ordered with a stream"), "{plan}");
            let mut out = vec![0u8; 8];
            peer.download(&dev, 0, &mut out).unwrap();
            assert_eq!(out, vec![7u8; 8]);
        }
        // The unordered op still takes the mailbox right after.
        let plan = peer.copy_blocking(&dev, 8, &host, 0, 8).unwrap();
        assert_eq!(plan.path, Path::Mailbox, "{plan}");
        peer.stop_mailbox(g).unwrap();
    }
}
