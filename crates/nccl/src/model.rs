//! What an NCCL INFO log says, as data: the facts [`crate::parse`] extracts and the per
//! rank-pair summary [`NcclLog::pair_classes`] builds from them. Serialises as the `--json`
//! of `gdx nccl explain` (under `"log"`).
//!
//! Invariant: every field is optional or a list, so a truncated or garbled log still gives a
//! value; what could not be read is in [`NcclLog::parse_warnings`].

use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::OnceLock;

/// Everything extracted from one or more log files.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct NcclLog {
    /// The files read, in order.
    pub sources: Vec<String>,
    /// NCCL version (`2.28.3+cuda13.0`), the first one seen.
    pub version: Option<String>,
    /// Every distinct version seen, with where (several mean mixed installs).
    pub versions: Vec<Seen>,
    /// Communicator ranks (`comm 0x.. rank 0 nranks 16 cudaDev 0 busId 1c000`).
    pub ranks: Vec<RankInfo>,
    /// `Using network IB` / `Socket` / `IBext_v8`, per host.
    pub networks: Vec<Seen>,
    /// RDMA devices NCCL uses (`NET/IB : Using [0]mlx5_0:1/RoCE`).
    pub ib_devices: Vec<IbDevice>,
    /// Socket interfaces NCCL uses (`NET/Socket : Using [0]eth0:10.0.0.1<0>`).
    pub sockets: Vec<SocketIf>,
    /// Why NCCL found no RDMA device (`NET/IB : No device found.`, `Failed to open libibverbs`).
    pub ib_unavailable: Vec<Seen>,
    /// GPU Direct RDMA per HCA (and per GPU in NCCL < 2.12's wording).
    pub gdr: Vec<GdrStatus>,
    /// GPUs for which NCCL said `DMA-BUF is available on GPU device N`.
    pub dmabuf_gpus: BTreeSet<u32>,
    /// Every channel connection line.
    pub connections: Vec<Connection>,
    /// NVLink SHARP (NVLS).
    pub nvls: Nvls,
    /// CollNet (SHARP in the network).
    pub collnet: CollNet,
    /// `NCCL_TOPO_FILE` as NCCL reported it.
    pub topo_file: Option<String>,
    /// `NCCL_GRAPH_FILE` as NCCL reported it.
    pub graph_file: Option<String>,
    /// Every `NCCL_X set by environment to Y` (and `NCCL_X set to Y`), last value wins.
    pub env: BTreeMap<String, String>,
    /// The `=== System : maxBw .. totalBw .. ===` topology print, when present.
    pub system: Option<SystemPrint>,
    /// NCCL's own `NCCL WARN` lines.
    pub nccl_warnings: Vec<Seen>,
    /// Lines this parser could not read (truncated, garbled), with where.
    pub parse_warnings: Vec<ParseWarning>,
    /// Lines read, and how many of them were NCCL lines.
    pub lines: usize,
    /// NCCL lines (with an `NCCL INFO`/`NCCL WARN` marker or a recognised bare message).
    pub nccl_lines: usize,
    /// Per-rank facts, built on first use after parsing.
    #[serde(skip)]
    index: RankCache,
}

/// What [`NcclLog::rank_host`], [`NcclLog::rank_bus_id`] and [`NcclLog::rank_dev`] answer,
/// gathered in one pass over the ranks and connections: asked once per connection, scanning
/// the connections each time made `gdx nccl explain` quadratic (8 MiB of channel lines: 86 s).
#[derive(Debug, Default, Clone)]
struct RankIndex {
    /// The first init line of each rank.
    init: HashMap<u32, usize>,
    /// The first host, bus id and CUDA device a connection line gives each rank.
    host: HashMap<u32, String>,
    bus_id: HashMap<u32, String>,
    dev: HashMap<u32, u32>,
}

/// The lazily built [`RankIndex`]; not part of a log's value (equal logs compare equal
/// whether or not one was asked a question yet).
#[derive(Debug, Default, Clone)]
struct RankCache(OnceLock<RankIndex>);

impl PartialEq for RankCache {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// A value and the host that printed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Seen {
    /// The value.
    pub value: String,
    /// The host, when the line had a prefix.
    pub host: Option<String>,
}

/// One rank of a communicator.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RankInfo {
    /// Rank in the communicator.
    pub rank: u32,
    /// Communicator size.
    pub nranks: Option<u32>,
    /// Host that printed the init line.
    pub host: Option<String>,
    /// CUDA device ordinal.
    pub cuda_dev: Option<u32>,
    /// PCI bus id as NCCL prints it (`1c000` = `0000:1c:00.0`).
    pub bus_id: Option<String>,
    /// `nNodes` when printed.
    pub nnodes: Option<u32>,
    /// Communicator id, to tell communicators apart.
    pub comm: Option<String>,
}

/// An RDMA device in NCCL's `NET/IB : Using` list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IbDevice {
    /// NCCL's net device index (`[0]`), the `n` of `NET/IB/n`.
    pub index: u32,
    /// Device name, `mlx5_0`.
    pub name: String,
    /// Port.
    pub port: u32,
    /// `IB` or `RoCE`.
    pub link: String,
    /// Extra tags after the link (`SHARP`).
    pub tags: Vec<String>,
    /// Host.
    pub host: Option<String>,
    /// `[RO]`: NCCL uses PCIe relaxed ordering.
    pub relaxed_ordering: bool,
}

/// A socket interface in NCCL's `NET/Socket : Using` list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SocketIf {
    /// Index (`NET/Socket/n`).
    pub index: u32,
    /// Interface name.
    pub name: String,
    /// Address as printed.
    pub addr: String,
    /// Host.
    pub host: Option<String>,
}

/// GPU Direct RDMA as NCCL decided it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GdrStatus {
    /// The network plugin's name in the line (`IB`, `FastSocket`).
    pub net: String,
    /// HCA index.
    pub hca: u32,
    /// HCA name when printed (`mlx5_0`).
    pub name: Option<String>,
    /// Enabled or disabled.
    pub enabled: bool,
    /// A reason NCCL gave: `no module`, `distance 5 > 4`.
    pub reason: Option<String>,
    /// GPU bus id (old per-GPU wording only).
    pub gpu_bus_id: Option<String>,
    /// Host.
    pub host: Option<String>,
}

/// One end of a connection: `2[c7000]` (rank and bus id, NCCL < 2.12) or `2[0]` (rank and
/// CUDA device).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct RankRef {
    /// Rank.
    pub rank: u32,
    /// CUDA device, when the bracket holds one.
    pub dev: Option<u32>,
    /// Bus id, when the bracket holds one.
    pub bus_id: Option<String>,
}

/// `[send]` / `[receive]` on network connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// This rank sends.
    Send,
    /// This rank receives.
    Receive,
}

/// How a channel connects two ranks.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Transport {
    /// GPU peer-to-peer: `P2P/CUMEM/read`, `P2P/IPC`, `P2P/direct pointer`.
    P2p {
        /// Everything after `P2P/`.
        mode: String,
    },
    /// Through host shared memory: `SHM/direct/direct`.
    Shm {
        /// Everything after `SHM/`.
        mode: String,
    },
    /// Through a NIC: `NET/IB/0/GDRDMA`, `NET/Socket/0`, `NET/IBext_v8/2`.
    Net {
        /// `IB`, `Socket`, `IBext_v8`, `AWS Libfabric`.
        plugin: String,
        /// NCCL's net device index.
        dev: u32,
        /// `GDRDMA` present: the NIC reads/writes GPU memory directly.
        gdr: bool,
        /// Other tags (`Shared`, `PCI`).
        tags: Vec<String>,
    },
}

impl Transport {
    /// Whether this is a socket (TCP) transport.
    pub fn is_socket(&self) -> bool {
        matches!(self, Transport::Net { plugin, .. } if plugin.to_ascii_lowercase().contains("socket"))
    }

    /// The summary label, without the device index: `P2P/CUMEM/read`, `SHM/direct/direct`,
    /// `NET/IB/GDRDMA`, `NET/IB without GDRDMA`, `NET/Socket`.
    pub fn class_label(&self) -> String {
        match self {
            Transport::P2p { mode } => format!("P2P/{mode}"),
            Transport::Shm { mode } => format!("SHM/{mode}"),
            Transport::Net { plugin, .. } if self.is_socket() => format!("NET/{plugin}"),
            Transport::Net {
                plugin, gdr: true, ..
            } => format!("NET/{plugin}/GDRDMA"),
            Transport::Net { plugin, .. } => format!("NET/{plugin} without GDRDMA"),
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Transport::Net {
                plugin,
                dev,
                gdr,
                tags,
            } => {
                write!(f, "NET/{plugin}/{dev}")?;
                if *gdr {
                    f.write_str("/GDRDMA")?;
                }
                for t in tags {
                    write!(f, "/{t}")?;
                }
                Ok(())
            }
            other => f.write_str(&other.class_label()),
        }
    }
}

/// One `Channel NN : a[x] -> b[y] via T` line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Connection {
    /// Channel number.
    pub channel: u32,
    /// Sending rank.
    pub from: RankRef,
    /// Receiving rank.
    pub to: RankRef,
    /// `[send]`/`[receive]` (network connections only).
    pub direction: Option<Direction>,
    /// How.
    pub transport: Transport,
    /// Host that printed the line.
    pub host: Option<String>,
}

/// NVLink SHARP.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Nvls {
    /// Devices with `NVLS multicast support is available on dev N`.
    pub available_on: BTreeSet<u32>,
    /// Devices with `... is not available on dev N`.
    pub unavailable_on: BTreeSet<u32>,
    /// `N nvls channels` (the largest seen).
    pub channels: Option<u32>,
}

/// CollNet (in-network reductions).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CollNet {
    /// `Loaded collnet plugin SHARP (v8)`.
    pub plugin: Option<String>,
    /// `N collnet channels` (the largest seen).
    pub channels: Option<u32>,
    /// Some RDMA device carries the `SHARP` tag.
    pub sharp_devices: bool,
}

/// NCCL's topology print.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SystemPrint {
    /// `maxBw` GB/s.
    pub max_bw: Option<f64>,
    /// `totalBw` GB/s.
    pub total_bw: Option<f64>,
    /// The smallest `PCI[x]` link bandwidth in the print (GB/s): a tiny one is a
    /// hypervisor-made bridge that throttles NCCL's graph search.
    pub min_pci_bw: Option<f64>,
}

/// A line the parser could not read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ParseWarning {
    /// File.
    pub source: String,
    /// 1-based line number.
    pub line: usize,
    /// What was wrong.
    pub message: String,
}

/// Whether the two ends of a pair are on one host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scope {
    /// Both ends on one host.
    SameHost,
    /// Ends on different hosts.
    InterNode,
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scope::SameHost => "GPU↔GPU same host",
            Scope::InterNode => "inter-node",
        })
    }
}

/// One row of the explanation: all rank pairs of one scope that NCCL connected one way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PairClass {
    /// Same host or inter-node.
    pub scope: Scope,
    /// Whether the scope was inferred from the transport because a host was unknown.
    pub scope_assumed: bool,
    /// [`Transport::class_label`].
    pub transport: String,
    /// Distinct (channel, from, to) connections.
    pub channels: usize,
    /// Distinct ordered rank pairs.
    pub pairs: usize,
    /// NICs used (network transports), by name when the `Using` list names them.
    pub nics: Vec<String>,
}

impl NcclLog {
    /// The index of per-rank facts (built on the first question: call after parsing).
    fn index(&self) -> &RankIndex {
        self.index.0.get_or_init(|| {
            let mut x = RankIndex::default();
            for (i, r) in self.ranks.iter().enumerate() {
                x.init.entry(r.rank).or_insert(i);
            }
            for c in &self.connections {
                // The ranks of the printing host: the sending end of a network send, the
                // receiving end of a receive; both ends of P2P and SHM.
                let local: &[u32] = match (&c.transport, c.direction) {
                    (Transport::Net { .. }, Some(Direction::Send)) => &[c.from.rank],
                    (Transport::Net { .. }, Some(Direction::Receive)) => &[c.to.rank],
                    (Transport::P2p { .. } | Transport::Shm { .. }, _) => &[c.from.rank, c.to.rank],
                    _ => &[],
                };
                if let Some(h) = &c.host {
                    for &r in local {
                        x.host.entry(r).or_insert_with(|| h.clone());
                    }
                }
                for e in [&c.from, &c.to] {
                    if let Some(b) = &e.bus_id {
                        x.bus_id.entry(e.rank).or_insert_with(|| b.clone());
                    }
                    if let Some(d) = e.dev {
                        x.dev.entry(e.rank).or_insert(d);
                    }
                }
            }
            x
        })
    }

    /// Drops the per-rank index (the log changed).
    pub(crate) fn forget_index(&mut self) {
        if self.index.0.get().is_some() {
            self.index = RankCache::default();
        }
    }

    /// The first init line of `rank`.
    fn rank_info(&self, rank: u32) -> Option<&RankInfo> {
        self.index()
            .init
            .get(&rank)
            .and_then(|&i| self.ranks.get(i))
    }

    /// The host of `rank`, from init lines or from the connections it printed.
    pub fn rank_host(&self, rank: u32) -> Option<String> {
        self.rank_info(rank)
            .and_then(|r| r.host.clone())
            .or_else(|| self.index().host.get(&rank).cloned())
    }

    /// The bus id of `rank`, from init lines or from old-style `rank[busid]` connections.
    pub fn rank_bus_id(&self, rank: u32) -> Option<String> {
        self.rank_info(rank)
            .and_then(|r| r.bus_id.clone())
            .or_else(|| self.index().bus_id.get(&rank).cloned())
    }

    /// The CUDA device of `rank`.
    pub fn rank_dev(&self, rank: u32) -> Option<u32> {
        self.rank_info(rank)
            .and_then(|r| r.cuda_dev)
            .or_else(|| self.index().dev.get(&rank).copied())
    }

    /// The name of net device `dev` of `plugin` as seen on `host`.
    pub fn net_name(&self, plugin: &str, dev: u32, host: Option<&str>) -> String {
        let same_host = |h: &Option<String>| host.is_none() || h.as_deref() == host;
        if plugin.to_ascii_lowercase().contains("socket") {
            if let Some(s) = self
                .sockets
                .iter()
                .find(|s| s.index == dev && same_host(&s.host))
            {
                return s.name.clone();
            }
        } else if let Some(d) = self
            .ib_devices
            .iter()
            .find(|d| d.index == dev && same_host(&d.host))
        {
            return d.name.clone();
        }
        format!("NET/{plugin}/{dev}")
    }

    /// Where the two ends of a connection are, and whether that was inferred.
    pub fn scope_of(&self, c: &Connection) -> (Scope, bool) {
        let (a, b) = (self.rank_host(c.from.rank), self.rank_host(c.to.rank));
        match (a, b, &c.transport) {
            (Some(a), Some(b), _) if a == b => (Scope::SameHost, false),
            (Some(_), Some(_), _) => (Scope::InterNode, false),
            (_, _, Transport::Net { .. }) => (Scope::InterNode, true),
            _ => (Scope::SameHost, true),
        }
    }

    /// One row per (scope, transport class), in a stable order.
    pub fn pair_classes(&self) -> Vec<PairClass> {
        type Key = (Scope, String);
        let mut chans: BTreeMap<Key, BTreeSet<(u32, u32, u32)>> = BTreeMap::new();
        let mut pairs: BTreeMap<Key, BTreeSet<(u32, u32)>> = BTreeMap::new();
        let mut nics: BTreeMap<Key, BTreeSet<String>> = BTreeMap::new();
        let mut assumed: BTreeMap<Key, bool> = BTreeMap::new();
        for c in &self.connections {
            let (scope, guess) = self.scope_of(c);
            let key = (scope, c.transport.class_label());
            chans
                .entry(key.clone())
                .or_default()
                .insert((c.channel, c.from.rank, c.to.rank));
            pairs
                .entry(key.clone())
                .or_default()
                .insert((c.from.rank, c.to.rank));
            *assumed.entry(key.clone()).or_default() |= guess;
            if let Transport::Net { plugin, dev, .. } = &c.transport {
                nics.entry(key.clone()).or_default().insert(self.net_name(
                    plugin,
                    *dev,
                    c.host.as_deref(),
                ));
            }
        }
        chans
            .into_iter()
            .map(|(key, set)| PairClass {
                scope: key.0,
                scope_assumed: assumed.get(&key).copied().unwrap_or(false),
                transport: key.1.clone(),
                channels: set.len(),
                pairs: pairs.get(&key).map_or(0, BTreeSet::len),
                nics: nics
                    .get(&key)
                    .map(|s| {
                        let mut v: Vec<String> = s.iter().cloned().collect();
                        v.sort_by(|a, b| gdx_topo::natural_cmp(a, b));
                        v
                    })
                    .unwrap_or_default(),
            })
            .collect()
    }

    /// Distinct hosts named anywhere in the log.
    pub fn hosts(&self) -> BTreeSet<String> {
        let mut h = BTreeSet::new();
        h.extend(self.ranks.iter().filter_map(|r| r.host.clone()));
        h.extend(self.connections.iter().filter_map(|c| c.host.clone()));
        h.extend(self.ib_devices.iter().filter_map(|d| d.host.clone()));
        h.extend(self.gdr.iter().filter_map(|d| d.host.clone()));
        h.extend(self.sockets.iter().filter_map(|d| d.host.clone()));
        for seen in [
            &self.versions,
            &self.networks,
            &self.ib_unavailable,
            &self.nccl_warnings,
        ] {
            h.extend(seen.iter().filter_map(|s| s.host.clone()));
        }
        h
    }
}
