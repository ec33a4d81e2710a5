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
//! Borrowed remote host regions, where the kernel allows it, take the `cma` path instead
//! (`cma.rs`): one kernel copy between the processes, many ops per system call.
//!
//! Ops are confirmed by the `ShmEnd` reply: if the target dies, every op of the batch fails with
//! `PeerLost` even if its copy into the (still mapped) memory had finished.

use std::collections::{HashMap, VecDeque};
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};

use crate::conn::{Conn, Sock};
use crate::error::{AuthFailure, Error, Result};
use crate::mem::Mapping;
use crate::transfer::{Drive, NewTransfer, XferState};
use crate::transport::{SerialQueue, Transport};
use crate::wire::Msg;

mod cma;
mod ipc;
mod ring;
mod ring_begin;
mod ring_client;
mod ring_inline;
mod ring_target;
mod socket;
mod standing;
mod target;
mod worker;

use worker::{Worker, BOUNCE_BYTES};

pub(crate) use cma::CMA_FRAMES_BIT;
pub(crate) use target::serve_target;

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
    /// Whether ops to the peer's borrowed host regions may take the `cma` path.
    cma: crate::routing::plan::CmaGrant,
}

impl ShmTransport {
    /// Connects to the peer's shm socket and joins the control session.
    /// With a session `key` (authenticated session) the socket's server must prove it holds
    /// it: that confirms it is the agent the control connection authenticated, on this host.
    /// `until`: the connect's handshake deadline. `peer_cma`: the peer's `Hello` says its shm
    /// target understands the cma frames.
    pub(crate) fn connect(
        socket_name: &str,
        (session, token, key): (u128, u128, Option<crate::auth::Mac>),
        cfg: &crate::config::AgentConfig,
        cuda: Arc<std::sync::OnceLock<crate::gpu::LocalPeer>>,
        until: std::time::Instant,
        peer_cma: bool,
    ) -> Result<Self> {
        let io_timeout = cfg.io_timeout;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(socket_name.as_bytes())
            .map_err(|e| Error::os("socket address", e))?;
        let s =
            UnixStream::connect_addr(&addr).map_err(|e| Error::os("connect (shm socket)", e))?;
        // Whoever holds that abstract name must run as us (or an allowed user).
        let uid = crate::mem::peer_uid(s.as_raw_fd())?;
        if uid != crate::mem::my_uid() && !cfg.shm_allowed_uids.contains(&uid) {
            return Err(Error::auth(
                AuthFailure::User,
                format!("the shm socket {socket_name} belongs to uid {uid}, not ours"),
            ));
        }
        let mut conn = Conn::new(Sock::Unix(s), "shm connection");
        conn.set_timeout(Some(io_timeout))?;
        conn.start_handshake(until, cfg.limits.handshake_timeout, crate::wire::MAX_BODY);
        let bounce = Mapping::memfd(BOUNCE_BYTES, "bounce")?;
        let fd = bounce
            .fd()
            .ok_or_else(|| Error::unavailable(None, "bounce buffer has no fd"))?;
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
        let r = crate::shm_ring::Ring::create()?;
        let rfd = r
            .fd()
            .ok_or_else(|| Error::unavailable(None, "shm ring has no fd"))?;
        conn.send_with_fd(
            &Msg::ShmRing {
                slots: crate::shm_ring::SLOTS as u32,
                slot_bytes: crate::shm_ring::SLOT_BYTES as u32,
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
        let pid = crate::mem::peer_pid(conn.raw_fd())?;
        let cma = cma::probe(&mut conn, pid, peer_cma)?;
        let sock = conn.shutdown_handle()?;
        let ring = ring::RingClient::new(r, conn.raw_fd(), io_timeout);
        let (rc_ring, rc_front) = (Arc::clone(&ring.ring), Arc::clone(&ring.front));
        let w = Worker {
            conn,
            bounce,
            maps: HashMap::new(),
            imports: HashMap::new(),
            end_unread: false,
            cuda,
            wait: io_timeout,
            ring: Some(ring),
            broken: None,
            inflight: VecDeque::new(),
            cma: cma.clone(),
            cma_regions: HashMap::new(),
            current: None,
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
            cma,
        })
    }

    /// Whether ops to the peer's borrowed host regions may take the `cma` path, and why not.
    pub(crate) fn cma(&self) -> &crate::routing::plan::CmaGrant {
        &self.cma
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
        // A `cma` op under a standing lease is copied by this thread (`submit`), cheaper than
        // staging it through a slot for the target's thread.
        if w.standing_for(&n) {
            drop(w);
            return super::submit_built(self, n);
        }
        let mut done = ring::Done::new();
        let x = match w.post_early(&n, &mut done) {
            Ok(None) => {
                drop(w);
                done.finish();
                return super::submit_built(self, n);
            }
            // The slot is on its way: the state is built while the peer works.
            Ok(Some(e)) => {
                let x = n.into_state();
                w.in_flight_early(Arc::clone(&x), e);
                x
            }
            Err(e) => {
                let x = n.into_state();
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
        // The peer's memory mapped here (its regions' shared memory, its GPU allocations
        // through their IPC handles) goes with the connection, not with the last Rust or
        // Python reference to it: a closed peer leaves no mapping behind. The worker's
        // transfer in flight, if any, ends quickly on the shut socket.
        let mut w = self.worker.lock().unwrap_or_else(|p| p.into_inner());
        w.imports.clear();
        w.maps.clear();
        w.cma_regions.clear();
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
                w.current = Some(Arc::clone(&xfer));
                broke |= w.run_guarded(&xfer);
                w.current = None;
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
