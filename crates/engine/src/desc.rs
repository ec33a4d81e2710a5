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
    pub ipc: Option<IpcDesc>,
    /// For GPU memory without an IPC handle: why none could be made (pool memory, a VMM
    /// mapping without a shareable handle type), for the peer's plan to say.
    #[serde(default)]
    pub no_ipc: Option<String>,
}

/// What another process on the same host needs to map a [`DeviceRegion`](crate::DeviceRegion)
/// ([`LocalPeer::import_ipc`](super::LocalPeer::import_ipc)): serialisable, carries the CUDA
/// IPC handle, never a pointer the importer trusts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpcDesc {
    /// Boot id of the exporting host: an import on another kernel is refused.
    pub host_id: String,
    /// Exporting process.
    pub pid: u32,
    /// Region id in the exporting process (the importer's cache key with `pid`).
    pub region: u64,
    /// PCI bus id of the GPU holding the memory (ordinals differ between processes).
    pub pci_bus_id: String,
    /// Length in bytes.
    pub len: u64,
    /// The `cuIpcGetMemHandle` handle, hex; empty for a region shared as a POSIX fd. It names
    /// the whole allocation holding the region (`alloc_len` bytes), so views into one tensor
    /// pool share one handle and the importer maps it once.
    pub handle: String,
    /// Bytes from the start of the shared allocation to the region (a view into a larger
    /// tensor or pool); 0 for memory gdx allocated.
    #[serde(default)]
    pub offset: u64,
    /// Bytes of the allocation the handle maps (0: the region's own `len`).
    #[serde(default)]
    pub alloc_len: u64,
    /// For a VMM range mapped piece by piece (torch's `expandable_segments`, XLA): each
    /// piece's size, in address order, adding up to `alloc_len`; the importer asks for each
    /// piece's fd and maps them one by one. Empty for one allocation.
    #[serde(default)]
    pub pieces: Vec<u64>,
    /// For a VMM region shared as a POSIX fd ([`LocalPeer::export_fd`](super::LocalPeer::export_fd)):
    /// the size of the allocation to map (a multiple of the granularity). The fd itself travels
    /// over a unix socket, never inside the descriptor.
    #[serde(default)]
    pub posix_fd_alloc_len: Option<u64>,
}

impl IpcDesc {
    /// Bytes the importer maps: the whole allocation.
    pub(crate) fn mapped_len(&self) -> u64 {
        if self.alloc_len == 0 {
            self.len
        } else {
            self.alloc_len
        }
    }

    /// What the importer caches a mapping under: one per exported allocation of a process
    /// (the legacy handle names the allocation; an fd export names its region).
    pub(crate) fn import_key(&self) -> (u32, String) {
        if self.handle.is_empty() {
            (self.pid, format!("region:{}", self.region))
        } else {
            (self.pid, self.handle.clone())
        }
    }

    /// The handle type, for plans: `legacy CUDA IPC handle` or `POSIX fd (VMM)`.
    pub(crate) fn handle_kind(&self) -> &'static str {
        if !self.pieces.is_empty() {
            "POSIX fds of the VMM allocations mapped there (cuMemRetainAllocationHandle, \
             cuMemExportToShareableHandle)"
        } else if self.posix_fd_alloc_len.is_some() {
            "POSIX fd of a VMM allocation (cuMemExportToShareableHandle)"
        } else {
            "legacy CUDA IPC handle (cuIpcGetMemHandle)"
        }
    }
}
