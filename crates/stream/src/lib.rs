//! Streaming pipelines: source → ring of slots → stage (a [`Kernel`]) → result ring → sink,
//! with back-pressure that never loses a frame silently (the engine side of `gdx stream`).
//!
//! # Model
//!
//! - A [`Source`] produces frames (a sensor, a file, a remote agent), each with a sequence
//!   number and a time stamp.
//! - The ring holds [`PipelineConfig::slots`] slots of the source's largest frame, allocated once:
//!   memory is bounded whatever the rates. A slot goes back to the source only after the stage
//!   has finished with it.
//! - The stage runs a [`Kernel`] on every frame (the CPU [`Checksum`] here; a GPU stage runs the
//!   same math) and pushes a small fixed-size result into a result ring of as many entries.
//! - A [`Sink`] takes the results in sequence order. A sink that fails stops the pipeline and
//!   the error names it and the frame.
//!
//! # Back-pressure
//!
//! When every slot is in use, [`BackPressure::Block`] makes the source wait (no frame is lost;
//! the wait shows up as latency), [`BackPressure::Drop`] discards the frame and counts it. Either
//! way the report counts how often the ring was full, and the sink side counts the sequence
//! numbers that never arrived: the run fails if that differs from the counted drops, so a frame
//! can only go missing loudly.
//!
//! # Example
//!
//! ```
//! use gdx_stream::{BackPressure, Checksum, NullSink, Pipeline, PipelineConfig, Synthetic};
//! let cfg = PipelineConfig { slots: 4, policy: BackPressure::Block, max_frames: Some(100), ..PipelineConfig::default() };
//! let report = Pipeline::new(cfg).run(Synthetic::new(4096, None)?, Checksum, NullSink, |_| {})?;
//! assert_eq!((report.frames_delivered, report.drops), (100, 0));
//! # Ok::<(), gdx_engine::Error>(())
//! ```

mod gpu;
mod gpu_service;
mod kernel;
mod peer;
mod report;
mod run;
mod sink;
mod source;
mod stage;

pub use gpu::GpuStage;
pub use kernel::{checksum, Checksum, Kernel, Output};
pub use peer::{PeerFrameWriter, PeerSink, PeerSource, PEER_SOURCE_REGION};
pub use report::{LatencySummary, Progress, StopReason, StreamReport};
pub use sink::{FileSink, FrameResult, NullSink, Sink};
pub use source::{Arrival, FileSource, FrameInfo, SlotBuf, Source, Synthetic};

use std::time::Duration;

use gdx_engine::{Error, Result};

/// What to do with a frame when every slot is in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackPressure {
    /// The source waits for a slot: no loss, the wait is latency.
    #[default]
    Block,
    /// The frame is discarded and counted.
    Drop,
}

impl BackPressure {
    /// `block` or `drop`.
    pub fn as_str(self) -> &'static str {
        match self {
            BackPressure::Block => "block",
            BackPressure::Drop => "drop",
        }
    }
}

impl std::str::FromStr for BackPressure {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "block" => Ok(BackPressure::Block),
            "drop" => Ok(BackPressure::Drop),
            _ => Err(Error::InvalidArgument(format!(
                "unknown back-pressure policy {s:?}: use block (the source waits) or drop (counted)"
            ))),
        }
    }
}

/// How a pipeline runs.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineConfig {
    /// Slots in the frame ring (and entries in the result ring); at least 1.
    pub slots: usize,
    /// When every slot is in use.
    pub policy: BackPressure,
    /// Stop producing after this long (`None`: until the source ends or `max_frames`).
    pub duration: Option<Duration>,
    /// Stop after this many frames produced (dropped ones included).
    pub max_frames: Option<u64>,
    /// How often the progress callback runs.
    pub progress_every: Duration,
    /// Latency samples kept for the quantiles (a uniform sample past this many frames).
    pub latency_samples: usize,
    /// Upper bound on ring memory (`slots` × slot size), so a typo in a size fails instead of
    /// exhausting memory.
    pub max_ring_bytes: u64,
    /// GPU runs: take the copy-engine stage even for frames the service kernel would take
    /// (≤ 8 KiB), e.g. to compare the two or to keep the SM the service kernel reserves.
    pub copy_engine_only: bool,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            slots: 8,
            policy: BackPressure::Block,
            duration: None,
            max_frames: None,
            progress_every: Duration::from_millis(500),
            latency_samples: 4 << 20,
            max_ring_bytes: 16 << 30,
            copy_engine_only: false,
        }
    }
}

/// A configured pipeline; [`Pipeline::run`] runs it to the end.
#[derive(Debug, Clone)]
pub struct Pipeline {
    cfg: PipelineConfig,
}

impl Pipeline {
    /// A pipeline with `cfg`.
    pub fn new(cfg: PipelineConfig) -> Pipeline {
        Pipeline { cfg }
    }

    /// Run `source` → ring → `kernel` (on a CPU stage thread) → result ring → `sink` until the
    /// duration passes, `max_frames` were produced or the source ends; drain what is in flight;
    /// report. `progress` is called on the calling thread every `progress_every`.
    ///
    /// # Errors
    /// A bad configuration ([`Error::InvalidArgument`]); a source, kernel or sink that failed
    /// (the pipeline stopped: the error names the stage, its name and the frame); frames that
    /// went missing without being counted as drops (a bug, never a figure).
    pub fn run(
        &self,
        source: impl Source,
        kernel: impl Kernel,
        sink: impl Sink,
        progress: impl FnMut(&Progress),
    ) -> Result<StreamReport> {
        run::run(
            &self.cfg,
            source,
            stage::CpuStage::new(kernel),
            sink,
            progress,
        )
    }

    /// As [`Pipeline::run`], with the stage on CUDA device `gpu`: the checksum kernel (PTX, the
    /// same math as [`checksum`]) on frames copied host → GPU on the copy engine from pinned
    /// slots, each slot released when a stream signal says its frame is done.
    ///
    /// # Errors
    /// As [`Pipeline::run`]; [`Error::Unavailable`] without a CUDA driver or that GPU, and
    /// [`Error::Cuda`] for a failing CUDA call — never a quiet run on the CPU.
    pub fn run_gpu(
        &self,
        gpu: u32,
        source: impl Source,
        sink: impl Sink,
        progress: impl FnMut(&Progress),
    ) -> Result<StreamReport> {
        // Small frames take the service kernel (no driver call per frame), larger ones the
        // copy engine; the report's `stage` says which.
        let frame = source.max_frame();
        if frame <= gpu_service::SERVICE_MAX_FRAME && !self.cfg.copy_engine_only {
            let stage = gpu_service::ServiceStage::open(gpu, self.cfg.slots, frame)?;
            return run::run(&self.cfg, source, stage, sink, progress);
        }
        let stage = GpuStage::open(gpu, self.cfg.slots, frame)?;
        run::run(&self.cfg, source, stage, sink, progress)
    }
}
