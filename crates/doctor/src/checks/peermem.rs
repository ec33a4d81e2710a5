//! `peermem`: a peer-memory client (nvidia_peermem, or legacy nv_peer_mem) is loaded, so
//! `ibv_reg_mr` works on `cudaMalloc` memory. Detection is exactly NCCL's (`gdr.cc`): any of
//! three sysfs files counts. Without it and without dma-buf, NCCL silently stages through host
//! memory at about half the bandwidth (gdr-checks A1).

use super::dmabuf::{self, Outlook};
use super::Check;
use crate::context::Context;
use crate::finding::Finding;

/// The `peermem` check.
pub struct PeerMem;

/// The files NCCL accepts as "a peer-memory client is loaded", in its order.
pub const PEERMEM_FILES: [&str; 3] = [
    "sys/kernel/mm/memory_peers/nv_mem/version",
    "sys/kernel/mm/memory_peers/nv_mem_nc/version",
    "sys/module/nvidia_peermem/version",
];

/// The first peer-memory file present, with its content.
pub fn loaded(ctx: &Context) -> Option<(&'static str, String)> {
    PEERMEM_FILES
        .iter()
        .find(|f| ctx.fs.exists(f))
        .map(|f| (*f, ctx.fs.text(f).unwrap_or_default()))
}

impl Check for PeerMem {
    fn id(&self) -> &'static str {
        "peermem"
    }
    fn title(&self) -> &'static str {
        "nvidia_peermem / nv_peer_mem loaded (GPU memory registration with ibv_reg_mr)"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        let found = loaded(ctx);
        let ev: Vec<String> = match &found {
            Some((f, v)) => vec![format!("{}: {v}", ctx.fs.show(f))],
            None => PEERMEM_FILES
                .iter()
                .map(|f| format!("{}: not found", ctx.fs.show(f)))
                .collect(),
        };
        if ctx.gpus().is_empty() {
            return vec![Finding::skip(id, "host", ctx.no_gpu_reason()).evidence_all(ev)];
        }
        if ctx.rdma().is_empty() {
            return vec![Finding::skip(
                id,
                "host",
                "no RDMA device: peer-memory registration is not needed",
            )
            .evidence_all(ev)];
        }
        let f = match found {
            Some((f, _)) if f.contains("nvidia_peermem") => {
                Finding::pass(id, "host", "nvidia_peermem is loaded")
            }
            Some(_) => Finding::pass(
                id,
                "host",
                "legacy nv_peer_mem is loaded (GDAKI/IBGDA and NCCL GIN need nvidia_peermem specifically)",
            ),
            None => {
                let fix = "`modprobe nvidia-peermem` and `echo nvidia-peermem > /etc/modules-load.d/nvidia-peermem.conf` (needs an ib_core with PeerDirect: MLNX_OFED/DOCA-OFED; GPU Operator: driver.rdma.enabled=true); or use dma-buf instead";
                match dmabuf::outlook(ctx) {
                    Outlook::Works(why) | Outlook::Likely(why) => Finding::warn(
                        id,
                        "host",
                        "no peer-memory client loaded; GPUDirect RDMA can use dma-buf instead, but GDAKI/IBGDA/NVSHMEM need nvidia_peermem",
                    )
                    .evidence(format!("dma-buf: {why}"))
                    .fix(fix),
                    Outlook::No(why) | Outlook::Unknown(why) => Finding::fail(
                        id,
                        "host",
                        "no peer-memory client loaded and dma-buf not shown to work: NCCL stages GPU traffic through host memory",
                    )
                    .evidence(format!("dma-buf: {why}"))
                    .fix(fix),
                }
            }
        };
        vec![f.evidence_all(ev)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{run, Tree};
    use crate::Status;

    fn tree() -> Tree {
        Tree::with_gpu_and_ib_nic()
    }

    #[test]
    fn present_passes() {
        let t = tree();
        t.file("sys/module/nvidia_peermem/version", "580.159.04\n");
        let fs = run(&PeerMem, &t.ctx().build());
        assert_eq!(fs[0].status, Status::Pass);
        assert!(fs[0].evidence[0].ends_with("nvidia_peermem/version: 580.159.04"));
    }

    #[test]
    fn legacy_counts_like_nccl() {
        let t = tree();
        t.file("sys/kernel/mm/memory_peers/nv_mem/version", "1.2\n");
        let fs = run(&PeerMem, &t.ctx().build());
        assert_eq!(fs[0].status, Status::Pass);
        assert!(fs[0].message.contains("legacy"));
    }

    #[test]
    fn absent_fails_without_dmabuf_and_warns_with_it() {
        let t = tree();
        let fs = run(&PeerMem, &t.ctx().build());
        assert_eq!(fs[0].status, Status::Fail, "{fs:#?}");
        assert!(fs[0]
            .fix
            .as_deref()
            .unwrap()
            .contains("modprobe nvidia-peermem"));
        // Open kernel module + kernel >= 5.12: dma-buf is likely there.
        t.file(
            "proc/driver/nvidia/version",
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build\n",
        );
        t.file("proc/sys/kernel/osrelease", "6.8.0-45-generic\n");
        let fs = run(&PeerMem, &t.ctx().build());
        assert_eq!(fs[0].status, Status::Warn, "{fs:#?}");
    }

    #[test]
    fn skip_without_rdma() {
        let t = Tree::new();
        t.gpu("pci0000:00", &[], "0000:00:06.0");
        let fs = run(&PeerMem, &t.ctx().build());
        assert_eq!(fs[0].status, Status::Skip);
    }
}
