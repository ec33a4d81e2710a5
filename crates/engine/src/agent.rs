//! The [`Agent`]: one per process. Owns the region registry, the listeners that serve peers, the
//! inbound notification queue, and creates [`Peer`]s.
//!
//! Threads: one accept thread per listener (tcp, and an abstract unix socket for shm) and one thread
//! per inbound connection. Dropping the agent stops the listeners and shuts every inbound connection
//! down; outbound [`Peer`]s keep working until dropped.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::accepted::Queue;
use crate::admission::Gate;
use crate::agent_state::{AgentInner, Conns, PeerInfo};
use crate::auth::Secret;
use crate::config::{boot_host_id, AgentConfig};
use crate::error::{Error, Result};
use crate::gpu::{AgentGpu, DeviceOrigin, DeviceRegion, LocalPeer};
use crate::limits::LimitHits;
use crate::notifications::Notification;
use crate::notifications::NotificationQueue;
use crate::peer::Peer;
use crate::region::{Access, Region, RegionScope, Registry};
use crate::routing::path::Path;
use crate::stats::StatsSnapshot;
use crate::transport::fabric::FabricNode;
use crate::transport::rdma::RdmaNode;

/// One per process: registers memory, serves peers, connects to peers.
///
/// ```no_run
/// use gdx_engine::{Access, Agent, AgentConfig, Transfer};
/// use std::time::Duration;
/// let agent = Agent::new(AgentConfig::from_env()?)?;
/// let mut src = agent.alloc(1 << 20, Access::LOCAL, None)?;
/// src.bytes_mut()?.fill(7);
/// let peer = agent.connect("127.0.0.1:7447")?;
/// let dst = peer.region("serve")?;
/// let mut t = Transfer::new();
/// t.write(&src, 0, &dst, 0, 1 << 20).notify("ready");
/// let report = peer.submit(t)?.wait(Duration::from_secs(10))?;
/// println!("{} via {}", report.bytes, report.ops[0].plan);
/// # Ok::<(), gdx_engine::Error>(())
/// ```
#[derive(Debug)]
pub struct Agent {
    pub(crate) inner: Arc<AgentInner>,
}

impl Agent {
    /// Starts an agent: binds its listeners (if `cfg.listen` is set) and starts serving.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad config, [`Error::Os`] if a listener cannot be bound.
    pub fn new(cfg: AgentConfig) -> Result<Agent> {
        cfg.validate()?;
        // The transfer clock calibrates on its first read (about a millisecond, once per
        // process): here, not in the first transfer.
        crate::transfer::clock::warm();
        let secret = match (&cfg.secret, cfg.insecure) {
            (_, true) => {
                log::warn!(
                    "gdx: agent {:?} runs WITHOUT authentication (insecure): any client that \
                     connects gets every published region key",
                    cfg.name
                );
                None
            }
            (Some(s), false) => Some(s.clone()),
            (None, false) => Some(crate::auth::process_secret()?),
        };
        let id = crate::mem::random_u128()?;
        let host_id = cfg.host_id.unwrap_or_else(boot_host_id);
        let (tcp, listen_addr) = match cfg.listen {
            Some(addr) => {
                let l = TcpListener::bind(addr).map_err(|e| Error::os("bind", e))?;
                let a = l.local_addr().map_err(|e| Error::os("getsockname", e))?;
                (Some(l), Some(a))
            }
            None => (None, None),
        };
        let (unix, shm_name) = if cfg.transports.shm && tcp.is_some() {
            let name = format!("gdx-{id:032x}");
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
                .map_err(|e| Error::os("socket address", e))?;
            match UnixListener::bind_addr(&addr) {
                Ok(l) => (Some(l), Some(name)),
                Err(e) => {
                    log::warn!("shm listener unavailable, serving tcp only: {e}");
                    (None, None)
                }
            }
        } else {
            (None, None)
        };
        let rdma = if cfg.transports.rdma {
            RdmaNode::open().map(Arc::new)
        } else {
            Err(Error::unavailable(
                Path::Rdma,
                "rdma disabled on this agent (GDX_TRANSPORTS)".to_string(),
            ))
        };
        let fabric = if cfg.transports.fabric {
            FabricNode::open(cfg.fabric_provider.clone()).map(Arc::new)
        } else {
            Err(Error::unavailable(
                Path::Fabric,
                "fabric not enabled on this agent (GDX_TRANSPORTS does not name it)".to_string(),
            ))
        };
        let notifications = NotificationQueue::new(
            cfg.limits.max_queued_notifications,
            cfg.limits.max_queued_notification_bytes,
        );
        let inner = Arc::new(AgentInner {
            cfg,
            id,
            host_id,
            registry: Arc::new(Registry::default()),
            listen_addr,
            shm_name,
            sessions: Mutex::new(HashMap::new()),
            notifications,
            secret,
            gate: Arc::new(Gate::default()),
            hits: LimitHits::default(),
            accepted: Queue::default(),
            conns: Conns::default(),
            shutdown: AtomicBool::new(false),
            strict: AtomicBool::new(crate::routing::planner::strict_from_env()?),
            rdma,
            rdma_qps: Mutex::new(HashMap::new()),
            stats: Arc::default(),
            served: crate::target_stats::Served::default(),
            fabric,
            rails: Mutex::default(),
            cuda: Arc::new(OnceLock::new()),
            cluster: Mutex::default(),
        });
        if let Ok(node) = &inner.fabric {
            inner.registry.attach(Arc::clone(node) as _);
        }
        if let Ok(node) = &inner.rdma {
            inner.registry.attach(Arc::clone(node) as _);
        }
        if let Some(l) = tcp {
            let a = Arc::clone(&inner);
            std::thread::Builder::new()
                .name("gdx-accept".into())
                .spawn(move || crate::server::accept_tcp(a, l))
                .map_err(|e| Error::os("spawn", e))?;
        }
        if let Some(l) = unix {
            let a = Arc::clone(&inner);
            std::thread::Builder::new()
                .name("gdx-accept-shm".into())
                .spawn(move || crate::server::accept_unix(a, l))
                .map_err(|e| Error::os("spawn", e))?;
        }
        Ok(Agent { inner })
    }

    /// [`Agent::new`] with [`AgentConfig::from_env`].
    ///
    /// # Errors
    /// As [`AgentConfig::from_env`] and [`Agent::new`].
    pub fn from_env() -> Result<Agent> {
        Agent::new(AgentConfig::from_env()?)
    }

    /// The agent's name.
    pub fn name(&self) -> &str {
        &self.inner.cfg.name
    }

    /// The agent's random id.
    pub fn id(&self) -> u128 {
        self.inner.id
    }

    /// Sets the cluster this agent says, and proves in every handshake, it belongs to
    /// (`gdx_cluster::ClusterAgent::join` sets it): a peer that asks for an agent of cluster
    /// `c1` ([`Expected::cluster`](crate::Expected)) refuses a namesake of another cluster.
    pub fn set_cluster(&self, cluster: &str) {
        *self.inner.cluster.lock().unwrap_or_else(|p| p.into_inner()) = cluster.to_string();
    }

    /// The cluster set by [`Agent::set_cluster`] (empty: none).
    pub fn cluster(&self) -> String {
        self.inner
            .cluster
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The host id peers compare to decide on shared memory.
    pub fn host_id(&self) -> u128 {
        self.inner.host_id
    }

    /// The address peers connect to (with the real port when 0 was asked for).
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        self.inner.listen_addr
    }

    /// The configuration in force.
    pub fn config(&self) -> &AgentConfig {
        &self.inner.cfg
    }

    /// The secret this agent and its peers prove they hold (the configured one, or the one
    /// generated for this process); `None` in insecure mode.
    pub fn secret(&self) -> Option<&Secret> {
        self.inner.secret.as_ref()
    }

    /// What this agent moved as the initiator (bytes and ops by path and direction, failures
    /// by reason, transfer latency) and the peers connected now, for exporters.
    pub fn stats(&self) -> StatsSnapshot {
        let inbound = self
            .inner
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len() as u64;
        self.inner.stats.snapshot(inbound)
    }

    /// What peers moved into and out of this agent's regions, by peer, path and direction
    /// (tcp chunks and shm ops this agent served; one-sided rdma and fabric ops are not seen).
    pub fn served(&self) -> Vec<crate::ServedStat> {
        self.inner.served.snapshot()
    }

    /// The rails of each outbound peer connection alive now, by peer: ends, bytes, errors,
    /// state and cause (`/metrics`).
    pub fn rails(&self) -> Vec<crate::PeerRails> {
        let mut g = self.inner.rails.lock().unwrap_or_else(|p| p.into_inner());
        g.retain(|(_, _, r)| r.strong_count() > 0);
        g.iter()
            .filter_map(|(peer, addr, r)| {
                Some(crate::PeerRails {
                    peer: peer.clone(),
                    addr: addr.clone(),
                    rails: r.upgrade()?.snapshot(None),
                })
            })
            .collect()
    }

    /// How often each bound of [`crate::Limits`] was hit.
    pub fn limit_hits(&self) -> &LimitHits {
        &self.inner.hits
    }

    /// Allocates `len` zeroed bytes of host memory owned by the agent (memfd-backed, so a same-host
    /// peer can map it and copy once), registered with `access`, and published under `name` if given
    /// (peers find it with [`Peer::region`]).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for `len == 0` or a name in use; [`Error::Os`] if allocation fails.
    pub fn alloc(&self, len: u64, access: Access, name: Option<&str>) -> Result<Region<'static>> {
        let inner = self
            .inner
            .registry
            .alloc(len, access, name.map(str::to_string))?;
        Ok(Region::new(
            inner,
            Arc::clone(&self.inner.registry),
            self.inner.cfg.transfer_timeout,
        ))
    }

    /// Strict mode for ops with GPU memory on both ends: an op between two agents of one host
    /// that cannot take the `ipc` path, or one that would be staged through host memory to
    /// another host, fails with [`Error::Strict`] and the plan's reason instead of running.
    /// Starts as `GDX_STRICT` says.
    pub fn set_strict(&self, on: bool) {
        self.inner.strict.store(on, Ordering::Relaxed);
    }

    /// The RDMA device port this agent offers to peers ("mlx5_0 port 1 (Ethernet, GID index
    /// 3)"), or why it offers none ("no RDMA device: ...", "rdma disabled ...").
    ///
    /// # Errors
    /// Why rdma is not offered: [`Error::Unavailable`] when disabled, [`Error::Rdma`] with the
    /// verbs error as its source when no device port opened.
    pub fn rdma_status(&self) -> Result<String> {
        match &self.inner.rdma {
            Ok(n) => Ok(n.describe()),
            Err(e) => Err(e.clone()),
        }
    }

    /// The libfabric provider this agent offers to peers ("tcp;ofi_rxm on lo (127.0.0.1:..),
    /// ..."), or why it offers none.
    ///
    /// # Errors
    /// Why fabric is not offered: [`Error::Unavailable`] when not enabled, [`Error::Fabric`]
    /// when no provider opened.
    pub fn fabric_status(&self) -> Result<String> {
        match &self.inner.fabric {
            Ok(n) => Ok(n.describe()),
            Err(e) => Err(e.clone()),
        }
    }

    /// Live fabric registrations of this agent and fabric `fi_close` calls the provider
    /// refused; `None` without fabric. Regions' registrations close when they are removed.
    pub fn fabric_registrations(&self) -> Option<(usize, usize)> {
        self.inner.fabric.as_ref().ok().map(|n| n.registrations())
    }

    /// Whether strict mode is on (see [`Agent::set_strict`]).
    pub fn strict(&self) -> bool {
        self.inner.strict.load(Ordering::Relaxed)
    }

    /// Lets this agent use `gpu` (this process's CUDA) for host regions too: a host region then
    /// moves to and from a same-host peer's GPU memory that carries an IPC handle by mapping
    /// that memory once and copying on the copy engine from the region page-locked in place
    /// (`cuMemHostRegister`, once per region, undone when the region closes), the `ipc` path,
    /// instead of through the bounce buffer. The first [`Agent::register_gpu`] does the same;
    /// later calls keep the first peer. Connections made before the call see it too.
    pub fn use_cuda(&self, gpu: &LocalPeer) {
        self.inner.cuda.get_or_init(|| gpu.clone());
    }

    /// Registers GPU memory of `gpu` so that peers can write into it and read from it, published
    /// under `name` if given. Its descriptor says `Location::Gpu(n)` and carries the CUDA IPC
    /// handle of the allocation holding it (memory gdx allocated, and a caller's `cudaMalloc`
    /// memory such as a torch, CuPy or JAX tensor or a view into one, with its offset): a
    /// same-host peer whose own region is GPU memory then copies GPU to GPU (`ipc`), with no
    /// host copy, mapping each allocation once. Memory no handle can name (stream-ordered pool
    /// memory, VMM mappings) carries the reason instead, which the peer's plan shows. Other
    /// peers reach it through pinned bounce buffers on both ends (`tcp-staged`, or
    /// `shm-staged` on one host). The region keeps the memory alive; it has no host view
    /// ([`Region::bytes`] refuses), copy with `gpu` instead.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a name already in use; [`Error::Cuda`] if the IPC handle
    /// of an allocated region cannot be made.
    pub fn register_gpu(
        &self,
        gpu: &LocalPeer,
        region: &DeviceRegion,
        access: Access,
        name: Option<&str>,
    ) -> Result<Region<'static>> {
        // Memory gdx allocated always exports; a caller's memory (a torch, CuPy or JAX
        // tensor) exports the handle of the allocation holding it where the driver allows one,
        // and otherwise the region says why, for the peer's plan.
        let (ipc, no_ipc) = match region.origin() {
            DeviceOrigin::Allocated | DeviceOrigin::Shareable => {
                (Some(gpu.export_ipc(region)?), None)
            }
            DeviceOrigin::Foreign | DeviceOrigin::Pool => match gpu.export_ipc(region) {
                Ok(d) => (Some(d), None),
                Err(e) => {
                    log::info!(
                        "GPU region {} has no IPC handle, same-host peers stage it: {e}",
                        region.id()
                    );
                    (None, Some(e.to_string()))
                }
            },
            other => (
                None,
                Some(format!(
                    "it is {other:?} memory, mapped from another process"
                )),
            ),
        };
        self.inner.cuda.get_or_init(|| gpu.clone());
        let dev = AgentGpu {
            region: region.clone(),
            peer: gpu.clone(),
            ipc,
            no_ipc,
        };
        let inner = self
            .inner
            .registry
            .register_device(dev, access, name.map(str::to_string))?;
        Ok(Region::new(
            inner,
            Arc::clone(&self.inner.registry),
            self.inner.cfg.transfer_timeout,
        ))
    }

    /// Registers `len` bytes of caller-owned host memory at `ptr` with `access`, published under
    /// `name` if given, with no lifetime tying it to a scope: for bindings (the Python package)
    /// whose buffers are kept alive by a foreign runtime rather than by a Rust borrow. Prefer
    /// [`Agent::scope`], which needs no `unsafe`. Dropping the region deregisters it and waits
    /// for running remote accesses; only then may the memory go.
    ///
    /// # Safety
    /// - `ptr..ptr + len` stays valid (allocated, not moved or unmapped) until the returned
    ///   region is dropped.
    /// - No Rust reference to that memory exists while the region lives; foreign code (the
    ///   binding's users) may touch the bytes, racing only with the transfers it started.
    /// - If the memory is not writable, the region is never the destination of a transfer
    ///   (registered without remote write and never used as the local end of a read).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for `len == 0` or a name already in use.
    pub unsafe fn register_raw(
        &self,
        ptr: *mut u8,
        len: u64,
        access: Access,
        name: Option<&str>,
    ) -> Result<Region<'static>> {
        // SAFETY: the caller upholds validity and aliasing until the region is dropped, and
        // dropping a region retires it (waits for running leases) before returning.
        let inner = unsafe {
            self.inner
                .registry
                .register_raw(ptr, len, access, name.map(str::to_string))?
        };
        Ok(Region::new(
            inner,
            Arc::clone(&self.inner.registry),
            self.inner.cfg.transfer_timeout,
        ))
    }

    /// Runs `f` with a [`RegionScope`] in which caller-owned buffers can be registered. Every region
    /// registered in the scope is deregistered (waiting for running remote accesses) before `scope`
    /// returns, so the buffers are never touched after their borrow ends.
    ///
    /// ```no_run
    /// # use gdx_engine::{Access, Agent};
    /// # let agent = Agent::from_env()?;
    /// let mut buf = vec![0u8; 4096];
    /// agent.scope(|s| -> gdx_engine::Result<()> {
    ///     let r = s.register(&mut buf, Access::READ_WRITE, Some("kv"))?;
    ///     println!("{}", r.desc());
    ///     Ok(())
    /// })?;
    /// # Ok::<(), gdx_engine::Error>(())
    /// ```
    pub fn scope<'env, F, T>(&self, f: F) -> T
    where
        F: for<'scope> FnOnce(&'scope RegionScope<'scope, 'env>) -> T,
    {
        struct End<'a, 'b, 'c>(&'a RegionScope<'b, 'c>);
        impl Drop for End<'_, '_, '_> {
            fn drop(&mut self) {
                self.0.end();
            }
        }
        let scope = RegionScope {
            registry: Arc::clone(&self.inner.registry),
            timeout: self.inner.cfg.transfer_timeout,
            regions: Mutex::new(Vec::new()),
            _scope: PhantomData,
            _env: PhantomData,
        };
        let _end = End(&scope);
        f(&scope)
    }

    /// The descriptors of the regions this agent publishes by name.
    pub fn published(&self) -> Vec<crate::RegionDesc> {
        self.inner.registry.published()
    }

    /// Connects to the agent at `addr` and performs the handshake; picks shm for a same-host peer and
    /// tcp otherwise ([`Peer::route`] says which and why).
    ///
    /// # Errors
    /// [`Error::Unreachable`] if nothing answers at `addr` (refused, no route, timed out);
    /// [`Error::PeerLost`] if the connection breaks during the handshake.
    pub fn connect(&self, addr: impl ToSocketAddrs) -> Result<Peer> {
        self.connect_to(addr, None)
    }

    /// [`Agent::connect`] to a peer that must be the agent `expect` names (and, when given,
    /// that instance): the name and instance id come from the authenticated handshake, bound to
    /// the session key, so an address that points elsewhere (a rewritten etcd record) fails.
    ///
    /// # Errors
    /// As [`Agent::connect`]; [`Error::AuthFailed`] naming the agent reached when it is another.
    pub fn connect_expecting(
        &self,
        addr: impl ToSocketAddrs,
        expect: &crate::peer::Expected,
    ) -> Result<Peer> {
        self.connect_to(addr, Some(expect.clone()))
    }

    fn connect_to(
        &self,
        addr: impl ToSocketAddrs,
        expect: Option<crate::peer::Expected>,
    ) -> Result<Peer> {
        let addrs: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| Error::InvalidArgument(format!("address: {e}")))?
            .collect();
        let mut last = Error::InvalidArgument("address resolves to nothing".into());
        for a in addrs {
            // A target under a flood of silent connections evicts pending handshakes, and ours
            // can be caught before its first frame is read (closed, nothing agreed yet): such a
            // handshake is tried again, twice at most.
            let mut tries = 0;
            loop {
                match TcpStream::connect_timeout(&a, self.inner.cfg.io_timeout) {
                    Ok(s) => match Peer::handshake(Arc::clone(&self.inner), s, a, expect.clone()) {
                        Err(Error::PeerLost { reason: why, .. }) if tries < 2 => {
                            log::info!("gdx: handshake with {a} cut ({why}); trying again");
                            tries += 1;
                        }
                        other => return other,
                    },
                    Err(e) => {
                        last = Error::Unreachable {
                            addr: a.to_string(),
                            why: e.to_string(),
                        };
                        break;
                    }
                }
            }
        }
        Err(last)
    }

    /// Waits up to `timeout` for the next notification from any peer.
    ///
    /// # Errors
    /// [`Error::Timeout`] if none arrives in time.
    pub fn wait_notification(&self, timeout: Duration) -> Result<Notification> {
        self.inner.notifications.pop(timeout)
    }

    /// The next notification if one is queued.
    pub fn try_notification(&self) -> Option<Notification> {
        self.inner.notifications.try_pop()
    }

    /// Waits up to `timeout` for the next peer to connect in, and says who it is.
    ///
    /// # Errors
    /// [`Error::Timeout`] if no peer connects in time.
    pub fn accept(&self, timeout: Duration) -> Result<PeerInfo> {
        self.inner.accepted.pop(timeout)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.inner.shutdown.store(true, Ordering::SeqCst);
        // Wake the accept threads: they check the flag after every accept.
        if let Some(a) = self.inner.listen_addr {
            let wake = if a.ip().is_unspecified() {
                SocketAddr::from(([127, 0, 0, 1], a.port()))
            } else {
                a
            };
            let _ = TcpStream::connect_timeout(&wake, Duration::from_millis(200));
        }
        if let Some(n) = &self.inner.shm_name {
            if let Ok(addr) = std::os::unix::net::SocketAddr::from_abstract_name(n.as_bytes()) {
                let _ = std::os::unix::net::UnixStream::connect_addr(&addr);
            }
        }
        self.inner.conns.shutdown_all();
    }
}
