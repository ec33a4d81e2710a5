//! The chunk I/O of one tcp stream: sending a job's chunks within the window, receiving their
//! acks and read payloads, and the GPU staging around both (device-to-host copies queued ahead
//! of the sends, host-to-device copies of received chunks queued behind the receives). Used by
//! the stream's thread (`run_job`, `await_replies`) and by the submitting thread's latency path
//! (`send_chunk`, `recv_reply`).

use std::collections::VecDeque;
use std::time::Duration;

use super::job::{Chunk, Job, WINDOW};
use crate::conn::Conn;
use crate::error::{Error, Result};
use crate::gpu::{Stager, Ticket, DEPTH};
use crate::region::{Lease, LeaseKind};
use crate::routing::path::Path;
use crate::transfer::{OpKind, XferState};
use crate::wire::Msg;

pub(super) fn fail_chunks(xfer: &XferState, chunks: &[Chunk], e: &Error) {
    for c in chunks {
        xfer.chunk_done(c.op as usize, 0, Err(e.clone()));
    }
}

/// A connection-level error and the chunks it left unconfirmed (to be reissued on another
/// rail, or failed).
pub(super) type Broke = (Error, Vec<Chunk>);

/// How often a stream waiting for a reply looks whether its transfer was cancelled or ran
/// out of time.
const HALT_LOOK: Duration = Duration::from_millis(10);

/// Waits for the next reply on `conn`: `Ok(true)` once input is there, `Ok(false)` when
/// `xfer` halted first (cancelled, or past its deadline: `XferState::halt`), an error when
/// nothing came within the I/O timeout.
fn reply_or_halt(conn: &mut Conn, xfer: &XferState, io_timeout: Duration) -> Result<bool> {
    if conn.poll_input() {
        return Ok(true);
    }
    let until = std::time::Instant::now() + io_timeout;
    loop {
        if xfer.halt().is_some() {
            return Ok(false);
        }
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(Error::peer_lost(format!(
                "no reply on the tcp data stream within the I/O timeout ({} ms)",
                io_timeout.as_millis()
            )));
        }
        if conn.wait_input(left.min(HALT_LOOK)) {
            return Ok(true);
        }
    }
}

/// The replies a halted transfer left in flight are abandoned: each of `chunks` fails with
/// the halt's error, and `stale` counts the `replies` frames to read and drop (payloads
/// included, never written into a region) before the stream's next request.
fn abandon(xfer: &XferState, chunks: &[Chunk], replies: usize, stale: &mut usize) {
    let e = xfer.halt().unwrap_or(Error::Cancelled);
    fail_chunks(xfer, chunks, &e);
    *stale += replies;
}

/// Reads and drops the `stale` replies an abandoned transfer left on the stream (waiting for
/// each up to the I/O timeout: a peer that never answers breaks the stream then).
pub(super) fn drain_stale(conn: &mut Conn, stale: &mut usize) -> Result<()> {
    while *stale > 0 {
        let (m, payload) = conn.recv_frame(false)?;
        if let Msg::Err(e) = m {
            return Err(e);
        }
        conn.discard_payload(payload as usize)?;
        *stale -= 1;
    }
    Ok(())
}

/// Receives the replies of chunks the submitting thread sent (host memory only). Returns the
/// bytes landed and, on a connection-level error, the chunks not yet confirmed. When the
/// transfer halts first, the replies still due are abandoned (`stale`).
pub(super) fn await_replies(
    conn: &mut Conn,
    stager: &mut Stager,
    (xfer, sent): (&XferState, &[Chunk]),
    io_timeout: Duration,
    tally: Tally<'_>,
    stale: &mut usize,
) -> (u64, std::result::Result<(), Broke>) {
    let mut st = Staging::new(stager, 0, tally);
    for (k, &c) in sent.iter().enumerate() {
        let r = match reply_or_halt(conn, xfer, io_timeout) {
            Ok(false) => {
                abandon(xfer, &sent[k..], sent.len() - k, stale);
                break;
            }
            Ok(true) => recv_reply(conn, &mut st, xfer, c, io_timeout),
            Err(e) => Err(e),
        };
        if let Err(e) = r {
            return (st.landed, Err((e, sent[k..].to_vec())));
        }
    }
    st.land(xfer, 0);
    (st.landed, Ok(()))
}

/// GPU staging state of one stream's share of a transfer: device-to-host copies queued ahead
/// of the sends (writes from a GPU region), and received chunks whose host-to-device copies
/// are queued (reads into a GPU region), completed once the copy is done.
pub(super) struct Staging<'s> {
    stager: &'s mut Stager,
    /// Index into the job's chunks → the queued device-to-host copy and the source lease.
    ahead: VecDeque<(usize, Ticket, Lease)>,
    /// How far `ahead` has looked.
    scanned: usize,
    landing: VecDeque<(Chunk, Ticket, Lease)>,
    /// Bytes confirmed in place so far.
    pub(super) landed: u64,
    /// Counters the landed bytes are added to as they land (the rail's total, the transfer's
    /// count for the rail), so they can be watched while a job runs.
    tally: Tally<'s>,
}

/// Where a stream's landed bytes are counted as they land.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Tally<'a> {
    pub(super) rail: Option<&'a std::sync::atomic::AtomicU64>,
    pub(super) xfer: Option<&'a std::sync::atomic::AtomicU64>,
}

impl<'s> Staging<'s> {
    /// Nothing queued yet; the chunks before `scanned` are not looked at for prefetching (a
    /// share the submitting thread sends itself, host memory only, has none to prefetch).
    pub(super) fn new(stager: &'s mut Stager, scanned: usize, tally: Tally<'s>) -> Self {
        Staging {
            stager,
            ahead: VecDeque::new(),
            scanned,
            landing: VecDeque::new(),
            landed: 0,
            tally,
        }
    }

    /// Counts `n` bytes landed.
    pub(super) fn count(&mut self, n: u32) {
        let n = u64::from(n);
        self.landed += n;
        for c in [self.tally.rail, self.tally.xfer].into_iter().flatten() {
            c.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Queues the device-to-host copies of the next GPU-sourced write chunks from `from` on,
    /// keeping at most `DEPTH - 1` queued.
    fn prefetch(&mut self, xfer: &XferState, chunks: &[Chunk], from: usize, wait: Duration) {
        // Chunks before `from` were skipped (expired): their staged copies are not needed.
        while self.ahead.front().is_some_and(|(j, _, _)| *j < from) {
            self.ahead.pop_front();
        }
        self.scanned = self.scanned.max(from);
        while self.ahead.len() < DEPTH - 1 && self.scanned < chunks.len() {
            let k = self.scanned;
            let c = chunks[k];
            let op = xfer.op(c.op as usize);
            self.scanned += 1;
            if op.kind != OpKind::Write {
                continue;
            }
            let Some(dev) = op.local.device() else {
                continue;
            };
            // A failure here is left for the send to meet again and report.
            let Ok(lease) = op.local.lease(LeaseKind::Source, wait) else {
                continue;
            };
            if let Ok(t) =
                self.stager
                    .queue_from_device(dev, op.local_offset + c.off, c.len as usize)
            {
                self.ahead.push_back((k, t, lease));
            }
        }
    }

    /// Completes received GPU chunks, oldest first, until at most `keep` wait.
    fn land(&mut self, xfer: &XferState, keep: usize) {
        while self.landing.len() > keep {
            let Some((c, t, _lease)) = self.landing.pop_front() else {
                break;
            };
            match self.stager.wait(t) {
                Ok(()) => {
                    self.count(c.len);
                    xfer.chunk_done(c.op as usize, u64::from(c.len), Ok(()))
                }
                Err(e) => xfer.chunk_done(c.op as usize, 0, Err(e)),
            }
        }
    }
}

/// A request in flight on a stream: one chunk (`Write`/`Read`), or a batch of them
/// (`WriteBatch`/`ReadBatch`, `batch.rs`).
enum Sent {
    One(Chunk),
    Batch(Vec<Chunk>),
}

/// Runs one stream's share of a transfer; `batch`: the target takes batch frames. Returns the
/// bytes landed and, on a connection-level error (the stream is then broken), the chunks not
/// confirmed: those in flight, the one whose send failed and those not sent. When the
/// transfer halts (cancelled, out of time), nothing more is sent and the replies still due
/// are abandoned (`stale`): the job ends without waiting for them.
pub(super) fn run_job(
    conn: &mut Conn,
    stager: &mut Stager,
    job: &Job,
    (io_timeout, batch): (Duration, bool),
    tally: Tally<'_>,
    stale: &mut usize,
) -> (u64, std::result::Result<(), Broke>) {
    let xfer = &job.xfer;
    let mut inflight: VecDeque<Sent> = VecDeque::with_capacity(WINDOW);
    let mut next = 0;
    let mut st = Staging::new(stager, 0, tally);
    let res = (|| -> Result<()> {
        loop {
            while inflight.len() < WINDOW && next < job.chunks.len() {
                let c = job.chunks[next];
                let k = next;
                if let Some(e) = xfer.halt() {
                    next += 1;
                    xfer.chunk_done(c.op as usize, 0, Err(e));
                    continue;
                }
                let n = if batch {
                    super::batch::batchable(xfer, &job.chunks[k..])
                } else {
                    0
                };
                if n >= 2 {
                    let sent =
                        super::batch::send_batch(conn, xfer, &job.chunks[k..k + n], io_timeout)?;
                    next += n;
                    if !sent.is_empty() {
                        inflight.push_back(Sent::Batch(sent));
                    }
                    continue;
                }
                st.prefetch(xfer, &job.chunks, k, io_timeout);
                // `next` moves past the chunk only once its request is out: a failed send
                // leaves it among the unconfirmed.
                let sent = send_chunk(conn, &mut st, xfer, k, c, io_timeout)?;
                next += 1;
                if sent {
                    inflight.push_back(Sent::One(c));
                }
            }
            if !inflight.is_empty() && !reply_or_halt(conn, xfer, io_timeout)? {
                let mut left: Vec<Chunk> = Vec::new();
                for s in inflight.drain(..) {
                    match s {
                        Sent::One(c) => left.push(c),
                        Sent::Batch(cs) => left.extend(cs),
                    }
                    *stale += 1;
                }
                // Chunks the full window kept back were never sent: they fail alike.
                left.extend_from_slice(&job.chunks[next..]);
                next = job.chunks.len();
                abandon(xfer, &left, 0, stale);
                return Ok(());
            }
            match inflight.front_mut() {
                None => return Ok(()),
                Some(Sent::One(c)) => recv_reply(conn, &mut st, xfer, *c, io_timeout)?,
                Some(Sent::Batch(cs)) => {
                    super::batch::recv_batch(conn, &mut st, xfer, cs, io_timeout)?
                }
            }
            inflight.pop_front();
        }
    })();
    // Received GPU chunks complete (or fail) with their copies, whatever happened after.
    st.land(xfer, 0);
    let res = res.map_err(|e| {
        let mut left: Vec<Chunk> = Vec::new();
        for s in inflight {
            match s {
                Sent::One(c) => left.push(c),
                Sent::Batch(cs) => left.extend(cs),
            }
        }
        left.extend_from_slice(&job.chunks[next..]);
        (e, left)
    });
    (st.landed, res)
}

/// Sends one chunk's request. `Ok(false)`: the chunk failed locally (recorded), nothing was sent.
pub(super) fn send_chunk(
    conn: &mut Conn,
    st: &mut Staging<'_>,
    xfer: &XferState,
    k: usize,
    c: Chunk,
    wait: Duration,
) -> Result<bool> {
    let op = xfer.op(c.op as usize);
    let roff = op.remote_offset + c.off;
    match op.kind {
        OpKind::Write => {
            let msg = Msg::Write {
                xfer: xfer.id,
                op: c.op,
                chunk: c.idx,
                region: op.remote.id,
                key: op.remote.key,
                offset: roff,
            };
            if op.local.device().is_some() {
                let staged = match st.ahead.front() {
                    Some((j, t, _)) if *j == k => Ok(*t),
                    _ => Err(Error::unavailable(
                        Path::TcpStaged,
                        format!("GPU chunk {} of op {} could not be staged", c.idx, c.op),
                    )),
                };
                let bytes = staged.and_then(|t| st.stager.bytes(t));
                let sent = match bytes {
                    Ok(b) => {
                        // SAFETY: `b` is the staged chunk: `c.len` bytes of a live pinned slot.
                        unsafe { conn.send_with_payload(&msg, b.as_ptr(), c.len) }.map(|()| true)
                    }
                    Err(e) => {
                        xfer.chunk_done(c.op as usize, 0, Err(e));
                        Ok(false)
                    }
                };
                if st.ahead.front().is_some_and(|(j, _, _)| *j == k) {
                    st.ahead.pop_front();
                }
                return sent;
            }
            let lease = match op.local.lease(LeaseKind::Source, wait) {
                Ok(l) => l,
                Err(e) => {
                    xfer.chunk_done(c.op as usize, 0, Err(e));
                    return Ok(false);
                }
            };
            // SAFETY: the Source lease covers the op's local span, bounds-checked at submit.
            unsafe { conn.send_with_payload(&msg, lease.ptr_at(op.local_offset + c.off)?, c.len)? };
        }
        OpKind::Read => {
            conn.send(&Msg::Read {
                xfer: xfer.id,
                op: c.op,
                chunk: c.idx,
                region: op.remote.id,
                key: op.remote.key,
                offset: roff,
                len: c.len,
            })?;
        }
    }
    Ok(true)
}

/// Receives a read's payload into the local region: straight into host memory, or into a
/// pinned slot whose copy to the GPU is queued (the chunk completes when it is done).
fn recv_read(
    conn: &mut Conn,
    st: &mut Staging<'_>,
    xfer: &XferState,
    c: Chunk,
    p: u32,
    wait: Duration,
) -> Result<()> {
    let op = xfer.op(c.op as usize);
    let lease = match op.local.lease(LeaseKind::Sink, wait) {
        Ok(lease) => lease,
        Err(e) => {
            conn.discard_payload(p as usize)?;
            xfer.chunk_done(c.op as usize, 0, Err(e));
            return Ok(());
        }
    };
    let off = op.local_offset + c.off;
    let Some(dev) = lease.device().cloned() else {
        // SAFETY: the Sink lease covers the op's local span, bounds-checked at submit.
        unsafe { conn.recv_payload(lease.ptr_at(off)?, p as usize)? };
        st.count(p);
        xfer.chunk_done(c.op as usize, u64::from(p), Ok(()));
        return Ok(());
    };
    st.land(xfer, DEPTH - 2);
    let queued = match st.stager.fill(&dev, p as usize) {
        Ok((t, buf)) => {
            // SAFETY: `buf` is a live pinned slot of exactly `p` bytes.
            unsafe { conn.recv_payload(buf.as_mut_ptr(), buf.len())? };
            st.stager.queue_to_device(t, &dev, off).map(|()| t)
        }
        Err(e) => conn.discard_payload(p as usize).and(Err(e)),
    };
    match queued {
        Ok(t) => st.landing.push_back((c, t, lease)),
        Err(e) => xfer.chunk_done(c.op as usize, 0, Err(e)),
    }
    Ok(())
}

/// Receives the confirmation of the oldest chunk in flight (replies come back in request order).
pub(super) fn recv_reply(
    conn: &mut Conn,
    st: &mut Staging<'_>,
    xfer: &XferState,
    c: Chunk,
    wait: Duration,
) -> Result<()> {
    let op = xfer.op(c.op as usize);
    let matches = |x: u64, o: u32, k: u32| x == xfer.id && o == c.op && k == c.idx;
    match conn.recv_frame(false)? {
        (
            Msg::WriteAck {
                xfer: x,
                op: o,
                chunk: k,
            },
            0,
        ) if matches(x, o, k) && op.kind == OpKind::Write => {
            st.count(c.len);
            xfer.chunk_done(c.op as usize, u64::from(c.len), Ok(()));
        }
        (
            Msg::ReadData {
                xfer: x,
                op: o,
                chunk: k,
            },
            p,
        ) if matches(x, o, k) && op.kind == OpKind::Read => {
            if p != c.len {
                return Err(Error::Protocol(format!(
                    "ReadData of {p} bytes for a chunk of {}",
                    c.len
                )));
            }
            recv_read(conn, st, xfer, c, p, wait)?;
        }
        (
            Msg::OpErr {
                xfer: x,
                op: o,
                chunk: k,
                err,
            },
            0,
        ) if matches(x, o, k) => {
            xfer.chunk_done(c.op as usize, 0, Err(err));
        }
        (Msg::Err(e), _) => return Err(e),
        (m, _) => {
            return Err(Error::Protocol(format!(
                "unexpected frame type {} on a data stream",
                m.kind()
            )))
        }
    }
    Ok(())
}
