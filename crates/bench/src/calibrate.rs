//! `gdx calibrate`: measure the paths that compete for the same transfer, find the sizes
//! where the winner changes, and write them as the engine's [`Calibration`] file
//! (`GDX_CALIBRATION` points the planner at it).
//!
//! Competitors compared (by p50 latency of one whole transfer, host clock — the same
//! yardstick for every path; at large sizes it is size / bandwidth):
//!
//! | scope | paths | engine crossover |
//! |---|---|---|
//! | GPU*a* → GPU*b* | `gpuA_to_gpuB_p2p` vs `gpuA_to_gpuB_staged` | `staged` over `p2p` |
//! | host → host | `host_to_host_shm` vs `host_to_host_tcp` | `shm` over `tcp` |
//! | host → GPU*g* | `host_to_gpuG_mailbox` vs `host_to_gpuG_pinned_ce` | `mailbox` over `host-to-gpu` |
//! | GPU*g* → host | `gpuG_to_host_mailbox` vs `gpuG_to_host_pinned_ce` | `mailbox` over `gpu-to-host` |
//!
//! A crossover is written only when the small-size winner differs from the large-size one:
//! `{below_bytes: S, prefer: small winner, over: large winner}` where S is the smallest
//! measured size from which the large-size winner wins at every larger size. The staged
//! chunk is tuned by timing the staged case at [`CHUNK_PROBE_BYTES`] with each of
//! [`CHUNK_CANDIDATES`]. Where no GPU exists only the host pair is calibrated.
//!
//! The file is the engine's JSON plus a `gdx_bench` object (ignored by the engine) holding
//! every decision with its evidence and the run header.

use std::time::Duration;

use gdx_engine::{Calibration, Crossover, Path};
use serde::{Deserialize, Serialize};

use crate::case::{default_sizes, BenchCase, Params};
use crate::report::{Header, Report, Status};
use crate::{run, Ctx, Observer};

/// Size the staged chunk candidates are compared at.
pub const CHUNK_PROBE_BYTES: u64 = 256 << 20;

/// Staged chunk sizes tried.
pub const CHUNK_CANDIDATES: [u64; 5] = [2 << 20, 4 << 20, 8 << 20, 16 << 20, 32 << 20];

/// One comparison and its outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// `gpu0->gpu1`, `host->host`.
    pub scope: String,
    /// The case keys compared.
    pub cases: [String; 2],
    /// Winner at the smallest size measured (engine path name).
    pub small_winner: Option<String>,
    /// Winner at the largest size measured.
    pub large_winner: Option<String>,
    /// The crossover, when the winners differ.
    pub below_bytes: Option<u64>,
    /// The evidence: (size, p50 µs of case 0, p50 µs of case 1).
    pub evidence: Vec<(u64, f64, f64)>,
    /// In words.
    pub summary: String,
}

/// The `gdx_bench` part of a calibration file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Detail {
    /// Every comparison made.
    pub decisions: Vec<Decision>,
    /// Staged chunk candidates: (chunk bytes, GB/s at [`CHUNK_PROBE_BYTES`]).
    pub staged_chunks: Vec<(u64, f64)>,
    /// The run header (machine, version, command line, method).
    pub header: Header,
    /// What the measurements contradict: tcp beating shm between two agents of one host is a
    /// defect or a loaded machine, never recorded as a preference (#17).
    #[serde(default)]
    pub warnings: Vec<String>,
}

/// What `gdx calibrate` produced.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// What the planner reads.
    pub calibration: Calibration,
    /// The evidence.
    pub detail: Detail,
    /// The measurements behind it.
    pub report: Report,
}

/// The sizes compared: the default sweep up to 256 MiB.
pub fn sizes() -> Vec<u64> {
    default_sizes()
        .into_iter()
        .filter(|&s| s <= 256 << 20)
        .collect()
}

fn engine_path(key: &str) -> Option<Path> {
    let tail = key.rsplit('_').next()?;
    Some(match tail {
        "mailbox" => Path::Mailbox,
        "ce" if key.starts_with("host_to_gpu") => Path::HostToGpu,
        "ce" if key.ends_with("_to_host_pinned_ce") => Path::GpuToHost,
        "p2p" => Path::P2p,
        "staged" => Path::Staged,
        "shm" => Path::Shm,
        "tcp" => Path::Tcp,
        "ipc" => Path::Ipc,
        _ => return None,
    })
}

/// Compare cases `a` and `b` of `report` by p50 latency (see the module docs).
pub fn decide(
    report: &Report,
    scope: &str,
    a: &str,
    b: &str,
) -> Option<(Decision, Option<Crossover>)> {
    let lat = |k: &str, size: u64| {
        report
            .results
            .iter()
            .find(|r| r.key == k && r.size_bytes == size && r.status == Status::Passed)
            .and_then(|r| r.lat_p50_us)
    };
    let mut sizes: Vec<u64> = report
        .results
        .iter()
        .filter(|r| r.key == a)
        .map(|r| r.size_bytes)
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    let evidence: Vec<(u64, f64, f64)> = sizes
        .iter()
        .filter_map(|&s| Some((s, lat(a, s)?, lat(b, s)?)))
        .collect();
    let (first, last) = (evidence.first()?, evidence.last()?);
    let winner = |e: &(u64, f64, f64)| if e.1 <= e.2 { a } else { b };
    let (pa, pb) = (engine_path(a)?, engine_path(b)?);
    let name = |k: &str| {
        if k == a {
            pa.to_string()
        } else {
            pb.to_string()
        }
    };
    let large = winner(last);
    let small = winner(first);
    // The smallest size from which `large` wins at every larger size.
    let mut from = last.0;
    for e in evidence.iter().rev() {
        if winner(e) == large {
            from = e.0;
        } else {
            break;
        }
    }
    let crossover = (small != large).then(|| Crossover {
        below_bytes: from,
        prefer: if small == a { pa } else { pb },
        over: if large == a { pa } else { pb },
    });
    let summary = match &crossover {
        Some(c) => format!(
            "{scope}: {} is faster below {} bytes, {} from there on",
            c.prefer, c.below_bytes, c.over
        ),
        None => {
            // The same path wins at both ends; say so honestly if the other wins in between
            // (a crossover can only say "below N bytes", so a middle band is not recorded).
            let others: Vec<u64> = evidence
                .iter()
                .filter(|e| winner(e) != large)
                .map(|e| e.0)
                .collect();
            match (others.first(), others.last()) {
                (Some(lo), Some(hi)) => format!(
                    "{scope}: {} is faster at the smallest and largest sizes; {} wins at {} \
                     size(s) between {lo} and {hi} bytes (a middle band: not recorded as a \
                     crossover)",
                    name(large),
                    name(if large == a { b } else { a }),
                    others.len()
                ),
                _ => format!("{scope}: {} is faster at every size measured", name(large)),
            }
        }
    };
    Some((
        Decision {
            scope: scope.into(),
            cases: [a.into(), b.into()],
            small_winner: Some(name(small)),
            large_winner: Some(name(large)),
            below_bytes: crossover.as_ref().map(|c| c.below_bytes),
            evidence,
            summary,
        },
        crossover,
    ))
}

/// The warning for a host->host decision where tcp was faster than shm at some size.
fn tcp_beats_shm(d: &Decision) -> Option<String> {
    if d.cases[0] != "host_to_host_shm" || d.cases[1] != "host_to_host_tcp" {
        return None;
    }
    let lost: Vec<String> = d
        .evidence
        .iter()
        .filter(|e| e.2 < e.1)
        .map(|e| format!("{} B ({:.2} vs {:.2} µs)", e.0, e.2, e.1))
        .collect();
    (!lost.is_empty()).then(|| {
        format!(
            "tcp beat shm between two agents of this host at {}: shm should win at every \
             size on one host, so this is an engine defect or a loaded machine; not recorded \
             as a preference for tcp (re-run on an idle machine, or report it)",
            lost.join(", ")
        )
    })
}

/// The pairs of case keys to compare for `gpus` GPUs.
pub fn pairs(gpus: u32) -> Vec<(String, String, String)> {
    let mut v = vec![(
        "host->host".to_string(),
        "host_to_host_shm".to_string(),
        "host_to_host_tcp".to_string(),
    )];
    // Mailbox against the copy engine (the mailbox case waives sizes above what one op
    // carries, so the evidence stops there).
    for g in 0..gpus {
        v.push((
            format!("host->gpu{g}"),
            format!("host_to_gpu{g}_mailbox"),
            format!("host_to_gpu{g}_pinned_ce"),
        ));
        v.push((
            format!("gpu{g}->host"),
            format!("gpu{g}_to_host_mailbox"),
            format!("gpu{g}_to_host_pinned_ce"),
        ));
    }
    for a in 0..gpus {
        for b in 0..gpus {
            if a != b {
                v.push((
                    format!("gpu{a}->gpu{b}"),
                    format!("gpu{a}_to_gpu{b}_p2p"),
                    format!("gpu{a}_to_gpu{b}_staged"),
                ));
            }
        }
    }
    v
}

/// Build the calibration from a report holding the compared cases (and any chunk probe).
pub fn from_report(
    report: Report,
    gpus: u32,
    staged_chunks: Vec<(u64, f64)>,
    source: String,
) -> Outcome {
    let mut cal = Calibration {
        // The engine's `CALIBRATION_SCHEMA` (not re-exported by gdx-engine).
        schema_version: 1,
        source: Some(source),
        ..Calibration::default()
    };
    let mut decisions = Vec::new();
    let mut warnings = Vec::new();
    for (scope, a, b) in pairs(gpus) {
        if let Some((d, c)) = decide(&report, &scope, &a, &b) {
            if let Some(w) = tcp_beats_shm(&d) {
                warnings.push(w);
            }
            // shm must win at every size on one host: a measurement saying otherwise is
            // reported above, never turned into a preference for tcp.
            let c = c.filter(|c| !(c.prefer == Path::Tcp && c.over == Path::Shm));
            if let Some(c) = c {
                // One crossover per path pair: keep the most conservative (smallest) threshold.
                match cal
                    .crossovers
                    .iter_mut()
                    .find(|x| x.prefer == c.prefer && x.over == c.over)
                {
                    Some(x) => x.below_bytes = x.below_bytes.min(c.below_bytes),
                    None => cal.crossovers.push(c),
                }
            }
            decisions.push(d);
        }
    }
    if let Some(best) = staged_chunks
        .iter()
        .copied()
        .max_by(|x, y| x.1.total_cmp(&y.1))
    {
        cal.staged_chunk_bytes = Some(best.0);
        cal.staged_depth = Some(crate::gpu::copy::STAGED_DEPTH as u32);
    }
    Outcome {
        calibration: cal,
        detail: Detail {
            decisions,
            staged_chunks,
            header: report.header.clone(),
            warnings,
        },
        report,
    }
}

/// Measure and decide: run the compared cases at [`sizes`] (shorter per size than `gdx
/// bench`), then the staged chunk probe on GPU0 → GPU1 when it exists.
pub fn calibrate(ctx: &Ctx, params: &Params, header: Header, obs: &mut dyn Observer) -> Outcome {
    let gpus = ctx.gpu_count();
    let wanted: Vec<String> = pairs(gpus)
        .into_iter()
        .flat_map(|(_, a, b)| [a, b])
        .collect();
    let cases: Vec<Box<dyn BenchCase>> = crate::all_cases(ctx)
        .into_iter()
        .filter(|c| wanted.contains(&c.spec().key))
        .collect();
    let report = run(&cases, ctx, params, header, obs);
    let mut chunks = Vec::new();
    if gpus >= 2 {
        let staged: Vec<Box<dyn BenchCase>> = crate::all_cases(ctx)
            .into_iter()
            .filter(|c| c.spec().key == "gpu0_to_gpu1_staged")
            .collect();
        for chunk in CHUNK_CANDIDATES {
            let p = Params {
                sizes: vec![CHUNK_PROBE_BYTES],
                staged_chunk: chunk,
                duration: Duration::from_millis(100),
                verify: false,
                ..params.clone()
            };
            let r = run(&staged, ctx, &p, report.header.clone(), &mut crate::Quiet);
            if let Some(bw) = r.results.first().and_then(|row| row.bw_gbps) {
                chunks.push((chunk, bw));
            }
        }
    }
    let source = format!(
        "gdx calibrate {} on {}, started at unix time {}",
        report.header.gdx_version, report.header.host, report.header.started_unix_s
    );
    from_report(report, gpus, chunks, source)
}

/// The calibration file's JSON: the engine's fields plus `gdx_bench` (the detail).
///
/// # Errors
/// Only if serialisation fails.
pub fn to_json(o: &Outcome) -> Result<String, serde_json::Error> {
    let mut v = serde_json::to_value(&o.calibration)?;
    if let Some(m) = v.as_object_mut() {
        m.insert("gdx_bench".into(), serde_json::to_value(&o.detail)?);
    }
    serde_json::to_string_pretty(&v)
}

/// The `gdx_bench` detail of a calibration file, if it has one.
pub fn detail_of(json: &str) -> Option<Detail> {
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    serde_json::from_value(v.get("gdx_bench")?.clone()).ok()
}

/// `gdx calibrate --show`: the crossovers and tuning, then the decisions with their evidence.
pub fn show(cal: &Calibration, detail: Option<&Detail>) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "calibration: {}",
        cal.source.as_deref().unwrap_or("(no source)")
    );
    if cal.crossovers.is_empty() {
        let _ = writeln!(
            s,
            "crossovers: none (the planner's default path wins at every size)"
        );
    } else {
        let _ = writeln!(
            s,
            "crossovers (the planner prefers the first path below the size):"
        );
        for c in &cal.crossovers {
            let _ = writeln!(
                s,
                "  {:<8} over {:<8} below {:>12} bytes",
                c.prefer.to_string(),
                c.over.to_string(),
                c.below_bytes
            );
        }
    }
    let _ = writeln!(
        s,
        "staged: chunk {} bytes, depth {}; p2p streams {}",
        cal.staged_chunk(),
        cal.staged_depth(),
        cal.p2p_streams.unwrap_or(1)
    );
    if let Some(d) = detail {
        for w in &d.warnings {
            let _ = writeln!(s, "warning: {w}");
        }
        for dec in &d.decisions {
            let _ = writeln!(s, "{}", dec.summary);
            let _ = writeln!(
                s,
                "  {:>12} {:>14} {:>14}",
                "bytes",
                format!("{} µs", short(&dec.cases[0])),
                format!("{} µs", short(&dec.cases[1]))
            );
            for (size, x, y) in &dec.evidence {
                let _ = writeln!(s, "  {size:>12} {x:>14.2} {y:>14.2}");
            }
        }
        for (c, bw) in &d.staged_chunks {
            let _ = writeln!(
                s,
                "staged chunk {:>9} bytes: {bw:.2} GB/s at {CHUNK_PROBE_BYTES} bytes",
                c
            );
        }
    }
    s
}

fn short(key: &str) -> &str {
    key.rsplit('_').next().unwrap_or(key)
}
