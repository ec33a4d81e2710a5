//! `gdx stream`: run a sensor-to-sink pipeline (gdx-engine's `pipeline`) and report sustained
//! GB/s, frames/s, end-to-end latency quantiles, drops and CPU time per GB. Parsing and
//! printing only; the pipeline, its back-pressure and its checks live in the engine.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use clap::Args;
use gdx_base::bytesize::ByteSize;
use gdx_engine::{Agent, AgentConfig};
use gdx_stream::{
    BackPressure, Checksum, FileSink, FileSource, NullSink, PeerSink, PeerSource, Pipeline,
    PipelineConfig, Progress, Sink, Source, StreamReport, Synthetic,
};
use gdx_sys::timer::CpuClock;
use serde_json::json;

use super::args::{parse_duration, parse_rate_arg, parse_size};

/// Stream frames from a source through a ring of slots and a processing kernel to a sink, and
/// measure it: sustained GB/s, frames/s, end-to-end latency per frame (source stamp → result
/// taken by the sink) p50/p99/p99.9/max, drops, CPU time per GB.
///
/// Frames are never lost silently: under `--policy block` the source waits for a free slot;
/// under `--policy drop` a frame that finds every slot in use is dropped and counted, and the run
/// fails if the sequence numbers missing at the sink differ from the counted drops.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  gdx stream --frame 4MiB --duration 10s                 host-only: synthetic -> CPU checksum -> null
  gdx stream --frame 4KiB --fps 100000 --policy drop --duration 20s --plot lat.svg
  gdx stream --source file:/data/capture.bin --frame 1MiB --sink file:/tmp/results.tsv
  gdx stream --source peer:0.0.0.0:7100 --frame 1MiB    frames written by a remote agent
  gdx stream --gpu 0 --frame 4MiB --rate 40GB/s          the GPU stage (fails loudly where it cannot run)

Sources: synthetic (a thread producing --frame bytes at --rate or --fps, each stamped with a
sequence number and time), file:PATH (the file cut into frames, read through gdx-storage),
peer:LISTEN (frames written by a remote gdx agent into this agent's landing region).
Sinks: null, file:PATH (one line per result: seq, len, checksum, sum of squares), peer:ADDR
(every result as a notification to the agent at ADDR). Peers authenticate with
GDX_SECRET_FILE, as for gdx serve.")]
pub struct StreamArgs {
    /// synthetic, file:PATH or peer:LISTEN_ADDR.
    #[arg(long, value_name = "SOURCE", default_value = "synthetic")]
    source: String,

    /// Bytes per frame, the slot size (plain numbers are bytes; KB/MB/GB = 10^3/10^6/10^9;
    /// KiB/MiB/GiB or K/M/G = 2^10/2^20/2^30).
    #[arg(long, value_name = "BYTES", default_value = "4MiB", value_parser = parse_size)]
    frame: u64,

    /// Synthetic source rate in bytes per second (`40GB/s`, `500MiB/s`); default: as fast as
    /// the pipeline takes frames.
    #[arg(long, value_name = "RATE", value_parser = parse_rate_arg, conflicts_with = "fps")]
    rate: Option<u64>,

    /// Synthetic source rate in frames per second.
    #[arg(long, value_name = "N")]
    fps: Option<f64>,

    /// Run the stage on this GPU (CUDA ordinal). Without it the stage runs on the CPU and the
    /// report says so; with it and no usable GPU stage, gdx stream fails (never a quiet CPU run).
    #[arg(long, value_name = "N")]
    gpu: Option<u32>,

    /// With --gpu: use the copy-engine stage even for frames of 8 KiB or less, which otherwise
    /// go to a persistent service kernel reading them in place (it reserves one SM).
    #[arg(long, requires = "gpu")]
    copy_engine: bool,

    /// The processing kernel: checksum (position-weighted word sum + sum of squares).
    #[arg(long, value_name = "KERNEL", default_value = "checksum")]
    kernel: String,

    /// null, file:PATH or peer:ADDR.
    #[arg(long, value_name = "SINK", default_value = "null")]
    sink: String,

    /// How long the source produces (`10s`, `500ms`); the run then drains what is in flight.
    #[arg(long, value_name = "TIME", default_value = "10s", value_parser = parse_duration)]
    duration: Duration,

    /// Stop after this many frames instead (whichever comes first).
    #[arg(long, value_name = "N")]
    frames: Option<u64>,

    /// When every slot is in use: block (the source waits) or drop (the frame is counted).
    #[arg(long, value_name = "POLICY", default_value = "block")]
    policy: BackPressure,

    /// Slots in the frame ring (ring memory = slots x frame, allocated once).
    #[arg(long, value_name = "N", default_value_t = 8)]
    slots: usize,

    /// Print the report as JSON on stdout.
    #[arg(long)]
    json: bool,

    /// Write the latency distribution (share of frames slower than x, log-log) to FILE.svg.
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,

    /// No live progress on stderr.
    #[arg(long, short)]
    quiet: bool,
}

fn open_source(args: &StreamArgs, frame: usize) -> Result<Box<dyn Source>> {
    let s = args.source.as_str();
    if s == "synthetic" {
        let rate = match (args.rate, args.fps) {
            (Some(r), _) => Some(r as f64),
            (None, Some(f)) if f.is_finite() && f > 0.0 => Some(f * frame as f64),
            (None, Some(f)) => {
                bail!("--fps must be a positive number of frames per second, not {f}")
            }
            (None, None) => None,
        };
        return Ok(Box::new(Synthetic::new(frame, rate)?));
    }
    if args.rate.is_some() || args.fps.is_some() {
        bail!("--rate and --fps pace the synthetic source only; {s} delivers frames as they come");
    }
    if let Some(path) = s.strip_prefix("file:") {
        return Ok(Box::new(
            FileSource::open(path, frame).with_context(|| format!("--source {s}"))?,
        ));
    }
    if let Some(listen) = s.strip_prefix("peer:") {
        let agent = Agent::new(AgentConfig {
            name: "gdx-stream-source".into(),
            listen: Some(
                gdx_engine::parse_listen(listen).with_context(|| format!("--source {s}"))?,
            ),
            ..AgentConfig::from_env()?
        })
        .with_context(|| format!("--source {s}: starting the receiving agent"))?;
        let src = PeerSource::new(agent, frame, args.slots)?;
        if let Some(a) = src.agent().listen_addr() {
            eprintln!("gdx stream: waiting for frames on {a} (region gdx-stream-in)");
        }
        return Ok(Box::new(src));
    }
    bail!("unknown --source {s:?}: use synthetic, file:PATH or peer:LISTEN_ADDR")
}

fn open_sink(spec: &str) -> Result<Box<dyn Sink>> {
    if spec == "null" {
        return Ok(Box::new(NullSink));
    }
    if let Some(path) = spec.strip_prefix("file:") {
        return Ok(Box::new(
            FileSink::create(path).with_context(|| format!("--sink {spec}"))?,
        ));
    }
    if let Some(addr) = spec.strip_prefix("peer:") {
        let agent = Agent::new(AgentConfig {
            name: "gdx-stream-sink".into(),
            ..AgentConfig::from_env()?
        })?;
        return Ok(Box::new(
            PeerSink::connect(agent, addr).with_context(|| format!("--sink {spec}"))?,
        ));
    }
    bail!("unknown --sink {spec:?}: use null, file:PATH or peer:ADDR")
}

/// Live progress: one redrawn line on a terminal, a plain line every 2 s otherwise.
fn progress_printer(quiet: bool) -> impl FnMut(&Progress) {
    let tty = std::io::stderr().is_terminal();
    let mut last_line = Duration::ZERO;
    move |p: &Progress| {
        if quiet {
            return;
        }
        let p99 = p
            .p99_us
            .map_or_else(|| "-".to_string(), |v| format!("{v:.1} µs"));
        let line = format!(
            "{:6.1}s  {:>10.0} frames/s  {:7.2} GB/s  drops {}  p99 {p99}",
            p.elapsed.as_secs_f64(),
            p.frames_per_s,
            p.gbps,
            p.drops
        );
        if tty {
            eprint!("\r\x1b[K{line}");
        } else if p.elapsed >= last_line + Duration::from_secs(2) {
            last_line = p.elapsed;
            eprintln!("{line}");
        }
    }
}

/// `gdx stream`.
pub fn run(args: &StreamArgs) -> Result<ExitCode> {
    if args.kernel != "checksum" {
        bail!(
            "unknown --kernel {:?}: the built-in kernel is checksum (embedders plug their own through gdx_stream::Kernel)",
            args.kernel
        );
    }
    if let Some(p) = &args.plot {
        if p.extension().and_then(|e| e.to_str()) != Some("svg") {
            bail!("--plot {}: give a .svg file", p.display());
        }
    }
    let frame = usize::try_from(args.frame).context("--frame is too large for this machine")?;
    let source = open_source(args, frame)?;
    let sink = open_sink(&args.sink)?;
    let cfg = PipelineConfig {
        slots: args.slots,
        policy: args.policy,
        duration: Some(args.duration),
        max_frames: args.frames,
        copy_engine_only: args.copy_engine,
        ..PipelineConfig::default()
    };
    let cpu = CpuClock::now();
    let pipeline = Pipeline::new(cfg);
    let progress = progress_printer(args.quiet);
    // Asked for a GPU: the stage runs there or the command fails; never a quiet CPU run.
    let result = match args.gpu {
        Some(g) => pipeline.run_gpu(g, source, sink, progress),
        None => pipeline.run(source, Checksum, sink, progress),
    };
    if !args.quiet && std::io::stderr().is_terminal() {
        eprint!("\r\x1b[K");
    }
    let rep = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("gdx: error: {e}");
            return Ok(ExitCode::from(1));
        }
    };
    let cpu_per_gb = cpu.per_gb_since(rep.bytes_delivered as f64);
    let stage_note = if args.gpu.is_some() {
        "the checksum kernel ran on the GPU"
    } else {
        "host-only: no --gpu given, the checksum kernel ran on the CPU"
    };
    if let Some(p) = &args.plot {
        let title = format!(
            "gdx stream: {} frames of {}, {} -> {} ({}), policy {}",
            rep.frames_delivered,
            ByteSize(rep.slot_bytes as u64),
            rep.source,
            rep.sink,
            rep.stage,
            rep.policy
        );
        let svg = gdx_bench::plot::latency_svg(&rep.latency_sample_s, &title)
            .map_err(anyhow::Error::msg)?;
        std::fs::write(p, svg).with_context(|| format!("writing {}", p.display()))?;
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        let v = json!({
            "report": rep,
            "stage_note": stage_note,
            "cpu_s_per_gb": cpu_per_gb,
        });
        writeln!(out, "{}", super::output::json_pretty(&v)?)?;
    } else {
        print_report(&mut out, &rep, stage_note, cpu_per_gb)?;
    }
    Ok(ExitCode::SUCCESS)
}

fn print_report(
    out: &mut impl Write,
    r: &StreamReport,
    stage_note: &str,
    cpu_per_gb: Option<f64>,
) -> Result<()> {
    writeln!(
        out,
        "gdx stream: {} -> {} ({}) -> {}",
        r.source, r.kernel, r.stage, r.sink
    )?;
    writeln!(out, "  {stage_note}")?;
    writeln!(
        out,
        "  ring: {} slots x {} ({} allocated once), policy {}, at most {} slots in use",
        r.slots,
        ByteSize(r.slot_bytes as u64),
        ByteSize(r.ring_bytes),
        r.policy,
        r.max_slots_in_use
    )?;
    writeln!(
        out,
        "  {:.2} s (stopped: {}): {} frames produced, {} delivered, {} dropped (ring full {} times; {} sequence gaps at the sink)",
        r.elapsed_s, r.stop.as_str(), r.frames_produced, r.frames_delivered, r.drops, r.ring_full, r.gaps
    )?;
    writeln!(
        out,
        "  sustained {:.3} GB/s, {:.0} frames/s",
        r.gbps, r.frames_per_s
    )?;
    match &r.latency {
        Some(l) => writeln!(
            out,
            "  latency (source stamp -> result at the sink): p50 {:.1} µs, p99 {:.1} µs, p99.9 {:.1} µs, max {:.1} µs ({} frames)",
            l.p50_us, l.p99_us, l.p999_us, l.max_us, l.frames
        )?,
        None => writeln!(out, "  latency: no frame delivered")?,
    }
    match cpu_per_gb {
        Some(c) => writeln!(
            out,
            "  CPU time: {c:.3} s per GB (user + system, all threads)"
        )?,
        None => writeln!(
            out,
            "  CPU time: not measured (getrusage failed or no bytes)"
        )?,
    }
    Ok(())
}
