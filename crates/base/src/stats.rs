//! Sample statistics: the one median / quantile / min / max / σ of gdx. Every crate's probe and
//! benchmark (gdx-bench's rows and copy probe, gdx-storage's and gdx-rdma's benchmarks, doctor's
//! probes) takes its figures from here, so "median" means the same thing in every report:
//! linear interpolation between the two middle samples of an even count.

use std::time::Duration;

/// The `q`-quantile (0..=1) of sorted `v` by linear interpolation; `None` when empty.
pub fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let pos = q.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    let frac = pos - lo as f64;
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * frac)
}

/// The median of the finite values of `v` (any order); `None` when there are none.
pub fn median(v: &[f64]) -> Option<f64> {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    s.sort_by(f64::total_cmp);
    quantile(&s, 0.5)
}

/// Count, extremes, centre and spread of a sample (hyperfine's "mean ± σ, min … max").
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Samples.
    pub n: usize,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
    /// Arithmetic mean.
    pub mean: f64,
    /// Median (linear interpolation).
    pub median: f64,
    /// 99th percentile (linear interpolation).
    pub p99: f64,
    /// Sample standard deviation (n − 1); `None` for one sample, never a made-up 0.
    pub stddev: Option<f64>,
}

impl Summary {
    /// The summary of `v` (any order); `None` when empty.
    pub fn of(v: &[f64]) -> Option<Summary> {
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let mean = s.iter().sum::<f64>() / n.max(1) as f64;
        let stddev = (n > 1)
            .then(|| (s.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt());
        Some(Summary {
            n,
            min: *s.first()?,
            max: *s.last()?,
            mean,
            median: quantile(&s, 0.5)?,
            p99: quantile(&s, 0.99)?,
            stddev,
        })
    }
}

/// Seconds of each duration, sorted ascending.
pub fn sorted_secs(v: &[Duration]) -> Vec<f64> {
    let mut s: Vec<f64> = v.iter().map(Duration::as_secs_f64).collect();
    s.sort_by(f64::total_cmp);
    s
}

/// `bytes` over the median of `samples` (zero durations, which a coarse clock can give, are
/// left out), in GB/s (1e9 bytes per second); `None` without a usable sample.
pub fn median_rate_gbps(bytes: u64, samples: &[Duration]) -> Option<f64> {
    let secs: Vec<f64> = samples
        .iter()
        .filter(|d| !d.is_zero())
        .map(Duration::as_secs_f64)
        .collect();
    median(&secs).map(|s| bytes as f64 / s / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile(&v, 0.5), Some(2.5));
        assert_eq!(quantile(&v, 0.0), Some(1.0));
        assert_eq!(quantile(&v, 1.0), Some(4.0));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn medians_skip_non_finite_values() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN, 1.0]), Some(1.0));
    }

    #[test]
    fn summaries_give_centre_spread_and_no_sigma_for_one_sample() {
        let s = Summary::of(&[4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!(
            (s.n, s.min, s.max, s.mean, s.median),
            (4, 1.0, 4.0, 2.5, 2.5)
        );
        assert!((s.stddev.unwrap() - 1.290_994).abs() < 1e-6);
        assert_eq!(Summary::of(&[7.0]).unwrap().stddev, None);
        assert_eq!(Summary::of(&[]), None);
    }

    #[test]
    fn rates_use_the_median_duration_and_skip_zero_samples() {
        let ms = Duration::from_millis;
        let g = median_rate_gbps(1_000_000_000, &[ms(10), ms(1000), ms(5)]).unwrap();
        assert!((g - 100.0).abs() < 1e-9, "{g}");
        assert_eq!(median_rate_gbps(1, &[]), None);
        assert_eq!(median_rate_gbps(1, &[Duration::ZERO]), None);
    }
}
