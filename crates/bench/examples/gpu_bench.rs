//! The gdx side of the `engine` stage of `scripts/device/run.sh`: GPU0→GPU1 p2p at 8 MiB / 64 MiB /
//! 1 GiB, both directions at once, ipc across two processes, staged (forced, chunk size tuned
//! first), pool memory with access granted, and the 8-byte copy latency. One JSON object per
//! line on stdout: `{"key": ..., "value": ..., "unit": ...}`; GB/s = 1e9 B/s; bandwidths are the
//! best of 3 timed batches of back-to-back copies (wall clock, after a warm-up), each copy
//! through the public API (`LocalPeer::transfer`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // an example, not library code

use gdx_base::clock::wall;
use std::io::{BufRead, Write};

use gdx_engine::{Calibration, DeviceRegion, LocalPeer, Mem, Path, Policy};

fn emit(key: &str, value: f64, unit: &str, note: &str) {
    println!(r#"{{"key":"{key}","value":{value:.3},"unit":"{unit}","note":"{note}"}}"#);
    std::io::stdout().flush().ok();
}

/// Best-of-3 GB/s of `reps` back-to-back copies per batch; pairs copy concurrently.
fn bandwidth(
    peer: &LocalPeer,
    pairs: &[(&DeviceRegion, &DeviceRegion)],
    len: u64,
    reps: u32,
) -> (f64, String) {
    let mut plan = String::new();
    for &(d, s) in pairs {
        plan = peer
            .transfer(d, 0, s, 0, len)
            .unwrap()
            .wait()
            .unwrap()
            .to_string();
    }
    let mut best = f64::MAX;
    for _ in 0..3 {
        let ((), d) = wall(|| {
            let mut last = Vec::new();
            for i in 0..reps {
                for &(d, s) in pairs {
                    let tr = peer.transfer(d, 0, s, 0, len).unwrap();
                    if i + 1 == reps {
                        last.push(tr);
                    }
                }
            }
            for tr in last {
                tr.wait().unwrap();
            }
        });
        best = best.min(d.as_secs_f64());
    }
    (
        pairs.len() as f64 * len as f64 * f64::from(reps) / best / 1e9,
        plan,
    )
}

fn ipc_child(len: u64) {
    let peer = LocalPeer::open(Policy::default(), Calibration::default()).unwrap();
    let r = peer.alloc_device(1, len).unwrap();
    println!(
        "IPCDESC {}",
        serde_json::to_string(&peer.export_ipc(&r).unwrap()).unwrap()
    );
    std::io::stdout().flush().ok();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).ok();
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    const GIB: u64 = 1 << 30;
    if args.get(1).map(String::as_str) == Some("--ipc-child") {
        return ipc_child(GIB);
    }
    let peer = match LocalPeer::open(Policy::default(), Calibration::default()) {
        Ok(p) if p.gpu_count() >= 2 => p,
        Ok(_) => return eprintln!("skipped: needs 2 GPUs"),
        Err(e) => return eprintln!("skipped: {e}"),
    };
    let a = peer.alloc_device(0, GIB).unwrap();
    let b = peer.alloc_device(1, GIB).unwrap();
    for (len, reps, key) in [
        (8u64 << 20, 400, "p2p_8MiB"),
        (64 << 20, 100, "p2p_64MiB"),
        (GIB, 10, "p2p_1GiB"),
    ] {
        let (gbps, plan) = bandwidth(&peer, &[(&b, &a)], len, reps);
        emit(key, gbps, "GB/s", &plan);
    }
    // Both directions at once, on four buffers (no buffer is read and written at once).
    let a2 = peer.alloc_device(0, GIB).unwrap();
    let b2 = peer.alloc_device(1, GIB).unwrap();
    let (gbps, plan) = bandwidth(&peer, &[(&b, &a), (&a2, &b2)], GIB, 10);
    drop((a2, b2));
    emit("p2p_bidir_1GiB", gbps, "GB/s", &plan);

    // 8-byte copy including completion, on the caller's thread.
    let mut lat = Vec::with_capacity(20000);
    for i in 0..21000 {
        let (done, d) = wall(|| peer.copy_blocking(&b, 0, &a, 0, 8));
        done.unwrap();
        if i >= 1000 {
            lat.push(d.as_secs_f64() * 1e6);
        }
    }
    lat.sort_by(f64::total_cmp);
    emit(
        "p2p_8B_latency_p50",
        gdx_base::stats::quantile(&lat, 0.5).unwrap_or(f64::NAN),
        "us",
        "copy_blocking",
    );
    emit(
        "p2p_8B_latency_p99",
        gdx_base::stats::quantile(&lat, 0.99).unwrap_or(f64::NAN),
        "us",
        "copy_blocking",
    );

    // Pool memory (cuMemAllocAsync-style) with access granted by gdx.
    let pa = peer.alloc_device_from_pool(0, GIB).unwrap();
    let pb = peer.alloc_device_from_pool(1, GIB).unwrap();
    let (gbps, plan) = bandwidth(&peer, &[(&pb, &pa)], GIB, 10);
    emit("p2p_pool_granted_1GiB", gbps, "GB/s", &plan);
    drop((pa, pb));

    // ipc: a child process exports 1 GiB on GPU1; this process writes into it from GPU0.
    let exe = std::env::current_exe().unwrap();
    let mut child = std::process::Command::new(exe)
        .arg("--ipc-child")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let desc = loop {
        let l = lines.next().unwrap().unwrap();
        if let Some(j) = l.strip_prefix("IPCDESC ") {
            break serde_json::from_str::<gdx_engine::IpcDesc>(j).unwrap();
        }
    };
    let remote = peer.import_ipc(&desc).unwrap();
    let (gbps, plan) = bandwidth(&peer, &[(&remote, &a)], GIB, 10);
    emit("ipc_1GiB", gbps, "GB/s", &plan);
    drop(remote);
    writeln!(child.stdin.as_mut().unwrap(), "done").ok();
    child.wait().ok();

    // Staged: tune the chunk, then 1 GiB forced through pinned host memory.
    let tune = peer
        .tune_staged(
            0,
            1,
            256 << 20,
            &[4 << 20, 8 << 20, 16 << 20, 32 << 20, 64 << 20],
            4,
        )
        .unwrap();
    for (c, g) in &tune.results {
        emit(
            &format!("staged_tune_chunk_{}MiB", c >> 20),
            *g,
            "GB/s",
            "256 MiB, depth 4",
        );
    }
    let cal = Calibration {
        staged_chunk_bytes: Some(tune.best_chunk_bytes),
        staged_depth: Some(4),
        ..Calibration::default()
    };
    let staged = LocalPeer::open(
        Policy {
            force: Some(Path::Staged),
            ..Policy::default()
        },
        cal,
    )
    .unwrap();
    let (gbps, plan) = bandwidth(&staged, &[(&b, &a)], GIB, 4);
    emit(
        "staged_1GiB",
        gbps,
        "GB/s",
        &format!("chunk {} MiB; {plan}", tune.best_chunk_bytes >> 20),
    );
    let _ = Mem::Gpu(&a);
}
