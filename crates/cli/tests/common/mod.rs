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
