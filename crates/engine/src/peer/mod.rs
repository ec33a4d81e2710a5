//! [`Peer`]: a connection to a remote agent, made by [`crate::Agent::connect`].
//!
//! The handshake exchanges `Hello` frames (agent name and id, host id, transports, shm socket, listen
//! address); the acceptor's reply carries a session id and a random token that every further
//! connection of this peer (tcp data streams, the shm socket) must present. The route (shm or tcp) is
//! fixed here and reported by [`Peer::route`].

use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};

use crate::agent_state::{AgentInner, PeerInfo};
use crate::config::Transports;
use crate::conn::{Conn, Sock};
use crate::error::{AuthFailure, Error, Result};
use crate::rails::Rails;
use crate::region::RegionDesc;
use crate::routing::plan::{CmaGrant, FabricMem, Path, PeerRoute};
use crate::transfer::{NewTransfer, Transfer, TransferHandle, XferShared, XferState};
use crate::transport::tcp::{Joiner, RailEnd, TcpTransport};
use crate::transport::{fabric, rdma, shm::ShmTransport, Transport};
use crate::wire::{Hello, Msg};

mod identity;
mod plans;
mod prepared;

use crate::routing::cache::PlanCache;
pub use identity::Expected;
pub use prepared::PreparedTransfer;

#[derive(Debug)]
struct PeerInner {
    agent: Arc<AgentInner>,
    addr: SocketAddr,
    /// The agent this peer must be (kept for reconnects).
    expect: Option<Expected>,
    info: PeerInfo,
    route: PeerRoute,
    tcp_detail: String,
    /// What the fabric route can do with GPU memory (default on other routes).
    fabric: FabricMem,
    /// Whether ops to the peer's borrowed host regions may take the `cma` path (shm routes).
    cma: CmaGrant,
    control: Arc<Mutex<Conn>>,
    transport: Box<dyn Transport>,
    /// Plans made lately, by region pair (`PlanCache`).
    plans: Mutex<PlanCache>,
    /// Given to each transfer (the agent's counters, the transport's driver).
    xfer_shared: Arc<XferShared>,
}

impl Drop for PeerInner {
    fn drop(&mut self) {
        // The spare states hold the peer's shared part, which holds them: let them go.
        self.xfer_shared.spares.close();
        self.agent
            .stats
            .peers_outbound
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        if let Ok(mut c) = self.control.lock() {
            let _ = c.send(&Msg::Bye);
        }
    }
}

/// A connected remote agent. Cheap to clone; the connection closes when the last clone drops
/// (transfers already submitted still run to completion).
#[derive(Debug, Clone)]
pub struct Peer {
    inner: Arc<PeerInner>,
}

/// Why a transport's route was not taken: text for the chosen route's [`PeerRoute::reason`]
/// (a route not taken is not an error; the connection goes on over another).
struct WhyNot(String);

impl std::fmt::Display for WhyNot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The rdma route when both agents offer it and the queue pairs connect; otherwise why not.
fn rdma_route(
    agent: &Arc<AgentInner>,
    info: &PeerInfo,
    control: &Arc<Mutex<Conn>>,
    why_not_shm: &str,
) -> std::result::Result<(PeerRoute, Box<dyn Transport>), WhyNot> {
    let node = agent
        .rdma
        .as_ref()
        .map_err(|why| WhyNot(format!("not offered here ({why})")))?;
    if !info.transports.rdma {
        return Err(WhyNot(
            "the peer offers none (no RDMA device there, or disabled)".into(),
        ));
    }
    // The rails: the devices `nics` names, in order; without a list, every device whose port
    // is active (the default device first).
    let chosen = !agent.cfg.nics.is_empty();
    let mut eps: Vec<usize> = if chosen {
        agent
            .cfg
            .nics
            .iter()
            .filter_map(|n| node.endpoint(n))
            .collect()
    } else {
        node.active_endpoints()
    };
    eps.dedup();
    if eps.is_empty() {
        eps.push(0);
    }
    let rails = rdma::connect_rails(
        node,
        &eps,
        &mut control.lock().unwrap_or_else(|p| p.into_inner()),
    )
    .map_err(|e| {
        WhyNot(format!(
            "offered by both, but the queue pairs did not connect: {e}"
        ))
    })?;
    let on = if rails.len() > 1 {
        let each: Vec<String> = rails
            .iter()
            .map(|(ep, _, remote)| format!("{} -> {remote}", node.device(*ep)))
            .collect();
        format!(
            "{} rails ({}; {}; ops from {} KiB striped by measured throughput, failover between \
             them)",
            rails.len(),
            each.join(", "),
            if chosen {
                "the devices GDX_NICS / nics names"
            } else {
                "every device with an active port: GDX_NICS / nics picks others"
            },
            crate::transport::tcp::SPLIT_BYTES >> 10
        )
    } else {
        node.describe()
    };
    let t = rdma::spawn(
        Arc::clone(node),
        rails,
        Arc::clone(control),
        agent.cfg.io_timeout,
    )
    .map_err(|e| WhyNot(e.to_string()))?;
    let reason = format!(
        "rdma: {}; both agents offer RDMA; RC queue pairs on {on}",
        why_not_shm.trim_start_matches("tcp: "),
    );
    Ok((
        PeerRoute {
            transport: Path::Rdma,
            reason,
        },
        Box::new(t),
    ))
}

/// The fabric route when both agents offer it and the addresses are exchanged; otherwise why
/// not.
fn fabric_route(
    agent: &Arc<AgentInner>,
    info: &PeerInfo,
    control: &Arc<Mutex<Conn>>,
    why_not: &str,
) -> std::result::Result<(PeerRoute, Box<dyn Transport>), WhyNot> {
    let node = agent
        .fabric
        .as_ref()
        .map_err(|why| WhyNot(format!("not offered here ({why})")))?;
    if !info.transports.fabric {
        return Err(WhyNot(
            "the peer offers none (no libfabric provider there, or not enabled)".into(),
        ));
    }
    let peer = node
        .connect(&mut control.lock().unwrap_or_else(|p| p.into_inner()))
        .map_err(|e| {
            WhyNot(format!(
                "offered by both, but the address exchange failed: {e}"
            ))
        })?;
    let t = fabric::spawn(
        Arc::clone(node),
        peer,
        Arc::clone(control),
        agent.cfg.io_timeout,
    )
    .map_err(|e| WhyNot(e.to_string()))?;
    let reason = format!(
        "fabric: {}; both agents offer libfabric; {}",
        why_not.trim_start_matches("tcp: "),
        node.describe()
    );
    Ok((
        PeerRoute {
            transport: Path::Fabric,
            reason,
        },
        Box::new(t),
    ))
}

/// The tcp route's transport: `cfg.tcp_streams` data streams per rail (the tcp rails of
/// `cfg.nics`, or one rail wherever the kernel routes), joined to the session; with the
/// detail plans give as their reason (streams, chunk size, rails).
fn tcp_transport(
    agent: &AgentInner,
    h: &Hello,
    key: Option<crate::auth::Mac>,
    addr: SocketAddr,
    control: &Arc<Mutex<Conn>>,
    until: std::time::Instant,
) -> Result<(TcpTransport, String)> {
    let cfg = &agent.cfg;
    let named: Vec<_> = cfg
        .nics
        .iter()
        .filter_map(|n| crate::config::tcp_rail(n, addr))
        .collect();
    let ignored: Vec<&str> = cfg
        .nics
        .iter()
        .filter(|n| crate::config::tcp_rail(n, addr).is_none())
        .map(String::as_str)
        .collect();
    let ends: Vec<RailEnd> = if named.is_empty() {
        vec![RailEnd {
            bind: None,
            to: addr,
        }]
    } else {
        named
            .iter()
            .map(|&(ip, to)| RailEnd { bind: Some(ip), to })
            .collect()
    };
    let joiner = Joiner {
        session: h.session,
        token: h.token,
        key,
        ends,
        io_timeout: cfg.io_timeout,
        handshake_timeout: cfg.limits.handshake_timeout,
    };
    let mut streams = Vec::new();
    let mut labels = Vec::new();
    for (r, end) in joiner.ends.iter().enumerate() {
        let mut local = end.bind.map(|b| b.to_string());
        for _ in 0..cfg.tcp_streams {
            let i = streams.len() as u16;
            // A target under a flood of silent connections evicts pending handshakes (oldest,
            // silent first); one of ours can be caught in that before its first frame is read.
            // That is a closed connection before the session took the stream: join again, a
            // few times, within the connect's deadline.
            let mut tries = 0;
            let c = loop {
                match joiner.join(r, i, until) {
                    Err(Error::PeerLost { .. })
                        if tries < 3 && std::time::Instant::now() < until =>
                    {
                        tries += 1
                    }
                    other => break other?,
                }
            };
            if local.is_none() {
                local = c.local_addr().map(|a| a.ip().to_string());
            }
            streams.push((r, c));
        }
        labels.push((
            local.unwrap_or_else(|| "default".into()),
            end.to.to_string(),
        ));
    }
    let stream_rails = streams.iter().map(|(r, _)| *r).collect();
    let rails = Arc::new(Rails::new(labels, stream_rails));
    let mut detail = format!(
        "{} stream(s) per rail, chunks of up to {} KiB; rails: {}",
        cfg.tcp_streams,
        cfg.chunk_bytes / 1024,
        rails
            .snapshot(None)
            .iter()
            .map(|r| format!("{} -> {}", r.local, r.remote))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if rails.len() > 1 {
        detail.push_str(&format!(
            " (transfers from {} KiB striped by measured throughput, failover between them)",
            crate::transport::tcp::SPLIT_BYTES >> 10
        ));
    }
    if !ignored.is_empty() {
        detail.push_str(&format!(
            "; nics {} name no local address, not used by tcp",
            ignored.join(",")
        ));
    }
    let t = TcpTransport::new(
        streams,
        rails,
        joiner,
        Arc::clone(control),
        cfg.chunk_bytes,
        cfg.io_timeout,
        h.transports & crate::transport::tcp::TCP_BATCH_BIT != 0,
    )?;
    Ok((t, detail))
}

/// The initiator's side of the control handshake: sends `hello`, runs the SPAKE2 exchange and
/// proves it holds the key, and returns the peer's `Hello` with the session key (`None` in
/// insecure mode); the peer's own proof is its identity tag (`identity::check`). Each side
/// refuses a peer whose mode differs from its own: no silent downgrade to an unauthenticated
/// session.
fn authenticate(
    agent: &AgentInner,
    control: &mut Conn,
    hello: &Msg,
    nonce: u128,
    addr: SocketAddr,
) -> Result<(Hello, Option<crate::auth::Mac>)> {
    control.send(hello)?;
    let key = match (control.recv_frame(false)?, &agent.secret) {
        ((Msg::Pake { nonce: sn, msg }, 0), Some(secret)) => {
            let ctx = agent.id.to_le_bytes();
            Some(crate::auth::answer_control(
                control,
                secret,
                &ctx,
                nonce,
                (sn, msg),
            )?)
        }
        ((Msg::Pake { .. }, 0), None) => {
            return Err(Error::auth(
                AuthFailure::Mode,
                format!(
                    "the peer at {addr} requires authentication and this agent is insecure \
                 (give it the peer's secret: GDX_SECRET_FILE or AgentConfig::secret)"
                ),
            ))
        }
        ((Msg::Hello(_), 0), Some(_)) => {
            return Err(Error::auth(
                AuthFailure::Mode,
                format!(
                    "the peer at {addr} runs without authentication (insecure); refusing it \
                 (make this agent insecure too, on a network you trust)"
                ),
            ))
        }
        ((Msg::Hello(h), 0), None) => return Ok((h, None)),
        ((Msg::Err(e), _), _) => return Err(e),
        ((m, _), _) => {
            return Err(Error::Protocol(format!(
                "expected Pake or Hello, got frame type {}",
                m.kind()
            )))
        }
    };
    match control.recv_frame(false)? {
        (Msg::Hello(h), 0) => Ok((h, key)),
        (Msg::Err(Error::AuthFailed { why, kind }), _) => Err(Error::auth(
            kind,
            format!(
                "the peer at {addr} refused this agent's proof ({}): the two hold different \
             secrets; check GDX_SECRET_FILE / --secret-file on both sides",
                gdx_topo::printable(&why)
            ),
        )),
        (Msg::Err(e), _) => Err(e),
        (m, _) => Err(Error::Protocol(format!(
            "expected Hello, got frame type {}",
            m.kind()
        ))),
    }
}

fn short(id: u128) -> String {
    format!("{:08x}…", (id >> 96) as u32)
}

impl Peer {
    pub(crate) fn handshake(
        agent: Arc<AgentInner>,
        s: TcpStream,
        addr: SocketAddr,
        expect: Option<Expected>,
    ) -> Result<Peer> {
        let cfg = &agent.cfg;
        let mut control = Conn::new(Sock::Tcp(s), "control connection");
        control.set_timeout(Some(cfg.io_timeout))?;
        // One deadline for the whole handshake, data stream and shm joins included: a peer
        // that drips its answers cannot stretch a connect past `handshake_timeout`.
        let limit = cfg.limits.handshake_timeout;
        let until = std::time::Instant::now() + limit;
        control.start_handshake(until, limit, crate::wire::MAX_BODY);
        let nonce = crate::mem::random_u128()?;
        let hello = Hello {
            agent_name: cfg.name.clone(),
            agent_id: agent.id,
            host_id: agent.host_id,
            transports: agent.offered(),
            shm_socket: agent.shm_name.clone(),
            listen: agent.listen_addr.map(|a| a.to_string()),
            session: 0,
            token: 0,
            streams: cfg.tcp_streams as u16,
            nonce,
            cluster: agent
                .cluster
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        };
        let (h, key) = authenticate(&agent, &mut control, &Msg::Hello(hello), nonce, addr)?;
        identity::check(&h, key.as_ref(), expect.as_ref(), addr)?;
        control.end_handshake(cfg.io_timeout)?;
        let info = PeerInfo {
            name: h.agent_name.clone(),
            agent_id: h.agent_id,
            host_id: h.host_id,
            transports: Transports::from_bits(h.transports),
            listen: h.listen.clone(),
        };
        let control = Arc::new(Mutex::new(control));
        let mut tcp_detail = format!(
            "{} stream(s), chunks of up to {} KiB",
            cfg.tcp_streams,
            cfg.chunk_bytes / 1024
        );
        let shm_reason = if !cfg.transports.shm {
            Err("tcp: shm disabled on this agent (GDX_TRANSPORTS)".to_string())
        } else if !info.transports.shm || h.shm_socket.is_none() {
            Err("tcp: peer does not offer shm".to_string())
        } else if h.host_id != agent.host_id {
            Err(format!(
                "tcp: peer is on another host (host id {} vs ours {})",
                short(h.host_id),
                short(agent.host_id)
            ))
        } else {
            let name = h.shm_socket.as_deref().unwrap_or_default();
            ShmTransport::connect(
                name,
                (h.session, h.token, key),
                cfg,
                Arc::clone(&agent.cuda),
                until,
                h.transports & crate::transport::shm::CMA_FRAMES_BIT != 0,
            )
            .map_err(|e| format!("tcp: same host but the shm socket did not connect ({e})"))
        };
        let mut cma = CmaGrant::default();
        let (route, transport): (PeerRoute, Box<dyn Transport>) = match shm_reason {
            Ok(t) => {
                cma = t.cma().clone();
                (
                    PeerRoute {
                        transport: Path::Shm,
                        reason: format!(
                            "shm: peer on the same host (host id {})",
                            short(h.host_id)
                        ),
                    },
                    Box::new(t),
                )
            }
            Err(reason) => match rdma_route(&agent, &info, &control, &reason).or_else(|rdma_why| {
                let reason = format!("{reason}; rdma: {rdma_why}");
                fabric_route(&agent, &info, &control, &reason)
                    .map_err(|fabric_why| format!("{reason}; fabric: {fabric_why}"))
            }) {
                Ok(r) => r,
                Err(reason) => {
                    let (t, detail) = tcp_transport(&agent, &h, key, addr, &control, until)?;
                    tcp_detail = detail;
                    (
                        PeerRoute {
                            transport: Path::Tcp,
                            reason,
                        },
                        Box::new(t),
                    )
                }
            },
        };
        let fabric = match (&agent.fabric, route.transport) {
            (Ok(node), Path::Fabric) => node.mem(),
            _ => FabricMem::default(),
        };
        agent
            .stats
            .peers_outbound
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Some(r) = transport.rails() {
            agent.rails.lock().unwrap_or_else(|p| p.into_inner()).push((
                info.name.clone(),
                addr.to_string(),
                Arc::downgrade(&r),
            ));
        }
        let xfer_shared = Arc::new(XferShared {
            stats: Arc::clone(&agent.stats),
            driver: transport.driver(),
            spares: Default::default(),
            rails: transport.rails(),
        });
        Ok(Peer {
            inner: Arc::new(PeerInner {
                agent,
                addr,
                expect,
                info,
                route,
                tcp_detail,
                fabric,
                cma,
                control,
                transport,
                plans: Mutex::default(),
                xfer_shared,
            }),
        })
    }

    /// Who the peer is (from its handshake).
    pub fn info(&self) -> &PeerInfo {
        &self.inner.info
    }

    /// The transport this connection uses and why.
    pub fn route(&self) -> &PeerRoute {
        &self.inner.route
    }

    /// The rails of this connection now: ends, bytes moved over each since the connection was
    /// made, state and cause. Empty on routes without rails (shm, rdma, fabric).
    pub fn rails(&self) -> Vec<crate::RailInfo> {
        self.inner
            .transport
            .rails()
            .map(|r| r.snapshot(None))
            .unwrap_or_default()
    }

    /// The address connected to.
    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// False once a connection of this peer broke; [`Peer::reconnect`] then gives a fresh one.
    pub fn is_alive(&self) -> bool {
        self.inner.transport.is_alive()
    }

    fn request(&self, m: &Msg) -> Result<Msg> {
        self.inner
            .control
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .request(m)
    }

    /// Asks the peer for the descriptor of the region it publishes under `name`.
    ///
    /// # Errors
    /// [`Error::NoSuchName`] if there is none; [`Error::PeerLost`] if the peer does not answer.
    pub fn region(&self, name: &str) -> Result<RegionDesc> {
        match self.request(&Msg::GetRegion {
            name: name.to_string(),
        })? {
            Msg::Region(d) => Ok(d),
            m => Err(Error::Protocol(format!(
                "expected Region, got frame type {}",
                m.kind()
            ))),
        }
    }

    /// Asks the peer for every region it publishes.
    ///
    /// # Errors
    /// [`Error::PeerLost`] if the peer does not answer.
    pub fn regions(&self) -> Result<Vec<RegionDesc>> {
        match self.request(&Msg::ListRegions)? {
            Msg::Regions(d) => Ok(d),
            m => Err(Error::Protocol(format!(
                "expected Regions, got frame type {}",
                m.kind()
            ))),
        }
    }

    /// Sends a standalone notification (no data movement).
    ///
    /// # Errors
    /// [`Error::PeerLost`] if the peer does not acknowledge it.
    pub fn notify(&self, data: impl Into<Vec<u8>>) -> Result<()> {
        let data = data.into();
        // Refused here: the peer would close the whole connection on an oversized frame.
        crate::notifications::check_size(data.len())?;
        match self.request(&Msg::Notify { xfer: 0, data })? {
            Msg::Ok => Ok(()),
            m => Err(Error::Protocol(format!(
                "expected Ok, got frame type {}",
                m.kind()
            ))),
        }
    }

    /// Validates, plans and starts a batch; returns at once. Each op's [`crate::Plan`] is in the
    /// handle's results.
    ///
    /// # Errors
    /// Before anything is sent: [`Error::InvalidArgument`] (empty batch, zero-length op),
    /// [`Error::OutOfBounds`] (local or remote span), [`Error::ReadOnly`] / [`Error::NotReadable`]
    /// (per the remote descriptor), [`Error::PeerLost`] if this connection already broke.
    pub fn submit(&self, mut t: Transfer) -> Result<TransferHandle> {
        let mut plans = self.plan(&t)?;
        let id = crate::transfer::next_id();
        let state = self.inner.transport.submit_new(NewTransfer::now(
            id,
            &mut t,
            &mut plans,
            self.inner.agent.cfg.transfer_timeout,
            &self.inner.xfer_shared,
        ));
        Ok(TransferHandle { state })
    }

    /// Validates and plans `t` once, for posting many times ([`PreparedTransfer::post`]): the
    /// way to send the same ops again and again (a KV block's write, a doorbell, a latency
    /// loop), as NIXL's prepared transfer requests and perftest's reused work requests are.
    /// Each post then skips validation, planning and the transfer's allocation.
    ///
    /// The plans are made now: a later change of strict mode does not re-plan a prepared
    /// transfer (prepare it again). The target checks every op on every post, so a region it
    /// freed since fails the op that names it.
    ///
    /// # Errors
    /// As [`Peer::submit`]'s, before anything is sent.
    pub fn prepare(&self, mut t: Transfer) -> Result<PreparedTransfer> {
        let mut plans = self.plan(&t)?;
        let timeout = t.timeout.unwrap_or(self.inner.agent.cfg.transfer_timeout);
        let state =
            NewTransfer::now(0, &mut t, &mut plans, timeout, &self.inner.xfer_shared).build();
        Ok(PreparedTransfer::new(self.clone(), state, timeout))
    }

    /// Starts a prepared transfer's state (re-armed by its caller).
    pub(crate) fn post_prepared(&self, state: &Arc<XferState>) -> Result<()> {
        self.check_alive()?;
        self.inner.transport.submit(Arc::clone(state));
        Ok(())
    }

    fn check_alive(&self) -> Result<()> {
        if self.is_alive() {
            return Ok(());
        }
        Err(Error::peer_lost(format!(
            "connection to {} broke earlier; reconnect",
            self.inner.addr
        )))
    }

    /// Opens a fresh connection to the same address (after a failure).
    ///
    /// # Errors
    /// As [`crate::Agent::connect`].
    pub fn reconnect(&self) -> Result<Peer> {
        let s = TcpStream::connect_timeout(&self.inner.addr, self.inner.agent.cfg.io_timeout)
            .map_err(|e| Error::Unreachable {
                addr: self.inner.addr.to_string(),
                why: e.to_string(),
            })?;
        Peer::handshake(
            Arc::clone(&self.inner.agent),
            s,
            self.inner.addr,
            self.inner.expect.clone(),
        )
    }

    /// Closes the connection now; transfers still running fail with [`Error::PeerLost`].
    pub fn close(&self) {
        self.inner.transport.close();
        if let Ok(c) = self.inner.control.lock() {
            if let Ok(h) = c.shutdown_handle() {
                h.shutdown();
            }
        }
    }
}
