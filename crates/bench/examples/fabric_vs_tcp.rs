//! The fabric transport over libfabric's tcp provider (loopback) against gdx's own tcp
//! transport, in one run, to a server in another process; and the 8-byte latency of both
//! against a raw TCP ping-pong (the loopback floor).
//!
//! ```text
//! cargo run --release -p gdx-bench --example fabric_vs_tcp -- [SIZE_BYTES] [ITERS] [LAT_ITERS]
//! ```
//! GB/s = 1e9 B/s; bandwidth = median (best) of ITERS timed writes after one warm-up, bytes
//! checked once per path by reading them back; latency = p50 (p99) of LAT_ITERS submit+wait
//! of one 8-byte write. A benchmark, not a test: nothing here asserts a time.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // an example, not library code

mod common;

use gdx_base::clock::wall;
use gdx_engine::{Access, Agent, AgentConfig, Error, Path, Transfer, Transports};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

fn transports(fabric: bool) -> Transports {
    Transports {
        tcp: true,
        shm: false,
        rdma: false,
        fabric,
    }
}

/// The `q`-quantile of the samples in seconds (gdx-base's one quantile).
fn pct(v: &[Duration], q: f64) -> f64 {
    gdx_base::stats::quantile(&gdx_base::stats::sorted_secs(v), q).unwrap_or(f64::NAN)
}

fn serve(size: u64) -> Result<(), Error> {
    let agent = Agent::new(AgentConfig {
        name: "fabric-bench-server".into(),
        transports: transports(true),
        ..AgentConfig::from_env()?
    })?;
    let _r = agent.alloc(size, Access::READ_WRITE, Some("b"))?;
    println!("{}", agent.listen_addr().expect("listening"));
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    Ok(())
}

fn raw_tcp_pingpong(iters: usize) -> Vec<Duration> {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let a = l.local_addr().expect("addr");
    let echo = std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        s.set_nodelay(true).expect("nodelay");
        let mut b = [0u8; 8];
        while s.read_exact(&mut b).is_ok() {
            if s.write_all(&b).is_err() {
                break;
            }
        }
    });
    let mut c = TcpStream::connect(a).expect("connect");
    c.set_nodelay(true).expect("nodelay");
    let mut b = [7u8; 8];
    let mut v = Vec::with_capacity(iters);
    for _ in 0..iters {
        let ((), d) = wall(|| {
            c.write_all(&b).expect("write");
            c.read_exact(&mut b).expect("read");
        });
        v.push(d);
    }
    drop(c);
    let _ = echo.join();
    v
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("serve") {
        return serve(args[2].parse().unwrap_or(1 << 30));
    }
    let size: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1 << 30);
    let iters: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(3);
    let lat_iters: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(2000);
    let (mut child, addr) = common::spawn_server(size, None)?;
    let addr: std::net::SocketAddr = addr.parse().expect("server address");
    println!("size {size} B, {iters} timed writes after 1 warm-up; 8 B latency over {lat_iters} ops; GB/s = 1e9 B/s");
    println!(
        "{:<28} {:>14} {:>14} {:>12} {:>12}",
        "case", "GB/s median", "GB/s best", "8 B p50", "8 B p99"
    );
    for fabric in [true, false] {
        let agent = Agent::new(AgentConfig {
            name: "fabric-bench-client".into(),
            transports: transports(fabric),
            ..AgentConfig::from_env()?
        })?;
        let peer = agent.connect(addr)?;
        let want = if fabric { Path::Fabric } else { Path::Tcp };
        assert_eq!(peer.route().transport, want, "{}", peer.route().reason);
        let remote = peer.region("b")?;
        let mut src = agent.alloc(size, Access::LOCAL, None)?;
        gdx_base::pattern::fill_pattern(&mut src.bytes_mut().expect("host"), 31);
        let mut times = Vec::new();
        for k in 0..=iters {
            let mut t = Transfer::new();
            t.write(&src, 0, &remote, 0, size);
            let (rep, d) = wall(|| peer.submit(t)?.wait(Duration::from_secs(600)));
            let rep = rep?;
            if k > 0 {
                times.push(d);
            }
            assert_eq!(rep.ops[0].plan.path, want);
        }
        // Bytes checked once, untimed: read them back and compare.
        let back = agent.alloc(size, Access::LOCAL, None)?;
        let mut t = Transfer::new();
        t.read(&back, 0, &remote, 0, size);
        peer.submit(t)?.wait(Duration::from_secs(600))?;
        assert!(
            back.bytes().expect("host")[..] == src.bytes().expect("host")[..],
            "bytes differ"
        );
        drop(back);
        let mut lat = Vec::with_capacity(lat_iters);
        for _ in 0..lat_iters {
            let mut t = Transfer::new();
            t.write(&src, 0, &remote, 0, 8);
            let (done, d) = wall(|| peer.submit(t)?.wait(Duration::from_secs(60)));
            done?;
            lat.push(d);
        }
        let gb = |secs: f64| size as f64 / secs / 1e9;
        let name = if fabric {
            "gdx fabric (tcp provider)"
        } else {
            "gdx tcp transport"
        };
        println!(
            "{:<28} {:>14.2} {:>14.2} {:>9.1} µs {:>9.1} µs",
            name,
            gb(pct(&times, 0.5)),
            gb(pct(&times, 0.0)),
            pct(&lat, 0.5) * 1e6,
            pct(&lat, 0.99) * 1e6
        );
        if fabric {
            println!("  route: {}", peer.route().reason);
        }
    }
    let raw = raw_tcp_pingpong(lat_iters.max(10_000));
    println!(
        "{:<28} {:>14} {:>14} {:>9.1} µs {:>9.1} µs",
        "raw TCP ping-pong (8 B)",
        "-",
        "-",
        pct(&raw, 0.5) * 1e6,
        pct(&raw, 0.99) * 1e6
    );
    drop(child.stdin.take());
    let _ = child.wait();
    Ok(())
}
