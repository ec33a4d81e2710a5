//! `gdx serve --etcd` and `gdx peers` end to end, on a real etcd (Debian's etcd-server):
//! the served agent is listed with its region, a second agent of the same name is refused
//! naming the holder, `--metrics` serves `/health`, `--watch` reports the leave after
//! `kill -9`, an unreachable etcd is a clear error unless `--etcd-optional`, and TLS with a
//! client certificate works through `--etcd-ca/--etcd-cert/--etcd-key`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::success_json;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use gdx_cluster::test_support::EtcdServer;

use common::Killed as Proc;

fn gdx() -> Command {
    Command::new(assert_cmd::cargo::cargo_bin("gdx"))
}

/// Lines of a child's stdout or stderr, through a channel so waits have deadlines.
fn lines(out: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                return;
            }
        }
    });
    rx
}

fn wait_line(rx: &Receiver<String>, what: &str, f: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) if f(&l) => return l,
            Ok(_) => {}
            Err(e) => panic!("no line {what}: {e}"),
        }
    }
}

/// `gdx serve` of a 1 MiB region on a free port, registered as `agent` in `cluster` at `url`.
fn serve_cmd(url: &str, cluster: &str, agent: &str) -> Command {
    let mut c = gdx();
    c.args([
        "serve",
        "--insecure",
        "--listen",
        "127.0.0.1:0",
        "--size",
        "1MiB",
    ])
    .args(["--etcd", url, "--cluster", cluster, "--agent", agent]);
    c
}

/// Starts `cmd` with its stdout read line by line (stderr dropped).
fn spawn_with_stdout(cmd: &mut Command, what: &str) -> (Proc, Receiver<String>) {
    let mut c = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    let rx = lines(c.stdout.take().expect("stdout"));
    (Proc(c), rx)
}

fn serve(url: &str, agent: &str) -> (Proc, Receiver<String>) {
    spawn_with_stdout(
        serve_cmd(url, "demo", agent)
            .args(["--lease-ttl", "2"])
            .args(["--metrics", "127.0.0.1:0"]),
        "gdx serve",
    )
}

/// `gdx peers` of `cluster` at `url`.
fn peers(url: &str, cluster: &str) -> Command {
    let mut c = gdx();
    c.args(["peers", "--etcd", url, "--cluster", cluster]);
    c
}

/// A fresh etcd, or a panic saying how to get one.
fn etcd() -> EtcdServer {
    EtcdServer::start()
        .unwrap_or_else(|e| panic!("{e} (these tests need apt-get install etcd-server)"))
}

fn http_status(addr: &str, path: &str) -> u16 {
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    write!(s, "GET {path} HTTP/1.0\r\n\r\n").expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    out.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status")
}

#[test]
fn serve_registers_peers_lists_and_watch_sees_the_leave() {
    let etcd = etcd();
    let url = etcd.url();
    let (mut a, a_out) = serve(&url, "prefill-0");
    let line = wait_line(&a_out, "GDX_CLUSTER", |l| l.starts_with("GDX_CLUSTER "));
    let instance = line
        .split_whitespace()
        .find_map(|f| f.strip_prefix("instance="))
        .expect("instance=")
        .to_string();
    let metrics = wait_line(&a_out, "GDX_METRICS", |l| l.starts_with("GDX_METRICS "));
    let maddr = metrics.trim_start_matches("GDX_METRICS addr=").to_string();
    assert_eq!(http_status(&maddr, "/health"), 200);

    let out = peers(&url, "demo")
        .arg("--json")
        .output()
        .expect("gdx peers");
    let v = success_json(&out);
    let agents = v["agents"].as_array().expect("agents");
    assert_eq!(agents.len(), 1, "{v}");
    assert_eq!(agents[0]["agent"]["name"], "prefill-0");
    assert_eq!(agents[0]["agent"]["instance"], instance.as_str());
    assert_eq!(agents[0]["regions"][0]["name"], "serve");
    assert_eq!(agents[0]["regions"][0]["len"], 1 << 20);
    assert!(!out.stdout.windows(3).any(|w| w == b"key"), "{v}");

    let table = peers(&url, "demo").output().expect("gdx peers");
    let t = String::from_utf8_lossy(&table.stdout);
    assert!(t.starts_with("NAME"), "{t}");
    assert!(t.contains("prefill-0") && t.contains(&instance), "{t}");

    // The same name again: refused, naming the holder.
    let dup = serve_cmd(&url, "demo", "prefill-0")
        .output()
        .expect("second serve");
    assert!(!dup.status.success());
    let err = String::from_utf8_lossy(&dup.stderr);
    assert!(
        err.contains("taken by instance") && err.contains(&instance),
        "{err}"
    );

    // --watch reports the leave after kill -9 (the lease expires).
    let mut w = peers(&url, "demo")
        .arg("--watch")
        .stdout(Stdio::piped())
        .spawn()
        .expect("gdx peers --watch");
    let w_out = lines(w.stdout.take().expect("stdout"));
    let _w = Proc(w);
    wait_line(&w_out, "the listing", |l| l.contains("prefill-0"));
    a.0.kill().expect("kill -9");
    let _ = a.0.wait();
    let left = wait_line(&w_out, "the leave", |l| l.starts_with("- left"));
    assert!(
        left.contains("prefill-0") && left.contains(&instance),
        "{left}"
    );
}

fn closed_port_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    drop(l);
    format!("http://127.0.0.1:{port}")
}

#[test]
fn unreachable_etcd_is_an_error_unless_optional() {
    let url = closed_port_url();
    let out = serve_cmd(&url, "demo", "x")
        .args(["--etcd-timeout-ms", "1000"])
        .output()
        .expect("gdx serve");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unreachable") && err.contains(&url), "{err}");

    let mut c = serve_cmd(&url, "demo", "x")
        .arg("--etcd-optional")
        .args(["--etcd-timeout-ms", "1000", "--metrics", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gdx serve --etcd-optional");
    let out = lines(c.stdout.take().expect("stdout"));
    let err = lines(c.stderr.take().expect("stderr"));
    let _c = Proc(c);
    wait_line(&out, "GDX_SERVE", |l| l.starts_with("GDX_SERVE "));
    let m = wait_line(&out, "GDX_METRICS", |l| l.starts_with("GDX_METRICS "));
    wait_line(&err, "the warning", |l| {
        l.contains("WITHOUT cluster registration")
    });
    // Serving, but not registered: /health says so.
    assert_eq!(
        http_status(m.trim_start_matches("GDX_METRICS addr="), "/health"),
        503
    );
}

#[test]
fn peers_over_tls_with_client_certificate() {
    let etcd = EtcdServer::start_tls()
        .unwrap_or_else(|e| panic!("{e} (these tests need etcd-server and openssl)"));
    let d = etcd.cert_dir();
    let f = |n: &str| d.join(n).display().to_string();
    let (_c, out) = spawn_with_stdout(
        serve_cmd(&etcd.url(), "secure", "t0")
            .args(["--etcd-ca", &f("ca.pem"), "--etcd-cert", &f("client.pem")])
            .args(["--etcd-key", &f("client.key")]),
        "gdx serve over TLS",
    );
    wait_line(&out, "GDX_CLUSTER", |l| l.starts_with("GDX_CLUSTER "));
    let list = peers(&etcd.url(), "secure")
        .arg("--json")
        .args(["--etcd-ca", &f("ca.pem"), "--etcd-cert", &f("client.pem")])
        .args(["--etcd-key", &f("client.key")])
        .output()
        .expect("gdx peers over TLS");
    let v = success_json(&list);
    assert_eq!(v["agents"][0]["agent"]["name"], "t0", "{v}");
}

fn agents(url: &str) -> Vec<serde_json::Value> {
    let out = peers(url, "demo")
        .arg("--json")
        .output()
        .expect("gdx peers");
    let v = success_json(&out);
    v["agents"].as_array().cloned().unwrap_or_default()
}

#[test]
fn sigterm_revokes_the_lease_and_bench_finds_a_peer_by_name() {
    let etcd = etcd();
    let url = etcd.url();
    // A long TTL: the keys going away below can only be the revoke, not the expiry.
    let (c, out) = spawn_with_stdout(
        serve_cmd(&url, "demo", "b0").args(["--lease-ttl", "600"]),
        "gdx serve",
    );
    wait_line(&out, "GDX_CLUSTER", |l| l.starts_with("GDX_CLUSTER "));

    let bench = gdx()
        .args(["bench", "--path", "host_to_remote_tcp", "--peer", "etcd:b0"])
        .args([
            "--etcd",
            &url,
            "--cluster",
            "demo",
            "--size",
            "4KiB",
            "--max-samples",
            "5",
        ])
        .env("GDX_INSECURE", "1")
        .output()
        .expect("gdx bench");
    let text = String::from_utf8_lossy(&bench.stdout);
    assert!(
        bench.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&bench.stderr)
    );
    assert!(text.contains("1 passed, 0 waived, 0 failed"), "{text}");
    let unknown = gdx()
        .args([
            "bench",
            "--path",
            "host_to_remote_tcp",
            "--peer",
            "etcd:nobody",
        ])
        .args(["--etcd", &url, "--cluster", "demo", "--size", "4KiB"])
        .output()
        .expect("gdx bench");
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no agent named \"nobody\""));

    assert_eq!(agents(&url).len(), 1);
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&c.0),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !agents(&url).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the lease was not revoked on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Issue 42 row 5 through the CLI: b0's record rewritten to point at b1 (b1's address and
/// instance under b0's name). `gdx bench --peer etcd:b0` used to write into b1; now it exits 2
/// naming the agent it reached, before any case runs.
#[test]
fn bench_refuses_a_redirected_etcd_record() {
    let etcd = etcd();
    let url = etcd.url();
    let (_b0, out0) = spawn_with_stdout(
        serve_cmd(&url, "demo", "b0").args(["--lease-ttl", "600"]),
        "gdx serve b0",
    );
    wait_line(&out0, "GDX_CLUSTER", |l| l.starts_with("GDX_CLUSTER "));
    let (_b1, out1) = spawn_with_stdout(
        serve_cmd(&url, "demo", "b1").args(["--lease-ttl", "600"]),
        "gdx serve b1",
    );
    wait_line(&out1, "GDX_CLUSTER", |l| l.starts_with("GDX_CLUSTER "));
    let b1 = agents(&url)
        .into_iter()
        .find(|a| a["agent"]["name"] == "b1")
        .expect("b1 listed");
    let mut forged = b1["agent"].clone();
    forged["name"] = "b0".into();
    etcd.put("/gdx/demo/agents/b0", &forged.to_string())
        .unwrap();
    let bench = gdx()
        .args(["bench", "--path", "host_to_remote_tcp", "--peer", "etcd:b0"])
        .args(["--etcd", &url, "--cluster", "demo", "--size", "4KiB"])
        .env("GDX_INSECURE", "1")
        .output()
        .expect("gdx bench");
    let err = String::from_utf8_lossy(&bench.stderr);
    assert_eq!(bench.status.code(), Some(2), "{err}");
    assert!(err.contains("reached agent \"b1\""), "{err}");
}
