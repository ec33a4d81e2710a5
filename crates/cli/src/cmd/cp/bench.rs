//! `gdx cp --bench FILE`: run gdx-storage's benchmark and render it, as a table (stdout) and
//! as JSON (`--json`, `--export-json FILE`).

use super::CpArgs;
use anyhow::{Context as _, Result};
use gdx_storage::{bench_file, human_bytes, BenchOptions, BenchReport, BenchStatus, Direction};
use serde_json::json;
use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;

/// Run `gdx cp --bench FILE`.
pub(super) fn run(args: &CpArgs, file: &Path) -> Result<ExitCode> {
    let opts = BenchOptions {
        file: file.to_path_buf(),
        gpu: args.gpu,
        size: args.size,
        samples: args.samples,
        chunk_bytes: usize::try_from(args.chunk).context("--chunk")?,
        depth: args.depth,
    };
    let quiet = args.quiet || args.json;
    let report = bench_file(&opts, &mut |line| {
        if !quiet {
            eprintln!("gdx: {line}");
        }
    })
    .with_context(|| format!("gdx cp --bench (file <-> GPU {})", args.gpu))?;
    let mut v = serde_json::to_value(&report)?;
    v["schema_version"] = json!(1);
    v["ceiling"]["text"] = json!(report.ceiling.describe());
    let text = serde_json::to_string_pretty(&v)?;
    match &args.export_json {
        Some(p) if p.as_os_str() != "-" => std::fs::write(p, format!("{text}\n"))
            .with_context(|| format!("writing {}", p.display()))?,
        _ => {}
    }
    let mut out = std::io::stdout().lock();
    if args.json
        || args
            .export_json
            .as_deref()
            .is_some_and(|p| p.as_os_str() == "-")
    {
        writeln!(out, "{text}")?;
    } else {
        write!(out, "{}", bench_table(&report))?;
    }
    let failed = report
        .rows
        .iter()
        .any(|r| matches!(r.status, BenchStatus::Error(_)));
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The bench report as text: a header, one row per case, then each row's path detail.
fn bench_table(r: &BenchReport) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "gdx storage bench: {} ({}), {} per transfer, GPU {}, median of {} sample(s); GB/s = 1e9 B/s",
        r.file.display(),
        r.fs,
        human_bytes(r.size),
        r.gpu,
        r.samples
    );
    let _ = writeln!(s, "cuFile: {}", r.cufile);
    let _ = writeln!(s, "ceiling (sysfs links): {}", r.ceiling.describe());
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:<26} {:>11} {:>8}  {:<24} method",
        "key", "median GB/s", "x naive", "samples GB/s"
    );
    for row in &r.rows {
        let (median, ratio, samples) = match &row.status {
            BenchStatus::Waived(why) => {
                ("N/A".to_string(), "-".to_string(), format!("waived: {why}"))
            }
            BenchStatus::Error(e) => ("N/A".to_string(), "-".to_string(), format!("error: {e}")),
            BenchStatus::Passed => {
                let m = row
                    .median_gbps
                    .map_or("N/A".to_string(), |m| format!("{m:.2}"));
                let ratio = match (
                    row.median_gbps,
                    r.naive_gbps(row.direction),
                    row.path.as_str(),
                ) {
                    (_, _, "naive" | "copy-engine") => "-".to_string(),
                    (Some(m), Some(n), _) if n > 0.0 && row.direction != Direction::FileToHost => {
                        format!("{:.2}x", m / n)
                    }
                    _ => "-".to_string(),
                };
                let samples = row
                    .samples_gbps
                    .iter()
                    .map(|g| format!("{g:.2}"))
                    .collect::<Vec<_>>()
                    .join(" ");
                (m, ratio, samples)
            }
        };
        let _ = writeln!(
            s,
            "{:<26} {:>11} {:>8}  {:<24} {}",
            row.key, median, ratio, samples, row.method
        );
    }
    let details: Vec<_> = r.rows.iter().filter(|row| !row.detail.is_empty()).collect();
    if !details.is_empty() {
        let _ = writeln!(s, "\npaths as each copy reported them:");
        for row in details {
            let _ = writeln!(s, "  {}: {}", row.key, row.detail);
        }
    }
    s
}
