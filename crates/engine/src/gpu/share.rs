//! Sharing GPU memory with other processes of the host: the legacy CUDA IPC handle
//! (`cuIpcGetMemHandle`, for `cuMemAlloc` memory) and the POSIX file descriptor of a VMM
//! allocation (`cuMemCreate` with `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`), which travels
//! over a unix socket (`SCM_RIGHTS`) rather than inside a descriptor.
//!
//! Invariant: an exported region is mapped once per importing process (keyed by exporter pid
//! and region id) while a mapping of it is alive; the mapping goes when the last clone drops.

use std::collections::BTreeMap;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::{Arc, Weak};

use std::sync::atomic::Ordering;

use gdx_sys::cuda::{DeviceBuffer, Sharing};

use super::region::{self, DeviceOrigin, DeviceRegion, IpcDesc};
use super::{to_usize, LocalPeer};
use crate::error::{Error, Result};

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
            host_id: format!("{:032x}", crate::config::boot_host_id()),
            pid: std::process::id(),
            region: region.id(),
            pci_bus_id: self.shared.cuda.device(region.gpu())?.pci_bus_id()?,
            len: region.len(),
            handle,
            offset: 0,
            alloc_len: region.len(),
            posix_fd_alloc_len,
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
        match self.shared.cuda.sharing(&ctx, ptr)? {
            Sharing::Legacy {
                handle,
                start,
                size,
            } => Ok(IpcDesc {
                host_id: format!("{:032x}", crate::config::boot_host_id()),
                pid: std::process::id(),
                region: region.id(),
                pci_bus_id: self.shared.cuda.device(region.gpu())?.pci_bus_id()?,
                len: region.len(),
                handle: region::handle_to_hex(&handle),
                offset: ptr - start,
                alloc_len: size as u64,
                posix_fd_alloc_len: None,
            }),
            Sharing::Unshareable(why) => Err(Error::Unavailable(why)),
            other => Err(Error::Unavailable(format!(
                "the driver describes the memory as {other:?}, which gdx cannot export"
            ))),
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
        let imports = self
            .shared
            .imports
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        imports
            .get(&desc.import_key())
            .and_then(Weak::upgrade)
            .map(|inner| DeviceRegion { inner })
    }

    fn import_with(
        &self,
        desc: &IpcDesc,
        open: impl FnOnce(&gdx_sys::cuda::Context) -> Result<DeviceBuffer>,
    ) -> Result<DeviceRegion> {
        let here = format!("{:032x}", crate::config::boot_host_id());
        if desc.host_id != here {
            return Err(Error::Unavailable(format!(
                "ipc needs one host: the region is on host {} and this is {here}",
                desc.host_id
            )));
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
        let key = desc.import_key();
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
                Error::Unavailable(format!(
                    "GPU {} is not visible to this process",
                    desc.pci_bus_id
                ))
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
