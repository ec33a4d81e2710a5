//! Choosing the GID a queue pair sends from.
//!
//! - InfiniBand: GID 0 and the port's LID (no global route header inside a subnet).
//! - Ethernet (RoCE): a RoCE v2 GID carrying an IPv4-mapped address (`::ffff:a.b.c.d`) on a
//!   netdev that is up and really has that address, as NCCL chooses by default; then global
//!   IPv6 v2 GIDs, then v1, then link-local ones. Ties go to the lowest index.
//! - `GDX_IB_GID_INDEX` overrides the choice; the index must exist in the port's table.
//!
//! The GID table comes from sysfs ([`candidates_from_topo`], which works on a captured
//! `--root`) or from libibverbs ([`candidates_from_verbs`]); netdev state and addresses come
//! from a [`NetdevView`]: [`SysfsNetdevs`] reads `sys/class/net/<if>/operstate` under a root
//! and, on the live machine, the interface addresses.

use gdx_sys::verbs::{GidType, InterfaceAddress, Port};
use gdx_topo::sysfs::RootFs;
use gdx_topo::NicPort;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

/// The environment variable that forces a GID index.
pub const GID_INDEX_ENV: &str = "GDX_IB_GID_INDEX";

/// A port's link layer, as the connection needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkKind {
    /// InfiniBand: LID routing.
    InfiniBand,
    /// Ethernet: RoCE, GID routing.
    Ethernet,
}

impl LinkKind {
    /// From sysfs or verbs text (`InfiniBand`, `Ethernet`); unknown text counts as
    /// InfiniBand, as old kernels report IB ports without a link layer.
    pub fn from_text(text: Option<&str>) -> LinkKind {
        match text.map(str::trim) {
            Some(t) if t.eq_ignore_ascii_case("ethernet") => LinkKind::Ethernet,
            _ => LinkKind::InfiniBand,
        }
    }
}

impl fmt::Display for LinkKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LinkKind::InfiniBand => "InfiniBand",
            LinkKind::Ethernet => "Ethernet (RoCE)",
        })
    }
}

/// A GID type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GidKind {
    /// InfiniBand GID.
    Ib,
    /// RoCE v1 (Ethernet, not routable).
    RoceV1,
    /// RoCE v2 (UDP/IP, routable).
    RoceV2,
    /// Not reported.
    Unknown,
}

impl fmt::Display for GidKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GidKind::Ib => "IB",
            GidKind::RoceV1 => "RoCE v1",
            GidKind::RoceV2 => "RoCE v2",
            GidKind::Unknown => "type unknown",
        })
    }
}

/// One populated GID table entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GidCandidate {
    /// GID index.
    pub index: u32,
    /// The GID.
    pub gid: Ipv6Addr,
    /// Its type.
    pub kind: GidKind,
    /// The netdev it belongs to (RoCE).
    pub netdev: Option<String>,
}

impl GidCandidate {
    /// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`).
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        self.gid.to_ipv4_mapped()
    }

    /// Whether the GID is link-local (`fe80::/10`, made from the MAC, not an IP address).
    pub fn is_link_local(&self) -> bool {
        self.gid.segments()[0] & 0xffc0 == 0xfe80
    }

    /// The IP address the GID carries, if any (IPv4-mapped or global IPv6).
    pub fn ip(&self) -> Option<IpAddr> {
        if let Some(v4) = self.ipv4() {
            return Some(IpAddr::V4(v4));
        }
        (!self.is_link_local() && !self.gid.is_unspecified()).then_some(IpAddr::V6(self.gid))
    }

    /// A RoCE v2 GID carrying an IP address: routable RoCE v2 traffic can be sent from it.
    pub fn is_routable_v2(&self) -> bool {
        self.kind == GidKind::RoceV2 && self.ip().is_some()
    }
}

/// Parse a sysfs GID (`0000:0000:0000:0000:0000:ffff:0a00:0001`).
pub fn parse_sysfs_gid(text: &str) -> Option<Ipv6Addr> {
    let groups: Vec<u16> = text
        .trim()
        .split(':')
        .map(|g| u16::from_str_radix(g, 16))
        .collect::<Result<_, _>>()
        .ok()?;
    let g: [u16; 8] = groups.try_into().ok()?;
    Some(Ipv6Addr::new(
        g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7],
    ))
}

fn kind_from_sysfs(text: Option<&str>, link: LinkKind) -> GidKind {
    match text.map(str::trim) {
        Some(t) if t.contains("v2") => GidKind::RoceV2,
        Some(t) if t.contains("v1") || t.starts_with("IB") => match link {
            LinkKind::Ethernet => GidKind::RoceV1,
            LinkKind::InfiniBand => GidKind::Ib,
        },
        _ if link == LinkKind::InfiniBand => GidKind::Ib,
        _ => GidKind::Unknown,
    }
}

/// The populated GIDs of a port read from sysfs (a topology from `--root` or the live
/// machine). Unparsable entries are skipped.
pub fn candidates_from_topo(port: &NicPort) -> Vec<GidCandidate> {
    let link = LinkKind::from_text(port.link_layer.as_deref());
    port.gids
        .iter()
        .filter_map(|g| {
            let gid = parse_sysfs_gid(&g.gid)?;
            (!gid.is_unspecified()).then(|| GidCandidate {
                index: g.index,
                gid,
                kind: kind_from_sysfs(g.gid_type.as_deref(), link),
                netdev: g.ndev.clone(),
            })
        })
        .collect()
}

/// The populated GIDs of a port as libibverbs reports them.
pub fn candidates_from_verbs(port: &Port) -> Vec<GidCandidate> {
    let link = LinkKind::from_text(Some(&port.link_layer.to_string()));
    port.gids
        .iter()
        .map(|g| GidCandidate {
            index: g.index,
            gid: g.gid,
            kind: match g.kind {
                GidType::Ib if link == LinkKind::Ethernet => GidKind::RoceV1,
                GidType::Ib => GidKind::Ib,
                GidType::RoceV1 => GidKind::RoceV1,
                GidType::RoceV2 => GidKind::RoceV2,
                _ if link == LinkKind::InfiniBand => GidKind::Ib,
                _ => GidKind::Unknown,
            },
            netdev: g.netdev.clone(),
        })
        .collect()
}

/// Whether a network interface is up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NetdevState {
    /// `operstate` is `up`.
    Up,
    /// `operstate` is `down`, `lowerlayerdown`, `dormant` or `notpresent`.
    Down,
    /// Not known (`unknown`, or no such file).
    Unknown,
}

/// What GID selection needs to know about network interfaces.
pub trait NetdevView {
    /// The interface's state.
    fn state(&self, netdev: &str) -> NetdevState;
    /// The interface's addresses; `None` when not known (a captured `--root`).
    fn addresses(&self, netdev: &str) -> Option<Vec<IpAddr>>;
}

/// Netdev facts from `sys/class/net` under a root, plus the live interface addresses when
/// the root is the running machine.
#[derive(Debug, Clone)]
pub struct SysfsNetdevs {
    root: RootFs,
    addrs: Option<Vec<InterfaceAddress>>,
}

impl SysfsNetdevs {
    /// Operstate under `root`; addresses unknown.
    pub fn at_root(root: &Path) -> SysfsNetdevs {
        SysfsNetdevs {
            root: RootFs::new(root),
            addrs: None,
        }
    }

    /// The running machine: operstate under `/` and addresses from `getifaddrs`.
    pub fn live() -> SysfsNetdevs {
        let addrs = match gdx_sys::verbs::interface_addresses() {
            Ok(a) => Some(a),
            Err(e) => {
                log::debug!("getifaddrs failed ({e}); GID addresses are not checked");
                None
            }
        };
        SysfsNetdevs {
            root: RootFs::new("/"),
            addrs,
        }
    }
}

impl NetdevView for SysfsNetdevs {
    fn state(&self, netdev: &str) -> NetdevState {
        if netdev.contains('/') || netdev.starts_with('.') {
            return NetdevState::Unknown;
        }
        // `sys/class/net/<if>` is a link (absolute in some captures): resolved inside the
        // root by topo's sysfs layer, never on this machine.
        let rel = format!("sys/class/net/{netdev}/operstate");
        match self.root.file_text(&rel).map(|s| s.to_ascii_lowercase()) {
            Ok(s) if s == "up" => NetdevState::Up,
            Ok(s)
                if matches!(
                    s.as_str(),
                    "down" | "lowerlayerdown" | "dormant" | "notpresent"
                ) =>
            {
                NetdevState::Down
            }
            _ => NetdevState::Unknown,
        }
    }

    fn addresses(&self, netdev: &str) -> Option<Vec<IpAddr>> {
        let a = self.addrs.as_ref()?;
        Some(
            a.iter()
                .filter(|x| x.interface == netdev)
                .map(|x| x.addr)
                .collect(),
        )
    }
}

/// Netdev facts given up front (tests, replays).
#[derive(Debug, Clone, Default)]
pub struct StaticNetdevs {
    /// Per interface: state and, when known, addresses.
    pub netdevs: BTreeMap<String, (NetdevState, Option<Vec<IpAddr>>)>,
}

impl NetdevView for StaticNetdevs {
    fn state(&self, netdev: &str) -> NetdevState {
        self.netdevs
            .get(netdev)
            .map_or(NetdevState::Unknown, |n| n.0)
    }
    fn addresses(&self, netdev: &str) -> Option<Vec<IpAddr>> {
        self.netdevs.get(netdev).and_then(|n| n.1.clone())
    }
}

/// The GID a queue pair uses, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GidChoice {
    /// GID index (the QP's `sgid_index`).
    pub index: u32,
    /// The GID (what the peer sends to).
    pub gid: Ipv6Addr,
    /// Its type.
    pub kind: GidKind,
    /// Its netdev (RoCE).
    pub netdev: Option<String>,
    /// Whether packets carry a global route header (always on RoCE; not on InfiniBand).
    pub use_grh: bool,
    /// Why this one, in words.
    pub reason: String,
}

/// Why no GID could be chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GidError {
    /// `GDX_IB_GID_INDEX` is not a GID index.
    #[error("{GID_INDEX_ENV}={value:?} is not a GID index (expected a number from 0 to 255)")]
    BadOverride {
        /// The text.
        value: String,
    },
    /// `GDX_IB_GID_INDEX` names an index the port does not populate.
    #[error(
        "{GID_INDEX_ENV}={index}, but {device} port {port} has no GID {index}; populated: {}",
        list(.available)
    )]
    OverrideNotFound {
        /// The index asked for.
        index: u32,
        /// RDMA device.
        device: String,
        /// Port.
        port: u32,
        /// Populated indexes.
        available: Vec<u32>,
    },
    /// Nothing usable.
    #[error("{device} port {port}: no usable GID: {why}")]
    NoUsableGid {
        /// RDMA device.
        device: String,
        /// Port.
        port: u32,
        /// Why, with the fix.
        why: String,
    },
}

fn list(v: &[u32]) -> String {
    if v.is_empty() {
        "none".into()
    } else {
        v.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
    }
}

/// Parse a `GDX_IB_GID_INDEX` value.
pub fn parse_override(value: &str) -> Result<u32, GidError> {
    value
        .trim()
        .parse::<u8>()
        .map(u32::from)
        .map_err(|_| GidError::BadOverride {
            value: value.to_string(),
        })
}

/// `GDX_IB_GID_INDEX` from the environment: `None` when unset or empty.
pub fn override_from_env() -> Result<Option<u32>, GidError> {
    match std::env::var(GID_INDEX_ENV) {
        Ok(v) if !v.trim().is_empty() => parse_override(&v).map(Some),
        _ => Ok(None),
    }
}

/// Rank of a RoCE candidate: lower is better.
fn roce_rank(c: &GidCandidate, netdevs: &dyn NetdevView) -> (u8, u8, u8, u32) {
    let state = c
        .netdev
        .as_deref()
        .map_or(NetdevState::Unknown, |n| netdevs.state(n));
    // Known addresses that lack the GID's address: a stale entry.
    let addr = match (
        c.ip(),
        c.netdev.as_deref().and_then(|n| netdevs.addresses(n)),
    ) {
        (Some(ip), Some(have)) if have.contains(&ip) => 0,
        (Some(_), Some(_)) => 2,
        _ => 1,
    };
    let unusable = u8::from(state == NetdevState::Down || addr == 2);
    let tier = match (c.kind, c.ipv4().is_some(), c.ip().is_some()) {
        (GidKind::RoceV2, true, _) => 0,
        (GidKind::RoceV2, false, true) => 1,
        (GidKind::RoceV1, true, _) => 2,
        (GidKind::RoceV1, false, true) => 3,
        (GidKind::RoceV2, _, _) => 4,
        (GidKind::Unknown, _, true) => 5,
        _ => 6,
    };
    let unknown = u8::from(state == NetdevState::Unknown) + u8::from(addr == 1);
    (unusable, tier, unknown, c.index)
}

fn describe(c: &GidCandidate, netdevs: &dyn NetdevView) -> String {
    let mut s = format!("GID {} {} ({}", c.index, c.gid, c.kind);
    if c.ipv4().is_some() {
        s.push_str(", IPv4-mapped");
    } else if c.is_link_local() {
        s.push_str(", link-local");
    }
    s.push(')');
    if let Some(n) = &c.netdev {
        let state = match netdevs.state(n) {
            NetdevState::Up => "up",
            NetdevState::Down => "down",
            NetdevState::Unknown => "state unknown",
        };
        s.push_str(&format!(" on {n} ({state}"));
        match (c.ip(), netdevs.addresses(n)) {
            (Some(ip), Some(have)) if have.contains(&ip) => s.push_str(&format!(", has {ip}")),
            (Some(ip), Some(_)) => s.push_str(&format!(", does not have {ip}: stale")),
            _ => {}
        }
        s.push(')');
    }
    s
}

/// Choose the GID for `device` port `port` from its populated `gids`, honouring
/// `override_index` (from [`override_from_env`]).
pub fn select_gid(
    device: &str,
    port: u32,
    link: LinkKind,
    gids: &[GidCandidate],
    netdevs: &dyn NetdevView,
    override_index: Option<u32>,
) -> Result<GidChoice, GidError> {
    let pick = |c: &GidCandidate, reason: String| GidChoice {
        index: c.index,
        gid: c.gid,
        kind: c.kind,
        netdev: c.netdev.clone(),
        use_grh: link == LinkKind::Ethernet,
        reason,
    };
    if let Some(i) = override_index {
        let Some(c) = gids.iter().find(|c| c.index == i) else {
            let mut available: Vec<u32> = gids.iter().map(|c| c.index).collect();
            available.sort_unstable();
            return Err(GidError::OverrideNotFound {
                index: i,
                device: device.to_string(),
                port,
                available,
            });
        };
        let mut reason = format!("{GID_INDEX_ENV}={i}: {}", describe(c, netdevs));
        if link == LinkKind::Ethernet && (c.kind != GidKind::RoceV2 || c.ipv4().is_none()) {
            reason.push_str("; note: not a RoCE v2 IPv4 GID, which peers usually expect");
        }
        return Ok(pick(c, reason));
    }
    match link {
        LinkKind::InfiniBand => {
            let Some(c) = gids.iter().find(|c| c.index == 0) else {
                return Err(GidError::NoUsableGid {
                    device: device.to_string(),
                    port,
                    why: "InfiniBand port without GID 0 (is the port initialised by a subnet manager?)"
                        .into(),
                });
            };
            Ok(pick(
                c,
                format!("InfiniBand: GID 0 {} with LID routing (no GRH)", c.gid),
            ))
        }
        LinkKind::Ethernet => {
            let best = gids
                .iter()
                .filter(|c| c.kind != GidKind::Ib)
                .min_by_key(|c| roce_rank(c, netdevs));
            let Some(c) = best else {
                return Err(GidError::NoUsableGid {
                    device: device.to_string(),
                    port,
                    why: "the RoCE GID table is empty: assign an IP address to the port's netdev"
                        .into(),
                });
            };
            let rank = roce_rank(c, netdevs);
            let mut reason = describe(c, netdevs);
            if rank.0 == 1 {
                reason.push_str("; warning: its netdev is down or lacks the address");
            }
            if rank.1 > 0 {
                reason.push_str(
                    "; warning: no RoCE v2 GID with an IPv4 address (assign an IPv4 address to the netdev)",
                );
            }
            Ok(pick(c, format!("RoCE: {reason}")))
        }
    }
}

/// [`select_gid`] for port `port` of a NIC in a topology (sysfs GID table).
pub fn select_gid_for_port(
    device: &str,
    port: &NicPort,
    netdevs: &dyn NetdevView,
    override_index: Option<u32>,
) -> Result<GidChoice, GidError> {
    select_gid(
        device,
        port.port,
        LinkKind::from_text(port.link_layer.as_deref()),
        &candidates_from_topo(port),
        netdevs,
        override_index,
    )
}
