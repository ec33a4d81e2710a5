//! `gdx serve`'s output flags and sizes: `--json` (one object), `-q` (machine lines only), and
//! `--size` read the one gdx way (1GB = 10^9, 1GiB = 2^30).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::{gdx_serve, spawn_lines};

/// Start `gdx serve ARGS` on a free loopback port and return its first stdout line (without the
/// newline).
fn first_line(args: &[&str]) -> String {
    let (served, mut lines) = spawn_lines(
        gdx_serve()
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .env_remove("GDX_SECRET_FILE"),
    );
    let line = lines.next().map(|l| l.unwrap()).unwrap_or_default();
    drop(served);
    line
}

#[test]
fn serve_sizes_are_decimal_and_binary() {
    for (size, bytes) in [("1GB", 1_000_000_000u64), ("1GiB", 1 << 30), ("4096", 4096)] {
        let v: serde_json::Value = serde_json::from_str(&first_line(&["--size", size, "--json"]))
            .unwrap_or_else(|e| panic!("--json gives one object: {e}"));
        assert_eq!(v["region"]["len"], bytes, "--size {size}: {v}");
        assert!(v["addr"].as_str().unwrap().starts_with("127.0.0.1:"), "{v}");
        assert!(v["desc"].as_str().unwrap().starts_with("gdx1:"), "{v}");
        // No --secret-file and no GDX_SECRET_FILE: a secret is generated and shown once.
        assert_eq!(v["secret"].as_str().map(str::len), Some(64), "{v}");
    }
}

#[test]
fn quiet_prints_the_machine_line_first() {
    let line = first_line(&["--size", "1KB", "-q"]);
    assert!(line.starts_with("GDX_SERVE addr=127.0.0.1:"), "{line}");
    assert!(line.trim_end().ends_with(" len=1000"), "{line}");
}
