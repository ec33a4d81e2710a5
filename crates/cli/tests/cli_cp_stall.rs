//! `gdx cp` gives up on a copy that stopped making progress, names the cause and exits, even
//! while the process doing the I/O cannot be ended (here: stopped with SIGSTOP; on a dead
//! NVMe-oF target: asleep in the kernel, which the RDMA VM suite exercises).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The children of `pid`, from /proc (each process's stat names its parent).
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(n) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{n}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces, so split after the last ')'.
        let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let ppid = rest
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) {
            out.push(n);
        }
    }
    out
}

/// Whether `pid` has exec'd as a copy worker (its environment names `GDX_CP_WORKER`).
fn is_worker(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
        env.split(|&b| b == 0)
            .any(|v| v.starts_with(b"GDX_CP_WORKER="))
    })
}

fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

#[test]
fn a_copy_whose_worker_stops_answering_fails_by_name_and_the_process_exits() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("sparse.bin");
    std::fs::File::create(&p)
        .unwrap()
        .set_len(256 << 20)
        .unwrap();
    let mut gdx = Command::new(env!("CARGO_BIN_EXE_gdx"))
        .args([
            "cp",
            &format!("file:{}", p.display()),
            "host",
            "--chunk",
            "4K",
            "--depth",
            "1",
            "--stall-timeout",
            "2",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Stop the worker as soon as it runs the copy: from then on nothing it does can be seen.
    // Not earlier: a child stopped between fork and exec holds its parent inside `spawn`
    // (which waits for the exec), which is not the stall this test is about; after the exec
    // the worker's environment carries the worker variable, before it the parent's does not.
    let t0 = Instant::now();
    let worker = loop {
        if let Some(&w) = children(gdx.id()).iter().find(|&&w| is_worker(w)) {
            break w;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no copy worker started"
        );
        std::thread::sleep(Duration::from_millis(1));
    };
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(worker as i32).unwrap(),
        rustix::process::Signal::STOP,
    )
    .unwrap();
    // gdx must end by itself; 60 s is only there so a hang fails the test instead of CI.
    let status = loop {
        if let Some(s) = gdx.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(60) {
            gdx.kill().unwrap();
            panic!("gdx cp hung on a stopped worker");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = gdx.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("no I/O completed for 2 s"), "{err}");
    assert!(err.contains("the device stopped answering"), "{err}");
    assert!(err.contains("is not on an NVMe-oF namespace"), "{err}");
    assert!(err.contains(&format!("worker pid {worker}")), "{err}");
    // The stopped worker was killed (SIGKILL ends a stopped process): gone or a zombie.
    let t1 = Instant::now();
    while matches!(state(worker), Some('R' | 'S' | 'T' | 'D' | 't')) {
        assert!(
            t1.elapsed() < Duration::from_secs(30),
            "worker {worker} still alive"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_bad_stall_timeout_is_a_usage_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_gdx"))
        .args([
            "cp",
            "host",
            "file:/tmp/x",
            "--length",
            "1",
            "--stall-timeout",
            "0",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("--stall-timeout 0: give a number of seconds above 0"));
}
