//! What a batch names: peers, local registrations, the remote regions peers describe, and
//! operations between them.

use std::sync::Arc;

use crate::error::{FabricError, Result};
use crate::provider::ProviderInfo;
use gdx_sys::fabric::{self as sys, Memory};

/// A peer in this endpoint's address vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub(crate) u64);

/// What a peer needs to target a registration: base address in the provider's addressing
/// (the virtual address under FI_MR_VIRT_ADDR, else 0), length and key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteRegion {
    /// Address of byte 0.
    pub addr: u64,
    /// Registered length.
    pub len: u64,
    /// Remote key.
    pub key: u64,
}

impl RemoteRegion {
    /// 24 bytes, little-endian: addr, len, key.
    pub fn encode(&self) -> [u8; 24] {
        let mut b = [0u8; 24];
        b[..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..].copy_from_slice(&self.key.to_le_bytes());
        b
    }

    /// The inverse of [`encode`](Self::encode); `None` for a wrong length.
    pub fn decode(b: &[u8]) -> Option<RemoteRegion> {
        if b.len() != 24 {
            return None;
        }
        let u = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        Some(RemoteRegion {
            addr: u(0),
            len: u(8),
            key: u(16),
        })
    }
}

/// A registration; dropping the last clone closes it (`fi_close`).
#[derive(Clone)]
pub struct MemoryRegion {
    pub(crate) mr: Arc<sys::Mr>,
    pub(crate) virt_addr: bool,
}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MemoryRegion({} bytes, key {:#x})",
            self.mr.len(),
            self.mr.key()
        )
    }
}

impl MemoryRegion {
    /// The registered memory.
    pub fn memory(&self) -> &Memory {
        self.mr.memory()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.mr.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.mr.is_empty()
    }

    /// What a peer needs to target it.
    pub fn remote(&self) -> RemoteRegion {
        RemoteRegion {
            addr: if self.virt_addr {
                self.mr.base() as u64
            } else {
                0
            },
            len: self.mr.len() as u64,
            key: self.mr.key(),
        }
    }
}

/// Direction of one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RmaKind {
    /// Local → remote (`fi_write`).
    Write,
    /// Remote → local (`fi_read`).
    Read,
}

/// One operation of a batch.
#[derive(Debug, Clone)]
pub struct RmaOp<'a> {
    /// Direction.
    pub kind: RmaKind,
    /// Local registration.
    pub local: &'a MemoryRegion,
    /// Offset in it.
    pub local_offset: u64,
    /// Target peer.
    pub peer: PeerAddr,
    /// Remote registration.
    pub remote: RemoteRegion,
    /// Offset in it.
    pub remote_offset: u64,
    /// Bytes.
    pub len: u64,
}

/// GPU memory only where the provider entry has FI_HMEM.
pub(crate) fn check_hmem(info: &ProviderInfo, mem: &Memory) -> Result<()> {
    match mem.cuda_device() {
        Some(device) if !info.hmem => Err(FabricError::NoHmem {
            provider: info.provider.clone(),
            device,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_region_round_trips_and_rejects_wrong_lengths() {
        let r = RemoteRegion {
            addr: 0x7f00_1234_5678,
            len: 1 << 30,
            key: u64::MAX - 3,
        };
        assert_eq!(RemoteRegion::decode(&r.encode()), Some(r));
        assert_eq!(RemoteRegion::decode(&r.encode()[..23]), None);
        assert_eq!(RemoteRegion::decode(&[0u8; 25]), None);
    }

    fn info(hmem: bool) -> ProviderInfo {
        ProviderInfo {
            provider: "tcp;ofi_rxm".into(),
            fabric: "127.0.0.1/32".into(),
            domain: "lo".into(),
            hmem,
            mr_mode: vec![],
            mr_key_size: 8,
            manual_progress: false,
            max_msg_size: 1 << 20,
            tx_size: 64,
            src_addr: "127.0.0.1:0".into(),
        }
    }

    #[test]
    fn gpu_memory_registers_only_where_the_provider_has_fi_hmem() {
        // SAFETY: never dereferenced or registered: only the FI_HMEM check sees it.
        let gpu = unsafe { Memory::from_cuda(0x7f00_0000_0000, 4096, 2) };
        match check_hmem(&info(false), &gpu) {
            Err(e @ FabricError::NoHmem { .. }) => {
                let t = e.to_string();
                assert!(t.contains("tcp;ofi_rxm") && t.contains("GPU2"), "{t}");
                assert!(t.contains("FI_HMEM"), "{t}");
            }
            other => panic!("GPU memory on a provider without FI_HMEM: {other:?}"),
        }
        assert!(check_hmem(&info(true), &gpu).is_ok());
        assert!(check_hmem(&info(false), &Memory::alloc(64)).is_ok());
    }
}
