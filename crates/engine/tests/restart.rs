//! A peer that restarts on the same address (issue 54; the peers' users' most repeated bug:
//! Mooncake #3188, #3584, #3755, NIXL #1983): the transfer in flight to the old agent fails
//! with `PeerLost`, the old `Peer` stays failed, a connect that expects the old instance is
//! refused naming the new one, and a plain connect reaches the new agent, whose bytes are
//! verified. Over tcp (the transfer in flight slowed by a relay, so the restart always comes
//! mid-transfer) and shm. Bounded: every wait has a deadline.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::relay::Relay;
use common::*;
use gdx_engine::{Access, Agent, AgentConfig, Error, Expected, Path, Region, Status, Transfer};
use std::net::SocketAddr;
use std::time::Duration;

/// A target named "target" listening on `at` (port 0: any) with a 4 MiB region "kv" of
/// `fill`. The old agent's accept thread lets go of the port just after the agent is dropped,
/// as a restarted process waits for its predecessor's: the bind is retried for up to 10 s.
fn target_at(at: SocketAddr, shm: bool, fill: u8) -> (Agent, Region<'static>) {
    let until = std::time::Instant::now() + Duration::from_secs(10);
    let t = loop {
        match Agent::new(AgentConfig {
            listen: Some(at),
            ..config("target", shm)
        }) {
            Ok(t) => break t,
            Err(e) if std::time::Instant::now() < until && e.to_string().contains("in use") => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("listening on {at}: {e}"),
        }
    };
    let mut r = t.alloc(4 << 20, Access::READ_WRITE, Some("kv")).unwrap();
    r.bytes_mut().unwrap().fill(fill);
    (t, r)
}

fn restart(shm: bool) {
    let (t1, _r1) = target_at("127.0.0.1:0".parse().unwrap(), shm, 1);
    let at = t1.listen_addr().unwrap();
    let old_id = t1.id();
    // Over tcp the client goes through a relay at 1 MiB/s: a 4 MiB write is surely in flight
    // when the target goes away.
    let relay = (!shm).then(|| Relay::start("127.0.0.5", at));
    let via = relay.as_ref().map_or(at, Relay::addr);
    let me = Agent::new(AgentConfig {
        io_timeout: Duration::from_secs(5),
        ..config("me", shm)
    })
    .unwrap();
    let peer = me.connect(via).unwrap();
    assert_eq!(
        peer.route().transport,
        if shm { Path::Shm } else { Path::Tcp },
        "{}",
        peer.route().reason
    );
    let remote = peer.region("kv").unwrap();
    let src = me.alloc(4 << 20, Access::LOCAL, None).unwrap();
    if let Some(r) = &relay {
        r.set_rate(Some(1 << 20));
    }
    let mut t = Transfer::new();
    t.write(&src, 0, &remote, 0, 4 << 20);
    let h = peer.submit(t).unwrap();
    // The restart: the old agent goes (its connections shut down), a new one listens on the
    // same address.
    drop(t1);
    drop(_r1);
    let (t2, r2) = target_at(at, shm, 2);
    assert_ne!(t2.id(), old_id);
    // Over shm the 4 MiB write may have finished before the restart; over tcp it cannot have.
    match h.wait(Duration::from_secs(20)) {
        Err(Error::PeerLost { reason: why, .. }) => assert!(!why.is_empty()),
        Ok(_) if shm => {}
        other => panic!("the transfer in flight to the restarted peer: {other:?}"),
    }
    if !shm {
        assert!(matches!(
            h.status(),
            Status::Failed {
                reason: Error::PeerLost { .. }
            }
        ));
    }
    // The old peer stays failed: a new transfer on it is PeerLost, never a silent success
    // against the new agent.
    let mut t = Transfer::new();
    t.write(&src, 0, &remote, 0, 4096);
    let again = peer.submit(t).and_then(|h| h.wait(Duration::from_secs(20)));
    assert!(
        matches!(again, Err(Error::PeerLost { .. })),
        "a transfer on the old peer after the restart: {again:?}"
    );
    if let Some(r) = &relay {
        r.set_rate(None);
    }
    // The restart is detected: the old instance is asked for, the new one answers.
    let expect = Expected {
        name: "target".into(),
        agent_id: Some(old_id),
        cluster: None,
    };
    match me.connect_expecting(via, &expect) {
        Err(Error::AuthFailed { why, .. }) => {
            assert!(why.contains(&format!("{:032x}", t2.id())), "{why}");
            assert!(why.contains(&format!("{old_id:032x}")), "{why}");
        }
        other => panic!("a connect expecting the old instance: {:?}", other.err()),
    }
    // A plain connect reaches the new agent, and its bytes move.
    let peer2 = me.connect(via).unwrap();
    assert_eq!(peer2.info().agent_id, t2.id());
    let remote2 = peer2.region("kv").unwrap();
    assert_ne!(
        remote2.key, remote.key,
        "the old region key must not open the new region"
    );
    let mut src2 = me.alloc(4096, Access::LOCAL, None).unwrap();
    src2.bytes_mut().unwrap().fill(0x5A);
    let mut t = Transfer::new();
    t.write(&src2, 0, &remote2, 0, 4096);
    peer2
        .submit(t)
        .unwrap()
        .wait(Duration::from_secs(20))
        .unwrap();
    let b = r2.bytes().unwrap();
    assert!(b[..4096].iter().all(|&x| x == 0x5A));
    assert!(b[4096..].iter().all(|&x| x == 2));
}

#[test]
fn a_peer_restarted_on_the_same_address_over_tcp() {
    restart(false);
}

#[test]
fn a_peer_restarted_on_the_same_address_over_shm() {
    restart(true);
}
