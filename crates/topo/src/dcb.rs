//! A netdev's Data Center Bridging state (IEEE 802.1Qaz/Qbb) as the kernel's dcbnl netlink API
//! reports it: which priorities have priority flow control (PFC) on, the application priority
//! table (DSCP → priority entries) and, where the driver has one, the trust table. This is what
//! `dcb pfc show` / `dcb app show` (iproute2) and `mlnx_qos` read: `RTM_GETDCB` with
//! `DCB_CMD_IEEE_GET` on a `NETLINK_ROUTE` socket.
//!
//! [`read`] takes the state from a capture (`gdx/dcb/<netdev>.json`, written by
//! `gdx topo --capture`) when the root holds one, else from the live kernel when the root is
//! this machine's `/`. A netdev without DCB support (virtio, dummy, a driver without dcbnl
//! operations) answers `EOPNOTSUPP`, which is [`DcbError::NotSupported`], not an error of gdx.

use crate::sysfs::RootFs;
use rustix::net::{netlink, AddressFamily, RecvFlags, SendFlags, SocketType};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// `IEEE_8021QAZ_APP_SEL_DSCP`: an application-table entry keyed by DSCP.
pub const APP_SEL_DSCP: u8 = 5;
/// `DCB_APP_SEL_PCP`: the trust table's "classify by VLAN PCP" selector.
pub const APP_SEL_PCP: u8 = 255;

/// Where a capture keeps the DCB state of netdev `netdev`.
pub fn capture_path(netdev: &str) -> String {
    format!("gdx/dcb/{netdev}.json")
}

/// One application-priority entry (`struct dcb_app`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DcbApp {
    /// Selector: 1 ethertype, 2 TCP/SCTP port, 3 UDP/DCCP port, 4 any port, 5 DSCP.
    pub selector: u8,
    /// The priority traffic matching it gets.
    pub priority: u8,
    /// The ethertype, port or DSCP value.
    pub protocol: u16,
}

/// A netdev's DCB state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dcb {
    /// Traffic classes that can have PFC (`pfc_cap`).
    pub pfc_cap: u8,
    /// Bit `p` set: PFC is on for priority `p` (`pfc_en`).
    pub pfc_en: u8,
    /// The application priority table.
    #[serde(default)]
    pub apps: Vec<DcbApp>,
    /// The trust table's selectors in order, where the driver reports one (kernel 6.4+).
    #[serde(default)]
    pub trust: Option<Vec<u8>>,
}

impl Dcb {
    /// PFC is on for priority `prio`.
    pub fn pfc_on(&self, prio: u8) -> bool {
        prio < 8 && self.pfc_en & (1 << prio) != 0
    }

    /// The priorities with PFC on, lowest first.
    pub fn pfc_priorities(&self) -> Vec<u8> {
        (0..8).filter(|&p| self.pfc_on(p)).collect()
    }

    /// The priority the application table gives DSCP `dscp`, if it has an entry.
    pub fn dscp_priority(&self, dscp: u8) -> Option<u8> {
        self.apps
            .iter()
            .find(|a| a.selector == APP_SEL_DSCP && a.protocol == u16::from(dscp))
            .map(|a| a.priority)
    }

    /// True when the application table has any DSCP entry (mlx5 then classifies by DSCP).
    pub fn has_dscp_map(&self) -> bool {
        self.apps.iter().any(|a| a.selector == APP_SEL_DSCP)
    }

    /// `pfc_en` as `dcb pfc show` prints it: `0:off 1:off 2:off 3:on ...`.
    pub fn pfc_text(&self) -> String {
        (0..8u8)
            .map(|p| format!("{p}:{}", if self.pfc_on(p) { "on" } else { "off" }))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Why the DCB state could not be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DcbError {
    /// The netdev's driver has no DCB operations (`EOPNOTSUPP`).
    #[error("{netdev} has no DCB support (the kernel answers EOPNOTSUPP to RTM_GETDCB)")]
    NotSupported {
        /// The netdev.
        netdev: String,
    },
    /// No such netdev (`ENODEV`).
    #[error("no netdev named {netdev}")]
    NoDevice {
        /// The netdev.
        netdev: String,
    },
    /// A captured root without `gdx/dcb/<netdev>.json`.
    #[error(
        "the capture has no DCB state for {netdev} ({path} is missing; capture with a newer gdx)"
    )]
    NotCaptured {
        /// The netdev.
        netdev: String,
        /// The file looked for.
        path: String,
    },
    /// The socket or the reply failed.
    #[error("RTM_GETDCB for {netdev}: {message}")]
    Failed {
        /// The netdev.
        netdev: String,
        /// What went wrong.
        message: String,
    },
}

/// Captured form of a DCB reading: the state, or why there was none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Captured {
    /// The state.
    State(Dcb),
    /// The netdev had no DCB support.
    NotSupported,
    /// Another failure, as text.
    Error(String),
}

/// The DCB state of `netdev` under `fs`'s root; the second value says where it came from
/// (evidence).
pub fn read(fs: &RootFs, netdev: &str) -> (Result<Dcb, DcbError>, String) {
    let path = capture_path(netdev);
    if let Some(text) = fs.text(&path) {
        let shown = fs.show(&path);
        let r = match serde_json::from_str::<Captured>(&text) {
            Ok(Captured::State(d)) => Ok(d),
            Ok(Captured::NotSupported) => Err(DcbError::NotSupported {
                netdev: netdev.into(),
            }),
            Ok(Captured::Error(message)) => Err(DcbError::Failed {
                netdev: netdev.into(),
                message,
            }),
            Err(e) => Err(DcbError::Failed {
                netdev: netdev.into(),
                message: format!("{shown} is not a DCB capture: {e}"),
            }),
        };
        return (r, shown);
    }
    if crate::sysfs::rootfs::is_host_root(fs.root()) {
        return (
            query_live(netdev),
            format!("netlink RTM_GETDCB DCB_CMD_IEEE_GET dev {netdev}"),
        );
    }
    let shown = fs.show(&path);
    (
        Err(DcbError::NotCaptured {
            netdev: netdev.into(),
            path: shown.clone(),
        }),
        shown,
    )
}

/// The captured form of the live state of `netdev` (what `gdx topo --capture` writes).
pub fn capture_live(netdev: &str) -> Captured {
    match query_live(netdev) {
        Ok(d) => Captured::State(d),
        Err(DcbError::NotSupported { .. }) => Captured::NotSupported,
        Err(e) => Captured::Error(e.to_string()),
    }
}

const RTM_GETDCB: u16 = 78;
const NLM_F_REQUEST: u16 = 1;
const NLMSG_ERROR: u16 = 2;
const DCB_CMD_IEEE_GET: u8 = 21;
const DCB_ATTR_IFNAME: u16 = 1;
const DCB_ATTR_IEEE: u16 = 13;
const DCB_ATTR_IEEE_PFC: u16 = 2;
const DCB_ATTR_IEEE_APP_TABLE: u16 = 3;
const DCB_ATTR_DCB_APP_TRUST_TABLE: u16 = 11;
const DCB_ATTR_IEEE_APP: u16 = 1;
const DCB_ATTR_DCB_APP_TRUST: u16 = 1;
const NLA_TYPE_MASK: u16 = 0x3fff;

/// The request: `nlmsghdr`, `dcbmsg { AF_UNSPEC, DCB_CMD_IEEE_GET }`, `DCB_ATTR_IFNAME`.
pub fn request(netdev: &str, seq: u32) -> Vec<u8> {
    let mut name = netdev.as_bytes().to_vec();
    name.push(0);
    let attr_len = 4 + name.len();
    let total = 16 + 4 + align4(attr_len);
    let mut m = Vec::with_capacity(total);
    m.extend_from_slice(&(total as u32).to_ne_bytes());
    m.extend_from_slice(&RTM_GETDCB.to_ne_bytes());
    m.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&[0, DCB_CMD_IEEE_GET, 0, 0]);
    m.extend_from_slice(&(attr_len as u16).to_ne_bytes());
    m.extend_from_slice(&DCB_ATTR_IFNAME.to_ne_bytes());
    m.extend_from_slice(&name);
    m.resize(total, 0);
    m
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Ask the kernel for `netdev`'s IEEE DCB state.
///
/// # Errors
/// [`DcbError::NotSupported`] for a netdev without DCB operations, [`DcbError::NoDevice`],
/// and [`DcbError::Failed`] for a socket error or a reply that does not parse.
pub fn query_live(netdev: &str) -> Result<Dcb, DcbError> {
    let failed = |message: String| DcbError::Failed {
        netdev: netdev.into(),
        message,
    };
    let fd = rustix::net::socket(AddressFamily::NETLINK, SocketType::RAW, None)
        .map_err(|e| failed(format!("socket(AF_NETLINK): {e}")))?;
    rustix::net::sockopt::set_socket_timeout(
        &fd,
        rustix::net::sockopt::Timeout::Recv,
        Some(Duration::from_secs(2)),
    )
    .map_err(|e| failed(format!("SO_RCVTIMEO: {e}")))?;
    let kernel = netlink::SocketAddrNetlink::new(0, 0);
    rustix::net::sendto(&fd, &request(netdev, 1), SendFlags::empty(), &kernel)
        .map_err(|e| failed(format!("sendto: {e}")))?;
    let mut buf = vec![0u8; 16384];
    let (_, n) = rustix::net::recv(&fd, &mut buf[..], RecvFlags::empty())
        .map_err(|e| failed(format!("recv: {e}")))?;
    parse_reply(netdev, &buf[..n.min(buf.len())])
}

/// Parse the kernel's reply to [`request`].
///
/// # Errors
/// As [`query_live`].
pub fn parse_reply(netdev: &str, msg: &[u8]) -> Result<Dcb, DcbError> {
    let bad = |what: &str| DcbError::Failed {
        netdev: netdev.into(),
        message: format!("malformed reply: {what}"),
    };
    if msg.len() < 16 {
        return Err(bad("shorter than a netlink header"));
    }
    let len = (u32_at(msg, 0) as usize).min(msg.len());
    let ty = u16_at(msg, 4);
    if ty == NLMSG_ERROR {
        let errno = if len >= 20 {
            -(u32_at(msg, 16) as i32)
        } else {
            0
        };
        return Err(match errno {
            0 => bad("an acknowledgement instead of the state"),
            e if e == EOPNOTSUPP => DcbError::NotSupported {
                netdev: netdev.into(),
            },
            e if e == ENODEV => DcbError::NoDevice {
                netdev: netdev.into(),
            },
            e => DcbError::Failed {
                netdev: netdev.into(),
                message: std::io::Error::from_raw_os_error(e).to_string(),
            },
        });
    }
    if ty != RTM_GETDCB || len < 20 {
        return Err(bad(&format!("message type {ty}, length {len}")));
    }
    let mut dcb = Dcb::default();
    let mut ieee_seen = false;
    for (t, payload) in attrs(&msg[20..len]) {
        if t != DCB_ATTR_IEEE {
            continue;
        }
        ieee_seen = true;
        for (it, ip) in attrs(payload) {
            match it {
                DCB_ATTR_IEEE_PFC if ip.len() >= 2 => {
                    dcb.pfc_cap = ip[0];
                    dcb.pfc_en = ip[1];
                }
                DCB_ATTR_IEEE_APP_TABLE => {
                    for (at, ap) in attrs(ip) {
                        if at == DCB_ATTR_IEEE_APP && ap.len() >= 4 {
                            dcb.apps.push(DcbApp {
                                selector: ap[0],
                                priority: ap[1],
                                protocol: u16_at(ap, 2),
                            });
                        }
                    }
                }
                DCB_ATTR_DCB_APP_TRUST_TABLE => {
                    let sels = attrs(ip)
                        .filter(|(tt, tp)| *tt == DCB_ATTR_DCB_APP_TRUST && !tp.is_empty())
                        .map(|(_, tp)| tp[0])
                        .collect();
                    dcb.trust = Some(sels);
                }
                _ => {}
            }
        }
    }
    if !ieee_seen {
        return Err(bad("no DCB_ATTR_IEEE attribute"));
    }
    Ok(dcb)
}

const EOPNOTSUPP: i32 = 95;
const ENODEV: i32 = 19;

fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_ne_bytes([b[off], b[off + 1]])
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// The netlink attributes of `b` as (type without flags, payload); stops at the first
/// malformed one.
fn attrs(b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut off = 0;
    std::iter::from_fn(move || {
        if off + 4 > b.len() {
            return None;
        }
        let len = u16_at(b, off) as usize;
        if len < 4 || off + len > b.len() {
            return None;
        }
        let item = (u16_at(b, off + 2) & NLA_TYPE_MASK, &b[off + 4..off + len]);
        off += align4(len);
        Some(item)
    })
}

/// Test and fixture support: the bytes the kernel sends for `dcb` (what [`parse_reply`]
/// reads), so that fixtures are built from the documented layout.
pub fn encode_reply(dcb: &Dcb) -> Vec<u8> {
    fn attr(t: u16, payload: &[u8]) -> Vec<u8> {
        let mut a = Vec::new();
        a.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
        a.extend_from_slice(&t.to_ne_bytes());
        a.extend_from_slice(payload);
        a.resize(align4(a.len()), 0);
        a
    }
    // struct ieee_pfc: pfc_cap, pfc_en, mbc, (pad), delay u16, requests[8] u64, indications[8] u64.
    let mut pfc = vec![dcb.pfc_cap, dcb.pfc_en, 0, 0, 0, 0];
    pfc.resize(6 + 2 + 128, 0);
    let mut ieee = attr(DCB_ATTR_IEEE_PFC, &pfc);
    let mut table = Vec::new();
    for a in &dcb.apps {
        let mut p = vec![a.selector, a.priority];
        p.extend_from_slice(&a.protocol.to_ne_bytes());
        table.extend(attr(DCB_ATTR_IEEE_APP, &p));
    }
    ieee.extend(attr(DCB_ATTR_IEEE_APP_TABLE | 0x8000, &table));
    if let Some(t) = &dcb.trust {
        let body: Vec<u8> = t
            .iter()
            .flat_map(|s| attr(DCB_ATTR_DCB_APP_TRUST, &[*s]))
            .collect();
        ieee.extend(attr(DCB_ATTR_DCB_APP_TRUST_TABLE | 0x8000, &body));
    }
    let mut body = attr(DCB_ATTR_IFNAME, b"eth2\0");
    body.extend(attr(DCB_ATTR_IEEE | 0x8000, &ieee));
    let total = 20 + body.len();
    let mut m = Vec::new();
    m.extend_from_slice(&(total as u32).to_ne_bytes());
    m.extend_from_slice(&RTM_GETDCB.to_ne_bytes());
    m.extend_from_slice(&0u16.to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&[0, DCB_CMD_IEEE_GET, 0, 0]);
    m.extend(body);
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Dcb {
        Dcb {
            pfc_cap: 8,
            pfc_en: 1 << 3,
            apps: vec![
                DcbApp {
                    selector: APP_SEL_DSCP,
                    priority: 3,
                    protocol: 26,
                },
                DcbApp {
                    selector: APP_SEL_DSCP,
                    priority: 6,
                    protocol: 48,
                },
            ],
            trust: Some(vec![APP_SEL_DSCP, APP_SEL_PCP]),
        }
    }

    #[test]
    fn a_reply_in_the_kernels_layout_parses() {
        let d = parse_reply("eth2", &encode_reply(&sample())).unwrap();
        assert_eq!(d, sample());
        assert!(d.pfc_on(3) && !d.pfc_on(0));
        assert_eq!(d.pfc_priorities(), vec![3]);
        assert_eq!(d.dscp_priority(26), Some(3));
        assert_eq!(d.dscp_priority(10), None);
        assert_eq!(
            d.pfc_text(),
            "0:off 1:off 2:off 3:on 4:off 5:off 6:off 7:off"
        );
    }

    #[test]
    fn the_request_names_the_netdev() {
        let r = request("eth2", 7);
        assert_eq!(
            r.len(),
            32,
            "header, dcbmsg, a 9-byte attribute padded to 12"
        );
        assert_eq!(u32_at(&r, 0), 32);
        assert_eq!(u16_at(&r, 4), RTM_GETDCB);
        assert_eq!(r[17], DCB_CMD_IEEE_GET);
        assert_eq!(&r[24..28], b"eth2");
    }

    #[test]
    fn errors_are_named() {
        let mut e = vec![0u8; 36];
        e[0..4].copy_from_slice(&36u32.to_ne_bytes());
        e[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        e[16..20].copy_from_slice(&(-EOPNOTSUPP).to_ne_bytes());
        assert!(matches!(
            parse_reply("eth0", &e),
            Err(DcbError::NotSupported { .. })
        ));
        e[16..20].copy_from_slice(&(-ENODEV).to_ne_bytes());
        assert!(matches!(
            parse_reply("eth0", &e),
            Err(DcbError::NoDevice { .. })
        ));
        for junk in [&[][..], &[1, 2, 3][..], &encode_reply(&sample())[..30]] {
            assert!(parse_reply("eth0", junk).is_err());
        }
    }

    /// The live kernel, through a real netlink socket: loopback has no DCB operations.
    #[test]
    fn loopback_has_no_dcb_on_this_kernel() {
        match query_live("lo") {
            Err(DcbError::NotSupported { netdev }) => assert_eq!(netdev, "lo"),
            // A sandbox without netlink sockets says why instead.
            Err(DcbError::Failed { message, .. }) => {
                assert!(
                    message.contains("socket") || message.contains("recv"),
                    "{message}"
                )
            }
            other => panic!("lo answered {other:?}"),
        }
        assert!(matches!(
            query_live("gdx-no-such-if"),
            Err(DcbError::NoDevice { .. } | DcbError::Failed { .. })
        ));
    }

    #[test]
    fn a_capture_is_read_and_a_missing_one_is_named() {
        let t = tempfile::tempdir().unwrap();
        let fs = RootFs::new(t.path());
        let (r, _) = read(&fs, "eth2");
        assert!(matches!(r, Err(DcbError::NotCaptured { .. })), "{r:?}");
        std::fs::create_dir_all(t.path().join("gdx/dcb")).unwrap();
        std::fs::write(
            t.path().join("gdx/dcb/eth2.json"),
            serde_json::to_string(&Captured::State(sample())).unwrap(),
        )
        .unwrap();
        std::fs::write(t.path().join("gdx/dcb/eth0.json"), "\"not_supported\"").unwrap();
        assert_eq!(read(&fs, "eth2").0.unwrap(), sample());
        assert!(matches!(
            read(&fs, "eth0").0,
            Err(DcbError::NotSupported { .. })
        ));
    }
}
