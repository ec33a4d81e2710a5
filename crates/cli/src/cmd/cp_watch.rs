//! `gdx cp` never hangs on a device that stopped answering. A read or write on a block device
//! whose controller lost its target (an NVMe-oF target gone, with the kernel's default
//! `ctrl_loss_tmo` of 600 s) sleeps uninterruptibly in the kernel: no signal ends it, and a
//! process cannot exit while one of its threads is in it. So the copy runs in a worker, this
//! same binary re-run with [`WORKER_ENV`] set, and this process watches its progress: when no
//! progress has come for `--stall-timeout`, it kills the worker (the kill lands once the
//! kernel lets the I/O go), says why, naming the device and its fabric controller's state,
//! and exits 1 without waiting for it.
//!
//! The worker reports progress on its stderr as lines starting with [`PROGRESS`]; every other
//! line is passed through. Its stdout (the report) is this process's.

use super::cp::{Bar, CpArgs};
use anyhow::{Context as _, Result};
use gdx_topo::nvmeof::{self, Controller};
use gdx_topo::sysfs::RootFs;
use std::io::{BufRead, BufReader, Write as _};
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Set in the worker's environment: run the copy here, report progress on stderr.
pub const WORKER_ENV: &str = "GDX_CP_WORKER";
/// The start of a progress line: `PROGRESS <done> <total>`.
pub const PROGRESS: &str = "\x1egdx-cp-progress";

/// True inside the worker.
pub fn in_worker() -> bool {
    std::env::var_os(WORKER_ENV).is_some()
}

/// The worker's progress callback: one line per 100 ms at most, and the last one.
pub fn worker_progress() -> gdx_storage::ProgressFn {
    let last = std::sync::Mutex::new(Instant::now() - Duration::from_secs(1));
    std::sync::Arc::new(move |done, total| {
        let mut l = last.lock().unwrap_or_else(|p| p.into_inner());
        if done < total && l.elapsed() < Duration::from_millis(100) {
            return;
        }
        *l = Instant::now();
        eprintln!("{PROGRESS} {done} {total}");
    })
}

/// The fabric a file location is served through: its disk and controller, if any.
pub fn fabric_of(path: &Path) -> Option<(String, Controller)> {
    nvmeof::fabric_of_path(&RootFs::new("/"), path)
}

enum Event {
    Progress(u64, u64),
    Closed,
}

/// Run the copy in a worker and watch it (see the module docs).
pub fn supervise(args: &CpArgs, files: &[&Path]) -> Result<ExitCode> {
    let exe = std::env::current_exe().context("finding this program to run the copy worker")?;
    let mut child = Command::new(&exe)
        .args(std::env::args_os().skip(1))
        .env(WORKER_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting the copy worker {}", exe.display()))?;
    let pid = child.id();
    let Some(err) = child.stderr.take() else {
        anyhow::bail!("the copy worker has no stderr pipe");
    };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines() {
            let Ok(line) = line else { break };
            match line.strip_prefix(PROGRESS) {
                Some(rest) => {
                    let mut n = rest.split_whitespace().filter_map(|x| x.parse().ok());
                    if let (Some(d), Some(t)) = (n.next(), n.next()) {
                        let _ = tx.send(Event::Progress(d, t));
                    }
                }
                None => eprintln!("{line}"),
            }
        }
        let _ = tx.send(Event::Closed);
    });
    let bar = args.wants_bar().then(Bar::new);
    let draw = bar.as_ref().map(Bar::callback);
    let stall = Duration::from_secs_f64(args.stall_timeout_s);
    let mut last = Instant::now();
    let mut done = 0u64;
    loop {
        let left = stall.saturating_sub(last.elapsed());
        match rx.recv_timeout(left) {
            Ok(Event::Progress(d, t)) => {
                if d > done || done == 0 {
                    last = Instant::now();
                }
                done = d;
                if let Some(f) = &draw {
                    f(d, t);
                }
            }
            Ok(Event::Closed) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Some(b) = &bar {
                    b.finish();
                }
                // SIGKILL: delivered when the kernel lets the stuck I/O go; never waited for.
                let _ = child.kill();
                let (src, dst) = (args.src_text(), args.dst_text());
                eprintln!(
                    "gdx: error: {src} -> {dst}: {}",
                    stall_cause(args.stall_timeout_s, done, files, pid)
                );
                let _ = std::io::stderr().flush();
                return Ok(ExitCode::from(1));
            }
        }
    }
    if let Some(b) = &bar {
        b.finish();
    }
    let status = child.wait().context("waiting for the copy worker")?;
    Ok(match status.code() {
        Some(c) => ExitCode::from(u8::try_from(c).unwrap_or(1)),
        None => {
            eprintln!("gdx: error: the copy worker (pid {pid}) was killed by a signal: {status}");
            ExitCode::from(1)
        }
    })
}

/// Why the copy stalled, in words: the device, and for a fabric namespace its controller's
/// state now and what the kernel will do with the I/O it holds.
fn stall_cause(stall_s: f64, done: u64, files: &[&Path], pid: u32) -> String {
    let mut parts = vec![format!(
        "no I/O completed for {stall_s:.0} s (after {done} bytes): the device stopped answering"
    )];
    for f in files {
        match fabric_of(f) {
            Some((disk, c)) => {
                let st = c.state.as_deref().unwrap_or("?");
                let held = match (c.fast_io_fail_tmo, c.ctrl_loss_tmo) {
                    (Some(nvmeof::Timeout::Secs(s)), _) => {
                        format!("fails it after fast_io_fail_tmo ({s} s)")
                    }
                    (_, Some(nvmeof::Timeout::Secs(s))) => {
                        format!("holds it until ctrl_loss_tmo ({s} s) unless the target comes back")
                    }
                    _ => "holds it until the target comes back (ctrl_loss_tmo off)".into(),
                };
                parts.push(format!(
                    "{} is on {disk}, namespace of {} (controller state '{st}'); the kernel {held}",
                    f.display(),
                    c.fabric_path()
                ));
            }
            None => parts.push(format!("{} is not on an NVMe-oF namespace", f.display())),
        }
    }
    parts.push(format!(
        "gdx gave up at its own deadline (--stall-timeout) and left the stuck I/O to the kernel (worker pid {pid} is killed once it returns)"
    ));
    parts.join("; ")
}
