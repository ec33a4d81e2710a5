//! Text output: the run header, the cases waived for a shared reason (one line each reason),
//! one perftest-like table per case (a line per size, GB/s beside Mop/s), and the closing
//! summary table. Results go to stdout; the CLI sends progress and warnings to stderr.

use std::fmt::Write as _;

use gdx_base::bytesize::human_bytes;

use crate::ceiling::OVER_CEILING_PCT;
use crate::report::{CaseOutcome, Header, Report, Row, Status, WaivedGroup};

/// Whether text carries ANSI colour (the CLI decides from `--color` and the terminal).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Style {
    /// Colour status words (ok, WAIVED, ERROR, FAILED, DROP).
    pub color: bool,
}

impl Style {
    /// `text` in ANSI colour `code` (31 red, 32 green, 33 yellow) when colour is on.
    pub fn paint(self, code: u8, text: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }
}

/// Three significant digits below 1 (so 8-byte rows do not read `0.00`; below 1e-5 in
/// scientific notation, to fit the column), two decimals up to 100, one above.
pub fn figure(x: f64) -> String {
    if !x.is_finite() {
        return "-".into();
    }
    let a = x.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 100.0 {
        format!("{x:.1}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else if a < 1e-5 {
        format!("{x:.2e}")
    } else {
        let decimals = (2 - a.log10().floor() as i32).clamp(2, 9) as usize;
        format!("{x:.decimals$}")
    }
}

fn fig(v: Option<f64>) -> String {
    v.map_or("-".into(), figure)
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
        "method: {} warm-up, {:.2} s per size, {}..{} samples{}, verify {}, {}; Mop/s = million transfers per second",
        m.warmup,
        m.duration_s,
        m.min_samples,
        m.max_samples,
        m.iters
            .map_or(String::new(), |n| format!(", {n} iterations")),
        if m.verify { "on" } else { "off" },
        m.bandwidth_unit
    );
    if let Some(c) = &h.host_ceiling {
        let _ = writeln!(s, "host ceiling: {}", c.method);
    }
    if let Some(f) = &h.latency_floors {
        let _ = writeln!(s, "{}", f.summary());
    }
    for n in &h.notes {
        let _ = writeln!(s, "note: {n}");
    }
    s
}

/// A `%ceil` cell, 7 wide. Past the ceiling the percentage is not a fact about the path: it is
/// marked (the row's note says the ceiling is wrong).
fn pct_cell(pct_of_ceiling: Option<f64>, style: Style) -> String {
    match pct_of_ceiling {
        Some(p) if p > OVER_CEILING_PCT => style.paint(33, &format!("{:>7}", format!("{p:.0}%!"))),
        Some(p) => format!("{:>7}", format!("{p:.1}%")),
        None => format!("{:>7}", "-"),
    }
}

/// Cases waived for a shared reason: one line each reason.
pub fn waived_groups(groups: &[WaivedGroup], style: Style) -> String {
    let mut s = String::new();
    for g in groups {
        let _ = writeln!(
            s,
            "{}: {}: {}{} [{} case{}]",
            g.scope,
            style.paint(33, "waived"),
            gdx_topo::printable(&g.reason),
            g.fix
                .as_deref()
                .map_or(String::new(), |f| format!("; {}", gdx_topo::printable(f))),
            g.cases,
            if g.cases == 1 { "" } else { "s" }
        );
    }
    if !s.is_empty() {
        s.push('\n');
    }
    s
}

/// One case: its status line, and for a measured case the table of its sizes.
pub fn case(outcome: &CaseOutcome, rows: &[&Row], style: Style) -> String {
    let mut s = String::new();
    let title = format!(
        "{} [{}, {} → {}]: {}",
        outcome.key, outcome.path, outcome.src, outcome.dst, outcome.description
    );
    match outcome.status {
        Status::Waived => {
            let _ = writeln!(
                s,
                "{title}\n  {}: {}\n",
                style.paint(33, "WAIVED"),
                gdx_topo::printable(outcome.reason.as_deref().unwrap_or(""))
            );
            return s;
        }
        Status::Passed | Status::Error => {
            let _ = writeln!(s, "{title}");
        }
    }
    // Host rows have one ceiling below 16 MiB and another from there: show each once.
    let mut ceilings: Vec<(f64, &str, u64)> = Vec::new();
    for r in rows {
        if let (Some(g), Some(b)) = (r.ceiling_gbps, r.ceiling_basis.as_deref()) {
            if !ceilings.iter().any(|c| c.1 == b) {
                ceilings.push((g, b, r.size_bytes));
            }
        }
    }
    for (i, (g, b, from)) in ceilings.iter().enumerate() {
        let from = if ceilings.len() > 1 && i > 0 {
            format!(" from {}", human_bytes(*from))
        } else {
            String::new()
        };
        let _ = writeln!(s, "  ceiling {g:.2} GB/s ({b}){from}");
    }
    if !rows.is_empty() {
        let _ = writeln!(
            s,
            "  {:>12} {:>7} {:>10} {:>9} {:>7} {:>10} {:>10} {:>9} {:>5} {:>8}",
            "#bytes",
            "iters",
            "BW GB/s",
            "Mop/s",
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
            (Status::Error, _) => style.paint(31, &format!("{:>8}", "ERROR")),
            (_, Some(true)) => style.paint(32, &format!("{:>8}", "ok")),
            (_, Some(false)) => style.paint(31, &format!("{:>8}", "FAILED")),
            (_, None) => format!("{:>8}", "-"),
        };
        let pct = pct_cell(r.pct_of_ceiling, style);
        let _ = writeln!(
            s,
            "  {:>12} {:>7} {:>10} {:>9} {pct} {:>10} {:>10} {:>9} {:>5} {verified}",
            r.size_bytes,
            r.iters,
            fig(r.bw_gbps),
            fig(r.msg_rate_mops),
            opt(r.lat_p50_us, 2),
            opt(r.lat_p99_us, 2),
            opt(r.cpu_s_per_gb, 3),
            opt(r.gpu_util_pct, 0),
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
            let _ = writeln!(
                s,
                "  note ({}): {}",
                human_bytes(size),
                gdx_topo::printable(n)
            );
            last = n;
        }
    }
    if outcome.status == Status::Error {
        let _ = writeln!(
            s,
            "  {}: {}",
            style.paint(31, "ERROR"),
            // A case's error quotes what a peer or a file said (a server's refusal): escaped,
            // so it cannot drive the terminal.
            gdx_topo::printable(outcome.reason.as_deref().unwrap_or(""))
        );
    }
    s.push('\n');
    s
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.prec$}"))
}

/// Every case of a report, in order, after the waived groups.
pub fn cases(report: &Report, style: Style) -> String {
    let mut s = waived_groups(&report.waived, style);
    for c in &report.cases {
        let rows: Vec<&Row> = report.results.iter().filter(|r| r.key == c.key).collect();
        s.push_str(&case(c, &rows, style));
    }
    s
}

/// One measured case in the closing summary.
#[derive(Debug, Clone, PartialEq)]
pub struct CaseSummary {
    /// Case key.
    pub key: String,
    /// Highest median bandwidth of its rows, GB/s, and the size it was reached at.
    pub peak: Option<(f64, u64)>,
    /// `%ceil` at the peak.
    pub pct_of_ceiling: Option<f64>,
    /// p50 latency at the smallest size measured, µs, and that size (8 B in the default sweep).
    pub small_p50: Option<(f64, u64)>,
    /// Highest message rate of its rows, Mop/s, and the size.
    pub msg_rate: Option<(f64, u64)>,
}

/// The summary figures of every case that measured something.
pub fn case_summaries(report: &Report) -> Vec<CaseSummary> {
    let best = |rows: &[&Row], f: &dyn Fn(&Row) -> Option<f64>| {
        rows.iter()
            .filter_map(|r| Some((f(r)?, r.size_bytes)))
            .max_by(|a, b| a.0.total_cmp(&b.0))
    };
    report
        .cases
        .iter()
        .filter_map(|c| {
            let rows: Vec<&Row> = report
                .results
                .iter()
                .filter(|r| r.key == c.key && r.status == Status::Passed)
                .collect();
            if rows.is_empty() {
                return None;
            }
            let peak = best(&rows, &|r| r.bw_gbps);
            let pct = peak.and_then(|(_, size)| {
                rows.iter()
                    .find(|r| r.size_bytes == size)
                    .and_then(|r| r.pct_of_ceiling)
            });
            let small_p50 = rows
                .iter()
                .min_by_key(|r| r.size_bytes)
                .and_then(|r| Some((r.lat_p50_us?, r.size_bytes)));
            Some(CaseSummary {
                key: c.key.clone(),
                peak,
                pct_of_ceiling: pct,
                small_p50,
                msg_rate: best(&rows, &|r| r.msg_rate_mops),
            })
        })
        .collect()
}

/// The closing table (per case: peak GB/s and where, %ceil there, p50 at the smallest size,
/// peak message rate), then the counts line.
pub fn summary_table(report: &Report, style: Style) -> String {
    let rows = case_summaries(report);
    let mut s = String::new();
    if !rows.is_empty() {
        let w = rows.iter().map(|r| r.key.len()).max().unwrap_or(4).max(4);
        let _ = writeln!(s, "summary");
        let _ = writeln!(
            s,
            "  {:<w$} {:>10} {:>8} {:>7} {:>10} {:>8} {:>9} {:>8}",
            "case", "peak GB/s", "at", "%ceil", "p50 µs", "at", "Mop/s", "at"
        );
        let at = |v: Option<(f64, u64)>| v.map_or("-".into(), |(_, b)| human_bytes(b));
        for r in &rows {
            let pct = pct_cell(r.pct_of_ceiling, style);
            let _ = writeln!(
                s,
                "  {:<w$} {:>10} {:>8} {pct} {:>10} {:>8} {:>9} {:>8}",
                r.key,
                fig(r.peak.map(|p| p.0)),
                at(r.peak),
                opt(r.small_p50.map(|p| p.0), 2),
                at(r.small_p50),
                fig(r.msg_rate.map(|p| p.0)),
                at(r.msg_rate),
            );
        }
    }
    s.push_str(&summary(report));
    s.push('\n');
    s
}

/// `3 passed, 1 waived, 1 failed (2 sizes failed verification)`; cases in a waived group
/// count as waived.
pub fn summary(report: &Report) -> String {
    let count = |s: Status| report.cases.iter().filter(|c| c.status == s).count();
    let grouped: usize = report.waived.iter().map(|g| g.cases).sum();
    let bad_rows = report.results.iter().filter(|r| r.is_failure()).count();
    let mut s = format!(
        "{} passed, {} waived, {} failed",
        count(Status::Passed),
        count(Status::Waived) + grouped,
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
    fn a_case_quoting_a_peer_prints_its_controls_escaped() {
        // What a server may put in its pre-auth error, as gdx bench's ERROR line quotes it.
        let why = "peer said: max\u{1b}]0;pwned\u{7} \u{1b}[2J\u{9b}31m\u{85}";
        let spec = crate::mock::cases()
            .into_iter()
            .next()
            .map(|c| c.spec().clone())
            .unwrap_or_else(|| panic!("no mock case"));
        for status in [Status::Error, Status::Waived] {
            let o = CaseOutcome::new(&spec, status, Some(why.into()), 0.0);
            let s = case(&o, &[], Style::default());
            assert!(!s.chars().any(|c| c.is_control() && c != '\n'), "{s:?}");
            assert!(s.contains("\\u{1b}]0;pwned\\u{7}"), "{s}");
            assert!(s.contains("\\u{9b}31m"), "{s}");
        }
    }

    #[test]
    fn small_figures_keep_three_significant_digits() {
        assert_eq!(figure(0.001234), "0.00123");
        assert_eq!(figure(0.0534), "0.0534");
        assert_eq!(figure(0.5), "0.500");
        assert_eq!(figure(12.345), "12.35");
        assert_eq!(figure(394.81), "394.8");
        assert_eq!(figure(0.0), "0");
        assert_eq!(figure(0.0000512), "0.0000512");
        assert_eq!(figure(0.000000931), "9.31e-7");
    }
}
