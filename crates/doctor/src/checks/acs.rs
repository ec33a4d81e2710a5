//! `acs`: PCIe Access Control Services on the bridges between a GPU and its NIC or a PCIe peer
//! GPU. P2P Request/Completion Redirect or Egress Control send the peer traffic up to the root
//! complex (slow, or a hang with an IOMMU) even when the topology says PIX (gdr-checks B3).
//!
//! Read from the ACS extended capability (id 0x000D) in each bridge's `config` file; the ACS
//! Control register is at cap+6. Extended config space is readable by root only: an
//! unprivileged read returns 64 bytes, which gives a `skip` with that reason. Direct
//! Translated P2P (bit 6) is not flagged: it lets ATS-translated traffic go direct (VMs).

use super::Check;
use crate::context::{pair, Context, GpuRef};
use crate::finding::Finding;
use crate::DoctorError;
use gdx_topo::sysfs::config::{AcsCtl, Config};
use gdx_topo::sysfs::devices::{self as pci, dev_dir};
use gdx_topo::PciAddr;
use std::collections::BTreeMap;

/// The `acs` check.
pub struct Acs;

/// Bridges between two devices whose ACS settings matter, from their sysfs chains.
pub fn pair_bridges(ctx: &Context, a: PciAddr, b: PciAddr) -> Result<Vec<PciAddr>, DoctorError> {
    let ca = pci::chain(&ctx.fs, a)?;
    let cb = pci::chain(&ctx.fs, b)?;
    Ok(pci::bridges_between(&ca, &cb))
}

/// The ACS control of a bridge, or why it cannot be read.
pub fn read_acs(ctx: &Context, bdf: PciAddr) -> Result<(Option<AcsCtl>, String), DoctorError> {
    let rel = format!("{}/config", dev_dir(bdf));
    let bytes = ctx.fs.file_bytes(&rel)?;
    let shown = ctx.fs.show(&rel);
    match Config::new(&bytes).acs_ctl() {
        Ok(Some(c)) => Ok((
            Some(c),
            format!("{shown}: ACSCtl 0x{:04x}: {}", c.0, c.describe()),
        )),
        Ok(None) => Ok((None, format!("{shown}: no ACS capability"))),
        Err(e) => Err(e.into()),
    }
}

/// Pairs whose PCIe path matters: GPU pairs not joined by NVLink, and each GPU with its
/// nearest RDMA NICs. Returns (subject, a, b).
pub fn pcie_pairs(ctx: &Context) -> Vec<(String, PciAddr, PciAddr)> {
    let gpus: &[GpuRef] = ctx.gpus();
    let mut out = Vec::new();
    for (i, a) in gpus.iter().enumerate() {
        for b in &gpus[i + 1..] {
            if ctx.nvlinks_between(a.bdf, b.bdf).is_some_and(|n| n > 0) {
                continue;
            }
            out.push((pair(&a.label, &b.label), a.bdf, b.bdf));
        }
    }
    for g in gpus {
        for (nic, _) in ctx.nearest_rdma(g) {
            if let Some(nb) = nic.bdf {
                out.push((pair(&g.label, &ctx.nic_label(nic)), g.bdf, nb));
            }
        }
    }
    out
}

impl Check for Acs {
    fn id(&self) -> &'static str {
        "acs"
    }
    fn title(&self) -> &'static str {
        "no ACS redirect on bridges between a GPU and its NIC or PCIe peer"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        if ctx.gpus().is_empty() {
            return vec![Finding::skip(id, "host", ctx.no_gpu_reason())];
        }
        let pairs = pcie_pairs(ctx);
        if pairs.is_empty() {
            return vec![Finding::skip(
                id,
                "host",
                "no PCIe GPU pair and no GPU-NIC pair (single GPU, NVLink peers, no RDMA NIC)",
            )];
        }
        let mut out = Vec::new();
        let mut bridges: BTreeMap<PciAddr, Vec<String>> = BTreeMap::new();
        for (subject, a, b) in &pairs {
            match pair_bridges(ctx, *a, *b) {
                Ok(bs) => {
                    for br in bs {
                        bridges.entry(br).or_default().push(subject.clone());
                    }
                }
                Err(why) => out.push(Finding::skip(id, subject.clone(), why.to_string())),
            }
        }
        if bridges.is_empty() && out.is_empty() {
            let names: Vec<&str> = pairs.iter().map(|(s, _, _)| s.as_str()).collect();
            return vec![Finding::pass(
                id,
                "host",
                "no PCIe bridge between any GPU and its NIC or PCIe peer (flat bus): nothing to redirect",
            )
            .evidence(format!("pairs checked: {}", names.join(", ")))];
        }
        for (br, subjects) in bridges {
            let on = format!("on the path {}", subjects.join(", "));
            let f = match read_acs(ctx, br) {
                Err(why) => Finding::skip(id, br.to_string(), why.to_string()),
                Ok((None, ev)) => {
                    Finding::pass(id, br.to_string(), format!("bridge {br} has no ACS capability")).evidence(ev)
                }
                Ok((Some(c), ev)) if c.redirects() => Finding::fail(
                    id,
                    br.to_string(),
                    format!("ACS redirect enabled on bridge {br} {on}: peer traffic goes up to the root complex"),
                )
                .evidence(ev)
                .fix(format!(
                    "disable ACS in the BIOS (or VT-d / IO virtualization if not needed), or at runtime `setpci -s {br} ECAP_ACS+0x6.w=0000` (not persistent; run at boot), or boot with pci=disable_acs_redir={br}"
                )),
                Ok((Some(c), ev)) => Finding::pass(
                    id,
                    br.to_string(),
                    format!("bridge {br} {on}: ACS does not redirect"),
                )
                .evidence(ev)
                .evidence_all((c.0 & AcsCtl::DIRECT_TRANS != 0).then(|| "DirectTrans+ lets ATS-translated P2P go direct".to_string())),
            };
            out.push(f);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{run, subject, Tree};
    use crate::Status;
    use gdx_topo::sysfs::config::ConfigBuilder;

    /// GPU and NIC under one switch: RP 00:01.0 → USP 01:00.0 → DSPs 02:01.0 / 02:02.0.
    fn tree(acs: u16, truncate: Option<usize>) -> Tree {
        let t = Tree::new();
        let hb = "pci0000:00";
        t.bridge(hb, &[], "0000:00:01.0");
        t.bridge(hb, &["0000:00:01.0"], "0000:01:00.0");
        for d in ["0000:02:01.0", "0000:02:02.0"] {
            t.bridge(hb, &["0000:00:01.0", "0000:01:00.0"], d);
            let mut c = ConfigBuilder::new().dev_ctl(0).acs_ctl(acs);
            if let Some(n) = truncate {
                c = c.truncate(n);
            }
            t.attr(d, "config", c.build());
        }
        t.gpu(
            hb,
            &["0000:00:01.0", "0000:01:00.0", "0000:02:01.0"],
            "0000:03:00.0",
        );
        t.nic(
            hb,
            &["0000:00:01.0", "0000:01:00.0", "0000:02:02.0"],
            "0000:04:00.0",
        );
        t.ib_rdma("0000:04:00.0");
        t
    }

    #[test]
    fn redirect_bits_fail_on_the_downstream_ports() {
        let t = tree(
            AcsCtl::SOURCE_VALID | AcsCtl::REQ_REDIRECT | AcsCtl::CMPLT_REDIRECT,
            None,
        );
        let fs = run(&Acs, &t.ctx().build());
        assert_eq!(fs.len(), 2, "{fs:#?}");
        let f = subject(&fs, "0000:02:01.0");
        assert_eq!(f.status, Status::Fail);
        assert!(f.message.contains("GPU0-NIC0"));
        assert!(f.evidence[0].contains("ReqRedir+ CmpltRedir+"));
        assert!(f
            .fix
            .as_deref()
            .unwrap()
            .contains("setpci -s 0000:02:01.0 ECAP_ACS+0x6.w=0000"));
    }

    #[test]
    fn egress_control_fails_too() {
        let t = tree(AcsCtl::EGRESS_CTRL, None);
        let fs = run(&Acs, &t.ctx().build());
        assert!(fs.iter().all(|f| f.status == Status::Fail));
    }

    #[test]
    fn clear_or_direct_translated_passes() {
        let t = tree(AcsCtl::SOURCE_VALID | AcsCtl::DIRECT_TRANS, None);
        let fs = run(&Acs, &t.ctx().build());
        assert!(fs.iter().all(|f| f.status == Status::Pass), "{fs:#?}");
        assert_eq!(fs.len(), 2);
    }

    #[test]
    fn unprivileged_config_skips_with_reason() {
        let t = tree(AcsCtl::REQ_REDIRECT, Some(64));
        let fs = run(&Acs, &t.ctx().build());
        let f = subject(&fs, "0000:02:02.0");
        assert_eq!(f.status, Status::Skip);
        assert!(f
            .reason
            .as_deref()
            .unwrap()
            .contains("extended config space needs root"));
    }

    #[test]
    fn flat_bus_passes_and_missing_config_skips() {
        let t = Tree::new();
        t.gpu("pci0000:00", &[], "0000:00:06.0");
        t.gpu("pci0000:00", &[], "0000:00:07.0");
        let fs = run(&Acs, &t.ctx().build());
        assert_eq!(fs.len(), 1);
        assert_eq!(fs[0].status, Status::Pass);
        assert!(fs[0].evidence[0].contains("GPU0-GPU1"));

        let t = tree(0, None);
        std::fs::remove_file(t.root().join("sys/bus/pci/devices/0000:02:01.0/config")).unwrap();
        let fs = run(&Acs, &t.ctx().build());
        assert_eq!(subject(&fs, "0000:02:01.0").status, Status::Skip);
    }
}
