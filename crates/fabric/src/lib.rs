//! libfabric for gdx: one-sided RMA (`fi_write`/`fi_read`) between registered memory over
//! whichever provider the machine offers (efa, verbs, cxi; tcp on loopback for CI).
//!
//! - **Loading**: libfabric is opened at run time by gdx-sys (`gdx_sys::fabric`, its FFI and
//!   owning handles); without it every entry point returns [`FabricError::Unavailable`] (the
//!   binary still runs and says why).
//! - **Provider**: [`FabricConfig`] / `GDX_FABRIC_PROVIDER`, or automatic (efa > verbs > cxi >
//!   tcp); [`Endpoint::reason`] says why. tcp is bound to 127.0.0.1 only.
//! - **Objects**: fabric, domain, AV, CQ, endpoint and MR are gdx-sys's owned handles, closed
//!   on drop in dependency order; [`Endpoint::registrations`] counts live MRs and refused
//!   closes.
//! - **MR modes**: FI_MR_LOCAL (descriptors always passed), FI_MR_VIRT_ADDR (remote addresses are
//!   virtual addresses, else offsets), FI_MR_PROV_KEY (the provider's key, else a random gdx key),
//!   FI_MR_ENDPOINT (bound and enabled), FI_MR_ALLOCATED; FI_MR_RAW (keys over 8 bytes) is refused.
//! - **Batches**: [`Endpoint::run`] checks bounds, posts in pieces with a bounded window, waits
//!   for every completion with a deadline, and maps `fi_cq_readerr` to named errors.
//! - **Thread safety**: FI_THREAD_SAFE is required of the provider; [`Endpoint`] is `Send + Sync`.
//!
//! The exchange of addresses and [`RemoteRegion`]s between peers is the caller's (the engine
//! does it over its authenticated handshake).

#![deny(missing_docs)]

mod endpoint;
mod error;
mod provider;
mod region;

pub use endpoint::Endpoint;
pub use error::{FabricError, Result};
pub use gdx_sys::fabric::Memory;
pub use provider::{library, providers, would_choose, FabricConfig, ProviderInfo, PREFERENCE};
pub use region::{MemoryRegion, PeerAddr, RemoteRegion, RmaKind, RmaOp};
