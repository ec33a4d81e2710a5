#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! GPU tests of run-time kernels, stream memory operations and the mailbox, through the public
//! API. All need a GPU: `cargo test -p gdx-sys --test cuda_mailbox_gpu -- --include-ignored`.
//! The GPU is `GDX_TEST_GPU` (default 0). No test asserts a speed.

use gdx_base::pattern::{fill_pattern, POISON};
use gdx_base::testenv::test_gpu;
use gdx_sys::cuda::mailbox::{KernelState, MAX_PAYLOAD};
use gdx_sys::cuda::{
    Context, Cuda, CudaError, DeviceBuffer, FloorStep, KernelArgs, LaunchDims, Mailbox,
    MailboxConfig, MappedHostBuffer, Module, PingPong, Signal, Stream, WaitCondition, Word,
};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The crossover the planner defaults to: every size up to it is checked byte by byte.
const CROSSOVER: usize = gdx_sys::cuda::mailbox::DEFAULT_CROSSOVER;

fn setup() -> (Context, Stream) {
    let cuda = Cuda::load().expect("libcuda");
    let ctx = cuda.context(test_gpu()).expect("context");
    let stream = Stream::new(&ctx).expect("stream");
    (ctx, stream)
}

fn load(m: &MappedHostBuffer, i: usize) -> u64 {
    m.word(i).unwrap().load(Ordering::Acquire)
}

/// Read `len` bytes of `dev` at `off` back through the copy engine (an independent path).
fn read_back(stream: &Stream, dev: &DeviceBuffer, off: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    stream.copy_to_pageable(&mut out, dev, off).unwrap();
    out
}

#[test]
#[ignore = "requires a CUDA GPU"]
fn the_shipped_ptx_loads_and_a_kernel_writes_mapped_memory() {
    let (ctx, stream) = setup();
    let module = Module::gdx_kernels(&ctx).unwrap();
    let mark = module.kernel("gdx_mark").unwrap();
    assert!(module.kernel("no_such_kernel").is_err());
    let word = MappedHostBuffer::new(&ctx, 8).unwrap();
    assert_eq!(load(&word, 0), 0);
    let mut args = KernelArgs::new();
    args.push_u64(word.device_ptr()).push_u64(0xfeed_f00d);
    // SAFETY: gdx_mark(u64*, u64) writes one word of the live mapped buffer.
    unsafe { stream.launch(&mark, LaunchDims::single_block(32), &mut args) }.unwrap();
    stream.synchronize().unwrap();
    assert!(stream.is_idle().unwrap());
    assert_eq!(load(&word, 0), 0xfeed_f00d);
    let ops = ctx.device().stream_mem_ops().unwrap();
    eprintln!("stream memory operations: {ops:?}");
    assert!(ops.map_host_memory);
}

/// Launch gdx_spin_then_mark: after `spin` (GPU clock) write `value` at `addr`.
fn spin_then_mark(stream: &Stream, module: &Module, addr: u64, value: u64, spin: Duration) {
    let k = module.kernel("gdx_spin_then_mark").unwrap();
    let mut args = KernelArgs::new();
    args.push_u64(addr)
        .push_u64(value)
        .push_u64(spin.as_nanos() as u64);
    // SAFETY: gdx_spin_then_mark(u64*, u64, u64) writes one word at `addr`, live mapped memory
    // the caller keeps until the stream is idle.
    unsafe { stream.launch(&k, LaunchDims::single_block(32), &mut args) }.unwrap();
}

#[test]
#[ignore = "requires a CUDA GPU"]
fn a_stream_written_signal_fires_only_after_the_queued_kernel() {
    let (ctx, stream) = setup();
    let module = Module::gdx_kernels(&ctx).unwrap();
    let marker = MappedHostBuffer::new(&ctx, 8).unwrap();
    let signal = Signal::new(&ctx).unwrap();
    for round in 1..=20u64 {
        // The kernel spins 5 ms before it writes its marker; the signal is queued behind it.
        spin_then_mark(
            &stream,
            &module,
            marker.device_ptr(),
            round,
            Duration::from_millis(5),
        );
        let t = signal.arm(&stream).unwrap();
        assert!(
            signal.wait(t, Duration::from_secs(10)),
            "round {round}: no signal"
        );
        // The instant the host sees the signal, the marker must be there.
        assert_eq!(
            load(&marker, 0),
            round,
            "round {round}: signal before the marker"
        );
    }
    stream.synchronize().unwrap();
    // The same on device memory, read back through the copy engine.
    let dev = DeviceBuffer::new(&ctx, 64).unwrap();
    stream.write_value64(Word::Device(&dev, 8), 0x1234).unwrap();
    assert_eq!(read_back(&stream, &dev, 8, 8), 0x1234u64.to_le_bytes());
    assert!(matches!(
        stream.write_value64(Word::Device(&dev, 60), 1),
        Err(CudaError::OutOfBounds { .. })
    ));
    assert!(
        stream.write_value64(Word::Device(&dev, 4), 1).is_err(),
        "unaligned"
    );
}

#[test]
#[ignore = "requires a CUDA GPU"]
fn a_stream_gated_on_a_signal_runs_its_kernel_only_after_the_host_raises_it() {
    let (ctx, stream) = setup();
    let module = Module::gdx_kernels(&ctx).unwrap();
    let marker = MappedHostBuffer::new(&ctx, 8).unwrap();
    let gate = Signal::new(&ctx).unwrap();
    let t = gate.ticket();
    gate.gate(&stream, t).unwrap();
    spin_then_mark(&stream, &module, marker.device_ptr(), 77, Duration::ZERO);
    // Whatever the host does meanwhile, the kernel must not run before the raise.
    let until = Instant::now() + Duration::from_millis(50);
    while Instant::now() < until {
        assert_eq!(load(&marker, 0), 0, "the kernel ran before its gate opened");
        std::thread::yield_now();
    }
    assert!(!stream.is_idle().unwrap());
    gate.raise(t);
    stream.synchronize().unwrap();
    assert_eq!(load(&marker, 0), 77);
    // A wait on a word that already satisfies the condition passes at once.
    stream
        .wait_value64(Word::Mapped(gate.buffer(), 0), t, WaitCondition::Eq)
        .unwrap();
    stream.synchronize().unwrap();
}

/// The kernel variants the byte test covers: the default and the other poll/publish choices.
fn variants() -> Vec<MailboxConfig> {
    let d = MailboxConfig::default();
    vec![
        d,
        MailboxConfig {
            poll_words: 32,
            pipelined_poll: false,
            release_store: false,
            ..d
        },
        MailboxConfig {
            poll_words: 4,
            pipelined_poll: true,
            release_store: false,
            ..d
        },
        MailboxConfig {
            poll_words: 8,
            pipelined_poll: false,
            release_store: true,
            slots: 1,
            threads: 32,
            ..d
        },
        MailboxConfig {
            gpu_scope_done: true,
            ..d
        },
    ]
}

#[test]
#[ignore = "requires a CUDA GPU"]
fn mailbox_bytes_are_exact_for_every_size_up_to_the_crossover_at_odd_offsets() {
    let (ctx, stream) = setup();
    for cfg in variants() {
        eprintln!("variant {cfg:?}");
        let mb = Mailbox::start(&ctx, cfg).unwrap();
        assert_eq!(mb.state(), KernelState::Running);
        let span = CROSSOVER + 64;
        let mut dev = DeviceBuffer::new(&ctx, span).unwrap();
        let mut pattern = vec![0u8; span];
        for len in 1..=CROSSOVER {
            let off = (len * 7) % 61; // unaligned, varies
            fill_pattern(&mut pattern, len as u64 * 0x9e37_79b9);
            stream
                .copy_from_pageable(&mut dev, 0, &vec![POISON; span])
                .unwrap();
            // Host -> GPU through the mailbox, checked through the copy engine, with the
            // bytes around the range untouched.
            mb.write(&dev, off, &pattern[..len]).unwrap();
            let back = read_back(&stream, &dev, 0, span);
            assert_eq!(
                &back[off..off + len],
                &pattern[..len],
                "write of {len} B at {off}"
            );
            assert!(
                back[..off].iter().all(|&b| b == POISON),
                "{len} B: bytes before clobbered"
            );
            assert!(
                back[off + len..].iter().all(|&b| b == POISON),
                "{len} B: bytes after clobbered"
            );
            // GPU -> host through the mailbox, from another odd offset.
            let roff = (off + 3) % 61;
            let mut out = vec![POISON ^ 0xff; len];
            mb.read(&dev, roff, &mut out).unwrap();
            assert_eq!(out, back[roff..roff + len], "read of {len} B at {roff}");
        }
        // The largest payload, and refusals named before anything is queued.
        let big = DeviceBuffer::new(&ctx, MAX_PAYLOAD).unwrap();
        let mut p = vec![0u8; MAX_PAYLOAD];
        fill_pattern(&mut p, 5);
        mb.write(&big, 0, &p).unwrap();
        let mut q = vec![0u8; MAX_PAYLOAD];
        mb.read(&big, 0, &mut q).unwrap();
        assert_eq!(p, q);
        assert!(mb.write(&big, 0, &vec![0; MAX_PAYLOAD + 1]).is_err());
        assert!(mb.write(&big, MAX_PAYLOAD - 1, &[1, 2]).is_err());
        assert!(mb.write(&big, 0, &[]).is_err());
        let report = mb.stop().unwrap();
        assert_eq!(report.state, KernelState::Stopped);
        assert!(report.kernel_gone);
        assert_eq!(report.served, 2 * CROSSOVER as u64 + 2);
    }
}

#[test]
#[ignore = "requires a CUDA GPU"]
fn a_million_back_to_back_mailbox_ops_arrive_complete_and_in_order() {
    let (ctx, stream) = setup();
    let mb = Mailbox::start(&ctx, MailboxConfig::default()).unwrap();
    const OPS: u64 = 1_000_000;
    const CELLS: u64 = 1024; // 8 KiB of u64 cells: one read sees them all
    let dev = DeviceBuffer::new(&ctx, (CELLS * 8) as usize).unwrap();
    let mut expect = vec![0u64; CELLS as usize];
    let mut reads = 0u64;
    let mut i = 0u64;
    while i < OPS {
        // A burst of pipelined writes (up to the ring's depth in flight), each writing its own
        // op number into cell i % CELLS...
        let mut tickets = Vec::new();
        for _ in 0..32 {
            if i >= OPS {
                break;
            }
            let cell = (i % CELLS) as usize;
            tickets.push(
                mb.write_nowait(&dev, cell * 8, &(i + 1).to_le_bytes())
                    .unwrap(),
            );
            expect[cell] = i + 1;
            i += 1;
        }
        for t in tickets {
            t.wait().unwrap();
        }
        // ...and every 32 bursts a read of all cells, served after every earlier write: a lost
        // or reordered write shows as a cell holding an older number.
        if (i / 32).is_multiple_of(32) || i >= OPS {
            let mut out = vec![0u8; (CELLS * 8) as usize];
            mb.read(&dev, 0, &mut out).unwrap();
            for (c, want) in expect.iter().enumerate() {
                let got = u64::from_le_bytes(out[c * 8..c * 8 + 8].try_into().unwrap());
                assert_eq!(got, *want, "cell {c} after {i} ops");
            }
            reads += 1;
        }
    }
    let report = mb.stop().unwrap();
    assert_eq!(report.served, OPS + reads, "ops served");
    // And through the copy engine.
    let back = read_back(&stream, &dev, 0, (CELLS * 8) as usize);
    for (c, want) in expect.iter().enumerate() {
        assert_eq!(
            u64::from_le_bytes(back[c * 8..c * 8 + 8].try_into().unwrap()),
            *want
        );
    }
}

#[test]
#[ignore = "requires a CUDA GPU"]
fn the_service_kernel_leaves_the_gpu_on_drop_and_on_a_silent_host() {
    let (ctx, _stream) = setup();
    // Drop: a new mailbox starts right after (the old one's stop is complete), and stop()
    // reports the kernel gone.
    for _ in 0..3 {
        let mb = Mailbox::start(&ctx, MailboxConfig::default()).unwrap();
        drop(mb);
    }
    // Watchdog: with the heartbeat suspended the kernel exits on its own.
    let cfg = MailboxConfig {
        watchdog: Duration::from_millis(200),
        ..MailboxConfig::default()
    };
    let mb = Mailbox::start(&ctx, cfg).unwrap();
    let dev = DeviceBuffer::new(&ctx, 64).unwrap();
    mb.write(&dev, 0, b"alive").unwrap();
    mb.suspend_heartbeat();
    let t0 = Instant::now();
    while mb.state() != KernelState::Watchdog && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(mb.state(), KernelState::Watchdog);
    let t1 = Instant::now();
    while !mb.kernel_gone().unwrap() && t1.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        mb.kernel_gone().unwrap(),
        "state says watchdog but the kernel still runs"
    );
    let e = mb.write(&dev, 0, b"late").unwrap_err();
    assert!(e.to_string().contains("watchdog"), "{e}");
    let report = mb.stop().unwrap();
    assert_eq!(report.state, KernelState::Watchdog);
    assert_eq!(report.served, 1);
}

/// Wait for `pp` to answer ping `n`: true when it did within two seconds.
fn answered(pp: &PingPong, n: u64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(2);
    while pp.pong() != n {
        if Instant::now() > deadline {
            return false;
        }
        std::hint::spin_loop();
    }
    true
}

#[test]
#[ignore = "requires a CUDA GPU"]
fn the_ping_pong_kernel_answers_every_ping_with_each_step_and_stops() {
    let (ctx, _stream) = setup();
    let module = Module::gdx_kernels(&ctx).unwrap();
    let steps = [
        FloorStep::Bare,
        FloorStep::StoreFenceSystem,
        FloorStep::StoreFenceGpu,
        FloorStep::Load,
    ];
    for step in steps {
        for gap in [0u32, 300] {
            let pp = PingPong::start(&ctx, &module, step, gap, Duration::from_secs(2)).unwrap();
            assert_eq!(pp.step(), step);
            for n in 1..=100u64 {
                pp.ping(n);
                assert!(answered(&pp, n), "{} gap {gap}: ping {n}", step.name());
            }
            pp.stop().unwrap();
        }
    }
    // Dropping without stop stops it too; the kernel's last word is the exit mark.
    let pp = PingPong::start(&ctx, &module, FloorStep::Bare, 0, Duration::from_secs(2)).unwrap();
    pp.ping(1);
    assert!(answered(&pp, 1));
    drop(pp);
    // A module that is not gdx's own is refused before anything is launched.
    let other = Module::load_ptx(&ctx, gdx_sys::cuda::GDX_KERNELS_PTX).unwrap();
    let err = PingPong::start(&ctx, &other, FloorStep::Bare, 0, Duration::from_secs(2));
    assert!(
        matches!(err, Err(CudaError::InvalidArgument { .. })),
        "{err:?}"
    );
}
