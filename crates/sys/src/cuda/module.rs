//! Device code loaded at run time: [`Module`] (`cuModuleLoadData` of PTX text, unloaded when
//! dropped), [`Kernel`] (`cuModuleGetFunction`), [`KernelArgs`] and [`Stream::launch`]
//! (`cuLaunchKernel`), [`Stream::is_idle`] (`cuStreamQuery`).
//!
//! gdx's own kernels ([`GDX_KERNELS_PTX`], from `crates/sys/kernels/gdx_kernels.cu`) are PTX
//! text compiled ahead of time (`scripts/gen-ptx.sh`) for `compute_75`: the driver JIT-compiles
//! it for the GPU it runs on, so neither nvcc nor NVRTC is needed where gdx runs.
//!
//! ```no_run
//! use gdx_sys::cuda::{Context, Cuda, KernelArgs, LaunchDims, MappedHostBuffer, Module, Stream};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ctx = Cuda::load()?.context(0)?;
//! let module = Module::gdx_kernels(&ctx)?;
//! let mark = module.kernel("gdx_mark")?;
//! let stream = Stream::new(&ctx)?;
//! let word = MappedHostBuffer::new(&ctx, 8)?;
//! let mut args = KernelArgs::new();
//! args.push_u64(word.device_ptr()).push_u64(42);
//! // SAFETY: gdx_mark(u64* marker, u64 value) writes one word at `marker`, which is live
//! // mapped memory until the stream is synchronised below.
//! unsafe { stream.launch(&mark, LaunchDims::single_block(32), &mut args)? };
//! stream.synchronize()?;
//! assert_eq!(word.word(0).map(|w| w.load(std::sync::atomic::Ordering::Acquire)), Some(42));
//! # Ok(()) }
//! ```

use super::api::{self, CuFunction, CuModule};
use super::{Context, CudaError, Stream};
use std::ffi::{c_void, CString};
use std::fmt;
use std::sync::Arc;

/// The PTX of gdx's kernels (`gdx_mailbox`, `gdx_spin_then_mark`, `gdx_mark`).
pub const GDX_KERNELS_PTX: &str = include_str!("../../kernels/gdx_kernels.ptx");

/// A loaded module of one context; unloaded (`cuModuleUnload`) when the last [`Module`] clone
/// and the last [`Kernel`] taken from it are dropped.
#[derive(Clone)]
pub struct Module {
    inner: Arc<ModuleInner>,
}

struct ModuleInner {
    ctx: Context,
    raw: CuModule,
    /// Loaded from [`GDX_KERNELS_PTX`], so its kernels' behaviour is known.
    gdx: bool,
}

// SAFETY: a CUmodule may be used from any thread; it is only read after loading.
unsafe impl Send for ModuleInner {}
// SAFETY: as above.
unsafe impl Sync for ModuleInner {}

impl fmt::Debug for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Module")
            .field("gpu", &self.inner.ctx.ordinal())
            .field("raw", &self.inner.raw)
            .finish()
    }
}

impl Module {
    /// Load PTX text (or a cubin/fatbin image given as text-free bytes through
    /// [`Module::load_image`]) into `ctx` (`cuModuleLoadData`). The driver JIT-compiles PTX for
    /// the context's GPU; its error (e.g. `CUDA_ERROR_UNSUPPORTED_PTX_VERSION` on a driver older
    /// than the PTX) is returned as is.
    pub fn load_ptx(ctx: &Context, ptx: &str) -> Result<Module, CudaError> {
        let text = CString::new(ptx).map_err(|_| CudaError::InvalidArgument {
            call: "cuModuleLoadData",
            reason: "the PTX text contains a NUL byte".to_string(),
        })?;
        Module::load_image(ctx, text.as_bytes_with_nul())
    }

    /// Load a module image (NUL-terminated PTX, cubin or fatbin bytes) into `ctx`.
    pub fn load_image(ctx: &Context, image: &[u8]) -> Result<Module, CudaError> {
        if image.is_empty() {
            return Err(CudaError::InvalidArgument {
                call: "cuModuleLoadData",
                reason: "the module image is empty".to_string(),
            });
        }
        ctx.make_current()?;
        let mut raw: CuModule = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; `image` is live for the call (the driver copies
        // what it needs); the context is current on this thread.
        let status = unsafe { (ctx.api().cuModuleLoadData)(&mut raw, image.as_ptr().cast()) };
        ctx.check(status, "cuModuleLoadData")?;
        Ok(Module {
            inner: Arc::new(ModuleInner {
                ctx: ctx.clone(),
                raw,
                gdx: false,
            }),
        })
    }

    /// gdx's own kernels ([`GDX_KERNELS_PTX`]) loaded into `ctx`.
    pub fn gdx_kernels(ctx: &Context) -> Result<Module, CudaError> {
        let mut m = Module::load_ptx(ctx, GDX_KERNELS_PTX)?;
        if let Some(inner) = Arc::get_mut(&mut m.inner) {
            inner.gdx = true;
        }
        Ok(m)
    }

    /// The context the module is loaded in.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// Whether this is gdx's own module ([`Module::gdx_kernels`]), whose kernels' parameters
    /// this crate knows.
    pub(crate) fn is_gdx(&self) -> bool {
        self.inner.gdx
    }

    /// The kernel `name` (an `extern "C"` entry point) of this module (`cuModuleGetFunction`).
    pub fn kernel(&self, name: &str) -> Result<Kernel, CudaError> {
        let c = CString::new(name).map_err(|_| CudaError::InvalidArgument {
            call: "cuModuleGetFunction",
            reason: format!("kernel name {name:?} contains a NUL byte"),
        })?;
        let mut raw: CuFunction = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer, the module is loaded, `c` is NUL-terminated.
        let status = unsafe {
            (self.inner.ctx.api().cuModuleGetFunction)(&mut raw, self.inner.raw, c.as_ptr())
        };
        self.inner
            .ctx
            .check(status, &format!("cuModuleGetFunction({name})"))?;
        Ok(Kernel {
            module: self.clone(),
            raw,
            name: name.to_string(),
        })
    }
}

impl Drop for ModuleInner {
    fn drop(&mut self) {
        // SAFETY: this value loaded the module, and no Kernel of it is left (each holds a
        // clone of the Arc around this value). A kernel of it still running (launched and not
        // waited for) keeps its code: the driver defers the unload until it completes.
        let status = unsafe { (self.ctx.api().cuModuleUnload)(self.raw) };
        if let Err(e) = self.ctx.check(status, "cuModuleUnload") {
            self.ctx.record_err(e);
        }
    }
}

/// A kernel of a loaded [`Module`]; keeps the module loaded.
#[derive(Clone)]
pub struct Kernel {
    module: Module,
    raw: CuFunction,
    name: String,
}

// SAFETY: a CUfunction may be used from any thread; it is never mutated here.
unsafe impl Send for Kernel {}
// SAFETY: as above.
unsafe impl Sync for Kernel {}

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kernel").field("name", &self.name).finish()
    }
}

impl Kernel {
    /// The entry point's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The module it belongs to.
    pub fn module(&self) -> &Module {
        &self.module
    }
}

/// Grid and block dimensions and dynamic shared memory of a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchDims {
    /// Blocks in x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads per block in x, y, z.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, bytes.
    pub shared_bytes: u32,
}

impl LaunchDims {
    /// One block of `threads` threads, no dynamic shared memory.
    pub fn single_block(threads: u32) -> LaunchDims {
        LaunchDims {
            grid: (1, 1, 1),
            block: (threads, 1, 1),
            shared_bytes: 0,
        }
    }

    /// `blocks` blocks of `threads` threads in x.
    pub fn linear(blocks: u32, threads: u32) -> LaunchDims {
        LaunchDims {
            grid: (blocks, 1, 1),
            block: (threads, 1, 1),
            shared_bytes: 0,
        }
    }
}

/// Kernel parameters, in the kernel's order, each stored by value (`cuLaunchKernel` copies
/// them at launch, so the value may be dropped right after).
#[derive(Debug, Default)]
pub struct KernelArgs {
    /// One 8-byte-aligned slot per parameter (every parameter gdx passes fits in 8 bytes).
    values: Vec<u64>,
}

impl KernelArgs {
    /// No parameters yet.
    pub fn new() -> KernelArgs {
        KernelArgs::default()
    }

    /// A 64-bit parameter (`unsigned long long`, or a device pointer such as
    /// [`super::DeviceBuffer::as_raw`] or [`super::MappedHostBuffer::device_ptr`]).
    pub fn push_u64(&mut self, v: u64) -> &mut KernelArgs {
        self.values.push(v);
        self
    }

    /// A 32-bit parameter (`unsigned int`). Stored in the low bytes of its slot, which is
    /// where the little-endian driver reads a 4-byte parameter from.
    pub fn push_u32(&mut self, v: u32) -> &mut KernelArgs {
        self.values.push(u64::from(v));
        self
    }

    /// Number of parameters.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

impl Stream {
    /// Queue `kernel` on this stream with `args` (`cuLaunchKernel`).
    ///
    /// # Safety
    ///
    /// The kernel runs arbitrary device code: `args` must match its parameter list in number
    /// and type, and every address among them must stay valid (not freed) until the kernel
    /// has finished, for every byte the kernel touches.
    pub unsafe fn launch(
        &self,
        kernel: &Kernel,
        dims: LaunchDims,
        args: &mut KernelArgs,
    ) -> Result<(), CudaError> {
        if !kernel.module.context().same(self.context()) {
            return Err(CudaError::InvalidArgument {
                call: "cuLaunchKernel",
                reason: format!(
                    "kernel {} is loaded on GPU {} and the stream belongs to GPU {}",
                    kernel.name,
                    kernel.module.context().ordinal(),
                    self.context().ordinal()
                ),
            });
        }
        self.enter()?;
        let mut ptrs: Vec<*mut c_void> = args
            .values
            .iter_mut()
            .map(|v| (v as *mut u64).cast::<c_void>())
            .collect();
        let (g, b) = (dims.grid, dims.block);
        // SAFETY: `ptrs` points at live parameter values for the call (the driver copies them);
        // the caller guarantees they match the kernel and that the memory stays valid.
        let status = unsafe {
            (self.context().api().cuLaunchKernel)(
                kernel.raw,
                g.0,
                g.1,
                g.2,
                b.0,
                b.1,
                b.2,
                dims.shared_bytes,
                self.raw(),
                ptrs.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        self.context()
            .check(status, &format!("cuLaunchKernel({})", kernel.name))
    }

    /// Queue gdx's marker kernel (`gdx_spin_then_mark` of [`Module::gdx_kernels`]): after
    /// `spin` (GPU clock) it writes `value` to `word`. Safe: the kernel and the address are
    /// known, and the word's buffer is kept until the kernel has run. For tests and benches of
    /// what is ordered after a kernel.
    pub fn launch_marker(
        &self,
        module: &Module,
        word: super::Word<'_>,
        value: u64,
        spin: std::time::Duration,
    ) -> Result<(), CudaError> {
        if !module.inner.gdx {
            return Err(CudaError::InvalidArgument {
                call: "Stream::launch_marker",
                reason: "the module is not gdx's own kernels (Module::gdx_kernels)".to_string(),
            });
        }
        let addr = word.address("cuLaunchKernel(gdx_spin_then_mark)")?;
        let k = module.kernel("gdx_spin_then_mark")?;
        let mut args = KernelArgs::new();
        args.push_u64(addr)
            .push_u64(value)
            .push_u64(u64::try_from(spin.as_nanos()).unwrap_or(u64::MAX));
        // SAFETY: gdx_spin_then_mark(u64* marker, u64 value, u64 spin_ns) writes 8 bytes at
        // `addr`, which `address` checked lie in the buffer; `mark` keeps the buffer (its Drop
        // waits) until the kernel has run.
        unsafe { self.launch(&k, LaunchDims::single_block(32), &mut args)? };
        word.mark(self)
    }

    /// Whether every operation queued on the stream is done (`cuStreamQuery`); never blocks.
    pub fn is_idle(&self) -> Result<bool, CudaError> {
        self.enter()?;
        // SAFETY: the handle is live.
        let status = unsafe { (self.context().api().cuStreamQuery)(self.raw()) };
        if status == api::NOT_READY {
            return Ok(false);
        }
        self.context().check(status, "cuStreamQuery")?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_ptx_has_every_entry_point_and_a_portable_target() {
        for k in ["gdx_mailbox", "gdx_spin_then_mark", "gdx_mark"] {
            assert!(
                GDX_KERNELS_PTX.contains(&format!(".visible .entry {k}(")),
                "{k} missing from the PTX"
            );
        }
        assert!(GDX_KERNELS_PTX.contains(".target sm_75"));
        assert!(!GDX_KERNELS_PTX.contains('\0'));
    }

    #[test]
    fn arguments_are_stored_by_value_in_order() {
        let mut a = KernelArgs::new();
        a.push_u64(0x1122_3344_5566_7788).push_u32(7);
        assert_eq!(a.len(), 2);
        assert_eq!(a.values, vec![0x1122_3344_5566_7788, 7]);
        // A 4-byte parameter is read from the first 4 bytes of its slot.
        assert_eq!(a.values[1].to_le_bytes()[..4], 7u32.to_le_bytes());
    }
}
