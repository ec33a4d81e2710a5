//! libcuda, the CUDA driver API: loading, driver version, device enumeration.
//!
//! [`Cuda::load`] opens libcuda under the names cudarc's loader would try, in its order
//! (`cudarc::get_lib_name_candidates("cuda")`, so both pick the same file), then in the
//! driver's usual directories; resolves every symbol of this module's own function-pointer
//! table (`api::Api`) without panicking; and calls `cuInit(0)`. Any failure is an [`Unavailable`] naming what was tried. The driver calls
//! themselves return [`CudaError`].
//!
//! Layout: `api` (the function-pointer table), `error`, `device` (per-GPU queries),
//! `context` ([`Context`], a retained primary context), `memory` ([`DeviceBuffer`],
//! [`PinnedHostBuffer`], [`RegisteredHost`], [`DmaBuf`]), `stream` ([`Stream`], [`Hold`]),
//! `event` ([`Event`] and the buffers' last-use markers), `copy` (the [`Stream`] copy methods),
//! `endpoint` (copies between any two ends: [`Src`], [`Dst`]), `share` (pool memory, IPC
//! handles, caller pointers: [`MemPool`], [`IpcHandle`]), `vmm` (virtual-memory-management
//! allocations shareable as a file descriptor: [`DeviceBuffer::new_shareable`],
//! [`DeviceBuffer::export_fd`], [`DeviceBuffer::import_fd`]), `mapped` ([`MappedHostBuffer`],
//! host memory the GPU addresses), `module` ([`Module`], [`Kernel`], [`Stream::launch`]: PTX
//! loaded at run time), `memop` (stream memory operations: [`Stream::write_value64`],
//! [`Stream::wait_value64`], [`Signal`]), [`mailbox`] ([`Mailbox`], the persistent-kernel
//! path) and `pingpong` ([`PingPong`]: the kernel under the mailbox's floor, which gdx-bench
//! times). Device memory
//! comes from `cuMemAlloc_v2`, not the stream-ordered pool (`cuMemAllocAsync`): pool memory
//! needs `cuMemPoolSetAccess` for peer access, and without it peer copies fall back to a slow
//! path silently (37.7 vs 395.5 GB/s on the H200 test machine).
//!
//! Every handle is owned by one type whose `Drop` releases it; children hold their
//! [`Context`]. Drops never panic: a failed release is logged and returned once by the next
//! checked call on that context ([`CudaError::Earlier`]). No method here needs `unsafe` from
//! the caller:
//!
//! ```no_run
//! use gdx_sys::cuda::{Context, Cuda, DeviceBuffer, PinnedHostBuffer, Stream};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cuda = Cuda::load()?;
//! let ctx = Context::new(&cuda.device(0)?)?;
//! let stream = Stream::new(&ctx)?;
//! let mut host = PinnedHostBuffer::new(&ctx, 4096)?;
//! host.as_mut_slice()?.fill(7);
//! let mut dev = DeviceBuffer::new(&ctx, 4096)?;
//! stream.copy_to_device(&mut dev, &host)?;
//! stream.copy_to_host(&mut host, &dev)?;
//! assert!(host.as_slice()?.iter().all(|&b| b == 7)); // waits for the copy
//! # Ok(()) }
//! ```

mod api;
mod batch;
mod context;
mod copy;
mod device;
mod endpoint;
mod error;
mod event;
mod filemap;
mod heartbeat;
pub mod mailbox;
mod mapped;
mod mapping;
mod memop;
mod memory;
mod module;
mod pingpong;
mod share;
mod stream;
mod vmm;

pub use batch::{BatchCopy, CopySpan};
pub use context::{Context, CurrentGuard};
pub use device::{Attribute, ComputeCapability, Device, DeviceInfo};
pub use endpoint::{Dst, Src};
pub use error::CudaError;
pub use event::Event;
pub use filemap::RegisteredFile;
pub use heartbeat::Heartbeat;
pub use mailbox::{Mailbox, MailboxConfig};
pub use mapped::MappedHostBuffer;
pub use memop::{Signal, StreamMemOps, WaitCondition, Word};
pub use memory::{
    DeviceBuffer, DmaBuf, HostBuffer, MemoryType, PinnedHostBuffer, PointerInfo, RegisteredHost,
};
pub use module::{Kernel, KernelArgs, LaunchDims, Module, GDX_KERNELS_PTX};
pub use pingpong::{FloorStep, PingPong};
pub use share::{IpcHandle, MemPool, PoolAccess, Sharing, VmmPiece};
pub use stream::{Hold, Stream, HOLD_LIMIT};

use crate::loader::{self, Opened};
use crate::Unavailable;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::fmt;
use std::sync::{Arc, OnceLock};

/// Canonical soname of the CUDA driver library.
pub const SONAME: &str = "libcuda.so.1";

/// The file names [`Cuda::load`] tries, in order: cudarc's candidates for `cuda`, then
/// `libcuda.so.1` in the driver's usual directories.
pub fn default_candidates() -> Vec<String> {
    let names = cudarc::get_lib_name_candidates("cuda");
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    loader::candidates(&names, SONAME, &loader::driver_dirs())
}

/// A loaded and initialised CUDA driver. Cheap to clone; all clones share one library.
#[derive(Clone)]
pub struct Cuda {
    inner: Arc<Inner>,
}

struct Inner {
    api: api::Api,
    path: String,
    /// Keeps the library open (it is never closed).
    _lib: Opened,
}

impl fmt::Debug for Cuda {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cuda")
            .field("path", &self.inner.path)
            .finish()
    }
}

/// A CUDA driver API version, as `cuDriverGetVersion` reports it (`1000 * major + 10 * minor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CudaVersion(pub i32);

impl CudaVersion {
    /// Major version, e.g. 13.
    pub fn major(self) -> i32 {
        self.0 / 1000
    }
    /// Minor version, e.g. 0.
    pub fn minor(self) -> i32 {
        (self.0 % 1000) / 10
    }
}

impl fmt::Display for CudaVersion {
    /// `13.0`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major(), self.minor())
    }
}

impl Cuda {
    /// The process-wide driver handle: loaded from [`default_candidates`] on the first call;
    /// later calls return the same handle or the same [`Unavailable`].
    pub fn load() -> Result<Cuda, Unavailable> {
        static CUDA: OnceLock<Result<Cuda, Unavailable>> = OnceLock::new();
        CUDA.get_or_init(|| Cuda::load_from(&default_candidates()))
            .clone()
    }

    /// Whether [`Cuda::load`] succeeds.
    pub fn is_available() -> bool {
        Cuda::load().is_ok()
    }

    /// Load from an explicit candidate list (sonames searched on the loader path, or paths),
    /// bypassing the cache: the first file the loader opens must have every required symbol,
    /// and `cuInit(0)` must succeed.
    pub fn load_from<S: AsRef<str>>(candidates: &[S]) -> Result<Cuda, Unavailable> {
        let opened = loader::open_first(SONAME, candidates)?;
        // SAFETY: `opened` is the library found under libcuda's names, and the table's
        // prototypes copy cuda.h (with enums widened to plain integers).
        let api = unsafe { api::Api::resolve(&opened) }
            .map_err(|m| m.into_unavailable(SONAME, &opened))?;
        let path = opened.file(api.cuInit as *const c_void);
        // SAFETY: `cuInit` takes flags by value; 0 is the only defined value.
        let status = unsafe { (api.cuInit)(0) };
        let cuda = Cuda {
            inner: Arc::new(Inner {
                api,
                path,
                _lib: opened,
            }),
        };
        if status != api::SUCCESS {
            let (name, description) = cuda.status_text(status);
            return Err(Unavailable::new(
                SONAME,
                format!(
                    "{}: cuInit(0) failed: {name} ({status}): {description}",
                    cuda.inner.path
                ),
            ));
        }
        log::debug!("CUDA driver loaded from {}", cuda.inner.path);
        Ok(cuda)
    }

    /// The file the driver library was loaded from, e.g. `/usr/lib/x86_64-linux-gnu/libcuda.so.1`.
    pub fn path(&self) -> &str {
        &self.inner.path
    }

    pub(crate) fn api(&self) -> &api::Api {
        &self.inner.api
    }

    /// The CUDA version the driver supports (`cuDriverGetVersion`), e.g. 13.0.
    pub fn driver_version(&self) -> Result<CudaVersion, CudaError> {
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid out-pointer for one int.
        let status = unsafe { (self.api().cuDriverGetVersion)(&mut v) };
        self.check(status, "cuDriverGetVersion", None)?;
        Ok(CudaVersion(v))
    }

    /// How many CUDA devices the driver exposes (`cuDeviceGetCount`).
    pub fn device_count(&self) -> Result<u32, CudaError> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer for one int.
        let status = unsafe { (self.api().cuDeviceGetCount)(&mut n) };
        self.check(status, "cuDeviceGetCount", None)?;
        Ok(u32::try_from(n).unwrap_or(0))
    }

    /// The device with CUDA ordinal `ordinal` (`cuDeviceGet`).
    pub fn device(&self, ordinal: u32) -> Result<Device, CudaError> {
        let count = self.device_count()?;
        let Ok(raw_ordinal) = c_int::try_from(ordinal) else {
            return Err(CudaError::NoSuchDevice { ordinal, count });
        };
        if ordinal >= count {
            return Err(CudaError::NoSuchDevice { ordinal, count });
        }
        let mut raw: api::CuDevice = 0;
        // SAFETY: `raw` is a valid out-pointer; the ordinal is in range.
        let status = unsafe { (self.api().cuDeviceGet)(&mut raw, raw_ordinal) };
        self.check(status, "cuDeviceGet", Some(ordinal))?;
        Ok(Device::new(self.clone(), ordinal, raw))
    }

    /// Every device, in CUDA ordinal order.
    pub fn devices(&self) -> Result<Vec<Device>, CudaError> {
        (0..self.device_count()?).map(|i| self.device(i)).collect()
    }

    /// The retained primary context of GPU `ordinal` ([`Context::new`]).
    pub fn context(&self, ordinal: u32) -> Result<Context, CudaError> {
        Context::new(&self.device(ordinal)?)
    }

    /// Whether GPU `a` can map GPU `b`'s memory (`cuDeviceCanAccessPeer`).
    pub fn can_access_peer(&self, a: u32, b: u32) -> Result<bool, CudaError> {
        let da = self.device(a)?;
        let db = self.device(b)?;
        let mut can: c_int = 0;
        // SAFETY: `can` is a valid out-pointer; both handles came from `cuDeviceGet`.
        let status = unsafe { (self.api().cuDeviceCanAccessPeer)(&mut can, da.raw(), db.raw()) };
        self.check(status, "cuDeviceCanAccessPeer", Some(a))?;
        Ok(can != 0)
    }

    /// Whether the loaded library exports `symbol` (for doctor checks of optional features).
    pub fn has_symbol(&self, symbol: &str) -> bool {
        // SAFETY: the symbol is only looked up, never called, so its type does not matter.
        unsafe { loader::symbol::<*const c_void>(self.inner._lib.lib(), symbol) }.is_ok()
    }

    /// `Ok` for `CUDA_SUCCESS`, else the [`CudaError`] for `call` on `device`.
    pub(crate) fn check(
        &self,
        status: api::CuResult,
        call: impl Into<String>,
        device: Option<u32>,
    ) -> Result<(), CudaError> {
        if status == api::SUCCESS {
            return Ok(());
        }
        let call = call.into();
        if status == api::NOT_SUPPORTED {
            return Err(CudaError::Unsupported { call, device });
        }
        let (name, description) = self.status_text(status);
        Err(CudaError::Call {
            call,
            code: status,
            name,
            description,
            device,
        })
    }

    /// `cuGetErrorName` and `cuGetErrorString` for `status`; a placeholder for a status the
    /// driver does not name.
    fn status_text(&self, status: api::CuResult) -> (String, String) {
        let text = |f: unsafe extern "C" fn(api::CuResult, *mut *const c_char) -> api::CuResult| {
            let mut p: *const c_char = std::ptr::null();
            // SAFETY: `p` is a valid out-pointer; both functions accept any status value and
            // report an unknown one with a non-success return.
            let rc = unsafe { f(status, &mut p) };
            if rc != api::SUCCESS || p.is_null() {
                return None;
            }
            // SAFETY: on success `p` points to a static NUL-terminated string in libcuda.
            Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        };
        (
            text(self.api().cuGetErrorName).unwrap_or_else(|| format!("CUresult {status}")),
            text(self.api().cuGetErrorString).unwrap_or_else(|| "unknown error".to_string()),
        )
    }
}

#[cfg(test)]
mod tests;
