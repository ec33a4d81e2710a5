//! `probe-copy`, `probe-register` and `probe-fabric`: the active probes' results as findings.
//! A copy that fails or returns wrong bytes fails; one below half the link ceiling warns (a
//! silent slow path, like pool memory peer copies at 38 GB/s on a 478 GB/s NVLink). A GPU ×
//! RDMA device pair passes when at least one registration method works. The fabric probe
//! passes when a registered buffer written and read back through libfabric verifies.

use super::Check;
use crate::context::{pair, Context};
use crate::finding::Finding;
use crate::probe::ProbeState;
use crate::probe_fabric::FabricProbeState;
use crate::probe_rdma::RdmaProbeState;

/// The `probe-copy` check.
pub struct ProbeCopy;

/// The `probe-register` check.
pub struct ProbeRegister;

/// The `probe-fabric` check.
pub struct ProbeFabric;

/// The `probe-rdma` check.
pub struct ProbeRdma;

impl Check for ProbeRdma {
    fn id(&self) -> &'static str {
        "probe-rdma"
    }
    fn title(&self) -> &'static str {
        "active probe: 1 MiB written and read back through verbs on each RDMA device, verified"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        match ctx.rdma_probe() {
            RdmaProbeState::NotRun(why) => vec![Finding::skip(id, "host", why.clone())],
            RdmaProbeState::Ran(probes) => probes.iter().map(|p| rdma_finding(id, p)).collect(),
        }
    }
}

/// One device's probe: fail on an error, warn when the bytes verified but the NIC counted loss
/// doing it, else pass; the counter deltas are evidence either way.
fn rdma_finding(id: &str, p: &crate::probe_rdma::RdmaProbe) -> Finding {
    let ev = format!(
        "{} bytes: RDMA WRITE {}, RDMA READ {}",
        p.bytes,
        if p.write_verified {
            "verified"
        } else {
            "not verified"
        },
        if p.read_verified {
            "verified"
        } else {
            "not verified"
        }
    );
    let counters: Vec<String> = p
        .counters
        .iter()
        .map(|c| format!("NIC counters during the probe: {}", c.describe()))
        .collect();
    let loss: Vec<String> = p
        .counters
        .iter()
        .flat_map(|c| {
            c.loss()
                .map(move |d| format!("{}/{} {} +{}", c.device, c.port, d.counter, d.delta))
        })
        .collect();
    let f = match &p.error {
        Some(e) => Finding::fail(id, p.device.as_str(), e.clone()).fix(
            "see `rdma-devices`, `roce-gid` and `mtu`; `ulimit -l` must allow \
             registering 2 MiB (see `memlock`); ibv_rc_pingpong -d DEV -g GID \
             on the same port tells whether verbs work at all",
        ),
        None if !loss.is_empty() => Finding::warn(
            id,
            p.device.as_str(),
            format!(
                "{} bytes written and read back through {}, bytes verified, but the NIC counted loss doing it: {}",
                p.bytes,
                p.device,
                loss.join(", ")
            ),
        )
        .fix("loss on a loopback probe points at the port itself: check `ethtool -S` of its netdev for drops and pause frames, and doctor's roce-pfc/roce-ecn"),
        None => Finding::pass(
            id,
            p.device.as_str(),
            format!(
                "{} bytes written and read back through {} (RC, loopback on its port), bytes verified",
                p.bytes, p.device
            ),
        ),
    };
    f.evidence(ev).evidence_all(counters)
}

impl Check for ProbeFabric {
    fn id(&self) -> &'static str {
        "probe-fabric"
    }
    fn title(&self) -> &'static str {
        "active probe: a registered buffer written and read back through libfabric, verified"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        let p = match ctx.fabric_probe() {
            FabricProbeState::NotRun(why) => {
                return vec![Finding::skip(
                    id,
                    "host",
                    format!("{why} (only the fabric transport needs libfabric)"),
                )]
            }
            FabricProbeState::Ran(p) => p,
        };
        let mr = if p.mr_mode.is_empty() {
            "none".to_string()
        } else {
            p.mr_mode.join(" ")
        };
        let ev = [
            format!(
                "provider {} fabric {} domain {}, MR mode [{mr}]",
                p.provider, p.fabric, p.domain
            ),
            format!("chosen: {}", p.reason),
            format!(
                "{} bytes at offset 1: fi_write {}, fi_read {}",
                p.bytes,
                if p.write_verified {
                    "verified"
                } else {
                    "not verified"
                },
                if p.read_verified {
                    "verified"
                } else {
                    "not verified"
                }
            ),
        ];
        let f = match &p.error {
            None => Finding::pass(
                id,
                "host",
                format!(
                    "{} bytes written and read back through {} on {}, bytes verified",
                    p.bytes, p.provider, p.domain
                ),
            ),
            Some(e) => Finding::fail(id, "host", format!("through {}: {e}", p.provider)).fix(
                "see the `fabric` finding (provider, MR mode); try another provider with \
                 GDX_FABRIC_PROVIDER, and check the provider's log with FI_LOG_LEVEL=warn",
            ),
        };
        vec![f.evidence_all(ev)]
    }
}

impl Check for ProbeCopy {
    fn id(&self) -> &'static str {
        "probe-copy"
    }
    fn title(&self) -> &'static str {
        "active probe: copies GPU<->GPU and GPU<->host verified and near the link ceiling"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        let r = match ctx.probes() {
            ProbeState::NotRun(why) => return vec![Finding::skip(id, "host", why.clone())],
            ProbeState::Ran(r) => r,
        };
        let mut out: Vec<Finding> = r
            .copies
            .iter()
            .map(|c| {
                let subject = format!("{}->{}", c.from, c.to);
                let f = if let Some(e) = &c.error {
                    Finding::fail(id, subject, format!("copy {} -> {} failed: {e}", c.from, c.to))
                        .fix("run `gdx bench` for details; check dmesg for Xid errors")
                } else if c.fraction().is_some_and(|f| f < super::p2p::SLOW_FRACTION) {
                    Finding::warn(id, subject, format!("copy {} -> {} is slow: {}", c.from, c.to, c.describe()))
                        .fix("compare with `gdx bench`; look for ACS redirect, a downtrained link, pageable or pool memory, or another job on the GPU")
                } else {
                    Finding::pass(id, subject, c.describe())
                };
                f.evidence(format!("{} bytes per copy", c.bytes))
            })
            .collect();
        if r.skipped_for_time > 0 {
            out.push(Finding::skip(
                id,
                "host",
                format!(
                    "{} probe(s) not run: the probe time budget ran out",
                    r.skipped_for_time
                ),
            ));
        }
        out
    }
}

impl Check for ProbeRegister {
    fn id(&self) -> &'static str {
        "probe-register"
    }
    fn title(&self) -> &'static str {
        "active probe: GPU memory registers with each RDMA device via dma-buf or peermem"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        let r = match ctx.probes() {
            ProbeState::NotRun(why) => return vec![Finding::skip(id, "host", why.clone())],
            ProbeState::Ran(r) => r,
        };
        if let Some(why) = &r.registration_skipped {
            return vec![Finding::skip(id, "host", why.clone())];
        }
        if r.registrations.is_empty() {
            return vec![Finding::skip(
                id,
                "host",
                "no RDMA device to register GPU memory with",
            )];
        }
        r.registrations
            .iter()
            .map(|g| {
                let subject = pair(&g.gpu, &g.nic);
                let show = |e: &Option<String>| e.clone().unwrap_or_else(|| "ok".into());
                let ev = [
                    format!("dma-buf registration with {}: {}", g.rdma_device, show(&g.dmabuf_error)),
                    format!("peermem registration with {}: {}", g.rdma_device, show(&g.peermem_error)),
                ];
                match (&g.dmabuf_error, &g.peermem_error) {
                    (None, None) => Finding::pass(id, subject, format!("{} memory registers with {} via dma-buf and peermem", g.gpu, g.rdma_device)),
                    (None, Some(_)) => Finding::pass(id, subject, format!("{} memory registers with {} via dma-buf (peermem does not work)", g.gpu, g.rdma_device)),
                    (Some(_), None) => Finding::pass(id, subject, format!("{} memory registers with {} via peermem (dma-buf does not work)", g.gpu, g.rdma_device)),
                    (Some(_), Some(_)) => Finding::fail(id, subject, format!("{} memory cannot be registered with {}: GPUDirect RDMA is impossible", g.gpu, g.rdma_device))
                        .fix("see the dmabuf and peermem findings: load nvidia-peermem or use open kernel modules with kernel >= 5.12"),
                }
                .evidence_all(ev)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::{CopyProbe, ProbeResults, RegisterProbe};
    use crate::testutil::{run, Tree};
    use crate::Status;

    fn results(gbps: f64, error: Option<&str>) -> ProbeState {
        ProbeState::Ran(ProbeResults {
            copies: vec![CopyProbe {
                from: "GPU0".into(),
                to: "host".into(),
                bytes: 1 << 28,
                gbps: Some(gbps),
                ceiling_gbps: Some(63.0),
                ceiling_basis: Some("PCIe Gen5 x16".into()),
                verified: error.is_none(),
                error: error.map(str::to_string),
            }],
            registrations: vec![RegisterProbe {
                gpu: "GPU0".into(),
                nic: "NIC0".into(),
                rdma_device: "mlx5_0".into(),
                dmabuf_error: error.map(str::to_string),
                peermem_error: Some("ibv_reg_mr: Bad address (EFAULT)".into()),
            }],
            ..Default::default()
        })
    }

    #[test]
    fn good_probe_passes_bad_probe_fails() {
        let t = Tree::new();
        let mut ctx = t.ctx().build();
        ctx.set_probes(results(55.3, None));
        assert_eq!(run(&ProbeCopy, &ctx)[0].status, Status::Pass);
        let reg = run(&ProbeRegister, &ctx);
        assert_eq!(reg[0].status, Status::Pass);
        assert!(reg[0]
            .message
            .contains("via dma-buf (peermem does not work)"));
        ctx.set_probes(results(0.0, Some("bytes differ after copy: offset 0")));
        assert_eq!(run(&ProbeCopy, &ctx)[0].status, Status::Fail);
        assert_eq!(run(&ProbeRegister, &ctx)[0].status, Status::Fail);
        ctx.set_probes(results(14.1, None));
        assert_eq!(run(&ProbeCopy, &ctx)[0].status, Status::Warn);
    }

    #[test]
    fn backend_without_registration_skips_instead_of_failing() {
        let t = Tree::new();
        let mut ctx = t.ctx().build();
        ctx.set_probes(ProbeState::Ran(ProbeResults {
            registration_skipped: Some("cannot register yet".into()),
            ..Default::default()
        }));
        let fs = run(&ProbeRegister, &ctx);
        assert_eq!(fs[0].status, Status::Skip);
        assert_eq!(fs[0].reason.as_deref(), Some("cannot register yet"));
    }

    fn fabric(error: Option<&str>) -> FabricProbeState {
        FabricProbeState::Ran(crate::probe_fabric::FabricProbe {
            provider: "tcp;ofi_rxm".into(),
            fabric: "127.0.0.1/32".into(),
            domain: "lo".into(),
            mr_mode: vec![],
            reason: "tcp: named by GDX_FABRIC_PROVIDER".into(),
            bytes: 1 << 20,
            write_verified: error.is_none(),
            read_verified: error.is_none(),
            error: error.map(str::to_string),
        })
    }

    #[test]
    fn fabric_probe_pass_fail_and_skip() {
        let t = Tree::new();
        let mut ctx = t.ctx().build();
        let fs = run(&ProbeFabric, &ctx);
        assert_eq!(fs[0].status, Status::Skip);
        ctx.set_fabric_probe(fabric(None));
        let fs = run(&ProbeFabric, &ctx);
        assert_eq!(fs[0].status, Status::Pass);
        assert!(fs[0].message.contains("bytes verified"));
        let ev = fs[0].evidence.join("\n");
        assert!(
            ev.contains("provider tcp;ofi_rxm fabric 127.0.0.1/32 domain lo, MR mode [none]"),
            "{ev}"
        );
        ctx.set_fabric_probe(fabric(Some(
            "after fi_write: byte 3: expected 0x89, found 0x00",
        )));
        let fs = run(&ProbeFabric, &ctx);
        assert_eq!(fs[0].status, Status::Fail);
        assert!(fs[0].message.contains("byte 3"));
        ctx.set_fabric_probe(FabricProbeState::NotRun("libfabric.so.1 not found".into()));
        let fs = run(&ProbeFabric, &ctx);
        assert_eq!(fs[0].status, Status::Skip);
        assert!(fs[0]
            .reason
            .as_deref()
            .unwrap()
            .contains("libfabric.so.1 not found"));
    }

    #[test]
    fn not_run_skips_with_reason() {
        let t = Tree::new();
        let mut ctx = t.ctx().build();
        ctx.set_probes(ProbeState::NotRun("--no-probe".into()));
        let fs = run(&ProbeCopy, &ctx);
        assert_eq!(fs[0].reason.as_deref(), Some("--no-probe"));
    }

    #[test]
    fn the_rdma_probe_names_the_counters_that_moved() {
        use crate::probe_rdma::{RdmaProbe, RdmaProbeState};
        use gdx_topo::sysfs::counters::{CounterDelta, CounterDeltas, CounterKind};
        let probe = |moved: Vec<CounterDelta>| RdmaProbe {
            device: "rxe0".into(),
            bytes: 1 << 20,
            write_verified: true,
            read_verified: true,
            error: None,
            counters: vec![CounterDeltas {
                device: "rxe0".into(),
                port: 1,
                read: 16,
                moved,
            }],
        };
        let t = Tree::new();
        let mut ctx = t.ctx().build();
        ctx.set_rdma_probe(RdmaProbeState::Ran(vec![probe(vec![])]));
        let fs = run(&ProbeRdma, &ctx);
        assert_eq!(fs[0].status, Status::Pass, "{fs:#?}");
        assert!(fs[0].evidence.iter().any(|e| e
            == "NIC counters during the probe: rxe0/1: no loss or congestion counter moved (16 counters read)"));
        ctx.set_rdma_probe(RdmaProbeState::Ran(vec![probe(vec![CounterDelta {
            counter: "hw_counters/rcvd_seq_err".into(),
            delta: 7,
            kind: CounterKind::OutOfSequence,
        }])]));
        let fs = run(&ProbeRdma, &ctx);
        assert_eq!(fs[0].status, Status::Warn, "{fs:#?}");
        assert!(
            fs[0].message.contains("rxe0/1 hw_counters/rcvd_seq_err +7"),
            "{}",
            fs[0].message
        );
    }
}
