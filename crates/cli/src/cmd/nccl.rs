//! `gdx nccl`: explain an NCCL INFO log and judge it against this (or a captured) machine,
//! recommend NCCL's environment, and run nccl-tests-style collectives on the local GPUs. The
//! work is in `gdx-nccl`; this file maps flags to it and its data to text, JSON and exit codes.

use super::output::{paint_verdicts, OutputArgs};
use anyhow::{Context as _, Result};
use clap::{Args, Subcommand};
use gdx_nccl::judge::{judge, Machine};
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

/// Explain what NCCL did, judge it against the machine, and tell NCCL what to do.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  gdx nccl explain nccl.log                    what NCCL did, judged against this machine
  gdx nccl explain nccl.*.log --xml topo.xml   per-rank NCCL_DEBUG_FILE files, judged against an NCCL XML
  gdx nccl env                                 export lines for this machine
  gdx nccl env --root box.tar.gz --json        for a captured machine, as JSON
  gdx nccl run --size 1MiB,64MiB,1GiB          all-reduce/all-gather/reduce-scatter/send-recv on every local GPU")]
pub struct NcclArgs {
    #[command(subcommand)]
    command: NcclCommand,
}

#[derive(Subcommand, Debug)]
enum NcclCommand {
    Explain(ExplainArgs),
    Env(EnvArgs),
    Run(RunArgs),
}

/// Which machine to judge against: this one, a capture, or an NCCL XML file.
#[derive(Args, Debug, Clone, Default)]
pub struct MachineArgs {
    /// A machine captured with `gdx topo --capture` (folder or .tar.gz) instead of this one.
    #[arg(long, value_name = "CAPTURE", conflicts_with = "xml")]
    pub root: Option<PathBuf>,

    /// An NCCL topology XML file (NCCL_TOPO_FILE format) instead of this machine.
    #[arg(long, value_name = "FILE")]
    pub xml: Option<PathBuf>,
}

/// Read NCCL_DEBUG=INFO logs and say, for every class of rank pairs, which transport NCCL
/// used and whether it is the most direct path the machine allows.
///
/// Exit code: 0 when NCCL took the best path everywhere it could be judged, 1 when it left a
/// direct path unused (GPUDirect RDMA off on a PIX/PXB NIC, sockets despite RDMA NICs, SHM
/// between P2P-capable GPUs), 2 when a log could not be read.
#[derive(Args, Debug)]
pub struct ExplainArgs {
    /// Log files: one combined log, or one per rank (NCCL_DEBUG_FILE=nccl.%h.%p).
    #[arg(value_name = "LOG", required = true)]
    logs: Vec<PathBuf>,

    #[command(flatten)]
    machine: MachineArgs,

    /// Print JSON: {"log":{..},"pair_classes":[..],"judged":{..}}.
    #[arg(long)]
    json: bool,

    #[command(flatten)]
    out: OutputArgs,
}

/// The NCCL_* environment for this machine, each variable with its reason, as shell
/// `export` lines (unset ones as comments).
#[derive(Args, Debug)]
pub struct EnvArgs {
    #[command(flatten)]
    machine: MachineArgs,

    /// Print JSON: {"topology":..,"gpus":[..],"vars":[{"name","value","reason"}]}.
    #[arg(long)]
    json: bool,

    #[command(flatten)]
    out: OutputArgs,
}

/// A loaded machine: topology (when readable), doctor findings, a description.
pub struct Loaded {
    /// The topology.
    pub topology: Option<gdx_topo::Topology>,
    /// Doctor findings (empty for an XML file: there is no tree to check).
    pub findings: Vec<gdx_doctor::Finding>,
    /// What it is, for the report.
    pub description: String,
}

/// Load the machine the flags name. A capture or XML that cannot be read is an error; the
/// live machine's problems become a note, so a log can still be explained on a bare host.
pub fn load_machine(m: &MachineArgs) -> Result<Loaded> {
    if let Some(x) = &m.xml {
        let topo = gdx_topo::from_nccl_xml(x).with_context(|| format!("--xml {}", x.display()))?;
        return Ok(Loaded {
            topology: Some(topo),
            findings: Vec::new(),
            description: format!("NCCL XML {}", x.display()),
        });
    }
    if let Some(r) = &m.root {
        let topo =
            super::topo::load(Some(r), None).with_context(|| format!("--root {}", r.display()))?;
        let mut opts = gdx_doctor::Options::new(r.clone());
        opts.topology = Some(topo.clone());
        opts.root_is_this_machine = Some(false);
        let report = gdx_doctor::run(&opts).with_context(|| format!("--root {}", r.display()))?;
        return Ok(Loaded {
            topology: Some(topo),
            findings: report.findings,
            description: format!("captured machine {}", r.display()),
        });
    }
    let topo = match gdx_topo::discover() {
        Ok(t) => Some(t),
        Err(e) => {
            eprintln!(
                "gdx: warning: this machine's topology could not be read ({e}); judging without it"
            );
            None
        }
    };
    let facts = gdx_doctor::live::SystemFacts;
    let mut opts = gdx_doctor::Options::new("/");
    opts.env = std::env::vars().collect();
    opts.live = Some(&facts);
    opts.topology = topo.clone();
    let findings = match gdx_doctor::run(&opts) {
        Ok(r) => r.findings,
        Err(e) => {
            eprintln!("gdx: warning: doctor could not run on this machine ({e})");
            Vec::new()
        }
    };
    Ok(Loaded {
        topology: topo,
        findings,
        description: "this machine".into(),
    })
}

/// Run `gdx nccl`.
pub fn run(args: &NcclArgs) -> Result<ExitCode> {
    match &args.command {
        NcclCommand::Explain(a) => explain(a),
        NcclCommand::Env(a) => env(a),
        NcclCommand::Run(a) => run_collectives(a),
    }
}

fn explain(args: &ExplainArgs) -> Result<ExitCode> {
    let log = gdx_nccl::parse_files(&args.logs)?;
    let machine = load_machine(&args.machine)?;
    let judged = judge(
        &log,
        Machine {
            topology: machine.topology.as_ref(),
            findings: &machine.findings,
        },
    );
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(
            out,
            "{}",
            gdx_nccl::render::explain_json(&log, &judged, &machine.description)
        )?;
    } else {
        // Every name in it (hosts, HCAs, interfaces) comes from the log: escaped before it
        // reaches the terminal, and before the verdicts are painted.
        let text = gdx_topo::printable_text(&gdx_nccl::render::explain_text(
            &log,
            &judged,
            &machine.description,
        ));
        // Quiet: only the judgement (what NCCL left on the table); the exit code says the rest.
        let text = match (args.out.quiet, text.find("\nJudgement")) {
            (true, Some(i)) => text[i + 1..].to_string(),
            _ => text,
        };
        out.write_all(paint_verdicts(args.out.color.enabled(), &text).as_bytes())?;
    }
    Ok(ExitCode::from(judged.exit_code()))
}

fn env(args: &EnvArgs) -> Result<ExitCode> {
    let machine = load_machine(&args.machine)?;
    let Some(topo) = machine.topology.as_ref() else {
        anyhow::bail!("no topology to recommend from: give --root CAPTURE or --xml FILE");
    };
    let netdevs: Box<dyn gdx_rdma::gid::NetdevView> = match (&args.machine.root, &args.machine.xml)
    {
        (_, Some(_)) => Box::new(gdx_rdma::gid::StaticNetdevs::default()),
        (Some(r), None) => Box::new(gdx_rdma::gid::SysfsNetdevs::at_root(r)),
        (None, None) => Box::new(gdx_rdma::gid::SysfsNetdevs::live()),
    };
    let advice = gdx_nccl::env::recommend(&gdx_nccl::env::EnvInput {
        topology: topo,
        netdevs: netdevs.as_ref(),
        findings: &machine.findings,
    });
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", super::output::json_pretty(&advice)?)?;
    } else {
        let text = gdx_nccl::env::render_shell(&advice);
        if args.out.quiet {
            // Quiet: the export lines alone, ready for `eval "$(gdx nccl env -q)"`.
            for l in text.lines().filter(|l| l.starts_with("export ")) {
                writeln!(out, "{l}")?;
            }
        } else {
            out.write_all(text.as_bytes())?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Sizes from the project's one size parser.
#[derive(Debug, Clone)]
pub struct Sizes(Vec<u64>);

fn parse_sizes(s: &str) -> Result<Sizes, gdx_base::bytesize::SizeError> {
    gdx_base::bytesize::parse_size_list(s).map(Sizes)
}

/// Collectives by name.
#[derive(Debug, Clone)]
pub struct Ops(Vec<gdx_nccl::run::Op>);

fn parse_ops(s: &str) -> Result<Ops, String> {
    s.split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(|x| {
            gdx_nccl::run::Op::parse(x).ok_or_else(|| {
                format!("unknown collective {x:?}: use all_reduce, all_gather, reduce_scatter, sendrecv")
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Ops)
}

/// Time all-reduce, all-gather, reduce-scatter and send/recv on the local GPUs from one
/// process (ncclCommInitAll), like nccl-tests (algbw, busbw with its formulas); capture NCCL's
/// log with NCCL_DEBUG_FILE, explain it, and compare busbw with the topology's ceiling.
///
/// Sets NCCL_DEBUG=INFO and NCCL_DEBUG_FILE for NCCL, and NCCL_NVLS_ENABLE=0 and
/// NCCL_DEBUG_SUBSYS when unset. Without a GPU or libnccl it prints "waived: <why>" and
/// exits 0; it exits 1 when the explained log shows a direct path left unused.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// Sizes: a list (1MiB,64MiB,1GiB) or a range (1MiB:1GiB, x4 steps; 1MiB:1GiB:x2).
    #[arg(short = 's', long, value_name = "SIZES", default_value = "1MiB,64MiB,1GiB", value_parser = parse_sizes)]
    size: Sizes,

    /// Collectives, comma-separated: all_reduce, all_gather, reduce_scatter, sendrecv.
    #[arg(long, value_name = "OPS", default_value = "all_reduce,all_gather,reduce_scatter,sendrecv", value_parser = parse_ops)]
    ops: Ops,

    /// Untimed launches per size first.
    #[arg(long, value_name = "N", default_value_t = 5)]
    warmup: u32,

    /// Timed launches per size.
    #[arg(long, value_name = "N", default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    iters: u32,

    /// Use only the first N GPUs (default: every GPU).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    gpus: Option<u32>,

    /// Keep NCCL's debug files in DIR (default: a temporary folder, removed afterwards).
    #[arg(long, value_name = "DIR")]
    keep_log: Option<PathBuf>,

    /// Print JSON: {"status":"ran",..,"rows":[..],"judged":{..}} or {"status":"waived","reason":..}.
    #[arg(long)]
    json: bool,

    #[command(flatten)]
    out: OutputArgs,
}

fn run_collectives(args: &RunArgs) -> Result<ExitCode> {
    use gdx_nccl::run::{RunOutcome, RunParams};
    // The topology first (sysfs + NVML, no NCCL): the run sets NCCL's environment before it
    // loads libnccl, and the ceiling needs the NVLink counts.
    let topo = gdx_topo::discover().ok();
    let params = RunParams {
        sizes: args.size.0.clone(),
        ops: args.ops.0.clone(),
        warmup: args.warmup,
        iters: args.iters,
        gpus: args.gpus,
        log_dir: args.keep_log.clone(),
    };
    let outcome = gdx_nccl::run::run(&params, topo.as_ref())?;
    let mut out = std::io::stdout().lock();
    let report = match outcome {
        RunOutcome::Waived { reason } => {
            if args.json {
                writeln!(
                    out,
                    "{}",
                    serde_json::json!({"status": "waived", "reason": reason})
                )?;
            } else {
                writeln!(out, "waived: {reason}")?;
            }
            return Ok(ExitCode::SUCCESS);
        }
        RunOutcome::Ran(r) => r,
    };
    let machine = load_machine(&MachineArgs::default())?;
    let judged = judge(
        &report.log,
        Machine {
            topology: machine.topology.as_ref(),
            findings: &machine.findings,
        },
    );
    if args.json {
        let doc = serde_json::json!({
            "status": "ran",
            "report": &report,
            "pair_classes": report.log.pair_classes(),
            "judged": &judged,
        });
        writeln!(out, "{}", super::output::json_pretty(&doc)?)?;
    } else {
        out.write_all(render_run(&report).as_bytes())?;
        // Quiet: the table alone (the log's explanation is what `gdx nccl explain` prints).
        if !args.out.quiet {
            writeln!(out, "\n--- NCCL's log, explained ---")?;
            let text = gdx_topo::printable_text(&gdx_nccl::render::explain_text(
                &report.log,
                &judged,
                &machine.description,
            ));
            out.write_all(paint_verdicts(args.out.color.enabled(), &text).as_bytes())?;
        }
    }
    Ok(ExitCode::from(judged.exit_code()))
}

fn render_run(r: &gdx_nccl::run::RunReport) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "gdx nccl run · NCCL {} ({}) · {} GPU(s): {}",
        r.nccl_version.as_deref().unwrap_or("?"),
        r.nccl_path,
        r.gpus.len(),
        r.gpus.join("; ")
    );
    let env: Vec<String> = r.env_set.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let _ = writeln!(s, "environment set for NCCL: {}", env.join(" "));
    let _ = writeln!(
        s,
        "warmup {}, timed {} per size; data not verified (speed only); GB/s = 1e9 B/s",
        r.warmup, r.iters
    );
    let _ = writeln!(
        s,
        "\n{:<15} {:>10} {:>12} {:>11} {:>12} {:>12}",
        "collective", "size", "count", "time(us)", "algbw(GB/s)", "busbw(GB/s)"
    );
    for row in &r.rows {
        let _ = writeln!(
            s,
            "{:<15} {:>10} {:>12} {:>11.1} {:>12.2} {:>12.2}",
            row.op.name(),
            gdx_base::bytesize::ByteSize(row.bytes).to_string(),
            row.count,
            row.time_us,
            row.algbw_gbps,
            row.busbw_gbps
        );
    }
    for k in &r.skipped {
        let _ = writeln!(s, "skipped: {k}");
    }
    let _ = writeln!(s, "\nceiling: {}", r.ceiling_note);
    if !r.log_files.is_empty() {
        let files: Vec<String> = r
            .log_files
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        let _ = writeln!(s, "NCCL debug files: {}", files.join(", "));
    }
    s
}
