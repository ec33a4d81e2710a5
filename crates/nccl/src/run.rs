//! `gdx nccl run`: nccl-tests' measurement from one process driving every local GPU
//! (`ncclCommInitAll`), with NCCL's own INFO log captured through `NCCL_DEBUG_FILE` so it can
//! be explained and judged like any other log.
//!
//! Per collective and size: `warmup` launches, then `iters` timed launches between host
//! clock reads around a synchronisation of every stream (nccl-tests' method), giving the
//! time per operation. Bandwidths use nccl-tests' definitions: algbw = bytes / time with
//! bytes the per-rank buffer nccl-tests names as the size (all-gather: the gathered output,
//! reduce-scatter: the scattered input); busbw = algbw × 2(n−1)/n for all-reduce,
//! × (n−1)/n for all-gather and reduce-scatter, × 1 for send/recv. With one rank the
//! collectives' busbw is therefore 0 by definition, and send/recv is a copy inside the GPU.
//!
//! Nothing here panics without a GPU or libnccl: the result is [`RunOutcome::Waived`] with the
//! reason. The environment NCCL reads at initialisation is set here, before the library is
//! loaded, and returned in the report: `NCCL_DEBUG=INFO`, `NCCL_DEBUG_FILE`, and, when unset,
//! `NCCL_DEBUG_SUBSYS` and `NCCL_NVLS_ENABLE=0` (NVLink multicast stays off).

use crate::error::NcclError;
use crate::model::NcclLog;
use gdx_base::clock::wall;
use gdx_sys::cuda::{Context, Cuda, DeviceBuffer, Stream};
use gdx_sys::nccl::{self as sys, Collective};
use gdx_topo::ceiling::Ceiling;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// A collective to time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// `all_reduce_perf`.
    AllReduce,
    /// `all_gather_perf`.
    AllGather,
    /// `reduce_scatter_perf`.
    ReduceScatter,
    /// `sendrecv_perf`.
    SendRecv,
}

impl Op {
    /// All four, in nccl-tests' order.
    pub const ALL: [Op; 4] = [
        Op::AllReduce,
        Op::AllGather,
        Op::ReduceScatter,
        Op::SendRecv,
    ];

    /// `all_reduce`, ...
    pub fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce",
            Op::AllGather => "all_gather",
            Op::ReduceScatter => "reduce_scatter",
            Op::SendRecv => "sendrecv",
        }
    }

    /// Parse `all_reduce` / `allreduce` / `all-reduce`, ...
    pub fn parse(s: &str) -> Option<Op> {
        let k: String = s
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .collect::<String>()
            .to_ascii_lowercase();
        Op::ALL.into_iter().find(|o| o.name().replace('_', "") == k)
    }

    fn collective(self) -> Collective {
        match self {
            Op::AllReduce => Collective::AllReduce,
            Op::AllGather => Collective::AllGather,
            Op::ReduceScatter => Collective::ReduceScatter,
            Op::SendRecv => Collective::SendRecv,
        }
    }

    /// nccl-tests' bus-bandwidth factor for `n` ranks.
    pub fn bus_factor(self, n: u32) -> f64 {
        let n = f64::from(n.max(1));
        match self {
            Op::AllReduce => 2.0 * (n - 1.0) / n,
            Op::AllGather | Op::ReduceScatter => (n - 1.0) / n,
            Op::SendRecv => 1.0,
        }
    }

    /// The element count per call and the bytes nccl-tests reports for a `size`-byte test
    /// on `n` ranks (0 elements when the size is too small to split).
    pub fn shape(self, size: u64, n: u32) -> (usize, u64) {
        let el = sys::ELEMENT_BYTES as u64;
        let n = u64::from(n.max(1));
        let count = match self {
            Op::AllReduce | Op::SendRecv => size / el,
            Op::AllGather | Op::ReduceScatter => size / (el * n),
        };
        let bytes = match self {
            Op::AllReduce | Op::SendRecv => count * el,
            Op::AllGather | Op::ReduceScatter => count * el * n,
        };
        (usize::try_from(count).unwrap_or(usize::MAX), bytes)
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct RunParams {
    /// Sizes in bytes (nccl-tests' `-b .. -e`).
    pub sizes: Vec<u64>,
    /// Collectives.
    pub ops: Vec<Op>,
    /// Untimed launches first.
    pub warmup: u32,
    /// Timed launches.
    pub iters: u32,
    /// Use only the first N GPUs (all when `None`).
    pub gpus: Option<u32>,
    /// Where NCCL writes its debug files; a temporary folder when `None`.
    pub log_dir: Option<PathBuf>,
}

/// One measured row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// Collective.
    pub op: Op,
    /// Bytes as nccl-tests reports them.
    pub bytes: u64,
    /// Elements per call.
    pub count: usize,
    /// Microseconds per operation (mean over `iters`).
    pub time_us: f64,
    /// GB/s (1e9 B/s).
    pub algbw_gbps: f64,
    /// GB/s.
    pub busbw_gbps: f64,
}

/// A completed run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunReport {
    /// `ncclGetVersion`.
    pub nccl_version: Option<String>,
    /// The library file.
    pub nccl_path: String,
    /// GPUs used, in rank order: `GPU0 NVIDIA H200 0000:00:06.0`.
    pub gpus: Vec<String>,
    /// Variables set for NCCL by this run.
    pub env_set: Vec<(String, String)>,
    /// Warmup and timed launches.
    pub warmup: u32,
    /// Timed launches.
    pub iters: u32,
    /// The rows.
    pub rows: Vec<Row>,
    /// Sizes skipped (too small for the rank count), as text.
    pub skipped: Vec<String>,
    /// The busbw ceiling, when the topology gives one.
    pub ceiling: Option<Ceiling>,
    /// Why there is no ceiling, or how the large sizes compare with it.
    pub ceiling_note: String,
    /// The data is not checked (speed only): stated so nobody assumes otherwise.
    pub verified: bool,
    /// NCCL's debug files.
    pub log_files: Vec<PathBuf>,
    /// Those files, parsed.
    pub log: NcclLog,
}

/// The result of `gdx nccl run`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum RunOutcome {
    /// It ran.
    Ran(Box<RunReport>),
    /// It could not run here.
    Waived {
        /// Why (no libcuda, no GPU, no libnccl).
        reason: String,
    },
}

/// Set `var` for NCCL when `force` or unset; returns the value NCCL will see.
fn set_env(var: &str, value: &str, force: bool, set: &mut Vec<(String, String)>) {
    if force || std::env::var_os(var).is_none() {
        // NCCL reads its environment when it initialises, which is after this point: the
        // library is loaded below. gdx runs this before starting any thread of its own.
        std::env::set_var(var, value);
        set.push((var.to_string(), value.to_string()));
    }
}

/// Run. `topology` (the live machine's, when known) gives the busbw ceiling.
pub fn run(
    params: &RunParams,
    topology: Option<&gdx_topo::Topology>,
) -> Result<RunOutcome, NcclError> {
    if params.sizes.is_empty() || params.ops.is_empty() || params.iters == 0 {
        return Err(NcclError::EmptyRun);
    }
    let cuda = match Cuda::load() {
        Ok(c) => c,
        Err(u) => return Ok(waived(format!("no GPU: {u}"))),
    };
    let count = cuda.device_count().unwrap_or(0);
    if count == 0 {
        return Ok(waived("no GPU: the CUDA driver reports 0 devices".into()));
    }
    let n = params.gpus.map_or(count, |g| g.min(count)).max(1);
    let (dir, _tmp) = match &params.log_dir {
        Some(d) => {
            std::fs::create_dir_all(d).map_err(|source| NcclError::LogDir {
                path: d.clone(),
                source,
            })?;
            (d.clone(), None)
        }
        None => {
            let t = tempfile::Builder::new()
                .prefix("gdx-nccl-")
                .tempdir()
                .map_err(|source| NcclError::LogDir {
                    path: std::env::temp_dir(),
                    source,
                })?;
            (t.path().to_path_buf(), Some(t))
        }
    };
    let mut env_set = Vec::new();
    set_env("NCCL_DEBUG", "INFO", true, &mut env_set);
    let file = dir.join("nccl.%h.%p.log");
    set_env(
        "NCCL_DEBUG_FILE",
        &file.to_string_lossy(),
        true,
        &mut env_set,
    );
    set_env(
        "NCCL_DEBUG_SUBSYS",
        "INIT,ENV,NET,GRAPH",
        false,
        &mut env_set,
    );
    set_env("NCCL_NVLS_ENABLE", "0", false, &mut env_set);
    let nccl = match sys::Nccl::load() {
        Ok(l) => l,
        Err(u) => return Ok(waived(format!("no libnccl: {u}"))),
    };
    let mut ctxs = Vec::new();
    let mut gpus = Vec::new();
    for i in 0..n {
        let ctx = cuda.context(i).map_err(cuda_err)?;
        let d = ctx.device();
        gpus.push(format!(
            "GPU{i} {} {}",
            d.name().unwrap_or_else(|_| "?".into()),
            d.pci_bus_id().unwrap_or_else(|_| "?".into())
        ));
        ctxs.push(ctx);
    }
    let rows_and_skips = measure(&nccl, &ctxs, params);
    // The communicators are gone; NCCL has flushed its debug files.
    let (rows, skipped) = rows_and_skips?;
    let log_files = debug_files(&dir)?;
    let log = crate::parse::parse_files(&log_files)?;
    let (ceiling, ceiling_note) = ceiling(topology, &ctxs, &rows);
    // A temporary folder is removed with `_tmp`: keep the files only when asked to.
    let log_files = if params.log_dir.is_some() {
        log_files
    } else {
        Vec::new()
    };
    Ok(RunOutcome::Ran(Box::new(RunReport {
        nccl_version: nccl.version().ok().map(|v| v.to_string()),
        nccl_path: nccl.path().to_string(),
        gpus,
        env_set,
        warmup: params.warmup,
        iters: params.iters,
        rows,
        skipped,
        ceiling,
        ceiling_note,
        verified: false,
        log_files,
        log,
    })))
}

fn waived(reason: String) -> RunOutcome {
    RunOutcome::Waived { reason }
}

fn cuda_err(e: gdx_sys::cuda::CudaError) -> NcclError {
    NcclError::RunCuda(e)
}

fn nccl_err(e: gdx_sys::nccl::NcclError) -> NcclError {
    NcclError::RunNccl(e)
}

type Measured = (Vec<Row>, Vec<String>);

fn measure(nccl: &sys::Nccl, ctxs: &[Context], p: &RunParams) -> Result<Measured, NcclError> {
    let comms = nccl.init_all(ctxs).map_err(nccl_err)?;
    let streams: Vec<Stream> = ctxs
        .iter()
        .map(Stream::new)
        .collect::<Result<_, _>>()
        .map_err(cuda_err)?;
    let n = comms.len() as u32;
    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    for &op in &p.ops {
        for &size in &p.sizes {
            let (count, bytes) = op.shape(size, n);
            if count == 0 {
                skipped.push(format!(
                    "{} {size} B: smaller than one element per rank",
                    op.name()
                ));
                continue;
            }
            let (s_el, r_el) = op.collective().elements(count, n as usize);
            let el = sys::ELEMENT_BYTES;
            let mut send = Vec::new();
            let mut recv = Vec::new();
            for (ctx, st) in ctxs.iter().zip(&streams) {
                let mut s = DeviceBuffer::new(ctx, s_el * el).map_err(cuda_err)?;
                let len = s.len();
                st.memset(&mut s, 0, len, 0).map_err(cuda_err)?;
                send.push(s);
                recv.push(DeviceBuffer::new(ctx, r_el * el).map_err(cuda_err)?);
            }
            for _ in 0..p.warmup {
                sys::launch(&comms, op.collective(), count, &send, &mut recv, &streams)
                    .map_err(nccl_err)?;
            }
            sync(&streams)?;
            // Wall time over all iterations, as nccl-tests measures (the launches are enqueued
            // back to back, so the host clock sees the collectives, not one launch each).
            let (done, took) = wall(|| -> Result<(), NcclError> {
                for _ in 0..p.iters {
                    sys::launch(&comms, op.collective(), count, &send, &mut recv, &streams)
                        .map_err(nccl_err)?;
                }
                sync(&streams)
            });
            done?;
            let secs = took.as_secs_f64() / f64::from(p.iters);
            let algbw = if secs > 0.0 {
                bytes as f64 / secs / 1e9
            } else {
                0.0
            };
            rows.push(Row {
                op,
                bytes,
                count,
                time_us: secs * 1e6,
                algbw_gbps: algbw,
                busbw_gbps: algbw * op.bus_factor(n),
            });
        }
    }
    drop(comms);
    Ok((rows, skipped))
}

fn sync(streams: &[Stream]) -> Result<(), NcclError> {
    for s in streams {
        s.synchronize().map_err(cuda_err)?;
    }
    Ok(())
}

/// `nccl.<host>.<pid>.log` files NCCL wrote into `dir`.
fn debug_files(dir: &Path) -> Result<Vec<PathBuf>, NcclError> {
    let rd = std::fs::read_dir(dir).map_err(|source| NcclError::LogDir {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|f| f.to_string_lossy().starts_with("nccl."))
        })
        .collect();
    v.sort();
    Ok(v)
}

/// The busbw ceiling: the slowest of topo's GPU-pair ceilings between consecutive ranks;
/// none with one rank.
fn ceiling(
    topo: Option<&gdx_topo::Topology>,
    ctxs: &[Context],
    rows: &[Row],
) -> (Option<Ceiling>, String) {
    if ctxs.len() < 2 {
        return (
            None,
            "one rank: collectives move no data between GPUs (busbw is 0 by definition) and send/recv is a copy inside the GPU; the 2-GPU figure needs a 2-GPU machine".into(),
        );
    }
    let Some(topo) = topo else {
        return (None, "no topology: no ceiling to compare with".into());
    };
    let dev_of = |c: &Context| {
        c.device()
            .pci_bus_id()
            .ok()
            .and_then(|b| b.parse::<gdx_topo::PciAddr>().ok())
            .and_then(|b| topo.by_bdf(b))
    };
    // (ceiling, the pair it is between)
    let mut best: Option<(Ceiling, String)> = None;
    for w in ctxs.windows(2) {
        let (Some(a), Some(b)) = (dev_of(&w[0]), dev_of(&w[1])) else {
            return (None, "a GPU is not in the topology: no ceiling".into());
        };
        let Some(c) = gdx_topo::ceiling::gpu_pair(topo, a, b, None) else {
            return (
                None,
                format!(
                    "{}↔{} is {} with unknown PCIe links: no ceiling",
                    a.label,
                    b.label,
                    topo.path_class(a, b)
                ),
            );
        };
        if best.as_ref().is_none_or(|(x, _)| c.gbps < x.gbps) {
            best = Some((c, format!("{}↔{}", a.label, b.label)));
        }
    }
    let Some((c, pair)) = best else {
        return (None, "no ceiling".into());
    };
    let large: Vec<&Row> = rows.iter().filter(|r| r.bytes >= 256 << 20).collect();
    let note = match large.iter().map(|r| r.busbw_gbps).reduce(f64::max) {
        Some(b) => format!(
            "best busbw at ≥ 256 MiB: {b:.1} GB/s = {:.0} % of {:.1} GB/s ({}, {pair})",
            b / c.gbps * 100.0,
            c.gbps,
            c.basis
        ),
        None => format!(
            "ceiling {:.1} GB/s ({}, {pair}); run sizes ≥ 256 MiB to compare",
            c.gbps, c.basis
        ),
    };
    (Some(c), note)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_tests_bus_factors() {
        assert_eq!(Op::AllReduce.bus_factor(8), 2.0 * 7.0 / 8.0);
        assert_eq!(Op::AllReduce.bus_factor(1), 0.0);
        assert_eq!(Op::AllGather.bus_factor(2), 0.5);
        assert_eq!(Op::ReduceScatter.bus_factor(4), 0.75);
        assert_eq!(Op::SendRecv.bus_factor(2), 1.0);
    }

    #[test]
    fn shapes_follow_nccl_tests_sizes() {
        assert_eq!(Op::AllReduce.shape(1 << 20, 2), (1 << 18, 1 << 20));
        assert_eq!(Op::AllGather.shape(1 << 20, 2), (1 << 17, 1 << 20));
        assert_eq!(Op::ReduceScatter.shape(8, 4), (0, 0));
        assert_eq!(Op::SendRecv.shape(10, 1), (2, 8));
    }

    #[test]
    fn op_names_parse_in_any_spelling() {
        assert_eq!(Op::parse("all_reduce"), Some(Op::AllReduce));
        assert_eq!(Op::parse("AllGather"), Some(Op::AllGather));
        assert_eq!(Op::parse("reduce-scatter"), Some(Op::ReduceScatter));
        assert_eq!(Op::parse("sendrecv"), Some(Op::SendRecv));
        assert_eq!(Op::parse("bcast"), None);
    }
}
