//! Context judgements: NVLS, CollNet, the topology file, and the environment overrides NCCL
//! reported, graded with gdx-doctor's `nccl-env` rules. They explain, they do not grade a path.

use super::{Judge, Judgement, Verdict};
use gdx_doctor::checks::nccl_env;
use gdx_doctor::Status;

impl Judge<'_> {
    /// NVLS, CollNet, the topology file, and environment overrides NCCL reported.
    pub(super) fn context(&self) -> Vec<Judgement> {
        let mut out = Vec::new();
        let info = |subject: &str, did: String| Judgement {
            subject: subject.to_string(),
            verdict: Verdict::Info,
            nccl_did: did,
            best: None,
            why: Vec::new(),
            fix: None,
        };
        let n = &self.log.nvls;
        if !n.available_on.is_empty() || !n.unavailable_on.is_empty() || n.channels.is_some() {
            let mut s = format!(
                "NVLS multicast available on {} device(s), not on {}",
                n.available_on.len(),
                n.unavailable_on.len()
            );
            if let Some(c) = n.channels {
                s.push_str(&format!("; {c} NVLS channel(s)"));
            }
            out.push(info("NVLS", s));
        }
        let c = &self.log.collnet;
        if c.plugin.is_some() || c.sharp_devices || c.channels.is_some() {
            out.push(info(
                "CollNet",
                format!(
                    "plugin {}; SHARP-capable devices: {}; CollNet channels: {}",
                    c.plugin.as_deref().unwrap_or("none"),
                    if c.sharp_devices { "yes" } else { "no" },
                    c.channels.map_or("not reported".into(), |n| n.to_string())
                ),
            ));
        }
        match &self.log.topo_file {
            Some(f) => out.push(info(
                "topology file",
                format!("NCCL read NCCL_TOPO_FILE={f}"),
            )),
            None if self
                .log
                .system
                .as_ref()
                .and_then(|s| s.min_pci_bw)
                .is_some_and(|b| b < 1.0) =>
            {
                let mut j = info(
                    "topology",
                    "NCCL's topology has a PCI link below 1 GB/s (a hypervisor-made bridge)".into(),
                );
                j.fix = Some(
                    "give NCCL the real PCI tree: `gdx nccl env` prints NCCL_TOPO_FILE".into(),
                );
                out.push(j);
            }
            None => {}
        }
        for (var, value) in &self.log.env {
            if let Some((status, what, fix)) = nccl_env::judge(var, value) {
                let mut j = info(&format!("{var}={value}"), what);
                if status == Status::Fail {
                    j.fix = Some(fix);
                }
                out.push(j);
            }
        }
        out
    }
}
