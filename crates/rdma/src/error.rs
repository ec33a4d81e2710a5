//! [`RdmaError`]: every way an RDMA operation of this crate fails, one variant per cause.

use crate::conn::ConnDataError;
use crate::discovery::RdmaUnavailable;
use crate::gid::GidError;
use crate::nic::NicError;
use crate::wc::WcError;
use gdx_sys::cuda::CudaError;
use gdx_sys::verbs::VerbsError;
use std::time::Duration;

/// The crate's result type.
pub type Result<T, E = RdmaError> = std::result::Result<T, E>;

/// A failed RDMA operation.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RdmaError {
    /// No RDMA here: libibverbs missing, or no device.
    #[error(transparent)]
    Unavailable(#[from] RdmaUnavailable),
    /// A verbs call failed.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// Another vendor library the operation needs (the CUDA driver) did not load.
    #[error(transparent)]
    Library(#[from] gdx_sys::Unavailable),
    /// A CUDA call failed (dma-buf export, GPU buffer).
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// No GID could be chosen.
    #[error(transparent)]
    Gid(#[from] GidError),
    /// No NIC could be chosen.
    #[error(transparent)]
    Nic(#[from] NicError),
    /// The peer's connection data is invalid.
    #[error(transparent)]
    ConnData(#[from] ConnDataError),
    /// Strict mode: GPU memory that neither dma-buf nor peermem could register, which only a
    /// staged path (through host memory) could serve.
    #[error(
        "strict mode: {len} bytes of GPU {gpu} memory cannot be registered with {device} for \
         GPUDirect RDMA ({}); only a staged path could serve it",
        .attempts.join("; ")
    )]
    GpuDirectUnavailable {
        /// GPU ordinal.
        gpu: u32,
        /// RDMA device.
        device: String,
        /// Bytes.
        len: u64,
        /// Each mechanism tried and why it failed.
        attempts: Vec<String>,
    },
    /// A registration that has no memory region (staged) was used for a direct transfer.
    #[error("{what} has no RDMA registration (it is served by a staged path)")]
    NotRegistered {
        /// Which region.
        what: String,
    },
    /// A byte range outside a region, found before posting.
    #[error("{len} byte(s) at offset {offset} do not fit in the {size}-byte {what}")]
    OutOfBounds {
        /// Which region, e.g. `local region` or `remote region 7`.
        what: String,
        /// First byte.
        offset: u64,
        /// Length.
        len: u64,
        /// Size of the region.
        size: u64,
    },
    /// The registration belongs to another device than the queue pair.
    #[error(
        "the local region is registered with {region_device}, but the queue pair is on {qp_device}"
    )]
    WrongDevice {
        /// The region's device.
        region_device: String,
        /// The queue pair's device.
        qp_device: String,
    },
    /// The send queues cannot take the batch now; poll completions and retry.
    #[error("the send queues have room for {free} work request(s); the batch needs {needed}")]
    QueueFull {
        /// Free slots over all queue pairs.
        free: usize,
        /// Work requests the batch needs.
        needed: usize,
    },
    /// A work request completed with an error.
    #[error(transparent)]
    Completion(#[from] WcError),
    /// A wait ran out.
    #[error(
        "no RDMA completion within {waited:?}; {outstanding} work request(s) outstanding{detail}"
    )]
    Timeout {
        /// How long was waited.
        waited: Duration,
        /// Work requests still outstanding.
        outstanding: usize,
        /// What the queue pairs and the port said when the wait ran out, and what it means
        /// (`"; QP 0x11 RTS, ... : cause"`), or empty.
        detail: String,
    },
    /// The two sides cannot be connected as described.
    #[error("cannot connect to the peer: {0}")]
    Mismatch(String),
    /// The queue pairs are in the error state after a failure; reconnect.
    #[error("the connection failed earlier and its queue pairs are in the error state: {why}")]
    Broken {
        /// The queue pair whose completion failed first.
        qp_num: u32,
        /// That completion's error.
        why: String,
    },
    /// A value outside what the call accepts.
    #[error("{0}")]
    InvalidArgument(String),
    /// The control channel (bench, out-of-band exchange) failed.
    #[error("control channel: {0}")]
    Control(String),
}
