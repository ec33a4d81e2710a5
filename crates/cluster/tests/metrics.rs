//! `/metrics` counts exactly what a test moved; `/health` flips to 503 when the lease is lost
//! and back to 200 after re-registration.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::*;
use gdx_cluster::metrics::MetricsServer;
use gdx_engine::{Access, Transfer};

/// GET `path` over plain HTTP/1.0; returns the status code and the body.
fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect metrics");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").expect("request");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("response");
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status code");
    let body = out.split_once("\r\n\r\n").map(|x| x.1).unwrap_or_default();
    (code, body.to_string())
}

type Samples = Vec<(String, BTreeMap<String, String>, f64)>;

/// The samples of a Prometheus text body: (name, labels, value).
fn parse(text: &str) -> Samples {
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').expect("sample line");
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => {
                let mut m = BTreeMap::new();
                for kv in rest
                    .trim_end_matches('}')
                    .split(',')
                    .filter(|s| !s.is_empty())
                {
                    let (k, v) = kv
                        .split_once('=')
                        .unwrap_or_else(|| panic!("label {kv:?} in {line:?}"));
                    m.insert(k.to_string(), v.trim_matches('"').to_string());
                }
                (n.to_string(), m)
            }
            None => (series.to_string(), BTreeMap::new()),
        };
        out.push((name, labels, value.parse().expect("value")));
    }
    out
}

fn sum(s: &Samples, name: &str, label: (&str, &str)) -> f64 {
    s.iter()
        .filter(|(n, l, _)| n == name && l.get(label.0).map(String::as_str) == Some(label.1))
        .map(|x| x.2)
        .sum()
}

fn one(s: &Samples, name: &str) -> f64 {
    s.iter()
        .find(|(n, _, _)| n == name)
        .unwrap_or_else(|| panic!("no {name}"))
        .2
}

#[test]
fn metrics_equal_what_moved_and_health_follows_the_lease() {
    let mut etcd = etcd();
    let url = etcd.url();
    let (a, kv) = join_with_kv(&url, "m", 2, 4 << 20);
    let b = join(&url, "m", "b", 2);
    let m = MetricsServer::start("127.0.0.1:0".parse().expect("addr"), b.health()).expect("serve");
    // The target's endpoint: what peers moved into and out of a's regions.
    let ma = MetricsServer::start("127.0.0.1:0".parse().expect("addr"), a.health()).expect("serve");

    let (code, body) = get(m.addr(), "/health");
    assert_eq!(code, 200, "{body}");
    let (code, text) = get(m.addr(), "/metrics");
    assert_eq!(code, 200, "{text}");
    let before = parse(&text);
    assert_eq!(sum(&before, "gdx_bytes_total", ("direction", "write")), 0.0);

    let pa = b.connect_named("a").expect("connect");
    let remote = pa.region("kv").expect("region");
    let (src, data) = filled_source(&b, 4 << 20, 9);
    // Three transfers: one op of 1 MiB, two ops (4 KiB + 2 MiB), and a 2 MiB read back.
    let mut t = Transfer::new();
    t.write(&src, 0, &remote, 0, 1 << 20);
    complete(&pa, t, "t1");
    let mut t = Transfer::new();
    t.write(&src, 1 << 20, &remote, 1 << 20, 4096).write(
        &src,
        (1 << 20) + 4096,
        &remote,
        (1 << 20) + 4096,
        2 << 20,
    );
    complete(&pa, t, "t2");
    let back = b.agent().alloc(2 << 20, Access::LOCAL, None).expect("back");
    let mut t = Transfer::new();
    t.read(&back, 0, &remote, 0, 2 << 20);
    complete(&pa, t, "t3");
    let written = (1u64 << 20) + 4096 + (2 << 20);
    assert_eq!(
        &kv.bytes().expect("bytes")[..written as usize],
        &data[..written as usize]
    );
    assert_eq!(&back.bytes().expect("bytes")[..], &data[..2 << 20]);

    let (code, text) = get(m.addr(), "/metrics");
    assert_eq!(code, 200);
    let s = parse(&text);
    assert_eq!(
        sum(&s, "gdx_bytes_total", ("direction", "write")),
        written as f64,
        "{text}"
    );
    assert_eq!(
        sum(&s, "gdx_bytes_total", ("direction", "read")),
        (2u64 << 20) as f64
    );
    assert_eq!(sum(&s, "gdx_ops_total", ("direction", "write")), 3.0);
    // The target counts exactly what b moved, under b's name.
    let (code, ta) = get(ma.addr(), "/metrics");
    assert_eq!(code, 200);
    let t = parse(&ta);
    let by_b: Samples = t
        .iter()
        .filter(|(_, l, _)| l.get("peer").map(String::as_str) == Some("b"))
        .cloned()
        .collect();
    assert_eq!(
        sum(&by_b, "gdx_served_bytes_total", ("direction", "write")),
        written as f64,
        "{ta}"
    );
    assert_eq!(
        sum(&by_b, "gdx_served_bytes_total", ("direction", "read")),
        (2u64 << 20) as f64,
        "{ta}"
    );
    assert!(sum(&by_b, "gdx_served_ops_total", ("direction", "write")) >= 3.0);
    assert_eq!(sum(&s, "gdx_ops_total", ("direction", "read")), 1.0);
    assert_eq!(
        sum(&s, "gdx_transfers_total", ("outcome", "completed")),
        3.0
    );
    assert_eq!(sum(&s, "gdx_transfers_total", ("outcome", "failed")), 0.0);
    assert_eq!(one(&s, "gdx_transfer_duration_seconds_count"), 3.0);
    assert_eq!(
        sum(&s, "gdx_peers_connected", ("direction", "outbound")),
        1.0
    );
    assert_eq!(one(&s, "gdx_lease_registered"), 1.0);
    // The path label names the path the engine reported for the ops.
    let path = pa.peer().route().transport.to_string();
    assert_eq!(
        sum(&s, "gdx_bytes_total", ("path", &path)),
        (written + (2 << 20)) as f64,
        "{text}"
    );

    etcd.kill();
    wait_for("/health to say 503", Duration::from_secs(60), || {
        get(m.addr(), "/health").0 == 503
    });
    assert_eq!(
        one(&parse(&get(m.addr(), "/metrics").1), "gdx_lease_registered"),
        0.0
    );
    etcd.restart().expect("restart");
    wait_for("/health back to 200", Duration::from_secs(60), || {
        get(m.addr(), "/health").0 == 200
    });
    assert_eq!(get(m.addr(), "/nope").0, 404);
}

/// Per-rail bytes, errors and state of an outbound connection over two loopback rails.
#[test]
fn metrics_show_each_rail() {
    use gdx_engine::{Agent, AgentConfig, Transports};
    let tcp_only = |name: &str| AgentConfig {
        name: name.into(),
        transports: Transports {
            tcp: true,
            shm: false,
            rdma: false,
            fabric: false,
        },
        tcp_streams: 1,
        chunk_bytes: 1 << 20,
        ..AgentConfig::default()
    };
    let target = Agent::new(tcp_only("t")).expect("target");
    let dst = target
        .alloc(8 << 20, Access::READ_WRITE, Some("dst"))
        .expect("dst");
    let mut cfg = tcp_only("i");
    cfg.nics = vec!["127.0.0.1".into(), "127.0.0.2".into()];
    let init = std::sync::Arc::new(Agent::new(cfg).expect("init"));
    let peer = init
        .connect(target.listen_addr().expect("listen"))
        .expect("connect");
    let mut src = init.alloc(8 << 20, Access::LOCAL, None).expect("src");
    for (i, b) in src.bytes_mut().expect("bytes").iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let remote = peer.region("dst").expect("region");
    let mut t = Transfer::new();
    t.write(&src, 0, &remote, 0, 8 << 20);
    peer.submit(t)
        .expect("submit")
        .wait(Duration::from_secs(60))
        .expect("write");
    assert_eq!(
        dst.bytes().expect("bytes")[..],
        src.bytes().expect("bytes")[..]
    );
    let m = MetricsServer::start(
        "127.0.0.1:0".parse().expect("addr"),
        gdx_cluster::metrics::Health::agent_only(std::sync::Arc::clone(&init)),
    )
    .expect("serve");
    let (code, text) = get(m.addr(), "/metrics");
    assert_eq!(code, 200);
    let s = parse(&text);
    for local in ["127.0.0.1", "127.0.0.2"] {
        let bytes = sum(&s, "gdx_rail_bytes_total", ("local", local));
        assert!(bytes > 0.0, "rail {local} carried nothing: {text}");
        assert_eq!(sum(&s, "gdx_rail_active", ("local", local)), 1.0, "{text}");
        assert_eq!(sum(&s, "gdx_rail_errors_total", ("local", local)), 0.0);
    }
    assert_eq!(
        sum(&s, "gdx_rail_bytes_total", ("peer", "t")),
        (8u64 << 20) as f64,
        "{text}"
    );
}
