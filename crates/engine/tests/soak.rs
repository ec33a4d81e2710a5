//! Soak (#15 "a standing adversary"): 1,000 transfers on loopback while the other process is
//! killed with SIGKILL at random points. Every transfer ends completed with verified bytes or
//! failed with a named reason (`PeerLost`, `Timeout`), and afterwards no fd, thread or lease
//! is left behind — on the initiator (the server is killed) and on the target (the clients are
//! killed). The other processes are this same test, re-run with `GDX_TEST_ROLE` set (so no
//! role reports `ok` without having run).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::*;
use gdx_engine::serve::{self, ServeConfig};
use gdx_engine::{Access, Agent, AgentConfig, Error, Peer, Region, RegionDesc, Transfer};
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const LEN: u64 = 1 << 20;

const SEED: u64 = 4242;

fn role(name: &str) -> bool {
    std::env::var("GDX_TEST_ROLE").as_deref() == Ok(name)
}

/// Child: serve a region filled with `fill_pattern(SEED)` until killed or stdin closes.
fn soak_server() {
    let mut h = serve::run(ServeConfig {
        agent: AgentConfig::from_env().unwrap(),
        region_len: LEN,
        ..ServeConfig::default()
    })
    .unwrap();
    fill_pattern(&mut h.region().bytes_mut().unwrap(), SEED);
    println!("{}", h.summary_line());
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}

/// Child: write and read the region at GDX_TEST_ADDR in a loop until killed.
fn soak_client() {
    let addr = std::env::var("GDX_TEST_ADDR").unwrap();
    let me = Agent::new(AgentConfig {
        listen: None,
        ..AgentConfig::from_env().unwrap()
    })
    .unwrap();
    let mut src = me.alloc(LEN, Access::LOCAL, None).unwrap();
    src.bytes_mut().unwrap().fill(0xEE);
    loop {
        let Ok(peer) = me.connect(addr.as_str()) else {
            return;
        };
        let Ok(remote) = peer.region("soak") else {
            return;
        };
        for i in 0..u64::MAX {
            let mut t = Transfer::new();
            let len = 4096 + (i * 7919) % (LEN - 4096);
            if i % 2 == 0 {
                t.write(&src, 0, &remote, 0, len);
            } else {
                t.read(&src, 0, &remote, 0, len);
            }
            if peer.submit(t).and_then(|h| h.wait(WAIT)).is_err() {
                break;
            }
        }
    }
}

fn child(role: &str, envs: &[(&str, String)]) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", "soak"])
        .args(["--nocapture", "--test-threads=1"])
        .env("GDX_TEST_ROLE", role)
        .env("GDX_SECRET_FILE", secret_file())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for (k, v) in envs {
        c.env(k, v);
    }
    c
}

fn spawn_server(shm: bool) -> (Child, String, RegionDesc) {
    let transports = if shm { "tcp,shm" } else { "tcp" };
    let mut c = child("soak-server", &[("GDX_TRANSPORTS", transports.into())])
        .spawn()
        .unwrap();
    let out = c.stdout.take().unwrap();
    for l in BufReader::new(out).lines() {
        let l = l.unwrap();
        if let Some(i) = l.find("GDX_SERVE ") {
            let f = |k: &str| {
                l[i..]
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix(k))
                    .unwrap()
                    .to_string()
            };
            return (c, f("addr="), f("region=").parse().unwrap());
        }
    }
    let _ = c.kill();
    let _ = c.wait();
    panic!("the soak server printed no GDX_SERVE line");
}

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

/// This process's fds and threads once they hold still: the same pair read five times in a
/// row 50 ms apart (a thread that an agent starts may still be starting), within a generous
/// 30 s deadline, after which the last reading is the baseline.
fn steady_counts() -> (usize, usize) {
    let until = Instant::now() + Duration::from_secs(30);
    let mut last = (count("/proc/self/fd"), count("/proc/self/task"));
    let mut same = 0;
    while same < 5 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
        let now = (count("/proc/self/fd"), count("/proc/self/task"));
        same = if now == last { same + 1 } else { 0 };
        last = now;
    }
    last
}

/// Waits (bounded) until the process's fds and threads are back to at most the baseline.
fn settles_to(fds: usize, threads: usize) -> (usize, usize) {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let now = (count("/proc/self/fd"), count("/proc/self/task"));
        if (now.0 <= fds && now.1 <= threads) || Instant::now() > until {
            return now;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn named(e: &Error) -> bool {
    matches!(e, Error::PeerLost { .. } | Error::Timeout(_))
}

struct Killer(Arc<Mutex<Child>>);
impl Drop for Killer {
    fn drop(&mut self) {
        let mut c = self.0.lock().unwrap();
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Both halves in one test: they count this process's fds and threads, so nothing else of
/// this binary may run meanwhile (a second test would be a thread of its own).
#[test]
fn soak() {
    if role("soak-server") {
        return soak_server();
    }
    if role("soak-client") {
        return soak_client();
    }
    target_survives_random_client_kills();
    initiator_survives_random_server_kills();
}

fn initiator_survives_random_server_kills() {
    let (fds0, threads0) = (count("/proc/self/fd"), count("/proc/self/task"));
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let (mut completed, mut failed, mut kills) = (0, 0, 0);
    {
        let me = Agent::new(AgentConfig {
            listen: None,
            transfer_timeout: Duration::from_secs(20),
            ..config("soak", true)
        })
        .unwrap();
        let mut dst: Region<'static> = me.alloc(LEN, Access::LOCAL, None).unwrap();
        let mut want = vec![0u8; LEN as usize];
        fill_pattern(&mut want, SEED);
        let mut conn: Option<(Killer, Peer, RegionDesc)> = None;
        for i in 0..1000u64 {
            if conn.as_ref().is_none_or(|(_, p, _)| !p.is_alive()) {
                drop(conn.take());
                let (c, addr, desc) = spawn_server(i % 2 == 0);
                let peer = me.connect(addr.as_str()).unwrap();
                conn = Some((Killer(Arc::new(Mutex::new(c))), peer, desc));
            }
            let Some((killer, peer, remote)) = &conn else {
                unreachable!()
            };
            if next(25) == 0 {
                // SIGKILL at a random point of the next transfer (or just before it).
                kills += 1;
                let c = Arc::clone(&killer.0);
                let after = Duration::from_micros(next(3000));
                std::thread::spawn(move || {
                    std::thread::sleep(after);
                    let _ = c.lock().unwrap().kill();
                });
            }
            let off = next(LEN - 4096);
            let len = 1 + next(LEN - off);
            dst.bytes_mut().unwrap().fill(0);
            let mut t = Transfer::new();
            t.read(&dst, 0, remote, off, len);
            match peer.submit(t).and_then(|h| h.wait(WAIT)) {
                Ok(rep) => {
                    assert_eq!(rep.bytes, len);
                    let got = dst.bytes().unwrap();
                    assert_eq!(
                        first_diff(
                            &got[..len as usize],
                            &want[off as usize..(off + len) as usize]
                        ),
                        None,
                        "transfer {i}: completed with wrong bytes"
                    );
                    completed += 1;
                }
                Err(e) => {
                    assert!(named(&e), "transfer {i} failed without a named reason: {e}");
                    failed += 1;
                }
            }
        }
        println!(
            "soak: {completed} completed and verified, {failed} failed (named), {kills} kills"
        );
        assert_eq!(completed + failed, 1000);
        assert!(kills > 10 && failed > 0, "kills {kills}, failed {failed}");
        assert!(completed > 500, "only {completed} of 1000 completed");
        drop(conn);
        // No lease left on the local region: a mutable view is granted at once.
        dst.bytes_mut().expect("a leaked lease on the local region");
    }
    let (fds, threads) = settles_to(fds0, threads0);
    assert!(fds <= fds0, "fds {fds0} -> {fds}");
    assert!(threads <= threads0, "threads {threads0} -> {threads}");
}

fn target_survives_random_client_kills() {
    let target = Agent::new(config("soak-target", true)).unwrap();
    let mut region = target.alloc(LEN, Access::READ_WRITE, Some("soak")).unwrap();
    // Baseline with the agent up (its listener threads belong to it), once its threads and fds
    // have stopped changing.
    let (fds0, threads0) = steady_counts();
    let addr = target.listen_addr().unwrap().to_string();
    let mut rng = 12345u64;
    for i in 0..24 {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1);
        let transports = if i % 2 == 0 { "tcp,shm" } else { "tcp" };
        let mut c = child(
            "soak-client",
            &[
                ("GDX_TEST_ADDR", addr.clone()),
                ("GDX_TRANSPORTS", transports.into()),
            ],
        )
        .spawn()
        .unwrap();
        std::thread::sleep(Duration::from_millis(50 + (rng >> 33) % 250));
        let _ = c.kill();
        let _ = c.wait();
    }
    // Every connection of the killed clients is closed, every lease released.
    let (fds, threads) = settles_to(fds0, threads0);
    println!("soak target: fds {fds0} -> {fds}, threads {threads0} -> {threads}");
    assert!(fds <= fds0, "fds {fds0} -> {fds}");
    assert!(threads <= threads0, "threads {threads0} -> {threads}");
    let mut view = region
        .bytes_mut()
        .expect("a lease leaked by a killed client's connection");
    // The clients really worked before they died: they connected and wrote.
    let mut peers = 0;
    while target.accept(Duration::from_millis(1)).is_ok() {
        peers += 1;
    }
    assert!(peers >= 12, "only {peers} of 24 clients connected");
    assert!(view.contains(&0xEE), "no client write landed");
    view.fill(0);
    drop(view);
    assert!(
        target
            .limit_hits()
            .connections
            .load(std::sync::atomic::Ordering::Relaxed)
            == 0
    );
    drop(region);
}
