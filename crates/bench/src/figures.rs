//! A row's figures from its raw samples ([`fill_row`]): bandwidth median, min and max, latency
//! p50 and p99, with gdx-base's one median and quantile ([`gdx_base::stats`]).

use std::time::Duration;

use crate::report::Row;

use gdx_base::stats::{quantile, sorted_secs};

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
}
