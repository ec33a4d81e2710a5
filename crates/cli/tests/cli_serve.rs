//! `gdx serve` end to end: start the real binary, parse its GDX_SERVE line, connect with the
//! engine from this process, write random bytes, read them back and compare.

use gdx_engine::{Access, Agent, AgentConfig, Transfer};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

struct Server(std::process::Child);
impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(args: &[&str]) -> (Server, String) {
    let exe = assert_cmd::cargo::cargo_bin("gdx");
    let mut child = Command::new(exe)
        .arg("serve")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start gdx serve");
    let out = child.stdout.take().unwrap();
    let server = Server(child);
    let mut lines = BufReader::new(out).lines();
    let line = lines
        .find_map(|l| l.ok().filter(|l| l.starts_with("GDX_SERVE ")))
        .expect("a GDX_SERVE line");
    let addr = line
        .split_whitespace()
        .find_map(|f| f.strip_prefix("addr="))
        .expect("addr=")
        .to_string();
    (server, addr)
}

fn client() -> Agent {
    Agent::new(AgentConfig {
        name: "cli-test".into(),
        listen: None,
        ..AgentConfig::from_env().unwrap()
    })
    .unwrap()
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
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for b in src.bytes_mut().unwrap().iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
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
