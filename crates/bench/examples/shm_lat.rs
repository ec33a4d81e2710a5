//! Profiling aid: loops submit + wait of one small write over shm between two agents of this
//! process and prints the p50, p99 and mean round trip (`cargo run --release -p gdx-bench --example shm_lat --
//! [size] [iters] [window] [batch]`; `SHM_LAT_PREPARED=1` posts prepared transfers,
//! `SHM_LAT_TCP=1` runs over tcp).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // an example, not library code

use gdx_base::stats::{median, quantile};
use gdx_engine::{Access, Agent, AgentConfig, Transfer, Transports};
use gdx_sys::timer::Timer;
use std::time::Duration;

fn main() {
    let arg = |i: usize, d: u64| {
        std::env::args()
            .nth(i)
            .and_then(|s| s.parse().ok())
            .unwrap_or(d)
    };
    let (size, iters, window, batch) = (arg(1, 8), arg(2, 200_000), arg(3, 1), arg(4, 1));
    let base = AgentConfig::from_env().unwrap();
    let t = Transports {
        tcp: true,
        shm: true,
        rdma: false,
        fabric: false,
    };
    let server = Agent::new(AgentConfig {
        name: "lat-target".into(),
        listen: Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0))),
        transports: t,
        ..base.clone()
    })
    .unwrap();
    let len = (size * window * batch).max(4096).next_power_of_two();
    let slots = len / size;
    let _r = server.alloc(len, Access::READ_WRITE, Some("r")).unwrap();
    // SHM_LAT_TCP: the same loop over tcp (the client offers no shm).
    let tcp_only = std::env::var_os("SHM_LAT_TCP").is_some();
    let client = Agent::new(AgentConfig {
        name: "lat-client".into(),
        transports: Transports {
            shm: !tcp_only,
            ..t
        },
        ..base
    })
    .unwrap();
    let peer = client
        .connect(server.listen_addr().unwrap().to_string().as_str())
        .unwrap();
    let remote = peer.region("r").unwrap();
    let mut local = client.alloc(len, Access::LOCAL, None).unwrap();
    // Real bytes: an untouched region reads the kernel's one zero page, which is always in
    // cache and would flatter every copy.
    gdx_base::pattern::fill_pattern(&mut local.bytes_mut().unwrap(), 31);
    let mut lat = Vec::with_capacity(iters as usize);
    // The submit (or post) phase of each window alone, to split a round trip's cost.
    let mut sub = Vec::with_capacity(iters as usize);
    let mut block = Vec::with_capacity(1000);
    let blocks = std::env::var_os("SHM_LAT_BLOCKS").is_some();
    let wait = Duration::from_secs(10);
    // SHM_LAT_PREPARED: each rotation position's transfer prepared once and posted again.
    let build = |j: u64| {
        let mut t = Transfer::with_capacity(batch as usize);
        for k in 0..batch {
            // As `gdx bench` does: successive transfers rotate over the region.
            let off = ((j * batch + k) % slots) * size;
            t.write(&local, off, &remote, off, size);
        }
        t
    };
    let positions = (slots / batch).max(1);
    let mut prepared: Vec<_> = if std::env::var_os("SHM_LAT_PREPARED").is_some() {
        (0..positions)
            .map(|j| peer.prepare(build(j)).unwrap())
            .collect()
    } else {
        Vec::new()
    };
    let mut run = Timer::wall();
    let _ = run.start(); // a wall clock cannot fail
    let mut one = Timer::wall();
    for i in 0..iters {
        let _ = one.start();
        let mut hs = Vec::with_capacity(window as usize);
        for w in 0..window {
            let j = i * window + w;
            if prepared.is_empty() {
                hs.push(peer.submit(build(j)).unwrap());
            } else {
                hs.push(prepared[(j % positions) as usize].post().unwrap());
            }
        }
        // Read while running: the time to post the window.
        let posted = one.read().unwrap_or_default().as_secs_f64() * 1e6;
        for h in hs {
            h.wait(wait).unwrap();
        }
        let _ = one.stop();
        let us = one.read().unwrap_or_default().as_secs_f64() * 1e6;
        if blocks {
            block.push(us);
            if block.len() == 1000 {
                eprintln!("block p50 {:.3} µs", median(&block).unwrap_or(f64::NAN));
                block.clear();
            }
        }
        if i >= iters / 10 {
            lat.push(us);
            sub.push(posted);
        }
    }
    let total = run.read().unwrap_or_default().as_secs_f64();
    lat.sort_by(f64::total_cmp);
    sub.sort_by(f64::total_cmp);
    let ops = (iters * window * batch) as f64;
    println!(
        "size {size} window {window} batch {batch}: p50 {:.3} µs (submit {:.3} µs) p99 {:.3} µs, {:.3} Mop/s, {:.2} GB/s",
        quantile(&lat, 0.5).unwrap_or(f64::NAN),
        quantile(&sub, 0.5).unwrap_or(f64::NAN),
        quantile(&lat, 0.99).unwrap_or(f64::NAN),
        ops / total / 1e6,
        ops * size as f64 / total / 1e9
    );
}
