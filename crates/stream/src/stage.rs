//! What the stage thread drives: a [`Stage`] takes filled slots in sequence order and reports
//! each frame's [`Output`] once it is done, in the same order, so it may keep several frames in
//! flight (the GPU stage does: copies and kernels queue on a stream while earlier frames
//! finish). The slot a frame sits in goes back to the source only when the stage says the frame
//! is done with.

use std::collections::VecDeque;

use std::sync::Arc;

use gdx_sys::cuda::{MappedHostBuffer, PinnedHostBuffer};

use super::kernel::{Kernel, Output};
use gdx_engine::{Error, Result};

/// A slot's memory: plain host memory for a CPU stage, pinned memory for the copy-engine GPU
/// stage (so the copy engine reads it directly), mapped pinned memory for the service-kernel
/// stage (the kernel reads it in place).
pub(crate) enum SlotMem {
    Host(Box<[u8]>),
    Pinned(PinnedHostBuffer),
    /// Slot `index` of a [`super::gpu_service::ServiceStage`], `len` usable bytes. The stage
    /// keeps its own reference, so the memory is freed only after its kernel stopped.
    Mapped {
        buf: Arc<MappedHostBuffer>,
        index: usize,
        len: usize,
    },
}

impl SlotMem {
    pub(crate) fn bytes(&self) -> Result<&[u8]> {
        match self {
            SlotMem::Host(b) => Ok(b),
            SlotMem::Pinned(p) => Ok(p.as_slice()?),
            // SAFETY: the service kernel only reads a slot, and only while its frame is in
            // flight; nothing else writes it while the pipeline holds this `&SlotMem`.
            SlotMem::Mapped { buf, len, .. } => Ok(unsafe { &buf.bytes()[..*len] }),
        }
    }

    pub(crate) fn bytes_mut(&mut self) -> Result<&mut [u8]> {
        match self {
            SlotMem::Host(b) => Ok(b),
            SlotMem::Pinned(p) => Ok(p.as_mut_slice()?),
            // SAFETY: a slot is handed to the source (`&mut SlotMem`) only when it is not in
            // flight: the stage returns it after the kernel's completion tag for its frame, and
            // the kernel reads a slot only between its submission word (written after this
            // borrow ended) and that tag. Each slot is one allocation no other slot shares.
            SlotMem::Mapped { buf, len, .. } => Ok(unsafe { &mut buf.bytes_mut()[..*len] }),
        }
    }
}

/// A pipeline stage.
pub(crate) trait Stage: Send {
    /// Where it runs, for the report (`cpu`, `gpu0 ...`).
    fn place(&self) -> String;
    /// The kernel's name.
    fn kernel_name(&self) -> String;
    /// Memory for one slot of `bytes`.
    fn alloc(&mut self, bytes: usize) -> Result<SlotMem>;
    /// Start on the frame in `slot` (`len` bytes); the slot is not touched until the frame's
    /// output came back from [`Stage::poll`].
    fn submit(&mut self, slot: &SlotMem, len: usize) -> Result<()>;
    /// The oldest submitted frame's output if it is done.
    fn poll(&mut self) -> Result<Option<Output>>;
}

/// A [`Kernel`] on the stage thread: each frame is done when `submit` returns.
pub(crate) struct CpuStage<K> {
    kernel: K,
    done: VecDeque<Result<Output>>,
}

impl<K: Kernel> CpuStage<K> {
    pub(crate) fn new(kernel: K) -> CpuStage<K> {
        CpuStage {
            kernel,
            done: VecDeque::new(),
        }
    }
}

impl<K: Kernel> Stage for CpuStage<K> {
    fn place(&self) -> String {
        "cpu".into()
    }

    fn kernel_name(&self) -> String {
        self.kernel.name()
    }

    fn alloc(&mut self, bytes: usize) -> Result<SlotMem> {
        Ok(SlotMem::Host(vec![0u8; bytes].into_boxed_slice()))
    }

    fn submit(&mut self, slot: &SlotMem, len: usize) -> Result<()> {
        let frame = slot.bytes()?.get(..len).ok_or_else(|| {
            Error::InvalidArgument(format!("a frame of {len} bytes does not fit its slot"))
        })?;
        let out = self.kernel.process(frame);
        self.done.push_back(out);
        Ok(())
    }

    fn poll(&mut self) -> Result<Option<Output>> {
        self.done.pop_front().transpose()
    }
}
