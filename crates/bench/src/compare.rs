//! `--compare OLD.json`: per case and size, the ratio of this run's bandwidth to an earlier
//! run's, flagging drops larger than a threshold.

use std::fmt::Write as _;

use serde::Serialize;

use crate::render::human_size;
use crate::report::Report;

/// A drop below this ratio (new / old bandwidth) is flagged.
pub const DEFAULT_DROP_RATIO: f64 = 0.9;

/// One case and size found in both runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    /// Case key.
    pub key: String,
    /// Transfer size.
    pub size_bytes: u64,
    /// Earlier bandwidth, GB/s.
    pub old_gbps: f64,
    /// This run's bandwidth, GB/s.
    pub new_gbps: f64,
    /// `new / old`.
    pub ratio: f64,
    /// The ratio is below the threshold.
    pub dropped: bool,
}

/// Pair up the rows of `new` and `old` with a bandwidth in both.
pub fn compare(new: &Report, old: &Report, drop_ratio: f64) -> Vec<Comparison> {
    new.results
        .iter()
        .filter_map(|n| {
            let o = old
                .results
                .iter()
                .find(|o| o.key == n.key && o.size_bytes == n.size_bytes)?;
            let (nb, ob) = (n.bw_gbps?, o.bw_gbps.filter(|b| *b > 0.0)?);
            let ratio = nb / ob;
            Some(Comparison {
                key: n.key.clone(),
                size_bytes: n.size_bytes,
                old_gbps: ob,
                new_gbps: nb,
                ratio,
                dropped: ratio < drop_ratio,
            })
        })
        .collect()
}

/// The comparison as a table, ending with the count of drops.
pub fn render(cmp: &[Comparison], old_name: &str, drop_ratio: f64) -> String {
    let mut s = format!("comparison with {old_name} (ratio = this run / earlier, GB/s)\n");
    let _ = writeln!(
        s,
        "  {:<32} {:>9} {:>10} {:>10} {:>7}",
        "case", "size", "old", "new", "ratio"
    );
    for c in cmp {
        let _ = writeln!(
            s,
            "  {:<32} {:>9} {:>10.2} {:>10.2} {:>6.2}x{}",
            c.key,
            human_size(c.size_bytes),
            c.old_gbps,
            c.new_gbps,
            c.ratio,
            if c.dropped { "  DROP" } else { "" }
        );
    }
    let drops = cmp.iter().filter(|c| c.dropped).count();
    let _ = writeln!(
        s,
        "  {} of {} figures dropped below {:.0}% of the earlier run",
        drops,
        cmp.len(),
        drop_ratio * 100.0
    );
    s
}
