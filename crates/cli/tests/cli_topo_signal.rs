//! SIGTERM while gdx holds an unpacked `--root` archive (and a capture being packed) removes
//! both temporary folders and exits 128 + 15, as a shell reports a killed command.
//!
//! No timing: gdx is held inside `--capture` by an output FIFO nobody opens, and the test
//! waits until the capture's last file exists before it signals.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_topo::fixture::h200x2_capture as h200_capture;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Names in `dir` starting with `prefix`.
fn with_prefix(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn sigterm_removes_the_unpacked_root_and_the_capture_folder() {
    let d = tempfile::tempdir().unwrap();
    let tmp = d.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let out = d.path().join("out.tar.gz");
    assert!(Command::new("mkfifo").arg(&out).status().unwrap().success());
    let mut child = Command::new(env!("CARGO_BIN_EXE_gdx"))
        .args(["topo", "-q", "--root"])
        .arg(h200_capture())
        .arg("--capture")
        .arg(&out)
        .env("TMPDIR", &tmp)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The manifest is the capture's last file; after it gdx opens the FIFO and blocks there.
    let mut waited = 0;
    loop {
        let ready = with_prefix(&tmp, "gdx-capture-")
            .iter()
            .any(|c| c.join("gdx/capture.json").is_file());
        if ready {
            break;
        }
        if let Some(st) = child.try_wait().unwrap() {
            panic!("gdx ended before blocking on the FIFO: {st}");
        }
        waited += 1;
        assert!(waited < 6000, "gdx never reached the output FIFO");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(
        with_prefix(&tmp, "gdx-root-").len(),
        1,
        "the root is unpacked"
    );
    let st = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(143), "{status}");
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().collect();
    assert!(left.is_empty(), "left in TMPDIR after SIGTERM: {left:?}");
}
