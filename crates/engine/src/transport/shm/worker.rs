//! The state of one shm connection on the initiator's side, and the types it holds: the
//! connection's worker (`Worker`), its control ring (`RingClient`), the transfers in flight on
//! the ring (`Inflight`) and the peer's regions the `cma` path reaches (`CmaRegion`). The files
//! beside it say what each part does (`impl` blocks); this one names nothing of theirs, so
//! they depend on it and not on each other through the worker.

use std::collections::{HashMap, VecDeque};
use std::os::fd::RawFd;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use std::time::Duration;

use crate::conn::Conn;
use crate::error::Error;
use crate::mem::Mapping;
use crate::shm_ring::{self, Ring};
use crate::transfer::clock::{Span, Tick};
use crate::transfer::XferState;

/// Size of the bounce buffer used for borrowed remote regions.
pub(super) const BOUNCE_BYTES: usize = 8 << 20;

/// One shm connection's state on the initiator's side: the worker thread's, and for small
/// transfers the submitting and waiting threads' (`ShmTransport::worker`). What it does is in the
/// sibling files (`impl Worker` blocks: ring, socket, cma, standing, ipc).
pub(super) struct Worker {
    /// The shm socket: requests the ring does not carry, fds, notifications.
    pub(super) conn: Conn,
    /// The bounce buffer the target maps too (`ShmStaged` copies go through it).
    pub(super) bounce: Mapping,
    /// The peer's agent-allocated regions mapped here, by remote region id, and whether the
    /// mapping is writable.
    pub(super) maps: HashMap<u64, (Mapping, bool)>,
    /// Remote GPU regions mapped through their IPC handle or fd, by remote region id (dropped
    /// when the target says the region is gone, or with the connection).
    pub(super) imports: HashMap<u64, Vec<(u64, crate::gpu::DeviceRegion)>>,
    /// A `ShmEnd` was sent whose reply is still unread (read before the next request).
    pub(super) end_unread: bool,
    /// This process's CUDA, for host regions that reach a peer's GPU memory (`ipc`).
    pub(super) cuda: Arc<std::sync::OnceLock<crate::gpu::LocalPeer>>,
    /// The I/O timeout: how long a wait for the peer goes on.
    pub(super) wait: Duration,
    /// The control ring (every transfer whose ops fit it runs without the socket).
    pub(super) ring: Option<RingClient>,
    /// Why the connection is unusable, once it is.
    pub(super) broken: Option<Error>,
    /// Small transfers posted into the ring and not yet completed, oldest first.
    pub(super) inflight: VecDeque<Inflight>,
    /// Whether this process may copy straight into and out of the peer's memory.
    pub(super) cma: crate::routing::plan::CmaGrant,
    /// The peer's borrowed host regions the `cma` path reaches, by remote region id.
    pub(super) cma_regions: HashMap<u64, CmaRegion>,
    /// The transfer the worker thread is running, whose halt (cancel, deadline) ends a wait
    /// for the peer's reply on the socket (`Worker::request`).
    pub(super) current: Option<Arc<XferState>>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("maps", &self.maps.len())
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}

/// The initiator's ring state: the mapping and the next sequence number.
#[derive(Debug)]
pub(super) struct RingClient {
    /// Shared with the connection's `Driver`, which reads slot states without the lock.
    pub(super) ring: Arc<Ring>,
    /// The slot of the oldest transfer in flight (`NO_SLOT`: none), for `Driver::poll`.
    pub(super) front: Arc<Front>,
    pub(super) seq: u32,
    /// Inline slots whose `DONE` this side has read: free to reuse as they are. The initiator
    /// does not write `FREE` into them, which would take the slot's line back from the target's
    /// core once more per request (and stall this core's next atomic until it had).
    pub(super) consumed: [bool; shm_ring::SLOTS],
    /// The shm socket, watched for hang-up while waiting.
    pub(super) sock_fd: RawFd,
    pub(super) wait: Duration,
    /// When this side last published a slot (`publish`).
    pub(super) last_post: Option<Tick>,
    /// `QUIET` in clock ticks (`publish` compares raw readings).
    pub(super) quiet: Span,
}

/// The slot of the oldest transfer in flight (`RingClient::front`), on a cache line of its
/// own: every poll of a waiter reads it, and a line shared with anything another thread writes
/// would cost a fetch per poll.
#[derive(Debug)]
#[repr(align(128))]
pub(super) struct Front(pub(super) AtomicU32);

impl std::ops::Deref for Front {
    type Target = AtomicU32;

    fn deref(&self) -> &AtomicU32 {
        &self.0
    }
}

/// A posted slot not yet answered (or answered and not yet completed): inline, or `BEGIN`
/// (answered: the ops are leased by the target, and whoever completes it copies through the
/// mappings and marks it `END`).
#[derive(Debug)]
pub(super) struct Inflight {
    pub(super) xfer: Arc<XferState>,
    /// The slot of its oldest unfinished part (a transfer cut into several `BEGIN` slots has
    /// the rest in the slots after it).
    pub(super) slot: usize,
    pub(super) kind: u32,
    /// The ops withdrawn before posting (their local copy failed), of the slot's ops.
    pub(super) skip: Skip,
    /// The ops of the transfer in `slot`.
    pub(super) ops: std::ops::Range<usize>,
    /// Ops per slot (`Started::chunk`).
    pub(super) chunk: usize,
}

/// The ops of one slot that are out of it: withdrawn before posting, or failed by the target.
/// Nothing is allocated until an op fails (the common case).
#[derive(Debug, Default)]
pub(super) struct Skip(pub(super) Option<Vec<bool>>);

/// A peer's borrowed host region as this side reaches it: its address in the peer.
#[derive(Debug, Clone, Copy)]
pub(super) struct CmaRegion {
    pub(super) addr: u64,
    pub(super) len: u64,
    pub(super) writable: bool,
    /// The ring-header entry of the target's standing lease on it (`standing.rs`), while open.
    pub(super) standing: Option<usize>,
}
