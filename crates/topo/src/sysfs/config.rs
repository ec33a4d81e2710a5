//! PCI configuration space parsing: the standard capability list (PCI Express capability,
//! Device Control register) and the extended capability list (ACS).
//!
//! Input is whatever `/sys/bus/pci/devices/<bdf>/config` returned: 64 bytes for an
//! unprivileged reader, 256 for conventional PCI, 4096 for PCIe read as root. Every walk is
//! bounded (no loops on corrupt pointers) and every read is range-checked, so odd bytes give
//! an error value, never a panic. The topology's port types and the doctor's ACS and
//! Device Control checks both walk the capability lists here.

use std::fmt;

/// Standard capability id of the PCI Express capability.
pub const CAP_ID_PCIE: u8 = 0x10;
/// Extended capability id of Access Control Services.
pub const EXT_CAP_ID_ACS: u16 = 0x000d;
/// First extended capability offset.
pub const EXT_CAP_START: usize = 0x100;

/// Why a register could not be read from the config bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CfgError {
    /// The file holds fewer bytes than the register needs (typically: not root).
    TooShort {
        /// Bytes available.
        len: usize,
        /// Bytes needed.
        need: usize,
    },
    /// The capability is not in the list.
    NoCapability(&'static str),
    /// The header says the device has no capability list, or it is corrupt.
    Malformed(String),
}

impl fmt::Display for CfgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CfgError::TooShort { len, need } if *need > EXT_CAP_START => write!(
                f,
                "extended config space needs root (config file has {len} bytes, need {need})"
            ),
            CfgError::TooShort { len, need } => write!(
                f,
                "config space beyond {len} bytes needs root (need {need} bytes)"
            ),
            CfgError::NoCapability(what) => write!(f, "device has no {what} capability"),
            CfgError::Malformed(why) => write!(f, "malformed config space: {why}"),
        }
    }
}

impl std::error::Error for CfgError {}

/// A view on config space bytes.
#[derive(Debug, Clone, Copy)]
pub struct Config<'a> {
    bytes: &'a [u8],
}

impl<'a> Config<'a> {
    /// Wrap the bytes of a `config` file.
    pub fn new(bytes: &'a [u8]) -> Self {
        Config { bytes }
    }

    /// Number of bytes available.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// True when no bytes were read.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    fn need(&self, end: usize) -> Result<(), CfgError> {
        if self.bytes.len() < end {
            Err(CfgError::TooShort {
                len: self.bytes.len(),
                need: end,
            })
        } else {
            Ok(())
        }
    }

    /// Little-endian 16-bit register.
    pub fn u16_at(&self, off: usize) -> Result<u16, CfgError> {
        self.need(off + 2)?;
        Ok(u16::from_le_bytes([self.bytes[off], self.bytes[off + 1]]))
    }

    /// Little-endian 32-bit register.
    pub fn u32_at(&self, off: usize) -> Result<u32, CfgError> {
        self.need(off + 4)?;
        Ok(u32::from_le_bytes([
            self.bytes[off],
            self.bytes[off + 1],
            self.bytes[off + 2],
            self.bytes[off + 3],
        ]))
    }

    /// Offset of a standard capability (walks from the pointer at 0x34).
    pub fn find_cap(&self, id: u8, what: &'static str) -> Result<usize, CfgError> {
        self.need(0x40)?;
        let status = self.u16_at(0x06)?;
        if status & 0x10 == 0 {
            return Err(CfgError::NoCapability(what));
        }
        let mut ptr = usize::from(self.bytes[0x34] & 0xfc);
        // 48 is the most capabilities that fit in 192 bytes; more means a pointer loop.
        for _ in 0..48 {
            if ptr == 0 {
                return Err(CfgError::NoCapability(what));
            }
            // A pointer into the 64-byte header is corruption, not the end of the list.
            if ptr < 0x40 {
                return Err(CfgError::Malformed(format!(
                    "capability pointer {ptr:#04x} points into the header"
                )));
            }
            self.need(ptr + 2)?;
            if self.bytes[ptr] == id {
                return Ok(ptr);
            }
            ptr = usize::from(self.bytes[ptr + 1] & 0xfc);
        }
        Err(CfgError::Malformed("capability list loops".into()))
    }

    /// Offset of an extended capability (walks from 0x100).
    pub fn find_ext_cap(&self, id: u16, what: &'static str) -> Result<usize, CfgError> {
        self.need(EXT_CAP_START + 4)?;
        let mut off = EXT_CAP_START;
        // (4096 - 256) / 4 headers at most; more means a loop.
        for _ in 0..960 {
            let hdr = self.u32_at(off)?;
            if hdr == 0 || hdr == 0xffff_ffff {
                return Err(CfgError::NoCapability(what));
            }
            if (hdr & 0xffff) as u16 == id {
                return Ok(off);
            }
            let next = (hdr >> 20) as usize & 0xffc;
            if next < EXT_CAP_START {
                return Err(CfgError::NoCapability(what));
            }
            off = next;
        }
        Err(CfgError::Malformed("extended capability list loops".into()))
    }

    /// The PCI Express Device Control register.
    pub fn dev_ctl(&self) -> Result<DevCtl, CfgError> {
        let cap = self.find_cap(CAP_ID_PCIE, "PCI Express")?;
        Ok(DevCtl(self.u16_at(cap + 8)?))
    }

    /// The ACS Control register, `Ok(None)` when the device has no ACS capability
    /// (then it cannot redirect anything).
    pub fn acs_ctl(&self) -> Result<Option<AcsCtl>, CfgError> {
        match self.find_ext_cap(EXT_CAP_ID_ACS, "ACS") {
            Ok(cap) => Ok(Some(AcsCtl(self.u16_at(cap + 6)?))),
            Err(CfgError::NoCapability(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// PCIe Device Control register (PCIe cap + 0x08).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevCtl(pub u16);

impl DevCtl {
    /// Max Read Request Size in bytes: 128 << bits 14:12.
    pub fn max_read_request(self) -> u32 {
        128u32 << ((self.0 >> 12) & 0x7).min(5)
    }

    /// Max Payload Size in bytes: 128 << bits 7:5.
    pub fn max_payload(self) -> u32 {
        128u32 << ((self.0 >> 5) & 0x7).min(5)
    }

    /// Enable Relaxed Ordering (bit 4).
    pub fn relaxed_ordering(self) -> bool {
        self.0 & 0x10 != 0
    }
}

/// ACS Control register (ACS cap + 0x06).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcsCtl(pub u16);

impl AcsCtl {
    /// Source Validation (bit 0).
    pub const SOURCE_VALID: u16 = 1 << 0;
    /// Translation Blocking (bit 1).
    pub const TRANSLATION_BLOCK: u16 = 1 << 1;
    /// P2P Request Redirect (bit 2): peer requests are sent up to the root complex.
    pub const REQ_REDIRECT: u16 = 1 << 2;
    /// P2P Completion Redirect (bit 3).
    pub const CMPLT_REDIRECT: u16 = 1 << 3;
    /// Upstream Forwarding (bit 4).
    pub const UPSTREAM_FWD: u16 = 1 << 4;
    /// P2P Egress Control (bit 5): peer requests to some ports are blocked or redirected.
    pub const EGRESS_CTRL: u16 = 1 << 5;
    /// Direct Translated P2P (bit 6): ATS-translated requests may go direct (good in VMs).
    pub const DIRECT_TRANS: u16 = 1 << 6;

    /// The bits that send GPU↔NIC / GPU↔GPU traffic through the root complex (or block it).
    pub const REDIRECTING: u16 = Self::REQ_REDIRECT | Self::CMPLT_REDIRECT | Self::EGRESS_CTRL;

    /// True when any redirecting bit is set.
    pub fn redirects(self) -> bool {
        self.0 & Self::REDIRECTING != 0
    }

    /// `lspci`-style rendering: `SrcValid+ TransBlk- ReqRedir+ ...`.
    pub fn describe(self) -> String {
        let names = [
            (Self::SOURCE_VALID, "SrcValid"),
            (Self::TRANSLATION_BLOCK, "TransBlk"),
            (Self::REQ_REDIRECT, "ReqRedir"),
            (Self::CMPLT_REDIRECT, "CmpltRedir"),
            (Self::UPSTREAM_FWD, "UpstreamFwd"),
            (Self::EGRESS_CTRL, "EgressCtrl"),
            (Self::DIRECT_TRANS, "DirectTrans"),
        ];
        names
            .iter()
            .map(|(bit, n)| format!("{n}{}", if self.0 & bit != 0 { '+' } else { '-' }))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Builds config space bytes for tests and fixtures: a type-1/0 header with the PCIe
/// capability at 0x40 and, optionally, ACS as the first extended capability.
#[derive(Debug, Clone, Default)]
pub struct ConfigBuilder {
    dev_ctl: Option<u16>,
    acs_ctl: Option<u16>,
    len: Option<usize>,
}

impl ConfigBuilder {
    /// Start empty (4096 bytes, no capabilities).
    pub fn new() -> Self {
        Self::default()
    }

    /// Add a PCIe capability with this Device Control value.
    pub fn dev_ctl(mut self, v: u16) -> Self {
        self.dev_ctl = Some(v);
        self
    }

    /// Add an ACS extended capability with this control value.
    pub fn acs_ctl(mut self, v: u16) -> Self {
        self.acs_ctl = Some(v);
        self
    }

    /// Truncate to `len` bytes, as an unprivileged read would.
    pub fn truncate(mut self, len: usize) -> Self {
        self.len = Some(len);
        self
    }

    /// The bytes.
    pub fn build(&self) -> Vec<u8> {
        let mut b = vec![0u8; 4096];
        b[0] = 0xde;
        b[1] = 0x10;
        if let Some(v) = self.dev_ctl {
            b[0x06] |= 0x10; // capabilities list present
            b[0x34] = 0x40;
            b[0x40] = CAP_ID_PCIE;
            b[0x41] = 0x00; // end of list
            b[0x42] = 0x02; // PCIe cap version 2
            b[0x48..0x4a].copy_from_slice(&v.to_le_bytes());
        }
        if let Some(v) = self.acs_ctl {
            let hdr: u32 = u32::from(EXT_CAP_ID_ACS) | (1 << 16);
            b[0x100..0x104].copy_from_slice(&hdr.to_le_bytes());
            b[0x104..0x106].copy_from_slice(&0x007fu16.to_le_bytes()); // capabilities: all
            b[0x106..0x108].copy_from_slice(&v.to_le_bytes());
        }
        b.truncate(self.len.unwrap_or(4096));
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devctl_fields() {
        // 0x5010: MRRS bits 101 = 4096, RO on.
        let c = ConfigBuilder::new().dev_ctl(0x5010 | (1 << 5)).build();
        let d = Config::new(&c).dev_ctl().unwrap();
        assert_eq!(d.max_read_request(), 4096);
        assert_eq!(d.max_payload(), 256);
        assert!(d.relaxed_ordering());
        let c = ConfigBuilder::new().dev_ctl(0x2000).build();
        let d = Config::new(&c).dev_ctl().unwrap();
        assert_eq!(d.max_read_request(), 512);
        assert!(!d.relaxed_ordering());
    }

    #[test]
    fn acs_found_after_another_ext_cap() {
        let mut c = ConfigBuilder::new().build();
        // AER (id 1) at 0x100 pointing to ACS at 0x148.
        let aer: u32 = 0x0001 | (1 << 16) | (0x148 << 20);
        c[0x100..0x104].copy_from_slice(&aer.to_le_bytes());
        let acs: u32 = 0x000d | (1 << 16);
        c[0x148..0x14c].copy_from_slice(&acs.to_le_bytes());
        c[0x14e..0x150].copy_from_slice(&0x001du16.to_le_bytes());
        let a = Config::new(&c).acs_ctl().unwrap().unwrap();
        assert!(a.redirects());
        assert_eq!(
            a.describe(),
            "SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-"
        );
    }

    #[test]
    fn short_or_corrupt_config_is_an_error_not_a_panic() {
        let c = ConfigBuilder::new().acs_ctl(0x1d).truncate(64).build();
        let e = Config::new(&c).acs_ctl().unwrap_err();
        assert!(
            e.to_string().contains("extended config space needs root"),
            "{e}"
        );
        assert!(Config::new(&[]).dev_ctl().is_err());
        assert!(Config::new(&[0xff; 7]).acs_ctl().is_err());
        // A capability pointing at itself.
        let mut c = vec![0u8; 256];
        c[0x06] = 0x10;
        c[0x34] = 0x40;
        c[0x40] = 0x05;
        c[0x41] = 0x40;
        assert!(matches!(
            Config::new(&c).dev_ctl(),
            Err(CfgError::Malformed(_))
        ));
        // An extended capability pointing at itself.
        let mut c = vec![0u8; 4096];
        let hdr: u32 = 0x0001 | (0x100 << 20);
        c[0x100..0x104].copy_from_slice(&hdr.to_le_bytes());
        assert!(matches!(
            Config::new(&c).acs_ctl(),
            Err(CfgError::Malformed(_))
        ));
        // No ACS at all is not an error: nothing can redirect.
        let c = ConfigBuilder::new().dev_ctl(0).build();
        assert_eq!(Config::new(&c).acs_ctl().unwrap(), None);
    }
}
