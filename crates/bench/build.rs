//! Records the git commit the crate is built from as `GDX_GIT_HASH` (absent outside a git
//! checkout), for the run header of `gdx bench`.
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=../../.git/HEAD");
    println!("cargo:rerun-if-changed=../../.git/index");
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
