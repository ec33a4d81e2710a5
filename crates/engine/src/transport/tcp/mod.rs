//! The tcp transport (initiator side): several data streams per peer over one or more rails
//! (local address → peer address pairs, `AgentConfig::nics`), ops cut into chunks of at most
//! `chunk_bytes`, up to [`WINDOW`] chunks in flight per stream.
//!
//! Rails: a transfer of at least [`SPLIT_BYTES`] is spread over the streams of every active rail
//! in proportion to each stream's measured throughput (a moving average over its jobs); a smaller
//! one goes to the best rail's streams. A stream that breaks (reset, timeout, refused) pauses its
//! rail with the cause; the chunks it had not confirmed are reissued on a healthy rail, so the
//! transfer completes with every byte confirmed by the target, or fails naming each rail's cause
//! when no rail is left. The notification goes after every chunk landed. A broken stream's thread
//! re-probes its rail (a fresh connection joining the session) once the rail's backoff has passed,
//! and the rail takes work again when that succeeds.
//!
//! GPU regions (this side): each stream queues the device-to-host copies of its next chunks into
//! pinned slots while it sends the current one, and a read's payload lands in a pinned slot whose
//! copy to the GPU is queued while the next reply is received (the chunk completes when the copy
//! is done). The target does the mirror image for its GPU regions (see `server`).
//!
//! Latency path: a small transfer of host memory (at most [`FAST_BYTES`] and [`WINDOW`] chunks) on
//! an idle stream is written by the submitting thread itself, under the stream's lock, which then
//! polls for the replies for at most `spin::TCP_SUBMIT_SPIN` and completes the ops itself: one
//! request/ack on the established stream, no thread between the bytes and the completion. Replies
//! not there by then (a stalled peer), and the notification, go to the stream's thread. Anything
//! larger, or a stream with work queued, goes through the stream's thread as before.
//!
//! Block lists: runs of whole small ops of host memory go as one `WriteBatch`/`ReadBatch`
//! request and one answer per stream (`batch.rs`), not a frame and a reply per op.
//!
//! Payloads go from the local region to the socket and from the socket into the local region without
//! an intermediate buffer. Each chunk is confirmed by the target (`WriteAck` after the payload landed,
//! or `ReadData`). Reissuing a chunk is safe: a write puts the same bytes at the same place, a read
//! fetches them again.

use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::conn::{Conn, Sock};
use crate::error::{Error, Result};
use crate::gpu::Stager;
use crate::rails::Rails;
use crate::transfer::XferState;
use crate::transport::Transport;
use crate::wire::Msg;

mod batch;
mod chunks;
mod job;
mod queue;
mod target;

pub(crate) use batch::TCP_BATCH_BIT;
use chunks::{
    await_replies, drain_stale, fail_chunks, recv_reply, run_job, send_chunk, Broke, Staging, Tally,
};
use job::{Chunk, Group, Job, WINDOW};
use queue::JobQueue;
pub(crate) use target::serve_stream;

/// Largest transfer (all its bytes) the submitting thread writes itself. Far below a socket's
/// buffer, so on an idle stream the write never waits for the peer, even a stalled one.
const FAST_BYTES: u64 = 64 << 10;

/// Smallest transfer spread over every active rail; a smaller one goes to the best rail only
/// (a rail's round trip would cost more than its share of the bytes saves).
pub(crate) const SPLIT_BYTES: u64 = 1 << 20;

/// Slices per stream a transfer spread over several rails is cut into (at least).
const SLICES_PER_STREAM: u64 = 8;

/// Smallest slice of a transfer spread over several rails.
const MIN_SLICE: u64 = 256 << 10;

/// Smallest job whose duration is taken as a throughput sample (below, latency dominates).
pub(crate) const MEASURE_BYTES: u64 = 1 << 20;

/// One data stream's connection and what its users share.
struct Stream {
    conn: Conn,
    stager: Stager,
    /// Why the stream is unusable, once it is.
    broken: Option<Error>,
    /// Replies of abandoned chunks (their transfer halted) still to read and drop before the
    /// stream's next request (`chunks::drain_stale`).
    stale: usize,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("conn", &self.conn)
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}

/// One end pair of a rail: where its streams connect from (`None`: wherever the kernel
/// routes) and to.
#[derive(Debug, Clone)]
pub(crate) struct RailEnd {
    pub(crate) bind: Option<IpAddr>,
    pub(crate) to: SocketAddr,
}

/// Connects from `bind` (if given) to `to` within `timeout`.
pub(crate) fn connect_from(
    bind: Option<IpAddr>,
    to: SocketAddr,
    timeout: Duration,
) -> std::io::Result<TcpStream> {
    let Some(ip) = bind else {
        return TcpStream::connect_timeout(&to, timeout);
    };
    let family = if to.is_ipv4() {
        rustix::net::AddressFamily::INET
    } else {
        rustix::net::AddressFamily::INET6
    };
    let fd = rustix::net::socket(family, rustix::net::SocketType::STREAM, None)?;
    rustix::net::bind(&fd, &SocketAddr::new(ip, 0))?;
    let s = TcpStream::from(fd);
    // Linux bounds a blocking connect by the send timeout.
    s.set_write_timeout(Some(timeout.max(Duration::from_millis(1))))?;
    match rustix::net::connect(&s, &to) {
        Ok(()) => Ok(s),
        Err(rustix::io::Errno::INPROGRESS) | Err(rustix::io::Errno::AGAIN) => Err(
            std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"),
        ),
        Err(e) => Err(e.into()),
    }
}

/// How a data stream joins the peer's session: at connect, and again when a broken stream
/// re-probes its rail.
#[derive(Debug)]
pub(crate) struct Joiner {
    pub(crate) session: u128,
    pub(crate) token: u128,
    pub(crate) key: Option<crate::auth::Mac>,
    pub(crate) ends: Vec<RailEnd>,
    pub(crate) io_timeout: Duration,
    pub(crate) handshake_timeout: Duration,
}

impl Joiner {
    /// A data stream `stream` over rail `rail`, joined and authenticated before `until`.
    pub(crate) fn join(&self, rail: usize, stream: u16, until: Instant) -> Result<Conn> {
        let end = &self.ends[rail];
        let left = until.saturating_duration_since(Instant::now());
        let s = connect_from(end.bind, end.to, left.min(self.io_timeout)).map_err(|e| {
            let from = end.bind.map(|b| format!(" from {b}")).unwrap_or_default();
            Error::peer_lost(format!("data stream {stream}{from} to {}: {e}", end.to))
        })?;
        let mut c = Conn::new(Sock::Tcp(s), "tcp data stream");
        c.set_timeout(Some(self.io_timeout))?;
        c.start_handshake(until, self.handshake_timeout, crate::wire::MAX_BODY);
        let nonce = crate::mem::random_u128()?;
        c.send(&Msg::Join {
            session: self.session,
            token: self.token,
            stream,
            nonce,
        })?;
        match self.key {
            Some(k) => {
                let mut ctx = self.session.to_le_bytes().to_vec();
                ctx.extend_from_slice(&stream.to_le_bytes());
                crate::auth::join(&mut c, &k, "join", &ctx, nonce)?;
            }
            None => match c.recv_frame(false)? {
                (Msg::Ok, 0) => {}
                (Msg::Err(e), _) => return Err(e),
                (m, _) => {
                    return Err(Error::Protocol(format!(
                        "expected Ok to Join, got frame type {}",
                        m.kind()
                    )))
                }
            },
        }
        c.end_handshake(self.io_timeout)?;
        Ok(c)
    }
}

#[derive(Debug)]
struct Worker {
    jobs: JobQueue<Job>,
    /// A handle to shut the stream's socket down (replaced when the stream reconnects).
    sock: Mutex<Sock>,
    stream: Mutex<Stream>,
    /// Jobs queued to the stream's thread and not yet done: the submitting thread writes only
    /// when this is 0, so replies still come back in the order the stream's thread expects.
    queued: AtomicUsize,
    /// Set while `stream.broken` is (read without the stream's lock, which a job holds).
    broken: AtomicBool,
    /// The rail this stream runs over.
    rail: usize,
    /// The stream's number in the session (`Join::stream`).
    idx: u16,
}

/// What the submitting side and the stream threads share.
#[derive(Debug)]
struct Net {
    workers: Vec<Worker>,
    rails: Arc<Rails>,
    joiner: Joiner,
    control: Arc<Mutex<Conn>>,
    io_timeout: Duration,
    closed: AtomicBool,
    /// The target takes block lists as batch frames (`batch.rs`).
    batch: bool,
}

/// Runs transfers over a set of joined data streams on one or more rails.
#[derive(Debug)]
pub(crate) struct TcpTransport {
    net: Arc<Net>,
    chunk: u64,
}

impl Net {
    /// Whether worker `w` takes work: its stream is whole and its rail active.
    fn usable(&self, w: usize) -> bool {
        let wk = &self.workers[w];
        !wk.broken.load(Ordering::SeqCst) && self.rails.is_active(wk.rail)
    }

    /// The workers a transfer goes to: every usable one when `spread` (or when the best rail
    /// has none usable), else the best rail's.
    fn pick(&self, spread: bool) -> Vec<usize> {
        let all: Vec<usize> = (0..self.workers.len())
            .filter(|&w| self.usable(w))
            .collect();
        if spread || self.rails.len() == 1 {
            return all;
        }
        let Some(best) = self.rails.best() else {
            return all;
        };
        let on_best: Vec<usize> = all
            .iter()
            .copied()
            .filter(|&w| self.workers[w].rail == best)
            .collect();
        if on_best.is_empty() {
            all
        } else {
            on_best
        }
    }

    /// The error of a transfer no rail can carry on: the one rail's own error, or every rail's
    /// cause.
    fn no_rail_left(&self, e: &Error) -> Error {
        if self.rails.len() == 1 {
            return e.clone();
        }
        Error::peer_lost(format!("no rail left: {}", self.rails.causes()))
    }

    /// Stream `w` broke with `e`: it stays broken (until its thread re-probes the rail) and its
    /// rail is paused.
    fn broke(&self, w: usize, st: &mut Stream, e: &Error) {
        st.broken = Some(e.clone());
        self.workers[w].broken.store(true, Ordering::SeqCst);
        self.rails.pause(self.workers[w].rail, e);
    }

    /// Hands `chunks` of `job` (left unconfirmed by a stream that broke with `e`) to the best
    /// usable stream, or fails them when no rail is left or the transfer's time is up.
    fn reissue(&self, job: &Job, chunks: Vec<Chunk>, e: &Error) {
        if chunks.is_empty() {
            return;
        }
        if let Some(halt) = job.xfer.halt() {
            fail_chunks(&job.xfer, &chunks, &halt);
            return;
        }
        let target = self.pick(false).into_iter().min_by_key(|&w| {
            (
                self.workers[w].queued.load(Ordering::SeqCst),
                usize::from(self.workers[w].idx),
            )
        });
        let Some(w) = target else {
            fail_chunks(&job.xfer, &chunks, &self.no_rail_left(e));
            return;
        };
        log::debug!(
            "gdx: {} chunk(s) of transfer {} reissued on rail {} ({e})",
            chunks.len(),
            job.xfer.id,
            self.rails.rail(self.workers[w].rail).local
        );
        job.group.left.fetch_add(1, Ordering::AcqRel);
        let again = Job {
            xfer: Arc::clone(&job.xfer),
            chunks,
            group: Arc::clone(&job.group),
            sent: None,
        };
        self.push(w, again);
    }

    /// Queues `job` to worker `w`; a closed queue fails its chunks.
    fn push(&self, w: usize, job: Job) {
        let worker = &self.workers[w];
        worker.queued.fetch_add(1, Ordering::SeqCst);
        if let Err(job) = worker.jobs.push(job, true) {
            worker.queued.fetch_sub(1, Ordering::SeqCst);
            let e = Error::peer_lost("peer connection closed");
            fail_chunks(&job.xfer, job.sent.as_deref().unwrap_or(&job.chunks), &e);
            group_done(&job);
        }
    }

    /// Where worker `w` counts the bytes it lands for `xfer`.
    fn tally<'a>(&'a self, w: usize, xfer: &'a XferState) -> Tally<'a> {
        let rail = self.workers[w].rail;
        Tally {
            rail: Some(self.rails.counter(rail)),
            xfer: xfer.rail_bytes.get(rail),
        }
    }

    /// A fresh connection for broken stream `w` (its thread, idle): the rail takes work again
    /// when it joins; otherwise the rail's backoff grows.
    fn reprobe(&self, w: usize) {
        let wk = &self.workers[w];
        let until = Instant::now() + self.joiner.handshake_timeout;
        match self.joiner.join(wk.rail, wk.idx, until) {
            Ok(conn) => {
                let handle = match conn.shutdown_handle() {
                    Ok(h) => h,
                    Err(e) => {
                        self.rails.probe_failed(wk.rail, &e);
                        return;
                    }
                };
                let mut st = wk.stream.lock().unwrap_or_else(|p| p.into_inner());
                st.conn = conn;
                st.broken = None;
                *wk.sock.lock().unwrap_or_else(|p| p.into_inner()) = handle;
                wk.broken.store(false, Ordering::SeqCst);
                drop(st);
                if self.closed.load(Ordering::SeqCst) {
                    // Closed meanwhile: the new connection goes down with the rest.
                    wk.sock.lock().unwrap_or_else(|p| p.into_inner()).shutdown();
                    return;
                }
                self.rails.resume(wk.rail);
            }
            Err(e) => {
                self.rails.pause(wk.rail, &e);
                self.rails.probe_failed(wk.rail, &e);
            }
        }
    }
}

impl TcpTransport {
    /// Takes the joined data streams (each with its rail) and starts one worker thread per
    /// stream.
    pub(crate) fn new(
        streams: Vec<(usize, Conn)>,
        rails: Arc<Rails>,
        joiner: Joiner,
        control: Arc<Mutex<Conn>>,
        chunk: u32,
        io_timeout: Duration,
        batch: bool,
    ) -> Result<Self> {
        let mut workers = Vec::new();
        for (i, (rail, conn)) in streams.into_iter().enumerate() {
            workers.push(Worker {
                jobs: JobQueue::new()?,
                sock: Mutex::new(conn.shutdown_handle()?),
                stream: Mutex::new(Stream {
                    conn,
                    stager: Stager::default(),
                    broken: None,
                    stale: 0,
                }),
                queued: AtomicUsize::new(0),
                broken: AtomicBool::new(false),
                rail,
                idx: i as u16,
            });
        }
        let net = Arc::new(Net {
            workers,
            rails,
            joiner,
            control,
            io_timeout,
            closed: AtomicBool::new(false),
            batch,
        });
        for w in 0..net.workers.len() {
            let n = Arc::clone(&net);
            std::thread::Builder::new()
                .name(format!("gdx-tcp-{w}"))
                .spawn(move || stream_worker(&n, w))
                .map_err(|e| Error::os("spawn", e))?;
        }
        Ok(TcpTransport {
            net,
            chunk: u64::from(chunk),
        })
    }

    /// The latency path: a small transfer of host memory, written on the submitting thread to an
    /// idle stream, its replies left to that stream's thread. Gives the transfer back when the
    /// path does not apply (too large, GPU memory, every stream busy).
    fn submit_fast(&self, xfer: Arc<XferState>) -> Option<Arc<XferState>> {
        let total: u64 = xfer.ops.iter().map(|o| o.len).sum();
        if total > FAST_BYTES || xfer.op_refs().any(|o| o.local.device().is_some()) {
            return Some(xfer);
        }
        let mut chunks = Vec::new();
        let mut counts = Vec::with_capacity(xfer.ops.len());
        for (i, op) in xfer.ops.iter().enumerate() {
            let mut off = 0;
            let mut idx = 0u32;
            while off < op.len {
                let len = (op.len - off).min(self.chunk);
                chunks.push(Chunk {
                    op: i as u32,
                    idx,
                    off,
                    len: len as u32,
                });
                off += len;
                idx += 1;
            }
            counts.push(idx);
        }
        if chunks.len() > WINDOW {
            return Some(xfer);
        }
        let net = &*self.net;
        for w in net.pick(false) {
            let wk = &net.workers[w];
            if wk.queued.load(Ordering::SeqCst) != 0 {
                continue;
            }
            let Ok(mut st) = wk.stream.try_lock() else {
                continue;
            };
            // Re-checked under the lock: the stream's thread holds it for a whole job and
            // lowers the count after, so nothing of an earlier job is still in flight.
            if wk.queued.load(Ordering::SeqCst) != 0 || st.broken.is_some() || st.stale != 0 {
                continue;
            }
            xfer.set_chunks(counts);
            let group = Arc::new(Group {
                left: AtomicUsize::new(1),
                control: Arc::clone(&net.control),
            });
            let mut job = Job {
                xfer,
                chunks,
                group,
                sent: None,
            };
            let mut sent = Vec::with_capacity(job.chunks.len());
            let mut next = 0;
            let tally = net.tally(w, &job.xfer);
            if let Err(e) = send_all(&mut st, &job, &mut sent, &mut next, net.io_timeout, tally) {
                net.broke(w, &mut st, &e);
                drop(st);
                sent.extend_from_slice(&job.chunks[next..]);
                net.reissue(&job, sent, &e);
                group_done(&job);
                return None;
            }
            // The replies, read here while they come within the spin (the round trip of a
            // running peer); the rest, and the notification (a control round trip), are left
            // to the stream's thread, so a stalled peer never holds the caller.
            let mut got = 0;
            let mut failed = None;
            {
                let Stream { conn, stager, .. } = &mut *st;
                let mut staging = Staging::new(stager, 0, tally);
                let until = Instant::now() + crate::spin::TCP_SUBMIT_SPIN;
                while got < sent.len() {
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() || !crate::shm_ring::spin_until(left, || conn.poll_input()) {
                        break;
                    }
                    if let Err(e) =
                        recv_reply(conn, &mut staging, &job.xfer, sent[got], net.io_timeout)
                    {
                        failed = Some(e);
                        break;
                    }
                    got += 1;
                }
            }
            if let Some(e) = failed {
                net.broke(w, &mut st, &e);
                drop(st);
                net.reissue(&job, sent.split_off(got), &e);
                group_done(&job);
                return None;
            }
            if got == sent.len() && (job.xfer.notify.is_none() || job.xfer.has_failed()) {
                drop(st);
                group_done(&job);
                return None;
            }
            job.sent = Some(sent.split_off(got));
            // Counted and queued under the lock: the stream's thread takes this job next.
            wk.queued.fetch_add(1, Ordering::SeqCst);
            let rejected = wk.jobs.push(job, true).err();
            drop(st);
            if let Some(job) = rejected {
                wk.queued.fetch_sub(1, Ordering::SeqCst);
                let e = Error::peer_lost("peer connection closed");
                fail_chunks(&job.xfer, job.sent.as_deref().unwrap_or(&[]), &e);
                group_done(&job);
            }
            return None;
        }
        Some(xfer)
    }
}

/// The submitting thread's writes of a fast-path job (no GPU memory, at most `WINDOW` chunks);
/// `sent` collects the chunks whose requests went out, `next` the index of the first chunk not
/// done with (on an error, the one whose send failed).
fn send_all(
    st: &mut Stream,
    job: &Job,
    sent: &mut Vec<Chunk>,
    next: &mut usize,
    wait: Duration,
    tally: Tally<'_>,
) -> Result<()> {
    let Stream { conn, stager, .. } = st;
    let mut staging = Staging::new(stager, job.chunks.len(), tally);
    while let Some(&c) = job.chunks.get(*next) {
        let k = *next;
        if let Some(e) = job.xfer.halt() {
            job.xfer.chunk_done(c.op as usize, 0, Err(e));
        } else if send_chunk(conn, &mut staging, &job.xfer, k, c, wait)? {
            sent.push(c);
        }
        *next += 1;
    }
    Ok(())
}

impl Transport for TcpTransport {
    fn submit(&self, xfer: Arc<XferState>) {
        let Some(xfer) = self.submit_fast(xfer) else {
            return;
        };
        let net = &*self.net;
        let total: u64 = xfer.ops.iter().map(|o| o.len).sum();
        let usable = net.pick(total >= SPLIT_BYTES);
        if usable.is_empty() {
            let first = net
                .workers
                .first()
                .and_then(|w| w.stream.lock().ok().and_then(|s| s.broken.clone()))
                .unwrap_or_else(|| Error::peer_lost("no data stream left"));
            xfer.fail_pending(&net.no_rail_left(&first));
            xfer.finish();
            return;
        }
        // Cut ops into chunks and give each to the stream that would finish it first at its
        // measured throughput (equal throughputs: the least-loaded stream). Over several rails
        // the chunks are cut finer (about SLICES_PER_STREAM per stream), so that every rail
        // gets its share even of a transfer of a few chunks.
        let weights = net.rails.weights(&usable);
        let n = usable.len();
        let chunk = if net.rails.len() > 1 && total >= SPLIT_BYTES {
            (total / (n as u64 * SLICES_PER_STREAM))
                .next_multiple_of(4096)
                .clamp(MIN_SLICE, self.chunk.max(MIN_SLICE))
                .min(self.chunk)
        } else {
            self.chunk
        };
        let mut lists: Vec<Vec<Chunk>> = vec![Vec::new(); n];
        let mut load = vec![0u64; n];
        let mut counts = Vec::with_capacity(xfer.ops.len());
        for (i, op) in xfer.ops.iter().enumerate() {
            let mut off = 0;
            let mut idx = 0u32;
            while off < op.len {
                let len = (op.len - off).min(chunk);
                let finish = |k: usize| (load[k] + len + 64) as f64 / weights[k];
                let k = (0..n)
                    .min_by(|&a, &b| finish(a).total_cmp(&finish(b)))
                    .unwrap_or(0);
                load[k] += len + 64;
                lists[k].push(Chunk {
                    op: i as u32,
                    idx,
                    off,
                    len: len as u32,
                });
                off += len;
                idx += 1;
            }
            counts.push(idx);
        }
        xfer.set_chunks(counts);
        let jobs: Vec<(usize, Vec<Chunk>)> = lists
            .into_iter()
            .enumerate()
            .filter(|(_, l)| !l.is_empty())
            .map(|(k, l)| (usable[k], l))
            .collect();
        let group = Arc::new(Group {
            left: AtomicUsize::new(jobs.len()),
            control: Arc::clone(&net.control),
        });
        for (w, chunks) in jobs {
            let job = Job {
                xfer: Arc::clone(&xfer),
                chunks,
                group: Arc::clone(&group),
                sent: None,
            };
            net.push(w, job);
        }
    }

    fn rails(&self) -> Option<Arc<Rails>> {
        Some(Arc::clone(&self.net.rails))
    }

    fn is_alive(&self) -> bool {
        !self.net.closed.load(Ordering::SeqCst) && self.net.rails.any_active()
    }

    fn close(&self) {
        self.net.closed.store(true, Ordering::SeqCst);
        for w in &self.net.workers {
            w.jobs.close();
            w.sock.lock().unwrap_or_else(|p| p.into_inner()).shutdown();
        }
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        // Closing the queues ends the workers after their queued jobs; they say Bye.
        self.net.closed.store(true, Ordering::SeqCst);
        for w in &self.net.workers {
            w.jobs.close();
        }
    }
}

/// Called by each stream when it is done with its share; the last one delivers the notification
/// (only if every op succeeded) and ends the transfer.
fn group_done(job: &Job) {
    if job.group.left.fetch_sub(1, Ordering::AcqRel) != 1 {
        return;
    }
    super::notify_and_finish(&job.xfer, &job.group.control);
}

fn stream_worker(net: &Net, w: usize) {
    let wk = &net.workers[w];
    loop {
        let job = match wk.jobs.pop() {
            (Some(job), _) => job,
            (None, true) => break,
            (None, false) => {
                if wk.broken.load(Ordering::SeqCst)
                    && !net.closed.load(Ordering::SeqCst)
                    && net.rails.probe_due(wk.rail)
                {
                    net.reprobe(w);
                }
                wk.jobs.idle_wait();
                continue;
            }
        };
        let mut broke: Option<Broke> = None;
        {
            let mut st = wk.stream.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(e) = &st.broken {
                // Queued before the stream broke: every chunk it has not confirmed goes on.
                let left = job.sent.clone().unwrap_or_else(|| job.chunks.clone());
                broke = Some((e.clone(), left));
            } else {
                let t0 = Instant::now();
                let Stream {
                    conn,
                    stager,
                    stale,
                    ..
                } = &mut *st;
                let tally = net.tally(w, &job.xfer);
                let (landed, r) = match drain_stale(conn, stale) {
                    Err(e) => {
                        let left = job.sent.clone().unwrap_or_else(|| job.chunks.clone());
                        (0, Err((e, left)))
                    }
                    Ok(()) => match &job.sent {
                        Some(sent) => await_replies(
                            conn,
                            stager,
                            (&job.xfer, sent),
                            net.io_timeout,
                            tally,
                            stale,
                        ),
                        None => run_job(
                            conn,
                            stager,
                            &job,
                            (net.io_timeout, net.batch),
                            tally,
                            stale,
                        ),
                    },
                };
                match r {
                    Ok(()) if landed >= MEASURE_BYTES => {
                        net.rails.measured(w, landed, t0.elapsed());
                    }
                    Ok(()) => {}
                    Err((e, left)) => {
                        net.broke(w, &mut st, &e);
                        broke = Some((e, left));
                    }
                }
            }
        }
        if let Some((e, left)) = broke {
            net.reissue(&job, left, &e);
        }
        group_done(&job);
        wk.queued.fetch_sub(1, Ordering::SeqCst);
    }
    let mut st = wk.stream.lock().unwrap_or_else(|p| p.into_inner());
    if st.broken.is_none() {
        let _ = st.conn.send(&Msg::Bye);
    }
}
