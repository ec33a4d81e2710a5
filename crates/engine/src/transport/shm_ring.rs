//! The initiator's side of the shm control ring (layout and states: `ring.rs`).
//!
//! A transfer whose ops all fit the ring runs without the socket: small ops (≤ `INLINE_MAX`)
//! travel inline, and the target copies them between the slot and its region under a lease, so
//! the op costs one ring round trip and the `DONE` is the target's confirmation. Larger ops to
//! mapped regions are leased by a `BEGIN` request (one round trip), copied once through the
//! mapping, and the slot is marked `END` without waiting: the copy finished while the target held
//! the leases, so the bytes are in place when the op completes; the target drops the leases when
//! it sees `END`. A notification still travels on the socket (`ShmEnd`), after the bytes.
//!
//! Liveness: a waiter spins briefly, then sleeps on the slot's futex in short naps, and between
//! naps checks the shm socket for hang-up (the target closes it when it dies or its ring
//! thread gives up) and the I/O timeout; either fails the transfer's unconfirmed ops with
//! `PeerLost` and the connection stays failed.

use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::Worker;
use crate::error::{Error, Result};
use crate::gpu::{copy_span, Dir};
use crate::plan::Path;
use crate::region::LeaseKind;
use crate::ring::{
    self, Ring, DATA_BYTES, DONE, END, FREE, INLINE_MAX, KIND_BEGIN, KIND_INLINE, MAX_RING_OPS,
    NAP, POSTED,
};
use crate::transfer::{OpKind, XferState};
use crate::wire::ShmOp;

/// How long the initiator spins on a slot before it sleeps on its futex.
const SPIN: Duration = Duration::from_micros(100);

/// The initiator's ring state: the mapping and the next sequence number.
#[derive(Debug)]
pub(super) struct RingClient {
    pub(super) ring: Ring,
    seq: u32,
    /// The shm socket, watched for hang-up while waiting.
    sock_fd: RawFd,
    wait: Duration,
}

impl RingClient {
    pub(super) fn new(ring: Ring, sock_fd: RawFd, wait: Duration) -> Self {
        RingClient {
            ring,
            seq: 0,
            sock_fd,
            wait,
        }
    }

    /// Waits until `slot` is in state `want`.
    fn wait_state(&self, slot: usize, want: u32) -> Result<()> {
        let st = self.ring.state(slot);
        if ring::spin_until(SPIN, || st.load(Ordering::Acquire) == want) {
            return Ok(());
        }
        let deadline = Instant::now() + self.wait;
        loop {
            self.ring.waiting(slot).store(1, Ordering::SeqCst);
            let cur = st.load(Ordering::SeqCst);
            if cur != want {
                ring::futex_wait(st, cur, NAP);
            }
            self.ring.waiting(slot).store(0, Ordering::SeqCst);
            if st.load(Ordering::Acquire) == want {
                return Ok(());
            }
            if hung_up(self.sock_fd) {
                return Err(Error::PeerLost(
                    "the shm peer closed its connection while a ring request was pending".into(),
                ));
            }
            if Instant::now() >= deadline {
                return Err(Error::PeerLost(format!(
                    "no answer on the shm ring within the I/O timeout ({} ms)",
                    self.wait.as_millis()
                )));
            }
        }
    }

    /// Takes the next slot (waiting until the target freed it) and writes the request into it.
    fn prepare(&mut self, kind: u32, xfer: u64, ops: &[ShmOp]) -> Result<usize> {
        let slot = self.seq as usize % ring::SLOTS;
        self.wait_state(slot, FREE)?;
        self.ring.write_request(slot, self.seq, kind, xfer, ops);
        Ok(slot)
    }

    /// Publishes a prepared slot (or an `END`) and rings the doorbell.
    fn publish(&mut self, slot: usize, state: u32) {
        self.ring.state(slot).store(state, Ordering::SeqCst);
        if state == POSTED {
            self.seq = self.seq.wrapping_add(1);
        }
        self.ring.doorbell().fetch_add(1, Ordering::SeqCst);
        if self.ring.target_sleeping().load(Ordering::SeqCst) != 0 {
            ring::futex_wake(self.ring.doorbell());
        }
    }
}

/// True when the peer hung up the socket (or it failed).
fn hung_up(fd: RawFd) -> bool {
    use rustix::event::{PollFd, PollFlags};
    // SAFETY: the transport keeps the socket open while its ring client lives; poll only looks
    // the number up (POLLNVAL if it were closed).
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let mut p = [PollFd::from_borrowed_fd(fd, PollFlags::RDHUP)];
    let n = rustix::event::poll(&mut p, Some(&rustix::event::Timespec::default())).unwrap_or(0);
    let hup = PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR | PollFlags::NVAL;
    n > 0 && p[0].revents().intersects(hup)
}

/// Whether `xfer` is small enough to run on the submitting thread: one inline slot at most
/// (its ops ≤ `INLINE_MAX`, their bytes ≤ the slot's data area). Whether it actually takes the
/// ring is decided by `run_ring`.
pub(super) fn fits_one_slot(xfer: &XferState) -> bool {
    xfer.ops.len() <= MAX_RING_OPS
        && xfer.ops.iter().all(|o| o.len <= INLINE_MAX)
        && xfer.ops.iter().map(|o| o.len).sum::<u64>() <= DATA_BYTES as u64
}

/// Whether op `i` can go through the ring (inline, or leased and copied through a mapping).
fn ring_class(w: &Worker, xfer: &XferState, plan: &Path, i: usize) -> Option<u32> {
    let op = &xfer.ops[i];
    if op.len <= INLINE_MAX && matches!(plan, Path::Shm | Path::ShmStaged) {
        return Some(KIND_INLINE);
    }
    if *plan == Path::Shm && w.maps.contains_key(&op.remote.id) {
        return Some(KIND_BEGIN);
    }
    None
}

impl Worker {
    /// Runs `xfer` through the ring when every op fits it; `Ok(false)` when some op does not
    /// (the caller runs the transfer over the socket).
    pub(super) fn run_ring(
        &mut self,
        xfer: &XferState,
        plans: &[Path],
        ok: &[bool],
    ) -> Result<bool> {
        if self.ring.is_none() {
            return Ok(false);
        }
        let idx: Vec<usize> = (0..xfer.ops.len()).filter(|&i| ok[i]).collect();
        let mut classes = Vec::with_capacity(idx.len());
        for &i in &idx {
            match ring_class(self, xfer, &plans[i], i) {
                Some(k) => classes.push(k),
                None => return Ok(false),
            }
        }
        // Consecutive ops of one class share a slot, up to its op and data limits.
        let mut start = 0;
        while start < idx.len() {
            let kind = classes[start];
            let mut end = start;
            let mut data = 0u64;
            while end < idx.len() && classes[end] == kind && end - start < MAX_RING_OPS {
                let len = xfer.ops[idx[end]].len;
                if kind == KIND_INLINE && data + len > DATA_BYTES as u64 {
                    break;
                }
                data += len;
                end += 1;
            }
            self.ring_batch(xfer, &idx[start..end], kind)?;
            start = end;
        }
        if let Some(n) = xfer.notify.clone().filter(|_| !xfer.has_failed()) {
            self.send_notify(xfer, n)?;
        }
        Ok(true)
    }

    /// One slot: post, wait for `DONE`, then complete (inline) or copy and `END` (begin).
    fn ring_batch(&mut self, xfer: &XferState, batch: &[usize], kind: u32) -> Result<()> {
        let ops: Vec<ShmOp> = batch
            .iter()
            .map(|&i| {
                let op = &xfer.ops[i];
                ShmOp {
                    write: op.kind == OpKind::Write,
                    region: op.remote.id,
                    key: op.remote.key,
                    offset: op.remote_offset,
                    len: op.len,
                }
            })
            .collect();
        let wait = self.wait;
        let rc = self
            .ring
            .as_mut()
            .ok_or_else(|| Error::Protocol("no shm ring".into()))?;
        let slot = rc.prepare(kind, xfer.id, &ops)?;
        let mut skip = vec![false; batch.len()];
        if kind == KIND_INLINE {
            let mut at = 0usize;
            for (j, &i) in batch.iter().enumerate() {
                let op = &xfer.ops[i];
                if op.kind == OpKind::Write {
                    // The bytes go into the slot now; a local failure withdraws the op, so the
                    // target copies nothing for it.
                    let r = op.local.lease(LeaseKind::Source, wait).and_then(|lease| {
                        // SAFETY: [at, at + len) lies in the slot's data area (the batch was cut
                        // to DATA_BYTES); the local span is leased and bounds-checked at submit.
                        unsafe {
                            copy_span(
                                &lease,
                                op.local_offset,
                                rc.ring.data_ptr(slot, at),
                                op.len as usize,
                                Dir::OutOfRegion,
                            )
                        }
                    });
                    if let Err(e) = r {
                        skip[j] = true;
                        rc.ring.skip_op(slot, j);
                        xfer.chunk_done(i, 0, Err(e));
                    }
                }
                at += op.len as usize;
            }
        }
        rc.publish(slot, POSTED);
        rc.wait_state(slot, DONE)?;
        let errors = rc.ring.read_result(slot)?;
        for (j, e) in errors {
            let j = j as usize;
            if j >= batch.len() {
                return Err(Error::Protocol("shm ring result index out of range".into()));
            }
            if !skip[j] {
                skip[j] = true;
                if matches!(e, Error::NoSuchRegion { .. } | Error::RegionGone { .. }) {
                    let gone = xfer.ops[batch[j]].remote.id;
                    self.maps.remove(&gone);
                }
                xfer.chunk_done(batch[j], 0, Err(e));
            }
        }
        let rc = self
            .ring
            .as_mut()
            .ok_or_else(|| Error::Protocol("no shm ring".into()))?;
        if kind == KIND_INLINE {
            let mut at = 0usize;
            for (j, &i) in batch.iter().enumerate() {
                let op = &xfer.ops[i];
                if !skip[j] && op.kind == OpKind::Read {
                    let r = op.local.lease(LeaseKind::Sink, wait).and_then(|lease| {
                        // SAFETY: as for the write above, from the slot into the local span.
                        unsafe {
                            copy_span(
                                &lease,
                                op.local_offset,
                                rc.ring.data_ptr(slot, at),
                                op.len as usize,
                                Dir::IntoRegion,
                            )
                        }
                    });
                    if let Err(e) = r {
                        skip[j] = true;
                        xfer.chunk_done(i, 0, Err(e));
                    }
                }
                at += op.len as usize;
            }
            rc.ring.state(slot).store(FREE, Ordering::Release);
            for (j, &i) in batch.iter().enumerate() {
                if !skip[j] {
                    xfer.chunk_done(i, xfer.ops[i].len, Ok(()));
                }
            }
            return Ok(());
        }
        // BEGIN: the target holds a lease on every accepted op until END.
        let mut done = Vec::new();
        let mut fatal = None;
        for (j, &i) in batch.iter().enumerate() {
            if skip[j] {
                continue;
            }
            if xfer.expired() {
                xfer.chunk_done(i, 0, Err(xfer.timeout_error()));
                continue;
            }
            match self.copy_direct(xfer, i) {
                Ok(()) => done.push(i),
                Err(e) if e.is_fatal_for_stream() => {
                    fatal = Some(e);
                    break;
                }
                Err(e) => xfer.chunk_done(i, 0, Err(e)),
            }
        }
        let rc = self
            .ring
            .as_mut()
            .ok_or_else(|| Error::Protocol("no shm ring".into()))?;
        rc.publish(slot, END);
        if let Some(e) = fatal {
            return Err(e);
        }
        for i in done {
            xfer.chunk_done(i, xfer.ops[i].len, Ok(()));
        }
        Ok(())
    }
}
