#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The GPU stage of the stream pipeline (run on a GPU machine with `--include-ignored`; the
//! device is `GDX_TEST_GPU`, default 0): every frame's GPU result equals the CPU checksum of
//! the same frame, sequence numbers prove no loss or reordering under `block`, drops equal
//! the gaps under `drop`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use gdx_engine::Result;
use gdx_stream::{checksum, BackPressure, FrameResult, Pipeline, PipelineConfig, Sink, Synthetic};

fn gpu() -> u32 {
    std::env::var("GDX_TEST_GPU")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

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

fn cfg(slots: usize, policy: BackPressure, frames: u64) -> PipelineConfig {
    PipelineConfig {
        slots,
        policy,
        max_frames: Some(frames),
        duration: Some(Duration::from_secs(120)),
        ..PipelineConfig::default()
    }
}

/// Frames of at most this size take the service kernel unless the copy engine is forced.
const SERVICE_MAX: usize = 8 << 10;

#[test]
#[ignore = "requires a CUDA GPU"]
fn gpu_results_equal_the_cpu_checksum_for_every_frame_and_size() {
    for (len, frames) in [
        (1usize, 200u64),
        (7, 200),
        (4096, 5000),
        (4096 + 3, 2000),
        (1 << 20, 300),
        ((4 << 20) + 1, 100),
        (SERVICE_MAX, 3000),
        (SERVICE_MAX + 1, 1000),
    ]
    .into_iter()
    .flat_map(|f| [(f, false), (f, true)])
    {
        let ((len, frames), copy_engine_only) = (len, frames);
        let sink = Collect::default();
        let rep = Pipeline::new(PipelineConfig {
            copy_engine_only,
            ..cfg(8, BackPressure::Block, frames)
        })
        .run_gpu(
            gpu(),
            Synthetic::new(len, None).unwrap(),
            sink.clone(),
            |_| {},
        )
        .unwrap();
        assert!(rep.stage.starts_with("gpu"), "{}", rep.stage);
        assert_eq!(
            rep.stage.contains("service kernel"),
            len <= SERVICE_MAX && !copy_engine_only,
            "len {len}: {}",
            rep.stage
        );
        assert_eq!((rep.frames_delivered, rep.drops), (frames, 0), "len {len}");
        let got = sink.0.lock().unwrap();
        for (i, r) in got.iter().enumerate() {
            assert_eq!(r.seq, i as u64, "no loss, no reordering (len {len})");
            assert_eq!(
                r.output,
                checksum(&Synthetic::expected(r.seq, len)),
                "frame {} of {len} bytes",
                r.seq
            );
        }
    }
}

#[test]
#[ignore = "requires a CUDA GPU"]
fn gpu_drops_are_counted_and_equal_the_gaps() {
    let len = 4 << 20;
    let sink = Collect::default();
    // 400 GB/s of 4 MiB frames: several times what PCIe carries, so the ring fills.
    let src = Synthetic::new(len, Some(400e9)).unwrap();
    let rep = Pipeline::new(cfg(2, BackPressure::Drop, 3000))
        .run_gpu(gpu(), src, sink.clone(), |_| {})
        .unwrap();
    let got = sink.0.lock().unwrap();
    assert!(rep.drops > 0, "{rep:?}");
    let mut expect = 0;
    let mut gaps = 0;
    for r in got.iter() {
        assert!(r.seq >= expect);
        gaps += r.seq - expect;
        expect = r.seq + 1;
        assert_eq!(r.output, checksum(&Synthetic::expected(r.seq, len)));
    }
    gaps += rep.frames_produced - expect;
    assert_eq!(gaps, rep.drops);
    assert!(rep.max_slots_in_use <= 2);
}

#[test]
#[ignore = "requires a CUDA GPU"]
fn a_missing_gpu_is_an_error_not_a_cpu_run() {
    let err = Pipeline::new(cfg(2, BackPressure::Block, 10))
        .run_gpu(
            999,
            Synthetic::new(64, None).unwrap(),
            Collect::default(),
            |_| {},
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("GPU999 is not present"), "{err}");
}
