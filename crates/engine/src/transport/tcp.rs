//! The tcp transport (initiator side): several data streams per peer, ops cut into chunks of at most
//! `chunk_bytes`, chunks spread over the streams by bytes, up to [`WINDOW`] chunks in flight per stream.
//!
//! GPU regions (this side): each stream queues the device-to-host copies of its next chunks into
//! pinned slots while it sends the current one, and a read's payload lands in a pinned slot whose
//! copy to the GPU is queued while the next reply is received (the chunk completes when the copy
//! is done). The target does the mirror image for its GPU regions (see `server`).
//!
//! Latency path: a small transfer of host memory (at most [`FAST_BYTES`] and [`WINDOW`] chunks) on
//! an idle stream is written by the submitting thread itself, under the stream's lock, which then
//! polls for the replies for at most [`SUBMIT_SPIN`] and completes the ops itself: one
//! request/ack on the established stream, no thread between the bytes and the completion. Replies
//! not there by then (a stalled peer), and the notification, go to the stream's thread. Anything
//! larger, or a stream with work queued, goes through the stream's thread as before.
//!
//! Payloads go from the local region to the socket and from the socket into the local region without
//! an intermediate buffer. Each chunk is confirmed by the target (`WriteAck` after the payload landed,
//! or `ReadData`); a stream that breaks fails its unconfirmed chunks with `PeerLost` and stays broken,
//! so later transfers on this peer fail fast (reconnect to recover).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::conn::{Conn, Sock};
use crate::error::{Error, Result};
use crate::gpu::Stager;
use crate::transfer::XferState;
use crate::transport::Transport;
use crate::wire::Msg;

#[path = "tcp_chunks.rs"]
mod chunks;
#[path = "tcp_queue.rs"]
mod queue;
use chunks::{await_replies, fail_chunks, recv_reply, run_job, send_chunk, Staging};
use queue::JobQueue;

/// Chunks in flight per stream before waiting for a confirmation.
const WINDOW: usize = 16;

/// Largest transfer (all its bytes) the submitting thread writes itself. Far below a socket's
/// buffer, so on an idle stream the write never waits for the peer, even a stalled one.
const FAST_BYTES: u64 = 64 << 10;

/// How long the submitting thread polls for the replies of what it wrote before it leaves them
/// to the stream's thread: a loopback or same-rack round trip, not a stalled peer's.
const SUBMIT_SPIN: Duration = Duration::from_micros(50);

#[derive(Debug, Clone, Copy)]
struct Chunk {
    op: u32,
    idx: u32,
    /// Offset of the chunk inside its op.
    off: u64,
    len: u32,
}

/// Completion bookkeeping shared by the streams running one transfer.
#[derive(Debug)]
struct Group {
    left: AtomicUsize,
    control: Arc<Mutex<Conn>>,
}

#[derive(Debug)]
struct Job {
    xfer: Arc<XferState>,
    chunks: Vec<Chunk>,
    group: Arc<Group>,
    /// Chunks the submitting thread already sent (in order, all of `chunks` that were sent):
    /// the stream's thread only receives their replies.
    sent: Option<Vec<Chunk>>,
}

/// One data stream's connection and what its users share.
struct Stream {
    conn: Conn,
    stager: Stager,
    /// Why the stream is unusable, once it is.
    broken: Option<Error>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("conn", &self.conn)
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct Worker {
    jobs: Arc<JobQueue<Job>>,
    sock: Sock,
    stream: Arc<Mutex<Stream>>,
    /// Jobs queued to the stream's thread and not yet done: the submitting thread writes only
    /// when this is 0, so replies still come back in the order the stream's thread expects.
    queued: Arc<AtomicUsize>,
}

/// Runs transfers over a set of joined data streams.
#[derive(Debug)]
pub(crate) struct TcpTransport {
    workers: Vec<Worker>,
    control: Arc<Mutex<Conn>>,
    chunk: u64,
    alive: Arc<AtomicBool>,
    io_timeout: Duration,
}

impl TcpTransport {
    /// Takes the joined data streams and starts one worker thread per stream.
    pub(crate) fn new(
        streams: Vec<Conn>,
        control: Arc<Mutex<Conn>>,
        chunk: u32,
        io_timeout: Duration,
    ) -> Result<Self> {
        let alive = Arc::new(AtomicBool::new(true));
        let mut workers = Vec::new();
        for (i, conn) in streams.into_iter().enumerate() {
            let sock = conn.shutdown_handle()?;
            let jobs = Arc::new(JobQueue::new()?);
            let a = Arc::clone(&alive);
            let stream = Arc::new(Mutex::new(Stream {
                conn,
                stager: Stager::default(),
                broken: None,
            }));
            let queued = Arc::new(AtomicUsize::new(0));
            let (st, q, j) = (Arc::clone(&stream), Arc::clone(&queued), Arc::clone(&jobs));
            std::thread::Builder::new()
                .name(format!("gdx-tcp-{i}"))
                .spawn(move || stream_worker(&st, &j, &a, &q, io_timeout))
                .map_err(|e| Error::os("spawn", e))?;
            workers.push(Worker {
                jobs,
                sock,
                stream,
                queued,
            });
        }
        Ok(TcpTransport {
            workers,
            control,
            chunk: u64::from(chunk),
            alive,
            io_timeout,
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
        for w in &self.workers {
            if w.queued.load(Ordering::SeqCst) != 0 {
                continue;
            }
            let Ok(mut st) = w.stream.try_lock() else {
                continue;
            };
            // Re-checked under the lock: the stream's thread holds it for a whole job and
            // lowers the count after, so nothing of an earlier job is still in flight.
            if w.queued.load(Ordering::SeqCst) != 0 {
                continue;
            }
            xfer.set_chunks(counts);
            let group = Arc::new(Group {
                left: AtomicUsize::new(1),
                control: Arc::clone(&self.control),
            });
            let mut job = Job {
                xfer,
                chunks,
                group,
                sent: None,
            };
            if let Some(e) = &st.broken {
                fail_chunks(&job.xfer, &job.chunks, e);
                drop(st);
                group_done(&job);
                return None;
            }
            let mut sent = Vec::with_capacity(job.chunks.len());
            let res = send_all(&mut st, &job, &mut sent, self.io_timeout);
            if let Err(e) = res {
                self.alive.store(false, Ordering::SeqCst);
                fail_chunks(&job.xfer, &sent, &e);
                fail_chunks(&job.xfer, &job.chunks[sent.len()..], &e);
                st.broken = Some(e);
                drop(st);
                group_done(&job);
                return None;
            }
            // The replies, read here while they come within the spin (the round trip of a
            // running peer); the rest, and the notification (a control round trip), are left
            // to the stream's thread, so a stalled peer never holds the caller.
            let mut got = 0;
            {
                let Stream { conn, stager, .. } = &mut *st;
                let mut staging = Staging::new(stager, 0);
                let until = std::time::Instant::now() + SUBMIT_SPIN;
                while got < sent.len() {
                    let left = until.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() || !crate::ring::spin_until(left, || conn.poll_input()) {
                        break;
                    }
                    if let Err(e) =
                        recv_reply(conn, &mut staging, &job.xfer, sent[got], self.io_timeout)
                    {
                        self.alive.store(false, Ordering::SeqCst);
                        fail_chunks(&job.xfer, &sent[got..], &e);
                        st.broken = Some(e);
                        drop(st);
                        group_done(&job);
                        return None;
                    }
                    got += 1;
                }
            }
            if got == sent.len() && (job.xfer.notify.is_none() || job.xfer.has_failed()) {
                drop(st);
                group_done(&job);
                return None;
            }
            job.sent = Some(sent.split_off(got));
            // Counted and queued under the lock: the stream's thread takes this job next.
            w.queued.fetch_add(1, Ordering::SeqCst);
            let rejected = w.jobs.push(job, true).err();
            drop(st);
            if let Some(job) = rejected {
                w.queued.fetch_sub(1, Ordering::SeqCst);
                let e = Error::PeerLost("peer connection closed".into());
                fail_chunks(&job.xfer, job.sent.as_deref().unwrap_or(&[]), &e);
                group_done(&job);
            }
            return None;
        }
        Some(xfer)
    }
}

/// The submitting thread's writes of a fast-path job (no GPU memory, at most `WINDOW` chunks);
/// `sent` collects the chunks whose requests went out.
fn send_all(st: &mut Stream, job: &Job, sent: &mut Vec<Chunk>, wait: Duration) -> Result<()> {
    let Stream { conn, stager, .. } = st;
    let mut staging = Staging::new(stager, job.chunks.len());
    for (k, &c) in job.chunks.iter().enumerate() {
        if job.xfer.expired() {
            job.xfer
                .chunk_done(c.op as usize, 0, Err(job.xfer.timeout_error()));
            continue;
        }
        if send_chunk(conn, &mut staging, &job.xfer, k, c, wait)? {
            sent.push(c);
        }
    }
    Ok(())
}

impl Transport for TcpTransport {
    fn submit(&self, xfer: Arc<XferState>) {
        let Some(xfer) = self.submit_fast(xfer) else {
            return;
        };
        // Cut ops into chunks and give each chunk to the least-loaded stream.
        let n = self.workers.len();
        let mut lists: Vec<Vec<Chunk>> = vec![Vec::new(); n];
        let mut load = vec![0u64; n];
        let mut counts = Vec::with_capacity(xfer.ops.len());
        for (i, op) in xfer.ops.iter().enumerate() {
            let mut off = 0;
            let mut idx = 0u32;
            while off < op.len {
                let len = (op.len - off).min(self.chunk);
                let w = (0..n).min_by_key(|&w| load[w]).unwrap_or(0);
                load[w] += len + 64;
                lists[w].push(Chunk {
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
            .collect();
        let group = Arc::new(Group {
            left: AtomicUsize::new(jobs.len()),
            control: Arc::clone(&self.control),
        });
        for (w, chunks) in jobs {
            let job = Job {
                xfer: Arc::clone(&xfer),
                chunks,
                group: Arc::clone(&group),
                sent: None,
            };
            let worker = &self.workers[w];
            worker.queued.fetch_add(1, Ordering::SeqCst);
            if let Err(job) = worker.jobs.push(job, true) {
                worker.queued.fetch_sub(1, Ordering::SeqCst);
                fail_chunks(
                    &job.xfer,
                    &job.chunks,
                    &Error::PeerLost("peer connection closed".into()),
                );
                group_done(&job);
            }
        }
    }

    fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    fn close(&self) {
        for w in &self.workers {
            w.jobs.close();
            w.sock.shutdown();
        }
        self.alive.store(false, Ordering::SeqCst);
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        // Dropping the senders ends the workers after their queued jobs; they say Bye.
        for w in &self.workers {
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

fn stream_worker(
    stream: &Mutex<Stream>,
    jobs: &JobQueue<Job>,
    alive: &AtomicBool,
    queued: &AtomicUsize,
    io_timeout: Duration,
) {
    loop {
        let job = match jobs.pop() {
            (Some(job), _) => job,
            (None, true) => break,
            (None, false) => {
                jobs.idle_wait();
                continue;
            }
        };
        {
            let mut st = stream.lock().unwrap_or_else(|p| p.into_inner());
            let Stream {
                conn,
                stager,
                broken,
            } = &mut *st;
            if let Some(e) = broken {
                match &job.sent {
                    // The chunks the submitting thread could not send were failed by it.
                    Some(sent) => fail_chunks(&job.xfer, sent, e),
                    None => fail_chunks(&job.xfer, &job.chunks, e),
                }
            } else {
                let r = match &job.sent {
                    Some(sent) => await_replies(conn, stager, &job.xfer, sent, io_timeout),
                    None => run_job(conn, stager, &job, io_timeout),
                };
                if let Err(e) = r {
                    alive.store(false, Ordering::SeqCst);
                    *broken = Some(e);
                }
            }
        }
        group_done(&job);
        queued.fetch_sub(1, Ordering::SeqCst);
    }
    let mut st = stream.lock().unwrap_or_else(|p| p.into_inner());
    if st.broken.is_none() {
        let _ = st.conn.send(&Msg::Bye);
    }
}
