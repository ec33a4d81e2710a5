//! `link-downtrain`: PCIe links running below their capability (a Gen5 x16 NIC at x8 halves
//! GDR bandwidth, and NCCL does not notice) on GPUs, RDMA NICs and every bridge above them
//! (gdr-checks B5).
//!
//! False positives suppressed: GPUs drop link *speed* at idle to save power (so a speed-only
//! drop on a GPU, or on the port right above it, passes with a note; width drops still fail),
//! and hypervisor-made bridges report meaningless figures (known virtual vendors, width 0,
//! unknown speed, or marked virtual in the topology).

use super::Check;
use crate::context::Context;
use crate::finding::Finding;
use gdx_topo::sysfs::devices::{self as pci, LinkRead};
use gdx_topo::{Link, PciAddr};
use std::collections::BTreeSet;

/// The `link-downtrain` check.
pub struct LinkDowntrain;

/// Vendors whose bridges only exist in a hypervisor (QEMU/Red Hat, VMware, Microsoft), and
/// individual synthetic bridges seen in cloud VMs.
fn is_known_virtual(vendor: Option<u16>, device: Option<u16>) -> bool {
    matches!(vendor, Some(0x1b36) | Some(0x15ad) | Some(0x1414))
        || matches!((vendor, device), (Some(0x104c), Some(0x8232)))
}

fn is_virtual(ctx: &Context, bdf: PciAddr, l: &LinkRead) -> bool {
    let f = pci::read_fn(&ctx.fs, bdf);
    let topo_virtual = ctx
        .topology()
        .ok()
        .is_some_and(|t| t.switches.iter().any(|s| s.upstream == bdf && s.is_virtual));
    topo_virtual
        || is_known_virtual(f.vendor, f.device)
        || l.current.width == Some(0)
        || l.max.width == Some(0)
}

/// How a link compares with its maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// At max.
    Full,
    /// Speed below max, width at max.
    SlowSpeed,
    /// Width below max (speed may be low too).
    Narrow,
    /// Figures missing.
    Unknown,
}

/// Compare current with max.
pub fn health(cur: Link, max: Link) -> Health {
    match (cur.speed_gts, cur.width, max.speed_gts, max.width) {
        (Some(_), Some(cw), Some(_), Some(mw)) if cw < mw => Health::Narrow,
        (Some(cs), Some(_), Some(ms), Some(_)) if cs + 0.01 < ms => Health::SlowSpeed,
        (Some(_), Some(_), Some(_), Some(_)) => Health::Full,
        _ => Health::Unknown,
    }
}

fn fmt_link(l: Link) -> String {
    let g = l
        .generation()
        .map(|g| format!("Gen{g}"))
        .unwrap_or_else(|| format!("{} GT/s", l.speed_gts.unwrap_or(0.0)));
    format!("{g} x{}", l.width.unwrap_or(0))
}

const FIX: &str = "reseat the card or riser, check BIOS slot bifurcation and PCIe speed settings, update firmware, and look for AER errors (aer_dev_correctable/nonfatal/fatal)";

impl Check for LinkDowntrain {
    fn id(&self) -> &'static str {
        "link-downtrain"
    }
    fn title(&self) -> &'static str {
        "PCIe links of GPUs, RDMA NICs and the ports above them run at max speed and width"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        let mut ends: Vec<(String, PciAddr, bool)> = ctx
            .gpus()
            .iter()
            .map(|g| (g.label.clone(), g.bdf, true))
            .collect();
        for d in ctx.rdma() {
            if let Some(b) = d.bdf {
                if !ends.iter().any(|(_, x, _)| *x == b) {
                    ends.push((ctx.nic_label(d), b, false));
                }
            }
        }
        if ends.is_empty() {
            return vec![Finding::skip(
                id,
                "host",
                format!("{} and no RDMA device", ctx.no_gpu_reason()),
            )];
        }
        let mut out = Vec::new();
        let mut seen: BTreeSet<PciAddr> = BTreeSet::new();
        for (label, bdf, is_gpu) in ends {
            let l = pci::read_link(&ctx.fs, bdf);
            let chain = pci::chain(&ctx.fs, bdf).ok();
            let parent = chain.as_ref().and_then(|c| c.bridges.last().copied());
            let mut ev = l.evidence.clone();
            let f = match health(l.current, l.max) {
                Health::Unknown => Finding::skip(
                    id,
                    label.clone(),
                    format!("{label} ({bdf}) has no readable link speed/width (virtual or integrated device)"),
                ),
                Health::Narrow => Finding::fail(
                    id,
                    label.clone(),
                    format!("{label} link runs at {} of {}", fmt_link(l.current), fmt_link(l.max)),
                )
                .fix(FIX),
                Health::SlowSpeed if is_gpu => Finding::pass(
                    id,
                    label.clone(),
                    format!(
                        "{label} link at {} of {}: full width; lower speed is the GPU's idle power state (re-check under load)",
                        fmt_link(l.current),
                        fmt_link(l.max)
                    ),
                ),
                Health::SlowSpeed => Finding::fail(
                    id,
                    label.clone(),
                    format!("{label} link runs at {} of {}", fmt_link(l.current), fmt_link(l.max)),
                )
                .fix(FIX),
                Health::Full => {
                    // The port above caps the link: a Gen5 device in a Gen4 slot.
                    let capped = parent.and_then(|p| {
                        let pl = pci::read_link(&ctx.fs, p);
                        if is_virtual(ctx, p, &pl) {
                            return None;
                        }
                        let slower = matches!((pl.max.speed_gts, l.max.speed_gts), (Some(a), Some(b)) if a + 0.01 < b);
                        let narrower = matches!((pl.max.width, l.max.width), (Some(a), Some(b)) if a < b);
                        (slower || narrower).then_some((p, pl))
                    });
                    match capped {
                        Some((p, pl)) => {
                            ev.extend(pl.evidence);
                            Finding::warn(
                                id,
                                label.clone(),
                                format!("{label} can do {} but the port above ({p}) only {}", fmt_link(l.max), fmt_link(pl.max)),
                            )
                            .fix("move the card to a slot whose port matches its generation and width")
                        }
                        None => Finding::pass(id, label.clone(), format!("{label} link at {}", fmt_link(l.current))),
                    }
                }
            };
            out.push(f.evidence_all(ev));
            // The bridges above: reported only when something is wrong with them.
            let Some(chain) = chain else { continue };
            let n = chain.bridges.len();
            for (i, br) in chain.bridges.iter().enumerate() {
                if !seen.insert(*br) {
                    continue;
                }
                let bl = pci::read_link(&ctx.fs, *br);
                if is_virtual(ctx, *br, &bl) {
                    continue;
                }
                // The port right above a GPU shares the GPU's link and its idle speed.
                let above_gpu = is_gpu && i + 1 == n;
                let bad = match health(bl.current, bl.max) {
                    Health::Narrow => true,
                    Health::SlowSpeed => !above_gpu,
                    _ => false,
                };
                if bad {
                    out.push(
                        Finding::fail(
                            id,
                            br.to_string(),
                            format!(
                                "bridge {br} above {label} runs at {} of {}",
                                fmt_link(bl.current),
                                fmt_link(bl.max)
                            ),
                        )
                        .evidence_all(bl.evidence)
                        .fix(FIX),
                    );
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{run, subject, Tree};
    use crate::Status;

    fn tree() -> Tree {
        let t = Tree::new();
        t.bridge("pci0000:00", &[], "0000:00:01.0");
        t.gpu("pci0000:00", &["0000:00:01.0"], "0000:01:00.0");
        t.bridge("pci0000:00", &[], "0000:00:02.0");
        t.nic("pci0000:00", &["0000:00:02.0"], "0000:02:00.0");
        t.ib_rdma("0000:02:00.0");
        t
    }

    #[test]
    fn healthy_passes() {
        let t = tree();
        let fs = run(&LinkDowntrain, &t.ctx().build());
        assert_eq!(fs.len(), 2, "{fs:#?}");
        assert!(fs.iter().all(|f| f.status == Status::Pass));
        assert!(subject(&fs, "GPU0").message.contains("Gen5 x16"));
    }

    #[test]
    fn narrow_nic_fails_and_idle_gpu_speed_passes() {
        let t = tree();
        t.attr("0000:02:00.0", "current_link_width", "8\n");
        t.attr("0000:00:02.0", "current_link_width", "8\n");
        t.attr("0000:01:00.0", "current_link_speed", "2.5 GT/s PCIe\n");
        t.attr("0000:00:01.0", "current_link_speed", "2.5 GT/s PCIe\n");
        let fs = run(&LinkDowntrain, &t.ctx().build());
        let nic = subject(&fs, "NIC0");
        assert_eq!(nic.status, Status::Fail);
        assert!(
            nic.message.contains("Gen5 x8 of Gen5 x16"),
            "{}",
            nic.message
        );
        assert_eq!(subject(&fs, "0000:00:02.0").status, Status::Fail);
        let gpu = subject(&fs, "GPU0");
        assert_eq!(gpu.status, Status::Pass);
        assert!(gpu.message.contains("idle"));
        assert!(!fs.iter().any(|f| f.subject == "0000:00:01.0"), "{fs:#?}");
    }

    #[test]
    fn slow_nic_fails_and_virtual_bridge_is_ignored() {
        let t = tree();
        t.attr("0000:02:00.0", "current_link_speed", "16.0 GT/s PCIe\n");
        // A QEMU root port above the GPU claiming 2.5 GT/s x1.
        t.attr("0000:00:01.0", "vendor", "0x1b36\n");
        t.attr("0000:00:01.0", "current_link_speed", "2.5 GT/s PCIe\n");
        t.attr("0000:00:01.0", "current_link_width", "1\n");
        let fs = run(&LinkDowntrain, &t.ctx().build());
        assert_eq!(subject(&fs, "NIC0").status, Status::Fail);
        assert_eq!(subject(&fs, "GPU0").status, Status::Pass);
        assert!(!fs.iter().any(|f| f.subject == "0000:00:01.0"));
    }

    #[test]
    fn gen5_card_in_gen4_port_warns_and_missing_files_skip() {
        let t = tree();
        t.attr("0000:00:02.0", "max_link_speed", "16.0 GT/s PCIe\n");
        t.attr("0000:00:02.0", "current_link_speed", "16.0 GT/s PCIe\n");
        let fs = run(&LinkDowntrain, &t.ctx().build());
        assert_eq!(subject(&fs, "NIC0").status, Status::Warn);
        std::fs::remove_file(
            t.root()
                .join("sys/bus/pci/devices/0000:01:00.0/max_link_speed"),
        )
        .unwrap();
        let fs = run(&LinkDowntrain, &t.ctx().build());
        assert_eq!(subject(&fs, "GPU0").status, Status::Skip);
    }
}
