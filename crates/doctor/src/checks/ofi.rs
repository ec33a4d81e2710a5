//! `fabric`: the libfabric providers that offer one-sided RMA on RDM endpoints (what the
//! `fabric` transport can use), the one gdx would choose and why, and whether an EFA device
//! exists without an EFA provider to drive it.

use super::Check;
use crate::context::Context;
use crate::finding::Finding;

/// The `fabric` check.
pub struct Libfabric;

/// EFA devices under `sys/class/infiniband`: named like one (`efa_0`), or on a PCI function
/// that is an EFA by driver or ids (newer kernels name them `rdmap16s27`); topo's rule
/// ([`gdx_topo::sysfs::is_efa`]).
fn efa_devices(ctx: &Context) -> Vec<String> {
    use gdx_topo::sysfs::devices;
    devices::rdma_devices(&ctx.fs)
        .into_iter()
        .filter(|d| {
            let (f, driver) = match d.bdf {
                Some(b) => (
                    Some(devices::read_fn(&ctx.fs, b)),
                    ctx.fs.link_name(&format!("{}/driver", devices::dev_dir(b))),
                ),
                None => (None, None),
            };
            gdx_topo::sysfs::is_efa(
                f.as_ref().and_then(|f| f.vendor),
                f.as_ref().and_then(|f| f.device),
                driver.as_deref(),
                Some(&d.name),
            )
        })
        .map(|d| d.name)
        .collect()
}

impl Check for Libfabric {
    fn id(&self) -> &'static str {
        "fabric"
    }
    fn title(&self) -> &'static str {
        "libfabric offers one-sided RMA (fabric transport)"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        let efa = efa_devices(ctx);
        // Providers are the running host's library: only consulted live.
        if let Err(why) = ctx.live() {
            return vec![Finding::skip(id, "host", why.to_string())];
        }
        let list = match gdx_fabric::providers() {
            Ok(l) => l,
            Err(e) if efa.is_empty() => {
                return vec![Finding::skip(
                    id,
                    "host",
                    format!("{e} (only the fabric transport needs it)"),
                )
                .fix("apt-get install libfabric1 libfabric-bin (or the EFA installer on AWS)")]
            }
            Err(e) => {
                return vec![Finding::fail(
                    id,
                    "host",
                    format!("EFA device(s) {} but {e}", efa.join(", ")),
                )
                .fix("install the AWS EFA installer (it ships libfabric with the efa provider)")]
            }
        };
        let mut seen = Vec::new();
        let mut ev = Vec::new();
        if let Ok((path, version)) = gdx_fabric::library() {
            ev.push(format!("{path}: libfabric {version}"));
        }
        for p in &list {
            let key = (p.provider.clone(), p.fabric.clone(), p.domain.clone());
            if seen.contains(&key) {
                continue;
            }
            seen.push(key);
            ev.push(format!(
                "{} fabric {} domain {}: FI_RMA, HMEM {}, MR mode [{}], key {} B, {} progress",
                p.provider,
                p.fabric,
                p.domain,
                if p.hmem { "yes" } else { "no" },
                p.mr_mode.join(" "),
                p.mr_key_size,
                if p.manual_progress { "manual" } else { "auto" }
            ));
        }
        let has = |name: &str| list.iter().any(|p| p.core() == name);
        if !efa.is_empty() && !has("efa") {
            return vec![Finding::fail(
                id,
                "host",
                format!(
                    "EFA device(s) {} but this libfabric has no efa provider offering FI_RMA",
                    efa.join(", ")
                ),
            )
            .evidence_all(ev)
            .fix("use the libfabric from the AWS EFA installer (/opt/amazon/efa/lib)")];
        }
        let cfg = gdx_fabric::FabricConfig::default();
        match gdx_fabric::would_choose(&cfg) {
            Ok((p, why)) => {
                // Nothing is wrong with a machine without a fabric, but say what tcp means.
                let f = if p.core() == "tcp" {
                    Finding::pass(
                        id,
                        "host",
                        format!(
                            "only tcp offers RMA here: the fabric transport runs between agents \
                             of this host (loopback); gdx would use {why}"
                        ),
                    )
                } else {
                    Finding::pass(id, "host", format!("gdx would use {why}"))
                };
                vec![f.evidence_all(ev)]
            }
            Err(e) => vec![Finding::warn(id, "host", e.to_string()).evidence_all(ev)],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{run, Tree};
    use crate::Status;

    #[test]
    fn a_capture_is_not_asked_about_this_hosts_library() {
        // A capture (`--root`) describes another machine; its libfabric is not this one's.
        let t = Tree::new();
        t.file("sys/class/infiniband/rdmap0s6/ports/1/state", "4: ACTIVE");
        let fs = run(&Libfabric, &t.ctx().build());
        assert_eq!(fs.len(), 1);
        assert_eq!(fs[0].status, Status::Skip, "{fs:#?}");
        assert_eq!(efa_devices(&t.ctx().build()), Vec::<String>::new());
        t.file("sys/class/infiniband/efa_0/ports/1/state", "4: ACTIVE");
        assert_eq!(efa_devices(&t.ctx().build()), vec!["efa_0".to_string()]);
    }

    #[test]
    fn an_efa_named_like_any_rdma_device_is_found_by_its_pci_ids() {
        // Newer kernels name EFAs rdmap<bus>s<slot>; Amazon's 1d0f:efa1 says what it is.
        let t = Tree::new();
        t.pci("pci0000:00", &[], "0000:10:00.0", 0x1d0f, 0xefa1, 0x020000);
        t.rdma(
            "rdmap16s0",
            "0000:10:00.0",
            &[("4: ACTIVE", "Unspecified")],
            None,
        );
        t.nic("pci0000:00", &[], "0000:20:00.0");
        t.rdma(
            "mlx5_0",
            "0000:20:00.0",
            &[("4: ACTIVE", "InfiniBand")],
            None,
        );
        assert_eq!(efa_devices(&t.ctx().build()), vec!["rdmap16s0".to_string()]);
    }
}
