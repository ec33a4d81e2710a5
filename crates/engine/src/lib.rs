//! gdx-engine: register memory, exchange descriptors, post batched one-sided reads and writes, poll
//! statuses — and every op says which path it took and why.
//!
//! # Model
//!
//! - An [`Agent`] (one per process, configured by [`AgentConfig`] and `GDX_*` variables) owns the
//!   registered memory and serves peers.
//! - A [`Region`] is registered memory with [`Access`] rights: owned (allocated by the agent,
//!   shareable with a same-host peer) or borrowed (a caller's buffer, inside [`Agent::scope`], whose
//!   lifetime the type system enforces). Its [`RegionDesc`] is what a peer needs to target it: id,
//!   length, location, access, and an unguessable 128-bit key — never a raw pointer.
//! - A [`Peer`] is a connected remote agent ([`Agent::connect`]); the handshake exchanges identity,
//!   host id and transports, and the peer hands out region descriptors on request ([`Peer::region`]).
//! - A [`Transfer`] is a batch of write/read ops; [`Peer::submit`] returns a [`TransferHandle`] with
//!   [`TransferHandle::status`], [`TransferHandle::wait`] and per-op [`OpResult`]s carrying the
//!   [`Plan`] (path + reason).
//! - A notification ([`Transfer::notify`]) reaches the peer's [`Agent::wait_notification`] after the
//!   transfer's bytes are in place.
//!
//! # Paths
//!
//! `shm` for a peer on the same kernel (memfd passing; one copy into agent-allocated regions, two
//! through a bounce buffer for borrowed ones), `tcp` otherwise (several streams, chunked, payloads
//! received straight into registered memory). The wire protocol is in `docs/wire-protocol.md`.
//!
//! # GPU memory
//!
//! [`LocalPeer`] moves bytes among this process's GPUs and pinned host memory, and into GPU
//! regions imported from another process ([`LocalPeer::import_ipc`]): `p2p` over the direct
//! link when peer access works, `ipc` for imported regions, `staged` (a chunked pipeline through
//! pinned bounce buffers) otherwise, `host-to-gpu`/`gpu-to-host` on the copy engines. The
//! [`planner`] picks per op and says why; [`Policy::strict`] (`GDX_STRICT=1`) turns a departure
//! from the direct path into an error; a [`Calibration`] (`GDX_CALIBRATION`) tunes crossovers.
//! CUDA is loaded at run time: without it, [`LocalPeer::open`] returns [`Error::Unavailable`].
//!
//! # Security
//!
//! Peers prove they hold the agent's [`Secret`] (mutual HMAC-SHA256 challenge–response) before
//! anything is shared; data streams and the shm socket are bound to the authenticated session.
//! Bulk data is not encrypted. Shared memfds are sealed and checked before mapping; every bound
//! on what a peer can hold is a [`Limits`] field. See `docs/wire-protocol.md`.
//!
//! # Failure
//!
//! Every wait has a timeout. A peer that dies mid-transfer yields `Failed { reason: PeerLost }`,
//! never a success for unconfirmed bytes; [`Peer::reconnect`] recovers.
//!
//! # Quick start
//!
//! See `examples/pingpong.rs` (two processes, a write, a read back, notifications).

#![deny(missing_docs)]
// Lints: [workspace.lints] in the root Cargo.toml (unsafe contracts, no unwrap/expect/panic).

mod accepted;
mod admission;
mod agent;
mod agent_state;
mod auth;
mod blocks;
mod config;
mod conn;
mod desc;
mod error;
pub mod file;
mod gpu;
mod limits;
mod mem;
mod notifications;
mod peer;
mod rails;
mod region;
mod routing;
pub mod serve;
mod server;
mod session;
mod shm_ring;
mod spin;
mod stats;
mod target_stats;
mod transfer;
mod transport;
pub mod wire;

pub use agent::Agent;
pub use agent_state::PeerInfo;
pub use auth::{Secret, MIN_SECRET_BYTES};
pub use blocks::{BlockList, BlockPool, BlockTransfer};
pub use config::{parse_listen, parse_nics, AgentConfig, Transports};
pub use error::{AuthFailure, Error, Result};
pub use gpu::{
    DeviceOrigin, DeviceRegion, IpcDesc, IpcStats, LocalPeer, LocalTransfer, Mem, Ordering,
    PinnedRegion, Span, StagedTuning,
};
pub use limits::{LimitHits, Limits};
pub use notifications::Notification;
pub use notifications::MAX_NOTIFICATION_BYTES;
pub use peer::{Expected, Peer, PreparedTransfer};
pub use rails::{PeerRails, RailInfo, RailState, MAX_RAILS};
pub use region::{
    Access, Location, Region, RegionDesc, RegionKey, RegionMut, RegionRef, RegionScope,
};
pub use routing::calibration::{
    Calibration, Crossover, CALIBRATION_ENV, DEFAULT_MAILBOX_CROSSOVER,
};
pub use routing::plan::{Path, PeerRoute, Plan};
pub use routing::planner;
pub use routing::planner::Policy;
pub use spin::{current_cpu, leave_cpu};
pub use stats::{reason_label, LatencyStat, PathStat, StatsSnapshot, LATENCY_BOUNDS_S};
pub use target_stats::ServedStat;
pub use transfer::{
    Batching, OpKind, OpResult, OpResults, OpResultsIter, OpStatus, Status, Transfer,
    TransferHandle, TransferReport,
};
pub use wire::RemoteError;
