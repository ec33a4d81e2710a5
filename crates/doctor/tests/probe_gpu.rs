//! GPU tests of the doctor's probe measurements (`gdx_doctor::measure`): every direction's bytes
//! arrive intact and each timed copy gives a sample. All need a GPU: `cargo test -p gdx-doctor
//! --test probe_gpu -- --ignored` (the GPU is `GDX_TEST_GPU`, default 0; peer pairs are added
//! when a second GPU is there, and the test says so when it is not). No test asserts a speed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_base::testenv::{peer_gpu, test_gpu};
use gdx_doctor::measure::{mailbox_round_trips, timed_copy, Loc};
use gdx_sys::cuda::Cuda;

#[test]
#[ignore = "requires a GPU; cargo test -- --ignored"]
fn timed_copy_verifies_and_times_every_direction() {
    let cuda = Cuda::load().unwrap();
    let g = test_gpu();
    let mut pairs = vec![
        (Loc::PinnedHost, Loc::Gpu(g)),
        (Loc::Gpu(g), Loc::PinnedHost),
        (Loc::Gpu(g), Loc::Gpu(g)),
    ];
    if let Some(o) = peer_gpu(cuda.device_count().unwrap(), "timed_copy (peer pairs)") {
        pairs.push((Loc::Gpu(g), Loc::Gpu(o)));
        pairs.push((Loc::Gpu(o), Loc::Gpu(g)));
    }
    for (from, to) in pairs {
        for bytes in [1usize, 4097, 8 << 20] {
            let t = timed_copy(&cuda, from, to, bytes, 3).unwrap();
            assert_eq!(t.mismatch, None, "{from} -> {to}, {bytes} B");
            assert_eq!(t.samples.len(), 3);
            assert!(t.samples.iter().all(|d| !d.is_zero()), "{:?}", t.samples);
        }
    }
}

/// Informational: prints the rates the probe measures (no thresholds).
#[test]
#[ignore = "requires a GPU; cargo test -- --ignored --nocapture"]
fn timed_copy_rates_report() {
    let cuda = Cuda::load().unwrap();
    let g = test_gpu();
    let mut pairs = vec![
        (Loc::Gpu(g), Loc::PinnedHost),
        (Loc::PinnedHost, Loc::Gpu(g)),
    ];
    if let Some(o) = peer_gpu(
        cuda.device_count().unwrap(),
        "timed_copy_rates_report (peer pairs)",
    ) {
        pairs.insert(0, (Loc::Gpu(g), Loc::Gpu(o)));
        pairs.insert(1, (Loc::Gpu(o), Loc::Gpu(g)));
    }
    for (from, to) in pairs {
        for bytes in [8usize << 20, 256 << 20, 1 << 30] {
            let t = timed_copy(&cuda, from, to, bytes, 10).unwrap();
            let ms: Vec<String> = t
                .samples
                .iter()
                .map(|d| format!("{:.3}", d.as_secs_f64() * 1e3))
                .collect();
            eprintln!(
                "RATE {from} -> {to} {:>5} MiB: median {:.1} GB/s, held {}, verified {}, ms [{}]",
                bytes >> 20,
                gdx_base::stats::median_rate_gbps(bytes as u64, &t.samples).unwrap_or(0.0),
                t.held,
                t.mismatch.is_none(),
                ms.join(" ")
            );
        }
    }
}

#[test]
#[ignore = "requires a GPU; cargo test -- --ignored"]
fn mailbox_round_trips_read_back_what_they_wrote() {
    let cuda = Cuda::load().unwrap();
    let t = mailbox_round_trips(&cuda, test_gpu(), 20).unwrap();
    assert_eq!(t.mismatch, None);
    assert_eq!(t.samples.len(), 20);
}
