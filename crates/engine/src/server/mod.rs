//! The serving side: what an agent does with inbound connections.
//!
//! Control connection: `Hello` (reply carries a session id and token), then region look-ups and
//! notifications. Data stream: `Join` with the session token, then `Write` / `Read` chunks, answered
//! in order. Shm connection: `ShmJoin` with the token and the initiator's bounce-buffer fd, then region
//! mappings, batch begin/end and staged chunks.
//!
//! GPU regions on a data stream: a write's payload lands in a pinned slot, its copy to the GPU is
//! queued and the next frame is received meanwhile; the `WriteAck` goes out once the copy is done
//! (before the server would block, or when the slots run out), so acknowledgements keep request
//! order. A read is copied to a pinned slot and sent from there.
//!
//! Every op is checked by [`Registry::check_remote`] (id, key, access, bounds) before memory is
//! touched; a rejected write's payload is drained through the connection's fixed buffer. Decode errors
//! and protocol violations close the connection after an `Err` frame.

use std::collections::VecDeque;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::admission::Slot;
use crate::agent::{AgentInner, Notification, PeerInfo};
use crate::config::Transports;
use crate::conn::{Conn, Sock};
use crate::error::{Error, Result};
use crate::gpu::{Stager, Ticket, DEPTH};
use crate::region::{Lease, Registry};
use crate::served::Counters;
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
/// an `Err` frame before closing, and counts the bound it hit.
fn with_conn(
    agent: &AgentInner,
    mut conn: Conn,
    mut slot: Slot,
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
                Error::AuthFailed(why) => hits.hit(&hits.auth_failures, why),
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
            if !matches!(e, Error::PeerLost(_)) {
                log::debug!("closing connection: {e}");
                let _ = conn.send(&Msg::Err(e));
            }
        }
    }
    agent.untrack(id);
}

/// How long a notification waits for room in a full queue: half the I/O timeout, so that the
/// sender (waiting up to its own I/O timeout for the reply) hears the refusal instead of
/// declaring the connection lost.
pub(super) fn note_wait(agent: &AgentInner) -> std::time::Duration {
    agent.cfg.io_timeout / 2
}

/// The end of a successful handshake: no longer pending, per-receive timeouts, idle limit.
fn authenticated(agent: &AgentInner, c: &mut Conn, slot: &mut Slot) -> Result<()> {
    slot.authenticated();
    c.end_handshake(agent.cfg.io_timeout)?;
    c.set_idle_limit(agent.cfg.limits.idle_timeout);
    Ok(())
}

fn serve_tcp(agent: Arc<AgentInner>, s: TcpStream, slot: Slot) {
    let conn = Conn::new(Sock::Tcp(s), "tcp connection");
    let accepted = std::time::Instant::now();
    with_conn(&agent.clone(), conn, slot, |c, slot| {
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
                serve_stream(&agent, c, &agent.served.counters(&s.peer, "tcp"))
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
    (session, token): (u128, u128),
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
    };
    let from = h.agent_name.clone();
    agent.inbound.push(PeerInfo {
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
                    match agent.notes.push(n, note_wait(agent), &agent.hits) {
                        Ok(()) => c.send(&Msg::Ok)?,
                        Err(e) => c.send(&Msg::Err(e))?,
                    }
                }
                Msg::RdmaConnect { data } => {
                    let r = agent
                        .rdma
                        .as_ref()
                        .map_err(|why| Error::Unavailable(format!("rdma: {why}")))
                        .and_then(|node| node.accept(&data));
                    match r {
                        Ok((qp, mine)) => {
                            agent
                                .rdma_qps
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .entry(session)
                                .or_default()
                                .push(qp);
                            c.send(&Msg::RdmaConnect { data: mine })?;
                        }
                        Err(e) => c.send(&Msg::Err(e))?,
                    }
                }
                Msg::RdmaRegion {
                    region,
                    key,
                    write: _,
                } => {
                    // On the device of this session's queue pairs (the initiator's one rail),
                    // which need not be this agent's default one.
                    let device = agent
                        .rdma_qps
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get(&session)
                        .and_then(|v| v.first())
                        .map(|qp| qp.local().device.clone());
                    let r = agent
                        .rdma
                        .as_ref()
                        .map_err(|why| Error::Unavailable(format!("rdma: {why}")))
                        .and_then(|node| {
                            node.expose(&agent.registry, region, key, device.as_deref())
                        });
                    match r {
                        Ok(m) => c.send(&m)?,
                        Err(e) => c.send(&Msg::Err(e))?,
                    }
                }
                Msg::RdmaRegionOn {
                    region,
                    key,
                    device,
                } => {
                    let r = agent
                        .rdma
                        .as_ref()
                        .map_err(|why| Error::Unavailable(format!("rdma: {why}")))
                        .and_then(|node| node.expose(&agent.registry, region, key, Some(&device)));
                    match r {
                        Ok(m) => c.send(&m)?,
                        Err(e) => c.send(&Msg::Err(e))?,
                    }
                }
                Msg::FabricConnect { addr } => {
                    let r = agent
                        .fabric
                        .as_ref()
                        .map_err(|why| Error::Unavailable(format!("fabric: {why}")))
                        .and_then(|node| node.accept(&addr));
                    match r {
                        Ok(mine) => c.send(&Msg::FabricConnect { addr: mine })?,
                        Err(e) => c.send(&Msg::Err(e))?,
                    }
                }
                Msg::FabricRegion { region, key } => {
                    let r = agent
                        .fabric
                        .as_ref()
                        .map_err(|why| Error::Unavailable(format!("fabric: {why}")))
                        .and_then(|node| node.expose(&agent.registry, region, key));
                    match r {
                        Ok(m) => c.send(&m)?,
                        Err(e) => c.send(&Msg::Err(e))?,
                    }
                }
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
    // The session ends with its control connection, however that ended: its data streams and
    // shm connections (and with them the ring thread and its leases) are shut down now.
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
    r
}

/// A GPU write whose host-to-device copy is queued: acknowledged once the copy is done.
struct Landing {
    ticket: Ticket,
    ack: (u64, u32, u32),
    _lease: Lease,
    /// Counted once the copy is done.
    served: Arc<Counters>,
    bytes: u64,
}

/// Rejects one op chunk; the stream stays usable.
fn op_err(c: &mut Conn, (xfer, op, chunk): (u64, u32, u32), err: Error) -> Result<()> {
    c.send(&Msg::OpErr {
        xfer,
        op,
        chunk,
        err,
    })
}

/// Acknowledges queued GPU writes, oldest first, until at most `keep` remain.
fn land(c: &mut Conn, stager: &Stager, q: &mut VecDeque<Landing>, keep: usize) -> Result<()> {
    while q.len() > keep {
        let Some(l) = q.pop_front() else { break };
        let (xfer, op, chunk) = l.ack;
        match stager.wait(l.ticket) {
            Ok(()) => {
                l.served.add(true, l.bytes);
                c.send(&Msg::WriteAck { xfer, op, chunk })?
            }
            Err(err) => op_err(c, (xfer, op, chunk), err)?,
        }
    }
    Ok(())
}

/// How long a data stream's reader polls for the next request before it blocks in the read.
const STREAM_SPIN: std::time::Duration = std::time::Duration::from_micros(50);

fn serve_stream(agent: &AgentInner, c: &mut Conn, served: &Arc<Counters>) -> Result<()> {
    let reg: &Registry = &agent.registry;
    let lease_wait = agent.cfg.io_timeout;
    let mut stager = Stager::default();
    let mut landing: VecDeque<Landing> = VecDeque::new();
    loop {
        // Replies go out in request order: acknowledge queued GPU writes before waiting for
        // more requests, and before answering any other frame.
        if !landing.is_empty() && !c.has_input() {
            land(c, &stager, &mut landing, 0)?;
        }
        // The next request of a busy stream usually follows within the spin: catch it
        // without sleeping in the read (the initiator polls for its ack the same way).
        c.spin_for_input(STREAM_SPIN);
        let (msg, payload) = c.recv_frame(true)?;
        // A write lands first where its reply is sent (a GPU write may itself be queued).
        if !matches!(msg, Msg::Write { .. }) {
            land(c, &stager, &mut landing, 0)?;
        }
        match msg {
            Msg::Write {
                xfer,
                op,
                chunk,
                region,
                key,
                offset,
            } => {
                let lease = match reg.check_remote(
                    region,
                    key,
                    offset,
                    u64::from(payload),
                    true,
                    lease_wait,
                ) {
                    Ok(lease) => lease,
                    Err(err) => {
                        c.discard_payload(payload as usize)?;
                        land(c, &stager, &mut landing, 0)?;
                        op_err(c, (xfer, op, chunk), err)?;
                        continue;
                    }
                };
                let Some(dev) = lease.device().cloned() else {
                    // SAFETY: the Sink lease was granted for offset..offset+payload, which
                    // check_remote bounds-checked; the region stays mapped while it is held.
                    unsafe { c.recv_payload(lease.ptr_at(offset)?, payload as usize)? };
                    drop(lease);
                    served.add(true, u64::from(payload));
                    land(c, &stager, &mut landing, 0)?;
                    c.send(&Msg::WriteAck { xfer, op, chunk })?;
                    continue;
                };
                // GPU memory: receive into a pinned slot, queue its copy to the GPU, go on.
                land(c, &stager, &mut landing, DEPTH - 2)?;
                let ticket = match stager.fill(&dev, payload as usize) {
                    Ok((t, buf)) => {
                        // SAFETY: `buf` is a live pinned slot of exactly `payload` bytes.
                        unsafe { c.recv_payload(buf.as_mut_ptr(), buf.len())? };
                        stager.queue_to_device(t, &dev, offset).map(|()| t)
                    }
                    Err(e) => c.discard_payload(payload as usize).and(Err(e)),
                };
                match ticket {
                    Ok(ticket) => landing.push_back(Landing {
                        ticket,
                        ack: (xfer, op, chunk),
                        _lease: lease,
                        served: Arc::clone(served),
                        bytes: u64::from(payload),
                    }),
                    Err(err) => {
                        land(c, &stager, &mut landing, 0)?;
                        op_err(c, (xfer, op, chunk), err)?;
                    }
                }
            }
            Msg::Read {
                xfer,
                op,
                chunk,
                region,
                key,
                offset,
                len,
            } => {
                if payload != 0 {
                    return Err(Error::Protocol("payload on a Read frame".into()));
                }
                if len > crate::wire::MAX_PAYLOAD {
                    let err = Error::FrameTooLarge {
                        len: len.into(),
                        limit: crate::wire::MAX_PAYLOAD.into(),
                    };
                    op_err(c, (xfer, op, chunk), err)?;
                    continue;
                }
                let staged = |lease: &Lease, stager: &mut Stager| -> Result<Option<Ticket>> {
                    match lease.device() {
                        Some(dev) => stager
                            .queue_from_device(dev, offset, len as usize)
                            .map(Some),
                        None => Ok(None),
                    }
                };
                let r = reg
                    .check_remote(region, key, offset, u64::from(len), false, lease_wait)
                    .and_then(|lease| Ok((staged(&lease, &mut stager)?, lease)));
                match r {
                    Ok((Some(t), _lease)) => match stager.bytes(t) {
                        Ok(bytes) => {
                            // Counted before the bytes leave: the initiator may finish (and
                            // read the counters) as soon as they arrive.
                            served.add(false, u64::from(len));
                            // SAFETY: `bytes` is the staged copy, `len` bytes of a live pinned
                            // slot.
                            unsafe {
                                c.send_with_payload(
                                    &Msg::ReadData { xfer, op, chunk },
                                    bytes.as_ptr(),
                                    len,
                                )?
                            };
                        }
                        Err(err) => op_err(c, (xfer, op, chunk), err)?,
                    },
                    Ok((None, lease)) => {
                        served.add(false, u64::from(len));
                        // SAFETY: the Source lease covers offset..offset+len (bounds-checked).
                        unsafe {
                            c.send_with_payload(
                                &Msg::ReadData { xfer, op, chunk },
                                lease.ptr_at(offset)?,
                                len,
                            )?
                        };
                    }
                    Err(err) => op_err(c, (xfer, op, chunk), err)?,
                }
            }
            Msg::Bye => return Ok(()),
            m => {
                return Err(Error::Protocol(format!(
                    "frame type {} on a data stream",
                    m.kind()
                )))
            }
        }
    }
}

mod handshake;
mod shm;
mod shm_ring;

use handshake::{check_name, control_handshake, join_handshake};

use shm::serve_shm;
