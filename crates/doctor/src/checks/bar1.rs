//! `bar1`: the GPU's BAR1 aperture, through which peers and NICs map GPU memory on the
//! peermem / nvidia_p2p path. A 256 MiB BAR1 (no Resizable BAR, small VM MMIO window) makes
//! large registrations fail (gdr-checks B6). Read from NVML when available, else from line 2
//! (BAR index 1) of the GPU's sysfs `resource` file.

use super::Check;
use crate::context::Context;
use crate::finding::Finding;
use gdx_topo::sysfs::devices::dev_dir;

/// The `bar1` check.
pub struct Bar1;

/// Size of BAR `index` from a sysfs `resource` file (`start end flags` per line).
pub fn bar_size(resource: &str, index: usize) -> Option<u64> {
    let line = resource.lines().nth(index)?;
    let mut it = line.split_whitespace();
    let p = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    let start = p(it.next()?)?;
    let end = p(it.next()?)?;
    (end > start).then(|| end - start + 1)
}

fn mib(b: u64) -> String {
    format!("{} MiB", b >> 20)
}

/// A BAR1 at or below this is the classic "no Resizable BAR" size.
pub const SMALL_BAR1: u64 = 256 << 20;

impl Check for Bar1 {
    fn id(&self) -> &'static str {
        "bar1"
    }
    fn title(&self) -> &'static str {
        "GPU BAR1 aperture large enough for peer/NIC mappings"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        if ctx.gpus().is_empty() {
            return vec![Finding::skip(id, "host", ctx.no_gpu_reason())];
        }
        ctx.gpus()
            .iter()
            .map(|g| {
                let label = g.label.clone();
                let nvml = ctx.live().ok().and_then(|l| l.nvml_device(g.bdf));
                let topo_gpu = ctx.topo_device(g.bdf).and_then(|d| d.gpu.as_ref());
                let rel = format!("{}/resource", dev_dir(g.bdf));
                let sysfs = ctx.fs.text(&rel).and_then(|r| bar_size(&r, 1));
                let mut ev = Vec::new();
                let bar1 = if let Some(b) = nvml.and_then(|n| n.bar1_bytes) {
                    ev.push(format!("nvmlDeviceGetBAR1MemoryInfo().bar1Total = {}", mib(b)));
                    Some(b)
                } else if let Some(m) = topo_gpu.and_then(|t| t.bar1_mib) {
                    ev.push(format!("topology (NVML snapshot): BAR1 {m} MiB"));
                    Some(m << 20)
                } else {
                    sysfs
                };
                if let Some(s) = sysfs {
                    ev.push(format!("{}: BAR1 {}", ctx.fs.show(&rel), mib(s)));
                }
                let mem = nvml
                    .and_then(|n| n.memory_bytes)
                    .or_else(|| topo_gpu.and_then(|t| t.memory_mib).map(|m| m << 20));
                if let Some(m) = mem {
                    ev.push(format!("framebuffer {}", mib(m)));
                }
                let Some(bar1) = bar1 else {
                    return Finding::skip(id, label, format!("BAR1 size unknown: {} unreadable and NVML not available", ctx.fs.show(&rel)));
                };
                let fix = "enable \"Above 4G decoding\" and \"Resizable BAR\" in the BIOS; for VMs give the passthrough device a large 64-bit MMIO window (QEMU pci-hole64 / firmware MMIO size)";
                let f = if bar1 <= SMALL_BAR1 {
                    Finding::fail(id, label.clone(), format!("{label} BAR1 is only {}: large GPU memory registrations for peers/NICs will fail", mib(bar1))).fix(fix)
                } else if mem.is_some_and(|m| bar1 < m) {
                    Finding::warn(id, label.clone(), format!("{label} BAR1 {} is smaller than its memory {}: registrations beyond it fail", mib(bar1), mib(mem.unwrap_or(0)))).fix(fix)
                } else {
                    Finding::pass(id, label.clone(), format!("{label} BAR1 is {}", mib(bar1)))
                };
                f.evidence_all(ev)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::{NvmlDevice, NvmlFacts, StaticFacts};
    use crate::testutil::{bdf, run, Tree};
    use crate::Status;

    fn resource(bar1_bytes: u64) -> String {
        let start = 0x2000_0000_0000u64;
        format!(
            "0x00000000fa000000 0x00000000faffffff 0x0000000000040200\n0x{start:016x} 0x{:016x} 0x000000000014220c\n0x0000000000000000 0x0000000000000000 0x0000000000000000\n",
            start + bar1_bytes - 1
        )
    }

    #[test]
    fn parses_resource() {
        assert_eq!(bar_size(&resource(256 << 20), 1), Some(256 << 20));
        assert_eq!(bar_size(&resource(256 << 20), 2), None);
        assert_eq!(bar_size("junk", 1), None);
    }

    #[test]
    fn small_bar_fails_large_passes() {
        let t = Tree::new();
        t.gpu("pci0000:00", &[], "0000:00:06.0");
        t.attr("0000:00:06.0", "resource", resource(256 << 20));
        let fs = run(&Bar1, &t.ctx().build());
        assert_eq!(fs[0].status, Status::Fail);
        assert!(fs[0].message.contains("256 MiB"));
        t.attr("0000:00:06.0", "resource", resource(256 << 30));
        assert_eq!(run(&Bar1, &t.ctx().build())[0].status, Status::Pass);
    }

    #[test]
    fn nvml_beats_sysfs_and_bar_below_memory_warns() {
        let t = Tree::new();
        t.gpu("pci0000:00", &[], "0000:00:06.0");
        let mut f = StaticFacts::none();
        f.nvml = Ok(NvmlFacts {
            driver_version: None,
            devices: vec![NvmlDevice {
                bdf: Some(bdf("0000:00:06.0")),
                bar1_bytes: Some(32 << 30),
                memory_bytes: Some(80 << 30),
                ..Default::default()
            }],
        });
        let fs = run(&Bar1, &t.ctx().live(f).build());
        assert_eq!(fs[0].status, Status::Warn);
        assert_eq!(run(&Bar1, &t.ctx().build())[0].status, Status::Skip);
    }
}
