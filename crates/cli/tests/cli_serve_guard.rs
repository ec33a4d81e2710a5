//! `gdx serve` tells the operator what peers did without letting them drive the terminal
//! (issue 42 rows 9 and 10): a peer's agent name and notification data come out with ESC
//! escaped, and refused logins are logged on stderr with their source address (they used to
//! vanish: no logger, and a real client's wrong secret was never seen by the agent).

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
    // A real client holding the wrong secret (what guessing the secret looks like): refused,
    // and the refusal is logged with its source address (it used to leave no trace).
    let guess = Agent::new(AgentConfig {
        name: "guess".into(),
        listen: None,
        secret: Some(Secret::generate().unwrap()),
        ..AgentConfig::default()
    })
    .unwrap();
    let e = guess.connect(addr.as_str()).expect_err("the wrong secret");
    assert!(e.to_string().contains("different secrets"), "{e}");
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
        err.contains("failed login from 127.0.0.1:") && err.contains("key confirmation is wrong"),
        "refused login not logged with its source: {err}"
    );
    let _ = std::fs::remove_file(&secret_path);
}
