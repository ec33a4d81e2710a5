//! Admission that a flood cannot aim (issue 54): connections that sent their `Hello` from 40
//! source addresses (127.0.0.2–41, about 150 a second) used to evict the oldest pending
//! connection, which was the legitimate client one round trip away: 0 of 10 logins. Now the
//! victim comes from the source holding the most, ties to the one whose connections keep ending
//! without authenticating, so the slow client's logins all go through. The flood comes in waves
//! timed by the agent's eviction count, not by the clock (the box may be loaded); bounded: each
//! wave waits at most 20 s for its evictions, each login has the 5 s handshake deadline.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::raw::{hmac, pake_start, read_msg, send};
use common::shm_raw::addr;
use common::*;
use gdx_engine::wire::{Hello, Msg};
use gdx_engine::Agent;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::sync::atomic::Ordering;

/// A tcp connection from `src` (any 127/8 address is this host's).
fn connect_from(src: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    use rustix::net::{AddressFamily, SocketType};
    let fd = rustix::net::socket(AddressFamily::INET, SocketType::STREAM, None)?;
    rustix::net::bind(&fd, &SocketAddrV4::new(src, 0))?;
    rustix::net::connect(&fd, &to)?;
    Ok(TcpStream::from(fd))
}

/// A connection from `src` that sent a `Hello` in `name` and nothing more.
fn hello_from(src: Ipv4Addr, to: SocketAddr, name: &str) -> Option<TcpStream> {
    let mut s = connect_from(src, to).ok()?;
    send(
        &mut s,
        &Msg::Hello(Hello {
            agent_name: name.into(),
            nonce: 1,
            ..Hello::default()
        }),
    );
    Some(s)
}

/// One flooding connection from 127.0.0.(2 + i % 40): its `Hello` sent, then held.
fn flood_one(to: SocketAddr, i: usize) -> Option<TcpStream> {
    hello_from(Ipv4Addr::new(127, 0, 0, 2 + (i % 40) as u8), to, "flood")
}

/// Waits until the agent has taken every connection of `wave` in: each was answered `Pake`
/// or closed (evicted); at most 5 s per connection.
fn admitted(wave: &mut [TcpStream]) {
    for s in wave {
        let _ = read_msg(s);
    }
}

/// A login by a client one round trip away, made by hand: while it waits to answer the
/// acceptor's `Pake`, `during` runs (the flood's next wave). True when the acceptor's `Hello`
/// came back.
fn slow_login(to: SocketAddr, during: impl FnOnce()) -> bool {
    let Ok(mut c) = connect_from(Ipv4Addr::new(127, 0, 0, 1), to) else {
        return false;
    };
    let (cn, id) = (77u128, 5u128);
    send(
        &mut c,
        &Msg::Hello(Hello {
            agent_name: "slow".into(),
            agent_id: id,
            nonce: cn,
            ..Hello::default()
        }),
    );
    let Some(Msg::Pake { nonce: sn, msg }) = read_msg(&mut c) else {
        return false;
    };
    during();
    let (st, mine) = pake_start(shared_secret().as_bytes());
    let k: [u8; 32] = st.finish(&msg).unwrap().try_into().unwrap();
    let t = [&id.to_le_bytes()[..], &cn.to_le_bytes(), &sn.to_le_bytes()];
    let _ = std::io::Write::write_all(
        &mut c,
        &gdx_engine::wire::encode(
            &Msg::PakeAuth {
                msg: mine,
                mac: hmac(&k, "gdx/7 control initiator", &t),
            },
            0,
        ),
    );
    matches!(read_msg(&mut c), Some(Msg::Hello(_)))
}

/// Ten slow logins from 127.0.0.1, each while a wave of 40 flooding connections arrives:
/// how many went through, and how many pending connections the agent evicted.
fn logins_under_a_flood(target: &Agent) -> (usize, u64) {
    let to = addr(target);
    let hits = target.limit_hits();
    let before = hits.evictions.load(Ordering::Relaxed);
    // The flood fills the pending table of the loopback network (one network: 127/8).
    let mut held: Vec<TcpStream> = (0..200).filter_map(|i| flood_one(to, i)).collect();
    admitted(&mut held);
    let mut ok = 0;
    for round in 0..10 {
        // While the client waits one round trip, 40 more flooding connections arrive, each
        // evicting one pending connection once the table is full: by age, the client's
        // would be among them (it is older than all of this wave).
        let logged_in = slow_login(to, || {
            let mut wave: Vec<TcpStream> = (0..40)
                .filter_map(|i| flood_one(to, 200 + round * 40 + i))
                .collect();
            admitted(&mut wave);
            held = wave;
        });
        if logged_in {
            ok += 1;
        }
    }
    drop(held);
    (ok, hits.evictions.load(Ordering::Relaxed) - before)
}

#[test]
fn a_flood_from_40_addresses_does_not_evict_a_slow_legitimate_login() {
    let target: Agent = agent("target", false);
    let (ok, evicted) = logins_under_a_flood(&target);
    // Each wave of 40 overfills a table of 16 by at least 24.
    assert!(evicted >= 240, "the flood evicted only {evicted}");
    assert_eq!(ok, 10, "logins under the flood ({evicted} evictions)");
}

/// The client's own address left more unfinished handshakes than any flooding address (a
/// client that crashed mid-handshake, or one the flood already evicted): by the failure record
/// alone it would be shed first among equals, every time. It proved the secret before, and an
/// address that did goes last among equals.
#[test]
fn a_client_that_proved_the_secret_survives_the_flood_after_failing_handshakes() {
    let target: Agent = agent("target", false);
    let to = addr(&target);
    assert!(slow_login(to, || {}), "the first login, with no flood");
    for _ in 0..30 {
        let mut s = hello_from(Ipv4Addr::LOCALHOST, to, "slow").unwrap();
        // Answered (`Pake`), then abandoned: a handshake that ends unfinished.
        assert!(matches!(read_msg(&mut s), Some(Msg::Pake { .. })));
    }
    let (ok, evicted) = logins_under_a_flood(&target);
    assert!(evicted >= 240, "the flood evicted only {evicted}");
    assert_eq!(ok, 10, "logins under the flood ({evicted} evictions)");
}
