//! NVMe over Fabrics controllers ([`gdx_topo::nvmeof`]), four checks:
//! - `nvmeof-state`: each controller is `live` (anything else: its I/O is queued or failing);
//! - `nvmeof-timeouts`: what a reader waits for when the target goes away. With the kernel's
//!   defaults (`ctrl_loss_tmo` 600 s, `fast_io_fail_tmo` off) I/O sits in uninterruptible
//!   sleep for ten minutes with no error; `fast_io_fail_tmo` fails it after that many seconds
//!   while reconnects go on;
//! - `nvmeof-nic-distance`: the PCIe class from each GPU to the NIC carrying the controller,
//!   which decides whether GPUDirect Storage over NVMe-oF can move data NIC → GPU directly;
//! - `nvmeof-multipath`: how many paths (controllers of the subsystem) serve the namespaces,
//!   and whether all of them are live.

use super::Check;
use crate::context::Context;
use crate::finding::Finding;
use gdx_topo::nvmeof::{controllers, Controller, Timeout};
use gdx_topo::PathClass;

/// `nvmeof-state`.
pub struct NvmeofState;
/// `nvmeof-timeouts`.
pub struct NvmeofTimeouts;
/// `nvmeof-nic-distance`.
pub struct NvmeofNicDistance;
/// `nvmeof-multipath`.
pub struct NvmeofMultipath;

fn each(
    ctx: &Context,
    id: &str,
    judge: impl Fn(&Controller, &[Controller]) -> Finding,
) -> Vec<Finding> {
    let all = controllers(&ctx.fs);
    if all.is_empty() {
        return vec![Finding::skip(
            id,
            "host",
            format!(
                "no NVMe-oF controller ({} lists none with transport rdma, tcp, fc or loop)",
                ctx.fs.show("sys/class/nvme")
            ),
        )];
    }
    all.iter()
        .map(|c| {
            let f = judge(c, &all);
            let mut ev = vec![format!(
                "{}: transport {}, address {}, state {}, namespaces {}",
                ctx.fs.show(&format!("sys/class/nvme/{}", c.name)),
                c.transport,
                c.address,
                c.state.as_deref().unwrap_or("?"),
                if c.namespaces.is_empty() {
                    "none".to_string()
                } else {
                    c.namespaces.join(", ")
                }
            )];
            ev.extend(f.evidence.iter().cloned());
            Finding { evidence: ev, ..f }
        })
        .collect()
}

impl Check for NvmeofState {
    fn id(&self) -> &'static str {
        "nvmeof-state"
    }
    fn title(&self) -> &'static str {
        "each NVMe-oF controller is live"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        each(ctx, id, |c, _| {
            match c.state.as_deref() {
            Some("live") => Finding::pass(id, c.name.as_str(), format!("{} is live: {}", c.name, c.fabric_path())),
            other => Finding::fail(
                id,
                c.name.as_str(),
                format!(
                    "{} is {}, not live: I/O to {} is queued or failing while the kernel reconnects to {}",
                    c.name,
                    other.map(|s| format!("'{s}'")).unwrap_or("in an unknown state".into()),
                    if c.namespaces.is_empty() { "its namespaces".to_string() } else { c.namespaces.join(", ") },
                    c.target()
                ),
            )
            .fix(format!(
                "check the target and the path to it (`ping {}`, `rdma link show`); `nvme disconnect -d {}` gives up on it, `nvme connect` makes it again",
                c.traddr.as_deref().unwrap_or("<traddr>"),
                c.name
            )),
        }
        })
    }
}

/// How long I/O waits once the target stops answering, and why.
fn wait_for(c: &Controller) -> (Option<u32>, String) {
    let kato = c
        .kato
        .map(|k| format!("; keep-alive notices a silent target within about {k} s"))
        .unwrap_or_default();
    match (c.fast_io_fail_tmo, c.ctrl_loss_tmo) {
        (Some(Timeout::Secs(f)), _) => (
            Some(f),
            format!("I/O fails {f} s after the connection is lost (fast_io_fail_tmo{kato}) while reconnects go on"),
        ),
        (_, Some(Timeout::Secs(l))) => (
            Some(l),
            format!("I/O sits in uninterruptible sleep for up to {l} s (ctrl_loss_tmo, with fast_io_fail_tmo off{kato}), then fails and the controller is removed"),
        ),
        (_, Some(Timeout::Off)) => (
            None,
            "I/O waits forever: ctrl_loss_tmo and fast_io_fail_tmo are both off".into(),
        ),
        (_, None) => (None, "ctrl_loss_tmo is not readable".into()),
    }
}

/// Longer than this and a user sees a hang, not an error.
const PATIENCE_S: u32 = 30;

impl Check for NvmeofTimeouts {
    fn id(&self) -> &'static str {
        "nvmeof-timeouts"
    }
    fn title(&self) -> &'static str {
        "what I/O waits for when an NVMe-oF target goes away (ctrl_loss_tmo, fast_io_fail_tmo)"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        each(ctx, id, |c, _| {
            let ev = vec![format!(
                "ctrl_loss_tmo {}, fast_io_fail_tmo {}, reconnect_delay {}, kato {}",
                c.ctrl_loss_tmo.map(|t| t.to_string()).unwrap_or("?".into()),
                c.fast_io_fail_tmo
                    .map(|t| t.to_string())
                    .unwrap_or("?".into()),
                c.reconnect_delay
                    .map(|t| format!("{t} s"))
                    .unwrap_or("?".into()),
                c.kato.map(|t| format!("{t} s")).unwrap_or("?".into()),
            )];
            let (secs, what) = wait_for(c);
            let msg = format!("if {} goes away: {what}", c.target());
            let fix = format!(
                "`echo 5 > /sys/class/nvme/{}/fast_io_fail_tmo` (I/O fails after 5 s, reconnects go on), or connect with `nvme connect ... --fast_io_fail_tmo=5 --ctrl-loss-tmo=60`",
                c.name
            );
            match secs {
                Some(s) if s <= PATIENCE_S => Finding::pass(id, c.name.as_str(), msg),
                _ => Finding::warn(id, c.name.as_str(), msg).fix(fix),
            }
            .evidence_all(ev)
        })
    }
}

impl Check for NvmeofNicDistance {
    fn id(&self) -> &'static str {
        "nvmeof-nic-distance"
    }
    fn title(&self) -> &'static str {
        "the NIC carrying each NVMe-oF controller is close to the GPUs (GPUDirect Storage over NVMe-oF)"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        let topo = ctx.sysfs_topology();
        each(ctx, id, |c, _| {
            let ev = c.carrier.evidence.clone();
            let Some(dev) = c.carrier.rdma_device.as_deref() else {
                let why = if c.transport == "rdma" {
                    format!(
                        "{}: the RDMA device carrying it is not known (see the evidence)",
                        c.name
                    )
                } else {
                    format!("{}: transport {} (no RDMA device; GPUDirect Storage needs NVMe-oF over RDMA)", c.name, c.transport)
                };
                return Finding::skip(id, c.name.as_str(), why).evidence_all(ev);
            };
            if ctx.rdma().iter().any(|d| d.name == dev && d.bdf.is_none()) {
                return Finding::warn(
                    id,
                    c.name.as_str(),
                    format!("{} is carried by {dev}, software RDMA: the CPU copies every byte, so GPUDirect Storage over it cannot be direct", c.name),
                )
                .fix("serve the namespace through a hardware RDMA NIC (ConnectX, ...) on the GPUs' PCIe switch")
                .evidence_all(ev);
            }
            let classes = match &topo {
                Ok(t) => c.gpu_classes(t),
                Err(e) => {
                    return Finding::skip(id, c.name.as_str(), format!("topology unreadable: {e}"))
                        .evidence_all(ev)
                }
            };
            if classes.is_empty() {
                return Finding::skip(
                    id,
                    c.name.as_str(),
                    format!("{} is carried by {dev}; no GPU here to be near it", c.name),
                )
                .evidence_all(ev);
            }
            let far: Vec<String> = classes
                .iter()
                .filter(|(_, k)| !matches!(k, Some(PathClass::Pix | PathClass::Pxb)))
                .map(|(g, k)| {
                    format!(
                        "{g} {}",
                        k.map(|k| k.to_string()).unwrap_or("unknown".into())
                    )
                })
                .collect();
            let all: Vec<String> = classes
                .iter()
                .map(|(g, k)| {
                    format!(
                        "{g}-{dev}: {}",
                        k.map(|k| k.to_string()).unwrap_or("unknown".into())
                    )
                })
                .collect();
            let f = if far.is_empty() {
                Finding::pass(id, c.name.as_str(), format!("{} is carried by {dev}, behind the same PCIe switch as every GPU: NIC → GPU can be direct", c.name))
            } else {
                Finding::warn(
                    id,
                    c.name.as_str(),
                    format!("{} is carried by {dev}, which is not behind a PCIe switch shared with {}: GPUDirect Storage reads cross the root complex or the CPU", c.name, far.join(", ")),
                )
                .fix("connect the controller through the NIC nearest the GPUs that read it (`nvme connect ... --host-traddr=<that NIC's address>`); `gdx topo` shows the classes")
            };
            f.evidence_all(ev).evidence_all(all)
        })
    }
}

impl Check for NvmeofMultipath {
    fn id(&self) -> &'static str {
        "nvmeof-multipath"
    }
    fn title(&self) -> &'static str {
        "the paths serving each NVMe-oF subsystem, and that all are live"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        let mp = ctx
            .fs
            .text("sys/module/nvme_core/parameters/multipath")
            .map(|t| t.trim().to_string());
        each(ctx, id, |c, all| {
            let mut ev = vec![format!(
                "{}: {}",
                ctx.fs.show("sys/module/nvme_core/parameters/multipath"),
                mp.as_deref().unwrap_or("not readable")
            )];
            if let Some(p) = &c.iopolicy {
                ev.push(format!(
                    "{} iopolicy: {p}",
                    c.subsystem.as_deref().unwrap_or("?")
                ));
            }
            let states: Vec<(String, String)> = c
                .paths
                .iter()
                .map(|p| {
                    let st = all
                        .iter()
                        .find(|o| &o.name == p)
                        .and_then(|o| o.state.clone())
                        .unwrap_or("?".into());
                    (p.clone(), st)
                })
                .collect();
            ev.push(format!(
                "paths: {}",
                states
                    .iter()
                    .map(|(p, s)| format!("{p} {s}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            let down: Vec<&str> = states
                .iter()
                .filter(|(_, s)| s != "live")
                .map(|(p, _)| p.as_str())
                .collect();
            let f = if states.len() <= 1 {
                Finding::pass(
                    id,
                    c.name.as_str(),
                    format!("{}: one path to {} (no multipath): losing this NIC or link loses the namespaces until it reconnects", c.name, c.target()),
                )
            } else if down.is_empty() {
                Finding::pass(
                    id,
                    c.name.as_str(),
                    format!("{}: {} paths, all live", c.name, states.len()),
                )
            } else {
                Finding::warn(
                    id,
                    c.name.as_str(),
                    format!(
                        "{}: {} of {} paths are not live ({}): I/O runs on the rest",
                        c.name,
                        down.len(),
                        states.len(),
                        down.join(", ")
                    ),
                )
                .fix("see `nvmeof-state` for each path; `nvme list-subsys` shows them")
            };
            f.evidence_all(ev)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::run;
    use crate::Status;
    use gdx_topo::fixture::{NvmeofCtrl, RdmaPort, SysfsFixture};

    fn vm_a() -> (tempfile::TempDir, crate::context::Context) {
        let dir = tempfile::tempdir().unwrap();
        let mut f = SysfsFixture::new(dir.path());
        f.host_bridge("0000:00", Some(0));
        f.virtual_netdev("eth0");
        f.software_rdma(
            "rxe0",
            "eth0",
            &[RdmaPort::roce(1, "eth0", [198, 51, 100, 1])],
        );
        f.nvmeof_controller(&NvmeofCtrl::rdma("198.51.100.2"));
        f.ipv4_routes(&[("eth0", [198, 51, 100, 0], 24)]);
        f.file("sys/module/nvme_core/parameters/multipath", "Y\n");
        let ctx = ctx_at(dir.path());
        (dir, ctx)
    }

    fn ctx_at(p: &std::path::Path) -> crate::context::Context {
        crate::context::Context::new(
            p,
            Default::default(),
            Err(crate::DoctorError::NoTopology),
            Err(crate::DoctorError::NoLiveFacts),
        )
    }

    #[test]
    fn a_live_controller_passes_and_names_its_fabric_path() {
        let (_d, ctx) = vm_a();
        let fs = run(&NvmeofState, &ctx);
        assert_eq!(fs[0].status, Status::Pass, "{fs:#?}");
        assert!(
            fs[0]
                .message
                .contains("nvme0 over rdma via rxe0/1 (eth0) to 198.51.100.2:4420"),
            "{}",
            fs[0].message
        );
        assert!(fs[0].evidence[0].contains("transport rdma, address traddr=198.51.100.2,trsvcid=4420, state live, namespaces nvme0n1"));
    }

    #[test]
    fn a_controller_that_lost_its_target_fails() {
        let (d, _) = vm_a();
        std::fs::write(d.path().join("sys/class/nvme/nvme0/state"), "connecting\n").unwrap();
        let fs = run(&NvmeofState, &ctx_at(d.path()));
        assert_eq!(fs[0].status, Status::Fail, "{fs:#?}");
        assert!(
            fs[0].message.contains("nvme0 is 'connecting', not live"),
            "{}",
            fs[0].message
        );
        assert!(fs[0]
            .fix
            .as_deref()
            .unwrap()
            .contains("nvme disconnect -d nvme0"));
    }

    #[test]
    fn default_timeouts_warn_with_what_a_user_waits_for() {
        let (d, ctx) = vm_a();
        let fs = run(&NvmeofTimeouts, &ctx);
        assert_eq!(fs[0].status, Status::Warn, "{fs:#?}");
        assert!(
            fs[0]
                .message
                .contains("uninterruptible sleep for up to 600 s"),
            "{}",
            fs[0].message
        );
        assert!(fs[0]
            .fix
            .as_deref()
            .unwrap()
            .starts_with("`echo 5 > /sys/class/nvme/nvme0/fast_io_fail_tmo`"));
        assert!(
            fs[0].evidence.iter().any(|e| e
                == "ctrl_loss_tmo 600 s, fast_io_fail_tmo off, reconnect_delay 10 s, kato 5 s"),
            "{fs:#?}"
        );
        std::fs::write(
            d.path().join("sys/class/nvme/nvme0/fast_io_fail_tmo"),
            "5\n",
        )
        .unwrap();
        let fs = run(&NvmeofTimeouts, &ctx_at(d.path()));
        assert_eq!(fs[0].status, Status::Pass, "{fs:#?}");
        assert!(
            fs[0]
                .message
                .contains("I/O fails 5 s after the connection is lost"),
            "{}",
            fs[0].message
        );
        std::fs::write(
            d.path().join("sys/class/nvme/nvme0/fast_io_fail_tmo"),
            "off\n",
        )
        .unwrap();
        std::fs::write(d.path().join("sys/class/nvme/nvme0/ctrl_loss_tmo"), "off\n").unwrap();
        let fs = run(&NvmeofTimeouts, &ctx_at(d.path()));
        assert_eq!(fs[0].status, Status::Warn);
        assert!(fs[0].message.contains("waits forever"));
    }

    #[test]
    fn a_software_carrier_cannot_be_direct_and_a_hardware_one_is_measured() {
        let (_d, ctx) = vm_a();
        let fs = run(&NvmeofNicDistance, &ctx);
        assert_eq!(fs[0].status, Status::Warn, "{fs:#?}");
        assert!(
            fs[0].message.contains("rxe0, software RDMA"),
            "{}",
            fs[0].message
        );

        // A ConnectX behind the GPU's switch carries it: PIX, direct.
        let dir = tempfile::tempdir().unwrap();
        let mut f = SysfsFixture::new(dir.path());
        let rp = f.root_port("0000:00", "0000:00:01.0", Some(0));
        let sw = f.switch_below(&rp, "0000:01:00.0", &["0000:02:00.0", "0000:02:01.0"]);
        f.gpu(&sw.downstream[0], "0000:03:00.0");
        let nic = f.nic(&sw.downstream[1], "0000:04:00.0");
        f.rdma(&nic, "mlx5_0", &[RdmaPort::roce(1, "eth2", [10, 0, 0, 1])]);
        f.netdev(&nic, "eth2", Some(200_000));
        f.nvmeof_controller(&NvmeofCtrl::rdma("10.0.0.9"));
        f.ipv4_routes(&[("eth2", [10, 0, 0, 0], 24)]);
        let fs = run(&NvmeofNicDistance, &ctx_at(dir.path()));
        assert_eq!(fs[0].status, Status::Pass, "{fs:#?}");
        assert!(
            fs[0].evidence.iter().any(|e| e == "GPU0-mlx5_0: PIX"),
            "{fs:#?}"
        );
    }

    #[test]
    fn one_path_is_said_and_a_dead_second_path_warns() {
        let (d, ctx) = vm_a();
        let fs = run(&NvmeofMultipath, &ctx);
        assert_eq!(fs[0].status, Status::Pass, "{fs:#?}");
        assert!(fs[0].message.contains("one path"), "{}", fs[0].message);
        let mut f = SysfsFixture::new(d.path());
        f.nvmeof_controller(&NvmeofCtrl {
            instance: 1,
            ..NvmeofCtrl::rdma("198.51.100.2")
        });
        std::fs::write(d.path().join("sys/class/nvme/nvme1/state"), "connecting\n").unwrap();
        let fs = run(&NvmeofMultipath, &ctx_at(d.path()));
        let f0 = fs.iter().find(|f| f.subject == "nvme0").unwrap();
        assert_eq!(f0.status, Status::Warn, "{fs:#?}");
        assert!(
            f0.message.contains("1 of 2 paths are not live (nvme1)"),
            "{}",
            f0.message
        );
    }

    #[test]
    fn no_fabric_controller_is_a_skip() {
        let d = tempfile::tempdir().unwrap();
        let fs = run(&NvmeofState, &ctx_at(d.path()));
        assert_eq!(fs[0].status, Status::Skip);
        assert!(fs[0]
            .reason
            .as_deref()
            .unwrap()
            .starts_with("no NVMe-oF controller"));
    }
}
