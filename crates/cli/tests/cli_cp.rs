//! End-to-end tests of `gdx cp` through the real binary (no GPU needed; the GPU cases are
//! `#[ignore]`d).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::{gdx, refused, shows};

use gdx_base::pattern::pattern;
use predicates::prelude::*;

#[test]
fn file_to_host_with_verify_reports_path_rate_ceiling_and_check() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("data.bin");
    std::fs::write(&p, pattern(3 << 20, 1)).unwrap();
    gdx()
        .args([
            "cp",
            &format!("file:{}", p.display()),
            "host",
            "--verify",
            "--chunk",
            "64K",
        ])
        .assert()
        .success()
        .stdout(predicate::str::contains("copied   3 MiB (3145728 bytes)"))
        .stdout(predicate::str::contains("GB/s"))
        .stdout(predicate::str::is_match("path     (file-staged|buffered): ").unwrap())
        .stdout(predicate::str::contains("  ceiling  "))
        .stdout(predicate::str::contains("verify   ok: crc32 "));
}

#[test]
fn host_to_file_and_back_round_trips_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("out.bin");
    let out = gdx()
        .args([
            "cp",
            "host",
            &format!("file:{}", p.display()),
            "--length",
            "1M",
            "--verify",
            "--json",
        ])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["bytes"], 1 << 20);
    assert_eq!(v["direction"], "host_to_file");
    assert_eq!(v["verify"]["ok"], true);
    assert!(v["reason"].as_str().unwrap().contains("O_DIRECT"), "{v}");
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 1 << 20);
    gdx()
        .args([
            "cp",
            &format!("file:{}", p.display()),
            "host",
            "--skip",
            "4095",
            "--length",
            "5000",
            "--verify",
            "--path",
            "buffered",
        ])
        .assert()
        .success()
        .stdout(predicate::str::contains("path     buffered: "))
        .stdout(predicate::str::contains("verify   ok: crc32 "));
}

#[test]
fn bad_locations_are_usage_errors_naming_the_syntax() {
    for (src, dst, what) in [
        ("disk:/x", "host", "SRC: bad location 'disk:/x'"),
        ("host", "gpu:x", "DST: bad location 'gpu:x'"),
        ("file:", "host", "SRC: bad location 'file:'"),
    ] {
        gdx()
            .args(["cp", src, dst])
            .assert()
            .code(2)
            .stderr(predicate::str::starts_with("gdx: error: "))
            .stderr(predicate::str::contains(what))
            .stderr(predicate::str::contains(
                "expected PATH, file:PATH, gpu:N[:OFFSET] or host",
            ));
    }
    refused(
        gdx().args(["cp", "file:/a", "file:/b"]).assert(),
        "use cp(1)",
    );
    refused(
        gdx().args(["cp", "host", "file:/tmp/x"]).assert(),
        "needs a length (gdx cp --length)",
    );
}

#[test]
fn a_missing_source_and_a_read_only_destination_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.bin");
    refused(
        gdx()
            .args(["cp", &format!("file:{}", missing.display()), "host"])
            .assert(),
        "No such file or directory",
    )
    .stderr(predicate::str::contains("missing.bin"));
    // Root may write a 0444 file; a read-only sysfs attribute refuses everyone.
    use std::os::unix::fs::PermissionsExt;
    let ro = dir.path().join("ro.bin");
    std::fs::write(&ro, b"keep").unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o444)).unwrap();
    let target = [ro.clone(), "/sys/kernel/uevent_seqnum".into()]
        .into_iter()
        .find(|c| c.exists() && std::fs::OpenOptions::new().write(true).open(c).is_err());
    if !gdx_base::testenv::precondition("a file that refuses writing", target.is_some()) {
        return;
    }
    let target = target.unwrap();
    gdx()
        .args([
            "cp",
            "host",
            &format!("file:{}", target.display()),
            "--length",
            "4K",
        ])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("for writing: "))
        .stderr(
            predicate::str::contains("Permission denied")
                .or(predicate::str::contains("Read-only file system")),
        );
}

#[test]
fn gpu_without_a_usable_gpu_is_a_clear_environment_error() {
    if !gdx_base::testenv::precondition("no GPU", !gdx_has_gpu()) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("data.bin");
    std::fs::write(&p, b"hello").unwrap();
    gdx()
        .args(["cp", &format!("file:{}", p.display()), "gpu:0"])
        .assert()
        .code(2)
        .stderr(predicate::str::starts_with("gdx: error: "))
        .stderr(predicate::str::contains("gpu:0 needs the CUDA driver"));
}

/// Whether libcuda loads and reports a device (then the no-GPU case does not apply).
fn gdx_has_gpu() -> bool {
    std::path::Path::new("/dev/nvidiactl").exists()
}

#[test]
fn help_lists_locations_and_the_bench() {
    shows(
        gdx().args(["cp", "--help"]).assert(),
        &["gpu:N[:OFFSET]", "--bench", "--verify"],
    );
}

#[test]
#[ignore = "requires a GPU; cargo test -- --ignored"]
fn file_to_gpu_and_back_verified() {
    let gpu = std::env::var("GDX_TEST_GPU").unwrap_or_else(|_| "0".into());
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("data.bin");
    std::fs::write(&p, pattern((8 << 20) + 5, 2)).unwrap();
    for path in ["auto", "file-staged", "gds"] {
        gdx()
            .args([
                "cp",
                &format!("file:{}", p.display()),
                &format!("gpu:{gpu}:3"),
                "--verify",
                "--path",
                path,
            ])
            .assert()
            .success()
            .stdout(predicate::str::contains("verify   ok"));
        let out = dir.path().join(format!("out-{path}.bin"));
        gdx()
            .args([
                "cp",
                &format!("gpu:{gpu}:5"),
                &format!("file:{}", out.display()),
                "--length",
                "3M",
                "--verify",
                "--path",
                path,
            ])
            .assert()
            .success()
            .stdout(predicate::str::contains("verify   ok"));
    }
}

#[test]
fn a_bare_path_is_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("src.bin");
    std::fs::write(&p, pattern(64 << 10, 3)).unwrap();
    gdx()
        .args(["cp", p.to_str().unwrap(), "host", "--verify"])
        .assert()
        .success()
        .stdout(predicate::str::contains(format!(
            "file:{} -> host",
            p.display()
        )))
        .stdout(predicate::str::contains("verify   ok"));
    refused(
        gdx().args(["cp", "disk:/a", "host"]).assert(),
        "unknown scheme 'disk:'",
    );
}

/// `--length` is read the one gdx way: 1GB = 10^9, 1GiB = 2^30. The range check names the
/// parsed count before anything is allocated, which makes the parse observable on a tiny file.
#[test]
fn length_units_are_decimal_and_binary() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("small.bin");
    std::fs::write(&p, pattern(4096, 4)).unwrap();
    for (flag, bytes) in [("1GB", "1000000000"), ("1GiB", "1073741824")] {
        gdx()
            .args(["cp", p.to_str().unwrap(), "host", "--length", flag])
            .assert()
            .code(2)
            .stderr(predicate::str::contains(format!(
                "the range of {bytes} byte(s) at offset 0 is past its end"
            )));
    }
    let out = dir.path().join("out.bin");
    let o = gdx()
        .args([
            "cp",
            "host",
            out.to_str().unwrap(),
            "--length",
            "1KB",
            "--json",
        ])
        .assert()
        .success();
    let v: serde_json::Value = serde_json::from_slice(&o.get_output().stdout).unwrap();
    assert_eq!(v["bytes"], 1000);
    assert_eq!(std::fs::metadata(&out).unwrap().len(), 1000);
}

#[test]
fn impossible_ranges_and_streams_are_refused_before_any_allocation() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("one-mib.bin");
    std::fs::write(&p, pattern(1 << 20, 5)).unwrap();
    for len in ["100T", "18446744073709551615"] {
        refused(
            gdx()
                .args(["cp", p.to_str().unwrap(), "host", "--length", len])
                .timeout(std::time::Duration::from_secs(30))
                .assert(),
            "is past its end",
        )
        .stderr(predicate::str::contains("panicked").not());
    }
    gdx()
        .args(["cp", p.to_str().unwrap(), "host", "--skip", "2M"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "at offset 2097152 is past its end",
        ));
    // A host source of u64::MAX bytes into a file: a range no file can hold, refused before
    // any allocation (not an abort).
    refused(
        gdx()
            .args([
                "cp",
                "host",
                dir.path().join("x").to_str().unwrap(),
                "--length",
                "18446744073709551615",
            ])
            .timeout(std::time::Duration::from_secs(30))
            .assert(),
        "past the largest file offset",
    );
    assert!(!dir.path().join("x").exists());
    // A FIFO has no size and would block the reader: refused without opening it.
    let fifo = dir.path().join("fifo");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    gdx()
        .args(["cp", fifo.to_str().unwrap(), "host"])
        .timeout(std::time::Duration::from_secs(30))
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "(a FIFO): gdx reads and writes files by range",
        ));
    refused(
        gdx()
            .args(["cp", "/dev/zero", "host"])
            .timeout(std::time::Duration::from_secs(30))
            .assert(),
        "(a character device)",
    );
}

/// A write that fails half way (here: the file-size limit, which the kernel reports as EFBIG the
/// way a full disk reports ENOSPC) removes the file the copy created.
#[test]
fn a_failed_write_leaves_no_partial_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("partial.bin");
    let gdx_bin = assert_cmd::cargo::cargo_bin("gdx");
    // `trap "" XFSZ` ignores the signal, which exec keeps, so write(2) fails with EFBIG.
    let script = format!(
        "trap '' XFSZ; ulimit -f 256; exec {} cp host {} --length 4MiB --chunk 64K",
        gdx_bin.display(),
        out.display()
    );
    let o = std::process::Command::new("bash")
        .args(["-c", &script])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("removed the partial file"), "{err}");
    assert!(!out.exists(), "the partial file is still there");
}

#[test]
fn quiet_prints_nothing_on_success_and_color_is_a_choice() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("q.bin");
    std::fs::write(&p, pattern(8192, 6)).unwrap();
    gdx()
        .args(["cp", p.to_str().unwrap(), "host", "--verify", "-q"])
        .assert()
        .success()
        .stdout(predicate::str::is_empty());
    gdx()
        .args([
            "cp",
            p.to_str().unwrap(),
            "host",
            "--verify",
            "--color",
            "always",
        ])
        .assert()
        .success()
        .stdout(predicate::str::contains("\x1b[32mok\x1b[0m"));
    gdx()
        .args([
            "cp",
            p.to_str().unwrap(),
            "host",
            "--verify",
            "--color",
            "never",
        ])
        .assert()
        .success()
        .stdout(predicate::str::contains("\x1b[").not());
}

/// A safetensors file written by gdx-storage: `(path, data section bytes)`.
fn checkpoint(dir: &std::path::Path, name: &str, tensors: &[(&str, u64)]) -> std::path::PathBuf {
    use gdx_storage::safetensors::{save, Dtype, TensorSpec};
    let specs: Vec<TensorSpec> = tensors
        .iter()
        .map(|&(n, elems)| TensorSpec {
            name: n.into(),
            dtype: Dtype::F32,
            shape: vec![elems],
            len: elems * 4,
        })
        .collect();
    let data: Vec<Vec<u8>> = specs.iter().map(|s| pattern(s.len as usize, 7)).collect();
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let p = dir.join(name);
    save(&p, &specs, &refs, &Default::default(), &Default::default()).unwrap();
    p
}

#[test]
fn safetensors_checkpoints_load_with_a_per_tensor_summary() {
    let dir = tempfile::tempdir().unwrap();
    checkpoint(
        dir.path(),
        "model-00001-of-00002.safetensors",
        &[("layer.0.w", 300_000), ("b", 3)],
    );
    checkpoint(
        dir.path(),
        "model-00002-of-00002.safetensors",
        &[("layer.1.w", 1000)],
    );
    gdx()
        .args([
            "cp",
            "--safetensors",
            "--verify",
            "--chunk",
            "64K",
            &dir.path().display().to_string(),
            "host",
        ])
        .assert()
        .success()
        .stdout(predicate::str::contains("2 file(s), 3 tensor(s) -> host"))
        .stdout(predicate::str::is_match(r"layer\.0\.w +F32 +\[300000\] +12 +1\.14 MiB").unwrap())
        .stdout(predicate::str::contains("verify ok"))
        .stdout(predicate::str::contains("in the page cache (mincore)"));
    let out = gdx()
        .args([
            "cp",
            "--safetensors",
            "--json",
            &dir.path().display().to_string(),
            "host",
        ])
        .assert()
        .success();
    let v: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    assert_eq!(v["bytes"], 300_003 * 4 + 4000);
    assert_eq!(v["files"][1]["tensors"][0]["name"], "layer.1.w");
    assert!(v["files"][0]["split"]["page_cache"].as_u64().unwrap() > 0);
}

#[test]
fn a_hostile_safetensors_header_is_refused_before_any_copy() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.safetensors");
    let json = br#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(json);
    bytes.extend_from_slice(&[0u8; 12]);
    std::fs::write(&p, bytes).unwrap();
    gdx()
        .args(["cp", "--safetensors", &p.display().to_string(), "host"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "is not a valid safetensors checkpoint",
        ))
        .stderr(predicate::str::contains("overlap"));
}

/// `--seek` near 2^64 once wrapped around: exit 0, "copied 8 KiB", nothing written. Now the
/// range is checked before the file is opened, and the file is left untouched.
#[test]
fn seek_overflow_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x");
    std::fs::write(&out, b"keep").unwrap();
    gdx()
        .args([
            "cp",
            "host",
            &format!("file:{}", out.display()),
            "--length",
            "8192",
            "--seek",
            "18446744073709547520",
        ])
        .timeout(std::time::Duration::from_secs(30))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("past the largest file offset"));
    assert_eq!(std::fs::read(&out).unwrap(), b"keep");
    // Past i64::MAX (the kernel's off_t) but not past u64::MAX: refused the same way.
    gdx()
        .args(["cp", "host", out.to_str().unwrap(), "--length", "8192"])
        .args(["--seek", &(i64::MAX as u64).to_string()])
        .timeout(std::time::Duration::from_secs(30))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("past the largest file offset"));
}

/// A FIFO (or a character device) as the destination is refused before it is opened: opening
/// a FIFO for writing used to block until a reader came, forever.
#[test]
fn fifo_and_device_destinations_are_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let t0 = std::time::Instant::now();
    gdx()
        .args(["cp", "host", fifo.to_str().unwrap(), "--length", "4096"])
        .timeout(std::time::Duration::from_secs(20))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("(a FIFO)"));
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(20),
        "gdx cp into a FIFO must not wait for a reader"
    );
    gdx()
        .args(["cp", "host", "/dev/null", "--length", "4096"])
        .timeout(std::time::Duration::from_secs(20))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("(a character device)"));
}

/// What a hostile file may name its tensors: ESC, BEL, an OSC title, CSI as one C1 byte, NEL.
const HOSTILE: &str = "w\u{1b}[2Jx\u{7}y\u{1b}]0;pwned\u{7}z\u{9b}31m\u{85}.";

fn raw_controls(b: &[u8]) -> Vec<char> {
    String::from_utf8_lossy(b)
        .chars()
        .filter(|&c| c.is_control() && c != '\n')
        .collect()
}

#[test]
fn foreign_text_in_a_checkpoint_reaches_the_terminal_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("ckpt\u{1b}[31m");
    std::fs::create_dir(&sub).unwrap();
    checkpoint(&sub, "m\u{9d}.safetensors", &[(HOSTILE, 4), ("plain", 2)]);
    for json in [false, true] {
        let mut args = vec![
            "cp".to_string(),
            "--safetensors".into(),
            sub.display().to_string(),
            "host".into(),
        ];
        if json {
            args.push("--json".into());
        }
        let out = gdx().args(&args).assert().success();
        let o = out.get_output();
        let text = [o.stdout.as_slice(), o.stderr.as_slice()].concat();
        assert!(
            raw_controls(&text).is_empty(),
            "json {json}: {:?}",
            String::from_utf8_lossy(&text)
        );
        if json {
            // The same value, escaped as JSON: the name round-trips.
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            assert_eq!(v["files"][0]["tensors"][1]["name"], HOSTILE);
        } else {
            assert!(String::from_utf8_lossy(&o.stdout).contains("\\u{1b}]0;pwned\\u{7}z\\u{9b}31m"));
        }
    }
    // A refusal quoting the hostile name is escaped too.
    let p = dir.path().join("bad.safetensors");
    let json = format!(
        r#"{{"{}":{{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}}}"#,
        "n\\u001b]0;x\\u0007\\u009b"
    );
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(json.as_bytes());
    bytes.extend_from_slice(&[0u8; 8]);
    std::fs::write(&p, bytes).unwrap();
    let out = gdx()
        .args(["cp", "--safetensors", &p.display().to_string(), "host"])
        .assert()
        .code(2);
    let e = &out.get_output().stderr;
    assert!(
        raw_controls(e).is_empty(),
        "{:?}",
        String::from_utf8_lossy(e)
    );
}

#[test]
fn a_fifo_as_a_checkpoint_or_index_is_refused_without_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("f.safetensors");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let index = dir.path().join("x.index.json");
    std::os::unix::fs::symlink("/dev/zero", &index).unwrap();
    for (p, what) in [(&fifo, "a FIFO"), (&index, "a character device")] {
        gdx()
            .args(["cp", "--safetensors", &p.display().to_string(), "host"])
            .timeout(std::time::Duration::from_secs(60))
            .assert()
            .code(2)
            .stderr(predicate::str::contains(what));
    }
}
