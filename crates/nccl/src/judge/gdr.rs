//! GPU Direct RDMA per HCA: is GDR off where a GPU reaches the HCA at PIX/PXB, and why (the
//! log's own reason, NCCL's version, the doctor's `peermem`/`dmabuf`/`gpu-gdr-support`
//! findings, the GDR-related environment).

use super::{parse_version, Judge, Judgement, Verdict};
use gdx_doctor::checks::distance::{parse_level, DEFAULT_GDR_LEVEL};
use gdx_doctor::checks::nccl_env;
use gdx_doctor::Status;
use gdx_topo::{Device, PathClass};

/// A judgement's verdict, best, why and fix (its subject and what NCCL did are the caller's).
type HcaVerdict = (Verdict, Option<String>, Vec<String>, Option<String>);

impl<'a> Judge<'a> {
    /// Why GDR is off, from the log and the doctor.
    pub(super) fn gdr_reasons(&self, hca: Option<&str>) -> (Vec<String>, Option<String>) {
        let mut why = Vec::new();
        let mut fix = None;
        for g in self.log.gdr.iter().filter(|g| !g.enabled) {
            if hca.is_some() && g.name.as_deref() != hca {
                continue;
            }
            if let Some(r) = &g.reason {
                let text = if r == "no module" {
                    "NCCL found no peer-memory module (nvidia-peermem / nv_peer_mem)".to_string()
                } else {
                    format!("NCCL said: {r}")
                };
                if !why.contains(&text) {
                    why.push(text);
                }
            }
        }
        let version = self.log.version.as_deref().and_then(parse_version);
        for id in ["peermem", "dmabuf", "gpu-gdr-support"] {
            let Some(f) = self.finding(id) else { continue };
            match f.status {
                Status::Fail | Status::Warn => {
                    why.push(format!("doctor {id}: {}", f.message));
                    if fix.is_none() {
                        fix = f.fix.clone();
                    }
                }
                Status::Pass
                    if id == "peermem"
                        && f.message.contains("nvidia_peermem")
                        && version.is_some_and(|v| v <= (2, 22, 3)) =>
                {
                    why.push("nvidia_peermem is loaded, but NCCL ≤ 2.22.3 only looks for nv_peer_mem's sysfs file, so it does not see it (NVIDIA/nccl#1676)".into());
                    fix = Some(
                        "use NCCL ≥ 2.23.4, or DMA-BUF (open GPU kernel modules, kernel ≥ 5.12)"
                            .into(),
                    );
                }
                _ => {}
            }
        }
        if version.is_some_and(|v| v < (2, 13, 0)) {
            why.push(
                "NCCL < 2.13 cannot register GPU memory through DMA-BUF; it needs nvidia-peermem"
                    .into(),
            );
        }
        for (var, value) in &self.log.env {
            if !matches!(
                var.as_str(),
                "NCCL_NET_GDR_LEVEL" | "NCCL_DMABUF_ENABLE" | "NCCL_NET_GDR_READ"
            ) {
                continue;
            }
            if let Some((_, what, _)) = nccl_env::judge(var, value) {
                why.push(format!("{var}={value}: {what}"));
            }
        }
        if why.is_empty() {
            why.push("neither the log nor the doctor gives a reason (run `gdx doctor` on the machine that wrote the log)".into());
        }
        let fix = fix.or_else(|| Some("load nvidia-peermem (`modprobe nvidia-peermem`), or use DMA-BUF: open GPU kernel modules, kernel ≥ 5.12, NCCL ≥ 2.13".into()));
        (why, fix)
    }

    /// GPUs that reach `nic` at PIX/PXB, with the class.
    fn local_gpus(&self, nic: &Device) -> Vec<(&'a Device, PathClass)> {
        let Some(topo) = self.topo else {
            return Vec::new();
        };
        topo.gpus()
            .map(|g| (g, topo.pcie_class(g, nic)))
            .filter(|(_, c)| c.is_pcie_local())
            .collect()
    }

    /// One judgement per HCA NCCL turned GPU Direct RDMA off for.
    pub(super) fn gdr_hcas(&mut self) -> Vec<Judgement> {
        let mut names: Vec<String> = Vec::new();
        for g in self.log.gdr.iter().filter(|g| !g.enabled) {
            let n = g.name.clone().unwrap_or_else(|| format!("HCA {}", g.hca));
            if !names.contains(&n) {
                names.push(n);
            }
        }
        let forced = self
            .log
            .env
            .get("NCCL_NET_GDR_LEVEL")
            .and_then(|v| parse_level(v))
            .is_some_and(|l| l > DEFAULT_GDR_LEVEL);
        names
            .into_iter()
            .map(|name| {
                let (verdict, best, why, fix) = self.gdr_hca_verdict(&name, forced);
                Judgement {
                    subject: format!("GDR on {name}"),
                    verdict,
                    nccl_did: format!("GPU Direct RDMA disabled for {name}"),
                    best,
                    why,
                    fix,
                }
            })
            .collect()
    }

    /// The verdict on the HCA `name` NCCL turned GPU Direct RDMA off for, with what the
    /// machine allows, why, and the fix; `forced`: NCCL_NET_GDR_LEVEL allows more than PXB.
    fn gdr_hca_verdict(&mut self, name: &str, forced: bool) -> HcaVerdict {
        let (why, fix) = self.gdr_reasons(Some(name));
        if self.topo.is_none() {
            return (Verdict::Unknown, None, why, fix);
        }
        let Some(nic) = self.nic_named(name) else {
            if let Some(best) = self.nearest_by_rank(name) {
                return (Verdict::NotBest, Some(best), why, fix);
            }
            return (
                Verdict::Unknown,
                None,
                vec![format!(
                    "{name} is not an RDMA device of the given topology"
                )],
                None,
            );
        };
        let local = self.local_gpus(nic);
        if local.is_empty() && !forced {
            return (
                Verdict::Best,
                Some(format!("no GPU is PIX or PXB to {name}")),
                vec![format!("GPUDirect RDMA would cross a host bridge; NCCL's default NCCL_NET_GDR_LEVEL (PXB) stages through host memory instead, which is right")],
                None,
            );
        }
        let best = match local.first() {
            Some((g, c)) => format!("{}↔{name} is {c}: GDRDMA expected", g.label),
            None => format!("NCCL_NET_GDR_LEVEL allows GDR at any distance to {name}"),
        };
        (Verdict::NotBest, Some(best), why, fix)
    }

    /// For a topology that names no HCA (an NCCL XML file): the nearest NIC of the GPU of a
    /// rank on the host that printed the GDR line for `hca`, when that NIC is PIX/PXB.
    fn nearest_by_rank(&mut self, hca: &str) -> Option<String> {
        let topo = self.topo?;
        if topo
            .nics()
            .any(|n| n.nic.as_ref().is_some_and(|i| i.rdma_name.is_some()))
        {
            return None;
        }
        let hosts: Vec<Option<String>> = self
            .log
            .gdr
            .iter()
            .filter(|g| g.name.as_deref() == Some(hca))
            .map(|g| g.host.clone())
            .collect();
        let ranks: Vec<u32> = self
            .log
            .ranks
            .iter()
            .filter(|r| hosts.contains(&r.host))
            .map(|r| r.rank)
            .collect();
        for r in ranks {
            let Some(gpu) = self.gpu_of(r) else { continue };
            let Some((nic, class)) = topo.nearest_nics(gpu).into_iter().next() else {
                continue;
            };
            if class.is_pcie_local() {
                return Some(format!(
                    "{}'s nearest NIC ({}{}) is {class}: GDRDMA expected (the topology names no HCA; matched through rank {r}'s GPU)",
                    gpu.label,
                    nic.label,
                    nic.bdf.map(|b| format!(" {b}")).unwrap_or_default()
                ));
            }
        }
        None
    }
}
