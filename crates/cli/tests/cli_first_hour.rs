//! The first things a new user runs: `--version`, `completions`, `--help`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::{gdx, refused};

use predicates::prelude::*;

/// `gdx --version` names the build: version, git commit and date, like the bench header.
#[test]
fn version_carries_the_git_hash_and_build_date() {
    let out = gdx().arg("--version").assert().success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).to_string();
    let re = regex_lite(&text);
    assert!(re, "unexpected --version: {text:?}");
    // The hash is the one this checkout is at.
    if let Ok(o) = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
    {
        if o.status.success() {
            let head = String::from_utf8_lossy(&o.stdout).trim().to_string();
            assert!(text.contains(&head), "{text:?} does not name HEAD {head}");
        }
    }
    // Subcommands report the same.
    gdx()
        .args(["topo", "--version"])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            text.trim().trim_start_matches("gdx "),
        ));
}

/// `gdx X.Y.Z (git <12 hex>[-dirty], built YYYY-MM-DD)`.
fn regex_lite(text: &str) -> bool {
    let Some(rest) = text
        .trim()
        .strip_prefix(&format!("gdx {} (git ", env!("CARGO_PKG_VERSION")))
    else {
        return false;
    };
    let Some((hash, rest)) = rest.split_once(", built ") else {
        return false;
    };
    let hash = hash.trim_end_matches("-dirty");
    let date = rest.trim_end_matches(')');
    hash.len() == 12
        && hash.bytes().all(|b| b.is_ascii_hexdigit())
        && date.len() == 10
        && date.as_bytes()[4] == b'-'
        && date.as_bytes()[7] == b'-'
}

#[test]
fn completions_for_each_shell() {
    for (shell, marker) in [
        ("bash", "complete -F _gdx"),
        ("zsh", "#compdef gdx"),
        ("fish", "complete -c gdx"),
    ] {
        gdx()
            .args(["completions", shell])
            .assert()
            .success()
            .stdout(predicate::str::contains(marker))
            // every subcommand is offered
            .stdout(predicate::str::contains("doctor"))
            .stdout(predicate::str::contains("bench"));
    }
    refused(
        gdx().args(["completions", "tcsh"]).assert(),
        "possible values",
    );
}

/// A closed pipe is not a crash (clap_complete panics on a write error when given stdout):
/// the pipe's read end is closed before gdx starts, so its first write fails with EPIPE.
#[test]
fn completions_into_a_closed_pipe_do_not_panic() {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let o = std::process::Command::new(assert_cmd::cargo::cargo_bin("gdx"))
        .args(["completions", "bash"])
        .stdout(writer)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(o.status.code(), Some(0), "{err}");
}
