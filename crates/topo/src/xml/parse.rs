//! NCCL topology XML to the model. See the parent module for the mapping.

use super::attrs::{syntax_error, text_pos, Attrs};
use super::{cpumask, depth};
use crate::error::TopoError;
use crate::model::{
    kind_from_class, Attachment, Device, DeviceKind, HostBridge, LinkStatus, NumaNode, NvLink,
    NvLinkTarget, PciAddr, Switch, SwitchId, Topology,
};
use roxmltree::{Document, Node};
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// Deepest `<pci>` nesting accepted. Real machines have a handful of switch levels; the limit
/// keeps the recursive walk's stack bounded whatever the input.
const MAX_PCI_DEPTH: usize = 64;

mod finish;
mod nic;

/// Most `<cpu>` elements accepted: one per NUMA node, and Linux has at most 1024 nodes.
pub const MAX_CPUS: usize = 1024;

/// Most devices (GPUs, NICs, NVMe) accepted. One NCCL file describes one node; the largest
/// have 8-16 GPUs and as many NICs. The matrix is quadratic in this, so it is the bound on
/// memory and time too.
pub const MAX_DEVICES: usize = 1024;

/// Most PCIe switches (bridge `<pci>` elements) accepted: a big node has a few dozen.
pub const MAX_SWITCHES: usize = 4096;

/// Most NVLink targets of one GPU, and nets of one NIC. A GPU has at most 18 links today and
/// a NIC a handful of ports; every GPU pair scans the targets, so this bounds the matrix time.
pub const MAX_PER_DEVICE: usize = 256;

/// At most this many notes are kept; a file with thousands of odd elements would otherwise
/// bury the first ones (and cost memory per element).
const MAX_NOTES: usize = 200;

/// How NVLink targets that are no visible device start (typically an NVSwitch seen from a
/// VM): a 7-digit all-ones domain no real PCI segment has.
const HIDDEN_PREFIX: &str = "fffffff:";

/// PCI class NCCL gives an NVSwitch and an NVLink-attached CPU (IBM NPU) as NVLink targets.
const CLASS_NVSWITCH: u32 = 0x06_8000;
const CLASS_NVLINK_CPU: u32 = 0x06_8001;
const CLASS_BRIDGE: u32 = 0x06_0400;

pub(super) fn parse(text: &str, path: &Path) -> Result<Topology, TopoError> {
    if let Some(pos) = depth::too_deep(text, depth::MAX_NESTING) {
        let (line, column) = text_pos(text, pos);
        return Err(TopoError::Xml {
            path: path.to_path_buf(),
            line,
            column,
            message: format!("elements nested more than {} deep", depth::MAX_NESTING),
        });
    }
    let doc = Document::parse(text).map_err(|e| syntax_error(text, path, &e))?;
    let root = doc.root_element();
    let name = root.tag_name().name();
    if name != "system" {
        let why = match name {
            "graphs" | "graph" => {
                "an NCCL graph file (NCCL_GRAPH_FILE: rings/trees), not a topology (NCCL_TOPO_FILE)"
                    .to_string()
            }
            other => format!(
                "the root element is <{other}>; an NCCL topology (NCCL_TOPO_FILE) has <system>"
            ),
        };
        return Err(TopoError::NotATopology {
            path: path.to_path_buf(),
            why,
        });
    }
    let mut p = Parser::new(&doc, path);
    p.system(root)?;
    let nvlink_elements = root.descendants().any(|n| n.has_tag_name("nvlink"));
    Ok(p.finish(path, nvlink_elements))
}

/// What a `<cpu>` element gives the devices below it.
struct CpuCtx {
    host_bridge: String,
    numa: Option<u32>,
    cpus: Option<String>,
}

/// A GPU-class NVLink without `tclass`: resolved once every GPU of the file is known.
struct Untyped {
    owner: PciAddr,
    target: PciAddr,
}

struct Parser<'a, 'input> {
    a: Attrs<'a, 'input>,
    devices: Vec<Device>,
    switches: Vec<Switch>,
    host_bridges: Vec<HostBridge>,
    numa_nodes: Vec<NumaNode>,
    notes: Vec<String>,
    dropped_notes: usize,
    /// Host bridge ids (`cpu0`) already made, and where each NUMA node is in `numa_nodes`.
    bridge_ids: HashSet<String>,
    numa_index: HashMap<u32, usize>,
    seen: HashSet<PciAddr>,
    /// Leaves with no class and no `<gpu>`/`<nic>` child.
    unknown_kind: Vec<PciAddr>,
    /// Leaves whose class is none of the kinds gdx tracks.
    untracked: Vec<(PciAddr, u32)>,
    /// Elements NCCL does not define, as `<name> (line N)`.
    ignored: Vec<String>,
    /// GPUs whose NVLink names the GPU itself (the Azure NC A100 v4 quirk).
    self_targets: Vec<PciAddr>,
    untyped: Vec<Untyped>,
}

impl<'a, 'input> Parser<'a, 'input> {
    fn new(doc: &'a Document<'input>, path: &'a Path) -> Self {
        Parser {
            a: Attrs::new(doc, path),
            devices: Vec::new(),
            switches: Vec::new(),
            host_bridges: Vec::new(),
            numa_nodes: Vec::new(),
            notes: Vec::new(),
            dropped_notes: 0,
            bridge_ids: HashSet::new(),
            numa_index: HashMap::new(),
            seen: HashSet::new(),
            unknown_kind: Vec::new(),
            untracked: Vec::new(),
            ignored: Vec::new(),
            self_targets: Vec::new(),
            untyped: Vec::new(),
        }
    }

    /// Record a non-fatal problem (at most [`MAX_NOTES`]; the rest are counted).
    fn note(&mut self, s: String) {
        if self.notes.len() < MAX_NOTES {
            self.notes.push(s);
        } else {
            self.dropped_notes += 1;
        }
    }

    /// Add a device, within [`MAX_DEVICES`].
    fn push_device(&mut self, d: Device, node: Node) -> Result<(), TopoError> {
        if self.devices.len() >= MAX_DEVICES {
            return Err(self.a.elem_err(
                node,
                &format!(
                    "more than {MAX_DEVICES} devices: not one machine's topology (an NCCL file \
                     describes one node)"
                ),
            ));
        }
        self.devices.push(d);
        Ok(())
    }

    /// Check the element children of `node`: those in `allowed` are the caller's to handle;
    /// NCCL elements in the wrong place are an error; anything else is noted and skipped
    /// (NCCL ignores elements it does not know, too).
    fn check_children(&mut self, node: Node, allowed: &[&str]) -> Result<(), TopoError> {
        for child in node.children().filter(Node::is_element) {
            let name = child.tag_name().name();
            if allowed.contains(&name) {
                continue;
            }
            let place = match name {
                "cpu" => "directly under <system>",
                "pci" => "under a <cpu> or another <pci>",
                "gpu" => "under the <pci> element of its GPU",
                "nic" => "under a <cpu> or a <pci>",
                "net" => "under a <nic>",
                "nvlink" | "c2c" => "under a <gpu>",
                _ => {
                    let line = self.a.line_of(child);
                    self.ignored.push(format!("<{name}> (line {line})"));
                    continue;
                }
            };
            let parent = node.tag_name().name();
            return Err(self.a.err_at(
                child.range().start,
                format!("<{name}> is not allowed inside <{parent}>: it belongs {place}"),
            ));
        }
        Ok(())
    }

    fn system(&mut self, node: Node) -> Result<(), TopoError> {
        if let Some(v) = self.a.opt_int(node, "version")? {
            if v != 1 {
                self.notes.push(format!(
                    "<system version=\"{v}\">: NCCL reads version 1 only; read as version 1"
                ));
            }
        }
        self.check_children(node, &["cpu"])?;
        if let Some(extra) = node
            .children()
            .filter(|n| n.has_tag_name("cpu"))
            .nth(MAX_CPUS)
        {
            return Err(self.a.elem_err(
                extra,
                &format!(
                    "more than {MAX_CPUS} <cpu> elements: NCCL writes one per NUMA node and \
                     Linux has at most {MAX_CPUS}"
                ),
            ));
        }
        for cpu in node.children().filter(|n| n.has_tag_name("cpu")) {
            self.cpu(cpu)?;
        }
        Ok(())
    }

    fn cpu(&mut self, node: Node) -> Result<(), TopoError> {
        let numaid = self
            .a
            .opt_int(node, "numaid")?
            .ok_or_else(|| self.a.elem_err(node, "missing numaid attribute"))?;
        // NCCL writes -1 when the kernel does not know the device's NUMA node.
        let numa = match numaid {
            -1 => None,
            n => Some(u32::try_from(n).map_err(|_| {
                self.a
                    .attr_err(node, "numaid", "must be a NUMA node number or -1")
            })?),
        };
        let cpus = match node.attribute("affinity") {
            Some(mask) => Some(cpumask::mask_to_list(mask).map_err(|why| {
                self.a
                    .attr_err(node, "affinity", &format!("is not a CPU mask: {why}"))
            })?)
            .filter(|l| !l.is_empty()),
            None => None,
        };
        let host_bridge = format!("cpu{numaid}");
        if !self.bridge_ids.insert(host_bridge.clone()) {
            // Two <cpu> with one numaid are one CPU to NCCL (its CPU node id is the numaid).
            let line = self.a.line_of(node);
            self.note(format!(
                "several <cpu numaid=\"{numaid}\"> elements (line {line}): treated as one CPU"
            ));
        } else {
            self.host_bridges.push(HostBridge {
                id: host_bridge.clone(),
                numa,
            });
        }
        if let Some(id) = numa {
            match self
                .numa_index
                .get(&id)
                .and_then(|&i| self.numa_nodes.get_mut(i))
            {
                Some(n) if n.cpus.is_empty() => n.cpus = cpus.clone().unwrap_or_default(),
                Some(_) => {}
                None => {
                    self.numa_index.insert(id, self.numa_nodes.len());
                    self.numa_nodes.push(NumaNode {
                        id,
                        cpus: cpus.clone().unwrap_or_default(),
                    });
                }
            }
        }
        let ctx = CpuCtx {
            host_bridge,
            numa,
            cpus,
        };
        self.check_children(node, &["pci", "nic"])?;
        for child in node.children().filter(Node::is_element) {
            match child.tag_name().name() {
                "pci" => self.pci(child, &ctx, &[], 1)?,
                "nic" => self.cpu_nic(child, &ctx)?,
                _ => {}
            }
        }
        Ok(())
    }

    fn new_device(&self, kind: DeviceKind, bdf: Option<PciAddr>, ctx: &CpuCtx) -> Device {
        let mut d = Device::new(kind, bdf);
        d.numa = ctx.numa;
        d.cpu_affinity = ctx.cpus.clone();
        d.attach = Attachment {
            host_bridge: Some(ctx.host_bridge.clone()),
            switches: Vec::new(),
        };
        d
    }

    fn pci(
        &mut self,
        node: Node,
        ctx: &CpuCtx,
        chain: &[SwitchId],
        depth: usize,
    ) -> Result<(), TopoError> {
        if depth > MAX_PCI_DEPTH {
            return Err(self.a.elem_err(
                node,
                &format!("<pci> elements nested more than {MAX_PCI_DEPTH} deep"),
            ));
        }
        let bdf = self.a.bus_id(node, "busid")?;
        let class = self.a.opt_hex(node, "class", 0xff_ffff)?;
        let vendor = self.a.opt_id(node, "vendor")?;
        let device_id = self.a.opt_id(node, "device")?;
        let link = self.a.link(node)?;
        let status = LinkStatus {
            current: link,
            max: link,
        };
        self.check_children(node, &["pci", "gpu", "nic", "pcilink"])?;
        let has_pci = node.children().any(|n| n.has_tag_name("pci"));
        if has_pci || class.is_some_and(|c| c >> 8 == CLASS_BRIDGE >> 8) {
            if self.switches.len() >= MAX_SWITCHES {
                return Err(self.a.elem_err(
                    node,
                    &format!("more than {MAX_SWITCHES} PCIe switches: not one machine's topology"),
                ));
            }
            let id = SwitchId(self.switches.len());
            self.switches.push(Switch {
                upstream: bdf,
                downstream: Vec::new(),
                vendor,
                device_id,
                link: status,
                parent: chain.last().copied(),
                is_virtual: (bdf.domain == 0xffff && bdf.bus == 0xff)
                    || matches!(vendor, Some(0x0000 | 0xffff)),
            });
            if node
                .children()
                .any(|n| n.has_tag_name("gpu") || n.has_tag_name("nic"))
            {
                let line = self.a.line_of(node);
                self.note(format!(
                    "bridge <pci busid=\"{bdf}\"> (line {line}) has <gpu>/<nic> children: ignored"
                ));
            }
            let mut below = chain.to_vec();
            below.push(id);
            for child in node.children().filter(|n| n.has_tag_name("pci")) {
                self.pci(child, ctx, &below, depth + 1)?;
            }
            return Ok(());
        }

        let gpu_el = node.children().find(|n| n.has_tag_name("gpu"));
        let nic_el = node.children().find(|n| n.has_tag_name("nic"));
        // NCCL's precedence: a <nic> child makes the function a NIC whatever its class.
        let kind = if nic_el.is_some() {
            Some(DeviceKind::Nic)
        } else if gpu_el.is_some() {
            Some(DeviceKind::Gpu)
        } else {
            class.and_then(kind_from_class)
        };
        let Some(kind) = kind else {
            match class {
                None => self.unknown_kind.push(bdf),
                Some(c) => self.untracked.push((bdf, c)),
            }
            return Ok(());
        };
        if !self.seen.insert(bdf) {
            let line = self.a.line_of(node);
            self.note(format!(
                "<pci busid=\"{bdf}\"> (line {line}) appears twice: the later one is ignored"
            ));
            return Ok(());
        }
        let mut d = self.new_device(kind, Some(bdf), ctx);
        d.vendor = vendor;
        d.device_id = device_id;
        d.class = class;
        d.link = status;
        d.attach.switches = chain.to_vec();
        match kind {
            DeviceKind::Gpu => {
                if let Some(g) = gpu_el {
                    self.gpu(g, &mut d, bdf)?;
                }
            }
            DeviceKind::Nic => {
                if let Some(n) = nic_el {
                    self.nets(n, &mut d)?;
                }
            }
            DeviceKind::Nvme => {}
        }
        if d.name.is_none() {
            d.name = match kind {
                DeviceKind::Nic => crate::vendor::nic_name(vendor, device_id, class),
                _ => vendor
                    .zip(device_id)
                    .map(|(v, dev)| format!("{v:04x}:{dev:04x}")),
            };
        }
        self.push_device(d, node)
    }

    fn gpu(&mut self, node: Node, d: &mut Device, bdf: PciAddr) -> Result<(), TopoError> {
        let extra = node
            .next_siblings()
            .skip(1)
            .filter(|n| n.has_tag_name("gpu"))
            .count();
        if extra > 0 {
            let line = self.a.line_of(node);
            self.note(format!(
                "GPU {bdf} has {} <gpu> elements (line {line}): the first is used",
                extra + 1
            ));
        }
        let index = self.a.opt_u32(node, "dev")?;
        let sm = self.a.opt_u32(node, "sm")?.filter(|s| *s > 0);
        // Validated because NCCL reads them as numbers, but the model has no place for them.
        self.a.opt_int(node, "rank")?;
        self.a.opt_int(node, "gdr")?;
        self.check_children(node, &["nvlink", "c2c"])?;
        let mut links: Vec<NvLink> = Vec::new();
        // Where each target's bundle is in `links`: one look-up per element, not a scan.
        let mut bundle: HashMap<NvLinkTarget, usize> = HashMap::new();
        for child in node.children().filter(Node::is_element) {
            let link = match child.tag_name().name() {
                "nvlink" => self.nvlink(child, bdf)?,
                "c2c" => {
                    self.a.opt_int(child, "bw")?;
                    Some(NvLink {
                        target: NvLinkTarget::Cpu,
                        count: self.a.req_u32(child, "count")?,
                    })
                }
                _ => None,
            };
            let Some(link) = link.filter(|l| l.count > 0) else {
                continue;
            };
            // NCCL adds up links to one target (real NVSwitch machines list each switch).
            if let Some(l) = bundle.get(&link.target).and_then(|&i| links.get_mut(i)) {
                l.count = l.count.saturating_add(link.count);
                continue;
            }
            if links.len() >= MAX_PER_DEVICE {
                return Err(self.a.elem_err(
                    child,
                    &format!(
                        "GPU {bdf} has NVLinks to more than {MAX_PER_DEVICE} targets: no GPU has"
                    ),
                ));
            }
            bundle.insert(link.target.clone(), links.len());
            links.push(link);
        }
        let info = d.gpu.get_or_insert_with(Default::default);
        info.index = index;
        info.compute_capability = sm.map(|s| format!("{}.{}", s / 10, s % 10));
        info.nvlinks = links;
        Ok(())
    }

    fn nvlink(&mut self, node: Node, owner: PciAddr) -> Result<Option<NvLink>, TopoError> {
        let count = self.a.req_u32(node, "count")?;
        let tclass = self.a.opt_hex(node, "tclass", 0xff_ffff)?;
        let raw_target = node.attribute("target").map(str::trim).unwrap_or("");
        // NCCL writes "fffffff:ffff:ff" for a peer NVML cannot name; NVML's own answer for
        // an NVSwitch outside the VM reads "fffffff:ff:ff.0". Neither is a real bus id.
        let hidden =
            raw_target.is_empty() || raw_target.to_ascii_lowercase().starts_with(HIDDEN_PREFIX);
        let target = match tclass {
            Some(c) if c >> 16 == 0x03 => {
                let peer = self.a.bus_id(node, "target")?;
                if peer == owner {
                    self.self_targets.push(owner);
                    return Ok(None);
                }
                NvLinkTarget::Gpu(peer)
            }
            // 0x068001 is NCCL's CPU class (POWER's NPU). A plain bridge is no NVLink
            // fabric either, so it counts as the CPU side too; NCCL's class table would
            // make it a PCI node and join the link to a made-up NVSwitch instead.
            Some(CLASS_NVLINK_CPU | CLASS_BRIDGE) => NvLinkTarget::Cpu,
            Some(CLASS_NVSWITCH) => NvLinkTarget::NvSwitch,
            Some(other) => {
                let line = self.a.line_of(node);
                self.note(format!(
                    "GPU {owner}: <nvlink tclass=\"{other:#08x}\"> (line {line}) is no class NCCL \
                     knows: taken as an NVSwitch, as NCCL does"
                ));
                NvLinkTarget::NvSwitch
            }
            None if hidden => NvLinkTarget::NvSwitch,
            None => {
                let peer = self.a.bus_id(node, "target")?;
                if peer == owner {
                    self.self_targets.push(owner);
                    return Ok(None);
                }
                self.untyped.push(Untyped {
                    owner,
                    target: peer,
                });
                NvLinkTarget::Gpu(peer)
            }
        };
        Ok(Some(NvLink { target, count }))
    }
}

/// How the GPU↔GPU classes of a model with no NVLink facts from an NCCL file are marked.
pub const NO_NVLINK_FACTS: &str = "PCIe only: this file carries no NVLink facts";
