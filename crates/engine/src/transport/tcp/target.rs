//! The tcp transport's target half: a data stream's requests (`Write` chunks landed in the
//! region, GPU ones through the staging pipeline; `Read` chunks answered from it; batches of
//! host chunks, `batch.rs`), each checked and leased through the registry, replies in request
//! order.
//!
//! GPU regions: a write's payload lands in a pinned slot, its copy to the GPU is queued and the
//! next frame is received meanwhile; the `WriteAck` goes out once the copy is done (before the
//! reader would block, or when the slots run out), so acknowledgements keep request order. A
//! read is copied to a pinned slot and sent from there. A rejected write's payload is drained
//! through the connection's fixed buffer.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use crate::conn::Conn;
use crate::error::{Error, Result};
use crate::gpu::{Stager, Ticket, DEPTH};
use crate::region::{Lease, RegionKey, Registry};
use crate::target_stats::Counters;
use crate::transport::AgentView;
use crate::wire::Msg;

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

/// Serves an authenticated tcp data stream until it ends: writes land in the region (GPU ones
/// through the staging pipeline, acknowledged in request order), reads are answered from it;
/// `served` counts what moved.
pub(crate) fn serve_stream<S: AgentView>(
    agent: &S,
    c: &mut Conn,
    served: &Arc<Counters>,
) -> Result<()> {
    let reg: &Registry = agent.registry();
    let lease_wait = agent.config().io_timeout;
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
        c.spin_for_input(crate::spin::STREAM_READ_SPIN);
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
                let ack = (xfer, op, chunk);
                serve_read(
                    c,
                    reg,
                    lease_wait,
                    &mut stager,
                    served,
                    ack,
                    (region, key, offset, len),
                )?;
            }
            Msg::WriteBatch { xfer, entries } => {
                let b = (xfer, entries);
                super::batch::serve_write_batch(c, reg, lease_wait, served, b, payload)?;
            }
            Msg::ReadBatch { xfer, entries } => {
                if payload != 0 {
                    return Err(Error::Protocol("payload on a ReadBatch frame".into()));
                }
                super::batch::serve_read_batch(c, reg, lease_wait, served, (xfer, entries))?;
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

/// Answers a `Read` of `len` bytes at `offset` in `region`: from host memory straight, from
/// GPU memory through a pinned slot; a refused read gets its `OpErr`.
fn serve_read(
    c: &mut Conn,
    reg: &Registry,
    lease_wait: Duration,
    stager: &mut Stager,
    served: &Arc<Counters>,
    (xfer, op, chunk): (u64, u32, u32),
    (region, key, offset, len): (u64, RegionKey, u64, u32),
) -> Result<()> {
    if len > crate::wire::MAX_PAYLOAD {
        let err = Error::FrameTooLarge {
            len: len.into(),
            limit: crate::wire::MAX_PAYLOAD.into(),
        };
        return op_err(c, (xfer, op, chunk), err);
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
        .and_then(|lease| Ok((staged(&lease, stager)?, lease)));
    match r {
        Ok((Some(t), _lease)) => match stager.bytes(t) {
            Ok(bytes) => {
                // Counted before the bytes leave: the initiator may finish (and
                // read the counters) as soon as they arrive.
                served.add(false, u64::from(len));
                // SAFETY: `bytes` is the staged copy, `len` bytes of a live pinned
                // slot.
                unsafe {
                    c.send_with_payload(&Msg::ReadData { xfer, op, chunk }, bytes.as_ptr(), len)?
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
    Ok(())
}
