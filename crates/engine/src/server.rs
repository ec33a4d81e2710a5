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
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::agent::{AgentInner, Notification, PeerInfo};
use crate::config::Transports;
use crate::conn::{trim_fds, Conn, Sock};
use crate::error::{Error, Result};
use crate::gpu::{copy_span, Dir, Stager, Ticket, DEPTH};
use crate::mem::Mapping;
use crate::region::{Lease, Registry};
use crate::wire::{Hello, Msg};

pub(crate) fn accept_tcp(agent: Arc<AgentInner>, l: TcpListener) {
    for s in l.incoming() {
        if agent.shutdown.load(Ordering::SeqCst) {
            break;
        }
        let Ok(s) = s else { continue };
        let a = Arc::clone(&agent);
        let _ = std::thread::Builder::new()
            .name("gdx-serve".into())
            .spawn(move || serve_tcp(a, s));
    }
}

pub(crate) fn accept_unix(agent: Arc<AgentInner>, l: UnixListener) {
    for s in l.incoming() {
        if agent.shutdown.load(Ordering::SeqCst) {
            break;
        }
        let Ok(s) = s else { continue };
        let a = Arc::clone(&agent);
        let _ = std::thread::Builder::new()
            .name("gdx-serve-shm".into())
            .spawn(move || serve_shm(a, s));
    }
}

/// Runs `f` on a tracked connection; answers a fatal error with an `Err` frame before closing.
fn with_conn(agent: &AgentInner, mut conn: Conn, f: impl FnOnce(&mut Conn) -> Result<()>) {
    let Ok(h) = conn.shutdown_handle() else {
        return;
    };
    let id = agent.track(h);
    if conn.set_timeout(Some(agent.cfg.io_timeout)).is_ok() {
        if let Err(e) = f(&mut conn) {
            if !matches!(e, Error::PeerLost(_)) {
                log::debug!("closing connection: {e}");
                let _ = conn.send(&Msg::Err(e));
            }
        }
    }
    agent.untrack(id);
}

fn serve_tcp(agent: Arc<AgentInner>, s: TcpStream) {
    let conn = Conn::new(Sock::Tcp(s), "tcp connection");
    with_conn(&agent.clone(), conn, |c| match c.recv_frame(false)? {
        (Msg::Hello(h), 0) => serve_control(&agent, c, h),
        (
            Msg::Join {
                session,
                token,
                stream: _,
            },
            0,
        ) => {
            if agent.session_peer(session, token).is_none() {
                return Err(Error::Protocol("unknown session or bad token".into()));
            }
            c.send(&Msg::Ok)?;
            serve_stream(&agent, c)
        }
        (m, _) => Err(Error::Protocol(format!(
            "expected Hello or Join, got frame type {}",
            m.kind()
        ))),
    });
}

fn serve_control(agent: &AgentInner, c: &mut Conn, h: Hello) -> Result<()> {
    let session = crate::mem::random_u128()?;
    let token = crate::mem::random_u128()?;
    agent
        .sessions
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(session, (token, h.agent_name.clone()));
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
                Msg::GetRegion { name } => match agent.registry.by_name(&name) {
                    Ok(d) => c.send(&Msg::Region(d))?,
                    Err(e) => c.send(&Msg::Err(e))?,
                },
                Msg::ListRegions => c.send(&Msg::Regions(agent.registry.published()))?,
                Msg::Notify { xfer, data } => {
                    agent.notes.push(Notification {
                        from: from.clone(),
                        xfer,
                        data,
                    });
                    c.send(&Msg::Ok)?;
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
                                .insert(session, qp);
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
                    let r = agent
                        .rdma
                        .as_ref()
                        .map_err(|why| Error::Unavailable(format!("rdma: {why}")))
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
    agent
        .sessions
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&session);
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
            Ok(()) => c.send(&Msg::WriteAck { xfer, op, chunk })?,
            Err(err) => op_err(c, (xfer, op, chunk), err)?,
        }
    }
    Ok(())
}

fn serve_stream(agent: &AgentInner, c: &mut Conn) -> Result<()> {
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
                        // SAFETY: `bytes` is the staged copy, `len` bytes of a live pinned slot.
                        Ok(bytes) => unsafe {
                            c.send_with_payload(
                                &Msg::ReadData { xfer, op, chunk },
                                bytes.as_ptr(),
                                len,
                            )?
                        },
                        Err(err) => op_err(c, (xfer, op, chunk), err)?,
                    },
                    Ok((None, lease)) => {
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

fn serve_shm(agent: Arc<AgentInner>, s: UnixStream) {
    let conn = Conn::new(Sock::Unix(s), "shm connection");
    with_conn(&agent.clone(), conn, |c| {
        let (session, token) = match c.recv_frame(false)? {
            (Msg::ShmJoin { session, token }, 0) => (session, token),
            (m, _) => {
                return Err(Error::Protocol(format!(
                    "expected ShmJoin, got frame type {}",
                    m.kind()
                )))
            }
        };
        let Some(peer_name) = agent.session_peer(session, token) else {
            return Err(Error::Protocol("unknown session or bad token".into()));
        };
        let fd = c
            .take_fd()
            .ok_or_else(|| Error::Protocol("ShmJoin without a bounce-buffer fd".into()))?;
        // SAFETY: fstat on a valid fd into a zeroed stat buffer.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fd is a valid open file descriptor; st is a valid out-pointer.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0
            || st.st_size <= 0
            || st.st_size > (256 << 20)
        {
            return Err(Error::Protocol("bad bounce buffer".into()));
        }
        let bounce = Mapping::map_fd(fd.as_raw_fd(), st.st_size as usize, true)?;
        drop(fd);
        c.send(&Msg::Ok)?;
        serve_shm_loop(&agent, c, &bounce, &peer_name)
    });
}

fn serve_shm_loop(agent: &AgentInner, c: &mut Conn, bounce: &Mapping, from: &str) -> Result<()> {
    let reg: &Registry = &agent.registry;
    let wait = agent.cfg.io_timeout;
    let mut held: Vec<Lease> = Vec::new();
    loop {
        trim_fds(c);
        let (msg, payload) = c.recv_frame(true)?;
        if payload != 0 {
            return Err(Error::Protocol("payload on the shm connection".into()));
        }
        match msg {
            Msg::ShmMap { region, key, write } => match map_fd_for(reg, region, key, write) {
                Ok((fd, len, writable)) => {
                    c.send_with_fd(&Msg::ShmMapped { len, writable }, fd.as_raw_fd())?;
                }
                Err(e) => c.send(&Msg::Err(e))?,
            },
            Msg::ShmBegin { xfer: _, ops } => {
                let mut errors = Vec::new();
                for (i, op) in ops.iter().enumerate() {
                    match reg.check_remote(op.region, op.key, op.offset, op.len, op.write, wait) {
                        Ok(l) => held.push(l),
                        Err(e) => errors.push((i as u32, e)),
                    }
                }
                c.send(&Msg::ShmBeginResult { errors })?;
            }
            Msg::ShmStaged {
                xfer: _,
                op: _,
                write,
                region,
                key,
                offset,
                len,
            } => {
                if len > bounce.len() as u64 {
                    c.send(&Msg::Err(Error::FrameTooLarge {
                        len,
                        limit: bounce.len() as u64,
                    }))?;
                    continue;
                }
                let dir = if write {
                    Dir::IntoRegion
                } else {
                    Dir::OutOfRegion
                };
                let r = reg
                    .check_remote(region, key, offset, len, write, wait)
                    .and_then(|lease| {
                        // SAFETY: both spans are len bytes of live memory (bounce: len <=
                        // bounce.len(); region: bounds-checked under the lease); they are
                        // distinct allocations, so they do not overlap.
                        unsafe { copy_span(&lease, offset, bounce.ptr(), len as usize, dir) }
                    });
                match r {
                    Ok(()) => c.send(&Msg::Ok)?,
                    Err(e) => c.send(&Msg::Err(e))?,
                }
            }
            Msg::ShmEnd { xfer, notify } => {
                held.clear();
                if let Some(data) = notify {
                    agent.notes.push(Notification {
                        from: from.to_string(),
                        xfer,
                        data,
                    });
                }
                c.send(&Msg::Ok)?;
            }
            Msg::Bye => return Ok(()),
            m => {
                return Err(Error::Protocol(format!(
                    "frame type {} on the shm connection",
                    m.kind()
                )))
            }
        }
    }
}

/// Checks a mapping request and returns an fd to pass: the region's memfd when peers may write, a
/// read-only reopening of it otherwise (so a peer's writable mapping fails).
fn map_fd_for(
    reg: &Registry,
    id: u64,
    key: crate::region::RegionKey,
    write: bool,
) -> Result<(std::os::fd::OwnedFd, u64, bool)> {
    use std::os::fd::FromRawFd;
    let r = reg.get(id)?;
    if !r.key.ct_eq(&key) {
        return Err(Error::BadKey { region: id });
    }
    if write && !r.access.remote_write {
        return Err(Error::ReadOnly { region: id });
    }
    if !r.access.remote_read && !r.access.remote_write {
        return Err(Error::NotReadable { region: id });
    }
    let writable = r.access.remote_write;
    if let Some(dev) = r.device() {
        // A VMM GPU region: its POSIX fd, for the peer to map (the access rights are enforced
        // by the leases of ShmBegin, which every ipc op goes through).
        let fd = dev.peer.export_fd(&dev.region)?;
        return Ok((fd, r.len, writable));
    }
    let fd = r
        .fd()
        .ok_or_else(|| Error::Unavailable(format!("region {id} is not shareable")))?;
    let path = std::ffi::CString::new(format!("/proc/self/fd/{fd}")).unwrap_or_default();
    let flags = if writable {
        libc::O_RDWR
    } else {
        libc::O_RDONLY
    };
    // SAFETY: path is a valid C string; open returns a new fd or -1.
    let nfd = unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC) };
    if nfd < 0 {
        return Err(Error::os("open", std::io::Error::last_os_error()));
    }
    // SAFETY: nfd is a fresh fd owned by nobody else.
    Ok((
        unsafe { std::os::fd::OwnedFd::from_raw_fd(nfd) },
        r.len,
        writable,
    ))
}
