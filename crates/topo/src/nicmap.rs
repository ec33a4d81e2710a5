//! Which NICs each region of memory (a GPU, a host NUMA node) should send through, and the
//! settings that tell NCCL, UCX, NIXL and Mooncake the same thing (`gdx topo --nic-map`).
//!
//! The ranking ([`rank_nics`]) is the one rule: NICs with a port up first (a NIC whose every
//! port reports down goes last, never into the NICs to use), then path class (PIX < PXB < PHB
//! < NODE < SYS, [`Topology::pcie_class`]), software RDMA devices (rxe, siw: the CPU copies
//! every byte) after hardware ones of the same class, then link speed (fastest first, unknown
//! last), then label order. The engine's rails and the printed map both come from it, so what gdx
//! uses and what it tells other libraries to use cannot drift apart.
//!
//! Only NICs that can carry RDMA are ranked (the rule of the `gdx topo` matrix,
//! [`crate::render::is_matrix_nic`]): a plain Ethernet NIC is no rail.

use crate::model::{Device, Topology};
use crate::path::PathClass;
use crate::render::is_matrix_nic;
use crate::sysfs::archive::printable;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Version of the `--nic-map --json` layout; bumped on incompatible changes.
pub const NIC_MAP_SCHEMA_VERSION: u32 = 1;

/// Where the bytes live: a GPU's memory or a host NUMA node's memory.
#[derive(Debug, Clone, Copy)]
pub enum Memory<'a> {
    /// A GPU (a device of kind GPU).
    Gpu(&'a Device),
    /// Host memory on this NUMA node.
    Numa(u32),
}

/// One NIC in a ranking, with the facts it was ranked by.
#[derive(Debug, Clone, Copy)]
pub struct RankedNic<'a> {
    /// The NIC.
    pub nic: &'a Device,
    /// Path class from the memory to the NIC.
    pub class: PathClass,
    /// Link speed in Gb/s, when known ([`nic_gbps`]).
    pub gbps: Option<f64>,
    /// A software RDMA device (rxe, siw).
    pub software: bool,
    /// A port is up, or no port says it is down (an NCCL file gives no port states).
    pub up: bool,
}

impl RankedNic<'_> {
    /// True when `other` is as good a choice: both up, same class, kind and speed.
    fn ties(&self, other: &RankedNic<'_>) -> bool {
        self.up
            && other.up
            && self.class == other.class
            && self.software == other.software
            && self.gbps == other.gbps
    }
}

/// False only when the NIC lists ports and every one reports a state other than ACTIVE.
fn nic_up(nic: &Device) -> bool {
    let ports = nic.nic.as_ref().map(|i| i.ports.as_slice()).unwrap_or(&[]);
    ports.is_empty() || ports.iter().any(|p| p.state.is_none() || port_is_active(p))
}

/// A NIC's link speed in Gb/s: its fastest active RDMA port, else its fastest port, else the
/// netdev / NCCL `<net speed>` figure.
pub fn nic_gbps(nic: &Device) -> Option<f64> {
    let info = nic.nic.as_ref()?;
    let fastest = |active_only: bool| {
        info.ports
            .iter()
            .filter(|p| !active_only || port_is_active(p))
            .filter_map(|p| p.rate_gbps)
            .reduce(f64::max)
    };
    fastest(true)
        .or_else(|| fastest(false))
        .or_else(|| info.speed_mbps.map(|m| m as f64 / 1000.0))
}

fn port_is_active(p: &crate::model::NicPort) -> bool {
    p.state.as_deref().is_some_and(|s| s.contains("ACTIVE"))
}

/// The class from host memory on `numa` to a NIC. Host memory sits behind the CPU's host
/// bridge, so a NIC on the same node is `PHB` and one on another node `SYS`; a NIC whose node
/// the platform does not say is `PHB` on a one-node machine and `SYS` (the worst) otherwise.
fn numa_class(topo: &Topology, numa: u32, nic: &Device) -> PathClass {
    let nodes = topo.numa_affinity(nic);
    if nodes.contains(&numa) || (nodes.is_empty() && topo.numa_nodes.len() <= 1) {
        PathClass::Phb
    } else {
        PathClass::Sys
    }
}

/// Every RDMA-capable NIC, best first for memory `from` (see the module docs for the order).
pub fn rank_nics<'a>(topo: &'a Topology, from: Memory<'_>) -> Vec<RankedNic<'a>> {
    let mut ranked: Vec<RankedNic<'a>> = topo
        .nics()
        .filter(|n| is_matrix_nic(topo, n))
        .map(|nic| RankedNic {
            nic,
            class: match from {
                Memory::Gpu(gpu) => topo.pcie_class(gpu, nic),
                Memory::Numa(n) => numa_class(topo, n, nic),
            },
            gbps: nic_gbps(nic),
            software: nic.nic.as_ref().is_some_and(|i| i.software),
            up: nic_up(nic),
        })
        .collect();
    // A stable sort: equal NICs keep label order (labels follow RDMA names, then bus order).
    ranked.sort_by(|a, b| {
        b.up.cmp(&a.up)
            .then(a.class.rank().cmp(&b.class.rank()))
            .then(a.software.cmp(&b.software))
            .then_with(|| {
                let speed = |r: &RankedNic<'_>| r.gbps.unwrap_or(-1.0);
                speed(b).total_cmp(&speed(a))
            })
    });
    ranked
}

/// The NICs one region of memory should use, and the rest in order.
#[derive(Debug, Clone)]
pub struct MemoryNics<'a> {
    /// `GPU0` or `NUMA1`.
    pub memory: String,
    /// The NICs to use: those tied with the best one (class, kind, speed). Where several GPUs
    /// share the same tied set (two GPUs and two NICs below one switch), each GPU's list starts
    /// at a different NIC, so one process per GPU spreads over the rails as NCCL does.
    pub preferred: Vec<RankedNic<'a>>,
    /// The full ranking ([`rank_nics`]).
    pub ranked: Vec<RankedNic<'a>>,
}

/// The ranking for every GPU and every host NUMA node.
#[derive(Debug, Clone)]
pub struct NicMap<'a> {
    /// One entry per GPU, in label order.
    pub gpus: Vec<MemoryNics<'a>>,
    /// One entry per NUMA node.
    pub numa: Vec<MemoryNics<'a>>,
}

fn best_tied<'a>(ranked: &[RankedNic<'a>]) -> Vec<RankedNic<'a>> {
    match ranked.first().filter(|f| f.up) {
        Some(first) => ranked
            .iter()
            .take_while(|r| r.ties(first))
            .copied()
            .collect(),
        None => Vec::new(),
    }
}

/// Build the map: [`rank_nics`] for each GPU and NUMA node, the preferred NICs of each.
pub fn nic_map(topo: &Topology) -> NicMap<'_> {
    let mut gpus: Vec<MemoryNics<'_>> = topo
        .gpus()
        .map(|g| {
            let ranked = rank_nics(topo, Memory::Gpu(g));
            MemoryNics {
                memory: g.label.clone(),
                preferred: best_tied(&ranked),
                ranked,
            }
        })
        .collect();
    // GPUs with the same preferred set take turns at its head, in label order.
    let mut seen: BTreeMap<Vec<String>, usize> = BTreeMap::new();
    for g in &mut gpus {
        let key: Vec<String> = g.preferred.iter().map(|r| r.nic.label.clone()).collect();
        let turn = seen.entry(key).or_insert(0);
        if !g.preferred.is_empty() {
            let n = g.preferred.len();
            g.preferred.rotate_left(*turn % n);
        }
        *turn += 1;
    }
    let numa = topo
        .numa_nodes
        .iter()
        .map(|n| {
            let ranked = rank_nics(topo, Memory::Numa(n.id));
            MemoryNics {
                memory: format!("NUMA{}", n.id),
                preferred: best_tied(&ranked),
                ranked,
            }
        })
        .collect();
    NicMap { gpus, numa }
}

/// An RDMA device name that is safe to print inside single quotes and to pass to the
/// libraries (`mlx5_0`, `rdmap16s27`, `rxe0`); `None` for a NIC without one.
fn rdma_name(nic: &Device) -> Option<&str> {
    let name = nic.nic.as_ref()?.rdma_name.as_deref()?;
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    ok.then_some(name)
}

/// The verbs port to name: the first active one, else the first, else 1.
fn port_of(nic: &Device) -> u32 {
    let ports = nic.nic.as_ref().map(|i| i.ports.as_slice()).unwrap_or(&[]);
    ports
        .iter()
        .find(|p| port_is_active(p))
        .or(ports.first())
        .map(|p| p.port)
        .filter(|&p| p > 0)
        .unwrap_or(1)
}

fn is_efa(nic: &Device) -> bool {
    nic.nic.as_ref().is_some_and(|i| i.efa)
}

/// One NIC as `--nic-map --json` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct NicEntry {
    /// Label (`NIC0`).
    pub nic: String,
    /// RDMA device name, when the source names it.
    pub rdma_name: Option<String>,
    /// Verbs port the settings name.
    pub port: u32,
    /// Path class from the memory.
    pub class: String,
    /// Link speed in Gb/s, when known.
    pub gbps: Option<f64>,
    /// Software RDMA (rxe, siw).
    pub software: bool,
    /// AWS EFA (driven through libfabric).
    pub efa: bool,
    /// A port is up (see [`RankedNic::up`]).
    pub up: bool,
}

impl NicEntry {
    fn new(r: &RankedNic<'_>) -> NicEntry {
        NicEntry {
            nic: r.nic.label.clone(),
            rdma_name: r
                .nic
                .nic
                .as_ref()
                .and_then(|i| i.rdma_name.as_deref())
                .map(printable),
            port: port_of(r.nic),
            class: r.class.to_string(),
            gbps: r.gbps,
            software: r.software,
            efa: is_efa(r.nic),
            up: r.up,
        }
    }
}

/// The settings for one GPU or NUMA node, as environment variables.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Settings {
    /// `NCCL_IB_HCA`: `=` (exact names) then `name:port,...`.
    #[serde(rename = "NCCL_IB_HCA", skip_serializing_if = "Option::is_none")]
    pub nccl_ib_hca: Option<String>,
    /// `UCX_NET_DEVICES` (`mlx5_0:1,...`): UCX, and NIXL's UCX backend, which reads it.
    #[serde(rename = "UCX_NET_DEVICES", skip_serializing_if = "Option::is_none")]
    pub ucx_net_devices: Option<String>,
    /// `MC_MS_FILTERS` (`mlx5_0,...`): the NICs Mooncake's auto-discovery
    /// (`MC_MS_AUTO_DISC=1`) may use.
    #[serde(rename = "MC_MS_FILTERS", skip_serializing_if = "Option::is_none")]
    pub mc_ms_filters: Option<String>,
}

/// One GPU or NUMA node as `--nic-map --json` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryView {
    /// `GPU0` or `NUMA1`.
    pub memory: String,
    /// PCI address of a GPU.
    pub bdf: Option<String>,
    /// The NICs to use ([`MemoryNics::preferred`]).
    #[serde(rename = "use")]
    pub use_nics: Vec<NicEntry>,
    /// Every RDMA NIC, best first.
    pub ranked: Vec<NicEntry>,
    /// The settings naming the NICs to use.
    pub env: Settings,
    /// Why a setting is missing.
    pub notes: Vec<String>,
}

/// The `gdx topo --nic-map --json` contract.
#[derive(Debug, Clone, Serialize)]
pub struct NicMapView {
    /// [`NIC_MAP_SCHEMA_VERSION`].
    pub schema_version: u32,
    /// How NICs are ranked, in words.
    pub order: &'static str,
    /// One entry per GPU.
    pub gpus: Vec<MemoryView>,
    /// One entry per host NUMA node.
    pub numa: Vec<MemoryView>,
    /// Mooncake transfer engine's NIC priority matrix: `"cuda:N"` / `"cpu:N"` → `[preferred,
    /// others]` RDMA device names (what `installTransport("rdma", ...)` and
    /// `transfer_engine_bench --nic_priority_matrix FILE` take).
    pub mooncake_nic_priority_matrix: BTreeMap<String, [Vec<String>; 2]>,
    /// What NIXL reads.
    pub nixl: &'static str,
    /// Problems with the map as a whole (no RDMA NIC, names unknown).
    pub notes: Vec<String>,
}

/// The ranking rule in words, for both outputs.
pub const ORDER: &str = "ports up first, then path class (PIX < PXB < PHB < NODE < SYS), \
software RDMA (rxe/siw) last within a class, then link speed";

/// What NIXL reads, for both outputs.
pub const NIXL_NOTE: &str = "NIXL's UCX backend reads UCX_NET_DEVICES; its libfabric \
backend maps each GPU to its nearest EFA devices itself (hwloc PCIe topology) and reads no \
device list";

fn settings(preferred: &[RankedNic<'_>], notes: &mut Vec<String>) -> Settings {
    let verbs: Vec<&RankedNic<'_>> = preferred.iter().filter(|r| !is_efa(r.nic)).collect();
    if verbs.len() < preferred.len() {
        notes.push(
            "EFA NICs: NCCL's aws-ofi-nccl plugin and NIXL's libfabric backend pick the EFA \
             devices nearest each GPU themselves; NCCL_IB_HCA and UCX_NET_DEVICES do not apply"
                .into(),
        );
    }
    let unnamed: Vec<&str> = preferred
        .iter()
        .filter(|r| rdma_name(r.nic).is_none())
        .map(|r| r.nic.label.as_str())
        .collect();
    if !unnamed.is_empty() {
        notes.push(format!(
            "{} {} no RDMA device name in this source: no setting can name {}",
            unnamed.join(", "),
            if unnamed.len() == 1 { "has" } else { "have" },
            if unnamed.len() == 1 { "it" } else { "them" },
        ));
    }
    let with_port: Vec<String> = verbs
        .iter()
        .filter_map(|r| Some(format!("{}:{}", rdma_name(r.nic)?, port_of(r.nic))))
        .collect();
    let names: Vec<&str> = preferred.iter().filter_map(|r| rdma_name(r.nic)).collect();
    let some = |v: String| (!v.is_empty()).then_some(v);
    Settings {
        // `=`: exact names; without it NCCL matches prefixes, and mlx5_1 would take mlx5_10.
        nccl_ib_hca: some(with_port.join(",")).map(|v| format!("={v}")),
        ucx_net_devices: some(with_port.join(",")),
        mc_ms_filters: some(names.join(",")),
    }
}

fn memory_view(topo: &Topology, m: &MemoryNics<'_>) -> MemoryView {
    let mut notes = Vec::new();
    if m.ranked.is_empty() {
        notes.push("no RDMA-capable NIC".to_string());
    } else if m.preferred.is_empty() {
        notes.push("every RDMA NIC has its ports down".to_string());
    }
    let env = settings(&m.preferred, &mut notes);
    MemoryView {
        memory: m.memory.clone(),
        bdf: topo
            .device(&m.memory)
            .and_then(|d| d.bdf)
            .map(|b| b.to_string()),
        use_nics: m.preferred.iter().map(NicEntry::new).collect(),
        ranked: m.ranked.iter().map(NicEntry::new).collect(),
        env,
        notes,
    }
}

/// Mooncake's key for a memory: `cuda:N` for `GPUN`, `cpu:N` for `NUMAN`.
fn mooncake_key(memory: &str) -> Option<String> {
    if let Some(n) = memory.strip_prefix("GPU") {
        return Some(format!("cuda:{n}"));
    }
    memory.strip_prefix("NUMA").map(|n| format!("cpu:{n}"))
}

/// Build the `--nic-map` view (both the JSON and the shell text are made from it).
pub fn nic_map_view(topo: &Topology) -> NicMapView {
    let map = nic_map(topo);
    let mut matrix = BTreeMap::new();
    for m in map.gpus.iter().chain(&map.numa) {
        let names = |list: &mut dyn Iterator<Item = &RankedNic<'_>>| -> Vec<String> {
            list.filter_map(|r| rdma_name(r.nic).map(str::to_string))
                .collect()
        };
        let preferred = names(&mut m.preferred.iter());
        let others = names(
            &mut m
                .ranked
                .iter()
                .filter(|r| !m.preferred.iter().any(|p| std::ptr::eq(p.nic, r.nic))),
        );
        if let (Some(key), false) = (mooncake_key(&m.memory), preferred.is_empty()) {
            matrix.insert(key, [preferred, others]);
        }
    }
    let mut notes = Vec::new();
    if topo.nics().all(|n| !is_matrix_nic(topo, n)) {
        notes.push("no RDMA-capable NIC on this machine: nothing to map".to_string());
    }
    NicMapView {
        schema_version: NIC_MAP_SCHEMA_VERSION,
        order: ORDER,
        gpus: map.gpus.iter().map(|m| memory_view(topo, m)).collect(),
        numa: map.numa.iter().map(|m| memory_view(topo, m)).collect(),
        mooncake_nic_priority_matrix: matrix,
        nixl: NIXL_NOTE,
        notes,
    }
}

fn describe(n: &NicEntry) -> String {
    let mut facts = vec![n.class.clone()];
    facts.extend(n.gbps.map(|g| format!("{g} Gb/s")));
    if n.software {
        facts.push("software".into());
    }
    if n.efa {
        facts.push("EFA".into());
    }
    if !n.up {
        facts.push("ports down".into());
    }
    let name = n
        .rdma_name
        .as_deref()
        .map(|s| format!(" {s}"))
        .unwrap_or_default();
    format!("{}{name} ({})", n.nic, facts.join(", "))
}

/// Single-quote a value for the shell. Names are already limited to `[A-Za-z0-9_.:,=-]`,
/// so the quotes only keep the shell from reading `=` or `,` specially.
fn quoted(v: &str) -> String {
    format!("'{}'", v.replace('\'', r"'\''"))
}

/// The `--nic-map` shell text: comments that say what each GPU and NUMA node uses and why,
/// then a `case` on the GPU index (`GDX_NIC_MAP_GPU`, else `LOCAL_RANK`, else 0) that exports
/// the settings, so `eval "$(gdx topo --nic-map)"` in each rank's launcher sets its own.
pub fn render_nic_map_shell(topo: &Topology, view: &NicMapView) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# gdx topo --nic-map: the NICs each GPU and NUMA node should use"
    );
    let source = match &topo.source {
        crate::Source::Sysfs(p) if p == "/" => "live machine".to_string(),
        crate::Source::Sysfs(p) => format!("sysfs under {}", printable(p)),
        crate::Source::NcclXml(p) => format!("NCCL topology {}", printable(p)),
    };
    let _ = writeln!(s, "# source: {source}");
    let _ = writeln!(s, "# order: {}", view.order);
    for m in view.gpus.iter().chain(&view.numa) {
        let used: Vec<String> = m.use_nics.iter().map(describe).collect();
        let rest: Vec<String> = m
            .ranked
            .iter()
            .filter(|r| !m.use_nics.iter().any(|u| u.nic == r.nic))
            .map(describe)
            .collect();
        let at = m
            .bdf
            .as_deref()
            .map(|b| format!(" {b}"))
            .unwrap_or_default();
        if used.is_empty() {
            let why = m
                .notes
                .first()
                .map_or("no RDMA-capable NIC", String::as_str);
            let _ = writeln!(s, "# {}{at}: no NIC to use: {why}", m.memory);
            continue;
        }
        let _ = write!(s, "# {}{at}: use {}", m.memory, used.join(", "));
        if !rest.is_empty() {
            let _ = write!(s, "; then {}", rest.join(", "));
        }
        s.push('\n');
        for n in &m.notes {
            let _ = writeln!(s, "#   {n}");
        }
    }
    for n in &view.notes {
        let _ = writeln!(s, "# {n}");
    }
    let _ = writeln!(s, "# NIXL: {}", view.nixl);
    if !view.mooncake_nic_priority_matrix.is_empty() {
        let json = serde_json::to_string(&view.mooncake_nic_priority_matrix).unwrap_or_default();
        let _ = writeln!(
            s,
            "# Mooncake nic_priority_matrix (installTransport(\"rdma\"), transfer_engine_bench \
             --nic_priority_matrix FILE): {json}"
        );
    }
    let _ = writeln!(
        s,
        "# Per GPU (GDX_NIC_MAP_GPU, else LOCAL_RANK, else 0): eval \"$(gdx topo --nic-map)\""
    );
    let _ = writeln!(s, "case \"${{GDX_NIC_MAP_GPU:-${{LOCAL_RANK:-0}}}}\" in");
    for m in &view.gpus {
        let index = m.memory.trim_start_matches("GPU");
        let mut vars = Vec::new();
        if let Some(v) = &m.env.nccl_ib_hca {
            vars.push(format!("NCCL_IB_HCA={}", quoted(v)));
        }
        if let Some(v) = &m.env.ucx_net_devices {
            vars.push(format!("UCX_NET_DEVICES={}", quoted(v)));
        }
        if let Some(v) = &m.env.mc_ms_filters {
            vars.push(format!("MC_MS_AUTO_DISC=1 MC_MS_FILTERS={}", quoted(v)));
        }
        if vars.is_empty() {
            let _ = writeln!(s, "  {index}) ;; # {}: nothing to set", m.memory);
        } else {
            let _ = writeln!(s, "  {index}) export {} ;;", vars.join(" "));
        }
    }
    let _ = writeln!(s, "esac");
    s
}
