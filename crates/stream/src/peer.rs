//! `peer:` sources and sinks: frames written by a remote gdx agent, results sent to one.
//!
//! The source side's agent publishes a landing region ([`PEER_SOURCE_REGION`]: `landing`
//! slots of one frame each). A [`PeerFrameWriter`] on the remote agent writes frame `seq` into
//! landing slot `seq % landing` with a notification that names it (so the bytes are in place
//! when the notification arrives, over shm or tcp, whichever route the agents agreed); the
//! source copies it into a ring slot and hands the landing slot back with a credit
//! notification. The writer never has more frames outstanding than it holds credits, so the
//! network side is lossless and bounded too; the pipeline's policy applies to its own ring.
//!
//! Latency of a `peer:` frame starts when its notification reached this agent: the remote
//! clock is not comparable, so the figure is "arrival here → result at the sink".
//!
//! Messages (little-endian): frame `GDXF seq:u64 slot:u32 len:u32`, credit `GDXC slot:u32`,
//! end `GDXE frames:u64` (answered by `GDXA` once the source has seen it), result `GDXR seq:u64 len:u64 word0:u64 word1:u64`.

use std::time::{Duration, Instant};

use super::sink::{FrameResult, Sink};
use super::source::{Arrival, FrameInfo, SlotBuf, Source};
use gdx_engine::{Access, Agent, Peer, PeerInfo, Region, RegionDesc, Transfer};
use gdx_engine::{Error, Result};

/// The landing region a [`PeerSource`] publishes.
pub const PEER_SOURCE_REGION: &str = "gdx-stream-in";

const FRAME: &[u8; 4] = b"GDXF";
const CREDIT: &[u8; 4] = b"GDXC";
const END: &[u8; 4] = b"GDXE";
const RESULT: &[u8; 4] = b"GDXR";
const END_ACK: &[u8; 4] = b"GDXA";

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Frames from a remote agent's [`PeerFrameWriter`], landing in this agent's memory.
pub struct PeerSource {
    agent: Agent,
    landing: Region<'static>,
    frame: usize,
    slots: usize,
    back: Option<Peer>,
    pending: Option<u32>,
    next_seq: u64,
}

impl PeerSource {
    /// Publish a landing region of `slots` frames of `frame` bytes on `agent` (which must
    /// listen, so the writer can connect).
    ///
    /// # Errors
    /// A zero size, or the region cannot be allocated.
    pub fn new(agent: Agent, frame: usize, slots: usize) -> Result<PeerSource> {
        if frame == 0 || slots == 0 {
            return Err(Error::InvalidArgument(
                "peer source: the frame size and the landing slots must be at least 1".into(),
            ));
        }
        let len = (frame as u64).saturating_mul(slots as u64);
        let landing = agent.alloc(len, Access::READ_WRITE, Some(PEER_SOURCE_REGION))?;
        Ok(PeerSource {
            agent,
            landing,
            frame,
            slots,
            back: None,
            pending: None,
            next_seq: 0,
        })
    }

    /// The agent the writer connects to.
    pub fn agent(&self) -> &Agent {
        &self.agent
    }

    /// Connect back to the writer (for credits) once it has connected in.
    fn back(&mut self, wait: Duration) -> Result<&Peer> {
        if self.back.is_none() {
            let info: PeerInfo = self.agent.accept(wait)?;
            let addr = info.listen.ok_or_else(|| {
                Error::unavailable(
                    None,
                    format!(
                        "peer source: the writer {:?} does not listen, so it cannot get credits",
                        info.name
                    ),
                )
            })?;
            self.back = Some(self.agent.connect(addr.as_str())?);
        }
        self.back
            .as_ref()
            .ok_or_else(|| Error::unavailable(None, "peer source: no writer"))
    }
}

impl Source for PeerSource {
    fn name(&self) -> String {
        match self.agent.listen_addr() {
            Some(a) => format!("peer:{a}"),
            None => "peer".into(),
        }
    }

    fn max_frame(&self) -> usize {
        self.frame
    }

    fn arrive(&mut self, until: Instant) -> Result<Arrival> {
        let wait = until.saturating_duration_since(Instant::now());
        let note = match self.agent.wait_notification(wait) {
            Ok(n) => n,
            Err(Error::Timeout(_)) => return Ok(Arrival::Idle),
            Err(e) => return Err(e),
        };
        let stamp = Instant::now();
        let d = &note.data;
        let bad = || Error::Protocol(format!("peer source: unexpected notification {d:?}"));
        match d.get(..4) {
            Some(m) if m == FRAME => {
                let (seq, slot, len) = (
                    u64_at(d, 4).ok_or_else(bad)?,
                    u32_at(d, 12).ok_or_else(bad)?,
                    u32_at(d, 16).ok_or_else(bad)? as usize,
                );
                if seq != self.next_seq || slot as usize >= self.slots || len > self.frame {
                    return Err(Error::Protocol(format!(
                        "peer source: frame {seq} (slot {slot}, {len} bytes) out of order or out of range; expected frame {} in {} slots of {} bytes",
                        self.next_seq, self.slots, self.frame
                    )));
                }
                self.next_seq += 1;
                self.pending = Some(slot);
                Ok(Arrival::Frame(FrameInfo { seq, stamp, len }))
            }
            Some(m) if m == END => {
                // Answer before the source (and its agent) can go away, so the writer knows
                // the end arrived even if the acknowledgement of its notification is lost.
                // The writer may take the answer and leave before the transport acknowledges
                // our notification: a writer gone after the end is the normal finish, so a lost
                // connection here ends the stream like the answer would (every frame arrived).
                match self
                    .back(Duration::from_secs(10))
                    .and_then(|p| p.notify(END_ACK.to_vec()))
                {
                    Ok(()) | Err(Error::PeerLost { .. }) => Ok(Arrival::End),
                    Err(e) => Err(e),
                }
            }
            _ => Err(bad()),
        }
    }

    fn take(&mut self, info: &FrameInfo, slot: Option<SlotBuf<'_>>) -> Result<()> {
        let landing = self
            .pending
            .take()
            .ok_or_else(|| Error::Protocol("peer source: take without a frame".into()))?;
        if let Some(s) = slot {
            let at = landing as usize * self.frame;
            let bytes = self.landing.bytes()?;
            s.buf[..info.len].copy_from_slice(&bytes[at..at + info.len]);
        }
        let mut credit = CREDIT.to_vec();
        credit.extend_from_slice(&landing.to_le_bytes());
        self.back(Duration::from_secs(10))?.notify(credit)
    }
}

/// The remote end of a `peer:` source: writes frames into a [`PeerSource`]'s landing region.
pub struct PeerFrameWriter<'a> {
    agent: &'a Agent,
    peer: Peer,
    dest: RegionDesc,
    staging: Region<'static>,
    frame: usize,
    credits: usize,
    next_seq: u64,
    timeout: Duration,
}

impl<'a> PeerFrameWriter<'a> {
    /// Connect `agent` (which must listen, for credits) to the source's agent at `addr`; frames
    /// are at most `frame` bytes, as the source was created with.
    ///
    /// # Errors
    /// The connection, the landing region lookup, or a landing region smaller than one frame.
    pub fn connect(agent: &'a Agent, addr: &str, frame: usize) -> Result<PeerFrameWriter<'a>> {
        let peer = agent.connect(addr)?;
        let dest = peer.region(PEER_SOURCE_REGION)?;
        let credits = usize::try_from(dest.len / frame.max(1) as u64).unwrap_or(0);
        if frame == 0 || credits == 0 {
            return Err(Error::InvalidArgument(format!(
                "peer writer: the landing region holds {} bytes, less than one {frame}-byte frame",
                dest.len
            )));
        }
        let staging = agent.alloc(frame as u64, Access::LOCAL, None)?;
        Ok(PeerFrameWriter {
            agent,
            peer,
            dest,
            staging,
            frame,
            credits,
            next_seq: 0,
            timeout: Duration::from_secs(30),
        })
    }

    /// Write one frame (waiting for a free landing slot first); returns its sequence number.
    ///
    /// # Errors
    /// A frame larger than the slot, no credit within the timeout (the source stopped), or the
    /// transfer failing.
    pub fn write(&mut self, frame: &[u8]) -> Result<u64> {
        if frame.is_empty() || frame.len() > self.frame {
            return Err(Error::InvalidArgument(format!(
                "peer writer: a frame must be 1 to {} bytes, not {}",
                self.frame,
                frame.len()
            )));
        }
        while self.credits == 0 {
            let n = self.agent.wait_notification(self.timeout)?;
            if n.data.get(..4) == Some(CREDIT.as_slice()) {
                self.credits += 1;
            }
        }
        let slots = (self.dest.len / self.frame as u64).max(1);
        let seq = self.next_seq;
        let slot = seq % slots;
        self.staging.bytes_mut()?[..frame.len()].copy_from_slice(frame);
        let mut note = FRAME.to_vec();
        note.extend_from_slice(&seq.to_le_bytes());
        note.extend_from_slice(&(slot as u32).to_le_bytes());
        note.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        let mut t = Transfer::new();
        t.write(
            &self.staging,
            0,
            &self.dest,
            slot * self.frame as u64,
            frame.len() as u64,
        )
        .notify(note);
        self.peer.submit(t)?.wait(self.timeout)?;
        self.credits -= 1;
        self.next_seq += 1;
        Ok(seq)
    }

    /// Tell the source there are no more frames, and wait until it has seen that.
    ///
    /// # Errors
    /// The source did not answer within the timeout.
    pub fn finish(&mut self) -> Result<()> {
        let mut note = END.to_vec();
        note.extend_from_slice(&self.next_seq.to_le_bytes());
        // The source may stop (and close the connection) as soon as it has the end, before our
        // notification is acknowledged: its own answer is what proves arrival.
        let sent = self.peer.notify(note);
        let deadline = Instant::now() + self.timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.agent.wait_notification(left) {
                Ok(n) if n.data.get(..4) == Some(END_ACK.as_slice()) => return Ok(()),
                Ok(_) => {} // a late credit
                Err(e) => return sent.and(Err(e)),
            }
        }
    }
}

/// `peer:ADDR`: every result as a notification to the agent at `ADDR` (decode with
/// [`PeerSink::decode`]); a lost peer stops the pipeline.
pub struct PeerSink {
    _agent: Agent,
    peer: Peer,
}

impl PeerSink {
    /// Connect `agent` to the receiving agent at `addr`.
    ///
    /// # Errors
    /// As [`Agent::connect`].
    pub fn connect(agent: Agent, addr: &str) -> Result<PeerSink> {
        let peer = agent.connect(addr)?;
        Ok(PeerSink {
            _agent: agent,
            peer,
        })
    }

    /// A result notification's (seq, len, words), or `None` for anything else.
    pub fn decode(data: &[u8]) -> Option<(u64, u64, [u64; 2])> {
        if data.get(..4)? != RESULT.as_slice() {
            return None;
        }
        Some((
            u64_at(data, 4)?,
            u64_at(data, 12)?,
            [u64_at(data, 20)?, u64_at(data, 28)?],
        ))
    }
}

impl Sink for PeerSink {
    fn name(&self) -> String {
        format!("peer:{}", self.peer.addr())
    }

    fn deliver(&mut self, r: &FrameResult) -> Result<()> {
        let mut note = RESULT.to_vec();
        for w in [r.seq, r.len as u64, r.output.0[0], r.output.0[1]] {
            note.extend_from_slice(&w.to_le_bytes());
        }
        self.peer.notify(note)
    }
}
