//! `gdx calibrate`: measure where the competing paths cross over (p2p vs staged per GPU
//! pair, shm vs tcp on the host), tune the staged chunk, and write the engine's calibration
//! file, which the planner reads when `GDX_CALIBRATION` names it. `--show` prints a file.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::Args;
use gdx_bench::{calibrate, header, CaseSpec, Ctx, Observer, Params, Row};
use gdx_engine::{Calibration, CALIBRATION_ENV};

use super::bench::parse_duration;

/// Measure the crossover sizes between the paths available here and write a calibration
/// file for the planner (`GDX_CALIBRATION=FILE`).
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  gdx calibrate                          measure, write gdx-calibration.json, print the table
  gdx calibrate -o /etc/gdx/cal.json
  gdx calibrate --show                   print the file named by GDX_CALIBRATION (or the default)
  export GDX_CALIBRATION=$PWD/gdx-calibration.json   the planner then uses it")]
pub struct CalibrateArgs {
    /// The calibration file to write (or, with --show, to read). Default: $GDX_CALIBRATION,
    /// else gdx-calibration.json.
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,

    /// Print the calibration file's crossovers and evidence instead of measuring.
    #[arg(long)]
    show: bool,

    /// Target time per size and path.
    #[arg(long, value_name = "TIME", default_value = "60ms", value_parser = parse_duration)]
    duration: Duration,

    /// No progress on stderr.
    #[arg(short, long)]
    quiet: bool,
}

struct Progress(bool);

impl Observer for Progress {
    fn case_started(&mut self, spec: &CaseSpec, index: usize, total: usize) {
        if self.0 {
            eprint!("\r\x1b[2K[{}/{}] {}", index + 1, total, spec.key);
        }
    }
    fn row(&mut self, row: &Row, done: usize, total: usize) {
        if self.0 {
            eprint!(
                "\r\x1b[2K{} {} bytes ({done}/{total})",
                row.key, row.size_bytes
            );
        }
    }
}

fn default_file() -> PathBuf {
    std::env::var_os(CALIBRATION_ENV)
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("gdx-calibration.json"), PathBuf::from)
}

/// Run `gdx calibrate`.
pub fn run(args: &CalibrateArgs) -> Result<ExitCode> {
    let file = args.output.clone().unwrap_or_else(default_file);
    if args.show {
        let cal = Calibration::load(&file).map_err(|e| anyhow::anyhow!("{e}"))?;
        let text = std::fs::read_to_string(&file)?;
        let detail = calibrate::detail_of(&text);
        print!("{}", calibrate::show(&cal, detail.as_ref()));
        return Ok(ExitCode::SUCCESS);
    }
    // Fail before measuring when the file cannot be written.
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&file)
        .with_context(|| format!("opening {} for writing", file.display()))?;
    let ctx = Ctx::live();
    let params = Params {
        sizes: calibrate::sizes(),
        duration: args.duration,
        max_samples: 300,
        ..Params::default()
    };
    let hdr = header::live_header(&ctx, &params, std::env::args().collect(), true);
    let mut progress = Progress(!args.quiet && std::io::stderr().is_terminal());
    let outcome = calibrate::calibrate(&ctx, &params, hdr, &mut progress);
    if progress.0 {
        eprint!("\r\x1b[2K");
    }
    let json = calibrate::to_json(&outcome)?;
    std::fs::write(&file, json).with_context(|| format!("writing {}", file.display()))?;
    for c in outcome.report.cases.iter().filter(|c| c.reason.is_some()) {
        eprintln!(
            "gdx: {}: {:?}: {}",
            c.key,
            c.status,
            c.reason.as_deref().unwrap_or("")
        );
    }
    print!(
        "{}",
        calibrate::show(&outcome.calibration, Some(&outcome.detail))
    );
    let abs = std::fs::canonicalize(&file).unwrap_or(file);
    println!(
        "wrote {}; the planner uses it with {CALIBRATION_ENV}={}",
        abs.display(),
        abs.display()
    );
    Ok(if outcome.report.has_failures() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
