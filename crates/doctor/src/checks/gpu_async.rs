//! `gpu-async`: the microsecond GPU paths. Per GPU: stream memory operations
//! (`cuStreamWriteValue64` / `cuStreamWaitValue64`, GPUDirect Async signalling) and mapped
//! host memory (the mailbox's ring); whether GDRCopy's `/dev/gdrdrv` exists (not needed: the
//! mailbox moves small payloads through a kernel); and the mailbox round trip the active probe
//! measured.

use super::Check;
use crate::context::Context;
use crate::finding::Finding;
use crate::probe::ProbeState;

/// The `gpu-async` check.
pub struct GpuAsync;

impl Check for GpuAsync {
    fn id(&self) -> &'static str {
        "gpu-async"
    }
    fn title(&self) -> &'static str {
        "stream memory operations, mapped host memory, gdrdrv, and the mailbox round trip"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        if ctx.gpus().is_empty() {
            return vec![Finding::skip(id, "host", ctx.no_gpu_reason())];
        }
        let mut out = Vec::new();
        match super::live_or_skip(ctx, id) {
            Err(fs) => out.extend(fs),
            Ok(live) => match &live.cuda {
                Err(u) => out.push(Finding::skip(id, "host", u.to_string())),
                Ok(cuda) => {
                    for d in &cuda.devices {
                        let subject = d
                            .bdf
                            .map(|b| ctx.label(b))
                            .unwrap_or_else(|| format!("cuda{}", d.ordinal));
                        out.push(match d.stream_mem_ops {
                            None => Finding::skip(id, subject, "stream memory operations not queried"),
                            Some(s) => {
                                let yn = |b: bool| if b { "yes" } else { "no" };
                                let text = format!(
                                    "64-bit stream write/wait {}, wait NOR {}, flush remote writes {}, mapped host memory {}",
                                    yn(s.ops_64bit && s.symbols),
                                    yn(s.wait_nor),
                                    yn(s.flush_remote_writes),
                                    yn(s.map_host_memory)
                                );
                                let ev = "CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS (122), \
                                          _STREAM_WAIT_VALUE_NOR (123), _CAN_FLUSH_REMOTE_WRITES (98), \
                                          _CAN_MAP_HOST_MEMORY (19)";
                                if s.ops_64bit && s.symbols && s.map_host_memory {
                                    Finding::pass(id, subject, text).evidence(ev)
                                } else {
                                    Finding::warn(id, subject, format!("{text}: GPUDirect Async signalling or the mailbox is unavailable"))
                                        .evidence(ev)
                                        .fix("update the NVIDIA driver (stream memory operations need CUDA 11.7+ symbols)")
                                }
                            }
                        });
                    }
                }
            },
        }
        out.push(if ctx.fs.exists("dev/gdrdrv") {
            Finding::pass(id, "host", "/dev/gdrdrv exists: GDRCopy's BAR1 mappings are available")
        } else {
            Finding::pass(
                id,
                "host",
                "no /dev/gdrdrv (GDRCopy's gdrdrv module is not loaded); not needed: gdx's mailbox moves small payloads through a kernel polling mapped host memory",
            )
        });
        match ctx.probes() {
            ProbeState::NotRun(why) => out.push(Finding::skip(id, "mailbox", why.clone())),
            ProbeState::Ran(r) if r.mailbox.is_empty() => out.push(Finding::skip(
                id,
                "mailbox",
                "the probe backend did not run the mailbox probe",
            )),
            ProbeState::Ran(r) => {
                for m in &r.mailbox {
                    let subject = format!("{} mailbox", m.gpu);
                    out.push(match (&m.error, m.p50_us) {
                        (Some(e), _) => Finding::fail(id, subject, format!("mailbox probe failed: {e}"))
                            .fix("run `cargo test -p gdx-sys --test cuda_mailbox_gpu -- --include-ignored` for details; check dmesg for Xid errors"),
                        (None, Some(us)) => Finding::pass(
                            id,
                            subject,
                            format!("mailbox round trip (8 B write then read, bytes checked) p50 {us:.2} µs"),
                        )
                        .evidence("2000 round trips, 1 SM reserved while it ran"),
                        (None, None) => Finding::skip(id, subject, "no samples"),
                    });
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::StreamMemOpsFacts;
    use crate::probe::{MailboxProbe, ProbeResults};
    use crate::testutil::{cuda_facts, run, TopoBuilder, Tree};
    use crate::Status;
    use gdx_topo::DeviceKind::Gpu;

    const A: &str = "0000:00:06.0";

    fn ctx(ops: Option<StreamMemOpsFacts>, _gdrdrv: bool, probe: Option<MailboxProbe>) -> Context {
        let t = Tree::new();
        t.gpu("pci0000:00", &[], A);
        let mut facts = cuda_facts(&[A]);
        if let Ok(c) = facts.cuda.as_mut() {
            c.devices[0].stream_mem_ops = ops;
        }
        let topo = TopoBuilder::new(0)
            .dev("GPU0", Gpu, A, "pci0000:00", &[])
            .build();
        let mut ctx = t.ctx().topo(topo).live(facts).build();
        if let Some(p) = probe {
            ctx.set_probes(ProbeState::Ran(ProbeResults {
                mailbox: vec![p],
                ..Default::default()
            }));
        }
        ctx
    }

    #[test]
    fn stream_mem_ops_gdrdrv_and_the_mailbox_probe_are_reported() {
        let all = StreamMemOpsFacts {
            ops_64bit: true,
            wait_nor: true,
            flush_remote_writes: true,
            map_host_memory: true,
            symbols: true,
        };
        let good = MailboxProbe {
            gpu: "GPU0".into(),
            p50_us: Some(1.8),
            error: None,
        };
        let fs = run(&GpuAsync, &ctx(Some(all), false, Some(good)));
        assert_eq!(fs.len(), 3, "{fs:#?}");
        assert!(fs.iter().all(|f| f.status == Status::Pass), "{fs:#?}");
        assert!(
            fs[0].message.contains("64-bit stream write/wait yes"),
            "{fs:#?}"
        );
        assert!(fs[1].message.contains("no /dev/gdrdrv"), "{fs:#?}");
        assert!(fs[2].message.contains("p50 1.80 µs"), "{fs:#?}");

        let none = StreamMemOpsFacts {
            ops_64bit: false,
            ..all
        };
        let bad = MailboxProbe {
            gpu: "GPU0".into(),
            p50_us: None,
            error: Some("cuModuleLoadData failed".into()),
        };
        let fs = run(&GpuAsync, &ctx(Some(none), false, Some(bad)));
        assert_eq!(fs[0].status, Status::Warn, "{fs:#?}");
        assert!(fs[1].message.contains("gdrdrv"), "{fs:#?}");
        assert_eq!(fs[2].status, Status::Fail, "{fs:#?}");
        // Probes not run: a skip naming why.
        let fs = run(&GpuAsync, &ctx(None, false, None));
        assert_eq!(fs[0].status, Status::Skip);
        assert_eq!(fs.last().map(|f| f.status), Some(Status::Skip));
    }
}
