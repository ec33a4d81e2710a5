//! What the two-process host examples (`bench_host`, `fabric_vs_tcp`) share: starting this
//! binary again as the server and reading the address it prints.

use gdx_engine::Error;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// Run this binary as `serve SIZE` (with `GDX_SECRET_FILE` set to `secret` when given), its
/// stdin a pipe (closing it ends the server), and read the first line it prints: its
/// address.
pub fn spawn_server(size: u64, secret: Option<&Path>) -> Result<(Child, String), Error> {
    let exe = std::env::current_exe().map_err(|e| Error::os("current_exe", e))?;
    let mut cmd = Command::new(exe);
    cmd.args(["serve", &size.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    if let Some(file) = secret {
        cmd.env("GDX_SECRET_FILE", file);
    }
    let mut child = cmd.spawn().map_err(|e| Error::os("spawn", e))?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .map_err(|e| Error::os("read", e))?;
    Ok((child, line.trim().to_string()))
}
