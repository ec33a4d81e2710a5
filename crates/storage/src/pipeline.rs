//! The staged pipeline: a few bounce buffers cycling between I/O threads (positioned reads or
//! writes, several in flight) and the calling thread (which hands each chunk to or takes it
//! from its memory: a host copy, or an asynchronous copy to or from a GPU).
//!
//! Invariants:
//! - One I/O thread per bounce buffer; a buffer is owned by exactly one side at a time (moved
//!   through channels), so no buffer is read and written at once.
//! - A buffer whose last use was an asynchronous GPU copy is waited for by its first access on
//!   the I/O thread ([`Bounce::bytes_mut`], [`Bounce::bytes`]), which is where the overlap comes
//!   from: the disk works on chunk `i + n` while the copy engine moves chunk `i`.
//! - Reads are consumed in file order (a chunk that finishes early waits in a small reorder
//!   map), so a consumer may checksum or stream them.
//! - The first error stops new work; threads finish the chunk they hold and the error is
//!   returned. Nothing here panics or blocks forever: every wait is on a channel whose other
//!   end is dropped when its side stops.

use crate::align::{AlignedBuf, Geometry, Piece};
use crate::fileio::FileIo;
use crate::StorageError;
use gdx_sys::cuda::PinnedHostBuffer;
use std::collections::BTreeMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Mutex;

/// A bounce buffer.
pub(crate) trait Bounce: Send {
    /// The bytes, once any queued device copy that uses them is done.
    fn bytes(&self) -> Result<&[u8], StorageError>;
    /// The bytes, writable, once any queued device copy that uses them is done.
    fn bytes_mut(&mut self) -> Result<&mut [u8], StorageError>;
}

impl Bounce for AlignedBuf {
    fn bytes(&self) -> Result<&[u8], StorageError> {
        Ok(self.as_slice())
    }
    fn bytes_mut(&mut self) -> Result<&mut [u8], StorageError> {
        Ok(self.as_mut_slice())
    }
}

impl Bounce for PinnedHostBuffer {
    fn bytes(&self) -> Result<&[u8], StorageError> {
        self.as_slice().map_err(StorageError::cuda(
            "waiting for a GPU copy out of a bounce buffer",
        ))
    }
    fn bytes_mut(&mut self) -> Result<&mut [u8], StorageError> {
        self.as_mut_slice().map_err(StorageError::cuda(
            "waiting for a GPU copy into a bounce buffer",
        ))
    }
}

/// Set-up each I/O thread runs before its first chunk (e.g. making a CUDA context current).
pub(crate) type ThreadInit<'a> = &'a (dyn Fn() -> Result<(), StorageError> + Sync);

struct Job<B> {
    piece: Piece,
    buf: B,
}

struct Done<B> {
    piece: Piece,
    buf: B,
    result: Result<(), StorageError>,
}

/// Read every chunk of `geo` from `io` into the bounce buffers, `bufs.len()` reads in flight,
/// and hand each to `consume` in file order; `progress` gets the range bytes of each consumed
/// chunk.
pub(crate) fn read<B: Bounce>(
    io: &FileIo,
    geo: &Geometry,
    bufs: Vec<B>,
    init: ThreadInit<'_>,
    mut consume: impl FnMut(&Piece, &B) -> Result<(), StorageError>,
    progress: &mut dyn FnMut(u64),
) -> Result<(), StorageError> {
    let op = |p: &Piece, b: &mut B| read_piece(io, p, b);
    with_io_threads(geo, bufs, init, op, |bufs, job_tx, done_rx| {
        let n = geo.count();
        let mut next = 0usize;
        for buf in bufs {
            send(&job_tx, geo.piece(next), buf)?;
            next += 1;
        }
        let mut waiting: BTreeMap<usize, (Piece, B)> = BTreeMap::new();
        let mut consumed = 0usize;
        while consumed < n {
            let Ok(done) = done_rx.recv() else {
                return Err(stopped());
            };
            let Done { piece, buf, result } = done;
            result?;
            waiting.insert(piece.index, (piece, buf));
            while let Some((piece, buf)) = waiting.remove(&consumed) {
                consume(&piece, &buf)?;
                progress(piece.len as u64);
                consumed += 1;
                if next < n {
                    send(&job_tx, geo.piece(next), buf)?;
                    next += 1;
                }
            }
        }
        Ok(())
    })
}

/// Write every chunk of `geo` to `io`: `fill` puts the range bytes of a chunk into a free
/// bounce buffer (at `piece.skip`), then an I/O thread writes them, `bufs.len()` writes in
/// flight; `progress` gets the range bytes of each written chunk.
pub(crate) fn write<B: Bounce>(
    io: &FileIo,
    geo: &Geometry,
    bufs: Vec<B>,
    init: ThreadInit<'_>,
    mut fill: impl FnMut(&Piece, &mut B) -> Result<(), StorageError>,
    progress: &mut dyn FnMut(u64),
) -> Result<(), StorageError> {
    let op = |p: &Piece, b: &mut B| write_piece(io, p, b);
    with_io_threads(geo, bufs, init, op, |mut free, job_tx, done_rx| {
        let mut outstanding = 0usize;
        let mut reap = |outstanding: &mut usize| -> Result<B, StorageError> {
            let done = done_rx.recv().map_err(|_| stopped())?;
            *outstanding -= 1;
            done.result?;
            progress(done.piece.len as u64);
            Ok(done.buf)
        };
        for i in 0..geo.count() {
            let mut buf = match free.pop() {
                Some(b) => b,
                None => reap(&mut outstanding)?,
            };
            let piece = geo.piece(i);
            fill(&piece, &mut buf)?;
            send(&job_tx, piece, buf)?;
            outstanding += 1;
        }
        drop(job_tx);
        while outstanding > 0 {
            reap(&mut outstanding)?;
        }
        Ok(())
    })
}

/// The I/O threads of a pipeline over `geo`'s chunks: one per bounce buffer (at most one per
/// chunk), each running `init` and then `op` on every job it takes. `lead` runs on the calling
/// thread with the buffers the threads get, the job sender and the completion receiver; it owns
/// the sender, so its return (on success or error) ends the threads, which are then joined.
fn with_io_threads<B: Bounce>(
    geo: &Geometry,
    bufs: Vec<B>,
    init: ThreadInit<'_>,
    op: impl Fn(&Piece, &mut B) -> Result<(), StorageError> + Sync,
    lead: impl FnOnce(Vec<B>, Sender<Job<B>>, Receiver<Done<B>>) -> Result<(), StorageError>,
) -> Result<(), StorageError> {
    let n = geo.count();
    if n == 0 {
        return Ok(());
    }
    let workers = bufs.len().min(n);
    if workers == 0 {
        return Err(StorageError::Internal("no bounce buffers".to_string()));
    }
    let (job_tx, job_rx) = channel::<Job<B>>();
    let job_rx = Mutex::new(job_rx);
    std::thread::scope(|s| {
        let (done_tx, done_rx) = channel::<Done<B>>();
        for _ in 0..workers {
            let (done_tx, job_rx, op) = (done_tx.clone(), &job_rx, &op);
            s.spawn(move || worker(job_rx, done_tx, init, op));
        }
        drop(done_tx);
        lead(bufs.into_iter().take(workers).collect(), job_tx, done_rx)
        // Leaving the scope joins the threads, which ended when `lead` dropped the job sender.
    })
}

/// Hand `buf` to an I/O thread for `piece`.
fn send<B>(jobs: &Sender<Job<B>>, piece: Piece, buf: B) -> Result<(), StorageError> {
    jobs.send(Job { piece, buf }).map_err(|_| stopped())
}

/// A [`write`] fill that copies each chunk's range bytes from `parts`, the whole range in
/// memory as consecutive slices (one, or a file's header and then each tensor).
pub(crate) fn fill_from<'a>(
    parts: &'a [&'a [u8]],
) -> impl FnMut(&Piece, &mut AlignedBuf) -> Result<(), StorageError> + 'a {
    // Where each part starts in the range.
    let starts: Vec<u64> = parts
        .iter()
        .scan(0u64, |at, p| {
            let s = *at;
            *at += p.len() as u64;
            Some(s)
        })
        .collect();
    move |piece, buf| {
        let out = &mut buf.as_mut_slice()[piece.skip..piece.need()];
        let (mut rel, mut done) = (piece.rel, 0usize);
        // The part holding `rel`: the last that starts at or before it.
        let mut i = starts.partition_point(|&s| s <= rel).saturating_sub(1);
        while done < out.len() {
            let part = parts.get(i).ok_or_else(|| {
                StorageError::Internal("a write chunk runs past its source".to_string())
            })?;
            let from = (rel - starts[i]) as usize;
            let n = (part.len() - from.min(part.len())).min(out.len() - done);
            out[done..done + n].copy_from_slice(&part[from..from + n]);
            done += n;
            rel += n as u64;
            i += 1;
        }
        Ok(())
    }
}

fn stopped() -> StorageError {
    StorageError::Internal("the I/O threads stopped early".to_string())
}

/// An I/O thread: run `init`, then take jobs until the job channel closes, doing `op` on each.
/// A failed `init` is reported on the first job, and the thread ends.
fn worker<B: Bounce>(
    jobs: &Mutex<Receiver<Job<B>>>,
    done: Sender<Done<B>>,
    init: ThreadInit<'_>,
    op: impl Fn(&Piece, &mut B) -> Result<(), StorageError>,
) {
    let mut init_err = init().err();
    loop {
        let job = {
            let rx = jobs.lock().unwrap_or_else(|p| p.into_inner());
            rx.recv()
        };
        let Ok(mut job) = job else {
            return;
        };
        let failed_init = init_err.is_some();
        let result = match init_err.take() {
            Some(e) => Err(e),
            None => op(&job.piece, &mut job.buf),
        };
        let sent = done.send(Done {
            piece: job.piece,
            buf: job.buf,
            result,
        });
        if sent.is_err() || failed_init {
            return;
        }
    }
}

fn read_piece<B: Bounce>(io: &FileIo, piece: &Piece, buf: &mut B) -> Result<(), StorageError> {
    let bytes = buf.bytes_mut()?;
    let span = bytes.len().min(piece.span);
    let got = io.read_full(&mut bytes[..span], piece.file_pos, piece.need())?;
    if got < piece.need() {
        return Err(StorageError::Shrunk {
            path: io.path().to_path_buf(),
            eof: piece.file_pos + got as u64,
            expected_end: piece.data_pos() + piece.len as u64,
            size_at_start: io.size_at_open(),
        });
    }
    Ok(())
}

fn write_piece<B: Bounce>(io: &FileIo, piece: &Piece, buf: &mut B) -> Result<(), StorageError> {
    let bytes = buf.bytes()?;
    io.write_all(&bytes[piece.skip..piece.need()], piece.data_pos())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(n: usize) -> Vec<u8> {
        gdx_base::pattern::pattern(n, 131)
    }

    #[test]
    fn reads_arrive_in_order_despite_short_reads_and_many_threads() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let data = pattern(300_001);
        std::fs::write(&p, &data).unwrap();
        let io = FileIo::open_read(&p, true).unwrap();
        io.simulate_short_reads(777);
        let geo = Geometry::new(3, 299_990, 8192);
        let bufs: Vec<AlignedBuf> = (0..5).map(|_| AlignedBuf::new(8192)).collect();
        let mut out = Vec::new();
        let mut seen = 0u64;
        read(
            &io,
            &geo,
            bufs,
            &|| Ok(()),
            |piece, buf| {
                assert_eq!(piece.rel, out.len() as u64, "out of order");
                out.extend_from_slice(&buf.as_slice()[piece.skip..piece.need()]);
                Ok(())
            },
            &mut |n| seen += n,
        )
        .unwrap();
        assert_eq!(out, &data[3..3 + 299_990]);
        assert_eq!(seen, 299_990);
    }

    #[test]
    fn a_failing_thread_init_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, pattern(100_000)).unwrap();
        let io = FileIo::open_read(&p, false).unwrap();
        let geo = Geometry::new(0, 100_000, 4096);
        let bufs: Vec<AlignedBuf> = (0..3).map(|_| AlignedBuf::new(4096)).collect();
        let e = read(
            &io,
            &geo,
            bufs,
            &|| Err(StorageError::Internal("no context".into())),
            |_, _| Ok(()),
            &mut |_| {},
        )
        .unwrap_err();
        assert!(e.to_string().contains("no context"), "{e}");
    }

    #[test]
    fn a_consumer_error_stops_the_copy() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, pattern(1 << 20)).unwrap();
        let io = FileIo::open_read(&p, true).unwrap();
        let geo = Geometry::new(0, 1 << 20, 4096);
        let bufs: Vec<AlignedBuf> = (0..4).map(|_| AlignedBuf::new(4096)).collect();
        let mut calls = 0;
        let e = read(
            &io,
            &geo,
            bufs,
            &|| Ok(()),
            |_, _| {
                calls += 1;
                if calls == 3 {
                    return Err(StorageError::Internal("consumer failed".into()));
                }
                Ok(())
            },
            &mut |_| {},
        )
        .unwrap_err();
        assert!(e.to_string().contains("consumer failed"));
        assert_eq!(calls, 3);
    }

    #[test]
    fn writes_land_at_their_offsets() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, vec![0xEEu8; 70_000]).unwrap();
        let io = FileIo::open_write(&p, true).unwrap();
        let src = pattern(50_001);
        let geo = Geometry::new(4097, 50_001, 8192);
        let bufs: Vec<AlignedBuf> = (0..3).map(|_| AlignedBuf::new(8192)).collect();
        write(&io, &geo, bufs, &|| Ok(()), fill_from(&[&src]), &mut |_| {}).unwrap();
        let back = std::fs::read(&p).unwrap();
        assert_eq!(back.len(), 70_000);
        assert!(back[..4097].iter().all(|&b| b == 0xEE));
        assert_eq!(&back[4097..4097 + 50_001], &src[..]);
        assert!(back[4097 + 50_001..].iter().all(|&b| b == 0xEE));
    }

    #[test]
    fn gathered_writes_cross_part_boundaries() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let io = FileIo::open_write(&p, true).unwrap();
        let src = pattern(40_000);
        // Parts of every size class, an empty one among them, cut across 8 KiB chunks.
        let parts: Vec<&[u8]> = vec![
            &src[..3],
            &src[3..3],
            &src[3..9000],
            &src[9000..9001],
            &src[9001..],
        ];
        let geo = Geometry::new(0, 40_000, 8192);
        let bufs: Vec<AlignedBuf> = (0..2).map(|_| AlignedBuf::new(8192)).collect();
        write(&io, &geo, bufs, &|| Ok(()), fill_from(&parts), &mut |_| {}).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), src);
    }
}
