//! The shm transport's target half on the socket: region mappings (an fd to map, or a VMM GPU
//! region's piece), batch begin/end with leases bounded per connection, staged chunks through
//! the bounce buffer, notifications, direct copies for the `cma` path (`cma.rs`: the grant and
//! the borrowed regions' addresses), and the attachment of the control ring (`ring_target.rs`,
//! which then serves most requests).

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use super::ring_target::{leases_full, RingServer};
use crate::conn::{trim_fds, Conn};
use crate::error::{Error, Result};
use crate::gpu::{copy_span, Dir};
use crate::mem::Mapping;
use crate::notifications::Notification;
use crate::region::{Lease, RegionKey, Registry};
use crate::routing::path::Path;
use crate::target_stats::Counters;
use crate::transport::AgentView;
use crate::wire::{Msg, ShmOp};

/// Serves an authenticated shm connection (its bounce buffer mapped) until it ends: `from` is
/// the peer's name.
pub(crate) fn serve_target<S: AgentView>(
    agent: &Arc<S>,
    c: &mut Conn,
    bounce: &Mapping,
    from: &str,
) -> Result<()> {
    let reg: &Registry = agent.registry();
    let wait = agent.config().io_timeout;
    let mut held: Vec<Lease> = Vec::new();
    let served = agent.served().counters(from, "shm");
    // Declared after `held` so it is dropped first: its thread stops and releases its leases.
    let mut ring: Option<RingServer> = None;
    // Declared after `ring`, so dropped before it: the Yama exception ends with the connection.
    let mut cma = super::cma::CmaTarget::default();
    // Standing leases on borrowed regions this peer resolved (`standing.rs`); dropped (each
    // revoked) when the connection ends.
    let mut standing: Vec<Arc<super::standing::StandingLease>> = Vec::new();
    loop {
        trim_fds(c);
        let (msg, payload) = match c.recv_frame(true) {
            Ok(f) => f,
            // A connection whose traffic goes through the ring is idle on the socket, not idle.
            Err(Error::LimitReached { what, .. })
                if what.contains("idle_timeout")
                    && ring
                        .as_ref()
                        .is_some_and(|r| r.active_within(agent.config().limits.idle_timeout)) =>
            {
                continue
            }
            Err(e) => return Err(e),
        };
        if payload != 0 {
            return Err(Error::Protocol("payload on the shm connection".into()));
        }
        match msg {
            Msg::ShmMap {
                region,
                key,
                write,
                piece,
            } => match map_fd_for(reg, region, key, write, piece) {
                Ok((fd, len, writable)) => {
                    c.send_with_fd(&Msg::ShmMapped { len, writable }, fd.as_raw_fd())?;
                }
                Err(e) => c.send(&Msg::Err(e))?,
            },
            Msg::ShmBegin { xfer: _, ops } => {
                let errors = begin(&**agent, &mut held, &served, &ops);
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
                let r = staged(reg, wait, bounce, (write, region, key, offset, len));
                match r {
                    Ok(()) => {
                        served.add(write, len);
                        c.send(&Msg::Ok)?
                    }
                    Err(e) => c.send(&Msg::Err(e))?,
                }
            }
            Msg::ShmEnd { xfer, notify } => {
                held.clear();
                let r = match notify {
                    Some(data) => {
                        let n = Notification {
                            from: from.to_string(),
                            xfer,
                            data,
                        };
                        agent.deliver(n)
                    }
                    None => Ok(()),
                };
                match r {
                    Ok(()) => c.send(&Msg::Ok)?,
                    Err(e) => c.send(&Msg::Err(e))?,
                }
            }
            Msg::ShmRing { slots, slot_bytes } => {
                let fd = c
                    .take_fd()
                    .ok_or_else(|| Error::Protocol("ShmRing without an fd".into()))?;
                if ring.is_some() {
                    return Err(Error::Protocol("a second ShmRing on one connection".into()));
                }
                if slots as usize != crate::shm_ring::SLOTS
                    || slot_bytes as usize != crate::shm_ring::SLOT_BYTES
                {
                    return Err(Error::Protocol(format!(
                        "shm ring of {slots} x {slot_bytes} B, expected {} x {} B",
                        crate::shm_ring::SLOTS,
                        crate::shm_ring::SLOT_BYTES
                    )));
                }
                let r = crate::shm_ring::Ring::attach(fd.as_raw_fd())?;
                drop(fd);
                ring = Some(RingServer::start(
                    Arc::clone(agent),
                    r,
                    c.shutdown_handle()?,
                    Arc::clone(&served),
                )?);
                c.send(&Msg::Ok)?;
            }
            Msg::ShmCmaGrant => {
                let peer = crate::mem::peer_pid(c.raw_fd())?;
                match cma.grant(agent.config().shm_cma, peer) {
                    Ok(m) => c.send(&m)?,
                    Err(e) => c.send(&Msg::Err(e))?,
                }
            }
            Msg::ShmCmaRegion { region, key, write } => {
                let r = if agent.config().shm_cma {
                    super::cma::region_addr(reg, region, key, write)
                } else {
                    Err(Error::unavailable(
                        Path::Cma,
                        "this agent does not let peers copy into its memory directly",
                    ))
                };
                match r {
                    Ok(m) => {
                        // Opened before the answer: the initiator looks for the entry then.
                        if let (Some(rs), Ok(inner)) = (&ring, reg.get(region)) {
                            let writable = matches!(m, Msg::ShmCmaAddr { writable: true, .. });
                            super::standing::open(&mut standing, rs.ring(), &inner, writable, wait);
                        }
                        c.send(&m)?
                    }
                    Err(e) => c.send(&Msg::Err(e))?,
                }
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

/// Takes a lease on each op of a `ShmBegin` that passes the checks, into `held` (at most
/// `max_leases_per_conn` held per connection), counting the granted bytes: the initiator then
/// copies through its mapping. Returns the refused ops with why.
fn begin<S: AgentView>(
    agent: &S,
    held: &mut Vec<Lease>,
    served: &Counters,
    ops: &[ShmOp],
) -> Vec<(u32, Error)> {
    let reg = agent.registry();
    let wait = agent.config().io_timeout;
    let max = agent.config().limits.max_leases_per_conn;
    let mut errors = Vec::new();
    let mut refused = 0usize;
    for (i, op) in ops.iter().enumerate() {
        if held.len() >= max {
            refused += 1;
            errors.push((
                i as u32,
                leases_full("connection (ShmBegin without ShmEnd)", max),
            ));
            continue;
        }
        match reg.check_remote(op.region, op.key, op.offset, op.len, op.write, wait) {
            Ok(l) => {
                served.add(op.write, op.len);
                held.push(l)
            }
            Err(e) => errors.push((i as u32, e)),
        }
    }
    if refused > 0 {
        agent.hits().hit(
            &agent.hits().leases,
            &format!("{refused} ShmBegin op(s) refused: max_leases_per_conn ({max})"),
        );
    }
    errors
}

/// A `ShmStaged` op: copies `len` bytes between the bounce buffer and the region, into it
/// (`write`) or out of it, under a lease.
fn staged(
    reg: &Registry,
    wait: Duration,
    bounce: &Mapping,
    (write, region, key, offset, len): (bool, u64, RegionKey, u64, u64),
) -> Result<()> {
    if len > bounce.len() as u64 {
        return Err(Error::FrameTooLarge {
            len,
            limit: bounce.len() as u64,
        });
    }
    let dir = if write {
        Dir::IntoRegion
    } else {
        Dir::OutOfRegion
    };
    reg.check_remote(region, key, offset, len, write, wait)
        .and_then(|lease| {
            // SAFETY: both spans are len bytes of live memory (bounce: len <= bounce.len();
            // region: bounds-checked under the lease); they are distinct allocations, so they
            // do not overlap.
            unsafe { copy_span(&lease, offset, bounce.ptr(), len as usize, dir) }
        })
}

/// Checks a mapping request and returns an fd to pass: the region's memfd when peers may write, a
/// read-only reopening of it otherwise (so a peer's writable mapping fails).
fn map_fd_for(
    reg: &Registry,
    id: u64,
    key: crate::region::RegionKey,
    write: bool,
    piece: u32,
) -> Result<(std::os::fd::OwnedFd, u64, bool)> {
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
        let fd = dev.peer.export_fd_piece(&dev.region, piece)?;
        return Ok((fd, r.len, writable));
    }
    let fd = r
        .fd()
        .ok_or_else(|| Error::unavailable(Path::Shm, format!("region {id} is not shareable")))?;
    let flags = if writable {
        rustix::fs::OFlags::RDWR
    } else {
        rustix::fs::OFlags::RDONLY
    };
    let path = format!("/proc/self/fd/{fd}");
    let nfd = rustix::fs::open(
        path,
        flags | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| Error::os("open", e.into()))?;
    Ok((nfd, r.len, writable))
}
