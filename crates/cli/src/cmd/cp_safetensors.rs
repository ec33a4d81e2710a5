//! `gdx cp --safetensors CKPT gpu:N|host`: load a safetensors checkpoint (one file, a folder of
//! shards, or a `model.safetensors.index.json`) into GPU or host memory. Every header is checked
//! before any byte moves; each file's data section is one pipelined copy (planned like any
//! `gdx cp`: the page cache, O_DIRECT or cuFile, split where the file is partly cached), files
//! run `--parallel` at a time, and the summary lists every tensor and where it landed.

use super::cp::{Bar, CpArgs};
use super::output::error_chain;
use anyhow::{bail, Result};
use gdx_base::bytesize::human_bytes;
use gdx_storage::safetensors::{in_parallel, open_checkpoint, Header};
use gdx_storage::{CopyOptions, CopyOutcome, CopyRequest, Location as Loc, ProgressFn};
use serde_json::json;
use std::io::{IsTerminal, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Run `gdx cp --safetensors`.
pub fn run(args: &CpArgs, src: &Loc, dst: &Loc, opts: CopyOptions) -> Result<ExitCode> {
    let Loc::File(path) = src else {
        bail!("--safetensors loads a checkpoint: SRC must be a file, a folder of shards or an index.json, not {src}");
    };
    if matches!(dst, Loc::File(_)) {
        bail!("--safetensors loads into memory: DST must be gpu:N or host (gdx.save_safetensors writes checkpoints)");
    }
    if args.length.is_some() || args.skip != 0 || args.seek.is_some() {
        bail!("--safetensors copies whole data sections: --length, --skip and --seek do not apply");
    }
    let files = open_checkpoint(path)?;
    // Shards copied one after another share one cuFile driver open (when a plan needs it).
    gdx_storage::keep_cufile_open();
    let total: u64 = files.iter().map(|(_, h)| h.data_len).sum();
    let bar = (!args.quiet && !args.json && std::io::stderr().is_terminal()).then(Bar::new);
    let done = Arc::new(AtomicU64::new(0));
    let run_one = |(file, h): &(PathBuf, Header)| {
        // Each file's progress adds to one bar over the whole checkpoint.
        let progress: Option<ProgressFn> = bar.as_ref().map(|b| {
            let (cb, done, last) = (b.callback(), Arc::clone(&done), AtomicU64::new(0));
            Arc::new(move |n: u64, _| {
                let delta = n.saturating_sub(last.swap(n, Ordering::Relaxed));
                cb(done.fetch_add(delta, Ordering::Relaxed) + delta, total);
            }) as ProgressFn
        });
        let req = CopyRequest {
            src: Loc::File(file.clone()),
            dst: dst.clone(),
            skip: h.data_start,
            length: Some(h.data_len),
            seek: None,
            verify: args.verify,
        };
        let opts = CopyOptions {
            progress,
            ..opts.clone()
        };
        gdx_storage::copy(&req, &opts)
    };
    // CUDA starts before the clock (the driver and the GPU's primary context, about 0.4 s on an
    // H100 machine), as a plain `gdx cp` times only its copy: the context held here is the one
    // every file's copy retains. A GPU that cannot start is left for the copy to report.
    let _gpu = match dst {
        Loc::Gpu { ordinal, .. } => gdx_sys::cuda::Cuda::load()
            .ok()
            .and_then(|c| c.context(*ordinal).ok()),
        _ => None,
    };
    let start = std::time::Instant::now();
    let results = in_parallel(&files, args.parallel, run_one);
    let elapsed = start.elapsed();
    if let Some(b) = &bar {
        b.finish();
    }
    let mut outcomes = Vec::new();
    for ((file, _), r) in files.iter().zip(results) {
        match r {
            Ok(o) => outcomes.push(o),
            Err(e) if e.is_copy_failure() => {
                let e = anyhow::Error::new(e);
                eprintln!(
                    "gdx: error: {} -> {dst}: {}",
                    gdx_topo::printable(&file.display().to_string()),
                    gdx_topo::printable_text(&error_chain(&e))
                );
                return Ok(ExitCode::from(1));
            }
            Err(e) => {
                return Err(anyhow::Error::new(e).context(format!("{} -> {dst}", file.display())))
            }
        }
    }
    render(&files, &outcomes, dst, elapsed, args)
}

fn render(
    files: &[(PathBuf, Header)],
    outcomes: &[CopyOutcome],
    dst: &Loc,
    elapsed: std::time::Duration,
    args: &CpArgs,
) -> Result<ExitCode> {
    let bytes: u64 = outcomes.iter().map(|o| o.report.bytes).sum();
    let secs = elapsed.as_secs_f64();
    let gbps = (bytes > 0 && secs > 0.0).then(|| bytes as f64 / secs / 1e9);
    let failed = outcomes.iter().any(|o| o.verified() == Some(false));
    let mut out = std::io::stdout().lock();
    if args.json {
        let v = json!({
            "dst": dst.to_string(),
            "bytes": bytes,
            "elapsed_s": secs,
            "gbps": gbps,
            "files": files.iter().zip(outcomes).map(|((f, h), o)| json!({
                "file": f.display().to_string(),
                "bytes": o.report.bytes,
                "path": o.report.path,
                "reason": o.report.reason,
                "split": o.report.split,
                "elapsed_s": o.report.elapsed.as_secs_f64(),
                "gbps": o.report.gbps(),
                "verify": o.verified(),
                "tensors": h.tensors.iter().map(|t| json!({
                    "name": t.name, "dtype": t.dtype.name(), "shape": t.shape,
                    "offset": t.begin, "bytes": t.len(),
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        });
        writeln!(out, "{}", super::output::json_pretty(&v)?)?;
    } else if !args.quiet || failed {
        let tensors: usize = files.iter().map(|(_, h)| h.tensors.len()).sum();
        let rate = gbps.map_or("no bytes to time".into(), |g| format!("{g:.2} GB/s"));
        writeln!(
            out,
            "gdx cp --safetensors: {} file(s), {tensors} tensor(s) -> {dst}",
            files.len()
        )?;
        writeln!(
            out,
            "  loaded   {} ({bytes} bytes) in {secs:.3} s: {rate}",
            human_bytes(bytes)
        )?;
        for ((f, h), o) in files.iter().zip(outcomes) {
            let r = &o.report;
            // File and tensor names came from the file (or its index): escaped.
            let file = gdx_topo::printable(&f.display().to_string());
            writeln!(out, "  file     {file}")?;
            writeln!(
                out,
                "    path   {}: {}",
                r.path,
                gdx_topo::printable(&r.reason)
            )?;
            if let Some(v) = o.verified() {
                writeln!(out, "    verify {}", if v { "ok" } else { "FAILED" })?;
            }
            writeln!(
                out,
                "    {:<40} {:<8} {:<20} {:>12} {:>12}",
                "tensor", "dtype", "shape", "offset", "bytes"
            )?;
            for t in &h.tensors {
                let shape = format!("{:?}", t.shape);
                writeln!(
                    out,
                    "    {:<40} {:<8} {:<20} {:>12} {:>12}",
                    gdx_topo::printable(&t.name),
                    t.dtype.name(),
                    shape,
                    t.begin,
                    human_bytes(t.len())
                )?;
            }
        }
    }
    if failed {
        eprintln!("gdx: error: -> {dst}: verification failed: the checksums differ");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
