//! Two-process harness: the test binary re-runs itself as the *target* (the ignored test
//! `target_process`), which opens an endpoint on the tcp provider (loopback), registers a
//! buffer filled with a known pattern, prints its address and region, and then obeys line
//! commands on stdin: `check OFF LEN SEED [START]` (verify bytes against the pattern of
//! offset START, default OFF), `fill OFF LEN SEED`, `drop`
//! (release the registration and report the counters), `quit`.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use gdx_fabric::{Endpoint, FabricConfig, Memory, RemoteRegion};

/// The pattern of `seed` from absolute offset `start` into `out` (gdx-base's one pattern).
pub use gdx_base::pattern::fill_pattern_at;

/// Fills `mem[off..off+len]` with `pattern(seed)` in 1 MiB pieces.
pub fn fill(mem: &Memory, off: usize, len: usize, seed: u64) {
    let mut buf = vec![0u8; len.min(1 << 20)];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(buf.len());
        fill_pattern_at(&mut buf[..n], seed, off + done);
        assert!(mem.write_at(off + done, &buf[..n]));
        done += n;
    }
}

/// The first offset in `mem[off..off+len]` that differs from `pattern(seed)`.
pub fn first_mismatch(mem: &Memory, off: usize, len: usize, seed: u64) -> Option<usize> {
    first_mismatch_from(mem, off, len, seed, off)
}

/// Like [`first_mismatch`], for bytes that carry the pattern of offset `start` onwards.
pub fn first_mismatch_from(
    mem: &Memory,
    off: usize,
    len: usize,
    seed: u64,
    start: usize,
) -> Option<usize> {
    let mut got = vec![0u8; len.min(1 << 20)];
    let mut want = got.clone();
    let mut done = 0;
    while done < len {
        let n = (len - done).min(got.len());
        if !mem.read_at(off + done, &mut got[..n]) {
            return Some(off + done);
        }
        fill_pattern_at(&mut want[..n], seed, start + done);
        if let Some(k) = (0..n).find(|&k| got[k] != want[k]) {
            return Some(off + done + k);
        }
        done += n;
    }
    None
}

pub fn tcp() -> FabricConfig {
    provider("tcp")
}

pub fn provider(name: &str) -> FabricConfig {
    FabricConfig {
        provider: Some(name.into()),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

/// The target's seed for its initial contents.
pub const TARGET_SEED: u64 = 0xA11CE;

/// The target process body (run by `target_process` when the harness starts it).
pub fn target_main() {
    let size: usize = std::env::var("GDX_FABRIC_TARGET_SIZE")
        .expect("started by the harness")
        .parse()
        .expect("size");
    let prov = std::env::var("GDX_FABRIC_TARGET_PROVIDER").unwrap_or_else(|_| "tcp".into());
    let ep = Endpoint::open(&provider(&prov)).expect("open target endpoint");
    let mem = Memory::alloc(size);
    fill(&mem, 0, size, TARGET_SEED);
    let mut region = Some(ep.register(mem).expect("register"));
    let r = region.as_ref().expect("region").remote();
    let out = std::io::stdout();
    let mut out = out.lock();
    writeln!(
        out,
        "READY {} {}",
        hex(&ep.address().expect("address")),
        hex(&r.encode())
    )
    .expect("stdout");
    out.flush().expect("flush");
    for line in std::io::stdin().lock().lines() {
        let line = line.expect("stdin");
        let w: Vec<&str> = line.split_whitespace().collect();
        let n = |i: usize| w[i].parse::<u64>().expect("number");
        let reply = match w.first().copied() {
            Some("check") => match &region {
                Some(reg) => match first_mismatch_from(
                    reg.memory(),
                    n(1) as usize,
                    n(2) as usize,
                    n(3),
                    if w.len() > 4 { n(4) } else { n(1) } as usize,
                ) {
                    None => "ok".to_string(),
                    Some(at) => format!("bad {at}"),
                },
                None => "gone".into(),
            },
            Some("fill") => match &region {
                Some(reg) => {
                    fill(reg.memory(), n(1) as usize, n(2) as usize, n(3));
                    "ok".into()
                }
                None => "gone".into(),
            },
            Some("drop") => {
                let before = ep.registrations();
                region = None;
                let after = ep.registrations();
                format!("regs {} {} {} {}", before.0, before.1, after.0, after.1)
            }
            Some("quit") | None => break,
            Some(other) => format!("unknown {other}"),
        };
        writeln!(out, "{reply}").expect("stdout");
        out.flush().expect("flush");
    }
}

/// A running target process.
pub struct Target {
    pub child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    pub addr: Vec<u8>,
    pub region: RemoteRegion,
}

impl Target {
    /// Starts the target with a `size`-byte region on the tcp provider.
    pub fn start(size: usize) -> Target {
        Target::start_on("tcp", size)
    }

    /// Starts the target on provider `prov`.
    // Target's Drop kills and reaps the child; only a failed start (the test panics) skips it.
    #[allow(clippy::zombie_processes)]
    pub fn start_on(prov: &str, size: usize) -> Target {
        let exe = std::env::current_exe().expect("test binary");
        let mut child = Command::new(exe)
            .args([
                "--exact",
                "target_process",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("GDX_FABRIC_TARGET_SIZE", size.to_string())
            .env("GDX_FABRIC_TARGET_PROVIDER", prov)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn target");
        let stdin = child.stdin.take().expect("stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        loop {
            line.clear();
            let n = stdout.read_line(&mut line).expect("read target");
            assert!(n > 0, "target exited before READY");
            // libtest prints "test target_process ... " on the same line first.
            if let Some(rest) = line.trim().split_once("READY ").map(|(_, r)| r) {
                let mut it = rest.split(' ');
                let addr = unhex(it.next().expect("addr"));
                let region =
                    RemoteRegion::decode(&unhex(it.next().expect("region"))).expect("region");
                return Target {
                    child,
                    stdin,
                    stdout,
                    addr,
                    region,
                };
            }
            // libtest's own lines ("running 1 test") come first.
        }
    }

    /// Sends one command and returns the reply line.
    pub fn ask(&mut self, cmd: &str) -> String {
        writeln!(self.stdin, "{cmd}").expect("write target");
        self.stdin.flush().expect("flush");
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read target");
        line.trim().to_string()
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
