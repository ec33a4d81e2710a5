//! `cufile`: GPUDirect Storage mode. With the nvidia-fs module cuFile DMAs between storage and
//! GPU memory; without it cuFile runs in compatibility mode (POSIX I/O through host bounce
//! buffers), or fails outright when `allow_compat_mode` is false in cufile.json.

use super::Check;
use crate::context::Context;
use crate::facts::{DriverOpen, UnavailableKind};
use crate::finding::Finding;

/// The `cufile` check.
pub struct Cufile;

/// Where cuFile's config and library usually live, relative to the root.
const CONFIGS: [&str; 2] = ["etc/cufile.json", "usr/local/cuda/gds/cufile.json"];
const LIB_DIRS: [&str; 4] = [
    "usr/local/cuda/targets/x86_64-linux/lib",
    "usr/local/cuda/targets/sbsa-linux/lib",
    "usr/local/cuda/lib64",
    "usr/lib/x86_64-linux-gnu",
];

/// `allow_compat_mode` from a cufile.json (which allows `//` comments, so it is scanned
/// line by line rather than parsed as JSON).
pub fn allow_compat_mode(text: &str) -> Option<bool> {
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .find_map(|l| {
            let rest = l.split("\"allow_compat_mode\"").nth(1)?;
            let v = rest.trim_start().strip_prefix(':')?.trim_start();
            if v.starts_with("true") {
                Some(true)
            } else if v.starts_with("false") {
                Some(false)
            } else {
                None
            }
        })
}

impl Check for Cufile {
    fn id(&self) -> &'static str {
        "cufile"
    }
    fn title(&self) -> &'static str {
        "GPUDirect Storage: nvidia-fs loaded (GDS mode) or cuFile compatibility mode"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        if ctx.gpus().is_empty() {
            return vec![Finding::skip(id, "host", ctx.no_gpu_reason())];
        }
        let mut out = self.mode(ctx);
        // Only where cuFile is there at all: the udev data matters to nobody else.
        if out.iter().any(|f| f.status != crate::finding::Status::Skip) {
            out.extend(udev_finding(id, ctx));
        }
        out
    }
}

/// cuFile identifies a file's file system through udev (`ID_FS_USAGE`, `ID_FS_TYPE` of the
/// block device). Where the udev database lacks them — containers and microVMs without udevd,
/// such as the GPU test machine — cuFile refuses to register every file, even in compatibility
/// mode (`CU_FILE_HANDLE_NOT_REGISTERED`). Read from the root file system's device number in
/// `proc/self/mountinfo` and `run/udev/data/b<major>:<minor>`; nothing when mountinfo is absent
/// (a capture does not hold it).
fn udev_finding(id: &str, ctx: &Context) -> Option<Finding> {
    let info = ctx.fs.text("proc/self/mountinfo")?;
    let (majmin, source) = info.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        // Fields: id parent major:minor root mountpoint ... - fstype source options
        if f.get(4) != Some(&"/") {
            return None;
        }
        let dash = f.iter().position(|x| *x == "-")?;
        Some((
            f.get(2)?.to_string(),
            f.get(dash + 2).copied().unwrap_or("?").to_string(),
        ))
    })?;
    if majmin.starts_with("0:") {
        // Not a block device (overlayfs, tmpfs): cuFile has nothing to look up there.
        return None;
    }
    let rel = format!("run/udev/data/b{majmin}");
    let evidence = format!("proc/self/mountinfo: / is on {source} ({majmin})");
    Some(match ctx.fs.text(&rel) {
        Some(t) if t.contains("ID_FS_USAGE=") => Finding::pass(
            id,
            "udev",
            format!("udev describes {source}'s file system: cuFile can register files on /"),
        )
        .evidence(evidence)
        .evidence(format!("{}: ID_FS_USAGE present", ctx.fs.show(&rel))),
        _ => Finding::warn(
            id,
            "udev",
            format!(
                "udev has no ID_FS_USAGE for {source} ({majmin}): cuFile will refuse to register files on / (CU_FILE_HANDLE_NOT_REGISTERED), even in compatibility mode"
            ),
        )
        .evidence(evidence)
        .evidence(format!("{}: missing or without ID_FS_USAGE", ctx.fs.show(&rel)))
        .fix("run udevd (or `udevadm trigger --subsystem-match=block`) so blkid properties exist; in a container, bind-mount the host's /run/udev; or use `gdx cp --path file-staged`, which needs no cuFile"),
    })
}

impl Cufile {
    fn mode(&self, ctx: &Context) -> Vec<Finding> {
        let id = "cufile";
        let mut ev = Vec::new();
        let nvfs = ctx.fs.exists("sys/module/nvidia_fs");
        let nvfs_ver = ctx
            .fs
            .text("proc/driver/nvidia-fs/version")
            .or_else(|| ctx.fs.text("sys/module/nvidia_fs/version"));
        ev.push(match (&nvfs_ver, nvfs) {
            (Some(v), _) => format!("nvidia-fs loaded: {}", v.lines().next().unwrap_or("")),
            (None, true) => format!("{} exists", ctx.fs.show("sys/module/nvidia_fs")),
            (None, false) => format!(
                "{}: not found (nvidia-fs not loaded)",
                ctx.fs.show("sys/module/nvidia_fs")
            ),
        });
        let nvfs = nvfs || nvfs_ver.is_some();
        let config = CONFIGS.iter().find_map(|c| Some((*c, ctx.fs.text(c)?)));
        let compat_allowed = config.as_ref().and_then(|(_, t)| allow_compat_mode(t));
        if let Some((c, _)) = &config {
            ev.push(format!(
                "{}: allow_compat_mode {}",
                ctx.fs.show(c),
                compat_allowed
                    .map(|b| b.to_string())
                    .unwrap_or_else(|| "not set (default true)".into())
            ));
        }
        let lib = LIB_DIRS.iter().find_map(|d| {
            ctx.fs
                .names_or_empty(d)
                .into_iter()
                .find(|n| n.starts_with("libcufile.so"))
                .map(|n| ctx.fs.show(&format!("{d}/{n}")))
        });
        if let Some(l) = &lib {
            ev.push(format!("found {l}"));
        }
        let live = ctx.live().ok().map(|l| &l.cufile);
        if let Some(Ok(c)) = live {
            match &c.driver_open {
                Some(DriverOpen::Opened) => ev.push("cuFileDriverOpen: ok".to_string()),
                Some(DriverOpen::Refused(e)) => ev.push(format!("cuFileDriverOpen: {e}")),
                None => {}
            }
            if let Some(v) = &c.version {
                ev.push(format!("cuFile {v}"));
            }
            if let Some(v) = &c.nvfs_version {
                ev.push(format!("cuFileDriverGetProperties: nvidia-fs {v}"));
            }
            if let Some(DriverOpen::Refused(e)) = &c.driver_open {
                return vec![Finding::fail(id, "host", format!("cuFile cannot open its driver: {e}"))
                    .evidence_all(ev)
                    .fix("load nvidia-fs (`modprobe nvidia-fs`) or set \"allow_compat_mode\": true in /etc/cufile.json")];
            }
            let gds = c.compat_mode == Some(false)
                || (c.compat_mode.is_none() && (nvfs || c.nvfs_version.is_some()));
            return vec![if gds {
                Finding::pass(
                    id,
                    "host",
                    "cuFile runs in GDS mode (nvidia-fs): storage DMAs straight to GPU memory",
                )
            } else {
                compat(id)
            }
            .evidence_all(ev)];
        }
        if let Some(Err(u)) = live {
            if u.kind != UnavailableKind::NotQueried {
                ev.push(u.to_string());
            }
        }
        let installed = lib.is_some() || config.is_some() || nvfs;
        let f = if nvfs {
            Finding::pass(
                id,
                "host",
                "nvidia-fs is loaded: cuFile can run in GDS mode",
            )
        } else if !installed {
            Finding::skip(id, "host", "GPUDirect Storage is not installed (no nvidia-fs module, no cufile.json, no libcufile)")
        } else if compat_allowed == Some(false) {
            Finding::fail(
                id,
                "host",
                "nvidia-fs is not loaded and cufile.json forbids compatibility mode: cuFile I/O will fail",
            )
            .fix("load nvidia-fs (`modprobe nvidia-fs`) or set \"allow_compat_mode\": true")
        } else {
            compat(id)
        };
        vec![f.evidence_all(ev)]
    }
}

fn compat(id: &str) -> Finding {
    Finding::warn(
        id,
        "host",
        "cuFile runs in compatibility mode (no nvidia-fs): file I/O is staged through host bounce buffers",
    )
    .fix("install and load nvidia-fs (`modprobe nvidia-fs`, part of the GDS package) on a supported filesystem for direct storage-to-GPU DMA")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::CufileFacts;
    use crate::testutil::{cuda_facts, run, Tree};
    use crate::Status;

    fn tree() -> Tree {
        let t = Tree::new();
        t.gpu("pci0000:00", &[], "0000:00:06.0");
        t
    }

    #[test]
    fn compat_mode_config_parse() {
        let j = "{\n  // \"allow_compat_mode\": false,\n  \"properties\": {\n    \"allow_compat_mode\" : true,\n  }\n}";
        assert_eq!(allow_compat_mode(j), Some(true));
        assert_eq!(allow_compat_mode("{}"), None);
    }

    #[test]
    fn nvidia_fs_loaded_passes() {
        let t = tree();
        t.file("sys/module/nvidia_fs/version", "2.20.5\n");
        let fs = run(&Cufile, &t.ctx().build());
        assert_eq!(fs[0].status, Status::Pass);
    }

    #[test]
    fn library_without_nvidia_fs_is_compat_mode() {
        let t = tree();
        t.file("usr/local/cuda/targets/x86_64-linux/lib/libcufile.so.0", "");
        let fs = run(&Cufile, &t.ctx().build());
        assert_eq!(fs[0].status, Status::Warn);
        assert!(fs[0].message.contains("compatibility mode"));
        t.file(
            "etc/cufile.json",
            "{ \"properties\": { \"allow_compat_mode\": false } }",
        );
        assert_eq!(run(&Cufile, &t.ctx().build())[0].status, Status::Fail);
    }

    #[test]
    fn live_driver_open_failure_fails_and_nothing_installed_skips() {
        let t = tree();
        let mut f = cuda_facts(&["0000:00:06.0"]);
        f.cufile = Ok(CufileFacts {
            version: Some("1.15".into()),
            driver_open: Some(DriverOpen::Refused("CU_FILE_DRIVER_NOT_INITIALIZED".into())),
            nvfs_version: None,
            compat_mode: None,
        });
        assert_eq!(
            run(&Cufile, &t.ctx().live(f.clone()).build())[0].status,
            Status::Fail
        );
        if let Ok(c) = f.cufile.as_mut() {
            c.driver_open = Some(DriverOpen::Opened);
            c.compat_mode = Some(true);
        }
        let fs = run(&Cufile, &t.ctx().live(f).build());
        assert_eq!(fs[0].status, Status::Warn);
        assert_eq!(run(&Cufile, &t.ctx().build())[0].status, Status::Skip);
    }

    const MOUNTINFO: &str = "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n";

    #[test]
    fn udev_without_fs_usage_warns_and_with_it_passes() {
        let t = tree();
        t.file("usr/local/cuda/targets/x86_64-linux/lib/libcufile.so.0", "");
        t.file("proc/self/mountinfo", MOUNTINFO);
        let fs = run(&Cufile, &t.ctx().build());
        let u = fs
            .iter()
            .find(|f| f.subject == "udev")
            .expect("a udev finding");
        assert_eq!(u.status, Status::Warn);
        assert!(u.message.contains("/dev/vda"), "{}", u.message);
        t.file(
            "run/udev/data/b254:0",
            "E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4\n",
        );
        let fs = run(&Cufile, &t.ctx().build());
        let u = fs.iter().find(|f| f.subject == "udev").unwrap();
        assert_eq!(u.status, Status::Pass);
    }

    #[test]
    fn udev_is_not_judged_without_mountinfo_cufile_or_a_block_device() {
        let t = tree();
        t.file("proc/self/mountinfo", MOUNTINFO);
        // No cuFile installed: the cufile check skips, and says nothing about udev.
        let fs = run(&Cufile, &t.ctx().build());
        assert!(fs.iter().all(|f| f.subject != "udev"));
        t.file("usr/local/cuda/targets/x86_64-linux/lib/libcufile.so.0", "");
        t.file(
            "proc/self/mountinfo",
            "22 1 0:31 / / rw - overlay overlay rw\n",
        );
        let fs = run(&Cufile, &t.ctx().build());
        assert!(fs.iter().all(|f| f.subject != "udev"));
    }
}
