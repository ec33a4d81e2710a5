//! `gdx doctor`: every GPU-direct readiness check, with evidence, verdict and fix, and active
//! probes that prove paths by using them. The checks live in `gdx-doctor`; this file only maps
//! flags to options and the report to text, JSON and an exit code.

use anyhow::Result;
use clap::Args;
use gdx_doctor::render::{render_text_with, TextStyle};
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

/// Check whether GPUDirect P2P / RDMA / Storage will be used on this machine, why not, and how
/// to fix it.
///
/// Prints the verdict per GPU pair and GPU↔NIC pair first, then every finding (failures
/// first) with its evidence and fix. Exit code: 0 when every check passed, warned or skipped,
/// 1 when any check failed, 2 when doctor itself could not run.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  gdx doctor                       this machine, with active probes when a GPU is present
  gdx doctor --no-probe            static checks only (seconds, no GPU work)
  gdx doctor --json                {\"findings\":[...],\"verdicts\":[...]} for tools
  gdx doctor --root box.tar.gz     a machine captured with `gdx topo --capture`
  gdx doctor --quiet               failures and warnings only, then the summary
  gdx doctor --list                the check ids")]
pub struct DoctorArgs {
    /// Examine a captured machine (folder or .tar.gz from `gdx topo --capture`) instead of
    /// this one. Live libraries and probes are not used: they describe this machine.
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,

    /// Run the active probes (copies between GPUs and to host, RDMA registrations). This is the
    /// default when a GPU is present.
    #[arg(long, overrides_with = "no_probe")]
    probe: bool,

    /// Skip the active probes.
    #[arg(long)]
    no_probe: bool,

    /// Print JSON: {"findings":[...],"verdicts":[...]} plus header and summary.
    #[arg(long)]
    json: bool,

    /// Show evidence for passing checks too.
    #[arg(long, short)]
    verbose: bool,

    /// Colour: auto (only on a terminal), always or never.
    #[arg(long, value_name = "WHEN", default_value = "auto", value_parser = ["auto", "always", "never"])]
    color: String,

    /// Print only failures and warnings (with evidence and fix) and the summary line.
    #[arg(long, short)]
    quiet: bool,

    /// List the checks (stable ids) and exit.
    #[arg(long)]
    list: bool,
}

/// Run `gdx doctor`.
pub fn run(args: &DoctorArgs) -> Result<ExitCode> {
    let mut stdout = std::io::stdout().lock();
    if args.list {
        for c in gdx_doctor::checks::all_checks() {
            writeln!(stdout, "{:<18} {}", c.id(), c.title())?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    super::topo::remove_unpacked_on_signal(args.root.as_deref())?;
    let facts = gdx_doctor::live::SystemFacts;
    let probe = gdx_doctor::live::SystemProbe;
    let mut opts = gdx_doctor::Options::new(args.root.clone().unwrap_or_else(|| "/".into()));
    opts.env = std::env::vars().collect();
    opts.live = Some(&facts);
    if !args.no_probe {
        opts.probe = Some(&probe);
    }
    let report = match gdx_doctor::run(&opts) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("gdx: error: {e}");
            return Ok(ExitCode::from(gdx_doctor::EXIT_DOCTOR_ERROR));
        }
    };
    if args.json {
        writeln!(stdout, "{}", gdx_doctor::render_json(&report))?;
    } else {
        let style = TextStyle {
            color: super::topo::use_color(&args.color),
            verbose: args.verbose,
            quiet: args.quiet,
        };
        stdout.write_all(render_text_with(&report, style).as_bytes())?;
    }
    Ok(ExitCode::from(report.exit_code()))
}
