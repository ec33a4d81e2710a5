//! One port of an RDMA device: state, link layer, MTU, width, speed and GID table.
//!
//! Every conversion from a verbs number is total: a value this build does not know becomes an
//! `Other(n)` variant or `None`, never a panic (sideway's `From` impls panic instead).

use rdma_mummy_sys::{ibv_gid, ibv_gid_entry, ibv_port_attr};
use sideway::ibverbs::device_context::DeviceContext;
use std::ffi::{c_char, c_int, CStr};
use std::fmt;
use std::net::Ipv6Addr;

/// Upper bound on GID indexes walked per port (real tables have 16 to 256 entries).
const MAX_GIDS: u32 = 1024;

/// Logical port state (`enum ibv_port_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortState {
    /// `IBV_PORT_NOP`.
    Nop,
    /// `IBV_PORT_DOWN`.
    Down,
    /// `IBV_PORT_INIT`: physical link up, waiting for the subnet manager.
    Init,
    /// `IBV_PORT_ARMED`.
    Armed,
    /// `IBV_PORT_ACTIVE`.
    Active,
    /// `IBV_PORT_ACTIVE_DEFER`.
    ActiveDefer,
    /// A value this build does not know.
    Other(u32),
}

impl PortState {
    fn from_raw(v: u32) -> Self {
        match v {
            0 => PortState::Nop,
            1 => PortState::Down,
            2 => PortState::Init,
            3 => PortState::Armed,
            4 => PortState::Active,
            5 => PortState::ActiveDefer,
            n => PortState::Other(n),
        }
    }
}

impl fmt::Display for PortState {
    /// `PORT_ACTIVE` etc., as `ibv_devinfo` prints it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortState::Nop => f.write_str("PORT_NOP"),
            PortState::Down => f.write_str("PORT_DOWN"),
            PortState::Init => f.write_str("PORT_INIT"),
            PortState::Armed => f.write_str("PORT_ARMED"),
            PortState::Active => f.write_str("PORT_ACTIVE"),
            PortState::ActiveDefer => f.write_str("PORT_ACTIVE_DEFER"),
            PortState::Other(n) => write!(f, "state {n}"),
        }
    }
}

/// Link layer of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkLayer {
    /// InfiniBand.
    InfiniBand,
    /// Ethernet (RoCE).
    Ethernet,
    /// Not reported (old kernels report InfiniBand ports this way).
    Unspecified,
    /// A value this build does not know.
    Other(u8),
}

impl LinkLayer {
    fn from_raw(v: u8) -> Self {
        match v {
            0 => LinkLayer::Unspecified,
            1 => LinkLayer::InfiniBand,
            2 => LinkLayer::Ethernet,
            n => LinkLayer::Other(n),
        }
    }
}

impl fmt::Display for LinkLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkLayer::InfiniBand => f.write_str("InfiniBand"),
            LinkLayer::Ethernet => f.write_str("Ethernet"),
            LinkLayer::Unspecified => f.write_str("Unspecified"),
            LinkLayer::Other(n) => write!(f, "link layer {n}"),
        }
    }
}

/// GID type (`enum ibv_gid_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GidType {
    /// InfiniBand GID.
    Ib,
    /// RoCE v1 (Ethernet, no IP header).
    RoceV1,
    /// RoCE v2 (UDP/IP; routable).
    RoceV2,
    /// Not known: an old rdma-core without `ibv_query_gid_ex`.
    Unknown,
    /// A value this build does not know.
    Other(u32),
}

impl GidType {
    fn from_raw(v: u32) -> Self {
        match v {
            0 => GidType::Ib,
            1 => GidType::RoceV1,
            2 => GidType::RoceV2,
            n => GidType::Other(n),
        }
    }
}

/// One populated entry of a port's GID table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidEntry {
    /// GID index (what a QP's `sgid_index` refers to).
    pub index: u32,
    /// The GID, an IPv6 address (an IPv4-mapped one for RoCE over IPv4).
    pub gid: Ipv6Addr,
    /// GID type.
    pub kind: GidType,
    /// The network interface of a RoCE GID, e.g. `ens1f0np0`.
    pub netdev: Option<String>,
}

/// One physical port.
#[derive(Debug, Clone, PartialEq)]
pub struct Port {
    /// Port number, from 1.
    pub number: u8,
    /// Logical state.
    pub state: PortState,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// Active MTU in bytes (256 to 4096); `None` for an unknown code.
    pub active_mtu_bytes: Option<u32>,
    /// Largest MTU the port supports, in bytes; `None` for an unknown code.
    pub max_mtu_bytes: Option<u32>,
    /// Active width in lanes (1, 2, 4, 8 or 12); `None` for an unknown code.
    pub active_width_lanes: Option<u8>,
    /// Active speed name per lane: `SDR`, `DDR`, `QDR`, `FDR10`, `FDR`, `EDR`, `HDR`, `NDR`,
    /// `XDR`; `None` for an unknown code.
    pub active_speed: Option<&'static str>,
    /// Nominal data rate, lanes × per-lane rate, in Gb/s (as `ibstat` prints it: EDR 4x =
    /// 100); `None` when width or speed is unknown.
    pub rate_gbps: Option<f64>,
    /// Base LID (InfiniBand).
    pub lid: u16,
    /// Populated GID table entries.
    pub gids: Vec<GidEntry>,
    /// Why the port could not be queried, if so (the fields above are then defaults).
    pub error: Option<String>,
}

/// MTU code to bytes.
fn mtu_bytes(code: u32) -> Option<u32> {
    match code {
        1..=5 => Some(128 << code),
        _ => None,
    }
}

/// `active_width` bit to lanes.
fn width_lanes(code: u8) -> Option<u8> {
    match code {
        1 => Some(1),
        2 => Some(4),
        4 => Some(8),
        8 => Some(12),
        16 => Some(2),
        _ => None,
    }
}

/// `active_speed`/`active_speed_ex` bit to name and nominal Gb/s per lane.
fn speed(code: u32) -> Option<(&'static str, f64)> {
    Some(match code {
        1 => ("SDR", 2.5),
        2 => ("DDR", 5.0),
        4 => ("QDR", 10.0),
        8 => ("FDR10", 10.0),
        16 => ("FDR", 14.0),
        32 => ("EDR", 25.0),
        64 => ("HDR", 50.0),
        128 => ("NDR", 100.0),
        256 => ("XDR", 200.0),
        _ => return None,
    })
}

/// Convert a port attribute block (no GIDs yet).
fn from_attr(number: u8, a: &ibv_port_attr) -> Port {
    let speed_code = if a.active_speed_ex != 0 {
        a.active_speed_ex
    } else {
        u32::from(a.active_speed)
    };
    let lanes = width_lanes(a.active_width);
    let speed = speed(speed_code);
    Port {
        number,
        state: PortState::from_raw(a.state),
        link_layer: LinkLayer::from_raw(a.link_layer),
        active_mtu_bytes: mtu_bytes(a.active_mtu),
        max_mtu_bytes: mtu_bytes(a.max_mtu),
        active_width_lanes: lanes,
        active_speed: speed.map(|s| s.0),
        rate_gbps: lanes.zip(speed).map(|(l, s)| f64::from(l) * s.1),
        lid: a.lid,
        gids: Vec::new(),
        error: None,
    }
}

/// Query port `number` of `ctx` (device `name`), with its populated GIDs.
pub(super) fn query(ctx: &DeviceContext, name: &str, number: u8) -> Port {
    // SAFETY: the pointer is only used while `ctx`, which owns the open context, is borrowed.
    let raw = unsafe { ctx.context() }.as_ptr();
    // SAFETY: `ibv_port_attr` is plain C data (integers), for which all-zero is valid.
    let mut attr: ibv_port_attr = unsafe { std::mem::zeroed() };
    // SAFETY: `raw` is an open context and `attr` a valid, exclusive out-pointer of the size
    // the inline wrapper passes to the provider.
    let rc = unsafe { rdma_mummy_sys::ibv_query_port(raw, number, &mut attr) };
    if rc != 0 {
        let mut p = from_attr(number, &attr);
        p.error = Some(format!(
            "ibv_query_port({name}, {number}) failed: {}",
            std::io::Error::from_raw_os_error(rc)
        ));
        return p;
    }
    let mut port = from_attr(number, &attr);
    let len = u32::try_from(attr.gid_tbl_len).unwrap_or(0).min(MAX_GIDS);
    for index in 0..len {
        if let Some(g) = gid(raw, number, index) {
            port.gids.push(g);
        }
    }
    port
}

/// GID `index` of a port: `ibv_query_gid_ex`, or `ibv_query_gid` with an unknown type when
/// rdma-core lacks the former. `None` for an empty or unreadable entry.
fn gid(raw: *mut rdma_mummy_sys::ibv_context, port: u8, index: u32) -> Option<GidEntry> {
    // SAFETY: `ibv_gid_entry` is plain C data (a byte union and integers); all-zero is valid.
    let mut e: ibv_gid_entry = unsafe { std::mem::zeroed() };
    // SAFETY: `raw` is an open context; `e` is a valid, exclusive out-pointer of the size the
    // inline wrapper passes.
    let rc = unsafe { rdma_mummy_sys::ibv_query_gid_ex(raw, u32::from(port), index, &mut e, 0) };
    let (bytes, kind, ifindex) = if rc == 0 {
        // SAFETY: every variant of the `ibv_gid` union is 16 bytes of plain data.
        (
            unsafe { e.gid.raw },
            GidType::from_raw(e.gid_type),
            e.ndev_ifindex,
        )
    } else if rc == libc::EOPNOTSUPP {
        // SAFETY: as above, all-zero is a valid `ibv_gid`.
        let mut g: ibv_gid = unsafe { std::mem::zeroed() };
        let idx = c_int::try_from(index).ok()?;
        // SAFETY: `raw` is an open context; `g` is a valid, exclusive out-pointer.
        if unsafe { rdma_mummy_sys::ibv_query_gid(raw, port, idx, &mut g) } != 0 {
            return None;
        }
        // SAFETY: every variant of the `ibv_gid` union is 16 bytes of plain data.
        (unsafe { g.raw }, GidType::Unknown, 0)
    } else {
        // ENODATA and friends: an unpopulated entry.
        return None;
    };
    if bytes.iter().all(|b| *b == 0) {
        return None;
    }
    Some(GidEntry {
        index,
        gid: Ipv6Addr::from(bytes),
        kind,
        netdev: netdev_name(ifindex),
    })
}

/// `if_indextoname`; `None` for 0 or an unknown index.
fn netdev_name(ifindex: u32) -> Option<String> {
    if ifindex == 0 {
        return None;
    }
    let mut buf = [0 as c_char; libc::IF_NAMESIZE];
    // SAFETY: `buf` has the IF_NAMESIZE bytes `if_indextoname` may write.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: on success `buf` holds a NUL-terminated name.
    Some(
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr() -> ibv_port_attr {
        // SAFETY: plain C data; all-zero is valid.
        unsafe { std::mem::zeroed() }
    }

    #[test]
    fn an_edr_4x_infiniband_port() {
        let mut a = attr();
        a.state = 4;
        a.link_layer = 1;
        a.active_mtu = 5;
        a.max_mtu = 5;
        a.active_width = 2;
        a.active_speed = 32;
        a.lid = 7;
        let p = from_attr(1, &a);
        assert_eq!(p.state, PortState::Active);
        assert_eq!(p.state.to_string(), "PORT_ACTIVE");
        assert_eq!(p.link_layer, LinkLayer::InfiniBand);
        assert_eq!(p.active_mtu_bytes, Some(4096));
        assert_eq!(p.max_mtu_bytes, Some(4096));
        assert_eq!(p.active_width_lanes, Some(4));
        assert_eq!(p.active_speed, Some("EDR"));
        assert_eq!(p.rate_gbps, Some(100.0));
        assert_eq!(p.lid, 7);
    }

    #[test]
    fn speed_ex_wins_over_the_legacy_field() {
        let mut a = attr();
        a.active_width = 2;
        a.active_speed = 0;
        a.active_speed_ex = 256;
        let p = from_attr(1, &a);
        assert_eq!(p.active_speed, Some("XDR"));
        assert_eq!(p.rate_gbps, Some(800.0));
    }

    #[test]
    fn unknown_codes_become_other_or_none_not_a_panic() {
        let mut a = attr();
        a.state = 42;
        a.link_layer = 9;
        a.active_mtu = 9;
        a.active_width = 3;
        a.active_speed = 3;
        let p = from_attr(2, &a);
        assert_eq!(p.state, PortState::Other(42));
        assert_eq!(p.link_layer, LinkLayer::Other(9));
        assert_eq!(p.active_mtu_bytes, None);
        assert_eq!(p.active_width_lanes, None);
        assert_eq!(p.active_speed, None);
        assert_eq!(p.rate_gbps, None);
        assert_eq!(GidType::from_raw(7), GidType::Other(7));
        assert_eq!(GidType::from_raw(2), GidType::RoceV2);
    }

    #[test]
    fn mtu_codes_map_to_bytes() {
        let got: Vec<_> = (1..=5).map(mtu_bytes).collect();
        assert_eq!(got, [256, 512, 1024, 2048, 4096].map(Some));
    }

    #[test]
    fn netdev_of_index_zero_is_none() {
        assert_eq!(netdev_name(0), None);
        assert_eq!(netdev_name(u32::MAX), None);
    }
}
