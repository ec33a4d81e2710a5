#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Host-only pipeline tests (no GPU): every result checked against the CPU kernel, no loss or
//! reordering under `block`, drops equal to the gaps under `drop`, bounded memory under
//! back-pressure, a dying sink or kernel named in the error, file and peer ends.

mod common {
    use gdx_engine::{Agent, AgentConfig, Secret, Transports};
    use std::time::Duration;

    pub use gdx_base::pattern::pattern;

    /// An agent of this test process (one secret for all of them: they only talk to each
    /// other), shm on or off.
    pub fn agent(name: &str, shm: bool) -> Agent {
        static SECRET: std::sync::OnceLock<Secret> = std::sync::OnceLock::new();
        let secret = SECRET
            .get_or_init(|| Secret::generate().expect("secret"))
            .clone();
        Agent::new(AgentConfig {
            name: name.into(),
            transports: Transports {
                tcp: true,
                shm,
                rdma: false,
                fabric: false,
            },
            io_timeout: Duration::from_secs(20),
            secret: Some(secret),
            ..AgentConfig::default()
        })
        .expect("agent")
    }
}

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gdx_engine::{Error, Result};
use gdx_stream::{
    checksum, Arrival, BackPressure, Checksum, FileSink, FileSource, FrameInfo, FrameResult,
    Kernel, NullSink, Output, PeerFrameWriter, PeerSink, PeerSource, Pipeline, PipelineConfig,
    Sink, SlotBuf, Source, StopReason, Synthetic,
};

/// Keeps every result.
#[derive(Clone, Default)]
struct Collect(Arc<Mutex<Vec<FrameResult>>>);

impl Sink for Collect {
    fn name(&self) -> String {
        "collect".into()
    }
    fn deliver(&mut self, r: &FrameResult) -> Result<()> {
        self.0.lock().unwrap().push(*r);
        Ok(())
    }
}

/// The checksum kernel, slowed down: a stage slower than the source.
struct Slow(Duration);

impl Kernel for Slow {
    fn name(&self) -> String {
        "slow-checksum".into()
    }
    fn process(&mut self, frame: &[u8]) -> Result<Output> {
        std::thread::sleep(self.0);
        Ok(checksum(frame))
    }
}

fn cfg(slots: usize, policy: BackPressure, frames: u64) -> PipelineConfig {
    PipelineConfig {
        slots,
        policy,
        max_frames: Some(frames),
        progress_every: Duration::from_millis(50),
        ..PipelineConfig::default()
    }
}

/// Every result is the CPU checksum of the frame the synthetic source made for that seq.
fn check_synthetic(results: &[FrameResult], len: usize) {
    for r in results {
        assert_eq!(r.len, len);
        assert_eq!(
            r.output,
            checksum(&Synthetic::expected(r.seq, len)),
            "frame {}",
            r.seq
        );
    }
}

#[test]
fn block_delivers_every_frame_in_order_with_correct_results() {
    let len = 4096 + 3; // not a whole number of words
    let sink = Collect::default();
    let mut calls = 0;
    let rep = Pipeline::new(cfg(4, BackPressure::Block, 3000))
        .run(
            Synthetic::new(len, None).unwrap(),
            Checksum,
            sink.clone(),
            |_| calls += 1,
        )
        .unwrap();
    let got = sink.0.lock().unwrap();
    let seqs: Vec<u64> = got.iter().map(|r| r.seq).collect();
    assert_eq!(
        seqs,
        (0..3000).collect::<Vec<_>>(),
        "no loss, no reordering"
    );
    check_synthetic(&got, len);
    assert_eq!(
        (
            rep.frames_produced,
            rep.frames_delivered,
            rep.drops,
            rep.gaps
        ),
        (3000, 3000, 0, 0)
    );
    assert_eq!(rep.bytes_delivered, 3000 * len as u64);
    assert_eq!(rep.stop, StopReason::Frames);
    assert!(rep.max_slots_in_use <= 4, "{rep:?}");
    let lat = rep.latency.unwrap();
    assert_eq!(lat.frames, 3000);
    assert!(lat.p50_us <= lat.p99_us && lat.p99_us <= lat.p999_us && lat.p999_us <= lat.max_us);
    assert_eq!(rep.latency_sample_s.len(), 3000);
}

#[test]
fn drop_counts_every_lost_frame_and_they_are_the_gaps() {
    let len = 1024;
    let sink = Collect::default();
    // 20k frames/s into a stage that takes 1 ms a frame: most frames find the ring full.
    let src = Synthetic::new(len, Some(len as f64 * 20_000.0)).unwrap();
    let rep = Pipeline::new(cfg(2, BackPressure::Drop, 2000))
        .run(src, Slow(Duration::from_millis(1)), sink.clone(), |_| {})
        .unwrap();
    let got = sink.0.lock().unwrap();
    assert!(
        rep.drops > 0,
        "the stage is slower than the source: {rep:?}"
    );
    assert_eq!(rep.frames_produced, 2000);
    assert_eq!(rep.frames_delivered + rep.drops, 2000);
    // Gaps counted from the sequence numbers the sink really saw.
    let mut expect = 0u64;
    let mut gaps = 0u64;
    for r in got.iter() {
        assert!(r.seq >= expect, "reordered at {}", r.seq);
        gaps += r.seq - expect;
        expect = r.seq + 1;
    }
    gaps += 2000 - expect;
    assert_eq!(gaps, rep.drops, "every drop is a gap and every gap a drop");
    assert_eq!(rep.gaps, rep.drops);
    assert!(rep.ring_full >= rep.drops);
    check_synthetic(&got, len);
}

/// A source that counts what it has produced, so the sink can check how far ahead it ran.
struct Counted {
    inner: Synthetic,
    produced: Arc<AtomicU64>,
}

impl Source for Counted {
    fn name(&self) -> String {
        self.inner.name()
    }
    fn max_frame(&self) -> usize {
        self.inner.max_frame()
    }
    fn arrive(&mut self, until: Instant) -> Result<Arrival> {
        let a = self.inner.arrive(until)?;
        if matches!(a, Arrival::Frame(_)) {
            self.produced.fetch_add(1, Ordering::SeqCst);
        }
        Ok(a)
    }
    fn take(&mut self, info: &FrameInfo, slot: Option<SlotBuf<'_>>) -> Result<()> {
        self.inner.take(info, slot)
    }
}

/// A slow sink that records how many frames existed beyond the one it is taking.
struct SlowSink {
    produced: Arc<AtomicU64>,
    ahead: Arc<AtomicU64>,
}

impl Sink for SlowSink {
    fn name(&self) -> String {
        "slow".into()
    }
    fn deliver(&mut self, r: &FrameResult) -> Result<()> {
        std::thread::sleep(Duration::from_micros(300));
        let ahead = self.produced.load(Ordering::SeqCst) - r.seq - 1;
        self.ahead.fetch_max(ahead, Ordering::SeqCst);
        Ok(())
    }
}

#[test]
fn a_source_faster_than_the_stage_is_held_back_with_bounded_memory() {
    let slots = 3;
    let produced = Arc::new(AtomicU64::new(0));
    let ahead = Arc::new(AtomicU64::new(0));
    let src = Counted {
        inner: Synthetic::new(64 << 10, None).unwrap(),
        produced: produced.clone(),
    };
    let sink = SlowSink {
        produced: produced.clone(),
        ahead: ahead.clone(),
    };
    let rep = Pipeline::new(cfg(slots, BackPressure::Block, 500))
        .run(src, Slow(Duration::from_micros(200)), sink, |_| {})
        .unwrap();
    assert_eq!((rep.frames_delivered, rep.drops), (500, 0));
    assert!(rep.ring_full > 0, "the source must have waited: {rep:?}");
    assert!(rep.max_slots_in_use <= slots, "{rep:?}");
    assert_eq!(
        rep.ring_bytes,
        (slots as u64) * (64 << 10),
        "memory is fixed up front"
    );
    // In flight beyond the frame at the sink: the result ring (slots), the frame ring (slots),
    // one in the stage's hands and one the source holds waiting for a slot.
    let bound = 2 * slots as u64 + 2;
    let seen = ahead.load(Ordering::SeqCst);
    assert!(
        seen <= bound,
        "{seen} frames ahead of the sink, bound {bound}"
    );
}

/// A sink that fails after `ok` results.
struct Dies {
    ok: u64,
}

impl Sink for Dies {
    fn name(&self) -> String {
        "doomed".into()
    }
    fn deliver(&mut self, r: &FrameResult) -> Result<()> {
        if r.seq >= self.ok {
            return Err(Error::peer_lost("the consumer went away"));
        }
        Ok(())
    }
}

#[test]
fn a_sink_that_dies_stops_the_pipeline_with_a_named_error() {
    let t = Instant::now();
    let err = Pipeline::new(PipelineConfig {
        duration: Some(Duration::from_secs(60)),
        ..cfg(4, BackPressure::Block, u64::MAX)
    })
    .run(
        Synthetic::new(4096, None).unwrap(),
        Checksum,
        Dies { ok: 10 },
        |_| {},
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("sink 'doomed' failed at frame 10") && msg.contains("the consumer went away"),
        "{msg}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "it stopped, not ran out the clock"
    );
}

#[test]
fn a_file_sink_on_a_full_disk_names_the_file() {
    if !std::path::Path::new("/dev/full").exists() {
        panic!("/dev/full is missing on this Linux machine");
    }
    let sink = FileSink::create("/dev/full").unwrap();
    let err = Pipeline::new(cfg(4, BackPressure::Block, 100_000))
        .run(Synthetic::new(64, None).unwrap(), Checksum, sink, |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("sink 'file:/dev/full' failed") && err.contains("/dev/full"),
        "{err}"
    );
}

struct Broken;

impl Kernel for Broken {
    fn name(&self) -> String {
        "broken".into()
    }
    fn process(&mut self, frame: &[u8]) -> Result<Output> {
        if frame[0] == 5 {
            return Err(Error::InvalidArgument("cannot handle frame 5".into()));
        }
        Ok(checksum(frame))
    }
}

#[test]
fn a_failing_kernel_is_named_with_its_frame() {
    let err = Pipeline::new(cfg(2, BackPressure::Block, 1000))
        .run(Synthetic::new(100, None).unwrap(), Broken, NullSink, |_| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("kernel 'broken' failed at frame 5"), "{err}");
}

#[test]
fn bad_configurations_are_refused_before_running() {
    let e = Pipeline::new(cfg(0, BackPressure::Block, 1))
        .run(
            Synthetic::new(100, None).unwrap(),
            Checksum,
            NullSink,
            |_| {},
        )
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let e = Pipeline::new(PipelineConfig {
        max_ring_bytes: 1 << 20,
        ..cfg(64, BackPressure::Block, 1)
    })
    .run(
        Synthetic::new(1 << 20, None).unwrap(),
        Checksum,
        NullSink,
        |_| {},
    )
    .unwrap_err();
    assert!(e.to_string().contains("fewer slots"), "{e}");
    assert!(Synthetic::new(0, None).is_err());
    assert!(Synthetic::new(10, Some(0.0)).is_err());
    assert!("sometimes".parse::<BackPressure>().is_err());
}

#[test]
fn a_file_source_and_file_sink_carry_every_frame() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.bin");
    let frame = 8192;
    let data = common::pattern(frame * 10 + 1234, 7);
    std::fs::write(&input, &data).unwrap();
    let out = dir.path().join("results.tsv");
    let rep = Pipeline::new(PipelineConfig {
        max_frames: None,
        ..cfg(3, BackPressure::Block, 0)
    })
    .run(
        FileSource::open(&input, frame).unwrap(),
        Checksum,
        FileSink::create(&out).unwrap(),
        |_| {},
    )
    .unwrap();
    assert_eq!(rep.stop, StopReason::SourceEnd);
    assert_eq!((rep.frames_delivered, rep.drops), (11, 0));
    assert_eq!(rep.bytes_delivered, data.len() as u64);
    let text = std::fs::read_to_string(&out).unwrap();
    let lines: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(lines.len(), 11);
    for (i, (line, chunk)) in lines.iter().zip(data.chunks(frame)).enumerate() {
        let [a, b] = checksum(chunk).0;
        assert_eq!(
            *line,
            format!("{i}\t{}\t{a:#018x}\t{b:#018x}", chunk.len()),
            "frame {i}"
        );
    }
}

#[test]
fn frames_from_a_remote_agent_and_results_to_another() {
    for shm in [false, true] {
        let frame = 16 << 10;
        let frames = 300u64;
        let source = PeerSource::new(common::agent("stream-in", shm), frame, 4).unwrap();
        let addr = source.agent().listen_addr().unwrap().to_string();
        let results = common::agent("stream-results", shm);
        let sink = PeerSink::connect(
            common::agent("stream-out", shm),
            &results.listen_addr().unwrap().to_string(),
        )
        .unwrap();
        let writer = std::thread::spawn(move || {
            let agent = common::agent("daq", shm);
            let mut w = PeerFrameWriter::connect(&agent, &addr, frame).unwrap();
            for seq in 0..frames {
                let got = w
                    .write(&common::pattern(frame - (seq as usize % 7), seq))
                    .unwrap();
                assert_eq!(got, seq);
            }
            // Returns once the source has seen the end.
            w.finish().unwrap();
        });
        let rep = Pipeline::new(PipelineConfig {
            max_frames: None,
            duration: Some(Duration::from_secs(120)),
            ..cfg(2, BackPressure::Block, 0)
        })
        .run(source, Checksum, sink, |_| {})
        .unwrap();
        writer.join().unwrap();
        assert_eq!(
            (rep.frames_delivered, rep.drops, rep.stop),
            (frames, 0, StopReason::SourceEnd)
        );
        for seq in 0..frames {
            let n = results.wait_notification(Duration::from_secs(10)).unwrap();
            let (s, len, words) = PeerSink::decode(&n.data).unwrap();
            let want = common::pattern(frame - (seq as usize % 7), seq);
            assert_eq!((s, len), (seq, want.len() as u64), "shm={shm}");
            assert_eq!(Output(words), checksum(&want), "frame {seq}, shm={shm}");
        }
    }
}

#[test]
fn a_peer_sink_whose_agent_goes_away_stops_the_pipeline() {
    let results = common::agent("doomed-results", false);
    let sink = PeerSink::connect(
        common::agent("stream-out", false),
        &results.listen_addr().unwrap().to_string(),
    )
    .unwrap();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        drop(results);
    });
    let err = Pipeline::new(PipelineConfig {
        duration: Some(Duration::from_secs(60)),
        ..cfg(4, BackPressure::Block, u64::MAX)
    })
    .run(
        Synthetic::new(4096, Some(4096.0 * 2000.0)).unwrap(),
        Checksum,
        sink,
        |_| {},
    )
    .unwrap_err()
    .to_string();
    killer.join().unwrap();
    assert!(
        err.contains("stream stopped: sink 'peer:") && err.contains("failed at frame"),
        "{err}"
    );
}
