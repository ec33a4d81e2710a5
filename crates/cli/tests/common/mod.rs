//! What the end-to-end test binaries share.
#![allow(dead_code)] // each test binary uses its own part

/// The gdx binary cargo built for these tests.
pub fn gdx() -> assert_cmd::Command {
    assert_cmd::Command::cargo_bin("gdx").expect("gdx binary built by cargo")
}

/// The JSON on stdout of a run that must have succeeded (its stderr is shown if it did not).
pub fn success_json(out: &std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

/// The stdout of a run that must have succeeded, as text (its stderr is shown if it did not).
pub fn success_text(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("UTF-8 on stdout")
}

/// A child process that is killed (and reaped) when dropped, so a failed test leaves no server.
pub struct Killed(pub std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The lines a child writes on stdout.
pub type StdoutLines = std::io::Lines<std::io::BufReader<std::process::ChildStdout>>;

/// Start `cmd` with stdout piped and stderr dropped: the process (killed when dropped) and its
/// stdout's lines.
pub fn spawn_lines(cmd: &mut std::process::Command) -> (Killed, StdoutLines) {
    use std::io::BufRead;
    use std::process::Stdio;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the child");
    let out = child.stdout.take().expect("piped stdout");
    (Killed(child), std::io::BufReader::new(out).lines())
}

/// `gdx serve` (the binary cargo built), to be given its arguments.
pub fn gdx_serve() -> std::process::Command {
    let mut c = std::process::Command::new(assert_cmd::cargo::cargo_bin("gdx"));
    c.arg("serve");
    c
}

/// A refused command line: exit status 2, `says` on stderr.
pub fn refused(run: assert_cmd::assert::Assert, says: &str) -> assert_cmd::assert::Assert {
    run.code(2).stderr(predicates::str::contains(says))
}

/// A run that succeeded with each of `says` on stdout.
pub fn shows(run: assert_cmd::assert::Assert, says: &[&str]) -> assert_cmd::assert::Assert {
    says.iter().fold(run.success(), |a, s| {
        a.stdout(predicates::str::contains(*s))
    })
}

/// `gdx bench --mock --path mock_host --size 8,4KiB,1MiB EXTRA --compare OLD`.
pub fn mock_compare(old: &std::path::Path, extra: &[&str]) -> assert_cmd::Command {
    let mut c = gdx();
    c.args([
        "bench",
        "--mock",
        "--path",
        "mock_host",
        "--size",
        "8,4KiB,1MiB",
    ])
    .args(extra)
    .arg("--compare")
    .arg(old);
    c
}
