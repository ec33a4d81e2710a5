//! `numa`: each GPU has an RDMA NIC on its own NUMA node, and the platform says which node
//! devices are on at all (`numa_node` = -1 in VMs and on some firmware makes NCCL lump
//! everything together) (gdr-checks B2).

use super::Check;
use crate::context::{pair, Context};
use crate::finding::Finding;
use gdx_topo::sysfs::devices::{self as pci, dev_dir};
use gdx_topo::PciAddr;

/// The `numa` check.
pub struct Numa;

fn node_ev(ctx: &Context, bdf: PciAddr, v: Option<u32>) -> String {
    let shown = v.map(|n| n.to_string()).unwrap_or_else(|| "-1".into());
    format!(
        "{}: {shown}",
        ctx.fs.show(&format!("{}/numa_node", dev_dir(bdf)))
    )
}

impl Check for Numa {
    fn id(&self) -> &'static str {
        "numa"
    }
    fn title(&self) -> &'static str {
        "each GPU has an RDMA NIC on its NUMA node; NUMA nodes are exposed"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        if ctx.gpus().is_empty() {
            return vec![Finding::skip(id, "host", ctx.no_gpu_reason())];
        }
        let nics: Vec<(String, PciAddr, Option<u32>)> = ctx
            .rdma()
            .iter()
            .filter_map(|d| {
                let b = d.bdf?;
                Some((
                    ctx.nic_label(d),
                    b,
                    pci::numa_node(&ctx.fs, b).ok().flatten(),
                ))
            })
            .collect();
        let mut out = Vec::new();
        for g in ctx.gpus() {
            let node = match pci::numa_node(&ctx.fs, g.bdf) {
                Ok(n) => n,
                Err(e) => {
                    out.push(Finding::skip(
                        id,
                        g.label.clone(),
                        format!("cannot read NUMA node: {e}"),
                    ));
                    continue;
                }
            };
            let gev = node_ev(ctx, g.bdf, node);
            let Some(node) = node else {
                out.push(
                    Finding::warn(
                        id,
                        g.label.clone(),
                        format!("{} has no NUMA node (-1): firmware or hypervisor does not expose NUMA, so CPU/memory placement and NCCL's topology are guesses", g.label),
                    )
                    .evidence(gev)
                    .fix("on bare metal check BIOS NPS/SNC settings; in a VM define guest NUMA cells and pin vCPUs, or give NCCL a topology file"),
                );
                continue;
            };
            if nics.is_empty() {
                let cpus = ctx
                    .fs
                    .text(&format!("{}/local_cpulist", dev_dir(g.bdf)))
                    .map(|c| format!("local CPUs {c}"));
                out.push(
                    Finding::pass(
                        id,
                        g.label.clone(),
                        format!("{} is on NUMA node {node}", g.label),
                    )
                    .evidence(gev)
                    .evidence_all(cpus),
                );
                continue;
            }
            // Prefer the topology's nearest NIC when it is on the same node.
            let nearest: Vec<String> = ctx
                .nearest_rdma(g)
                .iter()
                .map(|(d, _)| ctx.nic_label(d))
                .collect();
            let mut same: Vec<&(String, PciAddr, Option<u32>)> =
                nics.iter().filter(|(_, _, n)| *n == Some(node)).collect();
            same.sort_by_key(|(l, _, _)| !nearest.contains(l));
            if let Some((l, b, n)) = same.first() {
                out.push(
                    Finding::pass(
                        id,
                        pair(&g.label, l),
                        format!("{} and {l} share NUMA node {node}", g.label),
                    )
                    .evidence(gev)
                    .evidence(node_ev(ctx, *b, *n)),
                );
                continue;
            }
            let (l, _, n) = nics
                .iter()
                .find(|(l, _, _)| nearest.contains(l))
                .unwrap_or(&nics[0]);
            let f = if n.is_none() {
                Finding::warn(
                    id,
                    pair(&g.label, l),
                    format!(
                        "{} is on NUMA node {node} but {l} reports none (-1)",
                        g.label
                    ),
                )
                .fix("check BIOS NUMA settings; the NIC's locality is unknown")
            } else {
                Finding::fail(
                    id,
                    pair(&g.label, l),
                    format!(
                        "no RDMA NIC on {}'s NUMA node {node}: traffic crosses the CPU interconnect (SYS), and GPUDirect RDMA is off by default",
                        g.label
                    ),
                )
                .fix("move a NIC into a slot on the GPU's socket (rail-aligned), or check BIOS NPS/SNC settings")
            };
            out.push(
                f.evidence(gev)
                    .evidence_all(nics.iter().map(|(_, b, n)| node_ev(ctx, *b, *n))),
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{run, subject, Tree};
    use crate::Status;

    fn tree(gpu_node: &str, nic_node: &str) -> Tree {
        let t = Tree::new();
        t.gpu("pci0000:00", &[], "0000:03:00.0");
        t.nic("pci0000:80", &[], "0000:84:00.0");
        t.ib_rdma("0000:84:00.0");
        t.attr("0000:03:00.0", "numa_node", format!("{gpu_node}\n"));
        t.attr("0000:84:00.0", "numa_node", format!("{nic_node}\n"));
        t
    }

    #[test]
    fn same_node_passes() {
        let t = tree("0", "0");
        let fs = run(&Numa, &t.ctx().build());
        assert_eq!(subject(&fs, "GPU0-NIC0").status, Status::Pass);
    }

    #[test]
    fn nic_on_other_node_fails() {
        let t = tree("0", "1");
        let fs = run(&Numa, &t.ctx().build());
        let f = subject(&fs, "GPU0-NIC0");
        assert_eq!(f.status, Status::Fail);
        assert!(
            f.evidence
                .iter()
                .any(|e| e.ends_with("0000:84:00.0/numa_node: 1")),
            "{f:#?}"
        );
    }

    #[test]
    fn minus_one_warns() {
        let t = tree("-1", "0");
        let fs = run(&Numa, &t.ctx().build());
        assert_eq!(subject(&fs, "GPU0").status, Status::Warn);
    }
}
