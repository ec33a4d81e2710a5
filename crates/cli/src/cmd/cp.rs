//! `gdx cp SRC DST`: copy between a file and GPU or host memory over the fastest path that works
//! here (gdx-storage's planner), with a progress bar, an optional CRC-32 check, the path taken,
//! GB/s and the ceiling (`gdx cp --bench` is an alias of `gdx bench --path file`). Parsing and
//! rendering only: the copies, checksums, ceilings and benchmark are gdx-storage's
//! ([`gdx_storage::copy`]).
//!
//! A `gpu:N` or `host` source is this process's own memory, which starts empty: gdx fills it
//! with a seeded pattern first, so `--length` is required for it.

use super::cp_watch;
use super::output::{error_chain, paint, ColorWhen};
use anyhow::{bail, Context as _, Result};
use clap::{Args, ValueEnum};
use gdx_base::bytesize::human_bytes;
use gdx_storage::{CopyOptions, CopyOutcome, CopyRequest, Location as Loc, PathChoice, ProgressFn};
use serde_json::json;
use std::io::{IsTerminal, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Copy a file into or out of GPU (or host) memory over the fastest path that works here:
/// cuFile (GPUDirect Storage) or gdx's O_DIRECT pipeline through pinned buffers. Reports the
/// path taken and why, GB/s, and the ceiling (the disk's or the GPU's PCIe link, whichever is
/// lower).
#[derive(Args, Debug)]
#[command(after_help = "Locations:
  file:PATH, PATH    a file (or block device); --skip/--seek/--length pick a range.
                     A bare path is a file; write file:host or ./host for a file named host
  gpu:N[:OFFSET]     GPU N's memory (CUDA ordinal), at OFFSET bytes into a fresh buffer
  host               host memory (a fresh buffer)
A gpu: or host source starts empty, so gdx fills it with a seeded pattern; give --length.

Examples:
  gdx cp file:ckpt.bin gpu:0 --verify         load a file into GPU 0 and check every byte
  gdx cp gpu:1 file:out.bin --length 4G       write 4 GiB from GPU 1 (a pattern) to a file
  gdx cp file:data.bin host --skip 1M --length 64M
  gdx cp file:ckpt.bin gpu:0 --path gds       cuFile, or an error saying why it cannot run
  gdx cp --safetensors model/ gpu:0           a checkpoint's tensors (shards in parallel)
  gdx bench --path file --file-dir /nvme       every path vs read()+cudaMemcpy (was gdx cp --bench)
Exit status: 0 copied (and verified), 1 the copy or the verification failed, 2 gdx could not run.")]
pub struct CpArgs {
    /// Source: file:PATH, gpu:N[:OFFSET] or host.
    #[arg(value_name = "SRC", required_unless_present = "bench")]
    src: Option<String>,

    /// Destination: file:PATH, gpu:N[:OFFSET] or host.
    #[arg(value_name = "DST", required_unless_present = "bench")]
    dst: Option<String>,

    /// Which path: auto (the planner), gds (cuFile), file-staged (O_DIRECT pipeline) or
    /// buffered (the pipeline through the page cache).
    #[arg(long, value_enum, default_value_t = PathArg::Auto)]
    path: PathArg,

    /// After the copy, compare CRC-32 checksums of the source and the destination.
    #[arg(long)]
    pub(super) verify: bool,

    /// Bytes to copy (plain numbers are bytes; KB/MB/GB = 10^3/10^6/10^9; KiB/MiB/GiB or K/M/G
    /// = 2^10/2^20/2^30). Default: the rest of the source file; required for gpu: and host
    /// sources.
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    pub(super) length: Option<u64>,

    /// Start reading the source file at this byte.
    #[arg(long, value_name = "BYTES", default_value = "0", value_parser = parse_size)]
    pub(super) skip: u64,

    /// Write into the destination file at this byte, keeping the rest of the file. Without it
    /// the destination file is replaced (truncated at the end of the copy).
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    pub(super) seek: Option<u64>,

    /// Bytes per chunk (bounce buffer, O_DIRECT request, cuFile call); a multiple of 4 KiB.
    #[arg(long, value_name = "BYTES", default_value = "16M", value_parser = parse_size)]
    chunk: u64,

    /// Chunks in flight (reads or writes at once).
    #[arg(long, value_name = "N", default_value_t = gdx_storage::DEFAULT_DEPTH)]
    depth: usize,

    /// fdatasync a destination file before reporting (inside the timing).
    #[arg(long)]
    sync: bool,

    /// SRC is a safetensors checkpoint (a file, a folder of shards or a
    /// model.safetensors.index.json): check every header, load each file's tensors as one
    /// pipelined copy, and list every tensor and where it landed.
    #[arg(long)]
    pub(super) safetensors: bool,

    /// --safetensors: files loaded at once (a sharded checkpoint).
    #[arg(long, value_name = "N", default_value_t = 4, requires = "safetensors")]
    pub(super) parallel: usize,

    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub(super) json: bool,

    /// Give up when no I/O has completed for this long: a device that stopped answering (an
    /// NVMe-oF target gone) holds I/O in the kernel for minutes; gdx then names the cause and
    /// exits 1 instead of hanging with it.
    #[arg(long = "stall-timeout", value_name = "SECONDS", default_value_t = 30.0)]
    pub(super) stall_timeout_s: f64,

    /// No progress bar, and on success no report (errors are still printed).
    #[arg(long, short)]
    pub(super) quiet: bool,

    /// Colour: auto (only on a terminal, and not under NO_COLOR), always or never.
    #[arg(long, value_name = "WHEN", value_enum, default_value_t = ColorWhen::Auto)]
    color: ColorWhen,

    /// Deprecated: runs `gdx bench --path file --file-dir <FILE's folder>` (the one benchmark
    /// framework and JSON schema), with --gpu/--size/--samples/--export-json/--json passed on.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["src", "dst", "verify", "seek", "length"])]
    bench: Option<PathBuf>,

    /// --bench: the GPU (CUDA ordinal).
    #[arg(long, value_name = "N", default_value_t = 0, requires = "bench")]
    gpu: u32,

    /// --bench: bytes per transfer.
    #[arg(long, value_name = "BYTES", default_value = "1G", value_parser = parse_size, requires = "bench")]
    size: u64,

    /// --bench: also write the results as JSON to FILE (`-` for stdout).
    #[arg(long, value_name = "FILE", requires = "bench")]
    export_json: Option<PathBuf>,

    /// --bench: samples per row (the median is reported).
    #[arg(long, value_name = "N", default_value_t = 3, requires = "bench")]
    samples: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum PathArg {
    Auto,
    Gds,
    FileStaged,
    Buffered,
}

impl From<PathArg> for PathChoice {
    fn from(p: PathArg) -> Self {
        match p {
            PathArg::Auto => PathChoice::Auto,
            PathArg::Gds => PathChoice::Gds,
            PathArg::FileStaged => PathChoice::FileStaged,
            PathArg::Buffered => PathChoice::Buffered,
        }
    }
}

const LOC_SYNTAX: &str = "expected PATH, file:PATH, gpu:N[:OFFSET] or host";

fn parse_loc(s: &str) -> Result<Loc> {
    if s == "host" {
        return Ok(Loc::Host);
    }
    if let Some(path) = s.strip_prefix("file:") {
        if path.is_empty() {
            bail!("bad location '{s}': the file path is empty ({LOC_SYNTAX})");
        }
        return Ok(Loc::File(PathBuf::from(path)));
    }
    if let Some(rest) = s.strip_prefix("gpu:") {
        let (n, off) = match rest.split_once(':') {
            Some((n, off)) => (n, Some(off)),
            None => (rest, None),
        };
        let ordinal: u32 = n.parse().map_err(|_| {
            anyhow::anyhow!("bad location '{s}': '{n}' is not a GPU number ({LOC_SYNTAX})")
        })?;
        let offset = match off {
            Some(o) => parse_size(o)
                .map_err(|e| anyhow::anyhow!("bad location '{s}': offset {e} ({LOC_SYNTAX})"))?,
            None => 0,
        };
        return Ok(Loc::Gpu { ordinal, offset });
    }
    if s.is_empty() {
        bail!("bad location '': empty ({LOC_SYNTAX})");
    }
    // Anything else with a scheme-like prefix (`disk:`, `gpu0:`) is more likely a typo than a
    // file name; a bare path (no colon, or a colon after a slash) is a file, as in cp(1).
    if let Some((scheme, _)) = s.split_once(':') {
        if !scheme.contains('/') && !scheme.contains('.') {
            bail!("bad location '{s}': unknown scheme '{scheme}:' ({LOC_SYNTAX}; write file:{s} for a file of that name)");
        }
    }
    Ok(Loc::File(PathBuf::from(s)))
}

/// Every size flag reads sizes the one gdx way ([`gdx_base::bytesize`]).
fn parse_size(s: &str) -> Result<u64, gdx_base::bytesize::SizeError> {
    gdx_base::bytesize::ByteSize::parse(s)
}

/// Run `gdx cp`.
pub fn run(args: &CpArgs) -> Result<ExitCode> {
    let (Some(src), Some(dst)) = (&args.src, &args.dst) else {
        bail!("SRC and DST are required (or --bench FILE)");
    };
    let src = parse_loc(src).context("SRC")?;
    let dst = parse_loc(dst).context("DST")?;
    if !(args.stall_timeout_s.is_finite() && args.stall_timeout_s > 0.0) {
        bail!(
            "--stall-timeout {}: give a number of seconds above 0",
            args.stall_timeout_s
        );
    }
    let opts = CopyOptions {
        path: args.path.into(),
        chunk_bytes: usize::try_from(args.chunk).context("--chunk")?,
        depth: args.depth,
        truncate: args.seek.is_none(),
        sync: args.sync,
        progress: None,
    };
    opts.validate()?;
    if args.safetensors {
        return super::cp_safetensors::run(args, &src, &dst, opts);
    }
    // A file copy runs in a worker this process can abandon (cp_watch); the worker does it.
    let files: Vec<&std::path::Path> = [&src, &dst]
        .into_iter()
        .filter_map(|l| match l {
            Loc::File(p) => Some(p.as_path()),
            _ => None,
        })
        .collect();
    if !files.is_empty() && !cp_watch::in_worker() {
        return cp_watch::supervise(args, &files);
    }
    let bar = (!cp_watch::in_worker() && args.wants_bar()).then(Bar::new);
    let opts = CopyOptions {
        progress: match &bar {
            Some(b) => Some(b.callback()),
            None if cp_watch::in_worker() => Some(cp_watch::worker_progress()),
            None => None,
        },
        ..opts
    };
    let req = CopyRequest {
        src: src.clone(),
        dst: dst.clone(),
        skip: args.skip,
        length: args.length,
        seek: args.seek,
        verify: args.verify,
    };
    let outcome = gdx_storage::copy(&req, &opts);
    if let Some(b) = &bar {
        b.finish();
    }
    let done = match outcome {
        Ok(done) => done,
        // A copy that started and failed is exit 1; anything before it (no GPU, a missing or
        // unwritable file, a bad range) is an environment or usage error, exit 2.
        Err(e) if e.is_copy_failure() => {
            let e = anyhow::Error::new(e);
            eprintln!("gdx: error: {src} -> {dst}: {}", error_chain(&e));
            return Ok(ExitCode::from(1));
        }
        Err(e) => return Err(anyhow::Error::new(e).context(format!("{src} -> {dst}"))),
    };
    render(&src, &dst, &done, args)
}

impl CpArgs {
    /// A progress bar is drawn: not quiet, not JSON, stderr a terminal.
    pub(super) fn wants_bar(&self) -> bool {
        !self.quiet && !self.json && std::io::stderr().is_terminal()
    }

    /// SRC as given.
    pub(super) fn src_text(&self) -> &str {
        self.src.as_deref().unwrap_or("")
    }

    /// DST as given.
    pub(super) fn dst_text(&self) -> &str {
        self.dst.as_deref().unwrap_or("")
    }
}

/// The NVMe-oF path of each file location (its disk and controller), for the report.
fn fabric(src: &Loc, dst: &Loc) -> Vec<(String, gdx_topo::nvmeof::Controller)> {
    [src, dst]
        .into_iter()
        .filter_map(|l| match l {
            Loc::File(p) => cp_watch::fabric_of(p),
            _ => None,
        })
        .collect()
}

fn render(src: &Loc, dst: &Loc, done: &CopyOutcome, args: &CpArgs) -> Result<ExitCode> {
    let r = &done.report;
    let fabric = fabric(src, dst);
    let verified = done.verified();
    let color = args.color.enabled();
    let mut out = std::io::stdout().lock();
    if args.quiet && verified != Some(false) && !args.json {
        // Quiet and fine: the exit status says it all.
    } else if args.json {
        let v = json!({
            "src": src.to_string(),
            "dst": dst.to_string(),
            "direction": r.direction,
            "bytes": r.bytes,
            "path": r.path,
            "reason": r.reason,
            "elapsed_s": r.elapsed.as_secs_f64(),
            "gbps": r.gbps(),
            "ceiling": { "gbps": done.ceiling.gbps, "bound": done.ceiling.bound, "text": done.ceiling.describe() },
            "verify": done.verify.map(|(s, d)| json!({ "ok": s == d, "source": s, "destination": d })),
            "fabric": fabric.iter().map(|(disk, c)| json!({
                "disk": disk,
                "controller": c.name,
                "transport": c.transport,
                "target": format!("{}:{}", c.traddr.as_deref().unwrap_or("?"), c.trsvcid.as_deref().unwrap_or("?")),
                "rdma_device": c.carrier.rdma_device,
                "port": c.carrier.port,
                "netdev": c.carrier.netdev,
                "state": c.state,
                "path": c.fabric_path(),
            })).collect::<Vec<_>>(),
        });
        writeln!(out, "{}", super::output::json_pretty(&v)?)?;
    } else {
        let rate = match r.gbps() {
            Some(g) => format!("{g:.2} GB/s"),
            None => "no bytes to time".to_string(),
        };
        writeln!(out, "gdx cp: {src} -> {dst}")?;
        writeln!(
            out,
            "  copied   {} ({} bytes) in {:.3} s: {rate}",
            human_bytes(r.bytes),
            r.bytes,
            r.elapsed.as_secs_f64()
        )?;
        writeln!(out, "  path     {}: {}", r.path, r.reason)?;
        for (disk, c) in &fabric {
            writeln!(out, "  fabric   {disk}: {}", c.fabric_path())?;
        }
        let share = match (r.gbps(), done.ceiling.gbps) {
            (Some(g), Some(c)) if c > 0.0 => format!(" -> {:.0}% of it", g / c * 100.0),
            _ => String::new(),
        };
        writeln!(out, "  ceiling  {}{share}", done.ceiling.describe())?;
        match done.verify {
            Some((s, d)) if s == d => writeln!(
                out,
                "  verify   {}: {s} on both sides",
                paint(color, "32", "ok")
            )?,
            Some((s, d)) => writeln!(
                out,
                "  verify   {}: the source has {s}, the destination {d}",
                paint(color, "31", "FAILED")
            )?,
            None => {}
        }
    }
    if verified == Some(false) {
        eprintln!("gdx: error: {src} -> {dst}: verification failed: the checksums differ");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// A one-line progress bar on stderr, redrawn at most every 100 ms.
pub(super) struct Bar {
    state: Arc<Mutex<(Instant, Instant)>>,
}

impl Bar {
    pub(super) fn new() -> Bar {
        let now = Instant::now();
        Bar {
            state: Arc::new(Mutex::new((now, now - Duration::from_secs(1)))),
        }
    }

    pub(super) fn callback(&self) -> ProgressFn {
        let state = Arc::clone(&self.state);
        Arc::new(move |done, total| {
            let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            if done < total && now.duration_since(s.1) < Duration::from_millis(100) {
                return;
            }
            s.1 = now;
            let frac = if total == 0 {
                1.0
            } else {
                done as f64 / total as f64
            };
            let filled = (frac * 30.0).round() as usize;
            let secs = now.duration_since(s.0).as_secs_f64().max(1e-9);
            eprint!(
                "\r[{}{}] {:3.0}% {} / {}  {:.2} GB/s",
                "#".repeat(filled.min(30)),
                ".".repeat(30 - filled.min(30)),
                frac * 100.0,
                human_bytes(done),
                human_bytes(total),
                done as f64 / secs / 1e9
            );
        })
    }

    pub(super) fn finish(&self) {
        eprint!("\r\x1b[K");
    }
}

impl CpArgs {
    /// `gdx cp --bench FILE` is `gdx bench --path file` now: one benchmark framework and one
    /// JSON schema. With `--bench`, the `gdx bench` command line the old flags translate to
    /// (printed, then run by `main`); `None` for a copy.
    pub fn bench_alias(&self) -> Option<Vec<String>> {
        let file = self.bench.as_ref()?;
        let dir = match file.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let g = self.gpu;
        let mut argv: Vec<String> = [
            "bench".to_string(),
            "--path".into(),
            format!("file_to_host,file_to_gpu{g}_,gpu{g}_to_file"),
            "--file-dir".into(),
            dir.display().to_string(),
            "--size".into(),
            self.size.to_string(),
            "--min-samples".into(),
            self.samples.to_string(),
        ]
        .into();
        if self.json {
            argv.push("--json".into());
        }
        if self.quiet {
            argv.push("-q".into());
        }
        if let Some(p) = &self.export_json {
            argv.push("--export-json".into());
            argv.push(p.display().to_string());
        }
        eprintln!(
            "gdx cp: note: --bench is now `gdx {}` (scratch files go in {}; this alias will be removed)",
            argv.join(" "),
            dir.display()
        );
        Some(argv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_parse_or_explain() {
        assert_eq!(parse_loc("host").unwrap(), Loc::Host);
        assert_eq!(parse_loc("file:/a:b").unwrap(), Loc::File("/a:b".into()));
        assert_eq!(
            parse_loc("gpu:1").unwrap(),
            Loc::Gpu {
                ordinal: 1,
                offset: 0
            }
        );
        assert_eq!(
            parse_loc("gpu:0:4K").unwrap(),
            Loc::Gpu {
                ordinal: 0,
                offset: 4096
            }
        );
        assert_eq!(parse_loc("/tmp/a").unwrap(), Loc::File("/tmp/a".into()));
        assert_eq!(parse_loc("src.bin").unwrap(), Loc::File("src.bin".into()));
        assert_eq!(parse_loc("./a:b").unwrap(), Loc::File("./a:b".into()));
        for bad in ["gpu:x", "file:", "disk:/a", "gpu:0:z", ""] {
            let e = parse_loc(bad).unwrap_err().to_string();
            assert!(e.contains(LOC_SYNTAX), "{bad}: {e}");
        }
    }

    #[test]
    fn sizes_are_the_one_gdx_rule() {
        assert_eq!(parse_size("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("16M"), Ok(16 << 20));
    }
}
