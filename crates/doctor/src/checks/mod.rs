//! The checks. One check is one small unit type in its own module, registered once in
//! [`all_checks`] (nvbandwidth style). A check reads the [`Context`] and returns findings;
//! it never aborts the others: a panic inside one becomes a `skip` finding naming the bug.

use crate::context::Context;
use crate::finding::Finding;

pub mod acs;
pub mod bar1;
pub mod cuda;
pub mod cufile;
pub mod distance;
pub mod dmabuf;
pub mod driver;
pub mod fabric;
pub mod gdr_support;
pub mod gpu_async;
pub mod iommu;
pub mod link;
pub mod memlock;
pub mod mrrs;
pub mod mtu;
pub mod nccl_env;
pub mod numa;
pub mod nvmeof;
pub mod nvml;
pub mod ofi;
pub mod p2p;
pub mod peermem;
pub mod probes;
pub mod rdma;
pub mod relaxed_ordering;
pub mod roce_gid;
pub mod roce_qos;

/// One readiness check.
pub trait Check: Sync {
    /// Stable id (the JSON contract), e.g. `acs`.
    fn id(&self) -> &'static str;
    /// One line saying what it checks.
    fn title(&self) -> &'static str;
    /// Run against the context. Every finding carries [`Check::id`] as its id.
    fn run(&self, ctx: &Context) -> Vec<Finding>;
}

/// Every check, in report order.
pub fn all_checks() -> Vec<&'static dyn Check> {
    vec![
        &driver::Driver,
        &cuda::Cuda,
        &nvml::Nvml,
        &rdma::RdmaDevices,
        &peermem::PeerMem,
        &dmabuf::DmaBuf,
        &gdr_support::GdrSupport,
        &memlock::Memlock,
        &distance::GpuNicDistance,
        &numa::Numa,
        &acs::Acs,
        &iommu::Iommu,
        &link::LinkDowntrain,
        &bar1::Bar1,
        &mrrs::Mrrs,
        &p2p::P2p,
        &relaxed_ordering::RelaxedOrdering,
        &roce_gid::RoceGid,
        &mtu::Mtu,
        &roce_qos::RoceTc,
        &roce_qos::RoceTrust,
        &roce_qos::RocePfc,
        &roce_qos::RoceEcn,
        &nccl_env::NcclEnv,
        &cufile::Cufile,
        &nvmeof::NvmeofState,
        &nvmeof::NvmeofTimeouts,
        &nvmeof::NvmeofNicDistance,
        &nvmeof::NvmeofMultipath,
        &fabric::FabricManager,
        &ofi::Libfabric,
        &probes::ProbeCopy,
        &probes::ProbeRegister,
        &probes::ProbeFabric,
        &probes::ProbeRdma,
        &gpu_async::GpuAsync,
    ]
}

/// Run checks one by one. A check that returns nothing gets one `skip` so every id appears
/// in the report; a check that panics gets a `skip` naming the panic (a doctor bug, not a
/// machine problem, so it does not turn the exit code into 1).
pub fn run_checks(ctx: &Context, checks: &[&'static dyn Check]) -> Vec<Finding> {
    let mut out = Vec::new();
    for c in checks {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| c.run(ctx)));
        let mut fs = match r {
            Ok(fs) => fs,
            Err(p) => {
                let msg = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                log::error!("check {} panicked: {msg}", c.id());
                vec![Finding::skip(
                    c.id(),
                    "host",
                    format!("doctor bug: this check panicked ({msg}); please report it"),
                )]
            }
        };
        if fs.is_empty() {
            fs.push(Finding::skip(c.id(), "host", "nothing to check here"));
        }
        for f in &mut fs {
            f.id = c.id().to_string();
        }
        out.extend(fs);
    }
    out
}

/// Skip findings for checks that need live library facts when they are not available.
pub(crate) fn live_or_skip<'a>(
    ctx: &'a Context,
    id: &str,
) -> Result<&'a crate::facts::Gathered, Vec<Finding>> {
    ctx.live()
        .map_err(|why| vec![Finding::skip(id, "host", why.to_string())])
}

/// The sysfs topology for checks of RDMA ports, or the skip finding: ports unreadable, or no
/// RDMA port (with gdx-rdma's reason).
pub(crate) fn rdma_ports_or_skip<'a>(
    ctx: &'a Context,
    id: &str,
) -> Result<std::borrow::Cow<'a, gdx_topo::Topology>, Vec<Finding>> {
    let topo = ctx.sysfs_topology().map_err(|why| {
        vec![Finding::skip(
            id,
            "host",
            format!("RDMA ports unreadable: {why}"),
        )]
    })?;
    match gdx_rdma::doctor::no_rdma_port_reason(&topo, ctx.fs.root()) {
        Some(why) => Err(vec![Finding::skip(id, "host", why)]),
        None => Ok(topo),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Tree;

    struct Boom;
    impl Check for Boom {
        fn id(&self) -> &'static str {
            "boom"
        }
        fn title(&self) -> &'static str {
            "panics"
        }
        fn run(&self, _: &Context) -> Vec<Finding> {
            panic!("kaboom")
        }
    }

    #[test]
    fn a_panicking_check_does_not_stop_the_others() {
        let t = Tree::new();
        let ctx = t.ctx().build();
        let fs = run_checks(&ctx, &[&Boom, &memlock::Memlock]);
        assert_eq!(fs[0].id, "boom");
        assert_eq!(fs[0].status, crate::Status::Skip);
        assert!(fs[0].reason.as_deref().unwrap().contains("kaboom"));
        assert!(fs.iter().any(|f| f.id == "memlock"));
    }

    #[test]
    fn ids_are_unique_and_kebab_case() {
        let ids: Vec<&str> = all_checks().iter().map(|c| c.id()).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), ids.len());
        for id in ids {
            assert!(
                id.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{id}"
            );
        }
    }

    #[test]
    fn every_check_survives_an_empty_root() {
        let t = Tree::new();
        let ctx = t.ctx().build();
        let fs = run_checks(&ctx, &all_checks());
        for c in all_checks() {
            assert!(fs.iter().any(|f| f.id == c.id()), "{} missing", c.id());
        }
        // An empty folder has no GPU, no driver, nothing to fail on except memlock (no
        // proc/self/limits → skip), so nothing may fail.
        let bad: Vec<_> = fs
            .iter()
            .filter(|f| f.status == crate::Status::Fail)
            .collect();
        assert!(bad.is_empty(), "{bad:#?}");
    }
}
