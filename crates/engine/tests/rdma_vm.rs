//! The engine's rdma transport on a real verbs device. No machine of the project has an RDMA
//! NIC, so these run inside the Soft-RoCE VM (`scripts/rdma-vm.sh`; `scripts/test-rdma.sh`
//! runs them on every CI run) and are ignored elsewhere:
//!
//! ```text
//! scripts/rdma-vm.sh run -- target/debug/deps/rdma_vm-HASH --ignored --test-threads=1
//! ```
//!
//! Two agents with different host ids, so the route goes "between hosts" and rdma is the
//! fast path; Soft-RoCE pairs a device with itself, so one VM suffices. The server is another
//! process (this binary again, role `rdma_vm_role_server`) wherever a process boundary
//! matters: writes and reads, kill -9.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::*;
use gdx_engine::serve::{self, ServeConfig};
use gdx_engine::{Access, Agent, AgentConfig, Error, Path, RegionDesc, Transfer, Transports};
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn rdma_config(name: &str, host: u128) -> AgentConfig {
    AgentConfig {
        host_id: Some(host << 64 | 0x5d),
        transports: Transports {
            tcp: true,
            shm: false,
            rdma: true,
            fabric: false,
        },
        ..config(name, false)
    }
}

/// The server role: serve a region of `GDX_TEST_LEN` bytes holding `fill_pattern(seed)` over
/// rdma and tcp until stdin closes. Run only as a child of the tests below.
#[test]
#[ignore = "a role: run as a child process by the rdma_vm tests"]
fn rdma_vm_role_server() {
    let len: u64 = std::env::var("GDX_TEST_LEN").unwrap().parse().unwrap();
    let seed: u64 = std::env::var("GDX_TEST_SEED").unwrap().parse().unwrap();
    let mut agent = rdma_config("server", 2);
    // A restarted server listens where its predecessor did (`GDX_TEST_LISTEN`), once the old
    // process let go of the port: the bind is retried for up to 10 s.
    let at = std::env::var("GDX_TEST_LISTEN").ok();
    if let Some(a) = &at {
        agent.listen = Some(a.parse().unwrap());
    }
    let until = Instant::now() + Duration::from_secs(10);
    let mut h = loop {
        match serve::run(ServeConfig {
            agent: agent.clone(),
            region_len: len,
            ..ServeConfig::default()
        }) {
            Ok(h) => break h,
            Err(e)
                if at.is_some() && Instant::now() < until && e.to_string().contains("in use") =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("serve: {e}"),
        }
    };
    fill_pattern(&mut h.region().bytes_mut().unwrap(), seed);
    println!("{}", h.summary_line());
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
}

struct Server {
    child: Child,
    addr: String,
    desc: RegionDesc,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_server(len: u64, seed: u64) -> Server {
    spawn_server_at(len, seed, None)
}

/// A server process listening on `at` (`None`: a port the kernel picks).
fn spawn_server_at(len: u64, seed: u64, at: Option<&str>) -> Server {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    if let Some(a) = at {
        cmd.env("GDX_TEST_LISTEN", a);
    }
    let mut child = cmd
        .args([
            "--exact",
            "rdma_vm_role_server",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("GDX_SECRET_FILE", secret_file())
        .env("GDX_TEST_LEN", len.to_string())
        .env("GDX_TEST_SEED", seed.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let line = BufReader::new(out)
        .lines()
        .map_while(Result::ok)
        .find(|l| l.contains("GDX_SERVE "))
        .expect("the server printed its GDX_SERVE line");
    let field = |k: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .unwrap_or_else(|| panic!("{k} in {line}"))
            .to_string()
    };
    Server {
        addr: field("addr="),
        desc: field("region=").parse().unwrap(),
        child,
    }
}

/// Write then read back each size at an odd offset; every byte compared.
#[test]
#[ignore = "requires an RDMA device: run inside scripts/rdma-vm.sh (scripts/test-rdma.sh)"]
fn writes_and_reads_of_8_bytes_to_8_mib_between_two_processes_verify() {
    let len = 16 << 20;
    let server = spawn_server(len, 5);
    let me = Agent::new(rdma_config("client", 1)).unwrap();
    me.set_strict(true);
    let peer = me.connect(server.addr.as_str()).unwrap();
    assert_eq!(peer.route().transport, Path::Rdma, "{:?}", peer.route());
    let remote = peer.region("serve").unwrap();
    assert_eq!(remote, server.desc);
    // What the server filled is read back first.
    let back = me.alloc(len, Access::LOCAL, None).unwrap();
    let mut t = Transfer::new();
    t.read(&back, 0, &remote, 0, len);
    let rep = peer.submit(t).unwrap().wait(WAIT).unwrap();
    assert_eq!(rep.ops[0].plan.path, Path::Rdma, "{}", rep.ops[0].plan);
    let mut expect = vec![0u8; len as usize];
    fill_pattern(&mut expect, 5);
    assert_eq!(first_diff(&back.bytes().unwrap(), &expect), None);
    let mut src = me.alloc(len, Access::LOCAL, None).unwrap();
    for (i, size) in [8u64, 4096, 65536, 1 << 20, 8 << 20]
        .into_iter()
        .enumerate()
    {
        let off = 3 + i as u64 * 7;
        fill_pattern(
            &mut src.bytes_mut().unwrap()[..size as usize],
            100 + i as u64,
        );
        let mut t = Transfer::new();
        t.write(&src, 0, &remote, off, size);
        let rep = peer.submit(t).unwrap().wait(WAIT).unwrap();
        assert_eq!(rep.ops[0].plan.path, Path::Rdma, "{}", rep.ops[0].plan);
        assert_eq!(rep.bytes, size);
        let mut t = Transfer::new();
        t.read(&back, 0, &remote, off, size);
        peer.submit(t).unwrap().wait(WAIT).unwrap();
        assert_eq!(
            first_diff(
                &back.bytes().unwrap()[..size as usize],
                &src.bytes().unwrap()[..size as usize]
            ),
            None,
            "{size} bytes at offset {off}"
        );
    }
}

/// 1,000 writes of 4 KiB in one transfer with a notification: the notification arrives after
/// every byte, and the bytes are the target's to check (same process here, so it looks).
#[test]
#[ignore = "requires an RDMA device: run inside scripts/rdma-vm.sh (scripts/test-rdma.sh)"]
fn a_batch_of_1000_writes_with_a_notification_lands_before_it() {
    let target = Agent::new(rdma_config("target", 2)).unwrap();
    let me = Agent::new(rdma_config("init", 1)).unwrap();
    let n = 1000u64;
    let dst = target
        .alloc(n * 4096, Access::READ_WRITE, Some("dst"))
        .unwrap();
    let peer = me.connect(target.listen_addr().unwrap()).unwrap();
    assert_eq!(peer.route().transport, Path::Rdma, "{:?}", peer.route());
    let remote = peer.region("dst").unwrap();
    let mut src = me.alloc(n * 4096, Access::LOCAL, None).unwrap();
    fill_pattern(&mut src.bytes_mut().unwrap(), 9);
    let mut t = Transfer::new();
    for i in 0..n {
        // Reversed order: the target's placement is by offset, not by arrival.
        t.write(&src, i * 4096, &remote, (n - 1 - i) * 4096, 4096);
    }
    t.notify("batch done");
    let rep = peer.submit(t).unwrap().wait(WAIT).unwrap();
    assert_eq!(rep.bytes, n * 4096);
    assert!(rep.ops.iter().all(|o| o.plan.path == Path::Rdma));
    let note = target.wait_notification(WAIT).unwrap();
    assert_eq!(note.data, b"batch done");
    let (d, s) = (dst.bytes().unwrap(), src.bytes().unwrap());
    for i in 0..n as usize {
        let j = n as usize - 1 - i;
        assert_eq!(
            d[j * 4096..(j + 1) * 4096],
            s[i * 4096..(i + 1) * 4096],
            "block {i}"
        );
    }
}

/// A block list: 1,000 scattered 16 KiB blocks written into another process's pool of 2,048 as
/// one transfer (one stream of work requests), then the whole pool read back as 2,048 block
/// reads; the written blocks hold their sources, every other block the server's pattern.
#[test]
#[ignore = "requires an RDMA device: run inside scripts/rdma-vm.sh (scripts/test-rdma.sh)"]
fn a_thousand_scattered_16k_blocks_between_two_processes_verify() {
    const BLOCK: u64 = 16 << 10;
    const POOL: usize = 2_048;
    let len = POOL as u64 * BLOCK;
    let server = spawn_server(len, 8);
    let me = Agent::new(rdma_config("client", 1)).unwrap();
    let peer = me.connect(server.addr.as_str()).unwrap();
    assert_eq!(peer.route().transport, Path::Rdma, "{:?}", peer.route());
    let remote = peer.region("serve").unwrap();
    let mut src = me.alloc(len, Access::LOCAL, None).unwrap();
    fill_pattern(&mut src.bytes_mut().unwrap(), 81);
    let pairs: Vec<(usize, usize)> = gdx_base::pattern::permutation(POOL, 1)
        .into_iter()
        .zip(gdx_base::pattern::permutation(POOL, 2))
        .take(1_000)
        .collect();
    let mut t = Transfer::new();
    for &(s, d) in &pairs {
        t.write(&src, s as u64 * BLOCK, &remote, d as u64 * BLOCK, BLOCK);
    }
    let rep = peer.submit(t).unwrap().wait(WAIT).unwrap();
    assert_eq!(rep.bytes, 1_000 * BLOCK);
    assert!(rep.ops.iter().all(|o| o.plan.path == Path::Rdma));
    let back = me.alloc(len, Access::LOCAL, None).unwrap();
    let mut t = Transfer::new();
    for b in gdx_base::pattern::permutation(POOL, 3) {
        t.read(&back, b as u64 * BLOCK, &remote, b as u64 * BLOCK, BLOCK);
    }
    let rep = peer.submit(t).unwrap().wait(WAIT).unwrap();
    assert_eq!(rep.bytes, len);
    let mut expect = vec![0u8; len as usize];
    fill_pattern(&mut expect, 8);
    let s = src.bytes().unwrap();
    let bs = BLOCK as usize;
    for &(sb, db) in &pairs {
        expect[db * bs..(db + 1) * bs].copy_from_slice(&s[sb * bs..(sb + 1) * bs]);
    }
    assert_eq!(
        first_diff(&back.bytes().unwrap(), &expect),
        None,
        "the pool read back differs (written or untouched blocks)"
    );
}

/// A prepared write posted again and again over rdma, each post's bytes verified; then the
/// region is freed under it and the next post fails by name instead of reporting success.
#[test]
#[ignore = "requires an RDMA device: run inside scripts/rdma-vm.sh (scripts/test-rdma.sh)"]
fn prepared_writes_repeat_and_a_freed_region_fails_the_next_post() {
    let target = Agent::new(rdma_config("target", 2)).unwrap();
    let me = Agent::new(rdma_config("init", 1)).unwrap();
    let len = 256 << 10;
    let dst = target.alloc(len, Access::READ_WRITE, Some("dst")).unwrap();
    let peer = me.connect(target.listen_addr().unwrap()).unwrap();
    let remote = peer.region("dst").unwrap();
    let mut src = me.alloc(len, Access::LOCAL, None).unwrap();
    let mut t = Transfer::new();
    t.write(&src, 0, &remote, 0, len);
    let mut w = peer.prepare(t).unwrap();
    assert_eq!(w.paths(), vec![Path::Rdma]);
    for i in 0..10 {
        fill_pattern(&mut src.bytes_mut().unwrap(), 40 + i);
        w.run(WAIT).unwrap();
        assert_eq!(
            first_diff(&dst.bytes().unwrap(), &src.bytes().unwrap()),
            None,
            "post {i}"
        );
    }
    drop(dst);
    let e = w.run(WAIT).unwrap_err();
    assert!(
        matches!(
            e,
            Error::NoSuchRegion { .. } | Error::RegionGone { .. } | Error::Rdma(_)
        ),
        "{e}"
    );
}

/// kill -9 of the serving process mid-transfer: `PeerLost` (or the QP's error) within the
/// timeout, never a hang and never success; a new server then works.
#[test]
#[ignore = "requires an RDMA device: run inside scripts/rdma-vm.sh (scripts/test-rdma.sh)"]
fn kill_9_of_the_peer_mid_transfer_fails_within_the_timeout() {
    let len = 32 << 20;
    let mut server = spawn_server(len, 7);
    let mut cfg = rdma_config("client", 1);
    cfg.io_timeout = Duration::from_secs(5);
    let me = Agent::new(cfg).unwrap();
    let peer = me.connect(server.addr.as_str()).unwrap();
    assert_eq!(peer.route().transport, Path::Rdma, "{:?}", peer.route());
    let remote = peer.region("serve").unwrap();
    let src = me.alloc(len, Access::LOCAL, None).unwrap();
    let timeout = Duration::from_secs(60);
    let mut t = Transfer::new();
    for i in 0..8 {
        t.write(&src, i * (len / 8), &remote, i * (len / 8), len / 8);
    }
    let h = peer.submit(t).unwrap();
    server.child.kill().unwrap(); // SIGKILL
    let killed = Instant::now();
    match h.wait(timeout) {
        // The whole write may have landed before the kill took effect; then the next one fails.
        Ok(_) => {
            let mut t = Transfer::new();
            t.write(&src, 0, &remote, 0, len);
            let e = peer
                .submit(t)
                .and_then(|h| h.wait(timeout))
                .expect_err("a write to a killed peer cannot succeed");
            assert!(
                matches!(e, Error::PeerLost { .. } | Error::Rdma(_)),
                "{e:?}"
            );
        }
        Err(e) => assert!(
            matches!(e, Error::PeerLost { .. } | Error::Rdma(_)),
            "{e:?}"
        ),
    }
    assert!(killed.elapsed() < timeout, "took {:?}", killed.elapsed());
    drop(server);
    let server = spawn_server(1 << 20, 8);
    let peer = me.connect(server.addr.as_str()).unwrap();
    let remote = peer.region("serve").unwrap();
    let back = me.alloc(1 << 20, Access::LOCAL, None).unwrap();
    let mut t = Transfer::new();
    t.read(&back, 0, &remote, 0, 1 << 20);
    let rep = peer.submit(t).unwrap().wait(WAIT).unwrap();
    assert_eq!(rep.ops[0].plan.path, Path::Rdma);
    let mut expect = vec![0u8; 1 << 20];
    fill_pattern(&mut expect, 8);
    assert_eq!(first_diff(&back.bytes().unwrap(), &expect), None);
}

/// A peer that restarts on the same address (issue 54) over rdma: the transfer in flight to
/// the old process fails (`PeerLost`, or the queue pair's error naming the retry), the old
/// `Peer` stays failed, a connect expecting the old instance is refused naming the new one,
/// and a plain connect reaches the new process, whose bytes are read back and verified.
#[test]
#[ignore = "requires an RDMA device: run inside scripts/rdma-vm.sh (scripts/test-rdma.sh)"]
fn a_peer_restarted_on_the_same_address_over_rdma() {
    let len = 32 << 20;
    let mut old = spawn_server(len, 21);
    let mut cfg = rdma_config("client", 1);
    cfg.io_timeout = Duration::from_secs(5);
    let me = Agent::new(cfg).unwrap();
    let peer = me.connect(old.addr.as_str()).unwrap();
    assert_eq!(peer.route().transport, Path::Rdma, "{:?}", peer.route());
    let old_id = peer.info().agent_id;
    let remote = peer.region("serve").unwrap();
    let src = me.alloc(len, Access::LOCAL, None).unwrap();
    let mut t = Transfer::new();
    for i in 0..8 {
        t.write(&src, i * (len / 8), &remote, i * (len / 8), len / 8);
    }
    let h = peer.submit(t).unwrap();
    // The restart: the old process dies, a new one listens on the same address.
    old.child.kill().unwrap();
    old.child.wait().unwrap();
    let new = spawn_server_at(len, 22, Some(&old.addr));
    assert_eq!(new.addr, old.addr);
    match h.wait(Duration::from_secs(60)) {
        // The whole write may have landed before the kill took effect.
        Ok(_) => {}
        Err(e) => assert!(
            matches!(e, Error::PeerLost { .. } | Error::Rdma(_)),
            "{e:?}"
        ),
    }
    // The old peer stays failed: never a silent success against the new process.
    let mut t = Transfer::new();
    t.write(&src, 0, &remote, 0, 4096).notify("to the old one");
    let again = peer.submit(t).and_then(|h| h.wait(Duration::from_secs(60)));
    assert!(
        matches!(again, Err(Error::PeerLost { .. } | Error::Rdma(_))),
        "a transfer on the old peer after the restart: {again:?}"
    );
    let expect = gdx_engine::Expected {
        name: "server".into(),
        agent_id: Some(old_id),
        cluster: None,
    };
    match me.connect_expecting(new.addr.as_str(), &expect) {
        Err(Error::AuthFailed { why, .. }) => {
            assert!(why.contains(&format!("{old_id:032x}")), "{why}")
        }
        other => panic!("a connect expecting the old instance: {:?}", other.err()),
    }
    let peer2 = me.connect(new.addr.as_str()).unwrap();
    assert_ne!(peer2.info().agent_id, old_id);
    assert_eq!(peer2.route().transport, Path::Rdma, "{:?}", peer2.route());
    let remote2 = peer2.region("serve").unwrap();
    assert_ne!(remote2.key, remote.key);
    let back = me.alloc(len, Access::LOCAL, None).unwrap();
    let mut t = Transfer::new();
    t.read(&back, 0, &remote2, 0, len);
    let rep = peer2.submit(t).unwrap().wait(WAIT).unwrap();
    assert_eq!(rep.ops[0].plan.path, Path::Rdma);
    assert_eq!(
        first_diff(&back.bytes().unwrap(), &pattern(len as usize, 22)),
        None
    );
}

/// A peer stopped with SIGSTOP over rdma: its NIC (here its kernel's rxe) still serves
/// one-sided ops, so a write to a region already looked up lands; what needs the process
/// fails by the I/O timeout, naming it: the notification (`PeerLost`, no answer on the
/// control connection). After SIGCONT the bytes are read back and verified.
#[test]
#[ignore = "requires an RDMA device: run inside scripts/rdma-vm.sh (scripts/test-rdma.sh)"]
fn a_stopped_peer_over_rdma_fails_what_needs_it_by_the_timeout() {
    let len = 8 << 20;
    let server = spawn_server(len, 23);
    let mut cfg = rdma_config("client", 1);
    cfg.io_timeout = Duration::from_secs(3);
    let me = Agent::new(cfg).unwrap();
    let peer = me.connect(server.addr.as_str()).unwrap();
    assert_eq!(peer.route().transport, Path::Rdma, "{:?}", peer.route());
    let remote = peer.region("serve").unwrap();
    let mut src = me.alloc(len, Access::LOCAL, None).unwrap();
    fill_pattern(&mut src.bytes_mut().unwrap(), 24);
    // The region is looked up on the rail before the stop.
    let mut t = Transfer::new();
    t.write(&src, 0, &remote, 0, 4096);
    peer.submit(t).unwrap().wait(WAIT).unwrap();
    stop(server.child.id());
    let mut t = Transfer::new();
    t.write(&src, 0, &remote, 0, len);
    peer.submit(t).unwrap().wait(WAIT).unwrap();
    let mut t = Transfer::new();
    t.write(&src, 0, &remote, 0, 4096).notify("stopped");
    let h = peer.submit(t).unwrap();
    let t0 = Instant::now();
    let err = h.wait(WAIT).unwrap_err();
    assert!(
        matches!(&err, Error::PeerLost { reason: why, .. } if why.contains("timeout") || why.contains("timed out")),
        "the notification to a stopped peer: {err:?}"
    );
    eprintln!(
        "notification to the stopped peer failed after {:?}: {err}",
        t0.elapsed()
    );
    let st = Command::new("kill")
        .args(["-CONT", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let peer = me.connect(server.addr.as_str()).unwrap();
    let back = me.alloc(len, Access::LOCAL, None).unwrap();
    let mut t = Transfer::new();
    t.read(&back, 0, &peer.region("serve").unwrap(), 0, len);
    peer.submit(t).unwrap().wait(WAIT).unwrap();
    assert_eq!(
        first_diff(&back.bytes().unwrap(), &pattern(len as usize, 24)),
        None
    );
}

/// A write cancelled mid-transfer over rdma: `cancel` returns once no work request of it is
/// outstanding (each 8 MiB op is one piece, posted and completed whole, or never posted),
/// the transfer says `Cancelled`, the source region is dropped at once, and the peer's memory
/// holds each completed op's bytes and, where an op was cancelled, its own bytes untouched.
#[test]
#[ignore = "requires an RDMA device: run inside scripts/rdma-vm.sh (scripts/test-rdma.sh)"]
fn a_write_cancelled_mid_transfer_over_rdma_leaves_whole_ops() {
    const OP: u64 = 8 << 20;
    let len = 8 * OP;
    let server = spawn_server(len, 25);
    let me = Agent::new(rdma_config("client", 1)).unwrap();
    let peer = me.connect(server.addr.as_str()).unwrap();
    assert_eq!(peer.route().transport, Path::Rdma, "{:?}", peer.route());
    let remote = peer.region("serve").unwrap();
    let mut src = me.alloc(len, Access::LOCAL, None).unwrap();
    fill_pattern(&mut src.bytes_mut().unwrap(), 26);
    let mut t = Transfer::new();
    for i in 0..8 {
        t.write(&src, i * OP, &remote, i * OP, OP);
    }
    let h = peer.submit(t).unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    while h.bytes_done() == 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
    let res = h.cancel();
    let statuses: Vec<gdx_engine::OpStatus> =
        h.op_results().iter().map(|o| o.status.clone()).collect();
    drop(src);
    match &res {
        Err(Error::Cancelled) => {
            assert!(matches!(h.wait(WAIT), Err(Error::Cancelled)));
        }
        Ok(r) => assert_eq!(r.bytes, len, "ended before the cancel"),
        Err(e) => panic!("{e:?}"),
    }
    let back = me.alloc(len, Access::LOCAL, None).unwrap();
    let mut t = Transfer::new();
    t.read(&back, 0, &remote, 0, len);
    peer.submit(t).unwrap().wait(WAIT).unwrap();
    let got = back.bytes().unwrap();
    let (sent, theirs) = (pattern(len as usize, 26), pattern(len as usize, 25));
    let mut cancelled = 0;
    for (i, st) in statuses.iter().enumerate() {
        let span = i * OP as usize..(i + 1) * OP as usize;
        match st {
            gdx_engine::OpStatus::Completed => {
                assert_eq!(first_diff(&got[span.clone()], &sent[span]), None, "op {i}");
            }
            gdx_engine::OpStatus::Failed(Error::Cancelled) => {
                cancelled += 1;
                assert_eq!(
                    first_diff(&got[span.clone()], &theirs[span]),
                    None,
                    "op {i}"
                );
            }
            other => panic!("op {i}: {other:?}"),
        }
    }
    eprintln!("rdma cancel: {cancelled} of 8 ops cancelled");
    assert_eq!(res.is_err(), cancelled > 0);
}
