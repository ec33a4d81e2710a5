//! Block lists over tcp: consecutive small chunks of one transfer (whole ops of host memory on
//! both ends, one kind) travel as one `WriteBatch` or `ReadBatch` request and one answer,
//! instead of a frame and a reply each. The payload is the chunks' bytes back to back, sent with
//! one `sendmsg` of up to `MAX_BATCH_ENTRIES` spans straight from the regions; each chunk is
//! still checked and leased on its own at the target, and a refused one fails alone (its bytes
//! are drained, or left out of a read's answer). Sent only to a target whose `Hello` sets
//! [`TCP_BATCH_BIT`]; anything else (GPU memory, large ops, an older target) keeps the
//! per-chunk frames.

use std::time::Duration;

use super::chunks::Staging;
use super::job::Chunk;
use crate::conn::Conn;
use crate::error::{Error, Result};
use crate::region::{Lease, LeaseKind, Registry};
use crate::routing::plan::Path;
use crate::target_stats::Counters;
use crate::transfer::{OpKind, XferState};
use crate::wire::{BatchEntry, Msg, MAX_BATCH_ENTRIES};

/// `Hello` transport bit: this agent's data streams understand the batch frames (37–40).
pub(crate) const TCP_BATCH_BIT: u32 = 1 << 5;

/// Largest chunk a batch carries: a block of a paged KV cache (16–128 KiB) and then some;
/// larger chunks gain nothing from sharing a frame.
const BATCH_CHUNK_MAX: u32 = 256 << 10;

/// Most bytes one batch carries (its leases are held while it is sent or answered).
const BATCH_BYTES: u64 = 16 << 20;

/// How many chunks from the start of `chunks` go as one batch: whole ops of at most
/// `BATCH_CHUNK_MAX` bytes, on the `tcp` path (host memory both ends), of the first one's
/// kind; fewer than 2 means none.
pub(super) fn batchable(xfer: &XferState, chunks: &[Chunk]) -> usize {
    let Some(first) = chunks.first() else {
        return 0;
    };
    let kind = xfer.op(first.op as usize).kind;
    let mut bytes = 0u64;
    chunks
        .iter()
        .take(MAX_BATCH_ENTRIES)
        .take_while(|c| {
            let op = xfer.op(c.op as usize);
            bytes += u64::from(c.len);
            op.kind == kind
                && c.off == 0
                && u64::from(c.len) == op.len
                && c.len <= BATCH_CHUNK_MAX
                && bytes <= BATCH_BYTES
                && xfer.path(c.op as usize) == Path::Tcp
                && op.local.device().is_none()
        })
        .count()
}

fn entry(xfer: &XferState, c: &Chunk) -> BatchEntry {
    let op = xfer.op(c.op as usize);
    BatchEntry {
        op: c.op,
        chunk: c.idx,
        region: op.remote.id,
        key: op.remote.key,
        offset: op.remote_offset + c.off,
        len: c.len,
    }
}

/// Sends `chunks` (`batchable`) as one request. A chunk whose local lease fails is failed here
/// and left out; returns the chunks sent (their answer is `recv_batch`'s).
pub(super) fn send_batch(
    conn: &mut Conn,
    xfer: &XferState,
    chunks: &[Chunk],
    wait: Duration,
) -> Result<Vec<Chunk>> {
    let write = xfer.op(chunks[0].op as usize).kind == OpKind::Write;
    let mut sent = Vec::with_capacity(chunks.len());
    let mut leases: Vec<Lease> = Vec::new();
    let mut parts: Vec<(*const u8, usize)> = Vec::new();
    for c in chunks {
        let op = xfer.op(c.op as usize);
        if write {
            let lease = match op.local.lease(LeaseKind::Source, wait) {
                Ok(l) => l,
                Err(e) => {
                    xfer.chunk_done(c.op as usize, 0, Err(e));
                    continue;
                }
            };
            parts.push((lease.ptr_at(op.local_offset)?.cast_const(), c.len as usize));
            leases.push(lease);
        }
        sent.push(*c);
    }
    if sent.is_empty() {
        return Ok(sent);
    }
    let entries = sent.iter().map(|c| entry(xfer, c)).collect();
    if write {
        let msg = Msg::WriteBatch {
            xfer: xfer.id,
            entries,
        };
        // SAFETY: each part is a chunk's span of a region held by a Source lease above
        // (bounds-checked at submit), alive until the send returns.
        unsafe { conn.send_with_payloads(&msg, &parts)? };
    } else {
        conn.send(&Msg::ReadBatch {
            xfer: xfer.id,
            entries,
        })?;
    }
    Ok(sent)
}

/// Receives the answer to a batch `sent` and completes its chunks: the refused ones with the
/// target's error, the others with their bytes (a read's straight into the local regions).
/// On a connection-level error, `sent` keeps only the chunks not completed (to go again).
pub(super) fn recv_batch(
    conn: &mut Conn,
    st: &mut Staging<'_>,
    xfer: &XferState,
    sent: &mut Vec<Chunk>,
    wait: Duration,
) -> Result<()> {
    let mut completed = 0;
    let r = recv_batch_counted(conn, st, xfer, sent, wait, &mut completed);
    sent.drain(..completed);
    r
}

fn recv_batch_counted(
    conn: &mut Conn,
    st: &mut Staging<'_>,
    xfer: &XferState,
    sent: &[Chunk],
    wait: Duration,
    completed: &mut usize,
) -> Result<()> {
    let write = xfer.op(sent[0].op as usize).kind == OpKind::Write;
    let (msg, payload) = conn.recv_frame(false)?;
    let (x, errors) = match msg {
        Msg::WriteBatchAck { xfer, errors } if write && payload == 0 => (xfer, errors),
        Msg::ReadBatchData { xfer, errors } if !write => (xfer, errors),
        Msg::Err(e) => return Err(e),
        m => {
            return Err(Error::Protocol(format!(
                "unexpected frame type {} for a batch of {} chunks",
                m.kind(),
                sent.len()
            )))
        }
    };
    if x != xfer.id {
        return Err(Error::Protocol(format!(
            "a batch answer for transfer {x}, expected {}",
            xfer.id
        )));
    }
    let mut refused: Vec<Option<Error>> = vec![None; sent.len()];
    for (i, e) in errors {
        let slot = refused.get_mut(i as usize).ok_or_else(|| {
            Error::Protocol(format!("a batch answer names entry {i} of {}", sent.len()))
        })?;
        *slot = Some(e);
    }
    if !write {
        let want: u64 = sent
            .iter()
            .zip(&refused)
            .filter(|(_, r)| r.is_none())
            .map(|(c, _)| u64::from(c.len))
            .sum();
        if u64::from(payload) != want {
            return Err(Error::Protocol(format!(
                "ReadBatchData of {payload} bytes for {want} bytes of accepted chunks"
            )));
        }
    }
    for (c, r) in sent.iter().zip(refused) {
        if let Some(e) = r {
            xfer.chunk_done(c.op as usize, 0, Err(e));
            *completed += 1;
            continue;
        }
        if !write {
            let op = xfer.op(c.op as usize);
            match op.local.lease(LeaseKind::Sink, wait) {
                // SAFETY: the Sink lease covers the op's local span, bounds-checked at submit.
                Ok(l) => unsafe { conn.recv_payload(l.ptr_at(op.local_offset)?, c.len as usize)? },
                Err(e) => {
                    conn.discard_payload(c.len as usize)?;
                    xfer.chunk_done(c.op as usize, 0, Err(e));
                    *completed += 1;
                    continue;
                }
            }
        }
        st.count(c.len);
        xfer.chunk_done(c.op as usize, u64::from(c.len), Ok(()));
        *completed += 1;
    }
    Ok(())
}

/// Target: a `WriteBatch`: each entry checked and leased, its bytes received straight into
/// the region (or drained when refused), then one `WriteBatchAck`.
pub(super) fn serve_write_batch(
    c: &mut Conn,
    reg: &Registry,
    wait: Duration,
    served: &Counters,
    (xfer, entries): (u64, Vec<BatchEntry>),
    payload: u32,
) -> Result<()> {
    let total: u64 = entries.iter().map(|e| u64::from(e.len)).sum();
    if total != u64::from(payload) {
        return Err(Error::Protocol(format!(
            "WriteBatch of {payload} payload bytes for entries of {total}"
        )));
    }
    // Every entry checked and leased before a byte is read, so that the payloads of a batch
    // whose entries all pass land with a few vectored reads.
    let mut errors = Vec::new();
    let mut leases = Vec::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        let lease = reg
            .check_remote(e.region, e.key, e.offset, u64::from(e.len), true, wait)
            .and_then(|l| Ok((l.ptr_at(e.offset)?, l)));
        match lease {
            Ok((p, l)) => leases.push(Some((p, l))),
            Err(err) => {
                errors.push((i as u32, err));
                leases.push(None);
            }
        }
    }
    if errors.is_empty() {
        let parts: Vec<(*mut u8, usize)> = leases
            .iter()
            .zip(&entries)
            .filter_map(|(l, e)| l.as_ref().map(|(p, _)| (*p, e.len as usize)))
            .collect();
        // SAFETY: each span is an entry's range of a host region held by its Sink lease
        // (bounds-checked by check_remote; GPU regions have no host pointer, refused above).
        unsafe { c.recv_payloads(&parts)? };
    } else {
        for (l, e) in leases.iter().zip(&entries) {
            match l {
                // SAFETY: as above, one entry at a time.
                Some((p, _)) => unsafe { c.recv_payload(*p, e.len as usize)? },
                None => c.discard_payload(e.len as usize)?,
            }
        }
    }
    drop(leases);
    served.add(
        true,
        total
            - errors
                .iter()
                .map(|(i, _)| u64::from(entries[*i as usize].len))
                .sum::<u64>(),
    );
    c.send(&Msg::WriteBatchAck { xfer, errors })
}

/// Target: a `ReadBatch`: each entry checked and leased, then one `ReadBatchData` whose
/// payload is the accepted entries' bytes back to back, sent straight from the regions.
pub(super) fn serve_read_batch(
    c: &mut Conn,
    reg: &Registry,
    wait: Duration,
    served: &Counters,
    (xfer, entries): (u64, Vec<BatchEntry>),
) -> Result<()> {
    let mut errors = Vec::new();
    let mut leases = Vec::with_capacity(entries.len());
    let mut parts = Vec::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        let lease = reg
            .check_remote(e.region, e.key, e.offset, u64::from(e.len), false, wait)
            .and_then(|l| Ok((l.ptr_at(e.offset)?, l)));
        match lease {
            Ok((p, l)) if l.device().is_none() => {
                parts.push((p.cast_const(), e.len as usize));
                leases.push(l);
            }
            Ok(_) => errors.push((
                i as u32,
                Error::InvalidArgument(format!(
                    "region {} is GPU memory: a batch carries host memory only",
                    e.region
                )),
            )),
            Err(err) => errors.push((i as u32, err)),
        }
    }
    // Counted before the bytes leave: the initiator may finish as soon as they arrive.
    served.add(false, parts.iter().map(|p| p.1 as u64).sum());
    // SAFETY: each part is an accepted entry's span, held by its Source lease (bounds-checked
    // by check_remote) until the send returns.
    unsafe { c.send_with_payloads(&Msg::ReadBatchData { xfer, errors }, &parts) }
}
