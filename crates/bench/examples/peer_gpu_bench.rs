//! GPU regions through a `Peer` (the `peer` stage of `scripts/device/run.sh`): for each path,
//! the gdx figure and its reference measured in the same run.
//!
//! - `tcp-staged`: GPU0 → GPU1 of another agent over loopback tcp (pinned slots pipelined on
//!   both ends), against host → host over the same tcp connection settings.
//! - `ipc` through a `Peer`: GPU0 → GPU1 of an agent in a second process (the CUDA IPC handle
//!   in its region descriptor), against `LocalPeer` p2p GPU0 → GPU1 in this process.
//!
//! One JSON object per line: `{"key": ..., "value": ..., "unit": ..., "note": ...}`; GB/s =
//! 1e9 B/s, best of 3 timed transfers after a warm-up, each a single 1 GiB write op.
//! Usage: `peer_gpu_bench [bytes]` (default 1 GiB).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // an example, not library code

use gdx_base::clock::wall;
use std::io::{BufRead, Write};
use std::time::Duration;

use gdx_engine::{
    Access, Agent, AgentConfig, Calibration, LocalPeer, Peer, Policy, Region, RegionDesc, Secret,
    Transfer, Transports,
};

const WAIT: Duration = Duration::from_secs(300);

fn emit(key: &str, value: f64, unit: &str, note: &str) {
    let note = note.replace('"', "'");
    println!(r#"{{"key":"{key}","value":{value:.3},"unit":"{unit}","note":"{note}"}}"#);
    std::io::stdout().flush().ok();
}

/// The secret this process and its child share: the child reads GDX_SECRET_FILE, the parent
/// makes one (mode 600) for it.
fn secret_file() -> &'static std::path::Path {
    static F: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    F.get_or_init(|| {
        if let Some(p) = std::env::var_os("GDX_SECRET_FILE") {
            return p.into();
        }
        let p = std::env::temp_dir().join(format!("gdx-peer-gpu-{}.secret", std::process::id()));
        Secret::generate().unwrap().write_file(&p).unwrap();
        p
    })
}

fn config(name: &str, shm: bool) -> AgentConfig {
    AgentConfig {
        secret: Some(Secret::from_file(secret_file()).unwrap()),
        name: name.into(),
        transports: Transports {
            tcp: true,
            shm,
            rdma: true,
            fabric: false,
        },
        tcp_streams: 4,
        ..AgentConfig::default()
    }
}

/// Best-of-3 GB/s of one write op of `len` bytes, and the plan it took.
fn write_bw(peer: &Peer, src: &Region<'_>, dst: &RegionDesc, len: u64) -> (f64, String) {
    let once = || {
        let mut t = Transfer::new();
        t.write(src, 0, dst, 0, len);
        let (r, d) = wall(|| peer.submit(t).unwrap().wait(WAIT).unwrap());
        (d.as_secs_f64(), r.ops[0].plan.to_string())
    };
    let (_, plan) = once();
    let best = (0..3).map(|_| once().0).fold(f64::MAX, f64::min);
    (len as f64 / best / 1e9, plan)
}

fn child(len: u64) {
    let lp = LocalPeer::open(Policy::default(), Calibration::default()).unwrap();
    let r = lp.alloc_device(lp.gpu_count() - 1, len).unwrap();
    let agent = Agent::new(config("bench-child", true)).unwrap();
    let _served = agent
        .register_gpu(&lp, &r, Access::READ_WRITE, Some("gpu"))
        .unwrap();
    println!("ADDR {}", agent.listen_addr().unwrap());
    std::io::stdout().flush().ok();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).ok();
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let len: u64 = args
        .iter()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1 << 30);
    if args.get(1).map(String::as_str) == Some("child") {
        return child(len);
    }
    let lp = LocalPeer::open(Policy::default(), Calibration::default()).unwrap();
    let far_gpu = lp.gpu_count() - 1;

    // tcp-staged against host tcp, same agents, same settings.
    let target = Agent::new(config("target", false)).unwrap();
    let remote_dev = lp.alloc_device(far_gpu, len).unwrap();
    let _g = target
        .register_gpu(&lp, &remote_dev, Access::READ_WRITE, Some("g"))
        .unwrap();
    let _h = target.alloc(len, Access::READ_WRITE, Some("h")).unwrap();
    let me = Agent::new(config("me", false)).unwrap();
    let local_dev = lp.alloc_device(0, len).unwrap();
    let local_gpu = me
        .register_gpu(&lp, &local_dev, Access::LOCAL, None)
        .unwrap();
    let mut local_host = me.alloc(len, Access::LOCAL, None).unwrap();
    local_host.bytes_mut().unwrap().fill(7);
    let peer = me.connect(target.listen_addr().unwrap()).unwrap();
    let (g, h) = (peer.region("g").unwrap(), peer.region("h").unwrap());
    let (bw, plan) = write_bw(&peer, &local_gpu, &g, len);
    emit("peer_tcp_staged_gpu0_to_gpu1", bw, "GB/s", &plan);
    let (bw, plan) = write_bw(&peer, &local_host, &h, len);
    emit("peer_tcp_host_to_host", bw, "GB/s", &plan);
    drop(peer);

    // ipc through a Peer (second process) against LocalPeer p2p.
    let exe = std::env::current_exe().unwrap();
    let mut kid = std::process::Command::new(exe)
        .args(["child", &len.to_string()])
        .env("GDX_SECRET_FILE", secret_file())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(kid.stdout.take().unwrap()).lines();
    let addr = loop {
        let l = lines.next().expect("child ended").unwrap();
        if let Some(a) = l.strip_prefix("ADDR ") {
            break a.to_string();
        }
    };
    let shm_me = Agent::new(config("shm-me", true)).unwrap();
    let src = shm_me
        .register_gpu(&lp, &local_dev, Access::LOCAL, None)
        .unwrap();
    let peer = shm_me.connect(addr.as_str()).unwrap();
    let d = peer.region("gpu").unwrap();
    let (bw, plan) = write_bw(&peer, &src, &d, len);
    emit("peer_ipc_gpu0_to_gpu1", bw, "GB/s", &plan);
    writeln!(kid.stdin.as_mut().unwrap(), "done").ok();
    kid.wait().ok();
    if std::env::var_os("GDX_SECRET_FILE").is_none() {
        let _ = std::fs::remove_file(secret_file());
    }

    let p2p_dst = lp.alloc_device(far_gpu, len).unwrap();
    let once = || {
        let (p, d) = wall(|| lp.copy_blocking(&p2p_dst, 0, &local_dev, 0, len).unwrap());
        (d.as_secs_f64(), p.to_string())
    };
    let (_, plan) = once();
    let best = (0..3).map(|_| once().0).fold(f64::MAX, f64::min);
    emit(
        "localpeer_p2p_gpu0_to_gpu1",
        len as f64 / best / 1e9,
        "GB/s",
        &plan,
    );
}
