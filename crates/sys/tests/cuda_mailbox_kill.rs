#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The mailbox's kernel must not outlive its host: a child process (`examples/mailbox_child`)
//! starts a mailbox; the parent stops it (SIGSTOP: a hung host, its heartbeat silent) and checks
//! with `nvidia-smi` that the GPU goes idle while the child still exists (the watchdog ended the
//! kernel), then kills it (SIGKILL) and checks that its process leaves the GPU.
//!
//! One test in this binary, so nothing else of the test run keeps the GPU busy. Needs a GPU,
//! nvidia-smi, and the child built (`cargo test` builds examples; or `GDX_MAILBOX_CHILD=path`).

use gdx_base::testenv::test_gpu;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn child_path() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("GDX_MAILBOX_CHILD") {
        return p.into();
    }
    // target/<profile>/deps/<this test> -> target/<profile>/examples/mailbox_child
    let exe = std::env::current_exe().unwrap();
    exe.parent()
        .and_then(|d| d.parent())
        .unwrap()
        .join("examples")
        .join("mailbox_child")
}

fn smi(args: &[&str]) -> String {
    let out = Command::new("nvidia-smi")
        .args(args)
        .output()
        .expect("nvidia-smi (needed to see the GPU from outside the child)");
    assert!(out.status.success(), "nvidia-smi {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn utilization(bus: &str) -> u32 {
    smi(&[
        "-i",
        bus,
        "--query-gpu=utilization.gpu",
        "--format=csv,noheader,nounits",
    ])
    .trim()
    .parse()
    .unwrap()
}

fn compute_pids(bus: &str) -> Vec<u32> {
    smi(&[
        "-i",
        bus,
        "--query-compute-apps=pid",
        "--format=csv,noheader",
    ])
    .lines()
    .filter_map(|l| l.trim().parse().ok())
    .collect()
}

/// Poll `f` every 200 ms for up to `limit`; the first value `ok` accepts, or the last one.
fn poll<T: Copy + std::fmt::Debug>(
    limit: Duration,
    f: impl Fn() -> T,
    ok: impl Fn(T) -> bool,
) -> T {
    let start = Instant::now();
    loop {
        let v = f();
        if ok(v) || start.elapsed() > limit {
            return v;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
#[ignore = "requires a CUDA GPU and nvidia-smi"]
fn a_stopped_or_killed_host_leaves_no_kernel_spinning() {
    let cuda = gdx_sys::cuda::Cuda::load().expect("libcuda");
    let bus = cuda.device(test_gpu()).unwrap().pci_bus_id().unwrap();
    let path = child_path();
    assert!(
        path.exists(),
        "child {} not built (cargo test builds examples)",
        path.display()
    );
    let mut child = Command::new(&path)
        .arg("500")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), format!("READY {pid}"), "child output");
    // Positive control: while the child's kernel spins, the GPU is busy.
    let busy = poll(Duration::from_secs(10), || utilization(&bus), |u| u >= 50);
    assert!(
        busy >= 50,
        "the mailbox kernel should keep the GPU busy; utilization {busy}%"
    );
    // A hung host: its heartbeat stops, the watchdog (500 ms) ends the kernel.
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
    let idle = poll(Duration::from_secs(15), || utilization(&bus), |u| u == 0);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    assert!(
        stat.contains(") T "),
        "the child should still exist, stopped: {stat}"
    );
    assert_eq!(
        idle, 0,
        "GPU still busy {idle}% with the host stopped: the watchdog did not fire"
    );
    eprintln!("child {pid} stopped: GPU utilization {busy}% -> {idle}%");
    // A killed host: its process leaves the GPU.
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    child.wait().unwrap();
    let pids = poll(
        Duration::from_secs(15),
        || compute_pids(&bus).contains(&pid),
        |p| !p,
    );
    assert!(!pids, "child {pid} still listed on the GPU after SIGKILL");
}
