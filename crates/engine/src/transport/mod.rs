//! Transports: one implementation of [`Transport`] per backend.
//!
//! A transport runs whole transfers for one peer connection: it receives the transfer's shared state
//! (ops already planned and validated), moves the bytes, reports each op through
//! `XferState::chunk_done` / `fail_pending`, delivers the notification and calls `finish`: tcp
//! (with GPU staging), shm (with the GPU ipc path) and rdma.

use std::sync::Arc;

use crate::transfer::XferState;

pub(crate) mod rdma;
pub(crate) mod shm;
pub(crate) mod tcp;

/// The plug-in point for a data path backend.
pub(crate) trait Transport: Send + Sync + std::fmt::Debug {
    /// Starts running `xfer`; returns at once. The transport must eventually call `xfer.finish()`.
    fn submit(&self, xfer: Arc<XferState>);

    /// Whether the connection under this transport is still usable.
    fn is_alive(&self) -> bool;

    /// Stops accepting work and closes the connection; running transfers fail with `PeerLost`.
    fn close(&self);
}
