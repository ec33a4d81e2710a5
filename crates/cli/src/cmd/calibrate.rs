//! `gdx calibrate`: measure where the competing paths cross over (p2p vs staged per GPU
//! pair, shm vs tcp on the host), tune the staged chunk, and write the engine's calibration
//! file, which the planner reads when `GDX_CALIBRATION` names it. `--show` prints a file.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::Args;
use gdx_bench::render::{self, Style};
use gdx_bench::{calibrate, header, plan, BenchCase, CaseSpec, Ctx, Observer, Params, Row};
use gdx_engine::{Calibration, CALIBRATION_ENV};

use super::args::{parse_duration, parse_sizes, sizes_help, SizeList};
use super::output::ColorWhen;

/// Measure the crossover sizes between the paths available here and write a calibration
/// file for the planner (`GDX_CALIBRATION=FILE`).
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  gdx calibrate                          measure, write gdx-calibration.json, print the table
  gdx calibrate -o /etc/gdx/cal.json     write there instead
  gdx calibrate --show                   print the file named by GDX_CALIBRATION (or the default)
  gdx calibrate --show /etc/gdx/cal.json print that file
  gdx calibrate --dry-run --size 4KiB:1GB   the comparisons and sizes, nothing measured
  export GDX_CALIBRATION=$PWD/gdx-calibration.json   the planner then uses it")]
pub struct CalibrateArgs {
    /// The calibration file to write. Default: $GDX_CALIBRATION, else gdx-calibration.json.
    /// Always an output (`--show FILE` names a file to read).
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,

    /// Print a calibration file's crossovers and evidence instead of measuring: FILE, else
    /// $GDX_CALIBRATION, else gdx-calibration.json.
    #[arg(long, value_name = "FILE")]
    show: Option<Option<PathBuf>>,

    #[arg(short = 's', long, value_name = "SIZES", default_value = "8:256MiB", value_parser = parse_sizes, help = sizes_help())]
    size: SizeList,

    /// Target time per size and path.
    #[arg(long, value_name = "TIME", default_value = "60ms", value_parser = parse_duration)]
    duration: Duration,

    /// Print the calibration (the file's JSON) to stdout instead of the table; with
    /// --dry-run, the plan as JSON.
    #[arg(long)]
    json: bool,

    /// Print the comparisons that would be measured and the sizes; measure and write nothing.
    #[arg(long)]
    dry_run: bool,

    /// Print nothing but warnings and errors (no progress, no table).
    #[arg(short, long)]
    quiet: bool,

    /// Colour: auto (only on a terminal, and not when NO_COLOR is set), always or never.
    #[arg(long, value_name = "WHEN", value_enum, default_value_t = ColorWhen::Auto)]
    color: ColorWhen,
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

/// `--show [FILE]`: print a calibration file.
fn show(args: &CalibrateArgs, given: Option<&Path>) -> Result<ExitCode> {
    let file = if let Some(g) = given {
        g.to_path_buf()
    } else if let Some(o) = &args.output {
        // The old spelling, `--show -o FILE`, read FILE: keep it working, say the new one.
        eprintln!(
            "gdx: note: `--show -o FILE` is deprecated (-o is the file calibrate writes); use `--show {}`",
            o.display()
        );
        o.clone()
    } else {
        default_file()
    };
    let cal = Calibration::load(&file).map_err(|e| anyhow::anyhow!("{e}"))?;
    let text =
        std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    if args.json {
        let v: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not JSON", file.display()))?;
        println!("{}", super::output::json_pretty(&v)?);
    } else if !args.quiet {
        let detail = calibrate::detail_of(&text);
        print!("{}", calibrate::show(&cal, detail.as_ref()));
    }
    Ok(ExitCode::SUCCESS)
}

/// The compared cases of this machine.
fn compared_cases(ctx: &Ctx) -> Vec<Box<dyn BenchCase>> {
    let wanted: Vec<String> = calibrate::pairs(ctx.gpu_count())
        .into_iter()
        .flat_map(|(_, a, b)| [a, b])
        .collect();
    gdx_bench::all_cases(ctx)
        .into_iter()
        .filter(|c| wanted.contains(&c.spec().key))
        .collect()
}

/// `--dry-run`: the comparisons and sizes, as text or JSON.
fn dry_run(args: &CalibrateArgs, ctx: &Ctx, file: &Path) -> Result<ExitCode> {
    let pairs = calibrate::pairs(ctx.gpu_count());
    let cases = compared_cases(ctx);
    let (todo, groups) = plan(&cases, ctx);
    let json = args.json.then(|| {
        serde_json::json!({
            "output": file,
            "sizes_bytes": args.size.0,
            "comparisons": pairs.iter().map(|(scope, a, b)| serde_json::json!({
                "scope": scope, "cases": [a, b],
            })).collect::<Vec<_>>(),
            "runnable": todo.iter().filter(|(_, w)| w.is_none()).map(|(c, _)| c.spec().key.clone()).collect::<Vec<_>>(),
            "waived": groups,
        })
    });
    if let Some(done) = super::bench::dry_run_start(json, &groups, args.color)? {
        return Ok(done);
    }
    for (scope, a, b) in &pairs {
        println!("{scope}: {a} vs {b}");
    }
    let sizes: Vec<String> = args
        .size
        .0
        .iter()
        .map(|&b| gdx_base::bytesize::ByteSize(b).to_string())
        .collect();
    println!("sizes: {} ({} sizes)", sizes.join(" "), sizes.len());
    println!("would write {}", file.display());
    Ok(ExitCode::SUCCESS)
}

/// Run `gdx calibrate`.
pub fn run(args: &CalibrateArgs) -> Result<ExitCode> {
    if let Some(given) = &args.show {
        return show(args, given.as_deref());
    }
    let file = args.output.clone().unwrap_or_else(default_file);
    let ctx = Ctx::live();
    if args.dry_run {
        return dry_run(args, &ctx, &file);
    }
    // Fail before measuring when the file cannot be written.
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&file)
        .with_context(|| format!("opening {} for writing", file.display()))?;
    let params = Params {
        sizes: args.size.0.clone(),
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
    std::fs::write(&file, &json).with_context(|| format!("writing {}", file.display()))?;
    let style = Style {
        color: args.color.enabled() && std::io::stderr().is_terminal(),
    };
    // Waivers are warnings here (stderr): each shared reason once, then the others.
    for line in render::waived_groups(&outcome.report.waived, style).lines() {
        if !line.is_empty() {
            eprintln!("gdx: {line}");
        }
    }
    for c in outcome.report.cases.iter().filter(|c| c.reason.is_some()) {
        eprintln!(
            "gdx: {}: {:?}: {}",
            c.key,
            c.status,
            c.reason.as_deref().unwrap_or("")
        );
    }
    let abs = std::fs::canonicalize(&file).unwrap_or(file);
    if args.json {
        println!("{json}");
    } else if !args.quiet {
        print!(
            "{}",
            calibrate::show(&outcome.calibration, Some(&outcome.detail))
        );
        println!(
            "wrote {}; the planner uses it with {CALIBRATION_ENV}={}",
            abs.display(),
            abs.display()
        );
    }
    Ok(if outcome.report.has_failures() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
