//! Rendering a [`Report`] for people (text, failures first, colour only when asked) and for
//! tools (JSON). The CLI decides colour (terminal or not) and where output goes.

use crate::finding::{Finding, Status};
use crate::report::{DataPath, Report};
// Names and values come from the examined tree (maybe a hostile archive): never raw to a terminal.
use gdx_topo::printable;
use std::fmt::Write as _;

/// How the text report looks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TextStyle {
    /// ANSI colours (only for a terminal).
    pub color: bool,
    /// Evidence for passing and skipped findings too (fail/warn always show theirs).
    pub verbose: bool,
    /// Only failures and warnings (with evidence and fix) and the summary line: no header,
    /// no paths, no passes or skips.
    pub quiet: bool,
}

fn paint(s: &str, code: &str, on: bool) -> String {
    if on {
        format!("\x1b[{code}m{s}\x1b[0m")
    } else {
        s.to_string()
    }
}

fn status_tag(s: Status, color: bool) -> String {
    let (t, c) = match s {
        Status::Fail => ("FAIL", "1;31"),
        Status::Warn => ("WARN", "1;33"),
        Status::Pass => ("PASS", "32"),
        Status::Skip => ("SKIP", "2"),
    };
    paint(t, c, color)
}

fn path_tag(p: DataPath) -> &'static str {
    match p {
        DataPath::P2p => "p2p",
        DataPath::Gdr => "gdr",
        DataPath::Staged => "staged",
        DataPath::None => "none",
        DataPath::Unknown => "unknown",
    }
}

/// The text report: header, paths (verdicts), findings grouped by status with failures first,
/// and a summary line with the exit code.
pub fn render_text(r: &Report, color: bool) -> String {
    render_text_with(
        r,
        TextStyle {
            color,
            verbose: false,
            quiet: false,
        },
    )
}

/// The header and the per-path verdicts (left out by `quiet`).
fn header_and_paths(r: &Report, style: TextStyle, o: &mut String) {
    let c = style.color;
    let h = &r.header;
    let _ = writeln!(
        o,
        "{}",
        paint(&format!("{} — GPU-direct readiness", h.tool), "1", c)
    );
    let _ = writeln!(
        o,
        "root {}   live libraries: {}   topology: {}",
        h.root,
        if h.live { "yes" } else { "no" },
        h.topology
    );
    let devs = |v: &[crate::report::HeaderDevice]| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.iter()
                .map(|d| {
                    let mut s = d.label.clone();
                    if let Some(b) = &d.bdf {
                        s.push_str(&format!(" {b}"));
                    }
                    if let Some(n) = &d.name {
                        s.push_str(&format!(" ({n})"));
                    }
                    s
                })
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    let _ = writeln!(o, "GPUs: {}", devs(&h.gpus));
    let _ = writeln!(o, "RDMA devices: {}", devs(&h.rdma_devices));
    let _ = writeln!(o, "probes: {}", h.probes);
    if !h.environment.is_empty() && h.environment != "environment" {
        let _ = writeln!(o, "environment judged: {}", h.environment);
    }
    for n in &h.notes {
        let _ = writeln!(o, "note: {n}");
    }

    if !r.verdicts.is_empty() {
        let _ = writeln!(o, "\n{}", paint("Paths", "1", c));
        let w = r
            .verdicts
            .iter()
            .map(|v| v.subject.len())
            .max()
            .unwrap_or(0);
        for v in &r.verdicts {
            let tag = format!("{:<7}", path_tag(v.path));
            let tag = match v.path {
                DataPath::P2p | DataPath::Gdr => paint(&tag, "32", c),
                DataPath::Staged | DataPath::Unknown => paint(&tag, "33", c),
                DataPath::None => paint(&tag, "31", c),
            };
            let _ = writeln!(o, "  {:<w$}  {tag} {}", v.subject, v.summary);
            let deciding: Vec<String> = v
                .decided_by
                .iter()
                .filter(|f| f.status != Status::Pass || style.verbose)
                .map(|f| format!("{} {} ({})", f.id, f.subject, f.status))
                .collect();
            if !deciding.is_empty() {
                let _ = writeln!(
                    o,
                    "  {:<w$}          decided by: {}",
                    "",
                    deciding.join(", ")
                );
            }
        }
    }
}

/// [`render_text`] with every option.
pub fn render_text_with(r: &Report, style: TextStyle) -> String {
    let c = style.color;
    let mut o = String::new();
    if !style.quiet {
        header_and_paths(r, style, &mut o);
    }
    let s = &r.summary;
    let _ = writeln!(
        o,
        "\n{}",
        paint(
            &format!(
                "Findings ({} fail, {} warn, {} pass, {} skip)",
                s.fail, s.warn, s.pass, s.skip
            ),
            "1",
            c
        )
    );
    let mut fs: Vec<&Finding> = r
        .findings
        .iter()
        .filter(|f| !style.quiet || matches!(f.status, Status::Fail | Status::Warn))
        .collect();
    // Stable sort: within a status, check order is kept.
    fs.sort_by_key(|f| f.status.severity_rank());
    let idw = fs.iter().map(|f| f.id.len()).max().unwrap_or(0);
    let sw = fs
        .iter()
        .map(|f| f.subject.len())
        .max()
        .unwrap_or(0)
        .min(24);
    let mut last: Option<Status> = None;
    for f in fs {
        if last.is_some() && last != Some(f.status) {
            o.push('\n');
        }
        last = Some(f.status);
        let _ = writeln!(
            o,
            "{}  {:<idw$}  {:<sw$}  {}",
            status_tag(f.status, c),
            f.id,
            printable(&f.subject),
            printable(&f.message)
        );
        let pad = " ".repeat(6);
        let detailed = matches!(f.status, Status::Fail | Status::Warn) || style.verbose;
        if detailed {
            for e in &f.evidence {
                let _ = writeln!(o, "{pad}{} {}", paint("evidence:", "2", c), printable(e));
            }
        }
        if let Some(fix) = &f.fix {
            let _ = writeln!(o, "{pad}{} {}", paint("fix:", "36", c), printable(fix));
        }
    }
    let code = r.exit_code();
    let _ = writeln!(
        o,
        "\n{} fail, {} warn, {} pass, {} skip: exit {code}",
        s.fail, s.warn, s.pass, s.skip
    );
    o
}

/// The JSON report (`{"schema_version":..,"header":..,"summary":..,"findings":[..],"verdicts":[..]}`).
pub fn render_json(r: &Report) -> String {
    r.to_json()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Header, Summary, Verdict, SCHEMA_VERSION};

    fn report() -> Report {
        let findings = vec![
            Finding::pass("driver", "host", "NVIDIA driver 580"),
            Finding::fail("acs", "0000:02:01.0", "ACS redirect enabled")
                .evidence("config: ACSCtl 0x001d")
                .fix("setpci ..."),
            Finding::skip("mrrs", "NIC0", "needs root"),
        ];
        Report {
            schema_version: SCHEMA_VERSION,
            header: Header {
                tool: "gdx-doctor 0.1.0".into(),
                root: "/".into(),
                live: true,
                topology: "sysfs".into(),
                gpus: vec![],
                rdma_devices: vec![],
                probes: "not run: --no-probe".into(),
                environment: "environment".into(),
                notes: vec!["no RDMA devices".into()],
            },
            summary: Summary::of(&findings),
            findings,
            verdicts: vec![Verdict {
                subject: "GPU0-GPU1".into(),
                kind: "gpu-gpu".into(),
                path: DataPath::P2p,
                class: Some("NV18".into()),
                summary: "p2p over NV18".into(),
                measured_gbps: None,
                decided_by: vec![],
            }],
        }
    }

    #[test]
    fn failures_come_first_and_plain_text_has_no_escapes() {
        let t = render_text(&report(), false);
        let fail = t.find("FAIL  acs").unwrap();
        let pass = t.find("PASS  driver").unwrap();
        let skip = t.find("SKIP  mrrs").unwrap();
        assert!(fail < pass && pass < skip, "{t}");
        assert!(t.contains("evidence: config: ACSCtl 0x001d"));
        assert!(t.contains("fix: setpci ..."));
        assert!(t.contains("GPU0-GPU1  p2p     p2p over NV18"), "{t}");
        assert!(t.contains("note: no RDMA devices"));
        assert!(t.trim_end().ends_with("exit 1"));
        assert!(!t.contains('\x1b'));
        assert!(render_text(&report(), true).contains("\x1b[1;31mFAIL"));
    }

    #[test]
    fn json_round_trips() {
        let j = render_json(&report());
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(v["verdicts"][0]["path"], "p2p");
        assert_eq!(v["findings"][2]["reason"], "needs root");
    }
}
