//! `gpu-nic-distance`: for each GPU, the path class to its nearest RDMA NIC. NCCL uses
//! GPUDirect RDMA only when that class is within `NCCL_NET_GDR_LEVEL` (default PXB on x86), so
//! a NIC behind another root port (PHB/NODE) or socket (SYS) silently means host staging
//! (gdr-checks B1). A flat VM bus makes everything PHB.

use super::Check;
use crate::context::{pair, Context};
use crate::finding::Finding;
use gdx_topo::PathClass;

/// The `gpu-nic-distance` check.
pub struct GpuNicDistance;

/// NCCL's level numbers: LOC 0, PIX 1, PXB 2, PHB 3 (NODE counts as PHB), SYS 4.
pub fn class_level(c: PathClass) -> u8 {
    match c {
        PathClass::X | PathClass::Nv(_) => 0,
        PathClass::Pix => 1,
        PathClass::Pxb => 2,
        PathClass::Phb | PathClass::Node => 3,
        PathClass::Sys => 4,
    }
}

/// Parse an `NCCL_*_LEVEL` value: a name or a legacy integer.
pub fn parse_level(v: &str) -> Option<u8> {
    match v.trim().to_ascii_uppercase().as_str() {
        "LOC" | "0" => Some(0),
        "PIX" | "1" => Some(1),
        "PXB" | "2" => Some(2),
        "PHB" | "3" => Some(3),
        "SYS" | "4" | "5" => Some(4),
        _ => None,
    }
}

/// NCCL's default GDR level on x86: PXB.
pub const DEFAULT_GDR_LEVEL: u8 = 2;

/// Whether NCCL would use GDR at this class, given the environment.
pub fn gdr_allowed(ctx: &Context, c: PathClass) -> bool {
    let level = ctx
        .env("NCCL_NET_GDR_LEVEL")
        .and_then(parse_level)
        .unwrap_or(DEFAULT_GDR_LEVEL);
    class_level(c) <= level
}

impl Check for GpuNicDistance {
    fn id(&self) -> &'static str {
        "gpu-nic-distance"
    }
    fn title(&self) -> &'static str {
        "each GPU has an RDMA NIC at PIX/PXB (NCCL's default GPUDirect RDMA level)"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        if ctx.gpus().is_empty() {
            return vec![Finding::skip(id, "host", ctx.no_gpu_reason())];
        }
        if ctx.rdma().is_empty() {
            return vec![Finding::skip(
                id,
                "host",
                "no RDMA device: GPUDirect RDMA does not apply",
            )];
        }
        if let Err(why) = ctx.topology() {
            return vec![Finding::skip(
                id,
                "host",
                format!("needs the topology: {why}"),
            )];
        }
        let env_level = ctx.env("NCCL_NET_GDR_LEVEL");
        let mut out = Vec::new();
        for g in ctx.gpus() {
            let near = ctx.nearest_rdma(g);
            let Some((nic, Some(class))) = near.first().map(|(n, c)| (*n, *c)) else {
                out.push(Finding::skip(
                    id,
                    g.label.clone(),
                    "the topology does not place this GPU or its NICs in the PCI tree",
                ));
                continue;
            };
            let nl = ctx.nic_label(nic);
            let subject = pair(&g.label, &nl);
            let others: Vec<String> = near.iter().skip(1).map(|(n, _)| ctx.nic_label(n)).collect();
            let mut ev = vec![format!(
                "topology: {} ({}) to {nl} ({}, {}) is {class}",
                g.label,
                g.bdf,
                nic.name,
                nic.bdf.map(|b| b.to_string()).unwrap_or_else(|| "?".into())
            )];
            if !others.is_empty() {
                ev.push(format!("equally near: {}", others.join(", ")));
            }
            if let Some(v) = env_level {
                ev.push(format!("NCCL_NET_GDR_LEVEL={v}"));
            }
            let by_default = class_level(class) <= DEFAULT_GDR_LEVEL;
            let f = if by_default {
                Finding::pass(
                    id,
                    subject,
                    format!(
                        "nearest RDMA NIC {nl} is {class} from {}: GPUDirect RDMA on by default",
                        g.label
                    ),
                )
            } else if gdr_allowed(ctx, class) {
                Finding::warn(
                    id,
                    subject,
                    format!(
                        "nearest RDMA NIC {nl} is {class} from {}; GPUDirect RDMA is forced by NCCL_NET_GDR_LEVEL, so NIC DMA crosses the host bridge",
                        g.label
                    ),
                )
                .fix("put a NIC under the same PCIe switch as the GPU (rail-aligned slots); in VMs expose the host's PCIe switches or give NCCL a topology file (NCCL_TOPO_FILE)")
            } else {
                Finding::fail(
                    id,
                    subject,
                    format!(
                        "nearest RDMA NIC {nl} is {class} from {}: NCCL keeps GPUDirect RDMA off (level PXB) and stages through host memory",
                        g.label
                    ),
                )
                .fix("use a NIC under the same PCIe switch as the GPU (NCCL_IB_HCA, slot placement); in VMs expose the PCIe switches or pass NCCL_TOPO_FILE; forcing NCCL_NET_GDR_LEVEL=PHB/SYS works but DMA crosses the root complex")
            };
            out.push(f.evidence_all(ev));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{run, TopoBuilder, Tree};
    use crate::Status;
    use gdx_topo::DeviceKind::{Gpu, Nic};

    fn tree() -> Tree {
        let t = Tree::new();
        t.gpu("pci0000:00", &[], "0000:03:00.0");
        t.nic("pci0000:00", &[], "0000:04:00.0");
        t.ib_rdma("0000:04:00.0");
        t
    }

    #[test]
    fn pix_passes() {
        let t = tree();
        let topo = TopoBuilder::new(1)
            .dev("GPU0", Gpu, "0000:03:00.0", "pci0000:00", &[0])
            .dev("NIC0", Nic, "0000:04:00.0", "pci0000:00", &[0])
            .build();
        let fs = run(&GpuNicDistance, &t.ctx().topo(topo).build());
        assert_eq!(fs[0].status, Status::Pass, "{fs:#?}");
        assert_eq!(fs[0].subject, "GPU0-NIC0");
        assert!(fs[0].message.contains("PIX"));
    }

    #[test]
    fn flat_vm_bus_is_phb_and_fails_unless_forced() {
        let t = tree();
        let topo = TopoBuilder::new(0)
            .dev("GPU0", Gpu, "0000:03:00.0", "pci0000:00", &[])
            .dev("NIC0", Nic, "0000:04:00.0", "pci0000:00", &[])
            .build();
        let fs = run(&GpuNicDistance, &t.ctx().topo(topo.clone()).build());
        assert_eq!(fs[0].status, Status::Fail);
        assert!(fs[0].message.contains("PHB"));
        let fs = run(
            &GpuNicDistance,
            &t.ctx().topo(topo).env("NCCL_NET_GDR_LEVEL", "4").build(),
        );
        assert_eq!(fs[0].status, Status::Warn);
    }

    #[test]
    fn levels_parse() {
        assert_eq!(parse_level("sys"), Some(4));
        assert_eq!(parse_level("PXB"), Some(2));
        assert_eq!(parse_level("bogus"), None);
    }

    #[test]
    fn skips_without_topology_or_rdma() {
        let t = tree();
        assert_eq!(
            run(&GpuNicDistance, &t.ctx().build())[0].status,
            Status::Skip
        );
        let t = Tree::new();
        t.gpu("pci0000:00", &[], "0000:03:00.0");
        assert_eq!(
            run(&GpuNicDistance, &t.ctx().build())[0].status,
            Status::Skip
        );
    }
}
