//! What a pipeline run measured: the final [`StreamReport`], the live [`Progress`], and the
//! latency recorder behind both (bounded memory however long the run).

use std::sync::Mutex;
use std::time::Duration;

use gdx_base::stats::quantile;

/// End-to-end latency figures (source stamp → result taken by the sink), in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct LatencySummary {
    /// Frames timed (all delivered frames; past [`super::PipelineConfig::latency_samples`], a
    /// uniform random sample of them for the quantiles).
    pub frames: u64,
    /// Samples behind the quantiles.
    pub samples: usize,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Largest (exact, over every frame).
    pub max_us: f64,
}

/// Why a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StopReason {
    /// The configured duration passed.
    Duration,
    /// The configured frame count was produced.
    Frames,
    /// The source had no more frames.
    SourceEnd,
}

impl StopReason {
    /// `duration`, `frames` or `source-end`, as in the JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Duration => "duration",
            StopReason::Frames => "frames",
            StopReason::SourceEnd => "source-end",
        }
    }
}

/// A finished run.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StreamReport {
    /// Source name.
    pub source: String,
    /// Kernel name.
    pub kernel: String,
    /// Where the kernel ran (`cpu`, or the GPU).
    pub stage: String,
    /// Sink name.
    pub sink: String,
    /// Back-pressure policy (`block` or `drop`).
    pub policy: String,
    /// Slots in the ring.
    pub slots: usize,
    /// Bytes per slot (the source's largest frame).
    pub slot_bytes: usize,
    /// Bytes of frame memory the ring holds: fixed when the run starts, never more.
    pub ring_bytes: u64,
    /// Wall time from the first frame asked for to the last result delivered, seconds.
    pub elapsed_s: f64,
    /// Frames the source produced (sequence numbers used, dropped frames included).
    pub frames_produced: u64,
    /// Frames whose result the sink took.
    pub frames_delivered: u64,
    /// Frame bytes processed and delivered.
    pub bytes_delivered: u64,
    /// Frames dropped for want of a free slot (`drop` policy), as counted at the source.
    pub drops: u64,
    /// Sequence numbers missing at the sink; the pipeline checks it equals `drops` (a frame
    /// lost any other way is an error, not a figure).
    pub gaps: u64,
    /// Times the source found every slot in use (it waited under `block`, dropped under `drop`).
    pub ring_full: u64,
    /// Most slots in use at once (filled, not yet released by the stage): at most `slots`.
    pub max_slots_in_use: usize,
    /// Delivered frame bytes per second, GB/s (1e9).
    pub gbps: f64,
    /// Delivered frames per second.
    pub frames_per_s: f64,
    /// End-to-end latency; `None` when no frame was delivered.
    pub latency: Option<LatencySummary>,
    /// Why the run ended.
    pub stop: StopReason,
    /// The latency sample behind `latency`, seconds, sorted (for a distribution plot; not
    /// serialised).
    #[serde(skip)]
    pub latency_sample_s: Vec<f64>,
}

/// A live snapshot, handed to the progress callback.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    /// Since the run started.
    pub elapsed: Duration,
    /// Frames delivered so far.
    pub frames: u64,
    /// Bytes delivered so far.
    pub bytes: u64,
    /// Frames dropped so far.
    pub drops: u64,
    /// Delivered frames per second over the last interval.
    pub frames_per_s: f64,
    /// GB/s over the last interval.
    pub gbps: f64,
    /// p99 end-to-end latency over the last interval, µs (`None`: nothing delivered in it).
    pub p99_us: Option<f64>,
}

/// Latencies of the frames since the last progress report: enough for a live p99, capped so a
/// slow progress reader cannot grow it.
const RECENT_CAP: usize = 1 << 16;

/// Every frame's latency goes through here (on the sink thread).
pub(crate) struct LatencyRecorder {
    cap: usize,
    samples: Vec<f64>,
    seen: u64,
    max: f64,
    rng: u64,
}

impl LatencyRecorder {
    pub(crate) fn new(cap: usize) -> LatencyRecorder {
        LatencyRecorder {
            cap: cap.max(1),
            samples: Vec::with_capacity(cap.clamp(1, 1 << 20)),
            seen: 0,
            max: 0.0,
            rng: 0x9e37_79b9_7f4a_7c15,
        }
    }

    /// Record one latency (seconds). Past `cap` samples, reservoir sampling (algorithm R) keeps
    /// a uniform sample of all frames, so the quantiles stay unbiased and memory stays fixed.
    pub(crate) fn record(&mut self, secs: f64) {
        self.seen += 1;
        self.max = self.max.max(secs);
        if self.samples.len() < self.cap {
            self.samples.push(secs);
        } else {
            // xorshift64: no need for a crypto generator to pick which sample to replace.
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            let j = self.rng % self.seen;
            if let Some(s) = usize::try_from(j)
                .ok()
                .and_then(|j| self.samples.get_mut(j))
            {
                *s = secs;
            }
        }
    }

    /// The summary and the sorted sample (seconds) it came from.
    pub(crate) fn finish(mut self) -> (Option<LatencySummary>, Vec<f64>) {
        self.samples.sort_by(f64::total_cmp);
        let us = |q: f64| quantile(&self.samples, q).map(|s| s * 1e6);
        let summary = (|| {
            Some(LatencySummary {
                frames: self.seen,
                samples: self.samples.len(),
                p50_us: us(0.5)?,
                p99_us: us(0.99)?,
                p999_us: us(0.999)?,
                max_us: self.max * 1e6,
            })
        })();
        (summary, self.samples)
    }
}

/// Push one latency into the interval buffer the progress reader drains.
pub(crate) fn push_recent(recent: &Mutex<Vec<f64>>, secs: f64) {
    if let Ok(mut r) = recent.lock() {
        if r.len() < RECENT_CAP {
            r.push(secs);
        }
    }
}

/// p99 (µs) of the interval buffer, which it empties.
pub(crate) fn drain_p99_us(recent: &Mutex<Vec<f64>>) -> Option<f64> {
    let mut v = recent.lock().map(|mut r| std::mem::take(&mut *r)).ok()?;
    v.sort_by(f64::total_cmp);
    quantile(&v, 0.99).map(|s| s * 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recorder_keeps_a_bounded_sample_and_the_exact_max() {
        let mut r = LatencyRecorder::new(100);
        for i in 0..10_000 {
            r.record(f64::from(i) * 1e-6);
        }
        assert_eq!(r.samples.len(), 100, "memory stays at the cap");
        let s = r.finish().0.unwrap();
        assert_eq!((s.frames, s.samples), (10_000, 100));
        assert!((s.max_us - 9_999.0).abs() < 1e-6, "{s:?}");
        // A uniform sample of 0..10000 µs has its median well inside the middle half.
        assert!(s.p50_us > 2_500.0 && s.p50_us < 7_500.0, "{s:?}");
    }

    #[test]
    fn quantiles_come_from_the_shared_stats_module() {
        let mut r = LatencyRecorder::new(1000);
        for us in [1.0, 2.0, 3.0, 4.0, 5.0] {
            r.record(us * 1e-6);
        }
        let s = r.finish().0.unwrap();
        assert!((s.p50_us - 3.0).abs() < 1e-9);
        assert!((s.max_us - 5.0).abs() < 1e-9);
        assert_eq!(LatencyRecorder::new(10).finish(), (None, Vec::new()));
    }
}
