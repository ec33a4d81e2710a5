//! `gdx bench`: every data path, every size, judged against the topology's ceiling. Argument
//! parsing and rendering only; the measurements live in `gdx-bench`.
//!
//! stdout carries the results (tables, or `--json` / `--csv`); progress (only when stderr is
//! a terminal), warnings and errors go to stderr. Export files are created before the first
//! case (a bad path fails at once) and rewritten after every case, so partial results
//! survive. Exit code: 0 when every case passed or was waived, 1 when a case or a size failed
//! (or did not verify), 2 for bad flags or an unusable environment.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use clap::Args;
use gdx_base::bytesize::{ByteSize, SIZE_HELP};
use gdx_bench::render::Style;
use gdx_bench::{
    all_cases, compare, filter_pair, gpu_missing, header, plan, render, select, BenchCase,
    CaseOutcome, CaseSpec, Ctx, Exporter, Observer, Params, Report, Row, WaivedGroup,
};

use super::args::{
    parse_duration, parse_nic_list, parse_pair, parse_pct, parse_provider, parse_sizes, sizes_help,
    SizeList,
};
use super::output::ColorWhen;

/// Run `gdx bench` from a command line another command translated to it (`gdx cp --bench`).
pub fn run_argv(argv: &[String]) -> Result<ExitCode> {
    use clap::Parser as _;
    #[derive(clap::Parser)]
    struct Alias {
        #[command(flatten)]
        bench: BenchArgs,
    }
    let alias = Alias::try_parse_from(argv).context("translating gdx cp --bench")?;
    run(&alias.bench)
}

/// Measure every data path at every size and judge it against the hardware's ceiling.
///
/// GB/s are decimal (1e9 bytes per second). Bandwidth is the median over the timed samples;
/// latency is one transfer and its completion wait, as a program sees it. See
/// docs/bench/README.md for the method and the JSON schema.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  gdx bench                                   host paths (and GPU paths where present), 8 B … 1 GiB
  gdx bench --list                            the cases, with index and key
  gdx bench --path p2p --size 4KiB:1GiB       p2p cases only, 4 KiB to 1 GiB in ×4 steps
  gdx bench --path file --size 1GiB --file-dir /mnt/nvme   file ↔ GPU/host (opt-in), page cache dropped
  gdx bench --path host_to_host_tcp --peer 10.0.0.2:7447   against `gdx serve` on another host
  gdx bench --path rdma --peer 10.0.0.2:7448  RDMA WRITE/READ against `gdx serve --rdma-listen 0.0.0.0:7448`
  gdx bench --path rdma                       RDMA loopback through this machine's NIC (opt-in; waived
                                              with the reason where there is no RDMA device)
  gdx bench --path fabric --provider tcp --size 8,1GiB   libfabric RMA (loopback pair) beside gdx's tcp
  gdx bench --export-json run.json --plot run.svg
  gdx bench --compare old.json                bandwidth and latency against an earlier run
  gdx bench --compare old.json --fail-on-drop 5   exit 1 when a figure is > 5 % worse (CI gate)
  gdx bench --dry-run --size 4KiB:1GB         the cases and sizes that would run, nothing measured")]
pub struct BenchArgs {
    /// List the cases (index, key, path, description) and exit.
    #[arg(long)]
    list: bool,

    /// Cases to run: a key, an index from --list, a key prefix, or a path name (p2p, staged,
    /// pinned-ce, pageable-ce, shm, tcp, memcpy, file, rdma). Repeat or separate with commas.
    /// The `file` cases (file ↔ GPU/host through gdx-storage) and the `rdma` cases (RDMA
    /// WRITE/READ through gdx-rdma; run on Soft-RoCE in CI, not yet on a hardware NIC) run only when named.
    #[arg(short = 'p', long = "path", value_name = "SEL", value_delimiter = ',')]
    paths: Vec<String>,

    /// Directory for the `file` cases' scratch files (default: $GDX_BENCH_DIR, else the system
    /// temp dir). Put it on the disk to measure.
    #[arg(long, value_name = "DIR")]
    file_dir: Option<PathBuf>,

    #[arg(short = 's', long, value_name = "SIZES", default_value = "8:1GiB", value_parser = parse_sizes, help = sizes_help())]
    size: SizeList,

    /// Timed iterations per size (instead of --duration).
    #[arg(long, value_name = "N", conflicts_with = "duration", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    iters: Option<u32>,

    /// Target time of the timed loop per size: `200ms`, `1s`, `0.5`.
    #[arg(long, value_name = "TIME", default_value = "200ms", value_parser = parse_duration)]
    duration: Duration,

    /// Untimed warm-up transfers per size.
    #[arg(long, value_name = "N", default_value_t = 2)]
    warmup: u32,

    /// Fewest timed samples per size.
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    min_samples: u32,

    /// Most timed samples per size.
    #[arg(long, value_name = "N", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    max_samples: u32,

    /// Only GPU cases between these two GPUs (and host ↔ those GPUs): `0,1`.
    #[arg(long, value_name = "A,B", value_parser = parse_pair)]
    pair: Option<(u32, u32)>,

    /// Run the shm/tcp cases against a `gdx serve` agent at this address instead of a
    /// loopback agent. With `--path rdma` (and no --rdma-peer), the address of a
    /// `gdx serve --rdma-listen` to run the rdma cases against. `etcd:AGENT` looks the
    /// agent up in etcd (with --etcd URL --cluster NAME).
    #[arg(long, value_name = "HOST:PORT")]
    peer: Option<String>,

    #[command(flatten)]
    peer_cluster: super::cluster::PeerLookupArgs,

    /// Run the rdma cases against the `gdx serve --rdma-listen` at this address (default:
    /// --peer, else a loopback server in this process). Needed when the shm/tcp cases run
    /// against --peer in the same run: the two listen on different ports.
    #[arg(long, value_name = "HOST:PORT")]
    rdma_peer: Option<String>,

    /// RDMA device for the rdma cases (default: the NIC nearest to the local memory).
    #[arg(long, value_name = "NAME")]
    rdma_device: Option<String>,

    /// Rails of the engine cases' peer connection, in order (default: $GDX_NICS; else one tcp
    /// rail, and every RDMA device with an active port): tcp `LOCAL_IP` or
    /// `LOCAL_IP=REMOTE_IP[:PORT]` each, rdma device names (`rxe0,rxe1`); transfers from 1 MiB
    /// are striped over them by measured throughput, and each row's JSON carries its `rails`.
    #[arg(long, value_name = "A,B", value_parser = parse_nic_list)]
    nics: Option<String>,

    /// libfabric provider for the fabric cases (`tcp`, `shm`, `efa`, `verbs`, ...; default:
    /// $GDX_FABRIC_PROVIDER, else efa > verbs > cxi > tcp). `gdx doctor` lists the providers.
    #[arg(long, value_name = "NAME", value_parser = parse_provider)]
    provider: Option<String>,

    /// Region name the peer serves (`gdx serve --name`).
    #[arg(long, value_name = "NAME", default_value = "serve", requires = "peer")]
    peer_region: String,

    #[arg(long, value_name = "SIZE", default_value = "16MiB", value_parser = ByteSize::parse, help = format!("Chunk of the staged GPU → host → GPU pipeline ({SIZE_HELP})"))]
    staged_chunk: u64,

    /// Ops per transfer in the host shm/tcp cases: each transfer is a batch of N ops of the
    /// row's size (Mop/s then counts ops)
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=8192))]
    batch: u32,

    /// Transfers in flight at once in the host shm/tcp cases: each timed iteration submits N
    /// transfers, then waits for all (Mop/s counts ops; p50/p99 are per window)
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    window: u32,

    /// Host shm/tcp cases: prepare each transfer once (validated and planned) and post it
    /// again, as a latency loop or a KV block's write does (perftest reuses its work requests
    /// the same way); without it every transfer is built and submitted afresh
    #[arg(long)]
    prepared: bool,

    /// Skip checking the destination after the timed loop.
    #[arg(long)]
    no_verify: bool,

    /// Print the JSON report to stdout instead of tables (with --dry-run: the plan as JSON).
    #[arg(long, conflicts_with = "csv")]
    json: bool,

    /// Print the cases that would run, the waived groups and the sizes; measure nothing.
    #[arg(long)]
    dry_run: bool,

    /// Print CSV to stdout instead of tables.
    #[arg(long)]
    csv: bool,

    /// Write the JSON report to FILE (`-` for stdout), rewritten after every case.
    #[arg(long, value_name = "FILE")]
    export_json: Option<PathBuf>,

    /// Write CSV to FILE (`-` for stdout), rewritten after every case.
    #[arg(long, value_name = "FILE")]
    export_csv: Option<PathBuf>,

    /// Write the CSV columns as a Markdown table to FILE (`-` for stdout), rewritten after
    /// every case.
    #[arg(long, value_name = "FILE")]
    export_md: Option<PathBuf>,

    /// Draw bandwidth and latency against size to FILE.svg (or FILE.png, through
    /// rsvg-convert).
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,

    /// Compare with an earlier `--export-json` file: bandwidth and p50 latency per case and
    /// size; a figure worse by more than the threshold (10 %, or --fail-on-drop's) is a drop.
    #[arg(long, value_name = "OLD.json")]
    compare: Option<PathBuf>,

    /// Exit 1 when a compared figure is worse than the earlier run by more than PCT percent
    /// (bandwidth lower, or latency higher). Figures below the noise floor are not compared.
    #[arg(long, value_name = "PCT", requires = "compare", value_parser = parse_pct)]
    fail_on_drop: Option<f64>,

    /// Deprecated: use --fail-on-drop PCT (a RATIO of 0.9 is 10 %). Flags drops, never fails.
    #[arg(long, value_name = "RATIO", requires = "compare", hide = true)]
    drop_below: Option<f64>,

    /// Print only the summary table, waived groups and comparison: no progress, no per-case
    /// tables.
    #[arg(short, long)]
    quiet: bool,

    /// Colour: auto (only on a terminal, and not when NO_COLOR is set), always or never.
    #[arg(long, value_name = "WHEN", value_enum, default_value_t = ColorWhen::Auto)]
    color: ColorWhen,

    /// Use the deterministic mock backend (for tests of the output).
    #[arg(long, hide = true)]
    mock: bool,

    /// Internal: run as the second process of the ipc cases (allocate LEN bytes on GPU,
    /// print the IPC descriptor as one JSON line, hold it until stdin closes).
    #[arg(long = "ipc-child", hide = true, value_name = "GPU:LEN")]
    ipc_child: Option<String>,
}

/// Progress, streaming tables and incremental exports.
struct Cli<'a> {
    exporter: &'a Exporter,
    progress: bool,
    tables: bool,
    /// Waived groups go to stdout with the tables, else (stdout taken, or quiet) at the end.
    style: Style,
    key: String,
    index: usize,
    total: usize,
}

impl Cli<'_> {
    fn clear(&self) {
        if self.progress {
            eprint!("\r\x1b[2K");
        }
    }

    fn export(&self, report: &Report) {
        for e in self.exporter.after_case(report) {
            eprintln!("gdx: warning: {}", gdx_topo::printable(&e.chain()));
        }
    }
}

impl Observer for Cli<'_> {
    fn waived_groups(&mut self, groups: &[WaivedGroup]) {
        if self.tables {
            print!("{}", render::waived_groups(groups, self.style));
            let _ = std::io::stdout().flush();
        }
    }

    fn case_started(&mut self, spec: &CaseSpec, index: usize, total: usize) {
        self.key = spec.key.clone();
        self.index = index;
        self.total = total;
        if self.progress {
            eprint!("\r\x1b[2K[{}/{}] {}", index + 1, total, spec.key);
        }
    }

    fn row(&mut self, row: &Row, done: usize, total: usize) {
        if self.progress {
            eprint!(
                "\r\x1b[2K[{}/{}] {} {} ({done}/{total})",
                self.index + 1,
                self.total,
                self.key,
                gdx_base::bytesize::human_bytes(row.size_bytes)
            );
        }
    }

    fn case_finished(&mut self, outcome: &CaseOutcome, report: &Report) {
        self.clear();
        if self.tables {
            let rows: Vec<&Row> = report
                .results
                .iter()
                .filter(|r| r.key == outcome.key)
                .collect();
            print!("{}", render::case(outcome, &rows, self.style));
            if let Some(f) = &report.header.latency_floors {
                print!("{}", f.beside(&rows));
            }
            print!("{}", gdx_bench::copyref::beside(&rows));
            let _ = std::io::stdout().flush();
        }
        self.export(report);
    }
}

fn list(cases: &[Box<dyn BenchCase>], ctx: &Ctx) -> String {
    let mut s = String::from("index  key                              path         description\n");
    for (i, c) in cases.iter().enumerate() {
        let sp = c.spec();
        s.push_str(&format!(
            "{i:>5}  {:<32} {:<12} {}\n",
            sp.key,
            sp.path.name(),
            sp.description
        ));
    }
    // The GPU cases are listed for two GPUs anywhere; say so where they would be invented.
    let n = ctx.gpu_count();
    if n < 2 {
        let why = match ctx.cuda() {
            Err(u) if !ctx.mock => format!(", no CUDA driver ({} could not be loaded)", u.library),
            _ => String::new(),
        };
        s.push_str(&format!(
            "note: GPU cases are listed for GPU0 and GPU1; this machine has {n} GPU{}{why}, so a run waives those it lacks in one line\n",
            if n == 1 { "" } else { "s" }
        ));
    }
    s
}

/// The GPUs `--pair` names that this machine lacks, as an error: "GPU5 is not present (this
/// machine has 2 GPUs)", rather than the "no case left" the filter would end in.
fn check_pair(ctx: &Ctx, a: u32, b: u32) -> Result<()> {
    let n = ctx.gpu_count();
    let missing: Vec<u32> = [a, b].into_iter().filter(|&g| g >= n).collect();
    let why = match ctx.cuda() {
        Err(u) if !ctx.mock => format!(
            "; no CUDA driver: {} could not be loaded ({})",
            u.library,
            gdx_bench::ctx::CUDA_FIX
        ),
        _ => String::new(),
    };
    match missing.as_slice() {
        [] => Ok(()),
        [g] => bail!("--pair {a},{b}: {}{why}", gpu_missing(*g, n)),
        _ => bail!(
            "--pair {a},{b}: GPU{a} and GPU{b} are not present (this machine has {n} GPU{}){why}",
            if n == 1 { "" } else { "s" }
        ),
    }
}

/// The start of a `--dry-run` answer (`gdx bench`, `gdx calibrate`): `json` printed, when given
/// (`Some`: the answer is complete), or else the waived groups as text, which the caller follows.
pub(crate) fn dry_run_start(
    json: Option<serde_json::Value>,
    groups: &[WaivedGroup],
    color: ColorWhen,
) -> Result<Option<ExitCode>> {
    if let Some(v) = json {
        println!("{}", super::output::json_pretty(&v)?);
        return Ok(Some(ExitCode::SUCCESS));
    }
    let style = Style {
        color: color.enabled(),
    };
    print!("{}", render::waived_groups(groups, style));
    Ok(None)
}

/// `--dry-run`: what would run, as text or JSON.
fn dry_run(args: &BenchArgs, cases: &[Box<dyn BenchCase>], ctx: &Ctx) -> Result<ExitCode> {
    let (todo, groups) = plan(cases, ctx);
    let json = args.json.then(|| {
        serde_json::json!({
            "sizes_bytes": args.size.0,
            "cases": todo.iter().map(|(c, w)| serde_json::json!({
                "key": c.spec().key,
                "waived": w.as_ref().map(|w| w.reason.clone()),
            })).collect::<Vec<_>>(),
            "waived": groups,
        })
    });
    if let Some(done) = dry_run_start(json, &groups, args.color)? {
        return Ok(done);
    }
    for (c, w) in &todo {
        match w {
            Some(w) => println!("{}  (waived: {w})", c.spec().key),
            None => println!("{}", c.spec().key),
        }
    }
    let sizes: Vec<String> = args
        .size
        .0
        .iter()
        .map(|&b| ByteSize(b).to_string())
        .collect();
    println!("sizes: {} ({} sizes)", sizes.join(" "), sizes.len());
    Ok(ExitCode::SUCCESS)
}

/// The second process of the ipc cases: its protocol is its stdout line and exit code.
fn ipc_child(spec: &str) -> ExitCode {
    match gdx_bench::gpu::ipc::child_main(spec) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "gdx bench {}: {}",
                gdx_bench::gpu::ipc::CHILD_FLAG,
                e.chain()
            );
            ExitCode::from(2)
        }
    }
}

/// The context the cases read: the mock or this machine, with the peers, devices, scratch
/// folder, provider and NICs the flags name.
fn context(args: &BenchArgs) -> Result<Ctx> {
    let mut ctx = if args.mock { Ctx::mock() } else { Ctx::live() };
    let peer = match &args.peer {
        Some(p) => {
            let (addr, expect) = args.peer_cluster.resolve(p)?;
            ctx.peer_expect = expect;
            Some(addr)
        }
        None => None,
    };
    if let Some(p) = &peer {
        ctx.peer = Some((p.clone(), args.peer_region.clone()));
    }
    ctx.rdma_peer = args.rdma_peer.clone().or(peer);
    ctx.rdma_device.clone_from(&args.rdma_device);
    ctx.file_dir.clone_from(&args.file_dir);
    ctx.fabric_provider.clone_from(&args.provider);
    if let Some(n) = &args.nics {
        ctx.nics = gdx_engine::parse_nics(n);
    }
    Ok(ctx)
}

/// The cases `--path`/`--pair` select, with the comparison rows and method notes they bring;
/// refuses flag combinations that cannot run.
fn choose(
    args: &BenchArgs,
    ctx: &mut Ctx,
    cases: Vec<Box<dyn BenchCase>>,
) -> Result<Vec<Box<dyn BenchCase>>> {
    let mut cases = select(cases, &args.paths)?;
    if let Some((a, b)) = args.pair {
        check_pair(ctx, a, b)?;
        cases = filter_pair(cases, a, b);
    }
    if cases.is_empty() {
        bail!("no case left to run after --path/--pair");
    }
    if cases
        .iter()
        .any(|c| c.spec().path == gdx_bench::PathKind::Fabric)
    {
        // gdx's own tcp transport in the same run: what the fabric rows are read against.
        cases = gdx_bench::fabric::with_tcp_comparison(cases, all_cases(ctx));
        ctx.notes.push(gdx_bench::fabric::header_note(ctx));
    } else if let Some(p) = &args.provider {
        bail!("--provider {p} applies to the fabric cases only: add --path fabric");
    }
    let path_in = |k: &[gdx_bench::PathKind]| cases.iter().any(|c| k.contains(&c.spec().path));
    if args.peer.is_some()
        && args.rdma_peer.is_none()
        && path_in(&[gdx_bench::PathKind::Rdma])
        && path_in(&[gdx_bench::PathKind::Shm, gdx_bench::PathKind::Tcp])
    {
        bail!(
            "--peer is the gdx serve agent's address for the shm/tcp cases; give the rdma cases \
             theirs with --rdma-peer HOST:PORT (gdx serve --rdma-listen), or run them separately"
        );
    }
    if cases.iter().any(|c| gdx_bench::rdma::is_raw(c.spec())) {
        ctx.notes.push(gdx_bench::rdma::METHOD_NOTE.into());
    } else if args.rdma_peer.is_none() {
        // No raw rdma case runs: --peer is the agent's address only, which the engine's rdma
        // case then uses (it is waived while --peer also names the raw cases' server).
        ctx.rdma_peer = None;
    }
    if args.min_samples > args.max_samples {
        bail!(
            "--min-samples {} is above --max-samples {}",
            args.min_samples,
            args.max_samples
        );
    }
    Ok(cases)
}

/// `--fail-on-drop`'s percentage (or the deprecated `--drop-below`'s, said so).
fn drop_pct(args: &BenchArgs) -> f64 {
    match (args.fail_on_drop, args.drop_below) {
        (Some(p), _) => p,
        (None, Some(r)) => {
            eprintln!(
                "gdx: note: --drop-below is deprecated; use --fail-on-drop {:.0} (which also sets the exit code)",
                (1.0 - r) * 100.0
            );
            (1.0 - r) * 100.0
        }
        (None, None) => compare::DEFAULT_DROP_PCT,
    }
}

/// The `--compare` report, read.
fn compared_with(args: &BenchArgs) -> Result<Option<Report>> {
    Ok(match &args.compare {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            Some(Report::from_json(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?)
        }
        None => None,
    })
}

/// The measurement protocol the flags give.
fn params(args: &BenchArgs) -> Params {
    Params {
        sizes: args.size.0.clone(),
        warmup: args.warmup,
        duration: args.duration,
        min_samples: args.min_samples,
        max_samples: args.max_samples,
        iters: args.iters,
        verify: !args.no_verify,
        staged_chunk: args.staged_chunk,
        batch: args.batch,
        window: args.window,
        prepared: args.prepared,
    }
}

/// After the run: the comparison, the summary, and the exit code (1 for a failed case, or a
/// drop past `--fail-on-drop`).
fn conclude(
    args: &BenchArgs,
    report: &Report,
    old: Option<&Report>,
    drop_pct: f64,
    stdout_taken: bool,
    style: Style,
) -> ExitCode {
    let out_or_err = |s: String| {
        if stdout_taken {
            eprint!("{s}");
        } else {
            print!("{s}");
        }
    };
    if args.quiet && !stdout_taken {
        // The groups were not streamed with the tables.
        print!("{}", render::waived_groups(&report.waived, style));
    }
    let mut dropped = 0;
    let mut compared = 0;
    if let Some(old) = old {
        let name = args
            .compare
            .as_deref()
            .map_or(String::new(), |p| p.display().to_string());
        let cmp = compare::compare(report, old, drop_pct);
        dropped = cmp.iter().filter(|c| c.dropped).count();
        compared = cmp.len();
        out_or_err(compare::render(&cmp, &name, drop_pct, style));
    }
    if stdout_taken {
        if !args.quiet {
            eprint!("{}", render::summary_table(report, style));
        }
    } else {
        print!("{}", render::summary_table(report, style));
    }
    let old_name = args
        .compare
        .as_deref()
        .map_or(String::new(), |p| p.display().to_string());
    if old.is_some() && compared == 0 {
        // A gate that compared nothing has no evidence to pass on.
        eprintln!(
            "gdx: warning: no figure of this run matches one in {old_name} (other cases or sizes, or all below the noise floor): nothing was compared"
        );
        if args.fail_on_drop.is_some() {
            return ExitCode::from(1);
        }
    }
    if dropped > 0 && args.fail_on_drop.is_some() {
        eprintln!(
            "gdx: {dropped} figure(s) dropped by more than {drop_pct}% against {old_name} (--fail-on-drop)"
        );
        return ExitCode::from(1);
    }
    if report.has_failures() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// Run `gdx bench`.
pub fn run(args: &BenchArgs) -> Result<ExitCode> {
    if let Some(spec) = &args.ipc_child {
        return Ok(ipc_child(spec));
    }
    let mut ctx = context(args)?;
    let cases = all_cases(&ctx);
    if args.list {
        print!("{}", list(&cases, &ctx));
        return Ok(ExitCode::SUCCESS);
    }
    let cases = choose(args, &mut ctx, cases)?;
    if args.dry_run {
        return dry_run(args, &cases, &ctx);
    }
    if let Some(p) = &args.plot {
        if !matches!(p.extension().and_then(|e| e.to_str()), Some("svg" | "png")) {
            bail!("--plot {}: the file must end in .svg or .png", p.display());
        }
    }
    let drop_pct = drop_pct(args);
    let old = compared_with(args)?;
    let exporter = Exporter {
        json: args.export_json.clone(),
        csv: args.export_csv.clone(),
        markdown: args.export_md.clone(),
        plot: args.plot.clone(),
    };
    // Create the export files now, so a bad path fails before any measuring.
    exporter.create()?;
    let params = params(args);
    let uses_gpu = cases.iter().any(|c| {
        let s = c.spec();
        matches!(s.src, gdx_bench::End::Gpu(_)) || matches!(s.dst, gdx_bench::End::Gpu(_))
    });
    let host_to_host = cases.iter().any(|c| {
        let s = c.spec();
        s.src == gdx_bench::End::Host && s.dst == gdx_bench::End::Host
    });
    if host_to_host && !args.mock {
        // Measured before the header, so the header can say how.
        let _ = ctx.host_ceiling();
        // The round trips small host rows are judged against, under this run's load.
        let _ = ctx.latency_floors();
    }
    let hdr = if args.mock {
        header::mock_header(&params)
    } else {
        header::live_header(&ctx, &params, std::env::args().collect(), uses_gpu)
    };
    let stdout_taken = args.json || args.csv || exporter.stdout_taken();
    let style = Style {
        color: !stdout_taken && args.color.enabled(),
    };
    if !stdout_taken && !args.quiet {
        print!("{}", render::header(&hdr));
        println!();
    }
    let mut obs = Cli {
        exporter: &exporter,
        progress: !args.quiet && std::io::stderr().is_terminal(),
        tables: !stdout_taken && !args.quiet,
        style,
        key: String::new(),
        index: 0,
        total: 0,
    };
    let report = gdx_bench::run(&cases, &ctx, &params, hdr, &mut obs);
    obs.clear();
    if args.json {
        println!("{}", super::output::json_safe(&report.to_json()?));
    } else if args.csv {
        print!("{}", report.to_csv());
    }
    exporter.finish(&report)?;
    if let Err(e) = exporter.finish_plot(&report) {
        eprintln!("gdx: warning: no plot: {}", e.chain());
    }
    Ok(conclude(
        args,
        &report,
        old.as_ref(),
        drop_pct,
        stdout_taken,
        style,
    ))
}
