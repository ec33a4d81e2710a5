//! GPU regions over a remote [`Peer`]: `tcp-staged` (pinned bounce buffers pipelined on both
//! ends), `shm-staged`, and `ipc` between two processes of one host, with strict mode.
//! Random data, destination poisoned first, bytes verified after (and the poison around them).
//!
//! Like `gpu.rs`, every test that needs a GPU is `#[ignore = "requires a GPU ..."]` (reported as
//! ignored where there is none) and fails, naming what is missing, when asked for with
//! `--ignored` on a machine without one. One GPU is enough: the two-process tests put both
//! processes on the same GPU when there is no second.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::*;
use gdx_engine::{
    Access, Agent, AgentConfig, DeviceOrigin, DeviceRegion, Error, LocalPeer, Location, OpStatus,
    Path, Peer, Policy, Region, Transfer,
};
use std::time::Duration;

const POISON: u8 = 0x5A;

/// The local GPU peer, or a panic naming what is missing (the test was asked for by
/// `--ignored`; without a GPU it is reported as ignored, never `ok`).
fn open(test: &str) -> LocalPeer {
    match LocalPeer::open(Policy::default(), Default::default()) {
        Ok(p) => p,
        Err(e) => panic!("{test} requires a GPU with the CUDA driver: {e}"),
    }
}

/// The second GPU when there is one, else the first.
fn other_gpu(lp: &LocalPeer) -> u32 {
    u32::from(lp.gpu_count() > 1)
}

fn small_chunks(name: &str, shm: bool) -> AgentConfig {
    AgentConfig {
        // Small chunks so that a few MiB already run the pipeline through every slot.
        chunk_bytes: 1 << 20,
        tcp_streams: 2,
        ..config(name, shm)
    }
}

fn download(lp: &LocalPeer, r: &DeviceRegion) -> Vec<u8> {
    let mut out = vec![0u8; r.len() as usize];
    lp.download(r, 0, &mut out).unwrap();
    out
}

/// Runs one op and returns its plan path, failing the test if the op failed.
fn run(peer: &Peer, t: Transfer) -> Path {
    let report = peer.submit(t).unwrap().wait(WAIT).unwrap();
    let op = &report.ops[0];
    assert_eq!(op.status, OpStatus::Completed, "{}", op.plan);
    op.plan.path
}

/// Sizes around the chunk size, with unaligned offsets: (len, local offset, remote offset).
fn cases() -> Vec<(u64, u64, u64)> {
    vec![
        (1, 0, 0),
        (4099, 3, 5),
        ((1 << 20) + 5, 1, 7),
        ((5 << 20) + 3, 6, 2),
        ((64 << 20) + 1, 0, 3),
    ]
}

/// `want` landed at `at` in `got`, and the poison around it is untouched.
fn assert_landed(got: &[u8], at: u64, want: &[u8], what: &str) {
    let r = at as usize..at as usize + want.len();
    assert!(
        got[r.clone()] == *want,
        "{what} of {} B differs",
        want.len()
    );
    assert!(got[..r.start].iter().all(|&b| b == POISON), "before");
    assert!(got[r.end..].iter().all(|&b| b == POISON), "after");
}

/// Local GPU region ↔ remote GPU region through `peer`, every case, both directions.
fn gpu_to_gpu(
    lp: &LocalPeer,
    peer: &Peer,
    local: &Region<'_>,
    local_dev: &DeviceRegion,
    remote: &DeviceRegion,
    name: &str,
    want: Path,
) {
    let desc = peer.region(name).unwrap();
    assert_eq!(desc.location, Location::Gpu(remote.gpu()));
    for (i, (len, lo, ro)) in cases().into_iter().enumerate() {
        // Write: local GPU → remote GPU.
        let data = pattern((lo + len) as usize, 11 + i as u64);
        lp.upload(local_dev, 0, &data).unwrap();
        lp.upload(remote, 0, &vec![POISON; remote.len() as usize])
            .unwrap();
        let mut t = Transfer::new();
        t.write(local, lo, &desc, ro, len);
        assert_eq!(run(peer, t), want, "write of {len} bytes");
        assert_landed(&download(lp, remote), ro, &data[lo as usize..], "write");
        // Read: remote GPU → local GPU (fresh bytes there, poison here).
        let data = pattern((ro + len) as usize, 77 + i as u64);
        lp.upload(remote, 0, &data).unwrap();
        lp.upload(local_dev, 0, &vec![POISON; local_dev.len() as usize])
            .unwrap();
        let mut t = Transfer::new();
        t.read(local, lo, &desc, ro, len);
        assert_eq!(run(peer, t), want, "read of {len} bytes");
        assert_landed(&download(lp, local_dev), lo, &data[ro as usize..], "read");
    }
}

#[test]
#[ignore = "requires a GPU: cargo test -p gdx-engine --test gpu_peer -- --ignored"]
fn gpu_regions_over_tcp_are_staged_and_exact() {
    let lp = open("gpu_regions_over_tcp");
    let size = (64 << 20) + 16;
    let target = Agent::new(small_chunks("target", false)).unwrap();
    let remote = lp.alloc_device(other_gpu(&lp), size).unwrap();
    let _served = target
        .register_gpu(&lp, &remote, Access::READ_WRITE, Some("g"))
        .unwrap();
    let me = Agent::new(small_chunks("me", false)).unwrap();
    let local_dev = lp.alloc_device(0, size).unwrap();
    let local = me
        .register_gpu(&lp, &local_dev, Access::LOCAL, None)
        .unwrap();
    assert!(local.bytes().is_err(), "a GPU region has no host view");
    let peer = me.connect(target.listen_addr().unwrap()).unwrap();
    assert_eq!(peer.route().transport, Path::Tcp);
    gpu_to_gpu(
        &lp,
        &peer,
        &local,
        &local_dev,
        &remote,
        "g",
        Path::TcpStaged,
    );

    // Host memory on this side, GPU memory on the target, and the reverse.
    let desc = peer.region("g").unwrap();
    let mut host = me.alloc(3 << 20, Access::LOCAL, None).unwrap();
    let data = pattern(3 << 20, 5);
    host.bytes_mut().unwrap().copy_from_slice(&data);
    lp.upload(&remote, 0, &vec![POISON; size as usize]).unwrap();
    let mut t = Transfer::new();
    t.write(&host, 1, &desc, 9, (3 << 20) - 1);
    let report = peer.submit(t).unwrap().wait(WAIT).unwrap();
    assert_eq!(report.ops[0].plan.path, Path::TcpStaged);
    assert!(
        report.ops[0].plan.reason.contains("the peer's GPU"),
        "{}",
        report.ops[0].plan.reason
    );
    let got = download(&lp, &remote);
    assert!(got[9..9 + (3 << 20) - 1] == data[1..]);
    assert_eq!(got[8], POISON);

    let path = gpu_into_remote_host(&lp, &peer, &target, (&local, &local_dev), 2 << 20);
    assert_eq!(path, Path::TcpStaged);
}

#[test]
#[ignore = "requires a GPU: cargo test -p gdx-engine --test gpu_peer -- --ignored"]
fn strict_mode_refuses_gpu_regions_staged_over_tcp() {
    let lp = open("strict_tcp");
    let target = agent("target", false);
    let remote = lp.alloc_device(other_gpu(&lp), 4096).unwrap();
    let _served = target
        .register_gpu(&lp, &remote, Access::READ_WRITE, Some("g"))
        .unwrap();
    let me = agent("me", false);
    let local_dev = lp.alloc_device(0, 4096).unwrap();
    let local = me
        .register_gpu(&lp, &local_dev, Access::LOCAL, None)
        .unwrap();
    let peer = me.connect(target.listen_addr().unwrap()).unwrap();
    let desc = peer.region("g").unwrap();
    me.set_strict(true);
    let mut t = Transfer::new();
    t.write(&local, 0, &desc, 0, 4096);
    match peer.submit(t) {
        Err(Error::Strict { reason: why, .. }) => assert!(why.contains("staged"), "{why}"),
        other => panic!("strict mode let a staged GPU op run: {other:?}"),
    }
    me.set_strict(false);
    let mut t = Transfer::new();
    t.write(&local, 0, &desc, 0, 4096);
    assert_eq!(run(&peer, t), Path::TcpStaged);
}

#[test]
#[ignore = "requires a GPU: cargo test -p gdx-engine --test gpu_peer -- --ignored"]
fn gpu_regions_over_shm_in_one_process_are_staged_with_the_reason() {
    let lp = open("gpu_regions_over_shm");
    let size = (64 << 20) + 16;
    let target = agent("target", true);
    let remote = lp.alloc_device(other_gpu(&lp), size).unwrap();
    let _served = target
        .register_gpu(&lp, &remote, Access::READ_WRITE, Some("g"))
        .unwrap();
    let me = agent("me", true);
    let local_dev = lp.alloc_device(0, size).unwrap();
    let local = me
        .register_gpu(&lp, &local_dev, Access::LOCAL, None)
        .unwrap();
    let peer = me.connect(target.listen_addr().unwrap()).unwrap();
    assert_eq!(peer.route().transport, Path::Shm);
    let desc = peer.region("g").unwrap();
    assert!(
        desc.ipc.is_some(),
        "gdx-allocated GPU memory carries its IPC handle"
    );
    // Same process: legacy IPC cannot map its own allocation, so the plan says so and stages.
    let mut t = Transfer::new();
    t.write(&local, 0, &desc, 0, 16);
    let report = peer.submit(t).unwrap().wait(WAIT).unwrap();
    assert_eq!(report.ops[0].plan.path, Path::ShmStaged);
    assert!(report.ops[0].plan.reason.contains("this very process"));
    gpu_to_gpu(
        &lp,
        &peer,
        &local,
        &local_dev,
        &remote,
        "g",
        Path::ShmStaged,
    );

    // A local GPU region into a remote agent-allocated host region: one mapped copy.
    let path = gpu_into_remote_host(&lp, &peer, &target, (&local, &local_dev), 3 << 20);
    assert_eq!(path, Path::Shm);
}

/// Writes `len` random bytes from a local GPU region into a fresh host region of `target`,
/// checks them there, and returns the op's path.
fn gpu_into_remote_host(
    lp: &LocalPeer,
    peer: &Peer,
    target: &Agent,
    (local, local_dev): (&Region<'_>, &DeviceRegion),
    len: u64,
) -> Path {
    let served = target.alloc(len, Access::READ_WRITE, Some("h")).unwrap();
    let desc = peer.region("h").unwrap();
    let data = pattern(len as usize, len);
    lp.upload(local_dev, 0, &data).unwrap();
    let mut t = Transfer::new();
    t.write(local, 0, &desc, 0, len);
    let path = run(peer, t);
    assert!(*served.bytes().unwrap() == data[..]);
    path
}

#[test]
#[ignore = "requires a GPU: cargo test -p gdx-engine --test gpu_peer -- --ignored"]
fn pool_memory_has_no_ipc_handle_and_strict_refuses_staging_it() {
    let lp = open("pool_no_ipc");
    let target = agent("target", true);
    let remote = lp.alloc_device_from_pool(0, 1 << 20).unwrap();
    assert_eq!(remote.origin(), &DeviceOrigin::Pool);
    let _served = target
        .register_gpu(&lp, &remote, Access::READ_WRITE, Some("pool"))
        .unwrap();
    let me = agent("me", true);
    let local_dev = lp.alloc_device(0, 1 << 20).unwrap();
    let local = me
        .register_gpu(&lp, &local_dev, Access::LOCAL, None)
        .unwrap();
    let peer = me.connect(target.listen_addr().unwrap()).unwrap();
    let desc = peer.region("pool").unwrap();
    assert!(desc.ipc.is_none());
    me.set_strict(true);
    let mut t = Transfer::new();
    t.write(&local, 0, &desc, 0, 1 << 20);
    match peer.submit(t) {
        Err(Error::Strict { reason: why, .. }) => {
            assert!(why.contains("no CUDA IPC handle"), "{why}")
        }
        other => panic!("{other:?}"),
    }
}

/// The serving side of the two-process tests: a GPU region on the last GPU, filled with
/// `random(len, 42)`, published as "gpu" by an agent with shm on. Prints its address, waits
/// for a line on stdin, then prints the sum of the region's bytes.
/// Not a test of its own: `two_processes` runs its test binary again with
/// `GDX_GPU_PEER_CHILD` set, and the child does this.
fn gpu_peer_child() {
    let lp = LocalPeer::open(Policy::default(), Default::default()).unwrap();
    let len: u64 = std::env::var("GDX_GPU_PEER_LEN").unwrap().parse().unwrap();
    let gpu = lp.gpu_count() - 1;
    let r = if std::env::var("GDX_GPU_PEER_VMM").is_ok() {
        lp.alloc_device_shareable(gpu, len).unwrap()
    } else {
        lp.alloc_device(gpu, len).unwrap()
    };
    lp.upload(&r, 0, &pattern(len as usize, 42)).unwrap();
    let agent = agent("child", true);
    let _served = agent
        .register_gpu(&lp, &r, Access::READ_WRITE, Some("gpu"))
        .unwrap();
    println!("\nCHILDADDR {}", agent.listen_addr().unwrap());
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let out = download(&lp, &r);
    println!(
        "\nCHILDSUM {}",
        out.iter().map(|&b| u64::from(b)).sum::<u64>()
    );
}

/// Reads `prefix` from the child's output (libtest may print before it on the same line).
fn child_line(lines: &mut impl Iterator<Item = std::io::Result<String>>, prefix: &str) -> String {
    loop {
        let l = lines.next().expect("child ended early").unwrap();
        if let Some(i) = l.find(prefix) {
            return l[i + prefix.len()..].trim().to_string();
        }
    }
}

#[test]
#[ignore = "requires a GPU: cargo test -p gdx-engine --test gpu_peer -- --ignored"]
fn ipc_through_a_peer_and_tcp_staged_across_two_processes() {
    two_processes(
        false,
        "ipc_through_a_peer_and_tcp_staged_across_two_processes",
    );
}

#[test]
#[ignore = "requires a GPU: cargo test -p gdx-engine --test gpu_peer -- --ignored"]
fn vmm_memory_shared_as_a_posix_fd_through_a_peer() {
    two_processes(true, "vmm_memory_shared_as_a_posix_fd_through_a_peer");
}

/// `test` is the calling test's name: the child is the same test binary running that one test
/// with `GDX_GPU_PEER_CHILD` set.
fn two_processes(vmm: bool, test: &str) {
    use std::io::{BufRead, Write};
    if std::env::var("GDX_GPU_PEER_CHILD").is_ok() {
        return gpu_peer_child();
    }
    let lp = open(if vmm {
        "vmm_through_a_peer"
    } else {
        "ipc_through_a_peer"
    });
    let len: u64 = (64 << 20) + 3;
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    if vmm {
        cmd.env("GDX_GPU_PEER_VMM", "1");
    }
    let mut child = cmd
        .args([
            "--exact",
            test,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("GDX_GPU_PEER_CHILD", "1")
        // The child's agent must hold this process's secret to authenticate (wire v3).
        .env("GDX_SECRET_FILE", secret_file())
        .env("GDX_GPU_PEER_LEN", len.to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let addr = child_line(&mut lines, "CHILDADDR ");

    let me = agent("parent", true);
    let local_dev = lp.alloc_device(0, len).unwrap();
    let local = me
        .register_gpu(&lp, &local_dev, Access::LOCAL, None)
        .unwrap();
    let peer = me.connect(addr.as_str()).unwrap();
    assert_eq!(peer.route().transport, Path::Shm);
    let desc = peer.region("gpu").unwrap();
    let ipc = desc.ipc.clone().expect("an IPC handle in the descriptor");
    assert_ne!(ipc.pid, std::process::id());
    // A VMM region says "ask for my fd"; a cuMemAlloc one carries the legacy handle.
    assert_eq!(ipc.posix_fd_alloc_len.is_some(), vmm, "{ipc:?}");
    assert_eq!(ipc.handle.is_empty(), vmm);

    // ipc read: the child's GPU bytes straight into ours.
    lp.upload(&local_dev, 0, &vec![POISON; len as usize])
        .unwrap();
    let mut t = Transfer::new();
    t.read(&local, 0, &desc, 0, len);
    let report = peer.submit(t).unwrap().wait(WAIT).unwrap();
    assert_eq!(report.ops[0].status, OpStatus::Completed);
    assert_eq!(report.ops[0].plan.path, Path::Ipc, "{}", report.ops[0].plan);
    assert!(download(&lp, &local_dev) == pattern(len as usize, 42));
    // Strict mode accepts the direct path.
    me.set_strict(true);
    let mut t = Transfer::new();
    t.read(&local, 5, &desc, 11, 1000);
    assert_eq!(run(&peer, t), Path::Ipc);
    me.set_strict(false);

    // The same child over tcp (as another host would be reached): staged, still exact.
    let far = Agent::new(AgentConfig {
        host_id: Some(0xfeed),
        ..small_chunks("far", false)
    })
    .unwrap();
    let far_dev = lp.alloc_device(0, len).unwrap();
    let far_local = far
        .register_gpu(&lp, &far_dev, Access::LOCAL, None)
        .unwrap();
    let far_peer = far.connect(addr.as_str()).unwrap();
    assert_eq!(far_peer.route().transport, Path::Tcp);
    let mut t = Transfer::new();
    t.read(&far_local, 0, &desc, 0, len);
    assert_eq!(run(&far_peer, t), Path::TcpStaged);
    assert!(download(&lp, &far_dev) == pattern(len as usize, 42));

    // ipc write: new bytes into the child's memory, then the child sums what it sees.
    let data = pattern(len as usize, 99);
    lp.upload(&local_dev, 0, &data).unwrap();
    let mut t = Transfer::new();
    t.write(&local, 0, &desc, 0, len).notify("done");
    assert_eq!(run(&peer, t), Path::Ipc);
    writeln!(child.stdin.as_mut().unwrap(), "done").unwrap();
    let sum: u64 = child_line(&mut lines, "CHILDSUM ").parse().unwrap();
    assert_eq!(sum, data.iter().map(|&b| u64::from(b)).sum::<u64>());
    assert!(child.wait().unwrap().success());
}

/// Runs without a GPU: the plan for a remote GPU region is made from its descriptor, and the
/// target's checks still apply (this descriptor names no real region, so the op fails there).
#[test]
fn remote_gpu_descriptors_plan_staged_paths_without_local_cuda() {
    for (shm, want) in [(false, Path::TcpStaged), (true, Path::ShmStaged)] {
        let target = agent("target", shm);
        let me = agent("me", shm);
        let peer = me.connect(target.listen_addr().unwrap()).unwrap();
        let mut desc = target.alloc(64, Access::READ_WRITE, None).unwrap().desc();
        desc.location = Location::Gpu(3);
        desc.shareable = false;
        let src = me.alloc(64, Access::LOCAL, None).unwrap();
        let mut t = Transfer::new();
        t.write(&src, 0, &desc, 0, 64);
        me.set_strict(true); // host memory on this end: strict has no direct path to demand
        let h = peer.submit(t).unwrap();
        let r = h.wait(Duration::from_secs(20));
        let ops = h.op_results();
        assert_eq!(ops[0].plan.path, want, "{}", ops[0].plan);
        assert!(ops[0].plan.reason.contains("GPU3"), "{}", ops[0].plan);
        // The region was dropped with its handle: the target refuses the op.
        assert!(r.is_err() || matches!(ops[0].status, OpStatus::Failed(_)));
    }
}
