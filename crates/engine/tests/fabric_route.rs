//! The fabric transport through libfabric's real tcp provider on 127.0.0.1: two agents that
//! look like two hosts (different host ids, so shm does not apply; no RDMA device here), with
//! `fabric` enabled. The route says fabric and why; bytes are verified after every op; a
//! wrong key and a read-only region are refused by the target agent before any MR key is
//! handed out; registrations close when regions drop; `kill -9` of a target process gives
//! `PeerLost`. Needs libfabric (CI installs libfabric1 through scripts/bootstrap.sh); without
//! it these tests fail, they do not pass silently.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::*;
use gdx_engine::serve::{self, ServeConfig};
use gdx_engine::{Access, AgentConfig, Error, Path, RegionDesc, RegionKey, Transfer};
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn fabric_route_writes_and_reads_unaligned_spans_bytes_verified() {
    let target = fabric_agent("target", 0xf1);
    let me = fabric_agent("me", 0xf2);
    let status = me.fabric_status().expect("fabric offered");
    let expect = fabric_test_provider().unwrap_or_else(|| "127.0.0.1".into());
    assert!(status.contains(&expect), "{status}");
    let peer = me.connect(target.listen_addr().unwrap()).unwrap();
    let route = peer.route();
    assert_eq!(route.transport, Path::Fabric, "{}", route.reason);
    assert!(
        route.reason.contains("another host") && route.reason.contains("rdma:"),
        "{}",
        route.reason
    );
    let len = (4 << 20) + 7;
    let mut src = me.alloc(len + 64, Access::LOCAL, None).unwrap();
    fill_pattern(&mut src.bytes_mut().unwrap(), 31);
    let dst = target
        .alloc(len + 64, Access::READ_WRITE, Some("d"))
        .unwrap();
    let remote = peer.region("d").unwrap();
    for (n, lo, ro) in [(1u64, 0u64, 0u64), (7, 3, 5), (len, 13, 29)] {
        let mut t = Transfer::new();
        t.write(&src, lo, &remote, ro, n);
        let rep = peer.submit(t).unwrap().wait(WAIT).unwrap();
        assert_eq!(rep.ops[0].plan.path, Path::Fabric, "{}", rep.ops[0].plan);
        let (s, d) = (src.bytes().unwrap(), dst.bytes().unwrap());
        let (lo, ro, n) = (lo as usize, ro as usize, n as usize);
        assert_eq!(
            first_diff(&s[lo..lo + n], &d[ro..ro + n]),
            None,
            "write of {n} B"
        );
    }
    // Read back 100 ops in one transfer into a fresh buffer at shifted offsets.
    let back = me.alloc(len + 64, Access::LOCAL, None).unwrap();
    let mut t = Transfer::new();
    let piece = len / 100;
    for i in 0..100u64 {
        t.read(&back, 1 + i * piece, &remote, 29 + i * piece, piece);
    }
    let rep = peer.submit(t).unwrap().wait(WAIT).unwrap();
    assert!(rep.ops.iter().all(|o| o.plan.path == Path::Fabric));
    let (b, d) = (back.bytes().unwrap(), dst.bytes().unwrap());
    let span = 100 * piece as usize;
    assert_eq!(first_diff(&b[1..1 + span], &d[29..29 + span]), None);
}

#[test]
fn wrong_key_and_read_only_regions_are_refused_by_the_target_agent() {
    let (target, me, peer) = fabric_pair(0xf3);
    let src = me.alloc(4096, Access::LOCAL, None).unwrap();
    let dst = target.alloc(4096, Access::READ_WRITE, Some("rw")).unwrap();
    let mut forged: RegionDesc = peer.region("rw").unwrap();
    forged.key = RegionKey(forged.key.0 ^ 1);
    let mut t = Transfer::new();
    t.write(&src, 0, &forged, 0, 64);
    let e = peer.submit(t).unwrap().wait(WAIT).expect_err("forged key");
    assert!(format!("{e:?}").contains("BadKey"), "{e:?}");
    assert!(dst.bytes().unwrap().iter().all(|&b| b == 0));
    // A region open only to remote reads: the MR key would allow writes, so none is given.
    let _ro = target.alloc(4096, Access::READ, Some("ro")).unwrap();
    let mut t = Transfer::new();
    t.read(&src, 0, &peer.region("ro").unwrap(), 0, 64);
    let e = peer
        .submit(t)
        .unwrap()
        .wait(WAIT)
        .expect_err("read-only region");
    assert!(format!("{e:?}").contains("ReadOnly"), "{e:?}");
}

/// The peer's GPU memory on a fabric route: no provider here offers FI_HMEM (and gdx does not
/// register GPU memory with libfabric), and one-sided RMA gives the target no step in which to
/// stage it, so the op is refused at plan time, strict mode or not, naming the route that can
/// stage it. (This end's GPU memory is staged instead: `plan::tests` for the decision,
/// `tests/gpu_fabric.rs` for the bytes.) The peer's GPU region is a descriptor claiming GPU0
/// (no GPU here), so the decision is exercised without one.
#[test]
fn peer_gpu_memory_over_fabric_is_refused_not_staged() {
    let (target, me, peer) = fabric_pair(0xf9);
    let mut src = me.alloc(4096, Access::LOCAL, None).unwrap();
    fill_pattern(&mut src.bytes_mut().unwrap(), 5);
    let dst = target.alloc(4096, Access::READ_WRITE, Some("g")).unwrap();
    let mut gpu: RegionDesc = peer.region("g").unwrap();
    gpu.location = gdx_engine::Location::Gpu(0);
    for strict in [false, true] {
        me.set_strict(strict);
        let mut t = Transfer::new();
        t.write(&src, 0, &gpu, 0, 64);
        let e = match peer.submit(t) {
            Ok(h) => h.wait(WAIT).expect_err("GPU memory over fabric"),
            Err(e) => e,
        };
        let text = e.to_string();
        assert!(
            matches!(
                e,
                Error::Refused {
                    path: Path::Fabric,
                    ..
                }
            ),
            "strict {strict}: {e:?}"
        );
        assert!(
            text.contains("does not offer FI_HMEM") && text.contains("the peer's GPU0"),
            "{text}"
        );
        assert!(
            text.contains("cannot be staged over one-sided RMA"),
            "{text}"
        );
        assert!(text.contains("GDX_TRANSPORTS=tcp,shm"), "{text}");
    }
    assert!(
        dst.bytes().unwrap().iter().all(|&b| b == 0),
        "nothing moved"
    );
}

#[test]
fn registrations_close_when_regions_drop() {
    let (target, me, peer) = fabric_pair(0xf5);
    let (t0, m0) = (
        target.fabric_registrations().unwrap(),
        me.fabric_registrations().unwrap(),
    );
    let src = me.alloc(8192, Access::LOCAL, None).unwrap();
    let dst = target.alloc(8192, Access::READ_WRITE, Some("d")).unwrap();
    let mut t = Transfer::new();
    t.write(&src, 0, &peer.region("d").unwrap(), 0, 8192);
    peer.submit(t).unwrap().wait(WAIT).unwrap();
    assert_eq!(target.fabric_registrations().unwrap().0, t0.0 + 1);
    assert_eq!(me.fabric_registrations().unwrap().0, m0.0 + 1);
    drop(dst);
    drop(src);
    assert_eq!(target.fabric_registrations().unwrap(), (t0.0, 0));
    assert_eq!(me.fabric_registrations().unwrap(), (m0.0, 0));
}

/// The target process: serves a region over fabric until stdin closes (or it is killed).
#[test]
#[ignore = "helper: the target process that fabric_killed_target_gives_peer_lost starts"]
fn fabric_role_server() {
    let mut agent = AgentConfig::from_env().unwrap();
    agent.name = "server".into();
    let h = serve::run(ServeConfig {
        agent,
        region_len: 16 << 20,
        ..ServeConfig::default()
    })
    .unwrap();
    println!("{}", h.summary_line());
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
}

#[test]
fn fabric_killed_target_gives_peer_lost() {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "fabric_role_server",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("GDX_SECRET_FILE", secret_file())
        .env("GDX_TRANSPORTS", "tcp,fabric")
        .env("GDX_HOST_ID", "000000000000000000000000000000f7")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn server");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = loop {
        match lines.next() {
            Some(Ok(l)) if l.contains("GDX_SERVE ") => {
                break l[l.find("GDX_SERVE ").unwrap()..].to_string()
            }
            Some(Ok(_)) => continue,
            other => panic!("server ended early: {other:?}"),
        }
    };
    let field = |k: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .unwrap_or_else(|| panic!("{k} in {line}"))
            .to_string()
    };
    let (addr, desc): (String, RegionDesc) = (field("addr="), field("region=").parse().unwrap());
    let me = fabric_agent("me", 0xf8);
    let addr: std::net::SocketAddr = addr.parse().unwrap();
    let peer = me.connect(addr).unwrap();
    assert_eq!(
        peer.route().transport,
        Path::Fabric,
        "{}",
        peer.route().reason
    );
    let mut src = me.alloc(16 << 20, Access::LOCAL, None).unwrap();
    fill_pattern(&mut src.bytes_mut().unwrap(), 3);
    let mut t = Transfer::new();
    t.write(&src, 0, &desc, 0, 16 << 20);
    peer.submit(t)
        .unwrap()
        .wait(WAIT)
        .expect("write before the kill");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let start = Instant::now();
    let mut t = Transfer::new();
    t.write(&src, 0, &desc, 0, 16 << 20);
    let r = peer.submit(t).and_then(|h| h.wait(Duration::from_secs(60)));
    let e = r.expect_err("write to a killed target");
    eprintln!("after kill -9: {e} ({:?})", start.elapsed());
    assert!(matches!(e, Error::PeerLost { .. }), "{e:?}");
}
