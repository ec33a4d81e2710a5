//! What a peer sees of a region: [`RegionDesc`] with its [`Location`], [`Access`] rights and
//! [`RegionKey`]. Serialisable (serde JSON, and a `gdx1:<hex>` token); never a raw pointer.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Where a region's bytes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Location {
    /// Pageable host memory.
    Host,
    /// Page-locked host memory (registered with the GPU driver); not yet implemented.
    PinnedHost,
    /// Memory of GPU `n` (the exporting process's CUDA ordinal): a region registered with
    /// [`crate::Agent::register_gpu`].
    Gpu(u32),
    /// A file, or a byte range of one ([`crate::file::FileRange`]): the source or destination
    /// of file copies ([`crate::file`], [`crate::LocalPeer::copy_file_to`]); agents do not
    /// register or publish file regions.
    File,
}

impl Location {
    pub(crate) fn to_wire(self) -> (u8, u32) {
        match self {
            Location::Host => (0, 0),
            Location::PinnedHost => (1, 0),
            Location::Gpu(n) => (2, n),
            Location::File => (3, 0),
        }
    }

    pub(crate) fn from_wire(tag: u8, n: u32) -> Result<Self> {
        Ok(match tag {
            0 => Location::Host,
            1 => Location::PinnedHost,
            2 => Location::Gpu(n),
            3 => Location::File,
            t => return Err(Error::Malformed(format!("unknown location tag {t}"))),
        })
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Host => f.write_str("host"),
            Location::PinnedHost => f.write_str("pinned-host"),
            Location::Gpu(n) => write!(f, "gpu{n}"),
            Location::File => f.write_str("file"),
        }
    }
}

/// What remote peers may do with a region. Local access is always allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Access {
    /// Peers may read from the region (they post `read` ops against it).
    pub remote_read: bool,
    /// Peers may write into the region (they post `write` ops against it).
    pub remote_write: bool,
}

impl Access {
    /// No remote access (a purely local source/destination).
    pub const LOCAL: Access = Access {
        remote_read: false,
        remote_write: false,
    };
    /// Peers may read only.
    pub const READ: Access = Access {
        remote_read: true,
        remote_write: false,
    };
    /// Peers may write only.
    pub const WRITE: Access = Access {
        remote_read: false,
        remote_write: true,
    };
    /// Peers may read and write.
    pub const READ_WRITE: Access = Access {
        remote_read: true,
        remote_write: true,
    };

    pub(crate) fn bits(self) -> u8 {
        u8::from(self.remote_read) | (u8::from(self.remote_write) << 1)
    }

    pub(crate) fn from_bits(b: u8) -> Self {
        Access {
            remote_read: b & 1 != 0,
            remote_write: b & 2 != 0,
        }
    }
}

/// The unguessable 128-bit key a peer must present to touch a region. Printed as 32 hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RegionKey(pub u128);

impl RegionKey {
    /// Compares in time independent of where the keys differ.
    pub fn ct_eq(&self, other: &RegionKey) -> bool {
        let x = self.0 ^ other.0;
        let folded = (x as u64) | ((x >> 64) as u64);
        std::hint::black_box(folded) == 0
    }
}

impl fmt::Debug for RegionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print a key in full by accident in logs.
        write!(f, "RegionKey({:08x}…)", (self.0 >> 96) as u32)
    }
}

impl Serialize for RegionKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{:032x}", self.0))
    }
}

impl<'de> Deserialize<'de> for RegionKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        u128::from_str_radix(&s, 16)
            .map(RegionKey)
            .map_err(serde::de::Error::custom)
    }
}

/// The serialisable description a peer needs to target a region: never a raw pointer.
///
/// `Display` / `FromStr` give a compact token (`gdx1:<hex>`) to paste between processes or hosts;
/// serde gives JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionDesc {
    /// Id of the region inside its agent.
    pub id: u64,
    /// The key a peer must present.
    pub key: RegionKey,
    /// Length in bytes.
    pub len: u64,
    /// Where the bytes live.
    pub location: Location,
    /// What peers may do with it.
    pub access: Access,
    /// True when the agent allocated the memory itself (memfd-backed), so a same-host peer can map it
    /// and copy once; false for borrowed buffers, which shm reaches through a bounce buffer.
    pub shareable: bool,
    /// The name it is published under, if any.
    pub name: Option<String>,
    /// For GPU memory gdx allocated: the CUDA IPC handle a same-host peer maps to copy GPU to
    /// GPU with no host copy (the `ipc` path). `None` for host memory and for GPU memory that
    /// legacy IPC cannot export (a caller's pointer, pool memory).
    pub ipc: Option<crate::gpu::IpcDesc>,
    /// For GPU memory without an IPC handle: why none could be made (pool memory, a VMM
    /// mapping without a shareable handle type), for the peer's plan to say.
    #[serde(default)]
    pub no_ipc: Option<String>,
}

impl fmt::Display for RegionDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buf = Vec::new();
        crate::wire::put_desc(&mut buf, self);
        f.write_str("gdx1:")?;
        for b in buf {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for RegionDesc {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let hex = s
            .trim()
            .strip_prefix("gdx1:")
            .ok_or_else(|| Error::InvalidArgument("region token must start with gdx1:".into()))?;
        if hex.len() % 2 != 0 || hex.len() > 2 * 4096 {
            return Err(Error::InvalidArgument("bad region token length".into()));
        }
        let bytes = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
            .collect::<std::result::Result<Vec<u8>, _>>()
            .map_err(|e| Error::InvalidArgument(format!("bad region token: {e}")))?;
        let mut r = crate::wire::Reader::new(&bytes);
        let d = crate::wire::get_desc(&mut r)?;
        r.finish()?;
        Ok(d)
    }
}
