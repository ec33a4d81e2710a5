//! [`ConnData`]: what one side of an RC connection tells the other through the engine's
//! handshake: device and port, LID / GID, MTU, READ resources, its queue pairs' numbers and
//! first PSNs, and optionally the regions (address, length, rkey) it opens to the peer.
//!
//! Two encodings: serde (JSON for logs and `gdx serve`), and a compact, versioned binary form
//! ([`ConnData::encode`] / [`ConnData::decode`]) for the engine's frames. The decoder is
//! length-checked at every step, bounds every count before allocating, rejects trailing bytes
//! and never panics, whatever it is given (property-tested).
//!
//! Binary layout, little-endian:
//!
//! ```text
//! "GXRD" version:u8 link:u8 port:u8 gid_index:u8 lid:u16 mtu_bytes:u16 max_rd_atomic:u8
//! name_len:u8 name[name_len] gid[16]
//! n_qps:u16 { qpn:u32 psn:u32 }*n_qps
//! n_regions:u16 { id:u64 addr:u64 len:u64 rkey:u32 }*n_regions
//! ```

use crate::gid::LinkKind;
use serde::{Deserialize, Serialize};
use std::net::Ipv6Addr;

/// First four bytes of an encoded [`ConnData`].
pub const MAGIC: [u8; 4] = *b"GXRD";
/// The encoding version this build writes and reads.
pub const VERSION: u8 = 1;
/// Most queue pairs per connection.
pub const MAX_QPS: usize = 64;
/// Most advertised regions per connection.
pub const MAX_REGIONS: usize = 1024;
/// Longest device name.
pub const MAX_NAME: usize = 64;
/// Queue pair numbers and PSNs are 24-bit.
pub const MAX_24BIT: u32 = 0x00ff_ffff;

/// One queue pair of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct QpInfo {
    /// Queue pair number (24 bits).
    pub qpn: u32,
    /// First packet sequence number this side sends (24 bits).
    pub psn: u32,
}

/// A memory region one side opens to the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RemoteRegion {
    /// The owner's id for it (the engine's region id).
    pub id: u64,
    /// First address in the region's address space (what work requests target).
    pub addr: u64,
    /// Length in bytes (at least 1).
    pub len: u64,
    /// The key to present.
    pub rkey: u32,
}

impl RemoteRegion {
    /// The remote address of byte `offset`, when `offset..offset + len` fits inside.
    pub fn address_of(&self, offset: u64, len: u64) -> Option<u64> {
        let end = offset.checked_add(len)?;
        (end <= self.len).then(|| self.addr.checked_add(offset))?
    }
}

/// One side's connection data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnData {
    /// RDMA device name (for messages), e.g. `mlx5_0`.
    pub device: String,
    /// Port number (from 1).
    pub port: u8,
    /// Link layer: InfiniBand routes by LID, Ethernet (RoCE) by GID.
    pub link: LinkKind,
    /// Base LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// The GID the peer sends to.
    pub gid: Ipv6Addr,
    /// This side's GID index (informational: each side uses its own as source).
    pub gid_index: u8,
    /// Active MTU in bytes (256..=4096, a power of two); the path uses the smaller side's.
    pub mtu_bytes: u32,
    /// RDMA READs this side serves at once per queue pair.
    pub max_rd_atomic: u8,
    /// The queue pairs, paired by position with the peer's.
    pub qps: Vec<QpInfo>,
    /// Regions opened to the peer (may be empty: the engine can send them later).
    pub regions: Vec<RemoteRegion>,
}

/// Why bytes are not a valid [`ConnData`] (or a value cannot be encoded).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConnDataError {
    /// The input ended early.
    #[error(
        "RDMA connection data is truncated: {need} more byte(s) needed for {what} at offset {at}"
    )]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Where.
        at: usize,
        /// How many bytes were missing.
        need: usize,
    },
    /// Not connection data at all.
    #[error("not RDMA connection data (magic {0:02x?}, expected \"GXRD\")")]
    BadMagic([u8; 4]),
    /// Written by a newer or older gdx.
    #[error("RDMA connection data version {0} is not supported (this build speaks {VERSION})")]
    UnsupportedVersion(u8),
    /// A count over its limit.
    #[error("RDMA connection data lists {count} {what}; at most {max} are allowed")]
    TooMany {
        /// `queue pairs`, `regions`, `name bytes`.
        what: &'static str,
        /// The count found.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A field with a value no peer can send.
    #[error("RDMA connection data has an invalid {field}: {value}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// Why, with the value.
        value: String,
    },
    /// Bytes after the end.
    #[error("RDMA connection data has {0} unexpected trailing byte(s)")]
    Trailing(usize),
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], ConnDataError> {
        let rest = self.b.len() - self.at;
        if n > rest {
            return Err(ConnDataError::Truncated {
                what,
                at: self.at,
                need: n - rest,
            });
        }
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }
    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], ConnDataError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }
    fn u8(&mut self, what: &'static str) -> Result<u8, ConnDataError> {
        Ok(self.array::<1>(what)?[0])
    }
    fn u16(&mut self, what: &'static str) -> Result<u16, ConnDataError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, ConnDataError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, ConnDataError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
}

fn invalid(field: &'static str, value: impl Into<String>) -> ConnDataError {
    ConnDataError::Invalid {
        field,
        value: value.into(),
    }
}

/// `TooMany` when `count` of `what` exceed `max`.
fn at_most(what: &'static str, count: usize, max: usize) -> Result<(), ConnDataError> {
    if count > max {
        return Err(ConnDataError::TooMany { what, count, max });
    }
    Ok(())
}

impl ConnData {
    /// Check every field against what a peer can legitimately send: a port, a valid MTU,
    /// 1..=[`MAX_QPS`] queue pairs with 24-bit numbers, at most [`MAX_REGIONS`] non-empty
    /// regions that do not wrap the address space, a name of at most [`MAX_NAME`] bytes.
    pub fn validate(&self) -> Result<(), ConnDataError> {
        at_most("device name bytes", self.device.len(), MAX_NAME)?;
        if self.port == 0 {
            return Err(invalid("port", "0 (ports count from 1)"));
        }
        if !matches!(self.mtu_bytes, 256 | 512 | 1024 | 2048 | 4096) {
            return Err(invalid(
                "MTU",
                format!(
                    "{} bytes (expected 256, 512, 1024, 2048 or 4096)",
                    self.mtu_bytes
                ),
            ));
        }
        if self.qps.is_empty() {
            return Err(invalid("queue pair list", "empty"));
        }
        at_most("queue pairs", self.qps.len(), MAX_QPS)?;
        for q in &self.qps {
            if q.qpn > MAX_24BIT || q.qpn == 0 {
                return Err(invalid("queue pair number", format!("{:#x}", q.qpn)));
            }
            if q.psn > MAX_24BIT {
                return Err(invalid("PSN", format!("{:#x}", q.psn)));
            }
        }
        at_most("regions", self.regions.len(), MAX_REGIONS)?;
        for r in &self.regions {
            if r.len == 0 || r.addr.checked_add(r.len).is_none() {
                return Err(invalid(
                    "region",
                    format!("id {} at {:#x} with length {}", r.id, r.addr, r.len),
                ));
            }
        }
        Ok(())
    }

    /// The binary form (see the module docs), after [`ConnData::validate`].
    pub fn encode(&self) -> Result<Vec<u8>, ConnDataError> {
        self.validate()?;
        let mut b = Vec::with_capacity(48 + self.qps.len() * 8 + self.regions.len() * 28);
        b.extend_from_slice(&MAGIC);
        b.push(VERSION);
        b.push(match self.link {
            LinkKind::InfiniBand => 0,
            LinkKind::Ethernet => 1,
        });
        b.push(self.port);
        b.push(self.gid_index);
        b.extend_from_slice(&self.lid.to_le_bytes());
        // Validated: at most 4096.
        b.extend_from_slice(&(self.mtu_bytes as u16).to_le_bytes());
        b.push(self.max_rd_atomic);
        b.push(self.device.len() as u8);
        b.extend_from_slice(self.device.as_bytes());
        b.extend_from_slice(&self.gid.octets());
        b.extend_from_slice(&(self.qps.len() as u16).to_le_bytes());
        for q in &self.qps {
            b.extend_from_slice(&q.qpn.to_le_bytes());
            b.extend_from_slice(&q.psn.to_le_bytes());
        }
        b.extend_from_slice(&(self.regions.len() as u16).to_le_bytes());
        for r in &self.regions {
            b.extend_from_slice(&r.id.to_le_bytes());
            b.extend_from_slice(&r.addr.to_le_bytes());
            b.extend_from_slice(&r.len.to_le_bytes());
            b.extend_from_slice(&r.rkey.to_le_bytes());
        }
        Ok(b)
    }

    /// Parse and validate the binary form. Never panics; never allocates more than the
    /// input's length justifies.
    pub fn decode(bytes: &[u8]) -> Result<ConnData, ConnDataError> {
        let mut r = Reader { b: bytes, at: 0 };
        let magic = r.array::<4>("magic")?;
        if magic != MAGIC {
            return Err(ConnDataError::BadMagic(magic));
        }
        let version = r.u8("version")?;
        if version != VERSION {
            return Err(ConnDataError::UnsupportedVersion(version));
        }
        let link = match r.u8("link layer")? {
            0 => LinkKind::InfiniBand,
            1 => LinkKind::Ethernet,
            n => return Err(invalid("link layer", n.to_string())),
        };
        let port = r.u8("port")?;
        let gid_index = r.u8("GID index")?;
        let lid = r.u16("LID")?;
        let mtu_bytes = u32::from(r.u16("MTU")?);
        let max_rd_atomic = r.u8("READ resources")?;
        let name_len = usize::from(r.u8("name length")?);
        at_most("device name bytes", name_len, MAX_NAME)?;
        let device = std::str::from_utf8(r.take(name_len, "device name")?)
            .map_err(|_| invalid("device name", "not UTF-8"))?
            .to_string();
        let gid = Ipv6Addr::from(r.array::<16>("GID")?);
        let n_qps = usize::from(r.u16("queue pair count")?);
        at_most("queue pairs", n_qps, MAX_QPS)?;
        let mut qps = Vec::with_capacity(n_qps);
        for _ in 0..n_qps {
            qps.push(QpInfo {
                qpn: r.u32("queue pair number")?,
                psn: r.u32("PSN")?,
            });
        }
        let n_regions = usize::from(r.u16("region count")?);
        at_most("regions", n_regions, MAX_REGIONS)?;
        // Each region is 28 bytes: refuse a count the input cannot hold before allocating.
        let rest = bytes.len() - r.at;
        if n_regions * 28 > rest {
            return Err(ConnDataError::Truncated {
                what: "regions",
                at: r.at,
                need: n_regions * 28 - rest,
            });
        }
        let mut regions = Vec::with_capacity(n_regions);
        for _ in 0..n_regions {
            regions.push(RemoteRegion {
                id: r.u64("region id")?,
                addr: r.u64("region address")?,
                len: r.u64("region length")?,
                rkey: r.u32("rkey")?,
            });
        }
        if r.at != bytes.len() {
            return Err(ConnDataError::Trailing(bytes.len() - r.at));
        }
        let c = ConnData {
            device,
            port,
            link,
            lid,
            gid,
            gid_index,
            mtu_bytes,
            max_rd_atomic,
            qps,
            regions,
        };
        c.validate()?;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> ConnData {
        ConnData {
            device: "mlx5_0".into(),
            port: 1,
            link: LinkKind::Ethernet,
            lid: 0,
            gid: "::ffff:10.0.0.1".parse().unwrap(),
            gid_index: 3,
            mtu_bytes: 4096,
            max_rd_atomic: 16,
            qps: vec![
                QpInfo {
                    qpn: 0x123,
                    psn: 0xabcdef,
                },
                QpInfo { qpn: 0x124, psn: 7 },
            ],
            regions: vec![RemoteRegion {
                id: 9,
                addr: 0x7f00_0000_0000,
                len: 1 << 20,
                rkey: 0x1234,
            }],
        }
    }

    #[test]
    fn binary_and_json_round_trip() {
        let c = sample();
        let b = c.encode().unwrap();
        assert_eq!(&b[..4], b"GXRD");
        assert_eq!(ConnData::decode(&b).unwrap(), c);
        let j = serde_json::to_string(&c).unwrap();
        assert!(j.contains("\"gid\":\"::ffff:10.0.0.1\""), "{j}");
        assert_eq!(serde_json::from_str::<ConnData>(&j).unwrap(), c);
    }

    #[test]
    fn every_truncation_is_an_error() {
        let b = sample().encode().unwrap();
        for n in 0..b.len() {
            assert!(
                ConnData::decode(&b[..n]).is_err(),
                "accepted {n} of {} bytes",
                b.len()
            );
        }
        let mut long = b.clone();
        long.push(0);
        assert_eq!(ConnData::decode(&long), Err(ConnDataError::Trailing(1)));
    }

    #[test]
    fn wrong_magic_version_and_values_are_named() {
        let mut b = sample().encode().unwrap();
        b[4] = 2;
        assert_eq!(
            ConnData::decode(&b),
            Err(ConnDataError::UnsupportedVersion(2))
        );
        assert!(matches!(
            ConnData::decode(b"GXTCP-----"),
            Err(ConnDataError::BadMagic(_))
        ));
        let mut c = sample();
        c.mtu_bytes = 1500;
        assert!(c.encode().unwrap_err().to_string().contains("MTU"));
        let mut c = sample();
        c.qps[0].qpn = 1 << 24;
        assert!(c.encode().is_err());
        let mut c = sample();
        c.qps.clear();
        assert!(c.encode().is_err());
        let mut c = sample();
        c.regions[0].addr = u64::MAX;
        assert!(c.encode().is_err());
    }

    #[test]
    fn a_huge_region_count_is_refused_before_allocating() {
        let mut c = sample();
        c.regions.clear();
        let mut b = c.encode().unwrap();
        let n = b.len();
        b[n - 2..].copy_from_slice(&1000u16.to_le_bytes());
        assert!(matches!(
            ConnData::decode(&b),
            Err(ConnDataError::Truncated {
                what: "regions",
                ..
            })
        ));
    }

    #[test]
    fn remote_region_bounds() {
        let r = sample().regions[0];
        assert_eq!(r.address_of(0, 1 << 20), Some(0x7f00_0000_0000));
        assert_eq!(r.address_of(16, 16), Some(0x7f00_0000_0010));
        assert_eq!(r.address_of(1, 1 << 20), None);
        assert_eq!(r.address_of(u64::MAX, 2), None);
    }
}
