//! [`ClusterAgent`]: an engine [`Agent`] registered in a cluster, that connects to peers by
//! name and drops them when their lease goes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use gdx_engine::{Agent, Peer, RegionDesc, Transfer, TransferHandle, TransferReport};

use crate::error::{ClusterError, Result};
use crate::etcd::EtcdOptions;
use crate::metrics::Health;
use crate::record::{check_name, AgentRecord, RegionRecord};
use crate::registration::{LeaseState, Published, Registration};
use crate::view::{AgentEvent, ClusterView};

/// The reason in-flight transfers fail with when their peer's lease ends.
pub const LEASE_EXPIRED: &str = "lease expired";

/// How an agent joins a cluster.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// How to reach etcd.
    pub etcd: EtcdOptions,
    /// Cluster name (the `/gdx/<cluster>/` prefix).
    pub cluster: String,
    /// Lease TTL in seconds (default 10): a crashed agent's keys go this long after its last
    /// keep-alive.
    pub ttl_s: i64,
    /// Run without registration when etcd is unreachable at start, instead of failing.
    pub optional: bool,
    /// GPUs to list in the agent record (free text, e.g. "0: NVIDIA H200").
    pub gpus: Vec<String>,
    /// NICs to list in the agent record.
    pub nics: Vec<String>,
}

impl ClusterConfig {
    /// Defaults: TTL 10 s, etcd required, no GPUs or NICs listed.
    pub fn new(etcd: EtcdOptions, cluster: impl Into<String>) -> ClusterConfig {
        ClusterConfig {
            etcd,
            cluster: cluster.into(),
            ttl_s: 10,
            optional: false,
            gpus: Vec::new(),
            nics: Vec::new(),
        }
    }
}

#[derive(Debug)]
struct NamedInner {
    name: String,
    instance: String,
    peer: Peer,
    /// Set (before the engine peer is closed) when the peer's lease ended or it was replaced.
    lost: Mutex<Option<String>>,
    descs: Mutex<HashMap<String, RegionDesc>>,
}

impl NamedInner {
    fn lose(&self, reason: &str) {
        {
            let mut l = self.lost.lock().unwrap_or_else(|p| p.into_inner());
            if l.is_some() {
                return;
            }
            *l = Some(reason.to_string());
        }
        // Stale descriptors must not outlive the instance they name.
        self.descs.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.peer.close();
    }

    fn lost(&self) -> Option<String> {
        self.lost.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A peer connected by name: the engine [`Peer`] plus the instance etcd listed for it.
/// When that instance's lease ends, running transfers fail with
/// `PeerLost("lease expired ...")`, cached descriptors are dropped and new submits are refused.
#[derive(Debug, Clone)]
pub struct NamedPeer {
    inner: Arc<NamedInner>,
}

/// A transfer to a [`NamedPeer`]; its failure says when the peer's lease ended.
#[derive(Debug, Clone)]
pub struct NamedTransfer {
    handle: TransferHandle,
    peer: Arc<NamedInner>,
}

impl NamedTransfer {
    /// The engine handle (status, bytes done, per-op results).
    pub fn handle(&self) -> &TransferHandle {
        &self.handle
    }

    /// Waits up to `timeout`; a failure caused by the peer's lease ending is
    /// `Error::PeerLost` whose reason starts `lease expired: `.
    ///
    /// # Errors
    /// As [`TransferHandle::wait`].
    pub fn wait(&self, timeout: Duration) -> gdx_engine::Result<TransferReport> {
        match self.handle.wait(timeout) {
            Err(gdx_engine::Error::PeerLost { reason, errno }) => match self.peer.lost() {
                Some(r) => Err(gdx_engine::Error::PeerLost {
                    reason: format!("{r} ({reason})"),
                    errno,
                }),
                None => Err(gdx_engine::Error::PeerLost { reason, errno }),
            },
            r => r,
        }
    }
}

impl NamedPeer {
    /// The agent name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The instance id etcd listed and the handshake confirmed.
    pub fn instance(&self) -> &str {
        &self.inner.instance
    }

    /// The engine peer.
    pub fn peer(&self) -> &Peer {
        &self.inner.peer
    }

    /// Why this peer is gone (`lease expired ...`), if it is.
    pub fn lost(&self) -> Option<String> {
        self.inner.lost()
    }

    fn check(&self) -> gdx_engine::Result<()> {
        match self.inner.lost() {
            Some(r) => Err(gdx_engine::Error::peer_lost(format!(
                "{r}: agent {} instance {}",
                self.inner.name, self.inner.instance
            ))),
            None => Ok(()),
        }
    }

    /// The keyed descriptor of region `name`, fetched over the authenticated session (etcd
    /// holds only the keyless form) and cached until the peer's lease ends.
    ///
    /// # Errors
    /// `PeerLost` once the lease ended; as [`Peer::region`].
    pub fn region(&self, name: &str) -> gdx_engine::Result<RegionDesc> {
        self.check()?;
        if let Some(d) = self
            .inner
            .descs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
        {
            return Ok(d.clone());
        }
        let d = self.inner.peer.region(name)?;
        self.inner
            .descs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string(), d.clone());
        Ok(d)
    }

    /// Submits `t` to the peer.
    ///
    /// # Errors
    /// `PeerLost` once the lease ended; as [`Peer::submit`].
    pub fn submit(&self, t: Transfer) -> gdx_engine::Result<NamedTransfer> {
        self.check()?;
        let handle = self.inner.peer.submit(t)?;
        Ok(NamedTransfer {
            handle,
            peer: Arc::clone(&self.inner),
        })
    }
}

type Book = Mutex<HashMap<String, Vec<Weak<NamedInner>>>>;

/// An [`Agent`] published in a cluster (see the crate docs).
#[derive(Debug)]
pub struct ClusterAgent {
    agent: Arc<Agent>,
    /// `None` only when etcd was unreachable at start and the config made it optional.
    view: Option<ClusterView>,
    reg: Option<Registration>,
    disabled: Option<String>,
    book: Arc<Book>,
    stop: Arc<AtomicBool>,
}

fn hex(v: u128) -> String {
    format!("{v:032x}")
}

fn transports(agent: &Agent) -> Vec<String> {
    let t = agent.config().transports;
    let mut v = Vec::new();
    if t.tcp {
        v.push("tcp".to_string());
    }
    if t.shm {
        v.push("shm".to_string());
    }
    if t.rdma && agent.rdma_status().is_ok() {
        v.push("rdma".to_string());
    }
    v
}

fn regions_of(agent: &Agent) -> Vec<RegionRecord> {
    let mut v: Vec<RegionRecord> = agent
        .published()
        .iter()
        .filter_map(RegionRecord::from_desc)
        .collect();
    v.sort_by(|a, b| a.name.cmp(&b.name));
    v
}

impl ClusterAgent {
    /// Publishes `agent` (it must listen) and its named regions under its name, on a lease kept
    /// alive, and starts watching the cluster for leaves.
    ///
    /// # Errors
    /// [`ClusterError::NameTaken`] naming the holder; [`ClusterError::Unreachable`] unless
    /// `cfg.optional`; [`ClusterError::InvalidArgument`] for an agent without a listener or a
    /// bad name.
    pub fn join(agent: impl Into<Arc<Agent>>, cfg: ClusterConfig) -> Result<ClusterAgent> {
        let agent: Arc<Agent> = agent.into();
        check_name("agent name", agent.name())?;
        check_name("cluster name", &cfg.cluster)?;
        // Proved in every handshake from now on: a caller asking for an agent of this cluster
        // is never served by a namesake of another one holding the same secret.
        agent.set_cluster(&cfg.cluster);
        let listen = agent.listen_addr().ok_or_else(|| {
            ClusterError::InvalidArgument(
                "a cluster agent must listen (AgentConfig::listen)".into(),
            )
        })?;
        if cfg.ttl_s < 1 {
            return Err(ClusterError::InvalidArgument(
                "lease TTL must be >= 1 s".into(),
            ));
        }
        let view = match ClusterView::connect(&cfg.etcd, &cfg.cluster) {
            Ok(v) => v,
            Err(e @ ClusterError::Unreachable { .. }) if cfg.optional => {
                log::warn!("gdx cluster: {e}; running without registration (etcd optional)");
                return Ok(ClusterAgent {
                    agent,
                    view: None,
                    reg: None,
                    disabled: Some(e.to_string()),
                    book: Arc::default(),
                    stop: Arc::new(AtomicBool::new(true)),
                });
            }
            Err(e) => return Err(e),
        };
        let record = AgentRecord {
            name: agent.name().to_string(),
            instance: hex(agent.id()),
            host_id: hex(agent.host_id()),
            hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|s| s.trim().to_string())
                .unwrap_or_default(),
            listen: listen.to_string(),
            transports: transports(&agent),
            gpus: cfg.gpus.clone(),
            nics: cfg.nics.clone(),
            pid: std::process::id(),
            ttl_s: cfg.ttl_s,
        };
        let p = Published {
            agent: record,
            regions: regions_of(&agent),
        };
        let reg = Registration::start(&view.etcd, &view.keys, &cfg.cluster, p, cfg.ttl_s)?;
        let book: Arc<Book> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let rx = view.watch();
        let (b, s) = (Arc::clone(&book), Arc::clone(&stop));
        std::thread::Builder::new()
            .name("gdx-cluster-watch".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    match rx.recv_timeout(Duration::from_millis(200)) {
                        Ok(ev) => on_event(&b, &ev),
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                }
            })
            .map_err(|e| ClusterError::io("spawning the cluster watch thread", e))?;
        Ok(ClusterAgent {
            agent,
            view: Some(view),
            reg: Some(reg),
            disabled: None,
            book,
            stop,
        })
    }

    /// The engine agent.
    pub fn agent(&self) -> &Agent {
        &self.agent
    }

    /// What `/health` and `/metrics` read: the agent's counters and this registration.
    pub fn health(&self) -> Health {
        Health {
            agent: Arc::clone(&self.agent),
            reg: self.reg.as_ref().map(|r| Arc::clone(&r.shared)),
            disabled: self.disabled.clone(),
        }
    }

    /// The read side of the cluster (`None` when running without etcd, see
    /// [`ClusterConfig::optional`]).
    pub fn view(&self) -> Option<&ClusterView> {
        self.view.as_ref()
    }

    fn view_or_err(&self) -> Result<&ClusterView> {
        self.view.as_ref().ok_or_else(|| {
            ClusterError::InvalidArgument(format!(
                "no cluster: {}",
                self.disabled.as_deref().unwrap_or("not joined")
            ))
        })
    }

    /// This start's instance id.
    pub fn instance(&self) -> String {
        hex(self.agent.id())
    }

    /// Where the registration stands (for `/health`).
    pub fn lease_state(&self) -> LeaseState {
        match (&self.reg, &self.disabled) {
            (Some(r), _) => r.shared.state(),
            (None, Some(why)) => LeaseState::Disabled {
                reason: why.clone(),
            },
            (None, None) => LeaseState::Left,
        }
    }

    /// Re-publishes the agent's named regions (call after registering or dropping regions).
    ///
    /// # Errors
    /// [`ClusterError::Unreachable`] if etcd does not answer (the set is still remembered for
    /// re-registration).
    pub fn publish(&self) -> Result<()> {
        match &self.reg {
            Some(r) => r.set_regions(regions_of(&self.agent)),
            None => Ok(()),
        }
    }

    /// Looks `name` up in etcd, connects to the address it published, and checks that the
    /// peer's handshake names the instance etcd lists.
    ///
    /// # Errors
    /// [`ClusterError::NoSuchAgent`]; [`ClusterError::InstanceMismatch`]; engine errors of
    /// [`Agent::connect`].
    pub fn connect_named(&self, name: &str) -> Result<NamedPeer> {
        let view = self.view_or_err()?;
        let rec = view.lookup(name)?;
        // The handshake's authenticated name (and instance) must be the record's: a record
        // rewritten to point at another agent fails here, naming the agent reached.
        let expect = gdx_engine::Expected {
            name: name.to_string(),
            agent_id: u128::from_str_radix(&rec.instance, 16).ok(),
            cluster: Some(view.cluster().to_string()),
        };
        let peer = self.agent.connect_expecting(rec.listen.as_str(), &expect)?;
        let found = hex(peer.info().agent_id);
        if found != rec.instance {
            peer.close();
            return Err(ClusterError::InstanceMismatch {
                name: name.to_string(),
                addr: rec.listen,
                expected: rec.instance,
                found,
            });
        }
        let inner = Arc::new(NamedInner {
            name: name.to_string(),
            instance: rec.instance,
            peer,
            lost: Mutex::new(None),
            descs: Mutex::new(HashMap::new()),
        });
        {
            let mut b = self.book.lock().unwrap_or_else(|p| p.into_inner());
            let v = b.entry(name.to_string()).or_default();
            v.retain(|w| w.strong_count() > 0);
            v.push(Arc::downgrade(&inner));
        }
        // The lease may have ended between the lookup and now, before the watch saw this peer.
        if let Err(ClusterError::NoSuchAgent { .. }) = view.lookup(name) {
            inner.lose(LEASE_EXPIRED);
        }
        Ok(NamedPeer { inner })
    }

    /// Revokes the lease now (the agent's keys go at once) and stops watching.
    ///
    /// # Errors
    /// [`ClusterError::Unreachable`] if etcd does not answer; the lease then expires by itself.
    pub fn leave(mut self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        match self.reg.take() {
            Some(r) => r.leave(),
            None => Ok(()),
        }
    }
}

fn on_event(book: &Book, ev: &AgentEvent) {
    // `only`: the instance the event is about (a leave of instance X must not drop a peer
    // connected to a newer instance Y); `keep`: the instance that stays (a join).
    let (name, why, only, keep): (&str, String, Option<&str>, Option<&str>) = match ev {
        AgentEvent::Left { name, instance } => {
            (name, LEASE_EXPIRED.to_string(), instance.as_deref(), None)
        }
        // A new instance under the name: the old one is gone even if we missed its leave.
        AgentEvent::Joined(rec) => (
            &rec.name,
            format!("{LEASE_EXPIRED}: replaced by instance {}", rec.instance),
            None,
            Some(&rec.instance),
        ),
        AgentEvent::EtcdLost(_) | AgentEvent::EtcdBack => return,
    };
    let peers: Vec<Arc<NamedInner>> = {
        let b = book.lock().unwrap_or_else(|p| p.into_inner());
        b.get(name)
            .map(|v| v.iter().filter_map(Weak::upgrade).collect())
            .unwrap_or_default()
    };
    for p in peers {
        let about = only.is_none_or(|i| i == p.instance);
        if about && keep != Some(p.instance.as_str()) {
            log::warn!(
                "gdx cluster: peer {name} (instance {}): {why}; dropping it",
                p.instance
            );
            p.lose(&why);
        }
    }
}

impl Drop for ClusterAgent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
