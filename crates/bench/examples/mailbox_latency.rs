#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Small-op latency on one GPU, all in one run: the mailbox (host→GPU write with completion,
//! GPU→host read) against the copy engine (`cuMemcpy*Async` + `cuStreamSynchronize`) at each
//! size, and stream-ordered signalling (kernel done → host sees it) against
//! `cuStreamSynchronize`. Prints one line per figure: `name size p50_us p99_us`. Every figure is
//! a sample of gdx-sys's one timer (host wall clock); the floor is [`gdx_bench::gpu::floor`]'s.
//!
//! `cargo run --release -p gdx-bench --example mailbox_latency -- [samples]` (GPU `GDX_TEST_GPU`).

use gdx_base::clock::wall;
use gdx_base::stats::Summary;
use gdx_bench::gpu::floor;
use gdx_sys::cuda::{
    Cuda, DeviceBuffer, FloorStep, KernelArgs, LaunchDims, Mailbox, MailboxConfig, Module,
    PinnedHostBuffer, Signal, Stream,
};
use gdx_sys::timer::Timer;
use std::time::Duration;

fn report(name: &str, size: usize, v: &[Duration]) {
    let us: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1e6).collect();
    let s = Summary::of(&us).unwrap();
    println!("{name} {size} {:.2} {:.2}", s.median, s.p99);
}

fn time(n: usize, mut f: impl FnMut()) -> Vec<Duration> {
    for _ in 0..n / 10 {
        f();
    }
    (0..n).map(|_| wall(&mut f).1).collect()
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20_000);
    let gpu = std::env::var("GDX_TEST_GPU")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let ctx = Cuda::load().unwrap().context(gpu).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let mut dev = DeviceBuffer::new(&ctx, 1 << 16).unwrap();
    let mut host = PinnedHostBuffer::new(&ctx, 1 << 16).unwrap();
    // Kernels are loaded before the mailbox starts: under CUDA's lazy loading, loading one
    // while a persistent kernel runs may wait for the context to go idle.
    let module = Module::gdx_kernels(&ctx).unwrap();
    let mark = module.kernel("gdx_mark").unwrap();
    let warm = gdx_sys::cuda::MappedHostBuffer::new(&ctx, 8).unwrap();
    let mut a = KernelArgs::new();
    a.push_u64(warm.device_ptr()).push_u64(1);
    // SAFETY: gdx_mark(u64*, u64) writes one word of `warm`, alive past the sync.
    unsafe { stream.launch(&mark, LaunchDims::single_block(32), &mut a) }.unwrap();
    stream.synchronize().unwrap();
    // The floor under every mailbox figure: one GPU thread answering a host ping.
    for step in [
        FloorStep::Bare,
        FloorStep::StoreFenceSystem,
        FloorStep::StoreFenceGpu,
        FloorStep::Load,
    ] {
        for gap in [0u32, 300, 600, 1200] {
            let v = floor::round_trips(&ctx, &module, step, gap, n).unwrap();
            report(&format!("floor_{}_gap{gap}", step.name()), 8, &v);
        }
    }
    // The kernel variants at 8 bytes (poll words, pipelined poll, release store).
    for (pipelined_poll, poll_gap_cycles) in [(false, 0u32), (true, 300), (true, 600), (true, 1200)]
    {
        for (release_store, gpu_scope_done) in [(true, false), (false, true)] {
            let cfg = MailboxConfig {
                pipelined_poll,
                poll_gap_cycles,
                release_store,
                gpu_scope_done,
                ..MailboxConfig::default()
            };
            let mb = Mailbox::start(&ctx, cfg).unwrap();
            let tag = format!(
                "p{}_gap{}_{}",
                cfg.poll_words,
                if pipelined_poll { poll_gap_cycles } else { 0 },
                if gpu_scope_done {
                    "fence_gpu"
                } else {
                    "release_sys"
                }
            );
            report(
                &format!("variant_h2d_{tag}"),
                8,
                &time(n / 4, || mb.write(&dev, 0, &[7u8; 8]).unwrap()),
            );
            let mut o = [0u8; 8];
            report(
                &format!("variant_d2h_{tag}"),
                8,
                &time(n / 4, || mb.read(&dev, 0, &mut o).unwrap()),
            );
            mb.stop().unwrap();
        }
    }
    let mb = Mailbox::start(&ctx, MailboxConfig::default()).unwrap();
    let payload = vec![0x5au8; 8192];
    let mut out = vec![0u8; 8192];
    for size in [8usize, 64, 256, 1024, 2048, 4096, 8192] {
        report(
            "mailbox_h2d",
            size,
            &time(n, || mb.write(&dev, 0, &payload[..size]).unwrap()),
        );
        report(
            "mailbox_d2h",
            size,
            &time(n, || mb.read(&dev, 0, &mut out[..size]).unwrap()),
        );
        report(
            "copy_engine_h2d",
            size,
            &time(n, || {
                stream
                    .copy_to_device_at(&mut dev, 0, &host, 0, size)
                    .unwrap();
                stream.synchronize().unwrap();
            }),
        );
        report(
            "copy_engine_d2h",
            size,
            &time(n, || {
                stream.copy_to_host_at(&mut host, 0, &dev, 0, size).unwrap();
                stream.synchronize().unwrap();
            }),
        );
    }
    report(
        "idle_stream_sync",
        0,
        &time(n, || stream.synchronize().unwrap()),
    );
    let r = mb.stop().unwrap();
    println!(
        "mailbox_stop {:?} served {} gone {}",
        r.state, r.served, r.kernel_gone
    );
    let signal = Signal::new(&ctx).unwrap();
    let marker = gdx_sys::cuda::MappedHostBuffer::new(&ctx, 8).unwrap();
    let launch = |v: u64| {
        let mut a = KernelArgs::new();
        a.push_u64(marker.device_ptr()).push_u64(v);
        // SAFETY: gdx_mark(u64*, u64) writes one word of `marker`, alive for the whole run.
        unsafe {
            stream
                .launch(&mark, LaunchDims::single_block(32), &mut a)
                .unwrap()
        };
    };
    let mut v = 0u64;
    // Kernel done → host knows: the kernel spins 30 µs so everything behind it is queued when
    // it ends; the clock starts when the host sees its last store.
    let spin = Duration::from_micros(30);
    let mut timer = Timer::wall();
    let seen = |want: u64| {
        let w = marker.word(0).unwrap();
        while w.load(std::sync::atomic::Ordering::Acquire) != want {
            std::hint::spin_loop();
        }
    };
    let mut done_to = |signal_way: bool| -> Vec<Duration> {
        (0..n / 10 + n)
            .map(|_| {
                v += 1;
                stream
                    .launch_marker(&module, gdx_sys::cuda::Word::Mapped(&marker, 0), v, spin)
                    .unwrap();
                if signal_way {
                    let ticket = signal.arm(&stream).unwrap();
                    seen(v);
                    timer.start().unwrap();
                    assert!(signal.wait(ticket, Duration::from_secs(5)));
                } else {
                    seen(v);
                    timer.start().unwrap();
                    stream.synchronize().unwrap();
                }
                timer.stop().unwrap();
                timer.read().unwrap()
            })
            .skip(n / 10)
            .collect()
    };
    report("kernel_done_to_signal", 0, &done_to(true));
    report("kernel_done_to_stream_sync", 0, &done_to(false));
    report(
        "kernel_then_signal",
        0,
        &time(n, || {
            v += 1;
            launch(v);
            let t = signal.arm(&stream).unwrap();
            assert!(signal.wait(t, Duration::from_secs(5)));
        }),
    );
    report(
        "kernel_then_stream_sync",
        0,
        &time(n, || {
            v += 1;
            launch(v);
            stream.synchronize().unwrap();
        }),
    );
    report(
        "kernel_copy8_then_signal",
        8,
        &time(n, || {
            v += 1;
            launch(v);
            stream.copy_to_host_at(&mut host, 0, &dev, 0, 8).unwrap();
            let t = signal.arm(&stream).unwrap();
            assert!(signal.wait(t, Duration::from_secs(5)));
        }),
    );
    report(
        "kernel_sync_copy8_sync",
        8,
        &time(n, || {
            v += 1;
            launch(v);
            stream.synchronize().unwrap();
            stream.copy_to_host_at(&mut host, 0, &dev, 0, 8).unwrap();
            stream.synchronize().unwrap();
        }),
    );
}
