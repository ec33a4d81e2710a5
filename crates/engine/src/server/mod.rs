//! The serving side's façade: what an agent does with an inbound connection before a transport
//! serves it.
//!
//! Admission (a bounded number of connections still in their handshake), the handshakes
//! (`handshake.rs`: `Hello` on the control connection, which returns a session id and token;
//! `Join` for a tcp data stream and `ShmJoin` for an shm connection, both proving that session),
//! and the control connection itself: region look-ups, notifications, and the rdma and fabric
//! connection set-up (their nodes' `accept` and `expose`). Once a data stream or shm connection
//! is authenticated it is handed to its transport's target half (`transport::tcp::serve_stream`,
//! `transport::shm::serve_target`) with the agent seen through `transport::AgentView`.
//!
//! Every op is checked by `Registry::check_remote` (id, key, access, bounds) before memory is
//! touched. Decode errors and protocol violations close the connection after an `Err` frame.

use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::admission::Slot;
use crate::agent_state::{AgentInner, PeerInfo};
use crate::config::Transports;
use crate::conn::{Conn, Sock};
use crate::error::{Error, Result};
use crate::notifications::Notification;
use crate::routing::path::Path;
use crate::transport::AgentView;
use crate::wire::{Hello, Msg};

/// Largest frame body accepted before a connection authenticated (a `Hello` with the longest
/// names fits many times over).
const HANDSHAKE_BODY: u32 = 16 << 10;

pub(crate) fn accept_tcp(agent: Arc<AgentInner>, l: TcpListener) {
    for s in l.incoming() {
        if agent.shutdown.load(Ordering::SeqCst) {
            break;
        }
        let Ok(s) = s else { continue };
        let ip = s.peer_addr().ok().map(|a| a.ip());
        // Refused connections are closed at once: no thread, no buffer.
        let Some(slot) = admit(&agent, ip, s.try_clone().map(Sock::Tcp)) else {
            continue;
        };
        let a = Arc::clone(&agent);
        let _ = std::thread::Builder::new()
            .name("gdx-serve".into())
            .spawn(move || serve_tcp(a, s, slot));
    }
}

/// Asks the gate to admit a connection from `ip` (None: the shm socket); `handle` is a second
/// handle on it, which the gate keeps to evict the connection while it is pending.
fn admit(
    agent: &AgentInner,
    ip: Option<std::net::IpAddr>,
    handle: std::io::Result<Sock>,
) -> Option<Slot> {
    let handle = handle.ok()?;
    agent.gate.admit(ip, handle, &agent.cfg.limits, &agent.hits)
}

pub(crate) fn accept_unix(agent: Arc<AgentInner>, l: UnixListener) {
    for s in l.incoming() {
        if agent.shutdown.load(Ordering::SeqCst) {
            break;
        }
        let Ok(s) = s else { continue };
        // Only this user (or an allowed one) may even start a handshake on the shm socket.
        match crate::mem::peer_uid(s.as_raw_fd()) {
            Ok(uid) if uid == crate::mem::my_uid() || agent.cfg.shm_allowed_uids.contains(&uid) => {
            }
            Ok(uid) => {
                agent.hits.hit(
                    &agent.hits.peer_uid,
                    &format!(
                        "shm connection from uid {uid} refused (not ours, not in shm_allowed_uids)"
                    ),
                );
                continue;
            }
            Err(e) => {
                log::warn!("gdx: shm connection refused: {e}");
                continue;
            }
        }
        let Some(slot) = admit(&agent, None, s.try_clone().map(Sock::Unix)) else {
            continue;
        };
        let a = Arc::clone(&agent);
        let _ = std::thread::Builder::new()
            .name("gdx-serve-shm".into())
            .spawn(move || serve_shm(a, s, slot));
    }
}

/// The first frame arrived: the whole-handshake deadline (from accept) replaces the
/// first-frame one, and the gate evicts this connection after silent ones.
fn first_frame(agent: &AgentInner, c: &mut Conn, slot: &Slot, accepted: std::time::Instant) {
    let limit = agent.cfg.limits.handshake_timeout;
    c.start_handshake(accepted + limit, limit, HANDSHAKE_BODY);
    slot.spoke();
}

/// Runs `f` on a tracked connection within the handshake deadline; answers a fatal error with
/// an `Err` frame before closing, and counts the bound it hit. `from` names the source (an
/// address, or the shm socket's peer uid) in the log line of a failed login.
fn with_conn(
    agent: &AgentInner,
    mut conn: Conn,
    mut slot: Slot,
    from: &str,
    f: impl FnOnce(&mut Conn, &mut Slot) -> Result<()>,
) {
    let Ok(h) = conn.shutdown_handle() else {
        return;
    };
    let id = agent.track(h);
    if conn.set_timeout(Some(agent.cfg.io_timeout)).is_ok() {
        let limit = agent.cfg.limits.handshake_timeout;
        conn.start_handshake(std::time::Instant::now() + limit, limit, HANDSHAKE_BODY);
        conn.first_frame_within(agent.cfg.limits.first_frame_timeout);
        if let Err(e) = f(&mut conn, &mut slot) {
            let hits = &agent.hits;
            match &e {
                Error::AuthFailed { why, .. } => hits.hit(
                    &hits.auth_failures,
                    &format!("failed login from {from}: {why}"),
                ),
                Error::LimitReached { what, .. } if what.contains("first_frame_timeout") => {
                    hits.hit(&hits.first_frame_timeouts, what)
                }
                Error::LimitReached { what, .. } if what.contains("handshake_timeout") => {
                    hits.hit(&hits.handshake_timeouts, what)
                }
                Error::LimitReached { what, .. } if what.contains("idle_timeout") => {
                    hits.hit(&hits.idle_timeouts, what)
                }
                _ => {}
            }
            if !matches!(e, Error::PeerLost { .. }) {
                log::debug!("closing connection: {e}");
                let _ = conn.send(&Msg::Err(e));
            }
        }
    }
    agent.untrack(id);
}

/// The end of a successful handshake: no longer pending, per-receive timeouts, idle limit.
fn authenticated(agent: &AgentInner, c: &mut Conn, slot: &mut Slot) -> Result<()> {
    slot.authenticated();
    c.end_handshake(agent.cfg.io_timeout)?;
    c.set_idle_limit(agent.cfg.limits.idle_timeout);
    Ok(())
}

fn serve_tcp(agent: Arc<AgentInner>, s: TcpStream, slot: Slot) {
    let from = s
        .peer_addr()
        .map_or_else(|_| "an unknown address".into(), |a| a.to_string());
    let conn = Conn::new(Sock::Tcp(s), "tcp connection");
    let accepted = std::time::Instant::now();
    with_conn(&agent.clone(), conn, slot, &from, |c, slot| {
        let first = c.recv_frame(false)?;
        first_frame(&agent, c, slot, accepted);
        match first {
            (Msg::Hello(h), 0) => {
                let session = control_handshake(&agent, c, &h)?;
                authenticated(&agent, c, slot)?;
                serve_control(&agent, c, h, session)
            }
            (
                Msg::Join {
                    session,
                    token,
                    stream,
                    nonce,
                },
                0,
            ) => {
                let mut ctx = session.to_le_bytes().to_vec();
                ctx.extend_from_slice(&stream.to_le_bytes());
                // Held while the stream is served: the session's end shuts the stream down.
                let (s, _member) = join_handshake(&agent, c, session, token, &ctx, nonce, "join")?;
                authenticated(&agent, c, slot)?;
                c.send(&Msg::Ok)?;
                serve_stream(&*agent, c, &agent.served.counters(&s.peer, "tcp"))
            }
            (m, _) => Err(Error::Protocol(format!(
                "expected Hello or Join, got frame type {}",
                m.kind()
            ))),
        }
    });
}

fn serve_control(
    agent: &AgentInner,
    c: &mut Conn,
    h: Hello,
    (session, token, cluster): (u128, u128, String),
) -> Result<()> {
    let reply = Hello {
        agent_name: agent.cfg.name.clone(),
        agent_id: agent.id,
        host_id: agent.host_id,
        transports: agent.offered(),
        shm_socket: agent.shm_name.clone(),
        listen: agent.listen_addr.map(|a| a.to_string()),
        session,
        token,
        streams: 0,
        nonce: 0,
        cluster,
    };
    let from = h.agent_name.clone();
    agent.accepted.push(PeerInfo {
        name: h.agent_name,
        agent_id: h.agent_id,
        host_id: h.host_id,
        transports: Transports::from_bits(h.transports),
        listen: h.listen,
    });
    let r = (|| {
        c.send(&Msg::Hello(reply))?;
        loop {
            let (msg, payload) = c.recv_frame(true)?;
            if payload != 0 {
                return Err(Error::Protocol("payload on the control connection".into()));
            }
            match msg {
                Msg::GetRegion { name } => {
                    let r = check_name(agent, "region name", &name)
                        .and_then(|()| agent.registry.by_name(&name));
                    match r {
                        Ok(d) => c.send(&Msg::Region(d))?,
                        Err(e) => c.send(&Msg::Err(e))?,
                    }
                }
                Msg::ListRegions => c.send(&Msg::Regions(agent.registry.published()))?,
                Msg::Notify { xfer, data } => {
                    let n = Notification {
                        from: from.clone(),
                        xfer,
                        data,
                    };
                    match agent.deliver(n) {
                        Ok(()) => c.send(&Msg::Ok)?,
                        Err(e) => c.send(&Msg::Err(e))?,
                    }
                }
                m @ (Msg::RdmaConnect { .. }
                | Msg::RdmaRegion { .. }
                | Msg::RdmaRegionOn { .. }
                | Msg::FabricConnect { .. }
                | Msg::FabricRegion { .. }) => c.send(&nic_reply(agent, session, m))?,
                Msg::Bye => return Ok(()),
                m => {
                    return Err(Error::Protocol(format!(
                        "frame type {} on the control connection",
                        m.kind()
                    )))
                }
            }
        }
    })();
    end_session(agent, session, &from);
    r
}

/// The session ends with its control connection, however that ended: its data streams and shm
/// connections (and with them the ring thread and its leases) are shut down now, and its queue
/// pairs dropped.
fn end_session(agent: &AgentInner, session: u128, from: &str) {
    let ended = agent
        .sessions
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&session);
    if let Some(s) = ended {
        let n = s.members.end();
        if n > 0 {
            log::debug!("gdx: session of {from:?} ended: {n} joined connection(s) shut down");
        }
    }
    agent
        .rdma_qps
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&session);
}

/// The reply to an rdma or fabric set-up frame on session `session`'s control connection: the
/// node's answer, or the error that refused it.
fn nic_reply(agent: &AgentInner, session: u128, msg: Msg) -> Msg {
    let rdma = || {
        agent
            .rdma
            .as_ref()
            .map_err(|why| Error::unavailable(Path::Rdma, format!("rdma: {why}")))
    };
    let fabric = || {
        agent
            .fabric
            .as_ref()
            .map_err(|why| Error::unavailable(Path::Fabric, format!("fabric: {why}")))
    };
    let r = match msg {
        Msg::RdmaConnect { data } => {
            rdma()
                .and_then(|node| node.accept(&data))
                .map(|(qp, mine)| {
                    agent
                        .rdma_qps
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .entry(session)
                        .or_default()
                        .push(qp);
                    Msg::RdmaConnect { data: mine }
                })
        }
        Msg::RdmaRegion {
            region,
            key,
            write: _,
        } => {
            // On the device of this session's queue pairs (the initiator's one rail), which
            // need not be this agent's default one.
            let device = agent
                .rdma_qps
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&session)
                .and_then(|v| v.first())
                .map(|qp| qp.local().device.clone());
            rdma().and_then(|node| node.expose(&agent.registry, region, key, device.as_deref()))
        }
        Msg::RdmaRegionOn {
            region,
            key,
            device,
        } => rdma().and_then(|node| node.expose(&agent.registry, region, key, Some(&device))),
        Msg::FabricConnect { addr } => fabric()
            .and_then(|node| node.accept(&addr))
            .map(|mine| Msg::FabricConnect { addr: mine }),
        Msg::FabricRegion { region, key } => {
            fabric().and_then(|node| node.expose(&agent.registry, region, key))
        }
        m => Err(Error::Protocol(format!(
            "frame type {} is no rdma or fabric set-up frame",
            m.kind()
        ))),
    };
    r.unwrap_or_else(Msg::Err)
}

mod handshake;
mod shm;

use handshake::{check_name, control_handshake, join_handshake};

use crate::transport::tcp::serve_stream;
use shm::serve_shm;
