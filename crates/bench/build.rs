//! Records the git commit the crate is built from as `GDX_GIT_HASH` (absent outside a git
//! checkout) and the UTC build date as `GDX_BUILD_DATE`, for the run header of `gdx bench` and
//! `gdx --version` (which reads them through `gdx_bench::header`).
use std::process::Command;

fn main() {
    // `SOURCE_DATE_EPOCH` (reproducible builds) wins over the clock.
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    let mut date = Command::new("date");
    if let Ok(epoch) = std::env::var("SOURCE_DATE_EPOCH") {
        date.arg(format!("--date=@{epoch}"));
    }
    if let Ok(o) = date.args(["-u", "+%Y-%m-%d"]).output() {
        if o.status.success() {
            let d = String::from_utf8_lossy(&o.stdout).trim().to_string();
            println!("cargo:rustc-env=GDX_BUILD_DATE={d}");
        }
    }
    println!("cargo:rerun-if-changed=../../.git/HEAD");
    println!("cargo:rerun-if-changed=../../.git/index");
    // A commit moves the branch HEAD names, not HEAD itself: watch that ref too (else the
    // hash stays the one of the commit the crate was first built at).
    if let Ok(head) = std::fs::read_to_string("../../.git/HEAD") {
        if let Some(r) = head.trim().strip_prefix("ref: ") {
            println!("cargo:rerun-if-changed=../../.git/{r}");
        }
    }
    println!("cargo:rerun-if-changed=../../.git/packed-refs");
    let out = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output();
    if let Ok(o) = out {
        if o.status.success() {
            let hash = String::from_utf8_lossy(&o.stdout).trim().to_string();
            let dirty = Command::new("git")
                .args(["status", "--porcelain", "--untracked-files=no"])
                .output()
                .map(|d| !d.stdout.is_empty())
                .unwrap_or(false);
            let suffix = if dirty { "-dirty" } else { "" };
            println!("cargo:rustc-env=GDX_GIT_HASH={hash}{suffix}");
        }
    }
}
