//! Two processes: this test binary re-executes itself (`std::env::current_exe()`) with
//! `GDX_TEST_ROLE=server`, which runs `gdx_engine::serve` and prints its `GDX_SERVE` line. Nothing
//! depends on build-time paths, so the binary can be copied to another machine and still run.
//!
//! Also: the peer-death test (`kill -9` the server mid-transfer → `PeerLost` within the timeout,
//! then a fresh connection works), and the veth test (two network namespaces, run as root with
//! `ip netns`; skipped with a printed reason otherwise).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::*;
use gdx_engine::serve::{self, ServeConfig};
use gdx_engine::{Access, AgentConfig, Error, Path, RegionDesc, Status, Transfer};
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Large tests take this lock so that at most one 1 GiB pair lives at a time.
static BIG: Mutex<()> = Mutex::new(());

const GIB: u64 = 1 << 30;

/// The server role: serve a region filled with `fill_pattern(seed)` until stdin closes.
#[test]
#[ignore = "a role: run as a child process by the tests of this file"]
fn role_server() {
    assert_eq!(
        std::env::var("GDX_TEST_ROLE").as_deref(),
        Ok("server"),
        "a role: run only as a child of the tests of this file"
    );
    let len: u64 = std::env::var("GDX_TEST_LEN")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64 << 20);
    let seed: u64 = std::env::var("GDX_TEST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let mut agent = AgentConfig::from_env().unwrap();
    agent.name = "server".into();
    let mut h = serve::run(ServeConfig {
        agent,
        region_len: len,
        ..ServeConfig::default()
    })
    .unwrap();
    fill_pattern(&mut h.region().bytes_mut().unwrap(), seed);
    println!("{}", h.summary_line());
    // Serve until the parent closes our stdin (or kills us).
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
}

/// The client role (used inside a network namespace): write, read back, verify.
#[test]
#[ignore = "a role: run as a child process by veth_between_network_namespaces"]
fn role_client() {
    assert_eq!(
        std::env::var("GDX_TEST_ROLE").as_deref(),
        Ok("client"),
        "a role: run only as a child of veth_between_network_namespaces"
    );
    let addr = std::env::var("GDX_TEST_ADDR").unwrap();
    let len: u64 = std::env::var("GDX_TEST_LEN").unwrap().parse().unwrap();
    let seed: u64 = std::env::var("GDX_TEST_SEED").unwrap().parse().unwrap();
    let mut cfg = AgentConfig::from_env().unwrap();
    cfg.listen = None;
    let agent = gdx_engine::Agent::new(cfg).unwrap();
    let peer = agent.connect(addr.as_str()).unwrap();
    assert_eq!(peer.route().transport, Path::Tcp, "{:?}", peer.route());
    let remote = peer.region("serve").unwrap();
    verify_remote(&agent, &peer, &remote, len, seed, Path::Tcp);
    println!("GDX_CLIENT ok route={}", peer.route().reason);
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

fn role_command(role: &str, test: &str) -> Command {
    let exe = std::env::current_exe().expect("current_exe");
    let mut c = Command::new(exe);
    c.args([
        "--exact",
        test,
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("GDX_TEST_ROLE", role)
    .env("GDX_SECRET_FILE", secret_file());
    c
}

fn read_serve_line(child: &mut Child) -> (String, RegionDesc) {
    let out = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(out).lines();
    let line = loop {
        match lines.next() {
            // The harness may print "test role_server ... " before our line.
            Some(Ok(l)) if l.contains("GDX_SERVE ") => {
                break l[l.find("GDX_SERVE ").unwrap_or(0)..].to_string()
            }
            Some(Ok(_)) => continue,
            other => panic!("server ended before printing its address: {other:?}"),
        }
    };
    let field = |k: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .unwrap_or_else(|| panic!("{k} in {line}"))
            .to_string()
    };
    (field("addr="), field("region=").parse().unwrap())
}

fn spawn_server(len: u64, seed: u64, wrap: Option<&[&str]>) -> Server {
    let mut c = match wrap {
        None => role_command("server", "role_server"),
        Some(prefix) => {
            let mut c = Command::new(prefix[0]);
            c.args(&prefix[1..])
                .arg(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "role_server",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("GDX_TEST_ROLE", "server")
                .env("GDX_SECRET_FILE", secret_file());
            c
        }
    };
    let mut child = c
        .env("GDX_TEST_LEN", len.to_string())
        .env("GDX_TEST_SEED", seed.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn server");
    let (addr, desc) = read_serve_line(&mut child);
    Server { child, addr, desc }
}

/// Reads the whole remote region (filled with `fill_pattern(seed)` by the server) and checks it,
/// then writes fresh random data over it, reads it back and checks again.
fn verify_remote(
    agent: &gdx_engine::Agent,
    peer: &gdx_engine::Peer,
    remote: &RegionDesc,
    len: u64,
    seed: u64,
    path: Path,
) {
    let mut expect = vec![0u8; len as usize];
    fill_pattern(&mut expect, seed);
    let back = agent.alloc(len, Access::LOCAL, None).unwrap();
    let mut t = Transfer::new();
    t.read(&back, 0, remote, 0, len);
    let rep = peer.submit(t).unwrap().wait(WAIT).unwrap();
    assert_eq!(rep.ops[0].plan.path, path, "{}", rep.ops[0].plan);
    assert_eq!(
        first_diff(&back.bytes().unwrap(), &expect),
        None,
        "read of {len} bytes differs"
    );

    fill_pattern(&mut expect, seed + 1000);
    let mut src = agent.alloc(len, Access::LOCAL, None).unwrap();
    src.bytes_mut().unwrap().copy_from_slice(&expect);
    drop(expect);
    let mut t = Transfer::new();
    t.write(&src, 0, remote, 0, len);
    let rep = peer.submit(t).unwrap().wait(WAIT).unwrap();
    assert_eq!(rep.ops[0].plan.path, path);
    let mut t = Transfer::new();
    t.read(&back, 0, remote, 0, len);
    peer.submit(t).unwrap().wait(WAIT).unwrap();
    assert_eq!(
        first_diff(&back.bytes().unwrap(), &src.bytes().unwrap()),
        None,
        "written bytes differ"
    );
}

fn two_process(shm: bool, len: u64) {
    let _big = BIG.lock().unwrap_or_else(|p| p.into_inner());
    let server = spawn_server(len, 42, None);
    let agent = agent("client", shm);
    let peer = agent.connect(server.addr.as_str()).unwrap();
    let remote = peer.region("serve").unwrap();
    assert_eq!(remote, server.desc);
    let path = if shm { Path::Shm } else { Path::Tcp };
    assert_eq!(peer.route().transport, path, "{:?}", peer.route());
    verify_remote(&agent, &peer, &remote, len, 42, path);
    // Unaligned small ops against the same process.
    let src = agent.alloc(4096, Access::LOCAL, None).unwrap();
    let mut t = Transfer::new();
    t.write(&src, 1, &remote, len - 4095, 4095).notify("done");
    peer.submit(t).unwrap().wait(WAIT).unwrap();
}

#[test]
fn two_processes_tcp_1gib() {
    two_process(false, GIB);
}

#[test]
fn two_processes_shm_1gib() {
    two_process(true, GIB);
}

fn kill_mid_transfer(shm: bool) {
    let _big = BIG.lock().unwrap_or_else(|p| p.into_inner());
    let len = 256 << 20;
    let mut server = spawn_server(len, 7, None);
    let mut cfg = config("client", shm);
    cfg.io_timeout = Duration::from_secs(5);
    let agent = gdx_engine::Agent::new(cfg).unwrap();
    let peer = agent.connect(server.addr.as_str()).unwrap();
    let remote = peer.region("serve").unwrap();
    let src = agent.alloc(len, Access::LOCAL, None).unwrap();
    let timeout = Duration::from_secs(10);

    // Transfers back to back; kill -9 the server while one is running. The server is stopped
    // (SIGSTOP, every thread seen stopped) before the third is submitted, so that transfer
    // cannot finish before the kill, however fast the machine.
    let mut killed_at = None;
    let mut completed = 0;
    let (err, failed_handle) = loop {
        let mut t = Transfer::new();
        for i in 0..4 {
            t.write(&src, i * (len / 4), &remote, i * (len / 4), len / 4);
        }
        if completed == 2 && killed_at.is_none() {
            stop(server.child.id());
        }
        let h = match peer.submit(t) {
            Ok(h) => h,
            Err(e) => break (e, None),
        };
        if completed == 2 && killed_at.is_none() {
            assert_eq!(h.status(), Status::Pending, "the server is stopped");
            server.child.kill().unwrap(); // SIGKILL ends a stopped process too
            killed_at = Some(Instant::now());
        }
        match h.wait(timeout) {
            Ok(_) => completed += 1,
            Err(e) => break (e, Some(h)),
        }
        assert!(completed < 1000, "server never died");
    };
    let killed_at = killed_at.expect("failure before the kill");
    let took = killed_at.elapsed();
    assert!(
        matches!(err, Error::PeerLost { .. }),
        "expected PeerLost, got {err:?}"
    );
    assert!(took < timeout, "PeerLost took {took:?}");
    let h =
        failed_handle.expect("the failure should come from the running transfer, not from submit");
    assert!(matches!(
        h.status(),
        Status::Failed {
            reason: Error::PeerLost { .. }
        }
    ));
    assert!(h
        .op_results()
        .iter()
        .any(|o| matches!(o.status, gdx_engine::OpStatus::Failed(_))));
    eprintln!("PeerLost {took:?} after kill -9, after {completed} completed transfers");

    // The peer stays failed; a fresh server and a fresh connection work.
    assert!(!peer.is_alive() || peer.submit(Transfer::new()).is_err());
    drop(server);
    let server = spawn_server(1 << 20, 8, None);
    let peer = agent.connect(server.addr.as_str()).unwrap();
    let remote = peer.region("serve").unwrap();
    verify_remote(
        &agent,
        &peer,
        &remote,
        1 << 20,
        8,
        if shm { Path::Shm } else { Path::Tcp },
    );
}

#[test]
fn kill_server_mid_transfer_tcp() {
    kill_mid_transfer(false);
}

#[test]
fn kill_server_mid_transfer_shm() {
    kill_mid_transfer(true);
}

/// A stopped peer (SIGSTOP) must not block `submit` on the shm fast path: the small write's
/// posted ring slot goes to the worker thread, so `submit` returns with the transfer still
/// pending (it could only have ended by now through the 20 s I/O timeout, on the caller's
/// thread); a transfer submitted behind it is pending too; when the peer dies, both fail with
/// `PeerLost` and neither completes.
#[test]
fn stopped_shm_peer_does_not_block_submit() {
    let _big = BIG.lock().unwrap_or_else(|p| p.into_inner());
    let mut server = spawn_server(1 << 20, 9, None);
    let agent = agent("client", true);
    let peer = agent.connect(server.addr.as_str()).unwrap();
    assert_eq!(peer.route().transport, Path::Shm, "{:?}", peer.route());
    let remote = peer.region("serve").unwrap();
    let mut src = agent.alloc(4096, Access::LOCAL, None).unwrap();
    fill_pattern(&mut src.bytes_mut().unwrap(), 5);
    let back = agent.alloc(4096, Access::LOCAL, None).unwrap();

    // While the peer runs, the small write takes the fast path and its bytes land.
    let mut t = Transfer::new();
    t.write(&src, 0, &remote, 0, 8);
    peer.submit(t).unwrap().wait(WAIT).unwrap();
    let mut t = Transfer::new();
    t.read(&back, 0, &remote, 0, 8);
    peer.submit(t).unwrap().wait(WAIT).unwrap();
    assert_eq!(back.bytes().unwrap()[..8], src.bytes().unwrap()[..8]);

    stop(server.child.id());

    let mut t = Transfer::new();
    t.write(&src, 8, &remote, 8, 8);
    let stalled = peer.submit(t).unwrap();
    assert_eq!(
        stalled.status(),
        Status::Pending,
        "submit returned with the transfer already ended: it waited for the stopped peer"
    );
    let mut t = Transfer::new();
    t.write(&src, 16, &remote, 16, 8).notify("behind");
    let behind = peer.submit(t).unwrap();
    assert_eq!(behind.status(), Status::Pending);

    server.child.kill().unwrap(); // SIGKILL ends a stopped process too
    server.child.wait().unwrap();
    for h in [&stalled, &behind] {
        let err = h.wait(WAIT).unwrap_err();
        assert!(
            matches!(err, Error::PeerLost { .. }),
            "expected PeerLost, got {err:?}"
        );
        for o in h.op_results() {
            assert!(
                matches!(
                    o.status,
                    gdx_engine::OpStatus::Failed(Error::PeerLost { .. })
                ),
                "{:?}",
                o.status
            );
        }
    }
    assert!(!peer.is_alive());
}

/// A peer stopped with SIGSTOP (issue 54): its process holds its sockets open, so nothing
/// breaks; the transfer fails by its own deadline (`Timeout(500 ms)`), long before the I/O
/// timeout (5 s), and the ops say so. Over tcp the stream stops waiting for the reply at the
/// deadline; over shm the ring wait does, and closes the connection (the peer may still act
/// on the request when it resumes). Bounded: the deadline is 500 ms, the I/O timeout 5 s.
fn stopped_peer_times_out(shm: bool) {
    let _big = BIG.lock().unwrap_or_else(|p| p.into_inner());
    let mut server = spawn_server(1 << 20, 10, None);
    let (agent, peer, remote) = stopped_pair(&server, shm);
    let src = agent.alloc(1 << 20, Access::LOCAL, None).unwrap();
    stop(server.child.id());
    let deadline = Duration::from_millis(500);
    let mut t = Transfer::new();
    t.write(&src, 0, &remote, 0, 1 << 20).timeout(deadline);
    let h = peer.submit(t).unwrap();
    let err = h.wait(WAIT).unwrap_err();
    assert!(
        matches!(err, Error::Timeout(d) if d == deadline),
        "expected the transfer's own deadline, got {err:?}"
    );
    assert!(
        h.op_results()
            .iter()
            .all(|o| o.status == gdx_engine::OpStatus::Failed(Error::Timeout(deadline))),
        "{:?}",
        h.op_results()
    );
    drop(src);
    server.child.kill().unwrap();
    server.child.wait().unwrap();
}

/// A client connected to `server` over shm or tcp with a 5 s I/O timeout, and the served
/// region.
fn stopped_pair(server: &Server, shm: bool) -> (gdx_engine::Agent, gdx_engine::Peer, RegionDesc) {
    let agent = gdx_engine::Agent::new(AgentConfig {
        io_timeout: Duration::from_secs(5),
        ..config("client", shm)
    })
    .unwrap();
    let peer = agent.connect(server.addr.as_str()).unwrap();
    let want = if shm { Path::Shm } else { Path::Tcp };
    assert_eq!(peer.route().transport, want, "{:?}", peer.route());
    let remote = peer.region("serve").unwrap();
    (agent, peer, remote)
}

#[test]
fn stopped_peer_fails_transfers_by_a_timeout_tcp() {
    stopped_peer_times_out(false);
}

#[test]
fn stopped_peer_fails_transfers_by_a_timeout_shm() {
    stopped_peer_times_out(true);
}

/// A transfer to a peer stopped with SIGSTOP is cancelled (issue 54): the cancel returns
/// without waiting for the I/O timeout (the transfer's deadline is a minute), the transfer
/// says `Cancelled`, and its source region can be dropped. Over tcp the chunk already handed
/// to the kernel is abandoned (its reply would be dropped); over shm the unanswered ring
/// request closes the connection. The run stays bounded by the 5 s I/O timeout regardless.
fn stopped_peer_cancel(shm: bool) {
    let _big = BIG.lock().unwrap_or_else(|p| p.into_inner());
    let mut server = spawn_server(1 << 20, 11, None);
    let (agent, peer, remote) = stopped_pair(&server, shm);
    let src = agent.alloc(1 << 20, Access::LOCAL, None).unwrap();
    stop(server.child.id());
    let mut t = Transfer::new();
    t.write(&src, 0, &remote, 0, 1 << 20)
        .timeout(Duration::from_secs(60));
    let h = peer.submit(t).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(h.status(), Status::Pending, "the peer is stopped");
    let err = h.cancel().unwrap_err();
    assert_eq!(err, Error::Cancelled, "{err}");
    assert!(matches!(h.wait(WAIT), Err(Error::Cancelled)));
    assert!(h
        .op_results()
        .iter()
        .all(|o| o.status == gdx_engine::OpStatus::Failed(Error::Cancelled)));
    drop(src);
    server.child.kill().unwrap();
    server.child.wait().unwrap();
}

#[test]
fn a_transfer_to_a_stopped_peer_can_be_cancelled_tcp() {
    stopped_peer_cancel(false);
}

#[test]
fn a_transfer_to_a_stopped_peer_can_be_cancelled_shm() {
    stopped_peer_cancel(true);
}

/// Two network namespaces joined by a veth pair; server in one, client in the other, tcp between.
#[test]
#[ignore = "requires root and `ip netns` (CI runs it with --ignored --exact)"]
fn veth_between_network_namespaces() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc_geteuid() };
    assert_eq!(euid, 0, "veth_between_network_namespaces needs root");
    let ok = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(ok, "veth_between_network_namespaces needs `ip netns`");
    let _big = BIG.lock().unwrap_or_else(|p| p.into_inner());
    let pid = std::process::id();
    let (a, b) = (format!("gdxa{pid}"), format!("gdxb{pid}"));
    let (va, vb) = (
        format!("gva{}", pid % 100_000),
        format!("gvb{}", pid % 100_000),
    );
    struct Cleanup(Vec<String>);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            for ns in &self.0 {
                let _ = Command::new("ip").args(["netns", "del", ns]).status();
            }
        }
    }
    let _cleanup = Cleanup(vec![a.clone(), b.clone()]);
    let sh = |args: &[&str]| {
        let st = Command::new("ip").args(args).status().expect("ip");
        st.success()
    };
    let setup = sh(&["netns", "add", &a])
        && sh(&["netns", "add", &b])
        && sh(&["link", "add", &va, "type", "veth", "peer", "name", &vb])
        && sh(&["link", "set", &va, "netns", &a])
        && sh(&["link", "set", &vb, "netns", &b])
        && sh(&["-n", &a, "addr", "add", "10.213.7.1/30", "dev", &va])
        && sh(&["-n", &b, "addr", "add", "10.213.7.2/30", "dev", &vb])
        && sh(&["-n", &a, "link", "set", &va, "up"])
        && sh(&["-n", &b, "link", "set", &vb, "up"])
        && sh(&["-n", &a, "link", "set", "lo", "up"])
        && sh(&["-n", &b, "link", "set", "lo", "up"]);
    assert!(
        setup,
        "veth_between_network_namespaces could not create namespaces and a veth pair"
    );
    let len = 64 << 20;
    let exe = std::env::current_exe().unwrap();
    let mut server = Command::new("ip");
    server
        .args(["netns", "exec", &a])
        .arg(&exe)
        .args([
            "--exact",
            "role_server",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("GDX_TEST_ROLE", "server")
        .env("GDX_SECRET_FILE", secret_file())
        .env("GDX_LISTEN", "10.213.7.1:0")
        .env("GDX_TEST_LEN", len.to_string())
        .env("GDX_TEST_SEED", "77")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let mut child = server.spawn().unwrap();
    let (addr, _) = read_serve_line(&mut child);
    let server = Server {
        child,
        addr: addr.clone(),
        desc: "gdx1:".parse().unwrap_or_else(|_| dummy_desc()),
    };
    let out = Command::new("ip")
        .args(["netns", "exec", &b])
        .arg(&exe)
        .args([
            "--exact",
            "role_client",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("GDX_TEST_ROLE", "client")
        .env("GDX_SECRET_FILE", secret_file())
        .env("GDX_TEST_ADDR", &addr)
        .env("GDX_TEST_LEN", len.to_string())
        .env("GDX_TEST_SEED", "77")
        .output()
        .unwrap();
    drop(server);
    let stdout = String::from_utf8_lossy(&out.stdout);
    if let Some(l) = stdout.lines().find(|l| l.contains("GDX_CLIENT")) {
        eprintln!("veth: {l}");
    }
    assert!(
        out.status.success() && stdout.contains("GDX_CLIENT ok"),
        "client failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn dummy_desc() -> RegionDesc {
    RegionDesc {
        id: 0,
        key: gdx_engine::RegionKey(0),
        len: 0,
        location: gdx_engine::Location::Host,
        access: Access::LOCAL,
        shareable: false,
        name: None,
        ipc: None,
        no_ipc: None,
    }
}

extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}
