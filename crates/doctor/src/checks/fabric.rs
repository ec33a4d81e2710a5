//! `fabric-manager`: on NVSwitch systems (HGX/DGX) GPUs cannot use NVLink until the fabric
//! manager has trained the fabric; NVML then reports the GPU's fabric state as completed
//! (gdr-checks B8). Without NVML, fall back to looking for the `nv-fabricmanager` process.

use super::Check;
use crate::context::Context;
use crate::finding::Finding;
use gdx_topo::NvLinkTarget;

/// The `fabric-manager` check.
pub struct FabricManager;

/// NVSwitches visible: PCI functions of NVIDIA bridge class 0x0680, plus whether any GPU's
/// NVLinks lead to an NVSwitch in the topology.
fn nvswitches(ctx: &Context) -> (Vec<String>, bool) {
    let pci: Vec<String> = ctx
        .pci()
        .map(|fns| {
            fns.iter()
                .filter(|f| f.is_nvswitch())
                .map(|f| f.bdf.to_string())
                .collect()
        })
        .unwrap_or_default();
    let linked = ctx.topology().is_ok_and(|t| {
        t.gpus().any(|g| {
            g.gpu
                .as_ref()
                .is_some_and(|i| i.nvlinks.iter().any(|l| l.target == NvLinkTarget::NvSwitch))
        })
    });
    (pci, linked)
}

/// PIDs whose `comm` is the fabric manager daemon; `None` when `/proc` has no processes
/// (a capture).
fn fm_processes(ctx: &Context) -> Option<Vec<String>> {
    let pids: Vec<String> = ctx
        .fs
        .names_or_empty("proc")
        .into_iter()
        .filter(|n| n.chars().all(|c| c.is_ascii_digit()))
        .collect();
    if pids.is_empty() {
        return None;
    }
    Some(
        pids.into_iter()
            .filter(|p| {
                ctx.fs.text(&format!("proc/{p}/comm")).as_deref() == Some("nv-fabricmanager")
            })
            .collect(),
    )
}

const FIX: &str = "`systemctl enable --now nvidia-fabricmanager` (its version must match the driver exactly); check /var/log/fabricmanager.log";

impl Check for FabricManager {
    fn id(&self) -> &'static str {
        "fabric-manager"
    }
    fn title(&self) -> &'static str {
        "NVSwitch systems: fabric manager running, GPU fabric state completed"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        if ctx.gpus().is_empty() {
            return vec![Finding::skip(id, "host", ctx.no_gpu_reason())];
        }
        let (switches, linked) = nvswitches(ctx);
        if switches.is_empty() && !linked {
            return vec![Finding::skip(
                id,
                "host",
                "no NVSwitch: fabric manager is not needed",
            )];
        }
        let mut ev = Vec::new();
        if !switches.is_empty() {
            ev.push(format!("NVSwitch PCI functions: {}", switches.join(", ")));
        }
        if linked {
            ev.push("topology: GPU NVLinks lead to NVSwitches".to_string());
        }
        let nvml = ctx.live().ok().and_then(|l| l.nvml.as_ref().ok());
        let fabric: Vec<_> = ctx
            .gpus()
            .iter()
            .filter_map(|g| {
                let d = nvml?.devices.iter().find(|d| d.bdf == Some(g.bdf))?;
                Some((g, d.fabric.clone()?))
            })
            .collect();
        if !fabric.is_empty() {
            return fabric
                .into_iter()
                .map(|(g, fi)| {
                    let e = format!(
                        "nvmlDeviceGetGpuFabricInfo: state {}, status {}",
                        fi.state,
                        fi.status.as_deref().unwrap_or("-")
                    );
                    let ok = fi.state == "completed"
                        && fi.status.as_deref().is_none_or(|s| s == "success");
                    if ok {
                        Finding::pass(
                            id,
                            g.label.clone(),
                            format!("{} joined the NVLink fabric", g.label),
                        )
                    } else {
                        Finding::fail(
                            id,
                            g.label.clone(),
                            format!(
                                "{} fabric state is {}: NVLink P2P is unavailable",
                                g.label, fi.state
                            ),
                        )
                        .fix(FIX)
                    }
                    .evidence_all(ev.clone())
                    .evidence(e)
                })
                .collect();
        }
        if switches.is_empty() {
            // NVLinks lead to NVSwitches that this OS cannot see on its PCI bus: a VM with
            // passed-through GPUs, or shared NVSwitch mode. The fabric manager runs on the host
            // or a service VM, so only the result can be checked here: does P2P work?
            return vec![match p2p_works(ctx) {
                Some(true) => Finding::pass(
                    id,
                    "host",
                    "NVSwitch fabric is up (GPU P2P works); the NVSwitches are managed outside this OS (VM or shared NVSwitch mode)",
                ),
                Some(false) => Finding::fail(
                    id,
                    "host",
                    "GPU NVLinks lead to NVSwitches but GPU P2P does not work: the fabric is not trained",
                )
                .fix("on the host or service VM that owns the NVSwitches, check nvidia-fabricmanager and its log"),
                None => Finding::skip(
                    id,
                    "host",
                    "the NVSwitches are not visible on this PCI bus (VM or shared NVSwitch mode) and P2P status is unknown",
                ),
            }
            .evidence_all(ev)];
        }
        let f = match fm_processes(ctx) {
            None => Finding::skip(id, "host", "fabric state needs NVML on the live machine, and this root holds no processes to look for nv-fabricmanager"),
            Some(p) if p.is_empty() => Finding::fail(id, "host", "NVSwitch system but nv-fabricmanager is not running: GPUs cannot use NVLink").fix(FIX),
            Some(p) => Finding::pass(id, "host", format!("nv-fabricmanager is running (pid {})", p.join(", "))),
        };
        vec![f.evidence_all(ev)]
    }
}

/// Whether GPU peer access works for some GPU pair: CUDA `can_access_peer` or NVML P2P read
/// status; `None` when neither is known.
fn p2p_works(ctx: &Context) -> Option<bool> {
    let live = ctx.live().ok()?;
    let mut known = None;
    if let Ok(c) = &live.cuda {
        for d in &c.devices {
            for (_, ok) in &d.can_access_peer {
                known = Some(known.unwrap_or(false) || *ok);
            }
        }
    }
    if let Ok(n) = &live.nvml {
        for d in &n.devices {
            for p in &d.p2p {
                if let Some(r) = &p.read {
                    known = Some(known.unwrap_or(false) || r == "OK");
                }
            }
        }
    }
    known
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::{FabricInfo, NvmlDevice, NvmlFacts, StaticFacts};
    use crate::testutil::{bdf, run, Tree};
    use crate::Status;

    fn tree() -> Tree {
        let t = Tree::new();
        t.gpu("pci0000:00", &[], "0000:00:06.0");
        t.pci("pci0000:00", &[], "0000:00:09.0", 0x10de, 0x22a3, 0x068000);
        t.file("proc/1/comm", "systemd\n");
        t
    }

    #[test]
    fn process_scan_fail_and_pass() {
        let t = tree();
        assert_eq!(
            run(&FabricManager, &t.ctx().build())[0].status,
            Status::Fail
        );
        t.file("proc/4242/comm", "nv-fabricmanager\n");
        let fs = run(&FabricManager, &t.ctx().build());
        assert_eq!(fs[0].status, Status::Pass);
        assert!(fs[0].message.contains("4242"));
    }

    #[test]
    fn nvml_fabric_state_decides() {
        let t = tree();
        let mut f = StaticFacts::none();
        let dev = |state: &str| NvmlDevice {
            bdf: Some(bdf("0000:00:06.0")),
            fabric: Some(FabricInfo {
                state: state.into(),
                status: Some("success".into()),
            }),
            ..Default::default()
        };
        f.nvml = Ok(NvmlFacts {
            driver_version: None,
            devices: vec![dev("in_progress")],
        });
        assert_eq!(
            run(&FabricManager, &t.ctx().live(f.clone()).build())[0].status,
            Status::Fail
        );
        f.nvml = Ok(NvmlFacts {
            driver_version: None,
            devices: vec![dev("completed")],
        });
        assert_eq!(
            run(&FabricManager, &t.ctx().live(f).build())[0].status,
            Status::Pass
        );
    }

    #[test]
    fn vm_with_nvswitch_links_but_no_visible_switch_judges_by_p2p() {
        use crate::testutil::{cuda_facts, TopoBuilder};
        use gdx_topo::DeviceKind::Gpu;
        let t = Tree::new();
        t.gpu("pci0000:00", &[], "0000:00:06.0");
        t.gpu("pci0000:00", &[], "0000:00:07.0");
        t.file("proc/1/comm", "init\n");
        let mut topo = TopoBuilder::new(0)
            .dev("GPU0", Gpu, "0000:00:06.0", "pci0000:00", &[])
            .dev("GPU1", Gpu, "0000:00:07.0", "pci0000:00", &[])
            .build();
        for d in &mut topo.devices {
            if let Some(g) = d.gpu.as_mut() {
                g.nvlinks.push(gdx_topo::NvLink {
                    target: NvLinkTarget::NvSwitch,
                    count: 18,
                });
            }
        }
        let f = cuda_facts(&["0000:00:06.0", "0000:00:07.0"]);
        let fs = run(
            &FabricManager,
            &t.ctx().topo(topo.clone()).live(f.clone()).build(),
        );
        assert_eq!(fs[0].status, Status::Pass, "{fs:#?}");
        let mut bad = f;
        if let Ok(c) = bad.cuda.as_mut() {
            for d in &mut c.devices {
                d.can_access_peer.iter_mut().for_each(|p| p.1 = false);
            }
        }
        let fs = run(
            &FabricManager,
            &t.ctx().topo(topo.clone()).live(bad).build(),
        );
        assert_eq!(fs[0].status, Status::Fail);
        assert_eq!(
            run(&FabricManager, &t.ctx().topo(topo).build())[0].status,
            Status::Skip
        );
    }

    #[test]
    fn no_nvswitch_skips() {
        let t = Tree::new();
        t.gpu("pci0000:00", &[], "0000:00:06.0");
        assert_eq!(
            run(&FabricManager, &t.ctx().build())[0].status,
            Status::Skip
        );
    }
}
