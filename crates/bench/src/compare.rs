//! `--compare OLD.json [--fail-on-drop PCT]`: per case and size, this run's bandwidth and p50
//! latency against an earlier run's. Lower bandwidth or higher latency by more than the
//! threshold is a drop; the CLI exits 1 on a drop when `--fail-on-drop` is given, so a CI job
//! can gate on it.
//!
//! Figures below a noise floor ([`BW_NOISE_FLOOR_GBPS`], [`LAT_NOISE_FLOOR_US`]) in either run
//! are not compared: a ratio of two figures the clock cannot resolve (`0.00 → 0.00`) is noise,
//! not a regression.

use std::fmt::Write as _;

use serde::Serialize;

use crate::render::{figure, Style};
use crate::report::{Report, Row, Status};
use gdx_base::bytesize::human_bytes;

/// The default threshold, percent.
pub const DEFAULT_DROP_PCT: f64 = 10.0;

/// Bandwidth below this (1 MB/s) is not compared.
pub const BW_NOISE_FLOOR_GBPS: f64 = 0.001;

/// Latency below this is not compared (below the resolution of the host clock's samples).
pub const LAT_NOISE_FLOOR_US: f64 = 0.1;

/// Which figure a comparison is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Median bandwidth, GB/s: lower is worse.
    Bandwidth,
    /// p50 latency, µs: higher is worse.
    Latency,
}

impl Metric {
    fn unit(self) -> &'static str {
        match self {
            Metric::Bandwidth => "GB/s",
            Metric::Latency => "p50 µs",
        }
    }
}

/// One figure of one case and size found in both runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    /// Case key.
    pub key: String,
    /// Transfer size.
    pub size_bytes: u64,
    /// Which figure.
    pub metric: Metric,
    /// The earlier figure.
    pub old: f64,
    /// This run's figure.
    pub new: f64,
    /// How much worse this run is, percent (negative: better). Bandwidth: `(old − new) / old`;
    /// latency: `(new − old) / old`.
    pub worse_pct: f64,
    /// `worse_pct` is beyond the threshold.
    pub dropped: bool,
}

fn one(key: &str, size: u64, metric: Metric, old: f64, new: f64, pct: f64) -> Comparison {
    let worse_pct = match metric {
        Metric::Bandwidth => 100.0 * (old - new) / old,
        Metric::Latency => 100.0 * (new - old) / old,
    };
    Comparison {
        key: key.to_string(),
        size_bytes: size,
        metric,
        old,
        new,
        worse_pct,
        dropped: worse_pct > pct,
    }
}

fn measured(r: &Row) -> bool {
    r.status == Status::Passed
}

/// Pair up the passed rows of `new` and `old` (same key and size) and compare bandwidth and
/// latency where both runs are above the noise floor; `drop_pct` is the threshold.
pub fn compare(new: &Report, old: &Report, drop_pct: f64) -> Vec<Comparison> {
    let mut out = Vec::new();
    for n in new.results.iter().filter(|r| measured(r)) {
        let Some(o) = old
            .results
            .iter()
            .find(|o| measured(o) && o.key == n.key && o.size_bytes == n.size_bytes)
        else {
            continue;
        };
        if let (Some(nb), Some(ob)) = (n.bw_gbps, o.bw_gbps) {
            if nb >= BW_NOISE_FLOOR_GBPS && ob >= BW_NOISE_FLOOR_GBPS {
                out.push(one(
                    &n.key,
                    n.size_bytes,
                    Metric::Bandwidth,
                    ob,
                    nb,
                    drop_pct,
                ));
            }
        }
        if let (Some(nl), Some(ol)) = (n.lat_p50_us, o.lat_p50_us) {
            if nl >= LAT_NOISE_FLOOR_US && ol >= LAT_NOISE_FLOOR_US {
                out.push(one(&n.key, n.size_bytes, Metric::Latency, ol, nl, drop_pct));
            }
        }
    }
    out
}

/// The comparison as a table, ending with the count of drops.
pub fn render(cmp: &[Comparison], old_name: &str, drop_pct: f64, style: Style) -> String {
    let mut s = format!(
        "comparison with {old_name} (worse = lower bandwidth or higher latency; a drop is worse by more than {drop_pct}%)\n"
    );
    let w = cmp.iter().map(|c| c.key.len()).max().unwrap_or(4).max(4);
    let _ = writeln!(
        s,
        "  {:<w$} {:>9} {:>7} {:>10} {:>10} {:>8}",
        "case", "size", "figure", "old", "new", "worse"
    );
    for c in cmp {
        let _ = writeln!(
            s,
            "  {:<w$} {:>9} {:>7} {:>10} {:>10} {:>7.1}%{}",
            c.key,
            human_bytes(c.size_bytes),
            c.metric.unit(),
            figure(c.old),
            figure(c.new),
            c.worse_pct,
            if c.dropped {
                format!("  {}", style.paint(31, "DROP"))
            } else {
                String::new()
            }
        );
    }
    let drops = cmp.iter().filter(|c| c.dropped).count();
    let _ = writeln!(
        s,
        "  {drops} of {} figures dropped by more than {drop_pct}% (figures below {BW_NOISE_FLOOR_GBPS} GB/s or {LAT_NOISE_FLOOR_US} µs are not compared)",
        cmp.len()
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::{CaseSpec, End, PathKind};
    use crate::header::mock_header;
    use crate::Params;

    fn report(rows: &[(u64, f64, f64)]) -> Report {
        let spec = CaseSpec::bare("k", PathKind::Mock, End::Host, End::Host);
        Report {
            schema_version: crate::SCHEMA_VERSION,
            header: mock_header(&Params::default()),
            cases: vec![],
            waived: vec![],
            results: rows
                .iter()
                .map(|&(size, bw, lat)| Row {
                    bw_gbps: Some(bw),
                    lat_p50_us: Some(lat),
                    ..Row::new(&spec, size)
                })
                .collect(),
        }
    }

    #[test]
    fn lower_bandwidth_and_higher_latency_are_drops_noise_is_not() {
        let old = report(&[(8, 0.0, 5.0), (4096, 1.0, 5.0), (1 << 20, 10.0, 100.0)]);
        let new = report(&[(8, 0.0, 5.2), (4096, 1.0, 8.0), (1 << 20, 8.0, 100.0)]);
        let c = compare(&new, &old, 10.0);
        // 8 B: bandwidth 0 → 0 is below the floor, latency +4 % is within 10 %.
        assert!(!c
            .iter()
            .any(|x| x.size_bytes == 8 && x.metric == Metric::Bandwidth));
        let drops: Vec<(u64, Metric)> = c
            .iter()
            .filter(|x| x.dropped)
            .map(|x| (x.size_bytes, x.metric))
            .collect();
        assert_eq!(
            drops,
            vec![(4096, Metric::Latency), (1 << 20, Metric::Bandwidth)]
        );
        assert!(compare(&new, &old, 70.0).iter().all(|x| !x.dropped));
    }
}
