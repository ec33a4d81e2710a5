//! `nccl-env`: `NCCL_*` environment variables that disable or force data paths. They are easy
//! to inherit from a job script or container image and silently change which path NCCL takes.
//! Reads the injected environment, never `std::env`, so tests control it.

use super::distance::parse_level;
use super::Check;
use crate::context::Context;
use crate::finding::{Finding, Status};

/// The `nccl-env` check.
pub struct NcclEnv;

/// What a variable's value does: `(status, what it does, fix)`, or `None` when harmless.
pub fn judge(var: &str, value: &str) -> Option<(Status, String, String)> {
    let v = value.trim();
    let unset = format!("unset {var}");
    let on = |x: &str| x == "1" || x.eq_ignore_ascii_case("true");
    let r = match var {
        "NCCL_P2P_DISABLE" if on(v) => (
            Status::Fail,
            "disables GPU peer-to-peer (NVLink and PCIe P2P): GPU pairs go through host memory".to_string(),
            unset,
        ),
        "NCCL_P2P_LEVEL" => match parse_level(v) {
            Some(0) => (Status::Fail, "P2P level LOC disables GPU peer-to-peer".into(), unset),
            _ => (Status::Warn, format!("overrides NCCL's P2P distance limit ({v})"), unset),
        },
        "NCCL_NET_GDR_LEVEL" => match parse_level(v) {
            Some(0) => (Status::Fail, "GDR level LOC disables GPUDirect RDMA: NIC traffic is staged through host memory".into(), unset),
            Some(l) if l >= 3 => (Status::Warn, format!("forces GPUDirect RDMA across host bridges ({v}): NIC DMA crosses the root complex"), unset),
            _ => (Status::Warn, format!("overrides NCCL's GPUDirect RDMA distance limit ({v})"), unset),
        },
        "NCCL_NET_GDR_READ" if v == "0" => (
            Status::Warn,
            "turns off GPUDirect RDMA for sends (NIC reads of GPU memory): sends are staged".into(),
            unset,
        ),
        "NCCL_IB_DISABLE" if on(v) => (
            Status::Fail,
            "disables the InfiniBand/RoCE transport: NCCL falls back to TCP sockets".into(),
            unset,
        ),
        "NCCL_NET" if v.eq_ignore_ascii_case("socket") => (
            Status::Fail,
            "forces the TCP socket transport: no RDMA, no GPUDirect RDMA".into(),
            unset,
        ),
        "NCCL_SHM_DISABLE" if on(v) => (
            Status::Warn,
            "disables the shared-memory transport between processes on one host".into(),
            unset,
        ),
        "NCCL_DMABUF_ENABLE" if v == "0" => (
            Status::Warn,
            "disables dma-buf registration: GPUDirect RDMA then needs nvidia-peermem".into(),
            unset,
        ),
        "NCCL_NVLS_ENABLE" if v == "0" => (
            Status::Warn,
            "disables NVLink SHARP (NVLS) collectives (fine where multicast is unsupported)".into(),
            "unset it where NVSwitch multicast works".into(),
        ),
        "NCCL_NET_GDR_C2C" if v == "0" => (
            Status::Warn,
            "disables GPUDirect RDMA over C2C on Grace systems".into(),
            unset,
        ),
        "NCCL_IB_PCI_RELAXED_ORDERING" if v == "0" => (
            Status::Warn,
            "disables PCIe relaxed ordering for NCCL's RDMA registrations".into(),
            unset,
        ),
        "NCCL_TOPO_FILE" => (
            Status::Warn,
            format!("NCCL reads the topology from {v} instead of detecting it; a stale file misplaces GPUs and NICs"),
            "make sure the file matches this machine (compare with `gdx topo --nccl-xml`)".into(),
        ),
        _ => return None,
    };
    Some(r)
}

impl Check for NcclEnv {
    fn id(&self) -> &'static str {
        "nccl-env"
    }
    fn title(&self) -> &'static str {
        "no NCCL_* variable disables or forces a data path"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        let vars: Vec<(&String, &String)> = ctx
            .env_all()
            .iter()
            .filter(|(k, _)| k.starts_with("NCCL_"))
            .collect();
        let mut out = Vec::new();
        let mut harmless = Vec::new();
        for (k, v) in &vars {
            match judge(k, v) {
                Some((st, msg, fix)) => out.push(
                    Finding::with_status(id, st, k.as_str(), format!("{k}={v} {msg}"))
                        .evidence(format!("{}: {k}={v}", ctx.env_origin()))
                        .fix(fix),
                ),
                None => harmless.push(format!("{k}={v}")),
            }
        }
        if out.is_empty() {
            let mut msg = if vars.is_empty() {
                "no NCCL_* variables set".to_string()
            } else {
                format!(
                    "{} NCCL_* variable(s) set, none disables or forces a path",
                    vars.len()
                )
            };
            if ctx.env_origin() != "environment" {
                msg.push_str(&format!(" ({})", ctx.env_origin()));
            }
            out.push(Finding::pass(id, "host", msg).evidence_all(harmless));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{run, subject, Tree};

    #[test]
    fn disabling_variables_fail_harmless_pass() {
        let t = Tree::new();
        let fs = run(&NcclEnv, &t.ctx().build());
        assert_eq!(fs[0].status, Status::Pass);
        let fs = run(
            &NcclEnv,
            &t.ctx()
                .env("NCCL_DEBUG", "INFO")
                .env("PATH", "/bin")
                .build(),
        );
        assert_eq!(fs[0].status, Status::Pass);
        assert_eq!(fs[0].evidence, ["NCCL_DEBUG=INFO"]);
        let fs = run(
            &NcclEnv,
            &t.ctx()
                .env("NCCL_P2P_DISABLE", "1")
                .env("NCCL_NET_GDR_LEVEL", "SYS")
                .env("NCCL_NET", "Socket")
                .env("NCCL_DEBUG", "INFO")
                .build(),
        );
        assert_eq!(fs.len(), 3, "{fs:#?}");
        assert_eq!(subject(&fs, "NCCL_P2P_DISABLE").status, Status::Fail);
        assert_eq!(subject(&fs, "NCCL_NET_GDR_LEVEL").status, Status::Warn);
        assert_eq!(subject(&fs, "NCCL_NET").status, Status::Fail);
        assert_eq!(
            subject(&fs, "NCCL_P2P_DISABLE").fix.as_deref(),
            Some("unset NCCL_P2P_DISABLE")
        );
    }

    #[test]
    fn judge_levels() {
        assert_eq!(judge("NCCL_NET_GDR_LEVEL", "0").unwrap().0, Status::Fail);
        assert_eq!(judge("NCCL_P2P_DISABLE", "0"), None);
        assert_eq!(judge("NCCL_NVLS_ENABLE", "0").unwrap().0, Status::Warn);
    }
}
