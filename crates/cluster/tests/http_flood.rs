//! The metrics endpoint's table of open connections cannot be aimed at a slow health checker
//! (issue 54): a checker that sends its GET one round trip after connecting got 0 of 8 answers
//! while silent connections kept arriving, because each newcomer shut the oldest down. Now the
//! victim comes from the network and then the address holding the most, ties to the source
//! whose connections keep ending without a request. The flood comes in waves timed by what the
//! server did (its closes), not by the clock; bounded: each wave waits at most 10 s.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use gdx_cluster::metrics::{Health, MetricsServer};
use gdx_engine::Agent;

/// A tcp connection from `src` (any 127/8 address is this host's).
fn connect_from(src: Ipv4Addr, to: SocketAddr) -> TcpStream {
    use rustix::net::{AddressFamily, SocketType};
    let fd = rustix::net::socket(AddressFamily::INET, SocketType::STREAM, None).unwrap();
    rustix::net::bind(&fd, &SocketAddrV4::new(src, 0)).unwrap();
    rustix::net::connect(&fd, &to).unwrap();
    TcpStream::from(fd)
}

/// Whether the server closed `s` (without waiting).
fn closed(s: &mut TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut b = [0u8; 512];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

/// Opens `n` silent connections from 127.0.0.(2 + i % 40), adds them to `held`, and waits until
/// the server took them all in: with at most `cap` open, every connection but `cap` of all
/// ever opened (`opened`) is closed.
fn wave(to: SocketAddr, held: &mut Vec<(TcpStream, bool)>, n: usize, cap: usize) {
    let start = held.len();
    for i in 0..n {
        let src = Ipv4Addr::new(127, 0, 0, 2 + ((start + i) % 40) as u8);
        held.push((connect_from(src, to), false));
    }
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        for (s, c) in held.iter_mut() {
            if !*c {
                *c = closed(s);
            }
        }
        let shut = held.iter().filter(|(_, c)| *c).count();
        // `cap - 1`: the checker holds one slot.
        if shut + cap > held.len() || Instant::now() > until {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_silent_flood_does_not_shut_out_a_slow_health_checker() {
    let agent = Arc::new(Agent::new(agent_config("m")).unwrap());
    let m = MetricsServer::start(
        "127.0.0.1:0".parse().unwrap(),
        Health::agent_only(Arc::clone(&agent)),
    )
    .unwrap();
    let cap = gdx_cluster::metrics::HttpLimits::default().max_connections;
    let mut held = Vec::new();
    wave(m.addr(), &mut held, 200, cap + 1);
    let mut answered = 0;
    for _ in 0..8 {
        let mut c = connect_from(Ipv4Addr::LOCALHOST, m.addr());
        // One round trip of silence, during which 40 more silent connections arrive.
        wave(m.addr(), &mut held, 40, cap);
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = c.write_all(b"GET /health HTTP/1.0\r\n\r\n");
        let mut r = String::new();
        let _ = c.read_to_string(&mut r);
        if r.starts_with("HTTP/1.1 200") {
            answered += 1;
        }
        held.retain(|(_, c)| !c);
    }
    assert_eq!(answered, 8, "health checks answered under the flood");
}
