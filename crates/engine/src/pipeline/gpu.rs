//! The GPU stage: frames copied host → GPU on the copy engine, the checksum kernel (PTX, the same
//! math as [`super::checksum`]) run on them, slots released by stream signals.
//!
//! Not built in this version: it needs the module-loading, kernel-launch, stream-memory-op and
//! mapped-host-memory API of gdx-sys (the mailbox work, issue #20). [`GpuStage::open`] checks
//! the GPU that was asked for and then says so, so `gdx stream --gpu N` fails loudly instead of
//! running on the CPU.

use gdx_sys::cuda::Cuda;

use crate::error::{Error, Result};

/// A GPU stage on one device.
#[derive(Debug)]
pub struct GpuStage {
    _gpu: u32,
}

impl GpuStage {
    /// Open the stage on CUDA device `gpu`.
    ///
    /// # Errors
    /// [`Error::Unavailable`]: no CUDA driver, no such GPU, or (on a machine that has it) the
    /// GPU stage is not built yet.
    pub fn open(gpu: u32) -> Result<GpuStage> {
        let cuda = Cuda::load().map_err(|e| {
            Error::Unavailable(format!(
                "--gpu {gpu}: no CUDA driver ({e}); run without --gpu for the host-only pipeline"
            ))
        })?;
        let count = cuda.device_count()?;
        if gpu >= count {
            return Err(Error::Unavailable(format!(
                "--gpu {gpu}: GPU{gpu} is not present (this machine has {count} GPU{}); run without --gpu for the host-only pipeline",
                if count == 1 { "" } else { "s" }
            )));
        }
        Err(Error::Unavailable(format!(
            "--gpu {gpu}: the GPU stage of the stream pipeline is not built in this version (it needs the kernel-launch and stream-signal API of issue #20); run without --gpu for the host-only pipeline"
        )))
    }
}
