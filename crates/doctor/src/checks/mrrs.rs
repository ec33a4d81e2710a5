//! `mrrs`: the NIC's PCIe Max Read Request Size. GDR sends are NIC reads of GPU memory, split
//! at MRRS; BIOS "fairness" defaults of 128-512 bytes cut throughput (gdr-checks B7). Read from
//! the PCI Express capability's Device Control register (cap+8, bits 14:12).

use super::Check;
use crate::context::Context;
use crate::finding::Finding;
use crate::DoctorError;
use gdx_topo::sysfs::config::{Config, DevCtl};
use gdx_topo::sysfs::devices::dev_dir;
use gdx_topo::PciAddr;

/// The `mrrs` check.
pub struct Mrrs;

/// One RDMA PCI function's Device Control register, or why it cannot be read.
pub struct NicDevCtl {
    /// NIC label.
    pub label: String,
    /// PCI address.
    pub bdf: PciAddr,
    /// The register and its evidence line, or the skip reason.
    pub devctl: Result<(DevCtl, String), DoctorError>,
}

/// Device Control of every RDMA PCI function (deduplicated).
pub fn nic_devctl(ctx: &Context) -> Vec<NicDevCtl> {
    let mut out: Vec<NicDevCtl> = Vec::new();
    for d in ctx.rdma() {
        let Some(bdf) = d.bdf else { continue };
        if out.iter().any(|n| n.bdf == bdf) {
            continue;
        }
        let rel = format!("{}/config", dev_dir(bdf));
        let devctl = ctx
            .fs
            .file_bytes(&rel)
            .map_err(DoctorError::File)
            .and_then(|b| Config::new(&b).dev_ctl().map_err(DoctorError::Config))
            .map(|dc| {
                let ev = format!(
                    "{}: DevCtl 0x{:04x}: MaxPayload {} bytes, MaxReadReq {} bytes, RlxdOrd{}",
                    ctx.fs.show(&rel),
                    dc.0,
                    dc.max_payload(),
                    dc.max_read_request(),
                    if dc.relaxed_ordering() { '+' } else { '-' }
                );
                (dc, ev)
            });
        out.push(NicDevCtl {
            label: ctx.nic_label(d),
            bdf,
            devctl,
        });
    }
    out
}

/// [`nic_devctl`], or the skip finding of check `id` when there is no RDMA PCI function.
pub(crate) fn nic_devctl_or_skip(ctx: &Context, id: &str) -> Result<Vec<NicDevCtl>, Vec<Finding>> {
    let nics = nic_devctl(ctx);
    if nics.is_empty() {
        return Err(vec![Finding::skip(
            id,
            "host",
            "no RDMA device on a PCI function",
        )]);
    }
    Ok(nics)
}

impl Check for Mrrs {
    fn id(&self) -> &'static str {
        "mrrs"
    }
    fn title(&self) -> &'static str {
        "RDMA NIC PCIe MaxReadReq is 4096 bytes"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        let nics = match nic_devctl_or_skip(ctx, id) {
            Ok(n) => n,
            Err(fs) => return fs,
        };
        nics.into_iter()
            .map(|n| {
                let (dc, ev) = match n.devctl {
                    Ok(x) => x,
                    Err(why) => return Finding::skip(id, n.label, why.to_string()),
                };
                let m = dc.max_read_request();
                // Same register with bits 14:12 = 101 (4096 bytes): the exact setpci value.
                let want = (dc.0 & !0x7000) | (5 << 12);
                let fix = format!(
                    "`setpci -s {} CAP_EXP+8.w={want:04x}` (not persistent); the BIOS option \"PCIe Max Read Request\" is the persistent fix; leave MaxPayload alone",
                    n.bdf
                );
                let subject = n.label.clone();
                let f = if m >= 4096 {
                    Finding::pass(id, subject, format!("{} MaxReadReq {m} bytes", n.label))
                } else if m >= 1024 {
                    Finding::warn(id, subject, format!("{} MaxReadReq is {m} bytes (4096 is best for GDR reads)", n.label)).fix(fix)
                } else {
                    Finding::fail(id, subject, format!("{} MaxReadReq is only {m} bytes: NIC reads of GPU memory are split small and slow", n.label)).fix(fix)
                };
                f.evidence(ev)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{run, Tree};
    use crate::Status;
    use gdx_topo::sysfs::config::ConfigBuilder;

    fn tree(devctl: u16, len: Option<usize>) -> Tree {
        let t = Tree::new();
        t.ib_nic();
        let mut c = ConfigBuilder::new().dev_ctl(devctl);
        if let Some(l) = len {
            c = c.truncate(l);
        }
        t.attr("0000:00:03.0", "config", c.build());
        t
    }

    #[test]
    fn mrrs_4096_passes_512_fails_with_exact_setpci() {
        let fs = run(&Mrrs, &tree(0x5020, None).ctx().build());
        assert_eq!(fs[0].status, Status::Pass);
        let fs = run(&Mrrs, &tree(0x2020, None).ctx().build());
        assert_eq!(fs[0].status, Status::Fail);
        assert!(
            fs[0].fix.as_deref().unwrap().contains("CAP_EXP+8.w=5020"),
            "{:?}",
            fs[0].fix
        );
        let fs = run(&Mrrs, &tree(0x3020, None).ctx().build());
        assert_eq!(fs[0].status, Status::Warn);
    }

    #[test]
    fn unprivileged_read_skips() {
        // PCIe cap at 0x40 needs bytes up to 0x4a; an unprivileged read gives 64.
        let fs = run(&Mrrs, &tree(0x5020, Some(64)).ctx().build());
        assert_eq!(fs[0].status, Status::Skip);
        assert!(
            fs[0].reason.as_deref().unwrap().contains("needs root"),
            "{:?}",
            fs[0].reason
        );
    }
}
