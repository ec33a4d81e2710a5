//! `gdx serve` end to end: start the real binary, parse its GDX_SERVE line, connect with the
//! engine from this process, write random bytes, read them back and compare. Also: the
//! secret (given, generated and printed, wrong, insecure) and the `--listen` forms.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use gdx_base::pattern::fill_pattern;
use gdx_engine::{Access, Agent, AgentConfig, Error, Secret, Transfer};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

/// A secret file (mode 600) for this test process.
fn secret_file() -> PathBuf {
    static F: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    F.get_or_init(|| {
        // Under the target dir, not $TMPDIR: nothing is left outside the build.
        let p = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("gdx-cli-serve-secret-{}", std::process::id()));
        Secret::generate().unwrap().write_file(&p).unwrap();
        p
    })
    .clone()
}

type Server = common::Killed;

/// Starts `gdx serve` with the test's secret file (unless `args` says otherwise).
fn start(args: &[&str]) -> (Server, String) {
    let f = secret_file();
    let mut all: Vec<&str> = args.to_vec();
    if !args.contains(&"--insecure") && !args.contains(&"--no-secret-file") {
        all.extend(["--secret-file", f.to_str().unwrap()]);
    }
    all.retain(|a| *a != "--no-secret-file");
    let (server, lines) = start_raw(&all);
    let addr = lines
        .iter()
        .find(|l| l.starts_with("GDX_SERVE "))
        .and_then(|l| l.split_whitespace().find_map(|f| f.strip_prefix("addr=")))
        .expect("addr=")
        .to_string();
    (server, addr)
}

/// Starts `gdx serve ARGS`; returns the stdout lines up to and including GDX_SERVE (and the
/// secret line, if one follows).
fn start_raw(args: &[&str]) -> (Server, Vec<String>) {
    let (server, mut lines) =
        common::spawn_lines(common::gdx_serve().args(args).env_remove("GDX_SECRET_FILE"));
    let mut got = Vec::new();
    for l in lines.by_ref() {
        let l = l.expect("stdout");
        let done = l.starts_with("GDX_SERVE ");
        got.push(l);
        if done {
            break;
        }
    }
    assert!(got.iter().any(|l| l.starts_with("GDX_SERVE ")), "{got:?}");
    if !args.contains(&"--secret-file") && !args.contains(&"--insecure") {
        if let Some(Ok(l)) = lines.next() {
            got.push(l);
        }
    }
    (server, got)
}

fn client_with(secret: Option<Secret>, insecure: bool) -> Agent {
    Agent::new(AgentConfig {
        name: "cli-test".into(),
        listen: None,
        secret,
        insecure,
        ..AgentConfig::default()
    })
    .unwrap()
}

fn client() -> Agent {
    client_with(Some(Secret::from_file(&secret_file()).unwrap()), false)
}

#[test]
fn serve_accepts_writes_and_reads_back() {
    let (_server, addr) = start(&["--listen", "127.0.0.1:0", "--size", "3MiB", "--name", "t"]);
    let agent = client();
    let peer = agent.connect(addr.as_str()).unwrap();
    let remote = peer.region("t").unwrap();
    assert_eq!(remote.len, 3 << 20);

    let len = (3 << 20) - 5; // unaligned on purpose
    let mut src = agent.alloc(len, Access::LOCAL, None).unwrap();
    fill_pattern(&mut src.bytes_mut().unwrap(), 7);
    let mut t = Transfer::new();
    t.write(&src, 0, &remote, 3, len);
    let rep = peer
        .submit(t)
        .unwrap()
        .wait(Duration::from_secs(30))
        .unwrap();
    assert_eq!(rep.bytes, len);

    let mut dst = agent.alloc(len, Access::LOCAL, None).unwrap();
    dst.bytes_mut().unwrap().fill(0xAA);
    let mut t = Transfer::new();
    t.read(&dst, 0, &remote, 3, len);
    peer.submit(t)
        .unwrap()
        .wait(Duration::from_secs(30))
        .unwrap();
    assert!(
        dst.bytes().unwrap()[..] == src.bytes().unwrap()[..],
        "bytes differ"
    );
}

#[test]
fn read_only_serve_refuses_writes() {
    let (_server, addr) = start(&["--listen", "127.0.0.1:0", "--size", "4KiB", "--read-only"]);
    let agent = client();
    let peer = agent.connect(addr.as_str()).unwrap();
    let remote = peer.region("serve").unwrap();
    let src = agent.alloc(16, Access::LOCAL, None).unwrap();
    let mut t = Transfer::new();
    t.write(&src, 0, &remote, 0, 16);
    let outcome = peer.submit(t).and_then(|h| h.wait(Duration::from_secs(30)));
    let err = outcome.expect_err("a write into a read-only served region must fail");
    let text = format!("{err}").to_lowercase();
    assert!(
        text.contains("read-only") || text.contains("read only") || text.contains("write"),
        "{text}"
    );
}

#[test]
fn a_generated_secret_is_printed_and_works() {
    let (_server, lines) = start_raw(&["--listen", "127.0.0.1:0", "--size", "4KiB"]);
    let addr = lines
        .iter()
        .find_map(|l| l.strip_prefix("GDX_SERVE addr="))
        .and_then(|l| l.split_whitespace().next())
        .expect("addr")
        .to_string();
    let secret = lines
        .iter()
        .find_map(|l| l.strip_prefix("GDX_SERVE_SECRET "))
        .and_then(|l| l.split_whitespace().next())
        .expect("a GDX_SERVE_SECRET line");
    // The summary line never carries the secret.
    assert!(lines
        .iter()
        .all(|l| !l.starts_with("GDX_SERVE ") || !l.contains(secret)));
    let good = client_with(
        Some(Secret::from_bytes(secret.as_bytes().to_vec()).unwrap()),
        false,
    );
    let peer = good.connect(addr.as_str()).unwrap();
    assert_eq!(peer.region("serve").unwrap().len, 4096);

    // Another secret: refused before any region is named.
    let wrong = client_with(Some(Secret::generate().unwrap()), false);
    let err = wrong
        .connect(addr.as_str())
        .expect_err("a wrong secret must be refused");
    assert!(matches!(err, Error::AuthFailed { .. }), "{err}");
    // No secret at all (insecure client): refused too.
    let none = client_with(None, true);
    let err = none
        .connect(addr.as_str())
        .expect_err("an insecure client must be refused");
    assert!(matches!(err, Error::AuthFailed { .. }), "{err}");
}

#[test]
fn insecure_serve_takes_insecure_clients_only() {
    let (_server, addr) = start(&["--listen", "127.0.0.1:0", "--size", "4KiB", "--insecure"]);
    let open = client_with(None, true);
    let peer = open.connect(addr.as_str()).unwrap();
    assert_eq!(peer.region("serve").unwrap().len, 4096);
    // An authenticating client does not silently downgrade.
    let err = client()
        .connect(addr.as_str())
        .expect_err("no silent downgrade");
    assert!(matches!(err, Error::AuthFailed { .. }), "{err}");
}

#[test]
fn listen_forms_are_accepted() {
    // PORT alone means loopback; port 0 picks a free one.
    let (_server, addr) = start(&["--listen", "0", "--size", "4KiB"]);
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
    client().connect(addr.as_str()).unwrap();
    let (_server, addr) = start(&["--listen", "[::1]:0", "--size", "4KiB"]);
    if !addr.starts_with("[::1]:") {
        panic!("{addr}");
    }
    client().connect(addr.as_str()).unwrap();
    let (_server, addr) = start(&["--listen", "localhost:0", "--size", "4KiB"]);
    client().connect(addr.as_str()).unwrap();
    let out = Command::new(assert_cmd::cargo::cargo_bin("gdx"))
        .args(["serve", "--listen", "nonsense"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("PORT, :PORT, HOST:PORT"), "{err}");
}

#[test]
fn default_listen_is_loopback() {
    let out = Command::new(assert_cmd::cargo::cargo_bin("gdx"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("[default: 127.0.0.1:7447]"), "{help}");
}

#[test]
fn insecure_prints_a_warning_and_bad_limits_are_refused() {
    let exe = assert_cmd::cargo::cargo_bin("gdx");
    let mut child = Command::new(&exe)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--size",
            "4KiB",
            "--insecure",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let err = child.stderr.take().unwrap();
    let server = common::Killed(child);
    let lines: Vec<String> = BufReader::new(out)
        .lines()
        .map_while(|l| l.ok())
        .take_while(|l| !l.starts_with("GDX_SERVE "))
        .collect();
    assert!(lines.iter().all(|l| !l.starts_with("GDX_SERVE_SECRET")));
    drop(server); // killed: its stderr ends
    let mut text = String::new();
    std::io::Read::read_to_string(&mut BufReader::new(err), &mut text).unwrap();
    assert!(text.contains("WARNING: --insecure"), "{text}");

    let out = Command::new(&exe)
        .args(["serve", "--listen", "127.0.0.1:0", "--max-connections", "0"])
        .env_remove("GDX_SECRET_FILE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("max_connections must be > 0"), "{err}");
}
