//! The shm transport (initiator side) for a peer on the same kernel.
//!
//! Set-up: connect to the peer's abstract unix socket, present the session token and pass the fd of
//! an 8 MiB memfd bounce buffer. Per remote agent-allocated region: ask once for its memfd (`ShmMap`;
//! read-only regions come back as a read-only fd) and map it. Per transfer: `ShmBegin` lists the ops,
//! the target checks and leases them; then the initiator copies — once, straight between its local
//! region and the mapped remote region (`Shm`), or twice through the bounce buffer for borrowed
//! remote regions (`ShmStaged`, one `ShmStaged` request per bounce-sized chunk); `ShmEnd` releases the
//! leases and carries the notification. Only the small control frames cross the socket.
//!
//! GPU regions: an op between a local GPU region and a remote one that carries a CUDA IPC handle
//! takes the `ipc` path (the remote memory mapped once, copied GPU to GPU, between `ShmBegin` and
//! `ShmEnd` so the target's leases cover it); otherwise GPU memory moves by the driver's pageable
//! copies into the mapped region or the bounce buffer, on whichever side holds the GPU.
//!
//! Ops are confirmed by the `ShmEnd` reply: if the target dies, every op of the batch fails with
//! `PeerLost` even if its copy into the (still mapped) memory had finished.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, AsRawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::conn::{Conn, Sock};
use crate::error::{Error, Result};
use crate::gpu::{copy_span, Dir};
use crate::mem::Mapping;
use crate::plan::Path;
use crate::region::LeaseKind;
use crate::transfer::{Drive, NewTransfer, OpKind, XferState};
use crate::transport::{SerialQueue, Transport};
use crate::wire::Msg;

/// Size of the bounce buffer used for borrowed remote regions.
pub(crate) const BOUNCE_BYTES: usize = 8 << 20;
use crate::wire::MAX_OPS_PER_BEGIN;

#[path = "shm_ring.rs"]
mod ring;
#[path = "shm_ring_begin.rs"]
mod ring_begin;
#[path = "shm_ring_client.rs"]
mod ring_client;
#[path = "shm_ring_inline.rs"]
mod ring_inline;

/// Runs transfers over one shm connection: small ones posted into the ring by the submitting
/// thread and completed by whoever waits (`ring::Driver`), the rest one at a time on a worker
/// thread.
#[derive(Debug)]
pub(crate) struct ShmTransport {
    /// Strong only here: dropping the transport closes the queue and ends the worker thread.
    queue: Arc<SerialQueue>,
    sock: Sock,
    /// The connection's state, used by the worker thread and, for small transfers, by the
    /// submitting and waiting threads themselves (no thread hand-off on the latency path).
    worker: Arc<Mutex<Worker>>,
    /// Transfers queued to the worker thread and not yet finished: a transfer is posted by the
    /// submitting thread only when this is 0, so transfers still start in submission order.
    queued: Arc<AtomicUsize>,
    /// Set when the connection broke off the worker thread.
    dead: Arc<AtomicBool>,
    /// What waiters drive the transfers posted by the submitting thread through.
    driver: Arc<ring::Driver>,
}

struct Worker {
    conn: Conn,
    bounce: Mapping,
    maps: HashMap<u64, (Mapping, bool)>,
    /// Remote GPU regions mapped through their IPC handle or fd, by remote region id (dropped
    /// when the target says the region is gone, or with the connection).
    imports: HashMap<u64, crate::gpu::DeviceRegion>,
    wait: Duration,
    /// The control ring (every transfer whose ops fit it runs without the socket).
    ring: Option<ring::RingClient>,
    /// Why the connection is unusable, once it is.
    broken: Option<Error>,
    /// Small transfers posted into the ring and not yet completed, oldest first.
    inflight: VecDeque<ring::Inflight>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("maps", &self.maps.len())
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}

impl ShmTransport {
    /// Connects to the peer's shm socket and joins the control session.
    /// With a session `key` (authenticated session) the socket's server must prove it holds
    /// it: that confirms it is the agent the control connection authenticated, on this host.
    /// `until`: the connect's handshake deadline.
    pub(crate) fn connect(
        socket_name: &str,
        (session, token, key): (u128, u128, Option<crate::auth::Mac>),
        cfg: &crate::config::AgentConfig,
        until: std::time::Instant,
    ) -> Result<Self> {
        let io_timeout = cfg.io_timeout;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(socket_name.as_bytes())
            .map_err(|e| Error::os("socket address", e))?;
        let s =
            UnixStream::connect_addr(&addr).map_err(|e| Error::os("connect (shm socket)", e))?;
        // Whoever holds that abstract name must run as us (or an allowed user).
        let uid = crate::mem::peer_uid(s.as_raw_fd())?;
        if uid != crate::mem::my_uid() && !cfg.shm_allowed_uids.contains(&uid) {
            return Err(Error::AuthFailed(format!(
                "the shm socket {socket_name} belongs to uid {uid}, not ours"
            )));
        }
        let mut conn = Conn::new(Sock::Unix(s), "shm connection");
        conn.set_timeout(Some(io_timeout))?;
        conn.start_handshake(until, cfg.limits.handshake_timeout, crate::wire::MAX_BODY);
        let bounce = Mapping::memfd(BOUNCE_BYTES, "bounce")?;
        let fd = bounce
            .fd()
            .ok_or_else(|| Error::Unavailable("bounce buffer has no fd".into()))?;
        let nonce = crate::mem::random_u128()?;
        conn.send_with_fd(
            &Msg::ShmJoin {
                session,
                token,
                nonce,
            },
            fd,
        )?;
        match key {
            Some(k) => crate::auth::join(&mut conn, &k, "shm", &session.to_le_bytes(), nonce)?,
            None => match conn.recv_frame(false)? {
                (Msg::Ok, 0) => {}
                (Msg::Err(e), _) => return Err(e),
                (m, _) => {
                    return Err(Error::Protocol(format!(
                        "expected Ok to ShmJoin, got frame type {}",
                        m.kind()
                    )))
                }
            },
        }
        conn.end_handshake(io_timeout)?;
        // The control ring: attached once, before any transfer.
        let r = crate::ring::Ring::create()?;
        let rfd = r
            .fd()
            .ok_or_else(|| Error::Unavailable("shm ring has no fd".into()))?;
        conn.send_with_fd(
            &Msg::ShmRing {
                slots: crate::ring::SLOTS as u32,
                slot_bytes: crate::ring::SLOT_BYTES as u32,
            },
            rfd,
        )?;
        match conn.recv_frame(false)? {
            (Msg::Ok, 0) => {}
            (Msg::Err(e), _) => return Err(e),
            (m, _) => {
                return Err(Error::Protocol(format!(
                    "expected Ok to ShmRing, got frame type {}",
                    m.kind()
                )))
            }
        }
        let sock = conn.shutdown_handle()?;
        let ring = ring::RingClient::new(r, conn.raw_fd(), io_timeout);
        let (rc_ring, rc_front) = (Arc::clone(&ring.ring), Arc::clone(&ring.front));
        let w = Worker {
            conn,
            bounce,
            maps: HashMap::new(),
            imports: HashMap::new(),
            wait: io_timeout,
            ring: Some(ring),
            broken: None,
            inflight: VecDeque::new(),
        };
        let worker = Arc::new(Mutex::new(w));
        let queued = Arc::new(AtomicUsize::new(0));
        let dead = Arc::new(AtomicBool::new(false));
        let (w, q, d) = (Arc::clone(&worker), Arc::clone(&queued), Arc::clone(&dead));
        let queue = Arc::new(SerialQueue::spawn("gdx-shm", move |rx, alive| {
            worker_thread(&w, rx, &alive, &q, &d)
        })?);
        let driver = Arc::new(ring::Driver {
            ring: Arc::clone(&rc_ring),
            front: Arc::clone(&rc_front),
            worker: Arc::downgrade(&worker),
            queue: Arc::downgrade(&queue),
            dead: Arc::clone(&dead),
        });
        Ok(ShmTransport {
            queue,
            sock,
            worker,
            queued,
            dead,
            driver,
        })
    }
}

impl ShmTransport {
    /// The worker, when the submitting thread may post into the ring itself: free now, and
    /// (re-checked under its lock: the worker thread lowers the count under it, once what it
    /// took has started) nothing submitted earlier still waiting to start.
    fn post_here(&self) -> Option<std::sync::MutexGuard<'_, Worker>> {
        if self.queued.load(Ordering::SeqCst) != 0 {
            return None;
        }
        let w = self.worker.try_lock().ok()?;
        (self.queued.load(Ordering::SeqCst) == 0 && self.queue.is_alive()).then_some(w)
    }
}

impl Transport for ShmTransport {
    fn submit(&self, mut xfer: Arc<XferState>) {
        if ring::may_post(&xfer) {
            if let Some(mut w) = self.post_here() {
                let mut done = ring::Done::new();
                let back = w.post_guarded(xfer, &mut done);
                if w.broken.is_some() {
                    self.dead.store(true, Ordering::SeqCst);
                }
                drop(w);
                done.finish();
                // A slot left in flight is completed by whoever waits for it, polls it or
                // submits next on this connection (a leased one; an inline one when the ring
                // has no free slot, `slot_ready`); a handle dropped first hands it to the
                // worker thread (`TransferHandle`'s drop). Waking the worker per transfer
                // instead costs more than a 1 MiB copy on a machine of few cores.
                match back {
                    None => return,
                    Some(x) => xfer = x,
                }
            }
        }
        self.queued.fetch_add(1, Ordering::SeqCst);
        self.queue.submit(xfer);
    }

    fn submit_new(&self, n: NewTransfer<'_>) -> Arc<XferState> {
        if !ring::posts_early(&n) {
            return super::submit_built(self, n);
        }
        let Some(mut w) = self.post_here() else {
            return super::submit_built(self, n);
        };
        let mut done = ring::Done::new();
        let x = match w.post_early(&n, &mut done) {
            Ok(None) => {
                drop(w);
                done.finish();
                return super::submit_built(self, n);
            }
            // The slot is on its way: the state is built while the peer works.
            Ok(Some(e)) => {
                let x = Arc::new(n.build());
                w.in_flight_early(Arc::clone(&x), e);
                x
            }
            Err(e) => {
                let x = Arc::new(n.build());
                w.fail_early(Arc::clone(&x), e, &mut done);
                self.dead.store(true, Ordering::SeqCst);
                x
            }
        };
        drop(w);
        done.finish();
        x
    }

    fn driver(&self) -> Option<Arc<dyn Drive>> {
        Some(Arc::clone(&self.driver) as Arc<dyn Drive>)
    }

    fn is_alive(&self) -> bool {
        self.queue.is_alive() && !self.dead.load(Ordering::SeqCst)
    }

    fn close(&self) {
        self.queue.close();
        self.sock.shutdown();
    }
}

fn worker_thread(
    w: &Mutex<Worker>,
    rx: Receiver<Arc<XferState>>,
    alive: &AtomicBool,
    queued: &AtomicUsize,
    dead: &AtomicBool,
) {
    // A transfer taken off the queue that could not join a pipelined group.
    let mut next: Option<Arc<XferState>> = None;
    loop {
        let xfer = match next.take() {
            Some(x) => x,
            None => match rx.recv() {
                Ok(x) => x,
                Err(_) => break,
            },
        };
        let mut w = w.lock().unwrap_or_else(|p| p.into_inner());
        let mut done = ring::Done::new();
        // Whatever is in flight completes before anything queued starts (a waiter about to
        // sleep sends its in-flight transfer here again, `driven`: that is all it needs).
        let mut broke = w.reap_guarded(true, &mut done);
        let mut counted = 0;
        if !xfer.driven() {
            if ring::posts_inline(&xfer) {
                // Small transfers queued behind each other share the ring: their slots are
                // all posted before the first answer is awaited.
                let mut group = vec![xfer];
                while group.len() < ring::PIPELINE {
                    match rx.try_recv() {
                        Ok(x) if x.driven() => {}
                        Ok(x) if ring::posts_inline(&x) => group.push(x),
                        Ok(x) => {
                            next = Some(x);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                counted = group.len();
                broke |= w.pipeline_guarded(&group, &mut done);
            } else {
                broke |= w.run_guarded(&xfer);
                counted = 1;
                done.push(xfer);
            }
        }
        if broke {
            alive.store(false, Ordering::SeqCst);
            dead.store(true, Ordering::SeqCst);
        }
        // Lowered while the lock is held, before the transfers end: they have all started (and
        // been answered), so nothing queued earlier waits any more. Lowered after they end, a
        // submitter that sees its transfer end and submits the next at once could find the
        // count not yet lowered and hand that one to this thread too (a thread hand-off, tens
        // of µs on a small VM, where its own post would do).
        queued.fetch_sub(counted, Ordering::SeqCst);
        drop(w);
        done.finish();
    }
    let mut w = w.lock().unwrap_or_else(|p| p.into_inner());
    let mut done = ring::Done::new();
    w.reap_guarded(true, &mut done);
    if w.broken.is_none() {
        let _ = w.conn.send(&Msg::Bye);
    }
    drop(w);
    done.finish();
}

impl Worker {
    /// Runs one transfer (or fails it at once on a broken connection); true when this transfer
    /// broke the connection.
    fn run_guarded(&mut self, xfer: &XferState) -> bool {
        if let Some(e) = &self.broken {
            xfer.fail_pending(e);
            return false;
        }
        match self.run(xfer) {
            Ok(()) => false,
            Err(e) => {
                xfer.fail_pending(&e);
                self.broken = Some(e);
                true
            }
        }
    }

    /// Runs one transfer; `Err` means the connection is unusable.
    fn run(&mut self, xfer: &XferState) -> Result<()> {
        let plans: Vec<Path> = xfer.paths().collect();
        let mut ok = vec![true; xfer.ops.len()];
        // Map every agent-allocated remote region once.
        for (i, op) in xfer.op_refs().enumerate() {
            let again = i > 0 && ok[i - 1] && xfer.op(i - 1).remote.id == op.remote.id;
            if plans[i] == Path::Shm && !again && !self.maps.contains_key(&op.remote.id) {
                if let Err(e) = self.map(op.remote.id, op.remote.key, op.remote.access.remote_write)
                {
                    if e.is_fatal_for_stream() {
                        return Err(e);
                    }
                    xfer.chunk_done(i, 0, Err(e));
                    ok[i] = false;
                }
            }
        }
        if self.run_ring(xfer, &plans, &ok)? {
            return Ok(());
        }
        let idx: Vec<usize> = (0..xfer.ops.len()).filter(|&i| ok[i]).collect();
        for batch in idx.chunks(MAX_OPS_PER_BEGIN) {
            let ops = ring::ring_ops(xfer, batch);
            let begin = self.conn.request(&Msg::ShmBegin { xfer: xfer.id, ops })?;
            let Msg::ShmBeginResult { errors } = begin else {
                return Err(Error::Protocol("expected ShmBeginResult".into()));
            };
            let mut batch_ok = vec![true; batch.len()];
            for (j, e) in errors {
                let j = j as usize;
                if j >= batch.len() {
                    return Err(Error::Protocol("ShmBeginResult index out of range".into()));
                }
                batch_ok[j] = false;
                if matches!(e, Error::NoSuchRegion { .. } | Error::RegionGone { .. }) {
                    let gone = xfer.op(batch[j]).remote.id;
                    self.imports.remove(&gone);
                    self.maps.remove(&gone);
                }
                xfer.chunk_done(batch[j], 0, Err(e));
            }
            let mut done = Vec::new();
            for (j, &i) in batch.iter().enumerate() {
                if !batch_ok[j] {
                    continue;
                }
                if xfer.expired() {
                    xfer.chunk_done(i, 0, Err(xfer.timeout_error()));
                    continue;
                }
                let r = match plans[i] {
                    Path::Shm => self.copy_direct(xfer, i),
                    Path::Ipc => self.copy_ipc(xfer, i),
                    _ => self.copy_staged(xfer, i),
                };
                match r {
                    Ok(()) => done.push(i),
                    Err(e) if e.is_fatal_for_stream() => return Err(e),
                    Err(e) => xfer.chunk_done(i, 0, Err(e)),
                }
            }
            let last = batch.last() == idx.last();
            let notify = if last && !xfer.has_failed() {
                xfer.notify.clone()
            } else {
                None
            };
            match self.conn.request(&Msg::ShmEnd {
                xfer: xfer.id,
                notify,
            }) {
                Ok(Msg::Ok) => {}
                // The target refused the notification (its queue is full): the bytes are in
                // place but the transfer did not complete as asked; the connection is fine.
                Err(e) if !e.is_fatal_for_stream() => {
                    for i in done {
                        xfer.chunk_done(i, 0, Err(e.clone()));
                    }
                    continue;
                }
                Err(e) => return Err(e),
                Ok(m) => {
                    return Err(Error::Protocol(format!(
                        "expected Ok to ShmEnd, got frame type {}",
                        m.kind()
                    )))
                }
            }
            for i in done {
                xfer.chunk_done(i, xfer.ops[i].len, Ok(()));
            }
        }
        Ok(())
    }

    /// Delivers the notification of a transfer that ran on the ring (its bytes are in place).
    fn send_notify(&mut self, xfer: &XferState, n: Vec<u8>) -> Result<()> {
        match self.conn.request(&Msg::ShmEnd {
            xfer: xfer.id,
            notify: Some(n),
        }) {
            Ok(Msg::Ok) => Ok(()),
            // The target refused it (queue full): the connection is fine, the transfer failed.
            Err(e) if !e.is_fatal_for_stream() => {
                xfer.fail_transfer(e);
                Ok(())
            }
            Err(e) => Err(e),
            Ok(m) => Err(Error::Protocol(format!(
                "expected Ok to ShmEnd, got frame type {}",
                m.kind()
            ))),
        }
    }

    /// `ShmMap`: the fd the target passes for a region (its memfd, or a VMM GPU region's POSIX
    /// fd), with the length to map and whether it is writable.
    fn request_fd(
        &mut self,
        region: u64,
        key: crate::region::RegionKey,
        write: bool,
    ) -> Result<(std::os::fd::OwnedFd, u64, bool)> {
        match self.conn.request(&Msg::ShmMap { region, key, write })? {
            Msg::ShmMapped { len, writable } => {
                let fd = self
                    .conn
                    .take_fd()
                    .ok_or_else(|| Error::Protocol("ShmMapped without an fd".into()))?;
                Ok((fd, len, writable))
            }
            m => Err(Error::Protocol(format!(
                "expected ShmMapped, got frame type {}",
                m.kind()
            ))),
        }
    }

    fn map(&mut self, region: u64, key: crate::region::RegionKey, write: bool) -> Result<()> {
        let (fd, len, writable) = self.request_fd(region, key, write)?;
        let len = usize::try_from(len).map_err(|_| Error::Protocol("mapping too large".into()))?;
        // Sealed against shrink (no SIGBUS if the target truncates it) and at least `len`
        // bytes, checked before the mapping exists.
        crate::mem::verify_memfd(fd.as_raw_fd(), Some(len), !writable)?;
        let m = Mapping::map_fd(fd.as_raw_fd(), len, writable)?;
        self.maps.insert(region, (m, writable));
        Ok(())
    }

    fn copy_direct(&mut self, xfer: &XferState, i: usize) -> Result<()> {
        let op = xfer.op(i);
        let (m, writable) = self.maps.get(&op.remote.id).ok_or(Error::NoSuchRegion {
            region: op.remote.id,
        })?;
        crate::region::check_bounds(op.remote_offset, op.len, m.len() as u64)?;
        // SAFETY: remote_offset + len <= m.len() (checked above).
        let remote = unsafe { m.ptr().add(op.remote_offset as usize) };
        let (kind, dir) = match op.kind {
            OpKind::Write if !writable => {
                return Err(Error::ReadOnly {
                    region: op.remote.id,
                })
            }
            OpKind::Write => (LeaseKind::Source, Dir::OutOfRegion),
            OpKind::Read => (LeaseKind::Sink, Dir::IntoRegion),
        };
        let lease = op.local.lease(kind, self.wait)?;
        // SAFETY: the remote span is checked above, mapped (writable for a write) and leased by
        // the target since ShmBegin; the local span was bounds-checked at submit and is held by
        // the lease; distinct mappings do not overlap.
        unsafe { copy_span(&lease, op.local_offset, remote, op.len as usize, dir) }
    }

    /// The `ipc` path: the remote GPU region mapped through its CUDA IPC handle (once per region,
    /// cached by the local peer), copied GPU to GPU and waited for, while the target holds the
    /// leases taken by `ShmBegin`.
    fn copy_ipc(&mut self, xfer: &XferState, i: usize) -> Result<()> {
        let op = xfer.op(i);
        let dev = op.local.device().ok_or_else(|| {
            Error::InvalidArgument("an ipc op needs a GPU region on this side".into())
        })?;
        let ipc = op.remote.ipc.as_ref().ok_or_else(|| {
            Error::Unavailable(format!("remote region {} has no IPC handle", op.remote.id))
        })?;
        // Keep the mapping for the life of this connection: mapping a CUDA IPC handle costs
        // far more than a copy's set-up, so it is done once per remote region.
        let remote = match self.imports.get(&op.remote.id) {
            Some(r) => r.clone(),
            None => {
                let r = match ipc.posix_fd_alloc_len {
                    None => dev.peer.import_ipc(ipc)?,
                    Some(_) => match dev.peer.imported(ipc) {
                        Some(r) => r,
                        None => {
                            // A VMM region: ask the target for its fd.
                            let (fd, _, _) = self.request_fd(op.remote.id, op.remote.key, false)?;
                            dev.peer.import_fd(ipc, fd.as_fd())?
                        }
                    },
                };
                self.imports.insert(op.remote.id, r.clone());
                r
            }
        };
        let kind = match op.kind {
            OpKind::Write => LeaseKind::Source,
            OpKind::Read => LeaseKind::Sink,
        };
        let _lease = op.local.lease(kind, self.wait)?;
        // `transfer` (not `copy_blocking`): large copies split over several copy engines, as
        // between two GPUs of one process.
        let t = match op.kind {
            OpKind::Write => dev.peer.transfer(
                &remote,
                op.remote_offset,
                &dev.region,
                op.local_offset,
                op.len,
            )?,
            OpKind::Read => dev.peer.transfer(
                &dev.region,
                op.local_offset,
                &remote,
                op.remote_offset,
                op.len,
            )?,
        };
        t.wait()?;
        Ok(())
    }

    fn copy_staged(&mut self, xfer: &XferState, i: usize) -> Result<()> {
        let op = xfer.op(i);
        let write = op.kind == OpKind::Write;
        let lease = op.local.lease(
            if write {
                LeaseKind::Source
            } else {
                LeaseKind::Sink
            },
            self.wait,
        )?;
        let mut off = 0u64;
        while off < op.len {
            let len = (op.len - off).min(BOUNCE_BYTES as u64);
            let local_off = op.local_offset + off;
            if write {
                // SAFETY: len <= bounce size; the bounce buffer is this worker's own mapping; the
                // local span lies within the leased, bounds-checked op span.
                unsafe {
                    copy_span(
                        &lease,
                        local_off,
                        self.bounce.ptr(),
                        len as usize,
                        Dir::OutOfRegion,
                    )?
                };
            }
            let msg = Msg::ShmStaged {
                xfer: xfer.id,
                op: i as u32,
                write,
                region: op.remote.id,
                key: op.remote.key,
                offset: op.remote_offset + off,
                len,
            };
            match self.conn.request(&msg)? {
                Msg::Ok => {}
                m => {
                    return Err(Error::Protocol(format!(
                        "expected Ok to ShmStaged, got frame type {}",
                        m.kind()
                    )))
                }
            }
            if !write {
                // SAFETY: as above, from the bounce buffer into the local span.
                unsafe {
                    copy_span(
                        &lease,
                        local_off,
                        self.bounce.ptr(),
                        len as usize,
                        Dir::IntoRegion,
                    )?
                };
            }
            off += len;
        }
        Ok(())
    }
}
