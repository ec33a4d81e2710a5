//! The model to NCCL topology XML, in the layout NCCL's own dumps use so that NCCL's
//! hand-written parser (which knows no XML declaration, tabs or line breaks inside a tag)
//! reads it.

use super::{cpumask, CpuIdentity};
use crate::model::{
    kind_from_class, Device, DeviceKind, Link, NvLinkTarget, PciAddr, SwitchId, Topology,
};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// What [`super::parse`] reads as a hidden NVLink peer; NCCL writes it for peers NVML cannot
/// name and then assumes an NVSwitch.
const HIDDEN_PEER: &str = "fffffff:ffff:ff";

/// One element to write.
struct Elem {
    name: &'static str,
    attrs: Vec<(&'static str, String)>,
    children: Vec<Elem>,
}

impl Elem {
    fn new(name: &'static str) -> Elem {
        Elem {
            name,
            attrs: Vec::new(),
            children: Vec::new(),
        }
    }

    fn attr(mut self, key: &'static str, value: impl ToString) -> Elem {
        self.attrs.push((key, value.to_string()));
        self
    }

    fn write(&self, indent: usize, out: &mut String) {
        out.extend(std::iter::repeat_n(' ', indent));
        out.push('<');
        out.push_str(self.name);
        for (k, v) in &self.attrs {
            let _ = write!(out, " {k}=\"{}\"", escape(v));
        }
        if self.children.is_empty() {
            out.push_str("/>\n");
            return;
        }
        out.push_str(">\n");
        for c in &self.children {
            c.write(indent + 2, out);
        }
        out.extend(std::iter::repeat_n(' ', indent));
        let _ = writeln!(out, "</{}>", self.name);
    }
}

/// Escape an attribute value. Characters XML 1.0 cannot carry at all become `?`.
fn escape(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '&' => s.push_str("&amp;"),
            '<' => s.push_str("&lt;"),
            '>' => s.push_str("&gt;"),
            '"' => s.push_str("&quot;"),
            '\'' => s.push_str("&apos;"),
            '\t' => s.push_str("&#9;"),
            '\n' => s.push_str("&#10;"),
            '\r' => s.push_str("&#13;"),
            c if (c as u32) < 0x20 || c == '\u{fffe}' || c == '\u{ffff}' => s.push('?'),
            c => s.push(c),
        }
    }
    s
}

/// Switches and devices below one CPU, as a tree keyed by the attachment chains.
#[derive(Default)]
struct Tree {
    switches: Vec<(SwitchId, Tree)>,
    devices: Vec<usize>,
}

impl Tree {
    fn insert(&mut self, chain: &[SwitchId], dev: usize) {
        match chain.split_first() {
            None => self.devices.push(dev),
            Some((first, rest)) => {
                let pos = match self.switches.iter().position(|(id, _)| id == first) {
                    Some(p) => p,
                    None => {
                        self.switches.push((*first, Tree::default()));
                        self.switches.len() - 1
                    }
                };
                self.switches[pos].1.insert(rest, dev);
            }
        }
    }
}

/// One `<cpu>` to write.
#[derive(Default)]
struct Cpu {
    cpus: Option<String>,
    tree: Tree,
    /// NICs known by their nets only, placed directly under the CPU.
    bare_nics: Vec<usize>,
}

struct Writer<'a> {
    topo: &'a Topology,
    /// NCCL numbers its nets 0.. in one sequence; it renumbers them on load anyway.
    next_net: u32,
}

pub(super) fn export(topo: &Topology, identity: Option<&CpuIdentity>) -> String {
    // numaid -> CPU; -1 (NCCL's own "NUMA node unknown") for devices of no known node.
    let mut cpus: BTreeMap<i64, Cpu> = BTreeMap::new();
    for n in &topo.numa_nodes {
        let cpu = cpus.entry(i64::from(n.id)).or_default();
        if !n.cpus.is_empty() {
            cpu.cpus = Some(n.cpus.clone());
        }
    }
    // A device whose platform gives no node (VMs report -1) goes under the node its CPU
    // affinity names, or the machine's only node: NCCL's `numaid="-1"` beside an empty real
    // node would put every device on a CPU that does not exist.
    let sole_node = match topo.numa_nodes.as_slice() {
        [one] => Some(one.id),
        _ => None,
    };
    let numa_key = |d: &Device| -> i64 {
        d.numa
            .or_else(|| {
                d.attach
                    .host_bridge
                    .as_deref()
                    .and_then(|h| topo.host_bridge_numa(h))
            })
            .or_else(|| match topo.numa_affinity(d).as_slice() {
                [one] => Some(*one),
                _ => None,
            })
            .or(sole_node)
            .map_or(-1, i64::from)
    };
    for (i, d) in topo.devices.iter().enumerate() {
        let cpu = cpus.entry(numa_key(d)).or_default();
        if d.bdf.is_some() {
            // An id outside the switch table breaks the model's invariant; such a switch
            // cannot be written, so the device goes where the chain is still valid.
            let chain: Vec<SwitchId> = d
                .attach
                .switches
                .iter()
                .copied()
                .take_while(|s| s.0 < topo.switches.len())
                .collect();
            cpu.tree.insert(&chain, i);
        } else if d.kind == DeviceKind::Nic {
            cpu.bare_nics.push(i);
        }
    }
    // Without a node's own CPU list, the devices' common affinity (from sysfs) is as good.
    for (numa, cpu) in cpus.iter_mut() {
        if cpu.cpus.is_none() {
            let mut affinities = topo
                .devices
                .iter()
                .filter(|d| numa_key(d) == *numa && d.cpu_affinity.is_some());
            if let Some(first) = affinities.next() {
                if affinities.all(|d| d.cpu_affinity == first.cpu_affinity) {
                    cpu.cpus = first.cpu_affinity.clone();
                }
            }
        }
    }

    // Masks of one width, as the kernel's cpumap files (and so NCCL's dumps) have them.
    let masks: BTreeMap<i64, String> = cpus
        .iter()
        .filter_map(|(n, c)| Some((*n, cpumask::list_to_mask(c.cpus.as_deref()?)?)))
        .collect();
    let width = masks.values().map(|m| m.len()).max().unwrap_or(0);

    let mut w = Writer { topo, next_net: 0 };
    let mut system = Elem::new("system").attr("version", 1);
    for (numa, cpu) in &cpus {
        let mut el = Elem::new("cpu").attr("numaid", numa);
        if let Some(mask) = masks.get(numa) {
            let pad = "00000000,".repeat((width - mask.len()) / 9);
            el = el.attr("affinity", format!("{pad}{mask}"));
        }
        if let Some(id) = identity {
            el = el.attr("arch", &id.arch);
            if let Some(v) = &id.vendor {
                el = el.attr("vendor", v);
            }
            if let Some(f) = id.family {
                el = el.attr("familyid", f);
            }
            if let Some(m) = id.model {
                el = el.attr("modelid", m);
            }
        }
        el.children = w.tree(&cpu.tree);
        for &i in &cpu.bare_nics {
            if let Some(nic) = w.nic(&topo.devices[i]) {
                el.children.push(nic);
            }
        }
        system.children.push(el);
    }
    let mut out = String::from("<!-- NCCL topology (NCCL_TOPO_FILE) written by gdx -->\n");
    system.write(0, &mut out);
    out
}

/// `link_speed` and `link_width` as NCCL writes them. NCCL's figure is the slower of the
/// device's and its port's maximum, so the maximum is preferred over the current speed (an
/// idle GPU drops its link). Unknown figures are left out so that NCCL reads them from sysfs,
/// except on virtual bridges, which have no sysfs entry: there NCCL's own "unknown" values.
fn link_attrs(mut el: Elem, current: Link, max: Link, is_virtual: bool) -> Elem {
    let speed = max.speed_gts.or(current.speed_gts);
    let width = max.width.or(current.width);
    match speed {
        Some(s) => el = el.attr("link_speed", format!("{s:.1} GT/s PCIe")),
        None if is_virtual => el = el.attr("link_speed", ""),
        None => {}
    }
    match width {
        Some(w) => el = el.attr("link_width", w),
        None if is_virtual => el = el.attr("link_width", 0),
        None => {}
    }
    el
}

fn hex_id(v: u16) -> String {
    format!("{v:#06x}")
}

impl Writer<'_> {
    /// Children of a CPU or switch, in bus order as NCCL keeps them.
    fn tree(&mut self, tree: &Tree) -> Vec<Elem> {
        let topo = self.topo;
        let mut items: Vec<(PciAddr, Elem)> = Vec::new();
        for (id, sub) in &tree.switches {
            let sw = &topo.switches[id.0];
            let mut el = Elem::new("pci")
                .attr("busid", sw.upstream)
                .attr("class", "0x060400");
            if let Some(v) = sw.vendor {
                el = el.attr("vendor", hex_id(v));
            }
            if let Some(d) = sw.device_id {
                el = el.attr("device", hex_id(d));
            }
            el = link_attrs(el, sw.link.current, sw.link.max, sw.is_virtual);
            el.children = self.tree(sub);
            items.push((sw.upstream, el));
        }
        for &i in &tree.devices {
            let d = &topo.devices[i];
            if let Some(bdf) = d.bdf {
                items.push((bdf, self.leaf(d, bdf)));
            }
        }
        items.sort_by_key(|(bdf, _)| *bdf);
        items.into_iter().map(|(_, el)| el).collect()
    }

    fn leaf(&mut self, d: &Device, bdf: PciAddr) -> Elem {
        // Without its class a re-read could not tell what the device is; NCCL replaces the
        // class from sysfs where the device exists.
        let class = d.class.unwrap_or(match d.kind {
            DeviceKind::Gpu => 0x03_0200,
            DeviceKind::Nic => 0x02_0000,
            DeviceKind::Nvme => 0x01_0802,
        });
        let mut el = Elem::new("pci")
            .attr("busid", bdf)
            .attr("class", format!("{class:#08x}"));
        if let Some(v) = d.vendor {
            el = el.attr("vendor", hex_id(v));
        }
        if let Some(id) = d.device_id {
            el = el.attr("device", hex_id(id));
        }
        el = link_attrs(el, d.link.current, d.link.max, false);
        let child = match d.kind {
            DeviceKind::Gpu => self.gpu(d).unwrap_or_else(|| Elem::new("gpu")),
            DeviceKind::Nic => self.nic(d).unwrap_or_else(|| Elem::new("nic")),
            DeviceKind::Nvme => return el,
        };
        // An empty <gpu/> or <nic/> is written only where the class alone would make a
        // re-read (or NCCL) take the device for something else.
        if !child.children.is_empty()
            || !child.attrs.is_empty()
            || kind_from_class(class) != Some(d.kind)
        {
            el.children.push(child);
        }
        el
    }

    /// `<gpu>` with what the model knows; left out when it knows nothing NCCL would not find
    /// itself. Without `<nvlink>` children NCCL asks NVML for the links.
    fn gpu(&self, d: &Device) -> Option<Elem> {
        let info = d.gpu.as_ref()?;
        let sm = info.compute_capability.as_deref().and_then(|cc| {
            let (major, minor) = cc.trim().split_once('.')?;
            let sm = major.parse::<u64>().ok()? * 10 + minor.parse::<u64>().ok()?;
            u32::try_from(sm).ok()
        });
        if info.index.is_none() && sm.is_none() && info.nvlinks.is_empty() {
            return None;
        }
        let mut el = Elem::new("gpu");
        if let Some(i) = info.index {
            el = el.attr("dev", i);
        }
        if let Some(sm) = sm {
            el = el.attr("sm", sm);
        }
        for l in info.nvlinks.iter().filter(|l| l.count > 0) {
            let (target, tclass) = match l.target {
                NvLinkTarget::Gpu(peer) => {
                    let class = self
                        .topo
                        .by_bdf(peer)
                        .filter(|p| p.kind == DeviceKind::Gpu)
                        .and_then(|p| p.class)
                        .filter(|c| c >> 16 == 0x03)
                        .unwrap_or(0x03_0200);
                    (peer.to_string(), class)
                }
                NvLinkTarget::NvSwitch => (HIDDEN_PEER.to_string(), 0x06_8000),
                // NCCL's class for a CPU at the far end of an NVLink; it joins the link to
                // the GPU's own CPU without looking at the target.
                NvLinkTarget::Cpu => (HIDDEN_PEER.to_string(), 0x06_8001),
            };
            el.children.push(
                Elem::new("nvlink")
                    .attr("target", target)
                    .attr("count", l.count)
                    .attr("tclass", format!("{tclass:#08x}")),
            );
        }
        Some(el)
    }

    /// `<nic>` with one `<net>` per port (one for a NIC with a name and no ports); NCCL finds
    /// its nets by name. Unknown figures (gdr, guid) are left for NCCL to fill. `None` for a
    /// NIC with neither name nor ports.
    fn nic(&mut self, d: &Device) -> Option<Elem> {
        let info = d.nic.as_ref()?;
        let name = info.rdma_name.as_deref();
        if name.is_none() && info.ports.is_empty() {
            return None;
        }
        let mut el = Elem::new("nic");
        let net = |dev: u32, speed: Option<u64>| {
            let mut n = Elem::new("net");
            if let Some(name) = name {
                n = n.attr("name", name);
            }
            n = n.attr("dev", dev);
            if let Some(s) = speed {
                n = n.attr("speed", s);
            }
            n
        };
        if info.ports.is_empty() {
            el.children.push(net(self.next_net, info.speed_mbps));
            self.next_net = self.next_net.saturating_add(1);
        }
        for p in &info.ports {
            let speed = p
                .rate_gbps
                .filter(|r| r.is_finite() && *r > 0.0 && *r < 1e12)
                .map(|r| (r * 1000.0).round() as u64)
                .or(info.speed_mbps);
            el.children
                .push(net(self.next_net, speed).attr("port", p.port));
            self.next_net = self.next_net.saturating_add(1);
        }
        Some(el)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_attribute_values() {
        assert_eq!(escape(r#"a&b<c>"d'"#), "a&amp;b&lt;c&gt;&quot;d&apos;");
        assert_eq!(escape("x\u{1}\ty"), "x?&#9;y");
    }

    #[test]
    fn layout_matches_nccls_dumps() {
        let mut sys = Elem::new("system").attr("version", 1);
        let mut cpu = Elem::new("cpu").attr("numaid", 0);
        cpu.children
            .push(Elem::new("pci").attr("busid", "0000:01:00.0"));
        sys.children.push(cpu);
        let mut out = String::new();
        sys.write(0, &mut out);
        assert_eq!(
            out,
            "<system version=\"1\">\n  <cpu numaid=\"0\">\n    <pci busid=\"0000:01:00.0\"/>\n  </cpu>\n</system>\n"
        );
    }
}
