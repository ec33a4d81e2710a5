//! [`Exporter`]: where a run's report goes besides the terminal — the JSON report, CSV, a
//! Markdown table and a plot, each a file or `-` (stdout).
//!
//! Files are created before the first case ([`Exporter::create`]: a bad path fails before any
//! measuring) and rewritten after every case ([`Exporter::after_case`]), so partial results
//! survive an interrupted run. Stdout exports are written once, at the end
//! ([`Exporter::finish`]), so they stay one document. A plot is SVG, or PNG through
//! `rsvg-convert`.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::{BenchError, Report};

/// The export targets of a run; `None` exports nothing of that kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exporter {
    /// The JSON report ([`Report::to_json`]).
    pub json: Option<PathBuf>,
    /// The CSV rows ([`Report::to_csv`]).
    pub csv: Option<PathBuf>,
    /// The CSV columns as a Markdown table ([`Report::to_markdown`]).
    pub markdown: Option<PathBuf>,
    /// Bandwidth and latency against size, `.svg` or `.png`.
    pub plot: Option<PathBuf>,
}

fn is_stdout(p: &Path) -> bool {
    p.as_os_str() == "-"
}

impl Exporter {
    /// Whether the JSON or CSV export goes to stdout (which then carries nothing else).
    pub fn stdout_taken(&self) -> bool {
        [&self.json, &self.csv, &self.markdown]
            .into_iter()
            .flatten()
            .any(|p| is_stdout(p))
    }

    /// Creates (truncates) every export file now, so that a bad path fails before measuring.
    ///
    /// # Errors
    /// [`BenchError::Io`] naming the file that cannot be created.
    pub fn create(&self) -> Result<(), BenchError> {
        for p in [&self.json, &self.csv, &self.markdown, &self.plot]
            .into_iter()
            .flatten()
        {
            if !is_stdout(p) {
                std::fs::File::create(p)
                    .map_err(BenchError::io(format!("creating {}", p.display())))?;
            }
        }
        Ok(())
    }

    /// Rewrites the export files with the report so far (after each case). Stdout exports
    /// wait for [`Exporter::finish`]; an SVG plot is redrawn (cheap), a PNG only at the end
    /// (it runs `rsvg-convert`).
    ///
    /// Returns the JSON and CSV write failures, for the caller to warn about: the run goes on.
    /// A plot that cannot be drawn yet is not reported (the final one is).
    pub fn after_case(&self, report: &Report) -> Vec<BenchError> {
        let mut failed = Vec::new();
        if let Some(p) = self.json.as_deref().filter(|p| !is_stdout(p)) {
            if let Err(e) = report
                .to_json()
                .map_err(BenchError::Json)
                .and_then(|t| write_out(p, &t))
            {
                failed.push(e);
            }
        }
        if let Some(p) = self.csv.as_deref().filter(|p| !is_stdout(p)) {
            if let Err(e) = write_out(p, &report.to_csv()) {
                failed.push(e);
            }
        }
        if let Some(p) = self.markdown.as_deref().filter(|p| !is_stdout(p)) {
            if let Err(e) = write_out(p, &report.to_markdown()) {
                failed.push(e);
            }
        }
        if let Some(p) = &self.plot {
            if p.extension().and_then(|e| e.to_str()) == Some("svg") && !report.results.is_empty() {
                let _ = write_plot(p, report);
            }
        }
        failed
    }

    /// Writes the final JSON and CSV exports, stdout ones included.
    ///
    /// # Errors
    /// The first export that could not be written.
    pub fn finish(&self, report: &Report) -> Result<(), BenchError> {
        if let Some(p) = &self.json {
            write_out(p, &report.to_json().map_err(BenchError::Json)?)?;
        }
        if let Some(p) = &self.csv {
            write_out(p, &report.to_csv())?;
        }
        if let Some(p) = &self.markdown {
            write_out(p, &report.to_markdown())?;
        }
        Ok(())
    }

    /// Draws the final plot, when one is asked for.
    ///
    /// # Errors
    /// Why there is no plot (nothing measured, no `rsvg-convert` for a PNG, a write error).
    pub fn finish_plot(&self, report: &Report) -> Result<(), BenchError> {
        match &self.plot {
            Some(p) => write_plot(p, report),
            None => Ok(()),
        }
    }
}

/// Writes `text` to `path`, or stdout for `-`.
///
/// # Errors
/// [`BenchError::Io`] naming the file (or stdout).
pub fn write_out(path: &Path, text: &str) -> Result<(), BenchError> {
    if is_stdout(path) {
        let mut out = std::io::stdout().lock();
        return out
            .write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .map_err(BenchError::io("writing to stdout"));
    }
    std::fs::write(path, text).map_err(BenchError::io(format!("writing {}", path.display())))
}

/// Renders `report` as an SVG or PNG plot at `path` (by its extension).
///
/// # Errors
/// [`BenchError::Plot`] with nothing to plot, [`BenchError::PlotFormat`] for another
/// extension, [`BenchError::Rsvg`] when a PNG cannot be converted, [`BenchError::Io`] for a
/// write error.
pub fn write_plot(path: &Path, report: &Report) -> Result<(), BenchError> {
    let title = format!(
        "gdx bench on {} ({}), gdx {}",
        report.header.host, report.header.cpu, report.header.gdx_version
    );
    let svg = crate::plot::svg(report, &title)?;
    match path.extension().and_then(|e| e.to_str()) {
        Some("svg") => write_out(path, &svg),
        Some("png") => {
            let tmp = path.with_extension("svg.tmp");
            std::fs::write(&tmp, &svg)
                .map_err(BenchError::io(format!("writing {}", tmp.display())))?;
            let st = std::process::Command::new("rsvg-convert")
                .arg("-o")
                .arg(path)
                .arg(&tmp)
                .status();
            let _ = std::fs::remove_file(&tmp);
            match st {
                Ok(s) if s.success() => Ok(()),
                Ok(s) => Err(BenchError::Rsvg {
                    path: path.to_path_buf(),
                    status: Some(s),
                    source: None,
                }),
                Err(e) => Err(BenchError::Rsvg {
                    path: path.to_path_buf(),
                    status: None,
                    source: Some(e),
                }),
            }
        }
        _ => Err(BenchError::PlotFormat(path.to_path_buf())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        let params = crate::Params::default();
        let ctx = crate::Ctx::mock();
        let cases = crate::all_cases(&ctx);
        let cases = crate::select(cases, &["mock_host_to_host_fast".to_string()]).unwrap();
        crate::run(
            &cases,
            &ctx,
            &params,
            crate::header::mock_header(&params),
            &mut crate::Quiet,
        )
    }

    #[test]
    fn files_are_created_up_front_and_rewritten_after_each_case() {
        let dir = tempfile::tempdir().unwrap();
        let ex = Exporter {
            json: Some(dir.path().join("r.json")),
            csv: Some(dir.path().join("r.csv")),
            markdown: Some(dir.path().join("r.md")),
            plot: Some(dir.path().join("r.svg")),
        };
        assert!(!ex.stdout_taken());
        ex.create().unwrap();
        for p in [&ex.json, &ex.csv, &ex.plot].into_iter().flatten() {
            assert_eq!(std::fs::metadata(p).unwrap().len(), 0, "{}", p.display());
        }
        let r = report();
        assert!(ex.after_case(&r).is_empty());
        let json = std::fs::read_to_string(ex.json.as_ref().unwrap()).unwrap();
        assert_eq!(
            Report::from_json(&json).unwrap().results.len(),
            r.results.len()
        );
        let csv = std::fs::read_to_string(ex.csv.as_ref().unwrap()).unwrap();
        assert_eq!(csv, r.to_csv());
        let md = std::fs::read_to_string(ex.markdown.as_ref().unwrap()).unwrap();
        assert_eq!(md, r.to_markdown());
        // One header, one rule, one line per row; every line has the CSV's column count.
        let table: Vec<&str> = md.lines().filter(|l| l.starts_with('|')).collect();
        assert_eq!(table.len(), 2 + r.results.len(), "{md}");
        let cols = crate::report::CSV_HEADER.split(',').count();
        assert_eq!(table[1].matches("---|").count(), cols, "{md}");
        for l in table
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != 1)
            .map(|(_, l)| l)
        {
            assert_eq!(l.matches(" | ").count() + 1, cols, "{l}");
        }
        let svg = std::fs::read_to_string(ex.plot.as_ref().unwrap()).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
    }

    #[test]
    fn a_bad_path_fails_at_create_naming_the_file() {
        let ex = Exporter {
            json: Some(PathBuf::from("/nonexistent/dir/x.json")),
            ..Exporter::default()
        };
        let e = ex.create().unwrap_err();
        assert!(
            e.chain().starts_with("creating /nonexistent/dir/x.json: "),
            "{}",
            e.chain()
        );
        assert!(std::error::Error::source(&e).is_some());
    }

    #[test]
    fn stdout_exports_take_stdout_and_a_plot_needs_svg_or_png() {
        let ex = Exporter {
            csv: Some(PathBuf::from("-")),
            ..Exporter::default()
        };
        assert!(ex.stdout_taken());
        let e = write_plot(Path::new("run.pdf"), &report()).unwrap_err();
        assert!(matches!(e, BenchError::PlotFormat(_)), "{e}");
    }
}
