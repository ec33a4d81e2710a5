//! The tcp transport (initiator side): several data streams per peer, ops cut into chunks of at most
//! `chunk_bytes`, chunks spread over the streams by bytes, up to [`WINDOW`] chunks in flight per stream.
//!
//! Payloads go from the local region to the socket and from the socket into the local region without
//! an intermediate buffer. Each chunk is confirmed by the target (`WriteAck` after the payload landed,
//! or `ReadData`); a stream that breaks fails its unconfirmed chunks with `PeerLost` and stays broken,
//! so later transfers on this peer fail fast (reconnect to recover).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::conn::{Conn, Sock};
use crate::error::{Error, Result};
use crate::region::LeaseKind;
use crate::transfer::{OpKind, XferState};
use crate::transport::Transport;
use crate::wire::Msg;

/// Chunks in flight per stream before waiting for a confirmation.
const WINDOW: usize = 16;

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
}

#[derive(Debug)]
struct Worker {
    tx: Mutex<Option<Sender<Job>>>,
    sock: Sock,
}

/// Runs transfers over a set of joined data streams.
#[derive(Debug)]
pub(crate) struct TcpTransport {
    workers: Vec<Worker>,
    control: Arc<Mutex<Conn>>,
    chunk: u64,
    alive: Arc<AtomicBool>,
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
            let (tx, rx) = channel();
            let a = Arc::clone(&alive);
            std::thread::Builder::new()
                .name(format!("gdx-tcp-{i}"))
                .spawn(move || stream_worker(conn, rx, a, io_timeout))
                .map_err(|e| Error::os("spawn", e))?;
            workers.push(Worker {
                tx: Mutex::new(Some(tx)),
                sock,
            });
        }
        Ok(TcpTransport {
            workers,
            control,
            chunk: u64::from(chunk),
            alive,
        })
    }
}

impl Transport for TcpTransport {
    fn submit(&self, xfer: Arc<XferState>) {
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
            };
            let tx = self.workers[w]
                .tx
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            let rejected = match tx {
                Some(tx) => tx.send(job).err().map(|e| e.0),
                None => Some(job),
            };
            if let Some(job) = rejected {
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
            w.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
            w.sock.shutdown();
        }
        self.alive.store(false, Ordering::SeqCst);
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        // Dropping the senders ends the workers after their queued jobs; they say Bye.
        for w in &self.workers {
            w.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
        }
    }
}

fn fail_chunks(xfer: &XferState, chunks: &[Chunk], e: &Error) {
    for c in chunks {
        xfer.chunk_done(c.op as usize, 0, Err(e.clone()));
    }
}

/// Called by each stream when it is done with its share; the last one delivers the notification
/// (only if every op succeeded) and ends the transfer.
fn group_done(job: &Job) {
    if job.group.left.fetch_sub(1, Ordering::AcqRel) != 1 {
        return;
    }
    let xfer = &job.xfer;
    if !xfer.has_failed() {
        if let Some(data) = &xfer.notify {
            let mut c = job.group.control.lock().unwrap_or_else(|p| p.into_inner());
            if let Err(e) = c.request(&Msg::Notify {
                xfer: xfer.id,
                data: data.clone(),
            }) {
                xfer.fail_pending(&e);
                xfer.fail_transfer(e);
            }
        }
    }
    xfer.finish();
}

fn stream_worker(mut conn: Conn, rx: Receiver<Job>, alive: Arc<AtomicBool>, io_timeout: Duration) {
    let mut broken: Option<Error> = None;
    for job in rx {
        if let Some(e) = &broken {
            fail_chunks(&job.xfer, &job.chunks, e);
        } else if let Err(e) = run_job(&mut conn, &job, io_timeout) {
            alive.store(false, Ordering::SeqCst);
            broken = Some(e);
        }
        group_done(&job);
    }
    if broken.is_none() {
        let _ = conn.send(&Msg::Bye);
    }
}

/// Runs one stream's share of a transfer. A connection-level error fails every chunk not yet
/// confirmed and is returned (the stream is then broken).
fn run_job(conn: &mut Conn, job: &Job, io_timeout: Duration) -> Result<()> {
    let xfer = &job.xfer;
    let mut inflight: VecDeque<Chunk> = VecDeque::with_capacity(WINDOW);
    let mut next = 0;
    let res = (|| -> Result<()> {
        loop {
            while inflight.len() < WINDOW && next < job.chunks.len() {
                let c = job.chunks[next];
                next += 1;
                if xfer.expired() {
                    xfer.chunk_done(c.op as usize, 0, Err(xfer.timeout_error()));
                    continue;
                }
                if send_chunk(conn, xfer, c, io_timeout)? {
                    inflight.push_back(c);
                }
            }
            let Some(c) = inflight.front().copied() else {
                return Ok(());
            };
            recv_reply(conn, xfer, c, io_timeout)?;
            inflight.pop_front();
        }
    })();
    if let Err(e) = &res {
        fail_chunks(xfer, inflight.make_contiguous(), e);
        fail_chunks(xfer, &job.chunks[next..], e);
    }
    res
}

/// Sends one chunk's request. `Ok(false)`: the chunk failed locally (recorded), nothing was sent.
fn send_chunk(conn: &mut Conn, xfer: &XferState, c: Chunk, wait: Duration) -> Result<bool> {
    let op = &xfer.ops[c.op as usize];
    let roff = op.remote_offset + c.off;
    match op.kind {
        OpKind::Write => {
            let lease = match op.local.lease(LeaseKind::Source, wait) {
                Ok(l) => l,
                Err(e) => {
                    xfer.chunk_done(c.op as usize, 0, Err(e));
                    return Ok(false);
                }
            };
            let msg = Msg::Write {
                xfer: xfer.id,
                op: c.op,
                chunk: c.idx,
                region: op.remote.id,
                key: op.remote.key,
                offset: roff,
            };
            // SAFETY: the Source lease covers the op's local span, bounds-checked at submit.
            unsafe { conn.send_with_payload(&msg, lease.ptr_at(op.local_offset + c.off), c.len)? };
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

/// Receives the confirmation of the oldest chunk in flight (replies come back in request order).
fn recv_reply(conn: &mut Conn, xfer: &XferState, c: Chunk, wait: Duration) -> Result<()> {
    let op = &xfer.ops[c.op as usize];
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
            match op.local.lease(LeaseKind::Sink, wait) {
                Ok(lease) => {
                    // SAFETY: the Sink lease covers the op's local span, bounds-checked at submit.
                    unsafe {
                        conn.recv_payload(lease.ptr_at(op.local_offset + c.off), p as usize)?
                    };
                    xfer.chunk_done(c.op as usize, u64::from(p), Ok(()));
                }
                Err(e) => {
                    conn.discard_payload(p as usize)?;
                    xfer.chunk_done(c.op as usize, 0, Err(e));
                }
            }
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
