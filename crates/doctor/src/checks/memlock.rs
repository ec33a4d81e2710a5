//! `memlock`: `RLIMIT_MEMLOCK` from `/proc/self/limits`. Registering host bounce buffers and
//! GPU memory with verbs fails with ENOMEM under a small limit, common in containers and
//! systemd units (gdr-checks A4). It matters only where RDMA devices are used.

use super::Check;
use crate::context::Context;
use crate::finding::Finding;

/// The `memlock` check.
pub struct Memlock;

/// A limit value: `None` = unlimited.
pub type Limit = Option<u64>;

/// `(soft, hard)` of "Max locked memory" from a limits file.
pub fn parse_limits(text: &str) -> Option<(Limit, Limit)> {
    let line = text.lines().find(|l| l.starts_with("Max locked memory"))?;
    let rest = line.trim_start_matches("Max locked memory");
    let mut it = rest.split_whitespace();
    let parse = |t: &str| -> Option<Limit> {
        if t == "unlimited" {
            Some(None)
        } else {
            t.parse().ok().map(Some)
        }
    };
    Some((parse(it.next()?)?, parse(it.next()?)?))
}

fn show(l: Limit) -> String {
    match l {
        None => "unlimited".into(),
        Some(b) if b >= 1 << 20 => format!("{} MiB", b >> 20),
        Some(b) => format!("{} KiB", b >> 10),
    }
}

impl Check for Memlock {
    fn id(&self) -> &'static str {
        "memlock"
    }
    fn title(&self) -> &'static str {
        "locked-memory limit (ulimit -l) is unlimited"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        let rel = "proc/self/limits";
        let text = match ctx.fs.file_text(rel) {
            Ok(t) => t,
            Err(e) => {
                return vec![Finding::skip(
                    id,
                    "host",
                    format!("cannot read limits: {e}"),
                )]
            }
        };
        let Some((soft, hard)) = parse_limits(&text) else {
            return vec![Finding::skip(
                id,
                "host",
                format!("{}: no \"Max locked memory\" line", ctx.fs.show(rel)),
            )];
        };
        let ev = format!(
            "{}: Max locked memory soft {} hard {}",
            ctx.fs.show(rel),
            show(soft),
            show(hard)
        );
        let fix = "set `* soft memlock unlimited` and `* hard memlock unlimited` in /etc/security/limits.conf, `LimitMEMLOCK=infinity` for systemd units, `--ulimit memlock=-1` for docker";
        let f = match soft {
            None => Finding::pass(id, "host", "locked memory is unlimited"),
            Some(_) if ctx.rdma().is_empty() => Finding::warn(
                id,
                "host",
                format!("locked memory is limited to {} (matters once RDMA devices are used; none here)", show(soft)),
            )
            .fix(fix),
            Some(_) => Finding::fail(
                id,
                "host",
                format!("locked memory is limited to {}: verbs registrations can fail with ENOMEM", show(soft)),
            )
            .fix(fix),
        };
        vec![f.evidence(ev)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{run, Tree};
    use crate::Status;

    const HDR: &str = "Limit                     Soft Limit           Hard Limit           Units     \nMax open files            1024                 4096                 files     \n";

    #[test]
    fn parses() {
        let t = format!(
            "{HDR}Max locked memory         8388608              unlimited            bytes     \n"
        );
        assert_eq!(parse_limits(&t), Some((Some(8 << 20), None)));
        assert_eq!(parse_limits("nothing"), None);
        assert_eq!(parse_limits("Max locked memory  lots"), None);
    }

    #[test]
    fn unlimited_passes_limited_fails_with_rdma() {
        let t = Tree::new();
        t.ib_nic();
        t.file(
            "proc/self/limits",
            format!(
                "{HDR}Max locked memory         unlimited            unlimited            bytes\n"
            ),
        );
        assert_eq!(run(&Memlock, &t.ctx().build())[0].status, Status::Pass);
        t.file(
            "proc/self/limits",
            format!(
                "{HDR}Max locked memory         65536                65536                bytes\n"
            ),
        );
        let fs = run(&Memlock, &t.ctx().build());
        assert_eq!(fs[0].status, Status::Fail);
        assert!(fs[0].message.contains("64 KiB"), "{}", fs[0].message);
    }

    #[test]
    fn limited_without_rdma_warns_and_missing_file_skips() {
        let t = Tree::new();
        assert_eq!(run(&Memlock, &t.ctx().build())[0].status, Status::Skip);
        t.file(
            "proc/self/limits",
            format!(
                "{HDR}Max locked memory         65536                65536                bytes\n"
            ),
        );
        assert_eq!(run(&Memlock, &t.ctx().build())[0].status, Status::Warn);
    }
}
