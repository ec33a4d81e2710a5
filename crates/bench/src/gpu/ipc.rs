//! The second process of the `ipc` cases and its protocol.
//!
//! The parent (`gdx bench`) re-executes itself ([`std::env::current_exe`]) as
//! `gdx bench --ipc-child GPU:LEN` ([`child_args`]). The child ([`child_main`]) opens the
//! engine, allocates `LEN` bytes on GPU `GPU` ([`LocalPeer::alloc_device`]), exports it
//! ([`LocalPeer::export_ipc`]) and prints **one JSON line** on stdout:
//!
//! - `{"ready": <IpcDesc>}` — the descriptor to import, or
//! - `{"error": "<message>"}` — why it could not (then it exits with status 2).
//!
//! It then reads stdin until end of file, keeping the allocation alive, and exits when the
//! parent closes stdin (or dies). The parent ([`IpcChild::start`]) waits at most
//! [`READY_TIMEOUT`] for the line, and its [`IpcChild`] closes the child's stdin when dropped,
//! waits up to [`EXIT_GRACE`] for it to exit, then kills it: no hang, no orphan.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use gdx_engine::{Calibration, IpcDesc, LocalPeer, Policy};
use serde::{Deserialize, Serialize};

use crate::error::BenchError;

/// The hidden `gdx bench` flag that runs the child.
pub const CHILD_FLAG: &str = "--ipc-child";

/// How long the parent waits for the child's line (CUDA start-up and a large allocation).
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a dropped [`IpcChild`] waits for the child to exit after closing its stdin.
pub const EXIT_GRACE: Duration = Duration::from_secs(5);

/// The child's one line on stdout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ChildMsg {
    /// The exported allocation.
    Ready(IpcDesc),
    /// Why the child could not export one.
    Error(String),
}

/// The arguments after the executable that start the child for `len` bytes on GPU `gpu`.
pub fn child_args(gpu: u32, len: u64) -> Vec<String> {
    vec!["bench".into(), CHILD_FLAG.into(), format!("{gpu}:{len}")]
}

/// Parse the child's `GPU:LEN` argument.
///
/// # Errors
/// A message naming the bad argument.
pub fn parse_child_arg(arg: &str) -> Result<(u32, u64), BenchError> {
    let bad = || {
        BenchError::IpcChild(format!(
            "{CHILD_FLAG} {arg:?}: want GPU:LEN (a CUDA ordinal and a byte count)"
        ))
    };
    let (g, l) = arg.split_once(':').ok_or_else(bad)?;
    let gpu = g.trim().parse::<u32>().map_err(|_| bad())?;
    let len = l.trim().parse::<u64>().map_err(|_| bad())?;
    if len == 0 {
        return Err(bad());
    }
    Ok((gpu, len))
}

/// Parse one line the child printed: the descriptor, or the child's error as `Err`.
///
/// # Errors
/// The child's own error, or a message saying the line is not the protocol's.
pub fn parse_child_line(line: &str) -> Result<IpcDesc, BenchError> {
    let t = line.trim();
    match serde_json::from_str::<ChildMsg>(t) {
        Ok(ChildMsg::Ready(d)) => Ok(d),
        Ok(ChildMsg::Error(e)) => Err(BenchError::IpcChild(format!("ipc child: {e}"))),
        Err(e) => {
            let shown: String = t.chars().take(200).collect();
            Err(BenchError::IpcChild(format!(
                "malformed line from the ipc child (want {{\"ready\": <IpcDesc>}} or \
                 {{\"error\": \"...\"}}): {shown:?}: {e}"
            )))
        }
    }
}

/// The child: allocate, export, print the line, hold the allocation until stdin closes.
/// `out` is stdout and `input` stdin (parameters for tests).
///
/// # Errors
/// Why the allocation could not be exported (also printed as `{"error": ...}` on `out`).
pub fn serve_child(arg: &str, out: &mut dyn Write, input: &mut dyn Read) -> Result<(), BenchError> {
    let exported = parse_child_arg(arg).and_then(|(gpu, len)| {
        let peer = LocalPeer::open(Policy::default(), Calibration::default())
            .map_err(BenchError::engine("opening the engine"))?;
        let region = peer
            .alloc_device(gpu, len)
            .map_err(BenchError::engine(format!(
                "allocating {len} bytes on GPU{gpu}"
            )))?;
        let desc = peer
            .export_ipc(&region)
            .map_err(BenchError::engine("exporting the allocation"))?;
        Ok((peer, region, desc))
    });
    let (msg, held) = match exported {
        Ok((peer, region, desc)) => (ChildMsg::Ready(desc), Ok((peer, region))),
        // The wire carries the message (the protocol is one JSON line); the error stays here.
        Err(e) => (ChildMsg::Error(e.chain()), Err(e)),
    };
    let line = serde_json::to_string(&msg)
        .map_err(|e| BenchError::IpcChild(format!("encoding the child's line: {e}")))?;
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(BenchError::io("writing the child's line"))?;
    let held = held?;
    // Until the parent closes our stdin (or exits): end of file or an error both mean done.
    let _ = std::io::copy(input, &mut std::io::sink());
    drop(held);
    Ok(())
}

/// [`serve_child`] on this process's stdin and stdout (what `gdx bench --ipc-child` runs).
///
/// # Errors
/// See [`serve_child`].
pub fn child_main(arg: &str) -> Result<(), BenchError> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    serve_child(arg, &mut out, &mut std::io::stdin().lock())
}

/// A running child. Dropping it closes the child's stdin, waits up to [`EXIT_GRACE`], then
/// kills it.
#[derive(Debug)]
pub struct IpcChild {
    child: Child,
    stdin: Option<ChildStdin>,
    stderr: Option<mpsc::Receiver<String>>,
}

/// Most bytes of the child's stderr kept for error messages.
const STDERR_TAIL: usize = 2000;

impl IpcChild {
    /// Start `exe args…` and wait up to `timeout` for its line; the child and the descriptor.
    ///
    /// # Errors
    /// Could not start, exited early (with its status and stderr), said `error`, printed a
    /// malformed line, or was silent for `timeout` (it is killed in every case).
    pub fn start(
        exe: &Path,
        args: &[String],
        timeout: Duration,
    ) -> Result<(IpcChild, IpcDesc), BenchError> {
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(BenchError::io(format!(
                "starting the ipc child {}",
                exe.display()
            )))?;
        let stdout = child.stdout.take();
        // Read on threads, so a stuck child (or a grandchild holding a pipe) never blocks us.
        let stderr = child.stderr.take().map(|mut s| {
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let _ = s.read_to_end(&mut buf);
                let text = String::from_utf8_lossy(&buf).trim().to_string();
                let skip = text.len().saturating_sub(STDERR_TAIL);
                let start = (skip..=text.len())
                    .find(|&i| text.is_char_boundary(i))
                    .unwrap_or(0);
                let _ = tx.send(text[start..].to_string());
            });
            rx
        });
        let mut me = IpcChild {
            stdin: child.stdin.take(),
            child,
            stderr,
        };
        let (tx, rx) = mpsc::channel::<Option<String>>();
        if let Some(out) = stdout {
            std::thread::spawn(move || {
                let mut first = None;
                for line in BufReader::new(out).lines() {
                    match line {
                        Ok(l) if l.trim().is_empty() => continue,
                        Ok(l) => {
                            first = Some(l);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                let _ = tx.send(first);
            });
        }
        let t0 = Instant::now();
        match rx.recv_timeout(timeout) {
            Ok(Some(line)) => match parse_child_line(&line) {
                Ok(d) => Ok((me, d)),
                Err(e) => Err(me.fail(e.to_string())),
            },
            Ok(None) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                Err(me.fail("the ipc child closed its stdout without sending a descriptor".into()))
            }
            Err(mpsc::RecvTimeoutError::Timeout) => Err(me.fail(format!(
                "the ipc child sent no descriptor within {:.0} s",
                t0.elapsed().as_secs_f64()
            ))),
        }
    }

    /// Kill the child and add its exit status and stderr to `msg`.
    fn fail(&mut self, msg: String) -> BenchError {
        self.stdin.take();
        let _ = self.child.kill();
        let status = self.child.wait().map(|s| s.to_string()).unwrap_or_default();
        let err = self
            .stderr
            .take()
            .and_then(|rx| rx.recv_timeout(Duration::from_secs(1)).ok())
            .unwrap_or_default();
        let mut m = msg;
        if !status.is_empty() {
            m.push_str(&format!(" ({status})"));
        }
        if !err.is_empty() {
            m.push_str(&format!("; its stderr: {err}"));
        }
        BenchError::IpcChild(m)
    }
}

impl Drop for IpcChild {
    fn drop(&mut self) {
        self.stdin.take();
        let t = Instant::now();
        while t.elapsed() < EXIT_GRACE {
            match self.child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                Err(_) => break,
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc() -> IpcDesc {
        IpcDesc {
            host_id: "0123456789abcdef0123456789abcdef".into(),
            pid: 4242,
            region: 7,
            pci_bus_id: "0000:1b:00.0".into(),
            len: 1 << 20,
            handle: "ab".repeat(64),
            offset: 0,
            alloc_len: 1 << 20,
            pieces: Vec::new(),
            posix_fd_alloc_len: None,
        }
    }

    #[test]
    fn a_ready_line_round_trips_the_descriptor() {
        let line = serde_json::to_string(&ChildMsg::Ready(desc())).unwrap();
        assert!(line.starts_with(r#"{"ready":{"#), "{line}");
        assert!(!line.contains('\n'));
        assert_eq!(parse_child_line(&format!("{line}\n")).unwrap(), desc());
    }

    #[test]
    fn the_childs_error_is_passed_on() {
        let line = serde_json::to_string(&ChildMsg::Error("no GPU 3".into())).unwrap();
        assert_eq!(line, r#"{"error":"no GPU 3"}"#);
        assert_eq!(
            parse_child_line(&line).unwrap_err().to_string(),
            "ipc child: no GPU 3"
        );
    }

    #[test]
    fn malformed_lines_get_a_clear_error() {
        for bad in [
            "",
            "hello",
            r#"{"ready": {"pid": 1}}"#,
            r#"{"ready": {}, "error": "x"}"#,
            r#"{"other": 1}"#,
        ] {
            let e = parse_child_line(bad).unwrap_err().to_string();
            assert!(
                e.starts_with("malformed line from the ipc child"),
                "{bad:?}: {e}"
            );
        }
        let long = "x".repeat(5000);
        assert!(parse_child_line(&long).unwrap_err().to_string().len() < 600);
    }

    #[test]
    fn child_args_parse_back() {
        let a = child_args(1, 1 << 30);
        assert_eq!(a[..2], ["bench".to_string(), CHILD_FLAG.to_string()]);
        assert_eq!(parse_child_arg(&a[2]).unwrap(), (1, 1 << 30));
        for bad in ["", "1", "x:2", "1:", "1:0", "-1:5"] {
            assert!(
                parse_child_arg(bad)
                    .unwrap_err()
                    .to_string()
                    .contains("want GPU:LEN"),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_bad_argument_is_reported_on_the_line() {
        let mut out = Vec::new();
        let e = serve_child("nonsense", &mut out, &mut std::io::empty()).unwrap_err();
        let line = String::from_utf8(out).unwrap();
        assert_eq!(
            parse_child_line(&line).unwrap_err().to_string(),
            format!("ipc child: {}", e.chain())
        );
    }

    #[test]
    fn a_child_that_exits_early_or_prints_garbage_is_an_error_not_a_hang() {
        let sh = Path::new("/bin/sh");
        assert!(sh.exists(), "every Linux machine has /bin/sh");
        let run = |script: &str, timeout: Duration| {
            IpcChild::start(sh, &["-c".into(), script.into()], timeout)
                .map(|(_, d)| d)
                .map_err(|e| e.to_string())
        };
        let e = run("echo oops >&2; exit 3", READY_TIMEOUT).unwrap_err();
        assert!(
            e.contains("without sending a descriptor") && e.contains("oops"),
            "{e}"
        );
        let e = run("echo not-json; sleep 30", READY_TIMEOUT).unwrap_err();
        assert!(e.starts_with("malformed line"), "{e}");
        let t = Instant::now();
        let e = run("sleep 30", Duration::from_millis(200)).unwrap_err();
        assert!(e.contains("no descriptor within"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(10));
        let line = serde_json::to_string(&ChildMsg::Ready(desc())).unwrap();
        let (child, d) = IpcChild::start(
            sh,
            &["-c".into(), format!("echo '{line}'; cat >/dev/null")],
            READY_TIMEOUT,
        )
        .unwrap();
        assert_eq!(d, desc());
        let t = Instant::now();
        drop(child);
        assert!(t.elapsed() < EXIT_GRACE, "closing stdin ends the child");
    }
}
