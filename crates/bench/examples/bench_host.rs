//! Host→host throughput: memcpy baseline, tcp over loopback, shm between two processes (one copy into
//! an agent-allocated region, and two copies through the bounce buffer into a borrowed region).
//!
//! ```text
//! cargo run --release -p gdx-bench --example bench_host -- [SIZE_BYTES] [ITERS]
//! ```
//! Spawns its own server process (this binary with `serve`). GB/s = 1e9 bytes/s. Prints the median
//! and best of ITERS timed transfers after one warm-up. `GDX_TCP_STREAMS`, `GDX_CHUNK_BYTES` apply.
//! Both processes hold one secret, written (mode 600) for the child.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // an example, not library code

mod common;

use gdx_base::clock::wall;
use gdx_engine::{Access, Agent, AgentConfig, Error, Path, Secret, Transfer, Transports};
use std::io::Read;
use std::time::Duration;

/// Median and best rate of the samples (the median is gdx-base's one median).
fn stats(bytes: u64, v: Vec<Duration>) -> (f64, f64) {
    let s = gdx_base::stats::sorted_secs(&v);
    let rate = |sec: f64| bytes as f64 / sec / 1e9;
    (
        gdx_base::stats::quantile(&s, 0.5).map_or(f64::NAN, rate),
        s.first().copied().map_or(f64::NAN, rate),
    )
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("serve") {
        return serve(args[2].parse().unwrap_or(1 << 30));
    }
    let size: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1 << 30);
    let iters: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(5);
    let secret = Secret::generate()?;
    let file = std::env::temp_dir().join(format!("gdx-bench-host-{}.secret", std::process::id()));
    secret.write_file(&file)?;
    let (mut child, addr) = common::spawn_server(size, Some(&file))?;

    println!(
        "size {} bytes ({:.2} GiB), {iters} timed runs after 1 warm-up; GB/s = 1e9 B/s",
        size,
        size as f64 / (1u64 << 30) as f64
    );
    println!("{:<34} {:>10} {:>10}", "case", "median", "best");

    // Baseline: plain single-threaded memcpy between two pre-faulted buffers.
    let src = vec![1u8; size as usize];
    let mut dst = vec![0u8; size as usize];
    dst.copy_from_slice(&src);
    let mut times = Vec::new();
    for _ in 0..iters {
        let ((), d) = wall(|| {
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
        });
        times.push(d);
    }
    drop((src, dst));
    let (memcpy_med, memcpy_best) = stats(size, times);
    println!(
        "{:<34} {:>10.2} {:>10.2}",
        "memcpy (1 thread)", memcpy_med, memcpy_best
    );

    for shm in [false, true] {
        let cfg = AgentConfig {
            name: "bench-client".into(),
            transports: Transports {
                tcp: true,
                shm,
                rdma: true,
                fabric: false,
            },
            secret: Some(secret.clone()),
            ..AgentConfig::from_env()?
        };
        let agent = Agent::new(cfg)?;
        let peer = agent.connect(addr.as_str())?;
        let mut local = agent.alloc(size, Access::LOCAL, None)?;
        local.bytes_mut()?.fill(7);
        for region in ["owned", "borrowed"] {
            let remote = peer.region(region)?;
            for write in [true, false] {
                let mut times = Vec::new();
                let mut path = Path::Tcp;
                for i in 0..=iters {
                    let mut t = Transfer::new();
                    if write {
                        t.write(&local, 0, &remote, 0, size);
                    } else {
                        t.read(&local, 0, &remote, 0, size);
                    }
                    let (rep, d) = wall(|| peer.submit(t)?.wait(Duration::from_secs(300)));
                    let rep = rep?;
                    if i > 0 {
                        times.push(d);
                    }
                    path = rep.ops[0].plan.path;
                }
                let (med, best) = stats(size, times);
                let case = format!(
                    "{path} {} {region} region",
                    if write { "write to" } else { "read from" }
                );
                let ratio = if path == Path::Tcp {
                    String::new()
                } else {
                    format!("  ({:.2}x memcpy)", med / memcpy_med)
                };
                println!("{case:<34} {med:>10.2} {best:>10.2}{ratio}");
            }
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(&file);
    Ok(())
}

fn serve(size: u64) -> Result<(), Error> {
    let agent = Agent::new(AgentConfig {
        name: "bench-server".into(),
        ..AgentConfig::from_env()?
    })?;
    let _owned = agent.alloc(size, Access::READ_WRITE, Some("owned"))?;
    let mut buf = vec![3u8; size as usize];
    agent.scope(|s| -> Result<(), Error> {
        let _borrowed = s.register(&mut buf, Access::READ_WRITE, Some("borrowed"))?;
        println!("{}", agent.listen_addr().expect("listening"));
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        Ok(())
    })
}
