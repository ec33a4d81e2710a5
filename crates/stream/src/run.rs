//! The three threads of a run (source, stage, sink), the slot ring between them, and how a
//! failure anywhere stops the others.
//!
//! The rings are bounded channels: the free-slot queue and the filled-slot queue together never
//! hold more than `slots` slots, because slots are moved, never created after the start; the
//! result queue holds at most `slots` results. A thread that stops drops its channel ends, so
//! its neighbours see a disconnect and stop too — nobody waits forever on a dead stage.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TryRecvError};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::report::{
    drain_p99_us, push_recent, LatencyRecorder, Progress, StopReason, StreamReport,
};
use super::stage::{SlotMem, Stage};
use super::{Arrival, BackPressure, FrameInfo, FrameResult, PipelineConfig, Sink, SlotBuf, Source};
use gdx_engine::{Error, Result};
use std::collections::VecDeque;

/// One slot of the frame ring.
struct Slot {
    mem: SlotMem,
    used: bool,
}

/// A filled slot on its way to the stage.
struct Filled {
    slot: Slot,
    info: FrameInfo,
}

/// Counters every thread updates and the progress reader reads.
#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    in_use: AtomicUsize,
    max_in_use: AtomicUsize,
    produced: AtomicU64,
    drops: AtomicU64,
    ring_full: AtomicU64,
    delivered: AtomicU64,
    bytes: AtomicU64,
    /// Latencies since the last progress report.
    recent: Mutex<Vec<f64>>,
    /// The first failure: the one that stopped the run (later ones are its consequences).
    failure: Mutex<Option<Error>>,
}

impl Shared {
    fn fail(&self, e: Error) {
        if let Ok(mut f) = self.failure.lock() {
            f.get_or_insert(e);
        }
        self.stop.store(true, Ordering::SeqCst);
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}

/// How often a blocked thread looks at the stop flag.
const POLL: Duration = Duration::from_millis(20);

/// How long a thread spins on an empty queue before it sleeps: a futex wake costs tens of
/// microseconds, more than a small frame's whole budget at 100k frames/s.
const SPIN: Duration = Duration::from_micros(100);

/// `rx.recv()`, spinning for [`SPIN`] first.
fn recv_spin<T>(rx: &Receiver<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        match rx.try_recv() {
            Ok(v) => return Some(v),
            Err(TryRecvError::Disconnected) => return None,
            Err(TryRecvError::Empty) if start.elapsed() < SPIN => std::hint::spin_loop(),
            Err(TryRecvError::Empty) => return rx.recv().ok(),
        }
    }
}

fn stage_error(stage: &str, name: &str, seq: u64, e: &Error) -> Error {
    // One message shape for every stage so a log line says which part died and where.
    Error::unavailable(
        None,
        format!("stream stopped: {stage} '{name}' failed at frame {seq}: {e}"),
    )
}

pub(super) fn run(
    cfg: &PipelineConfig,
    mut source: impl Source,
    mut stage: impl Stage,
    mut sink: impl Sink,
    mut progress: impl FnMut(&Progress),
) -> Result<StreamReport> {
    let slot_bytes = source.max_frame();
    if cfg.slots == 0 {
        return Err(Error::InvalidArgument(
            "a pipeline needs at least 1 slot".into(),
        ));
    }
    let ring_bytes = (slot_bytes as u64).saturating_mul(cfg.slots as u64);
    if slot_bytes == 0 || ring_bytes > cfg.max_ring_bytes {
        return Err(Error::InvalidArgument(format!(
            "a ring of {} slots x {slot_bytes} bytes: it must hold 1 to {} bytes in all (use fewer slots or smaller frames)",
            cfg.slots, cfg.max_ring_bytes
        )));
    }
    let names = (source.name(), stage.kernel_name(), sink.name());
    let place = stage.place();
    let (free_tx, free_rx) = sync_channel::<Slot>(cfg.slots);
    let (full_tx, full_rx) = sync_channel::<Filled>(cfg.slots);
    let (res_tx, res_rx) = sync_channel::<FrameResult>(cfg.slots);
    for _ in 0..cfg.slots {
        let slot = Slot {
            mem: stage.alloc(slot_bytes)?,
            used: false,
        };
        free_tx
            .send(slot)
            .map_err(|_| Error::unavailable(None, "slot ring closed while filling"))?;
    }
    let shared = Shared::default();
    let mut recorder = LatencyRecorder::new(cfg.latency_samples);
    let start = Instant::now();
    let deadline = cfg.duration.map(|d| start + d);

    let (stop, gaps) = std::thread::scope(|s| {
        let sh = &shared;
        let (src_name, kernel_name, sink_name) = (&names.0, &names.1, &names.2);
        let src = s
            .spawn(move || source_loop(cfg, sh, &mut source, src_name, free_rx, full_tx, deadline));
        s.spawn(move || stage_loop(sh, &mut stage, kernel_name, full_rx, free_tx, res_tx));
        let rec = &mut recorder;
        let snk = s.spawn(move || sink_loop(sh, &mut sink, sink_name, res_rx, rec));
        // Progress on this thread until the sink, the last to finish, is done.
        let mut last = (Instant::now(), 0u64, 0u64);
        while !snk.is_finished() {
            std::thread::sleep(POLL.min(cfg.progress_every));
            let now = Instant::now();
            if now.duration_since(last.0) < cfg.progress_every {
                continue;
            }
            let (f, b) = (
                sh.delivered.load(Ordering::Relaxed),
                sh.bytes.load(Ordering::Relaxed),
            );
            let dt = now.duration_since(last.0).as_secs_f64().max(1e-9);
            progress(&Progress {
                elapsed: now.duration_since(start),
                frames: f,
                bytes: b,
                drops: sh.drops.load(Ordering::Relaxed),
                frames_per_s: f.saturating_sub(last.1) as f64 / dt,
                gbps: b.saturating_sub(last.2) as f64 / dt / 1e9,
                p99_us: drain_p99_us(&sh.recent),
            });
            last = (now, f, b);
        }
        // A panicking stage thread is a bug; report it as a failure, not a success.
        let stop = src.join().unwrap_or_else(|_| {
            sh.fail(Error::unavailable(None, "stream source thread panicked"));
            StopReason::SourceEnd
        });
        let gaps = snk.join().unwrap_or_else(|_| {
            sh.fail(Error::unavailable(None, "stream sink thread panicked"));
            0
        });
        (stop, gaps)
    });
    let elapsed = start.elapsed().as_secs_f64();
    if let Some(e) = shared.failure.lock().ok().and_then(|mut f| f.take()) {
        return Err(e);
    }
    let produced = shared.produced.load(Ordering::SeqCst);
    let delivered = shared.delivered.load(Ordering::SeqCst);
    let drops = shared.drops.load(Ordering::SeqCst);
    let last_seq_plus_one = delivered + gaps;
    // Frames dropped after the last delivered one are gaps too (the sink could not see them).
    let gaps = gaps + produced.saturating_sub(last_seq_plus_one);
    if gaps != drops {
        return Err(Error::Protocol(format!(
            "stream lost frames silently: {gaps} sequence numbers missing at the sink but {drops} drops counted ({produced} produced, {delivered} delivered)"
        )));
    }
    let bytes = shared.bytes.load(Ordering::SeqCst);
    let (latency, latency_sample_s) = recorder.finish();
    Ok(StreamReport {
        source: names.0,
        kernel: names.1,
        stage: place,
        sink: names.2,
        policy: cfg.policy.as_str().into(),
        slots: cfg.slots,
        slot_bytes,
        ring_bytes,
        elapsed_s: elapsed,
        frames_produced: produced,
        frames_delivered: delivered,
        bytes_delivered: bytes,
        drops,
        gaps,
        ring_full: shared.ring_full.load(Ordering::SeqCst),
        max_slots_in_use: shared.max_in_use.load(Ordering::SeqCst),
        gbps: bytes as f64 / elapsed.max(1e-9) / 1e9,
        frames_per_s: delivered as f64 / elapsed.max(1e-9),
        latency,
        stop,
        latency_sample_s,
    })
}

/// Get a free slot under `policy`; `Ok(None)` means drop the frame, `Err(())` the stage is gone
/// or the run is stopping.
fn free_slot(
    policy: BackPressure,
    sh: &Shared,
    free: &Receiver<Slot>,
) -> std::result::Result<Option<Slot>, ()> {
    match free.try_recv() {
        Ok(s) => return Ok(Some(s)),
        Err(TryRecvError::Disconnected) => return Err(()),
        Err(TryRecvError::Empty) => {
            sh.ring_full.fetch_add(1, Ordering::Relaxed);
        }
    }
    if policy == BackPressure::Drop {
        return Ok(None);
    }
    let start = Instant::now();
    while start.elapsed() < SPIN {
        match free.try_recv() {
            Ok(s) => return Ok(Some(s)),
            Err(TryRecvError::Disconnected) => return Err(()),
            Err(TryRecvError::Empty) => std::hint::spin_loop(),
        }
    }
    loop {
        match free.recv_timeout(POLL) {
            Ok(s) => return Ok(Some(s)),
            Err(RecvTimeoutError::Disconnected) => return Err(()),
            Err(RecvTimeoutError::Timeout) if sh.stopped() => return Err(()),
            Err(RecvTimeoutError::Timeout) => {}
        }
    }
}

fn source_loop(
    cfg: &PipelineConfig,
    sh: &Shared,
    source: &mut impl Source,
    name: &str,
    free: Receiver<Slot>,
    full: SyncSender<Filled>,
    deadline: Option<Instant>,
) -> StopReason {
    let far = Instant::now() + Duration::from_secs(3600 * 24 * 365);
    loop {
        if sh.stopped() {
            return StopReason::SourceEnd;
        }
        let produced = sh.produced.load(Ordering::Relaxed);
        if cfg.max_frames.is_some_and(|m| produced >= m) {
            return StopReason::Frames;
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return StopReason::Duration;
        }
        let until = deadline.unwrap_or(far).min(now + POLL);
        let info = match source.arrive(until) {
            Ok(Arrival::Frame(info)) => info,
            Ok(Arrival::Idle) => continue,
            Ok(Arrival::End) => return StopReason::SourceEnd,
            Err(e) => {
                sh.fail(stage_error("source", name, produced, &e));
                return StopReason::SourceEnd;
            }
        };
        if info.len > source.max_frame() {
            sh.fail(Error::InvalidArgument(format!(
                "stream source '{name}' produced frame {} of {} bytes, more than its slot size {}",
                info.seq,
                info.len,
                source.max_frame()
            )));
            return StopReason::SourceEnd;
        }
        sh.produced.fetch_add(1, Ordering::Relaxed);
        let Ok(mut slot) = free_slot(cfg.policy, sh, &free) else {
            // Still counted: the frame exists, so it is a drop, not a silent gap.
            let _ = source.take(&info, None);
            sh.drops.fetch_add(1, Ordering::Relaxed);
            return StopReason::SourceEnd;
        };
        let taken = match slot.as_mut() {
            None => source.take(&info, None),
            Some(s) => {
                let first_use = !s.used;
                s.mem
                    .bytes_mut()
                    .and_then(|buf| source.take(&info, Some(SlotBuf { buf, first_use })))
            }
        };
        if let Err(e) = taken {
            sh.fail(stage_error("source", name, info.seq, &e));
            return StopReason::SourceEnd;
        }
        let Some(mut slot) = slot else {
            sh.drops.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        slot.used = true;
        let n = sh.in_use.fetch_add(1, Ordering::SeqCst) + 1;
        sh.max_in_use.fetch_max(n, Ordering::SeqCst);
        if full.send(Filled { slot, info }).is_err() {
            return StopReason::SourceEnd;
        }
    }
}

fn stage_loop(
    sh: &Shared,
    stage: &mut impl Stage,
    name: &str,
    full: Receiver<Filled>,
    free: SyncSender<Slot>,
    results: SyncSender<FrameResult>,
) {
    let mut inflight: VecDeque<Filled> = VecDeque::new();
    let mut open = true;
    // Ends when the source has dropped its sender and every frame in flight is done, or when
    // the sink drops its receiver.
    loop {
        if open {
            // Nothing in flight: wait for a frame. Otherwise take what is there and go on
            // looking for completions.
            let next = if inflight.is_empty() {
                recv_spin(&full)
            } else {
                match full.try_recv() {
                    Ok(f) => Some(f),
                    Err(TryRecvError::Empty) => None,
                    Err(TryRecvError::Disconnected) => {
                        open = false;
                        None
                    }
                }
            };
            match next {
                Some(f) => {
                    if let Err(e) = stage.submit(&f.slot.mem, f.info.len) {
                        sh.fail(stage_error("kernel", name, f.info.seq, &e));
                        return;
                    }
                    inflight.push_back(f);
                }
                None if inflight.is_empty() => return,
                None => {}
            }
        }
        if inflight.is_empty() {
            // The source ended while frames were in flight (seen by `try_recv`), and the last
            // of them is done: nothing more can come, so end (an asynchronous stage, the GPU's,
            // got here; looping on would never drop the result sender and the sink would wait).
            if !open {
                return;
            }
            continue;
        }
        let out = match stage.poll() {
            Ok(Some(o)) => o,
            Ok(None) => {
                if sh.stopped() {
                    return;
                }
                std::hint::spin_loop();
                continue;
            }
            Err(e) => {
                let seq = inflight.front().map_or(0, |f| f.info.seq);
                sh.fail(stage_error("kernel", name, seq, &e));
                return;
            }
        };
        let Some(Filled { slot, info }) = inflight.pop_front() else {
            continue;
        };
        // The stage is done with the bytes: the slot may be refilled.
        sh.in_use.fetch_sub(1, Ordering::SeqCst);
        let _ = free.send(slot);
        let r = FrameResult {
            seq: info.seq,
            len: info.len,
            stamp: info.stamp,
            output: out,
        };
        if results.send(r).is_err() {
            return;
        }
    }
}

/// Returns the gaps seen in the sequence (frames missing between delivered ones).
fn sink_loop(
    sh: &Shared,
    sink: &mut impl Sink,
    name: &str,
    results: Receiver<FrameResult>,
    rec: &mut LatencyRecorder,
) -> u64 {
    let mut next = 0u64;
    let mut gaps = 0u64;
    while let Some(r) = recv_spin(&results) {
        if r.seq < next {
            sh.fail(Error::Protocol(format!(
                "stream reordered: frame {} reached the sink after frame {}",
                r.seq,
                next - 1
            )));
            return gaps;
        }
        if let Err(e) = sink.deliver(&r) {
            sh.fail(stage_error("sink", name, r.seq, &e));
            return gaps;
        }
        let lat = r.stamp.elapsed().as_secs_f64();
        rec.record(lat);
        push_recent(&sh.recent, lat);
        gaps += r.seq - next;
        next = r.seq + 1;
        sh.delivered.fetch_add(1, Ordering::Relaxed);
        sh.bytes.fetch_add(r.len as u64, Ordering::Relaxed);
    }
    if let Err(e) = sink.finish() {
        sh.fail(stage_error("sink", name, next, &e));
    }
    gaps
}
