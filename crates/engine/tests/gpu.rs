//! GPU tests of [`LocalPeer`]: random data, destination poisoned first, bytes verified after.
//!
//! Convention: every test here is `#[ignore = "requires ..."]`, so a machine without the GPUs
//! reports them as ignored, never `ok`. Run them with `--ignored` (or `--include-ignored`); a
//! test then *fails* with the missing piece named if the machine lacks it. Tests that need two
//! GPUs are named `two_gpus_*`, so a one-GPU machine runs the rest with `--skip two_gpus_`.
//! `GDX_TEST_MAX_BYTES` caps the largest size (default 1 GiB).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_engine::{
    DeviceOrigin, DeviceRegion, Error, LocalPeer, Mem, Ordering, Path, PinnedRegion, Policy,
};
use gdx_sys::cuda::{Event, Stream};

const POISON: u8 = 0xA5;

/// The peer, or a panic naming what this machine lacks (the test was asked for by `--ignored`).
fn open(policy: Policy, gpus: u32, test: &str) -> LocalPeer {
    match LocalPeer::open(policy, Default::default()) {
        Ok(p) if p.gpu_count() >= gpus => p,
        Ok(p) => panic!(
            "{test} requires {gpus} GPUs and this machine has {}: run the others with --skip two_gpus_",
            p.gpu_count()
        ),
        Err(e) => panic!("{test} requires a GPU with the CUDA driver: {e}"),
    }
}

/// GPU0↔GPU1 peer access, which the test's premise needs.
fn require_p2p(peer: &LocalPeer, test: &str) {
    let link = peer.link(0, 1).unwrap();
    assert_eq!(
        link.peer,
        gdx_engine::planner::PeerStatus::Enabled,
        "{test} requires P2P between GPU0 and GPU1: {link:?}"
    );
}

fn random(len: usize, mut seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    for c in v.chunks_mut(8) {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        c.copy_from_slice(&seed.to_le_bytes()[..c.len()]);
    }
    v
}

fn max_bytes() -> u64 {
    std::env::var("GDX_TEST_MAX_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1 << 30)
}

/// Sizes 1 B … 1 GiB (capped), with unaligned offsets.
fn cases() -> Vec<(u64, u64, u64)> {
    let sizes = [1u64, 8, 4099, (1 << 20) + 5, 64 << 20, 1 << 30];
    sizes
        .iter()
        .filter(|&&s| s <= max_bytes())
        .enumerate()
        .map(|(i, &s)| (s, (i as u64 * 3) % 7, (i as u64 * 5) % 11))
        .collect()
}

/// Fill `src` with random bytes and `dst` with the poison, copy, check the copied range and
/// that the bytes around it are still poison.
fn check_copy(
    peer: &LocalPeer,
    dst: &DeviceRegion,
    src: Mem<'_>,
    len: u64,
    d_off: u64,
    s_off: u64,
    blocking: bool,
) -> Path {
    let data = random((len + s_off) as usize, len ^ 0x9e37_79b9);
    match src {
        Mem::Gpu(r) => peer.upload(r, 0, &data).unwrap(),
        Mem::Pinned(p) => p
            .with_bytes_mut(|b| b[..data.len()].copy_from_slice(&data))
            .unwrap(),
    }
    peer.upload(dst, 0, &vec![POISON; dst.len() as usize])
        .unwrap();
    let plan = if blocking {
        peer.copy_blocking(dst, d_off, src, s_off, len).unwrap()
    } else {
        peer.transfer(dst, d_off, src, s_off, len)
            .unwrap()
            .wait()
            .unwrap()
    };
    let mut out = vec![0u8; dst.len() as usize];
    peer.download(dst, 0, &mut out).unwrap();
    let got = &out[d_off as usize..(d_off + len) as usize];
    if let Some(i) = got
        .iter()
        .zip(&data[s_off as usize..])
        .position(|(a, b)| a != b)
    {
        panic!("{len} bytes on {plan}: byte {i} differs");
    }
    assert!(out[..d_off as usize].iter().all(|&b| b == POISON));
    assert!(out[(d_off + len) as usize..].iter().all(|&b| b == POISON));
    plan.path
}

#[test]
#[ignore = "requires 2 GPUs: cargo test -p gdx-engine --test gpu -- --ignored"]
fn two_gpus_p2p_copies_every_size_and_offset() {
    let peer = open(Policy::default(), 2, "p2p");
    for (len, d, s) in cases() {
        let src = peer.alloc_device(0, len + s).unwrap();
        let dst = peer.alloc_device(1, len + d + 3).unwrap();
        let path = check_copy(&peer, &dst, Mem::Gpu(&src), len, d, s, len <= 4099);
        let link = peer.link(0, 1).unwrap();
        eprintln!("{len} B: {path} ({link:?})");
        if link.peer == gdx_engine::planner::PeerStatus::Enabled {
            assert_eq!(path, Path::P2p);
        }
    }
}

#[test]
#[ignore = "requires 2 GPUs: cargo test -p gdx-engine --test gpu -- --ignored"]
fn two_gpus_forced_staged_copies_every_size_and_offset() {
    let policy = Policy {
        force: Some(Path::Staged),
        ..Policy::default()
    };
    let peer = open(policy, 2, "staged");
    for (len, d, s) in cases() {
        let src = peer.alloc_device(0, len + s).unwrap();
        let dst = peer.alloc_device(1, len + d).unwrap();
        assert_eq!(
            check_copy(&peer, &dst, Mem::Gpu(&src), len, d, s, false),
            Path::Staged
        );
    }
}

#[test]
#[ignore = "requires 2 GPUs: cargo test -p gdx-engine --test gpu -- --ignored"]
fn two_gpus_strict_mode_refuses_forced_staged_with_the_reason() {
    let policy = Policy {
        strict: true,
        force: Some(Path::Staged),
        ..Policy::default()
    };
    let peer = open(policy, 2, "strict");
    require_p2p(&peer, "strict");
    let src = peer.alloc_device(0, 4096).unwrap();
    let dst = peer.alloc_device(1, 4096).unwrap();
    let e = peer.transfer(&dst, 0, &src, 0, 4096).unwrap_err();
    let msg = e.to_string();
    eprintln!("{msg}");
    assert!(matches!(e, Error::Strict { .. }));
    assert!(
        msg.contains("forced by policy") && msg.contains("p2p GPU0→GPU1"),
        "{msg}"
    );
}

#[test]
#[ignore = "requires a GPU: cargo test -p gdx-engine --test gpu -- --ignored"]
fn host_to_gpu_and_back() {
    let peer = open(Policy::default(), 1, "host<->gpu");
    for (len, d, s) in cases() {
        let host: PinnedRegion = peer.alloc_pinned(len + s).unwrap();
        let dev = peer.alloc_device(0, len + d).unwrap();
        assert_eq!(
            check_copy(&peer, &dev, Mem::Pinned(&host), len, d, s, len <= 8),
            Path::HostToGpu
        );
        // And back into a poisoned pinned buffer.
        let back = peer.alloc_pinned(len).unwrap();
        back.with_bytes_mut(|b| b.fill(POISON)).unwrap();
        let plan = peer
            .transfer(&back, 0, &dev, d, len)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(plan.path, Path::GpuToHost);
        let want = host
            .with_bytes(|b| b[s as usize..(s + len) as usize].to_vec())
            .unwrap();
        assert!(
            back.with_bytes(|b| b == &want[..]).unwrap(),
            "{len} bytes back differ"
        );
    }
}

#[test]
#[ignore = "requires 2 GPUs: cargo test -p gdx-engine --test gpu -- --ignored"]
fn two_gpus_pool_memory_is_granted_access_or_reported_unmapped() {
    let strict_free = open(
        Policy {
            no_pool_grant: true,
            ..Policy::default()
        },
        2,
        "pool",
    );
    require_p2p(&strict_free, "pool");
    let len = 8 << 20;
    // Without the grant: the driver leaves the pool unmapped for GPU0; the region says so and
    // the planner takes the staged path (with the reason), never the driver's slow fallback.
    let dst = strict_free.alloc_device_from_pool(1, len).unwrap();
    let src = strict_free.alloc_device(0, len).unwrap();
    assert_eq!(dst.origin(), &DeviceOrigin::Pool);
    match dst.peer_mapped(0) {
        Err(why) => {
            eprintln!("pool without grant: {why}");
            let plan = strict_free.plan(Mem::Gpu(&dst), Mem::Gpu(&src), len).unwrap();
            assert_eq!(plan.path, Path::Staged, "{plan}");
            assert!(plan.reason.contains("pool memory"), "{plan}");
            assert_eq!(check_copy(&strict_free, &dst, Mem::Gpu(&src), len, 0, 0, false), Path::Staged);
        }
        Ok(()) => eprintln!("pool without grant: the driver already maps it for GPU0 (granted earlier in this process)"),
    }
    drop(dst);
    // With the grant (the default policy): mapped, p2p, bytes verified.
    let peer = open(Policy::default(), 2, "pool");
    let dst = peer.alloc_device_from_pool(1, len).unwrap();
    assert_eq!(dst.peer_mapped(0), Ok(()));
    let src = peer.alloc_device(0, len).unwrap();
    assert_eq!(
        check_copy(&peer, &dst, Mem::Gpu(&src), len, 0, 0, false),
        Path::P2p
    );
}

#[test]
#[ignore = "requires 2 GPUs: cargo test -p gdx-engine --test gpu -- --ignored"]
fn two_gpus_stream_ordering_waits_and_signals() {
    let peer = open(Policy::default(), 2, "ordering");
    let len = 4 << 20;
    let src = peer.alloc_device(0, len).unwrap();
    let dst = peer.alloc_device(1, len).unwrap();
    let data = random(len as usize, 7);
    peer.upload(&src, 0, &data).unwrap();
    peer.upload(&dst, 0, &vec![POISON; len as usize]).unwrap();
    let ctx0 = peer.context(0).unwrap();
    let caller = Stream::new(&ctx0).unwrap();
    let before = Event::without_timing(&ctx0).unwrap();
    before.record(&caller).unwrap();
    let ctx1 = peer.context(1).unwrap();
    let signal = Event::without_timing(&ctx1).unwrap();
    let t = peer
        .transfer_with(
            &dst,
            0,
            &src,
            0,
            len,
            Ordering {
                after: Some(&before),
                stream: Some(&caller),
                signal: Some(&signal),
            },
        )
        .unwrap();
    signal.synchronize().unwrap();
    caller.synchronize().unwrap();
    let mut out = vec![0u8; len as usize];
    peer.download(&dst, 0, &mut out).unwrap();
    assert!(out == data);
    t.wait().unwrap();
}

#[test]
#[ignore = "requires 2 GPUs: cargo test -p gdx-engine --test gpu -- --ignored"]
fn two_gpus_raw_device_pointers_register_and_never_free() {
    let peer = open(Policy::default(), 2, "raw pointer");
    let owner = peer.alloc_device(1, 1 << 20).unwrap();
    // SAFETY: `owner` outlives `foreign` and nothing else touches the memory.
    let foreign = unsafe { peer.register_device_ptr(owner.device_ptr() + 16, 1000) }.unwrap();
    assert_eq!(foreign.gpu(), 1);
    assert_eq!(foreign.origin(), &DeviceOrigin::Foreign);
    // SAFETY: as above; the range runs past the allocation, so registration must fail.
    assert!(unsafe { peer.register_device_ptr(owner.device_ptr() + 16, 1 << 20) }.is_err());
    let src = peer.alloc_device(0, 1000).unwrap();
    check_copy(&peer, &foreign, Mem::Gpu(&src), 1000, 0, 0, true);
    drop(foreign);
    owner.synchronize().unwrap();
}

/// The exporting side of the ipc test: `two_gpus_ipc_across_two_processes` runs its own
/// binary again with `GDX_IPC_CHILD` set, and this is what that child does (not a test of its
/// own, so nothing reports `ok` without having run).
fn ipc_child() {
    let peer = LocalPeer::open(Policy::default(), Default::default()).unwrap();
    let len: u64 = std::env::var("GDX_IPC_LEN").unwrap().parse().unwrap();
    let r = peer.alloc_device(1, len).unwrap();
    peer.upload(&r, 0, &random(len as usize, 42)).unwrap();
    println!(
        "\nIPCDESC {}",
        serde_json::to_string(&peer.export_ipc(&r).unwrap()).unwrap()
    );
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let mut out = vec![0u8; len as usize];
    peer.download(&r, 0, &mut out).unwrap();
    println!(
        "\nCHILDSUM {}",
        out.iter().map(|&b| u64::from(b)).sum::<u64>()
    );
}

#[test]
#[ignore = "requires 2 GPUs: cargo test -p gdx-engine --test gpu -- --ignored"]
fn two_gpus_ipc_across_two_processes() {
    use std::io::{BufRead, Write};
    if std::env::var("GDX_IPC_CHILD").is_ok() {
        return ipc_child();
    }
    let peer = open(Policy::default(), 2, "ipc");
    let len: u64 = (64 << 20) + 3;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "two_gpus_ipc_across_two_processes",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("GDX_IPC_CHILD", "1")
        .env("GDX_IPC_LEN", len.to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let desc = loop {
        let l = lines
            .next()
            .expect("child ended without a descriptor")
            .unwrap();
        // libtest prints "test ipc_child ... " without a newline before the child's output.
        if let Some(j) = l.find("IPCDESC ").map(|i| &l[i + 8..]) {
            break serde_json::from_str::<gdx_engine::IpcDesc>(j).unwrap();
        }
    };
    let remote = peer.import_ipc(&desc).unwrap();
    let again = peer.import_ipc(&desc).unwrap();
    assert_eq!(remote.id(), again.id(), "mapped once, cached per region");
    // Read the child's bytes GPU1 → GPU0, no host copy.
    let local = peer.alloc_device(0, len).unwrap();
    peer.upload(&local, 0, &vec![POISON; len as usize]).unwrap();
    let plan = peer
        .transfer(&local, 0, &remote, 0, len)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(plan.path, Path::Ipc, "{plan}");
    let mut out = vec![0u8; len as usize];
    peer.download(&local, 0, &mut out).unwrap();
    assert!(out == random(len as usize, 42), "ipc read differs");
    // Write new bytes into the child's memory; the child sums what it sees.
    let data = random(len as usize, 99);
    peer.upload(&local, 0, &data).unwrap();
    peer.copy_blocking(&remote, 0, &local, 0, len).unwrap();
    drop((remote, again));
    writeln!(child.stdin.as_mut().unwrap(), "done").unwrap();
    let sum = loop {
        let l = lines.next().expect("child ended without a sum").unwrap();
        if let Some(s) = l.find("CHILDSUM ").map(|i| &l[i + 9..]) {
            break s.parse::<u64>().unwrap();
        }
    };
    assert_eq!(sum, data.iter().map(|&b| u64::from(b)).sum::<u64>());
    assert!(child.wait().unwrap().success());
}

#[test]
#[ignore = "requires a GPU: cargo test -p gdx-engine --test gpu -- --ignored"]
fn shareable_vmm_memory_copies_p2p_and_exports_a_posix_fd() {
    let peer = open(Policy::default(), 1, "vmm");
    let len = (8 << 20) + 3;
    let vmm = match peer.alloc_device_shareable(0, len) {
        Ok(r) => r,
        Err(e) => panic!("vmm requires a GPU/driver that makes fd-shareable memory: {e}"),
    };
    assert_eq!(vmm.origin(), &DeviceOrigin::Shareable);
    let other = peer.alloc_device(peer.gpu_count() - 1, len).unwrap();
    let path = check_copy(&peer, &other, Mem::Gpu(&vmm), len - 9, 4, 5, false);
    if peer.gpu_count() > 1 {
        assert_eq!(
            path,
            Path::P2p,
            "VMM memory is granted access to the other GPU"
        );
    }
    let path = check_copy(&peer, &vmm, Mem::Gpu(&other), len - 9, 5, 4, true);
    if peer.gpu_count() > 1 {
        assert_eq!(path, Path::P2p);
    }
    let desc = peer.export_ipc(&vmm).unwrap();
    assert!(desc.handle.is_empty() && desc.posix_fd_alloc_len.is_some());
    assert!(desc.posix_fd_alloc_len.unwrap() >= len);
    match peer.import_ipc(&desc) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("import_fd"), "{m}"),
        other => panic!("{other:?}"),
    }
    let fd = peer.export_fd(&vmm).unwrap();
    // Legacy memory has no fd to give.
    assert!(peer.export_fd(&other).is_err());
    drop(fd);
}

/// A framework's stream and events (PyTorch's `cuda_stream` is a raw `CUstream`): borrowed
/// with `from_raw`, used for ordering, and left alive when the borrowed values drop.
#[test]
#[ignore = "requires a GPU: cargo test -p gdx-engine --test gpu -- --ignored"]
fn stream_ordering_with_borrowed_raw_handles() {
    let peer = open(Policy::default(), 1, "raw ordering");
    let dst_gpu = peer.gpu_count() - 1;
    let len = (4 << 20) + 1;
    let src = peer.alloc_device(0, len).unwrap();
    let dst = peer.alloc_device(dst_gpu, len).unwrap();
    let data = random(len as usize, 8);
    peer.upload(&src, 0, &data).unwrap();
    peer.upload(&dst, 0, &vec![POISON; len as usize]).unwrap();
    let ctx0 = peer.context(0).unwrap();
    let ctx_dst = peer.context(dst_gpu).unwrap();
    // The "framework" owns these; gdx only borrows their raw handles.
    let owned_stream = Stream::new(&ctx0).unwrap();
    let owned_before = Event::without_timing(&ctx0).unwrap();
    let owned_signal = Event::without_timing(&ctx_dst).unwrap();
    owned_before.record(&owned_stream).unwrap();
    {
        // SAFETY: the handles belong to these contexts and outlive the borrowed values.
        let (stream, before, signal) = unsafe {
            (
                Stream::from_raw(&ctx0, owned_stream.as_raw()),
                Event::from_raw(&ctx0, owned_before.as_raw()),
                Event::from_raw(&ctx_dst, owned_signal.as_raw()),
            )
        };
        assert!(!stream.is_owned() && !before.is_owned());
        let t = peer
            .transfer_with(
                &dst,
                0,
                &src,
                0,
                len,
                Ordering {
                    after: Some(&before),
                    stream: Some(&stream),
                    signal: Some(&signal),
                },
            )
            .unwrap();
        signal.synchronize().unwrap();
        t.wait().unwrap();
    }
    // The framework's handles still work after the borrowed values dropped.
    owned_signal.synchronize().unwrap();
    owned_before.record(&owned_stream).unwrap();
    owned_stream.synchronize().unwrap();
    let mut out = vec![0u8; len as usize];
    peer.download(&dst, 0, &mut out).unwrap();
    assert!(out == data);
}
