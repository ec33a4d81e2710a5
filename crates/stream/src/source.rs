//! Frame sources: where frames come from.
//!
//! A [`Source`] works in two steps so that the pipeline, not the source, decides what happens
//! when no slot is free: [`Source::arrive`] waits until the next frame exists (a sensor's frame
//! is due, a file has more bytes, a peer's frame landed) and stamps it; [`Source::take`] then
//! copies it into a slot — or, under the `drop` policy with every slot in use, discards it
//! (`slot` is `None`), exactly as a DAQ card that cannot wait overwrites its buffer. The frame
//! still used its sequence number, so every drop is a gap the sink can see.

use std::path::PathBuf;

use gdx_base::pattern::{fill_pattern, pattern};
use std::time::{Duration, Instant};

use gdx_storage::{copy_file_to_host, source_len, CopyOptions, FileRange};

use gdx_engine::{Error, Result};

/// One frame's header: what the source stamped on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameInfo {
    /// Sequence number, from 0, one per frame the source produced (dropped ones included).
    pub seq: u64,
    /// When the frame came into existence (the start of its end-to-end latency).
    pub stamp: Instant,
    /// Bytes in the frame (at most the slot size).
    pub len: usize,
}

/// What [`Source::arrive`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// The next frame exists.
    Frame(FrameInfo),
    /// Nothing before the deadline; ask again.
    Idle,
    /// The source has no more frames.
    End,
}

/// A slot handed to [`Source::take`].
#[derive(Debug)]
pub struct SlotBuf<'a> {
    /// The slot's bytes (the pipeline's slot size; write `info.len` of them).
    pub buf: &'a mut [u8],
    /// True the first time this slot is handed out, so a source can lay down constant bytes
    /// once instead of on every frame.
    pub first_use: bool,
}

/// Where frames come from. Implement it to plug your own producer in.
pub trait Source: Send {
    /// A short name for reports (`synthetic`, `file:/data/x`).
    fn name(&self) -> String;

    /// The largest frame this source produces (the slot size).
    fn max_frame(&self) -> usize;

    /// Wait until the next frame exists, at most until `until`.
    ///
    /// # Errors
    /// A source that cannot go on (I/O, a lost peer); the pipeline stops and names it.
    fn arrive(&mut self, until: Instant) -> Result<Arrival>;

    /// Put the frame `info` (the last one [`Source::arrive`] returned) into `slot`, or discard
    /// it when `slot` is `None` (dropped under the `drop` policy).
    ///
    /// # Errors
    /// As for [`Source::arrive`].
    fn take(&mut self, info: &FrameInfo, slot: Option<SlotBuf<'_>>) -> Result<()>;
}

impl<S: Source + ?Sized> Source for Box<S> {
    fn name(&self) -> String {
        (**self).name()
    }
    fn max_frame(&self) -> usize {
        (**self).max_frame()
    }
    fn arrive(&mut self, until: Instant) -> Result<Arrival> {
        (**self).arrive(until)
    }
    fn take(&mut self, info: &FrameInfo, slot: Option<SlotBuf<'_>>) -> Result<()> {
        (**self).take(info, slot)
    }
}

/// A sensor stand-in: a frame of `frame` bytes every `frame / rate` seconds (as fast as the
/// pipeline takes them without a rate), each stamped with its sequence number and the time it
/// was produced. Bytes: `seq` and `!seq` (little-endian) in the first 16, then
/// gdx-base's test pattern of [`SYNTHETIC_SEED`] (the one pattern every gdx tool checks
/// with); the pattern is written once per slot, the header per frame — a
/// DAQ card's DMA does not cost the host CPU either. [`Synthetic::expected`] rebuilds a frame for
/// checking.
#[derive(Debug, Clone)]
pub struct Synthetic {
    frame: usize,
    /// Seconds per frame.
    interval: Option<f64>,
    next_seq: u64,
    start: Option<Instant>,
}

/// The seed of every synthetic frame's pattern (from offset 16 on): gdx-base's probe seed.
pub const SYNTHETIC_SEED: u64 = gdx_base::pattern::SEED;

/// Pacing: closer than this to a frame's due time the source spins instead of sleeping
/// (a sleep overshoots by tens of microseconds; 100k frames/s is one frame per 10 µs).
const SPIN: Duration = Duration::from_micros(200);

impl Synthetic {
    /// Frames of `frame` bytes at `rate` bytes per second (`None`: as fast as possible).
    ///
    /// # Errors
    /// A zero frame size or a rate that is zero or not finite.
    pub fn new(frame: usize, rate: Option<f64>) -> Result<Synthetic> {
        if frame == 0 {
            return Err(Error::InvalidArgument(
                "synthetic source: the frame size must be at least 1 byte".into(),
            ));
        }
        let interval = match rate {
            None => None,
            Some(r) if r.is_finite() && r > 0.0 => Some(frame as f64 / r),
            Some(r) => {
                return Err(Error::InvalidArgument(format!(
                "synthetic source: the rate must be a positive number of bytes per second, not {r}"
            )))
            }
        };
        Ok(Synthetic {
            frame,
            interval,
            next_seq: 0,
            start: None,
        })
    }

    /// Frame `seq` of `len` bytes, as the source writes it (for checking results).
    pub fn expected(seq: u64, len: usize) -> Vec<u8> {
        let mut v = pattern(len, SYNTHETIC_SEED);
        write_header(&mut v, seq);
        v
    }
}

fn write_header(buf: &mut [u8], seq: u64) {
    let mut h = [0u8; 16];
    h[..8].copy_from_slice(&seq.to_le_bytes());
    h[8..].copy_from_slice(&(!seq).to_le_bytes());
    let n = buf.len().min(16);
    buf[..n].copy_from_slice(&h[..n]);
}

impl Source for Synthetic {
    fn name(&self) -> String {
        "synthetic".into()
    }

    fn max_frame(&self) -> usize {
        self.frame
    }

    fn arrive(&mut self, until: Instant) -> Result<Arrival> {
        let start = *self.start.get_or_insert_with(Instant::now);
        if let Some(iv) = self.interval {
            // From the start, not from the last frame: late frames do not push later ones back.
            let due = start + Duration::from_secs_f64(iv * self.next_seq as f64);
            if due > until {
                std::thread::sleep(until.saturating_duration_since(Instant::now()));
                return Ok(Arrival::Idle);
            }
            loop {
                let left = due.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                if left > SPIN {
                    std::thread::sleep(left - SPIN);
                } else {
                    std::hint::spin_loop();
                }
            }
        }
        let info = FrameInfo {
            seq: self.next_seq,
            stamp: Instant::now(),
            len: self.frame,
        };
        self.next_seq += 1;
        Ok(Arrival::Frame(info))
    }

    fn take(&mut self, info: &FrameInfo, slot: Option<SlotBuf<'_>>) -> Result<()> {
        if let Some(s) = slot {
            let buf = &mut s.buf[..info.len];
            if s.first_use {
                fill_pattern(buf, SYNTHETIC_SEED);
            }
            write_header(buf, info.seq);
        }
        Ok(())
    }
}

/// `file:PATH`: the file cut into frames of `frame` bytes (the last one may be shorter), read
/// through gdx-storage, as fast as the pipeline takes them; stamped when the read starts.
#[derive(Debug, Clone)]
pub struct FileSource {
    path: PathBuf,
    frame: usize,
    len: u64,
    next_seq: u64,
}

impl FileSource {
    /// Frames of `frame` bytes from `path`.
    ///
    /// # Errors
    /// The file cannot be opened or its size read, or `frame` is zero.
    pub fn open(path: impl Into<PathBuf>, frame: usize) -> Result<FileSource> {
        let path = path.into();
        if frame == 0 {
            return Err(Error::InvalidArgument(
                "file source: the frame size must be at least 1 byte".into(),
            ));
        }
        let len = source_len(&path, 0, None).map_err(Error::from)?;
        Ok(FileSource {
            path,
            frame,
            len,
            next_seq: 0,
        })
    }

    fn offset(&self, seq: u64) -> u64 {
        seq.saturating_mul(self.frame as u64)
    }
}

impl Source for FileSource {
    fn name(&self) -> String {
        format!("file:{}", self.path.display())
    }

    fn max_frame(&self) -> usize {
        self.frame
    }

    fn arrive(&mut self, _until: Instant) -> Result<Arrival> {
        let off = self.offset(self.next_seq);
        if off >= self.len {
            return Ok(Arrival::End);
        }
        let len = (self.len - off).min(self.frame as u64) as usize;
        let info = FrameInfo {
            seq: self.next_seq,
            stamp: Instant::now(),
            len,
        };
        self.next_seq += 1;
        Ok(Arrival::Frame(info))
    }

    fn take(&mut self, info: &FrameInfo, slot: Option<SlotBuf<'_>>) -> Result<()> {
        let Some(s) = slot else { return Ok(()) };
        let range = FileRange::new(&self.path, self.offset(info.seq), info.len as u64);
        copy_file_to_host(&range, &mut s.buf[..info.len], &CopyOptions::default())
            .map_err(Error::from)?;
        Ok(())
    }
}
