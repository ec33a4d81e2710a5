//! `<nic>` and `<net>` elements: one NIC per `<nic>`, named by its first net.

use super::{CpuCtx, Parser, MAX_PER_DEVICE};
use crate::error::TopoError;
use crate::model::{Device, DeviceKind, NicPort};
use roxmltree::Node;
use std::collections::HashSet;

impl Parser<'_, '_> {
    /// `<net>` children of a `<nic>` into the device's NIC facts.
    pub(super) fn nets(&mut self, nic: Node, d: &mut Device) -> Result<(), TopoError> {
        self.check_children(nic, &["net"])?;
        let mut names: Vec<String> = Vec::new();
        let mut named: HashSet<&str> = HashSet::new();
        let mut ports = Vec::new();
        let mut speed_mbps = None;
        if let Some(extra) = nic
            .children()
            .filter(|n| n.has_tag_name("net"))
            .nth(MAX_PER_DEVICE)
        {
            return Err(self.a.elem_err(
                extra,
                &format!("<nic> with more than {MAX_PER_DEVICE} <net> elements: no NIC has"),
            ));
        }
        for net in nic.children().filter(|n| n.has_tag_name("net")) {
            self.a.opt_int(net, "dev")?;
            self.a.opt_int(net, "gdr")?;
            let speed = self.a.opt_u64(net, "speed")?.filter(|s| *s > 0);
            let port = self.a.opt_u32(net, "port")?.unwrap_or(0);
            if let Some(name) = net
                .attribute("name")
                .map(str::trim)
                .filter(|s| !s.is_empty())
            {
                if named.insert(name) {
                    names.push(name.to_string());
                }
            }
            speed_mbps = speed_mbps.or(speed);
            ports.push(NicPort {
                port,
                rate_gbps: speed.map(|s| s as f64 / 1000.0),
                ..NicPort::default()
            });
        }
        if names.len() > 1 {
            let line = self.a.line_of(nic);
            self.note(format!(
                "<nic> (line {line}) holds several net devices ({}): modelled as one NIC named {}",
                names.join(", "),
                names[0]
            ));
        }
        let info = d.nic.get_or_insert_with(Default::default);
        info.rdma_name = names.first().cloned();
        if let Some(name) = names.first().filter(|n| is_netdev_name(n)) {
            info.netdevs.push(name.clone());
        }
        info.ports = ports;
        info.speed_mbps = speed_mbps;
        d.name = info.rdma_name.clone().or(d.name.take());
        Ok(())
    }

    /// A `<nic>` directly under `<cpu>`: a NIC NCCL knows only by its nets (no PCI address).
    pub(super) fn cpu_nic(&mut self, node: Node, ctx: &CpuCtx) -> Result<(), TopoError> {
        if !node.children().any(|n| n.has_tag_name("net")) {
            self.check_children(node, &["net"])?;
            let line = self.a.line_of(node);
            self.note(format!(
                "<nic> without <net> under <cpu> (line {line}): ignored"
            ));
            return Ok(());
        }
        let mut d = self.new_device(DeviceKind::Nic, None, ctx);
        self.nets(node, &mut d)?;
        self.push_device(d, node)
    }
}

/// True for kernel interface names (`eth0`, `ens1f0`, `ib0`, `bond0`): NCCL's socket
/// transport names its nets so, where the IB transport uses RDMA device names (`mlx5_0`).
fn is_netdev_name(name: &str) -> bool {
    const PREFIXES: [&str; 12] = [
        "eth", "en", "ib", "bond", "team", "br", "lo", "wl", "vlan", "veth", "hsn", "docker",
    ];
    PREFIXES.iter().any(|p| name.starts_with(p))
}
