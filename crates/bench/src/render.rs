//! Text output: the run header, one perftest-like table per case (a line per size), and the
//! closing summary. Results go to stdout; the CLI sends progress and warnings to stderr.

use std::fmt::Write as _;

use crate::report::{CaseOutcome, Header, Report, Row, Status};

/// `8 B`, `4 KiB`, `1 GiB`: the largest binary unit that divides the size exactly.
pub fn human_size(b: u64) -> String {
    for (unit, shift) in [("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if b >= 1 << shift && b.trailing_zeros() >= shift {
            return format!("{} {unit}", b >> shift);
        }
    }
    format!("{b} B")
}

/// The run header, one fact per line.
pub fn header(h: &Header) -> String {
    let mut s = String::new();
    let git = h
        .git_hash
        .as_deref()
        .map_or(String::new(), |g| format!(" ({g})"));
    let _ = writeln!(
        s,
        "gdx bench {}{git} on {} — {}",
        h.gdx_version, h.host, h.cpu
    );
    if let Some(k) = &h.kernel {
        let _ = writeln!(s, "kernel {k}");
    }
    if let Some(c) = &h.cuda {
        let _ = writeln!(s, "cuda: {c}");
    }
    if let Some(d) = &h.driver {
        let _ = writeln!(s, "driver: {d}");
    }
    for d in &h.devices {
        let _ = writeln!(
            s,
            "{}: {} {}{}",
            d.label,
            d.name.as_deref().unwrap_or("?"),
            d.bdf.as_deref().unwrap_or("?"),
            d.numa.map_or(String::new(), |n| format!(" NUMA {n}"))
        );
    }
    let m = &h.method;
    let _ = writeln!(
        s,
        "method: {} warm-up, {:.2} s per size, {}..{} samples{}, verify {}, {}",
        m.warmup,
        m.duration_s,
        m.min_samples,
        m.max_samples,
        m.iters
            .map_or(String::new(), |n| format!(", {n} iterations")),
        if m.verify { "on" } else { "off" },
        m.bandwidth_unit
    );
    for n in &h.notes {
        let _ = writeln!(s, "note: {n}");
    }
    s
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.prec$}"))
}

/// One case: its status line, and for a measured case the table of its sizes.
pub fn case(outcome: &CaseOutcome, rows: &[&Row]) -> String {
    let mut s = String::new();
    let title = format!(
        "{} [{}, {} → {}]: {}",
        outcome.key, outcome.path, outcome.src, outcome.dst, outcome.description
    );
    match outcome.status {
        Status::Waived => {
            let _ = writeln!(
                s,
                "{title}\n  WAIVED: {}\n",
                outcome.reason.as_deref().unwrap_or("")
            );
            return s;
        }
        Status::Passed | Status::Error => {
            let _ = writeln!(s, "{title}");
        }
    }
    if let Some(c) = rows
        .iter()
        .find_map(|r| r.ceiling_gbps.zip(r.ceiling_basis.as_ref()))
    {
        let _ = writeln!(s, "  ceiling {:.2} GB/s ({})", c.0, c.1);
    }
    if !rows.is_empty() {
        let _ = writeln!(
            s,
            "  {:>12} {:>7} {:>10} {:>7} {:>10} {:>10} {:>9} {:>5} {:>8}",
            "#bytes",
            "iters",
            "BW GB/s",
            "%ceil",
            "p50 µs",
            "p99 µs",
            "CPU s/GB",
            "GPU%",
            "verified"
        );
    }
    let mut notes = Vec::new();
    for r in rows {
        let verified = match (r.status, r.verified) {
            (Status::Error, _) => "ERROR",
            (_, Some(true)) => "ok",
            (_, Some(false)) => "FAILED",
            (_, None) => "-",
        };
        let _ = writeln!(
            s,
            "  {:>12} {:>7} {:>10} {:>7} {:>10} {:>10} {:>9} {:>5} {:>8}",
            r.size_bytes,
            r.iters,
            opt(r.bw_gbps, 2),
            r.pct_of_ceiling.map_or("-".into(), |p| format!("{p:.1}%")),
            opt(r.lat_p50_us, 2),
            opt(r.lat_p99_us, 2),
            opt(r.cpu_s_per_gb, 3),
            opt(r.gpu_util_pct, 0),
            verified
        );
        if let Some(n) = &r.note {
            if !notes.contains(&(n.as_str(), r.size_bytes)) {
                notes.push((n.as_str(), r.size_bytes));
            }
        }
    }
    let mut last = "";
    for (n, size) in notes {
        if n != last {
            let _ = writeln!(s, "  note ({}): {n}", human_size(size));
            last = n;
        }
    }
    if outcome.status == Status::Error {
        let _ = writeln!(s, "  ERROR: {}", outcome.reason.as_deref().unwrap_or(""));
    }
    s.push('\n');
    s
}

/// Every case of a report, in order.
pub fn cases(report: &Report) -> String {
    report
        .cases
        .iter()
        .map(|c| {
            let rows: Vec<&Row> = report.results.iter().filter(|r| r.key == c.key).collect();
            case(c, &rows)
        })
        .collect()
}

/// `3 passed, 1 waived, 1 failed (2 sizes failed verification)`.
pub fn summary(report: &Report) -> String {
    let count = |s: Status| report.cases.iter().filter(|c| c.status == s).count();
    let bad_rows = report.results.iter().filter(|r| r.is_failure()).count();
    let mut s = format!(
        "{} passed, {} waived, {} failed",
        count(Status::Passed),
        count(Status::Waived),
        count(Status::Error)
    );
    if bad_rows > 0 {
        let _ = write!(s, " ({bad_rows} sizes failed or did not verify)");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human_size(8), "8 B");
        assert_eq!(human_size(4096), "4 KiB");
        assert_eq!(human_size(3 << 20), "3 MiB");
        assert_eq!(human_size(1 << 30), "1 GiB");
        assert_eq!(human_size(1000), "1000 B");
    }
}
