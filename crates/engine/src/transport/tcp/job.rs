//! What a tcp stream is given to run: a transfer's [`Job`] of [`Chunk`]s (pieces of its ops,
//! at most [`WINDOW`] in flight per stream) and the [`Group`] the streams running one transfer
//! share. Values only: the submitting side (`mod.rs`) makes them, the stream's chunk I/O
//! (`chunks.rs`, `batch.rs`) runs them.

use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

use crate::conn::Conn;
use crate::transfer::XferState;

/// Chunks in flight per stream before waiting for a confirmation.
pub(super) const WINDOW: usize = 16;

/// One piece of an op, sent as one `Write` or `Read` frame.
#[derive(Debug, Clone, Copy)]
pub(super) struct Chunk {
    pub(super) op: u32,
    pub(super) idx: u32,
    /// Offset of the chunk inside its op.
    pub(super) off: u64,
    pub(super) len: u32,
}

/// Completion bookkeeping shared by the streams running one transfer.
#[derive(Debug)]
pub(super) struct Group {
    pub(super) left: AtomicUsize,
    pub(super) control: Arc<Mutex<Conn>>,
}

/// A transfer's chunks given to one stream.
#[derive(Debug)]
pub(super) struct Job {
    pub(super) xfer: Arc<XferState>,
    pub(super) chunks: Vec<Chunk>,
    pub(super) group: Arc<Group>,
    /// Chunks the submitting thread already sent (in order, all of `chunks` that were sent):
    /// the stream's thread only receives their replies.
    pub(super) sent: Option<Vec<Chunk>>,
}
