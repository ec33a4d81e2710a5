//! The agent's state, shared by the [`Agent`](crate::Agent) handle, its server threads and its
//! peers: configuration, the region registry, sessions, the notification and accepted-peer
//! queues, the NIC endpoints and the counters. It imports neither the peer nor the server, so
//! both sit above it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::accepted::Queue;
use crate::admission::Gate;
use crate::auth::Secret;
use crate::config::{AgentConfig, Transports};
use crate::conn::Sock;
use crate::error::Result;
use crate::gpu::LocalPeer;
use crate::limits::LimitHits;
use crate::notifications::{Notification, NotificationQueue};
use crate::region::Registry;
use crate::session::Session;
use crate::stats::Stats;
use crate::transport::fabric::FabricNode;
use crate::transport::rdma::RdmaNode;

/// What a peer said about itself in the handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    /// Agent name.
    pub name: String,
    /// Agent id (random per process).
    pub agent_id: u128,
    /// Host id (kernel boot id unless overridden).
    pub host_id: u128,
    /// Transports the peer offers.
    pub transports: Transports,
    /// Where the peer accepts connections, if it listens.
    pub listen: Option<String>,
}

/// State shared by the agent handle, its server threads and its peers.
#[derive(Debug)]
pub(crate) struct AgentInner {
    pub(crate) cfg: AgentConfig,
    pub(crate) id: u128,
    pub(crate) host_id: u128,
    pub(crate) registry: Arc<Registry>,
    pub(crate) listen_addr: Option<SocketAddr>,
    pub(crate) shm_name: Option<String>,
    /// session id → what data streams and shm connections joining it must prove.
    pub(crate) sessions: Mutex<HashMap<u128, Session>>,
    pub(crate) notifications: NotificationQueue,
    /// The secret peers prove they hold; `None` only in insecure mode.
    pub(crate) secret: Option<Secret>,
    pub(crate) gate: Arc<Gate>,
    pub(crate) hits: LimitHits,
    pub(crate) accepted: Queue<PeerInfo>,
    pub(crate) conns: Conns,
    pub(crate) shutdown: AtomicBool,
    /// Strict mode for GPU regions ([`Agent::set_strict`]; `GDX_STRICT` at start).
    pub(crate) strict: AtomicBool,
    /// The RDMA endpoint, or why this agent does not offer rdma.
    pub(crate) rdma: Result<Arc<RdmaNode>>,
    /// Queue pairs of inbound rdma connections, per control session.
    pub(crate) rdma_qps: Mutex<HashMap<u128, Vec<gdx_rdma::Qp>>>,
    /// What this agent moved ([`Agent::stats`]).
    pub(crate) stats: Arc<Stats>,
    /// What peers moved through this agent ([`Agent::served`]).
    pub(crate) served: crate::target_stats::Served,
    /// The libfabric endpoint, or why this agent does not offer fabric.
    pub(crate) fabric: Result<Arc<FabricNode>>,
    /// The rails of outbound peer connections ([`Agent::rails`]): peer name, address, rails
    /// (gone once the peer is dropped).
    pub(crate) rails: Mutex<Vec<(String, String, std::sync::Weak<crate::rails::Rails>)>>,
    /// This process's CUDA, once known ([`Agent::use_cuda`], or the first
    /// [`Agent::register_gpu`]): with it a host region reaches a same-host peer's GPU memory
    /// through that memory's IPC handle, page-locked and copied once, instead of staged.
    pub(crate) cuda: Arc<OnceLock<LocalPeer>>,
    /// The cluster this agent proves it belongs to ([`Agent::set_cluster`]; empty: none).
    pub(crate) cluster: Mutex<String>,
}

impl crate::transport::AgentView for AgentInner {
    fn registry(&self) -> &Registry {
        &self.registry
    }
    fn config(&self) -> &AgentConfig {
        &self.cfg
    }
    fn hits(&self) -> &LimitHits {
        &self.hits
    }
    fn served(&self) -> &crate::target_stats::Served {
        &self.served
    }
    fn deliver(&self, n: Notification) -> Result<()> {
        self.notifications
            .push(n, self.cfg.io_timeout / 2, &self.hits)
    }
    fn shutting_down(&self) -> bool {
        self.shutdown.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// The inbound sockets open now, so that dropping the agent can shut them down.
#[derive(Debug)]
pub(crate) struct Conns {
    open: Mutex<HashMap<u64, Sock>>,
    next: AtomicU64,
}

impl Default for Conns {
    fn default() -> Self {
        Conns {
            open: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
        }
    }
}

impl Conns {
    /// Shuts every tracked socket down and forgets it.
    pub(crate) fn shutdown_all(&self) {
        for (_, s) in self.open.lock().unwrap_or_else(|p| p.into_inner()).drain() {
            s.shutdown();
        }
    }
}

impl AgentInner {
    /// Remembers an inbound socket so that dropping the agent can shut it down.
    pub(crate) fn track(&self, s: Sock) -> u64 {
        let id = self.conns.next.fetch_add(1, Ordering::Relaxed);
        self.conns
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, s);
        id
    }

    /// Forgets socket `id` (its connection ended).
    pub(crate) fn untrack(&self, id: u64) {
        self.conns
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
    }

    /// The transports this agent offers in its `Hello`: the configured ones, less rdma when no
    /// RDMA device port opened.
    pub(crate) fn offered(&self) -> u32 {
        let mut t = self.cfg.transports;
        t.rdma &= self.rdma.is_ok();
        t.fabric &= self.fabric.is_ok();
        // An shm target of this build understands the cma frames (it may still decline them).
        let cma = if t.shm {
            crate::transport::shm::CMA_FRAMES_BIT
        } else {
            0
        };
        // Its data streams understand the batch frames.
        t.bits() | cma | crate::transport::tcp::TCP_BATCH_BIT
    }

    /// The session `session`, if it exists.
    pub(crate) fn session(&self, session: u128) -> Option<Session> {
        let s = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        s.get(&session).cloned()
    }
}
