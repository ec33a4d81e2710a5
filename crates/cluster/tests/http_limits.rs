//! The metrics endpoint cannot be stalled or bloated by an unauthenticated client (issue 42
//! rows 3 and 4): a client pipelining GETs without reading stalls only itself, `/health`
//! answers meanwhile; a 64 MiB header line and millions of header lines cost a few KiB and
//! get 431; half-sent requests do not pile up threads; only GET and HEAD are served.
//! Memory is measured on this process, so these tests live in their own binary.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use gdx_cluster::metrics::{Health, MetricsServer};
use gdx_engine::Agent;

fn server() -> (MetricsServer, Arc<Agent>) {
    let agent = Arc::new(Agent::new(agent_config("m")).unwrap());
    let m = MetricsServer::start(
        "127.0.0.1:0".parse().unwrap(),
        Health::agent_only(Arc::clone(&agent)),
    )
    .unwrap();
    (m, agent)
}

/// One request, the whole response.
fn ask(addr: SocketAddr, req: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

fn status_kb(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

#[test]
fn health_answers_while_a_client_stalls_metrics_and_others_half_send() {
    let (m, _agent) = server();
    // A client pipelines 2,000 GET /metrics and never reads.
    let mut stall = TcpStream::connect(m.addr()).unwrap();
    stall.set_nonblocking(true).unwrap();
    let req = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".repeat(2000);
    let _ = stall.write(req.as_bytes());
    // 600 half-sent requests.
    let before = threads();
    let half: Vec<TcpStream> = (0..600)
        .map(|_| {
            let mut s = TcpStream::connect(m.addr()).unwrap();
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost:").unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    let r = ask(m.addr(), "GET /health HTTP/1.0\r\n\r\n");
    let took = t0.elapsed();
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(r.contains("\"status\":\"ok\""), "{r}");
    assert!(took < Duration::from_secs(1), "/health took {took:?}");
    let grown = threads().saturating_sub(before);
    assert!(grown <= 40, "{grown} threads for 600 half-sent requests");
    drop(half);
    drop(stall);
}

#[test]
fn a_64_mib_header_costs_little_and_gets_431() {
    let (m, _agent) = server();
    let rss0 = status_kb("VmRSS:");
    let mut s = TcpStream::connect(m.addr()).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nX-Big: ").unwrap();
    let chunk = vec![b'a'; 1 << 20];
    let mut sent = 0usize;
    for _ in 0..64 {
        match s.write_all(&chunk) {
            Ok(()) => sent += chunk.len(),
            Err(_) => break, // the server answered and closed: the rest is never read
        }
    }
    let grown_mib = status_kb("VmRSS:").saturating_sub(rss0) / 1024;
    assert!(
        grown_mib < 16,
        "a {} MiB header grew the process by {grown_mib} MiB",
        sent >> 20
    );
    assert!(sent < 64 << 20, "the server read the whole 64 MiB header");
    // A thousand short header lines (two million once cost 222 MiB): refused at the cap.
    let r = ask(
        m.addr(),
        &format!("GET /metrics HTTP/1.1\r\n{}", "a: b\r\n".repeat(1000)),
    );
    assert!(r.starts_with("HTTP/1.1 431"), "{r}");
    // The endpoint still serves.
    assert!(ask(m.addr(), "GET /health HTTP/1.0\r\n\r\n").starts_with("HTTP/1.1 200"));
}

#[test]
fn only_get_and_head_are_served() {
    let (m, _agent) = server();
    for method in ["POST", "PUT", "DELETE", "OPTIONS"] {
        let r = ask(
            m.addr(),
            &format!("{method} /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n"),
        );
        assert!(r.starts_with("HTTP/1.1 405"), "{method}: {r}");
        assert!(r.contains("Allow: GET, HEAD"), "{method}: {r}");
    }
    let r = ask(m.addr(), "HEAD /health HTTP/1.1\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(r.ends_with("\r\n\r\n"), "HEAD carried a body: {r}");
    let r = ask(m.addr(), "GET /metrics HTTP/1.1\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(r.contains("gdx_limit_hits_total"), "{r}");
    assert!(
        r.contains("gdx_metrics_requests_refused_total{why=\"refused\"} 4"),
        "{r}"
    );
}
