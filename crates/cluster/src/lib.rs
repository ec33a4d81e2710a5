//! gdx-cluster: agents find each other through etcd, on leases; Prometheus metrics and health.
//!
//! # Model
//!
//! - [`ClusterAgent::join`] publishes an engine [`gdx_engine::Agent`] under
//!   `/gdx/<cluster>/agents/<name>` ([`AgentRecord`]: address, transports, host id, GPUs,
//!   NICs, instance id) and each named region under `/gdx/<cluster>/regions/<name>/<region>`
//!   ([`RegionRecord`]), all on one lease (TTL 10 s by default) kept alive. The name is taken
//!   with a create-if-absent transaction: a second agent of the same name gets
//!   [`ClusterError::NameTaken`] naming the holder. Dropping the agent (or
//!   [`ClusterAgent::leave`]) revokes the lease; a crash lets it expire.
//! - **No usable key sits in etcd**: records carry neither region keys nor CUDA IPC handles;
//!   a peer gets the keyed descriptor over its authenticated session ([`NamedPeer::region`]).
//! - [`ClusterAgent::connect_named`] looks a peer up, connects, and checks that the handshake
//!   names the instance etcd lists. When that instance's lease ends, running transfers fail
//!   with `PeerLost("lease expired ...")`, cached descriptors go, new submits are refused; a
//!   restarted agent has a new instance id and new keys.
//! - etcd lost while running: connected peers keep working; the registration is retried with
//!   backoff and comes back on the same lease when it survived, or on a new one
//!   ([`LeaseState`]).
//! - [`ClusterView`] is the read side (`gdx peers`): list agents, watch joins and leaves.
//! - [`metrics::MetricsServer`] serves `/metrics` (Prometheus text) from the engine's counters
//!   and `/health` (200 while serving and registered, 503 otherwise).
//!
//! etcd-client runs on a small tokio runtime inside this crate, behind a blocking API: the
//! engine stays free of async.

#![deny(missing_docs)]

mod agent;
mod error;
mod etcd;
mod http;
pub mod metrics;
mod record;
mod registration;
#[cfg(feature = "test-support")]
pub mod test_support;
mod view;

pub use agent::{ClusterAgent, ClusterConfig, NamedPeer, NamedTransfer, LEASE_EXPIRED};
pub use error::{ClusterError, Result};
pub use etcd::{EtcdOptions, EtcdTls};
pub use record::{AgentRecord, RegionRecord};
pub use registration::LeaseState;
pub use view::{AgentEvent, AgentListing, ClusterView};
