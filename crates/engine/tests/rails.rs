//! tcp rails over loopback: a peer connection striped over several local addresses (127.0.0.1,
//! 127.0.0.2, ... are all local on Linux), its share following each rail's throughput, failover
//! when a rail is cut mid-transfer, the rail used again once it comes back, and a clear failure
//! naming every rail's cause when none is left. Slow and cut rails go through a userspace relay
//! (`common::relay`): loopback has no `tc` without root. Every transfer's bytes are verified.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::relay::Relay;
use common::*;
use gdx_engine::{Access, Agent, Error, Path, Peer, RailInfo, RailState, Region, Status, Transfer};
use std::time::{Duration, Instant};

const LEN: u64 = 64 << 20;

/// A target and an initiator whose peer connection has one rail per `nics` entry (tcp only,
/// one stream per rail, 1 MiB chunks so a share can be seen to the percent).
fn pair(nics: impl Fn(std::net::SocketAddr) -> Vec<String>) -> (Agent, Agent, Peer) {
    let target = agent("target", false);
    let addr = target.listen_addr().unwrap();
    let mut cfg = config("init", false);
    cfg.nics = nics(addr);
    cfg.tcp_streams = 1;
    cfg.chunk_bytes = 1 << 20;
    cfg.io_timeout = Duration::from_secs(5);
    let init = Agent::new(cfg).unwrap();
    let peer = init.connect(addr).unwrap();
    assert_eq!(peer.route().transport, Path::Tcp, "{:?}", peer.route());
    (target, init, peer)
}

/// Writes `src` over `dst` (published as "dst"), verifies the bytes, returns the transfer's rails.
fn write_verified(peer: &Peer, src: &mut Region<'_>, dst: &Region<'_>, seed: u64) -> Vec<RailInfo> {
    fill_pattern(&mut src.bytes_mut().unwrap(), seed);
    let remote = peer.region("dst").unwrap();
    let mut t = Transfer::new();
    t.write(&*src, 0, &remote, 0, LEN);
    let h = peer.submit(t).unwrap();
    let rep = h.wait(WAIT).unwrap();
    assert_eq!(rep.bytes, LEN);
    assert_eq!(
        first_diff(&src.bytes().unwrap(), &dst.bytes().unwrap()),
        None,
        "written bytes differ"
    );
    let rails = h.rails();
    assert_eq!(rails.iter().map(|r| r.bytes).sum::<u64>(), LEN, "{rails:?}");
    rails
}

/// An initiator whose two rails reach the target at `addr` through relays `ra` and `rb`.
fn through(addr: std::net::SocketAddr, ra: &Relay, rb: &Relay) -> (Agent, Peer) {
    let mut cfg = config("init", false);
    cfg.nics = vec![
        format!("127.0.0.1={}", ra.addr()),
        format!("127.0.0.2={}", rb.addr()),
    ];
    cfg.tcp_streams = 1;
    cfg.chunk_bytes = 1 << 20;
    cfg.io_timeout = Duration::from_secs(5);
    cfg.transfer_timeout = Duration::from_secs(60);
    let init = Agent::new(cfg).unwrap();
    let peer = init.connect(addr).unwrap();
    assert_eq!(peer.route().transport, Path::Tcp, "{:?}", peer.route());
    (init, peer)
}

fn regions<'a>(init: &'a Agent, target: &'a Agent) -> (Region<'a>, Region<'a>) {
    let dst = target.alloc(LEN, Access::READ_WRITE, Some("dst")).unwrap();
    let src = init.alloc(LEN, Access::LOCAL, None).unwrap();
    (src, dst)
}

/// Waits (bounded: a rail that never comes back fails the test, not hangs it) until `rail` of
/// `peer` is in `state`.
fn await_state(peer: &Peer, rail: usize, state: RailState) -> RailInfo {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let r = peer.rails()[rail].clone();
        if r.state == state {
            return r;
        }
        assert!(
            Instant::now() < until,
            "rail {rail} never became {state}: {r:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_64_mib_write_uses_both_rails() {
    let (target, init, peer) = pair(|_| vec!["127.0.0.1".into(), "127.0.0.2".into()]);
    let (mut src, dst) = regions(&init, &target);
    let rails = write_verified(&peer, &mut src, &dst, 1);
    assert_eq!(rails.len(), 2);
    assert_eq!(rails[0].local, "127.0.0.1");
    assert_eq!(rails[1].local, "127.0.0.2");
    for r in &rails {
        assert!(r.bytes > 0, "a rail carried nothing: {rails:?}");
        assert_eq!(r.state, RailState::Active);
        assert_eq!(r.cause, None);
    }
    // The plan names the rails.
    let before = peer.rails();
    let remote = peer.region("dst").unwrap();
    let mut t = Transfer::new();
    t.write(&src, 0, &remote, 0, 4096);
    let rep = peer.submit(t).unwrap().wait(WAIT).unwrap();
    let reason = &rep.ops[0].plan.reason;
    assert!(
        reason.contains("127.0.0.1 -> ") && reason.contains("127.0.0.2 -> "),
        "{reason}"
    );
    // A small transfer goes to one rail.
    let rails = peer.rails();
    assert_eq!(rails.iter().map(|r| r.bytes).sum::<u64>(), LEN + 4096);
    assert!(
        rails
            .iter()
            .zip(&before)
            .filter(|(r, b)| r.bytes != b.bytes)
            .count()
            == 1,
        "{before:?} then {rails:?}"
    );
}

#[test]
fn a_slow_rail_gets_the_share_of_its_throughput() {
    let target = agent("target", false);
    let addr = target.listen_addr().unwrap();
    let ra = Relay::start("127.0.0.3", addr);
    let rb = Relay::start("127.0.0.4", addr);
    ra.set_rate(Some(32 << 20));
    rb.set_rate(Some(16 << 20));
    let (init, peer) = through(addr, &ra, &rb);
    let (mut src, dst) = regions(&init, &target);
    // The first transfers measure the rails (the first is split evenly, knowing nothing).
    write_verified(&peer, &mut src, &dst, 1);
    write_verified(&peer, &mut src, &dst, 2);
    let rails = write_verified(&peer, &mut src, &dst, 3);
    let share = rails[1].bytes as f64 / LEN as f64;
    let expected = 16.0 / (32.0 + 16.0);
    assert!(
        (share - expected).abs() <= 0.2 * expected,
        "the slow rail carried {:.1} % of the bytes, expected {:.1} % ± 20 %: {rails:?}",
        share * 100.0,
        expected * 100.0
    );
}

#[test]
fn a_rail_cut_mid_transfer_fails_over_and_comes_back() {
    let t = agent("target", false);
    let addr = t.listen_addr().unwrap();
    let ra = Relay::start("127.0.0.3", addr);
    let rb = Relay::start("127.0.0.4", addr);
    // Slow enough that the cut falls inside the transfer.
    ra.set_rate(Some(32 << 20));
    rb.set_rate(Some(32 << 20));
    let (init, peer) = through(addr, &ra, &rb);
    let (mut src, dst) = regions(&init, &t);
    fill_pattern(&mut src.bytes_mut().unwrap(), 7);
    let remote = peer.region("dst").unwrap();
    let mut tr = Transfer::new();
    tr.write(&src, 0, &remote, 0, LEN).notify("all landed");
    let h = peer.submit(tr).unwrap();
    // Cut once rail 1 has carried something, while the transfer still runs.
    let until = Instant::now() + Duration::from_secs(60);
    while h.rails()[1].bytes == 0 {
        assert!(Instant::now() < until, "rail 1 never carried a byte");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        h.status(),
        Status::Pending,
        "the transfer ended before the cut"
    );
    rb.cut();
    let rep = h.wait(WAIT).unwrap();
    assert_eq!(rep.bytes, LEN);
    assert_eq!(
        first_diff(&src.bytes().unwrap(), &dst.bytes().unwrap()),
        None,
        "written bytes differ"
    );
    // The notification came after every byte landed.
    let n = t.wait_notification(Duration::from_secs(10)).unwrap();
    assert_eq!(n.data, b"all landed");
    let rails = h.rails();
    assert_eq!(rails.iter().map(|r| r.bytes).sum::<u64>(), LEN, "{rails:?}");
    assert!(rails[0].bytes > LEN / 2, "rail 0 took over: {rails:?}");
    let paused = &peer.rails()[1];
    assert_eq!(paused.state, RailState::Paused, "{paused:?}");
    assert!(paused.cause.is_some(), "{paused:?}");
    assert!(paused.errors >= 1, "{paused:?}");

    // Back: the rail is re-probed, becomes active and carries bytes again.
    rb.restore();
    await_state(&peer, 1, RailState::Active);
    let rails = write_verified(&peer, &mut src, &dst, 8);
    assert!(
        rails[1].bytes > 0,
        "the mended rail was not used: {rails:?}"
    );
    assert!(rails[0].bytes > 0, "{rails:?}");
}

#[test]
fn both_rails_cut_fails_naming_both_causes() {
    let t = agent("target", false);
    let addr = t.listen_addr().unwrap();
    let ra = Relay::start("127.0.0.3", addr);
    let rb = Relay::start("127.0.0.4", addr);
    ra.set_rate(Some(16 << 20));
    rb.set_rate(Some(16 << 20));
    let (init, peer) = through(addr, &ra, &rb);
    let (src, _dst) = regions(&init, &t);
    let remote = peer.region("dst").unwrap();
    let mut tr = Transfer::new();
    tr.write(&src, 0, &remote, 0, LEN).notify("must not arrive");
    let h = peer.submit(tr).unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    while h.rails().iter().any(|r| r.bytes == 0) {
        assert!(Instant::now() < until, "a rail never carried a byte");
        std::thread::sleep(Duration::from_millis(5));
    }
    ra.cut();
    rb.cut();
    // Fails (not a wait timeout: the transfer's own end) and names each rail's cause.
    let err = h.wait(WAIT).unwrap_err();
    assert!(!matches!(err, Error::Timeout(_)), "{err}");
    let msg = err.to_string();
    for local in ["127.0.0.1", "127.0.0.2"] {
        assert!(msg.contains(&format!("rail {local} -> ")), "{msg}");
    }
    assert!(!msg.contains(": active"), "a rail without a cause: {msg}");
    assert!(matches!(h.status(), Status::Failed { .. }));
    assert!(h.bytes_done() < LEN);
    for r in peer.rails() {
        assert_eq!(r.state, RailState::Paused, "{r:?}");
        assert!(r.cause.is_some(), "{r:?}");
    }
    assert!(!peer.is_alive());
    assert!(
        t.wait_notification(Duration::from_millis(500)).is_err(),
        "a failed transfer's notification was delivered"
    );
}
