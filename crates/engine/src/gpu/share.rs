//! Sharing GPU memory with other processes of the host: the legacy CUDA IPC handle
//! (`cuIpcGetMemHandle`, for `cuMemAlloc` memory) and the POSIX file descriptor of a VMM
//! allocation (`cuMemCreate` with `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`), which travels
//! over a unix socket (`SCM_RIGHTS`) rather than inside a descriptor.
//!
//! Invariant: an exported region is mapped once per importing process (keyed by exporter pid
//! and region id) while a mapping of it is alive; the mapping goes when the last clone drops.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Weak};

use std::sync::atomic::Ordering;

use gdx_sys::cuda::{DeviceBuffer, Sharing};

use super::region::{self, DeviceOrigin, DeviceRegion, IpcDesc};
use super::{to_usize, LocalPeer};
use crate::error::{Error, Result};
use crate::routing::path::Path;

/// Mappings of other processes' GPU memory ([`LocalPeer::ipc_stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct IpcStats {
    /// Allocations opened since the peer was created (one per allocation while mapped).
    pub opened: u64,
    /// Mappings alive now.
    pub live: u64,
}

impl LocalPeer {
    /// Allocate `len` bytes on GPU `gpu` as a VMM allocation that can be shared as a POSIX file
    /// descriptor ([`LocalPeer::export_fd`]); every GPU that supports peer access to `gpu` is
    /// granted read/write access (`cuMemSetAccess`), so p2p copies take the direct link.
    pub fn alloc_device_shareable(&self, gpu: u32, len: u64) -> Result<DeviceRegion> {
        let g = self.gpu(gpu)?;
        let mut access = Vec::new();
        for o in (0..self.shared.count).filter(|&o| o != gpu) {
            if self.shared.cuda.can_access_peer(o, gpu)? {
                access.push(self.gpu(o)?.ctx.clone());
            }
        }
        let buf = DeviceBuffer::new_shareable(&g.ctx, to_usize(len)?, &access)?;
        Ok(self.device_region(gpu, len, DeviceOrigin::Shareable, BTreeMap::new(), buf))
    }

    /// Describe `region` for another process on this host. For memory from
    /// [`LocalPeer::alloc_device`] the descriptor carries the legacy IPC handle; for memory from
    /// [`LocalPeer::alloc_device_shareable`] it says that the importer needs the POSIX fd
    /// ([`LocalPeer::export_fd`], passed over a unix socket, as the agents' shm connection does).
    pub fn export_ipc(&self, region: &DeviceRegion) -> Result<IpcDesc> {
        let (handle, posix_fd_alloc_len) = match region.inner.origin {
            DeviceOrigin::Allocated => {
                let h = region.inner.lock().ipc_handle()?;
                (region::handle_to_hex(&h), None)
            }
            DeviceOrigin::Shareable => {
                let alloc = region.inner.lock().alloc_len() as u64;
                (String::new(), Some(alloc))
            }
            DeviceOrigin::Foreign | DeviceOrigin::Pool => return self.export_foreign(region),
            ref other => {
                return Err(Error::InvalidArgument(format!(
                    "region {} ({other:?}) cannot be exported: it is itself mapped from \
                     another process",
                    region.id()
                )))
            }
        };
        Ok(IpcDesc {
            handle,
            alloc_len: region.len(),
            posix_fd_alloc_len,
            ..self.ipc_desc(region)?
        })
    }

    /// The descriptor of `region` of this process, with no handle yet (offset 0, one piece).
    fn ipc_desc(&self, region: &DeviceRegion) -> Result<IpcDesc> {
        Ok(IpcDesc {
            host_id: format!("{:032x}", crate::config::boot_host_id()),
            pid: std::process::id(),
            region: region.id(),
            pci_bus_id: self.shared.cuda.device(region.gpu())?.pci_bus_id()?,
            len: region.len(),
            handle: String::new(),
            offset: 0,
            alloc_len: 0,
            pieces: Vec::new(),
            posix_fd_alloc_len: None,
        })
    }

    /// Describe a caller's device memory (a torch, CuPy or JAX tensor, a view into a larger
    /// pool) for another process: the legacy IPC handle of the allocation that holds it, and
    /// the region's offset in it, so views into one allocation share one handle.
    ///
    /// # Errors
    /// [`Error::Unavailable`] saying why the memory cannot be shared (pool memory, a VMM
    /// mapping and the handle types it allows).
    fn export_foreign(&self, region: &DeviceRegion) -> Result<IpcDesc> {
        let ptr = region.device_ptr();
        let ctx = self.context(region.gpu())?;
        match self
            .shared
            .cuda
            .sharing(&ctx, ptr, to_usize(region.len())?)?
        {
            Sharing::Legacy {
                handle,
                start,
                size,
            } => Ok(IpcDesc {
                handle: region::handle_to_hex(&handle),
                offset: ptr - start,
                alloc_len: size as u64,
                ..self.ipc_desc(region)?
            }),
            Sharing::Vmm { start, pieces } => {
                let total: u64 = pieces.iter().map(|&p| p as u64).sum();
                Ok(IpcDesc {
                    offset: ptr - start,
                    alloc_len: total,
                    pieces: pieces.iter().map(|&p| p as u64).collect(),
                    posix_fd_alloc_len: Some(total),
                    ..self.ipc_desc(region)?
                })
            }
            Sharing::Unshareable(why) => Err(Error::unavailable(Path::Ipc, why)),
            other => Err(Error::unavailable(
                Path::Ipc,
                format!("the driver describes the memory as {other:?}, which gdx cannot export"),
            )),
        }
    }

    /// How many allocations of other processes this process has opened, and how many of
    /// those mappings are alive now.
    pub fn ipc_stats(&self) -> IpcStats {
        let imports = self
            .shared
            .imports
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        IpcStats {
            opened: self.shared.ipc_opened.load(Ordering::Relaxed),
            live: imports.values().filter(|w| w.strong_count() > 0).count() as u64,
        }
    }

    /// The POSIX file descriptor of a VMM region ([`LocalPeer::alloc_device_shareable`]), for
    /// [`LocalPeer::import_fd`] in another process of this host.
    pub fn export_fd(&self, region: &DeviceRegion) -> Result<OwnedFd> {
        Ok(region.inner.lock().export_fd()?)
    }

    /// The POSIX fd of piece `piece` of `region`: for a caller's VMM memory
    /// ([`IpcDesc::pieces`]) the allocation mapped at that piece, looked up again now (the
    /// registered memory stays mapped while the region lives); for memory gdx allocated
    /// shareable, piece 0 is [`LocalPeer::export_fd`].
    pub(crate) fn export_fd_piece(&self, region: &DeviceRegion, piece: u32) -> Result<OwnedFd> {
        match region.inner.origin {
            DeviceOrigin::Shareable if piece == 0 => self.export_fd(region),
            DeviceOrigin::Foreign | DeviceOrigin::Pool => {
                let ctx = self.context(region.gpu())?;
                let pieces = self.shared.cuda.vmm_pieces(
                    &ctx,
                    region.device_ptr(),
                    to_usize(region.len())?,
                )?;
                let p = pieces.get(piece as usize).ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "region {} has {} VMM pieces, not {}",
                        region.id(),
                        pieces.len(),
                        piece + 1
                    ))
                })?;
                Ok(p.export_fd()?)
            }
            ref other => Err(Error::InvalidArgument(format!(
                "region {} ({other:?}) has no piece {piece} to export",
                region.id()
            ))),
        }
    }

    /// Map the pieces of a caller's VMM range another process exported ([`IpcDesc::pieces`]),
    /// one fd each (in order), each piece once per exporting region; returns each piece's
    /// offset in the range and its mapping.
    pub(crate) fn import_fd_pieces(
        &self,
        desc: &IpcDesc,
        mut fd: impl FnMut(u32) -> Result<OwnedFd>,
    ) -> Result<Vec<(u64, DeviceRegion)>> {
        let total: u64 = desc.pieces.iter().sum();
        if desc
            .offset
            .checked_add(desc.len)
            .is_none_or(|end| end > total)
        {
            return Err(Error::InvalidArgument(format!(
                "region {} of process {}: {} bytes at offset {} do not fit in its {} pieces of \
                 {total} bytes",
                desc.region,
                desc.pid,
                desc.len,
                desc.offset,
                desc.pieces.len()
            )));
        }
        let mut out = Vec::with_capacity(desc.pieces.len());
        let mut at = 0u64;
        for (i, &size) in desc.pieces.iter().enumerate() {
            let piece = IpcDesc {
                region: desc.region,
                len: size,
                offset: 0,
                alloc_len: size,
                pieces: Vec::new(),
                posix_fd_alloc_len: Some(size),
                handle: String::new(),
                ..desc.clone()
            };
            let key = (desc.pid, format!("region:{}:{i}", desc.region));
            let r = match self.imported_key(&key) {
                Some(r) => r,
                None => {
                    let f = fd(i as u32)?;
                    self.import_keyed(&piece, key, |ctx| {
                        Ok(DeviceBuffer::import_fd(
                            ctx,
                            f.as_fd(),
                            to_usize(size)?,
                            to_usize(size)?,
                        )?)
                    })?
                }
            };
            out.push((at, r));
            at += size;
        }
        Ok(out)
    }

    /// Map a region another process exported with the legacy handle ([`LocalPeer::export_ipc`]):
    /// once per exported region (later imports return the same mapping while one is alive);
    /// unmapped when the last clone is dropped. Copies with it plan as `ipc`, GPU to GPU with
    /// no host copy.
    pub fn import_ipc(&self, desc: &IpcDesc) -> Result<DeviceRegion> {
        if desc.posix_fd_alloc_len.is_some() {
            return Err(Error::InvalidArgument(format!(
                "region {} of process {} is shared as a POSIX fd: import it with import_fd",
                desc.region, desc.pid
            )));
        }
        self.import_with(desc, |ctx| {
            let handle = region::handle_from_hex(&desc.handle)?;
            Ok(DeviceBuffer::open_ipc(
                ctx,
                &handle,
                to_usize(desc.mapped_len())?,
            )?)
        })
    }

    /// Map a VMM region another process exported as a POSIX fd ([`LocalPeer::export_fd`]),
    /// described by its [`IpcDesc`]; cached like [`LocalPeer::import_ipc`]. The fd may be
    /// closed afterwards.
    pub fn import_fd(&self, desc: &IpcDesc, fd: BorrowedFd<'_>) -> Result<DeviceRegion> {
        let Some(alloc) = desc.posix_fd_alloc_len else {
            return Err(Error::InvalidArgument(format!(
                "region {} of process {} has a legacy IPC handle: import it with import_ipc",
                desc.region, desc.pid
            )));
        };
        self.import_with(desc, |ctx| {
            Ok(DeviceBuffer::import_fd(
                ctx,
                fd,
                to_usize(desc.len)?,
                to_usize(alloc)?,
            )?)
        })
    }

    /// Whether a mapping of `desc` is alive in this process (the shm transport then needs no fd).
    pub(crate) fn imported(&self, desc: &IpcDesc) -> Option<DeviceRegion> {
        self.imported_key(&desc.import_key())
    }

    fn imported_key(&self, key: &(u32, String)) -> Option<DeviceRegion> {
        let imports = self
            .shared
            .imports
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        imports
            .get(key)
            .and_then(Weak::upgrade)
            .map(|inner| DeviceRegion { inner })
    }

    fn import_with(
        &self,
        desc: &IpcDesc,
        open: impl FnOnce(&gdx_sys::cuda::Context) -> Result<DeviceBuffer>,
    ) -> Result<DeviceRegion> {
        self.import_keyed(desc, desc.import_key(), open)
    }

    fn import_keyed(
        &self,
        desc: &IpcDesc,
        key: (u32, String),
        open: impl FnOnce(&gdx_sys::cuda::Context) -> Result<DeviceBuffer>,
    ) -> Result<DeviceRegion> {
        let here = format!("{:032x}", crate::config::boot_host_id());
        if desc.host_id != here {
            return Err(Error::unavailable(
                Path::Ipc,
                format!(
                    "ipc needs one host: the region is on host {} and this is {here}",
                    desc.host_id
                ),
            ));
        }
        if desc
            .offset
            .checked_add(desc.len)
            .is_none_or(|end| end > desc.mapped_len())
        {
            return Err(Error::InvalidArgument(format!(
                "region {} of process {}: {} bytes at offset {} do not fit in its allocation of \
                 {} bytes",
                desc.region,
                desc.pid,
                desc.len,
                desc.offset,
                desc.mapped_len()
            )));
        }
        let mut imports = self
            .shared
            .imports
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(inner) = imports.get(&key).and_then(Weak::upgrade) {
            return Ok(DeviceRegion { inner });
        }
        let gpu = (0..self.shared.count)
            .find(|&o| {
                self.shared
                    .cuda
                    .device(o)
                    .and_then(|d| d.pci_bus_id())
                    .is_ok_and(|b| b.eq_ignore_ascii_case(&desc.pci_bus_id))
            })
            .ok_or_else(|| {
                Error::unavailable(
                    Path::Ipc,
                    format!("GPU {} is not visible to this process", desc.pci_bus_id),
                )
            })?;
        let g = self.gpu(gpu)?;
        let buf = open(&g.ctx)?;
        self.shared.ipc_opened.fetch_add(1, Ordering::Relaxed);
        // The mapping covers the whole allocation; a region's own bytes start at `desc.offset`.
        let r = self.device_region(
            gpu,
            desc.mapped_len(),
            DeviceOrigin::Imported {
                pid: desc.pid,
                region: desc.region,
            },
            BTreeMap::new(),
            buf,
        );
        imports.retain(|_, w| w.strong_count() > 0);
        imports.insert(key, Arc::downgrade(&r.inner));
        Ok(r)
    }
}
