//! `rdma-devices`: RDMA devices in `sys/class/infiniband`, their ports' states, and whether
//! user space can open them (`/dev/infiniband/uverbs*`, missing in many containers).

use super::Check;
use crate::context::Context;
use crate::finding::Finding;

/// The `rdma-devices` check.
pub struct RdmaDevices;

impl Check for RdmaDevices {
    fn id(&self) -> &'static str {
        "rdma-devices"
    }
    fn title(&self) -> &'static str {
        "RDMA devices present, ports active, /dev/infiniband usable"
    }
    fn run(&self, ctx: &Context) -> Vec<Finding> {
        let id = self.id();
        let devs = ctx.rdma();
        if devs.is_empty() {
            let mut f = Finding::skip(
                id,
                "host",
                format!(
                    "no RDMA devices in {}: GPUDirect RDMA and RDMA transports do not apply here",
                    ctx.fs.show(gdx_topo::sysfs::devices::RDMA_CLASS)
                ),
            );
            let mods: Vec<&str> = ["ib_core", "mlx5_ib", "ib_uverbs"]
                .into_iter()
                .filter(|m| ctx.fs.exists(&format!("sys/module/{m}")))
                .collect();
            if !mods.is_empty() {
                f = f.evidence(format!(
                    "kernel RDMA modules loaded ({}), but no device registered",
                    mods.join(", ")
                ));
            }
            if let Ok(Ok(v)) = ctx.live().map(|l| &l.verbs) {
                f = f.evidence(format!(
                    "ibv_get_device_list(): {} device(s)",
                    v.devices.len()
                ));
            }
            return vec![f];
        }
        let mut out = Vec::new();
        // /dev is only meaningful on the live machine; captures do not hold it.
        let uverbs: Option<Vec<String>> = ctx.fs.exists("dev").then(|| {
            ctx.fs
                .names_or_empty("dev/infiniband")
                .into_iter()
                .filter(|n| n.starts_with("uverbs"))
                .collect()
        });
        if let Some(u) = &uverbs {
            if u.is_empty() {
                out.push(
                    Finding::fail(id, "host", "RDMA devices exist but no /dev/infiniband/uverbs* node: user space cannot open them")
                        .evidence(format!("{}: no uverbs*", ctx.fs.show("dev/infiniband")))
                        .fix("load ib_uverbs (`modprobe ib_uverbs`); in a container pass `--device=/dev/infiniband` (or the RDMA shared device plugin)"),
                );
            }
        }
        for d in devs {
            let label = ctx.nic_label(d);
            let subject = d.name.clone();
            let ev: Vec<String> = d
                .ports
                .iter()
                .map(|p| {
                    format!(
                        "{}: state {}, phys_state {}, link_layer {}, rate {}",
                        ctx.fs.show(&d.port_dir(p.port)),
                        p.state.as_deref().unwrap_or("?"),
                        p.phys_state.as_deref().unwrap_or("?"),
                        p.link_layer.as_deref().unwrap_or("?"),
                        p.rate.as_deref().unwrap_or("?")
                    )
                })
                .collect();
            let at = d
                .bdf
                .map(|b| format!(" ({label}, {b})"))
                .unwrap_or_default();
            let active = d.ports.iter().filter(|p| p.is_active()).count();
            let f = if d.ports.is_empty() {
                Finding::fail(id, subject, format!("{}{at} has no ports", d.name))
                    .fix("check the driver (dmesg | grep mlx5) and firmware")
            } else if active == 0 {
                Finding::fail(id, subject, format!("{}{at}: no port is ACTIVE", d.name))
                    .fix("check the cable and switch port; on IB make sure a subnet manager runs (`sminfo`); on RoCE bring the netdev up (`ip link set <if> up`)")
            } else if active < d.ports.len() {
                Finding::warn(
                    id,
                    subject,
                    format!("{}{at}: {active} of {} ports ACTIVE", d.name, d.ports.len()),
                )
                .fix("exclude down ports with NCCL_IB_HCA, or fix their links")
            } else {
                Finding::pass(
                    id,
                    subject,
                    format!("{}{at}: {active} port(s) ACTIVE", d.name),
                )
            };
            out.push(f.evidence_all(ev));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{run, subject, Tree};
    use crate::Status;

    #[test]
    fn none_is_a_skip_that_explains() {
        let t = Tree::new();
        t.dir("sys/module/ib_core");
        let fs = run(&RdmaDevices, &t.ctx().build());
        assert_eq!(fs[0].status, Status::Skip);
        assert!(fs[0].reason.as_deref().unwrap().contains("no RDMA devices"));
        assert!(fs[0].evidence[0].contains("ib_core"));
    }

    #[test]
    fn pass_active_fail_down_warn_mixed() {
        let t = Tree::new();
        t.nic("pci0000:00", &[], "0000:00:03.0");
        t.nic("pci0000:00", &[], "0000:00:04.0");
        t.nic("pci0000:00", &[], "0000:00:05.0");
        t.ib_rdma("0000:00:03.0");
        t.rdma("mlx5_1", "0000:00:04.0", &[("1: DOWN", "Ethernet")], None);
        t.rdma(
            "mlx5_2",
            "0000:00:05.0",
            &[("4: ACTIVE", "Ethernet"), ("1: DOWN", "Ethernet")],
            None,
        );
        let fs = run(&RdmaDevices, &t.ctx().build());
        assert_eq!(subject(&fs, "mlx5_0").status, Status::Pass);
        assert_eq!(subject(&fs, "mlx5_1").status, Status::Fail);
        assert_eq!(subject(&fs, "mlx5_2").status, Status::Warn);
        assert!(subject(&fs, "mlx5_0").evidence[0].contains("4: ACTIVE"));
    }

    #[test]
    fn missing_uverbs_on_a_live_like_root_fails() {
        let t = Tree::new();
        t.ib_nic();
        t.dir("dev/infiniband");
        t.file("dev/infiniband/rdma_cm", "");
        let fs = run(&RdmaDevices, &t.ctx().build());
        assert_eq!(subject(&fs, "host").status, Status::Fail);
        t.file("dev/infiniband/uverbs0", "");
        let fs = run(&RdmaDevices, &t.ctx().build());
        assert!(fs.iter().all(|f| f.status == Status::Pass));
    }
}
