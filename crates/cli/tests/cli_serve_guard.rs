//! `gdx serve` tells the operator what peers did without letting them drive the terminal
//! (issue 42 rows 9 and 10): a peer's agent name and notification data come out with ESC
//! escaped, and refused logins are logged on stderr (they used to vanish: no logger).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use gdx_engine::{Agent, AgentConfig, Secret};
use std::io::{BufRead, BufReader, Read};
use std::process::Stdio;
use std::time::Duration;

#[test]
fn peer_strings_are_escaped_and_refused_logins_are_logged() {
    let secret_path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("gdx-cli-guard-secret-{}", std::process::id()));
    let secret = Secret::generate().unwrap();
    secret.write_file(&secret_path).unwrap();
    let mut child = common::gdx_serve()
        .args(["--listen", "127.0.0.1:0", "--secret-file"])
        .arg(&secret_path)
        .env_remove("GDX_SECRET_FILE")
        .env_remove("GDX_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let server = common::Killed(child);
    let addr = out
        .lines()
        .map(|l| l.unwrap())
        .find(|l| l.starts_with("GDX_SERVE "))
        .and_then(|l| {
            l.split_whitespace()
                .find_map(|f| f.strip_prefix("addr=").map(str::to_string))
        })
        .expect("GDX_SERVE addr=");
    // A peer whose name and notification carry terminal escapes.
    let evil = Agent::new(AgentConfig {
        name: "ev\x1b[2Jil".into(),
        listen: None,
        secret: Some(secret.clone()),
        ..AgentConfig::default()
    })
    .unwrap();
    let peer = evil.connect(addr.as_str()).unwrap();
    peer.notify(&b"hi\x1b]0;pwned\x07"[..]).unwrap();
    // A login with a wrong proof (what guessing the secret looks like): refused, and the
    // refusal is logged.
    {
        use gdx_engine::wire::{decode_frame, encode, Hello, Msg};
        use std::io::Write;
        let mut s = std::net::TcpStream::connect(addr.as_str()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let hello = Msg::Hello(Hello {
            agent_name: "guess".into(),
            nonce: 1,
            ..Hello::default()
        });
        s.write_all(&encode(&hello, 0)).unwrap();
        let mut buf = Vec::new();
        let mut tmp = [0u8; 4096];
        while !matches!(decode_frame(&buf), Ok(Some((Msg::Challenge { .. }, _, _)))) {
            let n = s.read(&mut tmp).unwrap();
            assert!(n > 0, "no Challenge");
            buf.extend_from_slice(&tmp[..n]);
        }
        s.write_all(&encode(&Msg::Auth { mac: [0; 32] }, 0))
            .unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
    }
    std::thread::sleep(Duration::from_millis(500));
    drop(server); // killed: its stderr ends
    let mut err = String::new();
    stderr.read_to_string(&mut err).unwrap();
    assert!(
        !err.contains('\x1b'),
        "a raw ESC reached the terminal: {err:?}"
    );
    assert!(
        !err.contains('\x07'),
        "a raw BEL reached the terminal: {err:?}"
    );
    assert!(
        err.contains("notification from ev\\u{1b}[2Jil: hi\\u{1b}]0;pwned\\u{7}"),
        "{err}"
    );
    assert!(
        err.contains("proof is wrong"),
        "refused login not logged: {err}"
    );
    let _ = std::fs::remove_file(&secret_path);
}
