//! Sample statistics for rows and process CPU time: the median / quantile / σ are gdx-base's one
//! implementation ([`gdx_base::stats`], re-exported here), this module fills a [`Row`]'s figures
//! from raw samples, and [`CpuClock`] gives user + system time of the whole process (from
//! `getrusage`).

use std::time::Duration;

use crate::report::Row;

pub use gdx_base::stats::{median, quantile, sorted_secs, Summary};

/// Fill `row`'s bandwidth figures from per-transfer durations of `bytes_per_op` bytes each
/// (median, min, max), and its latency figures from `lat` (p50, p99). `iters` is the count of
/// timed transfers behind `bw`.
pub fn fill_row(row: &mut Row, bytes_per_op: f64, bw: &[Duration], lat: &[Duration], iters: u64) {
    let s = sorted_secs(bw);
    let rate = |sec: f64| (sec > 0.0).then(|| bytes_per_op / sec / 1e9);
    row.bw_gbps = quantile(&s, 0.5).and_then(rate);
    row.bw_max_gbps = s.first().copied().and_then(rate);
    row.bw_min_gbps = s.last().copied().and_then(rate);
    let l = sorted_secs(lat);
    row.lat_p50_us = quantile(&l, 0.5).map(|x| x * 1e6);
    row.lat_p99_us = quantile(&l, 0.99).map(|x| x * 1e6);
    row.iters = iters;
    row.samples_s = bw.iter().map(Duration::as_secs_f64).collect();
    row.lat_samples_s = lat.iter().map(Duration::as_secs_f64).collect();
}

/// Process CPU time (user + system, all threads) at one moment.
#[derive(Debug, Clone, Copy)]
pub struct CpuClock(Option<Duration>);

impl CpuClock {
    /// Read the clock now (`getrusage(RUSAGE_SELF)`); unreadable gives a clock that yields
    /// no figure.
    pub fn now() -> CpuClock {
        CpuClock(gdx_sys::os::process_cpu_time().ok())
    }

    /// The clock as if `by` less CPU time had passed since it was read (time spent on work
    /// the figure leaves out).
    pub fn shifted(self, by: Duration) -> CpuClock {
        CpuClock(self.0.map(|t| t + by))
    }

    /// CPU seconds per GB (1e9 bytes) for `bytes` moved since `self`.
    pub fn per_gb_since(self, bytes: f64) -> Option<f64> {
        let (Some(a), Some(b)) = (self.0, CpuClock::now().0) else {
            return None;
        };
        (bytes > 0.0).then(|| b.saturating_sub(a).as_secs_f64() / (bytes / 1e9))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::{CaseSpec, End, PathKind};

    #[test]
    fn rows_get_median_bandwidth_and_latency_percentiles() {
        let spec = CaseSpec::bare("k", PathKind::Mock, End::Host, End::Host);
        let mut row = Row::new(&spec, 1000);
        let ms = Duration::from_micros;
        fill_row(
            &mut row,
            1000.0,
            &[ms(1), ms(2), ms(4)],
            &[ms(10), ms(20)],
            3,
        );
        assert!((row.bw_gbps.unwrap() - 0.5).abs() < 1e-9);
        assert!((row.bw_max_gbps.unwrap() - 1.0).abs() < 1e-9);
        assert!((row.lat_p50_us.unwrap() - 15.0).abs() < 1e-9);
        assert_eq!(row.samples_s.len(), 3);
    }

    #[test]
    fn cpu_clock_reads() {
        let c = CpuClock::now();
        let mut x = 0u64;
        for i in 0..1_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        std::hint::black_box(x);
        assert!(c.per_gb_since(1e9).is_some());
    }
}
