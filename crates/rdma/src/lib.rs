//! gdx-rdma: everything verbs for gdx — discovery, GPU and host memory registration with a
//! cache, RC queue-pair bring-up, connection data for the engine's handshake, GID and NIC
//! choice, batched RDMA WRITE/READ with completion polling and named errors, the doctor's
//! RDMA probes and the RDMA bandwidth/latency bench.
//!
//! libibverbs is loaded at run time through `gdx-sys` (sideway / rdma-mummy-sys): a binary
//! using this crate runs on machines without it, and every entry point then returns a typed
//! [`RdmaUnavailable`] ("no libibverbs" / "no RDMA device", with the reason), never a panic.
//!
//! # Pieces
//!
//! | module | job |
//! |---|---|
//! | [`discovery`] | devices, ports, GID tables; "unavailable" with the reason |
//! | [`gid`] | the GID a QP sends from (RoCE v2 IPv4-mapped on an up netdev; `GDX_IB_GID_INDEX`) |
//! | [`nic`] | the NICs for a region from the topology (PIX/PXB first; rails) |
//! | [`cache`] | the registration cache, generic over a [`Registrar`] |
//! | [`register`] | host `ibv_reg_mr`; GPU dma-buf → peermem → staged; strict mode |
//! | [`conn`] | [`ConnData`]: versioned binary / serde connection data |
//! | [`endpoint`], [`qp`], [`cq`] | device port → prepared QPs → connected QPs → completions |
//! | [`wc`] | every `ibv_wc_status` by name; [`WcError`] |
//! | [`doctor`] | what `gdx doctor` calls: dma-buf probe, devices, GIDs, MTUs, active probe |
//! | [`bench`](mod@bench) | perftest-style WRITE/READ bandwidth and latency against a peer |
//!
//! # How the engine uses it (the RDMA transport)
//!
//! The engine owns regions, peers and its handshake; this crate owns the verbs objects. A
//! transport built on it does, per agent and per peer:
//!
//! 1. **At agent start**: [`discovery::discover`]; no devices → the transport is not offered
//!    (the reason goes into the agent's transport list). Otherwise keep a [`gdx_topo::Topology`].
//! 2. **Per region**: pick NICs with [`nic::choose_nics`] (GPU: nearest by PCIe class, rails
//!    on ties; host: same NUMA node), open one [`RdmaEndpoint`] per NIC ([`endpoint::open_rails`],
//!    cached per device) and [`RdmaEndpoint::register`] the memory ([`Memory::gpu`] for a
//!    `DeviceBuffer`, unsafe [`Memory::host`] for host memory under the region's lease
//!    protocol). The [`MrHandle`] says which [`Mechanism`] worked; a staged one means the
//!    planner must route the region's ops through the staged path (or, in strict mode,
//!    registration already failed with [`RdmaError::GpuDirectUnavailable`]). The
//!    [`Registration::remote_region`] (address, length, rkey) goes into the region's
//!    descriptor for peers. On region drop: [`RdmaEndpoint::invalidate`].
//! 3. **Per peer, in the handshake**: [`RdmaEndpoint::completion_queue`] and
//!    [`RdmaEndpoint::prepare`] (several QPs per peer) give a [`PreparedQp`]; send
//!    [`ConnData::encode`] bytes in the handshake, [`ConnData::decode`] the peer's, then
//!    [`PreparedQp::connect`] → [`Qp`].
//! 4. **Per transfer**: build [`WorkItem`]s (local handle + address, remote address + rkey,
//!    length; [`WorkItem::between`] bounds-checks against a [`RemoteRegion`]), split across
//!    rails with [`nic::split_across_rails`], [`Qp::post_write`] / [`Qp::post_read`] →
//!    [`Ticket`]; a transport thread polls [`CompletionQueue::poll`] with a timeout and maps
//!    each [`BatchDone`] item to the op's result (a [`WcError`] names the status:
//!    remote access, retry exceeded, local protection, flushed ...). One-sided ops need
//!    nothing from the peer's CPU: the engine's existing control frames carry the
//!    notification after the completions.
//! 5. **Teardown**: drop the [`Qp`] (destroys the QPs, releases pending registrations), then
//!    the endpoint.
//!
//! # Quick start
//!
//! Two sides of one connection in one process (a loopback; in the engine each side runs in its
//! own agent and the [`ConnData`] bytes travel in the handshake):
//!
//! ```no_run
//! use gdx_rdma::{ConnData, EndpointConfig, Memory, RdmaEndpoint, WorkItem};
//! use std::time::Duration;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ep = RdmaEndpoint::open("mlx5_0", EndpointConfig::default())?;
//! let mut src = vec![7u8; 1 << 20];
//! let mut dst = vec![0u8; 1 << 20];
//! // SAFETY: both vectors outlive the endpoint, its cache and the connection (dropped below).
//! let s = ep.register(&unsafe { Memory::host(src.as_mut_ptr(), src.len()) })?;
//! let d = ep.register(&unsafe { Memory::host(dst.as_mut_ptr(), dst.len()) })?;
//! let cq = ep.completion_queue(1024)?;
//! let a = ep.prepare(&cq, 2)?;
//! let mut b = ep.prepare(&cq, 2)?;
//! b.advertise(d.handle.remote_region(1));
//! let (to_b, to_a) = (a.conn_data().encode()?, b.conn_data().encode()?);
//! let mut qa = a.connect(&ConnData::decode(&to_a)?)?;
//! let _qb = b.connect(&ConnData::decode(&to_b)?)?;
//! let target = qa.remote().regions[0];
//! let item = WorkItem::between(&s, 0, &target, 0, 1 << 20)?;
//! let ticket = qa.post_write(&[item])?;
//! let done = qa.completion_queue().wait(ticket, Duration::from_secs(5))?;
//! assert!(done.first_error().is_none());
//! # drop((qa, _qb, s, d, cq, ep));
//! assert_eq!(dst, src);
//! # Ok(()) }
//! ```
//!
//! # Not verified on hardware
//!
//! No machine available to the project has an RDMA NIC. Everything that needs one — QP
//! bring-up, posting, completions, registration through a real provider, the bench — is built
//! against the real libibverbs API and tested only without a device; see `docs/rdma.md` for
//! the table of what has and has not run.

#![deny(missing_docs)]
// Lints: [workspace.lints] in the root Cargo.toml (unsafe contracts, no unwrap/expect/panic).

mod batch;
pub mod bench;
pub mod cache;
pub mod conn;
pub mod cq;
pub mod discovery;
pub mod doctor;
pub mod endpoint;
mod error;
pub mod gid;
pub mod nic;
pub mod qp;
pub mod register;
pub mod wc;

pub use cache::{CacheStats, MemKind, MemRange, RegCache, Registrar};
pub use conn::{ConnData, ConnDataError, QpInfo, RemoteRegion};
pub use cq::{BatchDone, CompletionQueue, MrHandle, Ticket};
pub use discovery::{discover, RdmaUnavailable, UnavailableKind};
pub use endpoint::{EndpointConfig, RdmaEndpoint};
pub use error::{RdmaError, Result};
pub use gdx_sys::verbs::RdmaOp;
pub use gid::{GidChoice, GidError, LinkKind};
pub use nic::{choose_nics, MemPlace, NicChoice, Rail};
pub use qp::{PreparedQp, Qp, WorkItem};
pub use register::{Mechanism, Memory, Registration};
pub use wc::{WcError, WcStatus};

#[cfg(test)]
mod tests {
    use super::*;

    fn send_sync<T: Send + Sync>() {}

    #[test]
    fn handles_can_move_to_transport_threads() {
        send_sync::<RdmaEndpoint>();
        send_sync::<CompletionQueue>();
        send_sync::<MrHandle>();
        send_sync::<PreparedQp>();
        send_sync::<Qp>();
        send_sync::<RdmaError>();
    }
}
