//! The engine-driven GPU cases: `gpuA_to_gpuB_staged` (the engine's staged transfers, forced
//! with [`Policy::force`]) and `gpuA_to_gpuB_ipc` (GPU A of this process into GPU B memory a
//! second process exported, see [`super::ipc`]). Both copy through
//! [`LocalPeer::transfer_with`], each copy ordered into a timing stream on GPU A
//! ([`Ordering::stream`]), so the device-event batches of [`super::timing`] apply as for p2p:
//! the stream is held, a start event recorded, the batch queued (each copy forks from and joins
//! the timing stream), the end event recorded, the hold released.
//!
//! Buffers: a window per case (as in [`super::copy`]); the source holds a seeded pattern, the
//! destination's rotated span is poisoned before each size (uploaded), and the touched part is
//! read back through the engine (`download`; for ipc through the imported mapping) and compared.

use gdx_base::pattern::{fill_pattern, POISON};
use gdx_engine::{Calibration, DeviceRegion, LocalPeer, Ordering, Path, Plan, Policy};
use gdx_sys::cuda::Stream;

use super::copy::{event_row, finish, window, SEED, STAGED_DEPTH};
use super::ipc::{child_args, IpcChild, READY_TIMEOUT};
use super::timing::{event_batches, latency, OpCounter};
use crate::case::{CaseSpec, Params};
use crate::error::{BenchError, Mismatch};
use crate::host::{slots, touched};
use crate::report::Row;
use crate::Ctx;

/// Host bytes moved per upload/download call when poisoning and verifying.
const STEP: usize = 64 << 20;

/// The engine opened for the staged case: staged forced, the chunk from `--staged-chunk` (the
/// calibration's tuned chunk when run by `gdx calibrate`), the depth from `GDX_CALIBRATION`
/// or [`STAGED_DEPTH`]. Returns the peer and the note naming the method.
fn staged_peer(params: &Params) -> Result<(LocalPeer, String), BenchError> {
    let base = match Calibration::from_env() {
        Ok(c) => c.unwrap_or_default(),
        Err(e) => {
            return Err(BenchError::Unmeasurable(format!(
                "cannot read the calibration: {e}"
            )))
        }
    };
    let chunk = params.staged_chunk.max(4096);
    let depth = base.staged_depth.unwrap_or(STAGED_DEPTH as u32).max(1);
    let cal = Calibration {
        staged_chunk_bytes: Some(chunk),
        staged_depth: Some(depth),
        ..base
    };
    let peer = LocalPeer::open(
        Policy {
            force: Some(Path::Staged),
            ..Policy::default()
        },
        cal,
    )
    .map_err(BenchError::engine("opening the engine (staged forced)"))?;
    let note = format!(
        "engine staged (LocalPeer::transfer, staged forced): {depth} x {} KiB pinned bounce buffers \
         (chunk = min(chunk, size)), D2H on GPU-A's stream, H2D on GPU-B's; device events",
        chunk >> 10
    );
    Ok((peer, note))
}

/// Run `gpuA_to_gpuB_staged` through the engine.
pub fn run_staged(
    ctx: &Ctx,
    spec: &CaseSpec,
    a: u32,
    b: u32,
    params: &Params,
    sink: &mut dyn FnMut(Row),
) -> Result<(), BenchError> {
    let (peer, note) = staged_peer(params)?;
    let w = window(params);
    let (src, pat) = source(&peer, a, w)?;
    let dst = peer.alloc_device(b, w).map_err(BenchError::engine(format!(
        "allocating {w} bytes on GPU{b}"
    )))?;
    sweep(
        ctx,
        spec,
        &peer,
        a,
        b,
        &src,
        &dst,
        &pat,
        params,
        Path::Staged,
        &note,
        sink,
    );
    Ok(())
}

/// Run `gpuA_to_gpuB_ipc`: start the child exporting `w` bytes on GPU `b`, import, sweep.
pub fn run_ipc(
    ctx: &Ctx,
    spec: &CaseSpec,
    a: u32,
    b: u32,
    params: &Params,
    sink: &mut dyn FnMut(Row),
) -> Result<(), BenchError> {
    let peer = LocalPeer::open(Policy::default(), Calibration::default())
        .map_err(BenchError::engine("opening the engine"))?;
    let w = window(params);
    let (src, pat) = source(&peer, a, w)?;
    let exe = std::env::current_exe().map_err(BenchError::io("finding this executable"))?;
    let (child, desc) = IpcChild::start(&exe, &child_args(b, w), READY_TIMEOUT)?;
    let result = (|| {
        let dst = peer
            .import_ipc(&desc)
            .map_err(BenchError::engine("importing the child's IPC handle"))?;
        if dst.gpu() != b {
            return Err(BenchError::IpcChild(format!(
                "the child's GPU{b} ({}) is GPU{} in this process",
                desc.pci_bus_id,
                dst.gpu()
            )));
        }
        if dst.len() < w {
            return Err(BenchError::IpcChild(format!(
                "the child exported {} bytes, {w} wanted",
                dst.len()
            )));
        }
        let note = format!(
            "engine ipc (LocalPeer::transfer into a region imported from child pid {}); device events",
            desc.pid
        );
        sweep(
            ctx,
            spec,
            &peer,
            a,
            b,
            &src,
            &dst,
            &pat,
            params,
            Path::Ipc,
            &note,
            sink,
        );
        // The mapping goes before the child is told to exit (drop order below).
        drop(dst);
        Ok(())
    })();
    drop(child);
    result
}

/// A `w`-byte region on GPU `gpu` holding the case's pattern, and the pattern.
fn source(peer: &LocalPeer, gpu: u32, w: u64) -> Result<(DeviceRegion, Vec<u8>), BenchError> {
    let mut pat = vec![0u8; w as usize];
    fill_pattern(&mut pat, SEED);
    let src = peer
        .alloc_device(gpu, w)
        .map_err(BenchError::engine(format!(
            "allocating {w} bytes on GPU{gpu}"
        )))?;
    for (k, c) in pat.chunks(STEP).enumerate() {
        peer.upload(&src, (k * STEP) as u64, c)
            .map_err(BenchError::engine("uploading the pattern"))?;
    }
    Ok((src, pat))
}

fn poison(peer: &LocalPeer, r: &DeviceRegion, span: u64) -> Result<(), BenchError> {
    let p = vec![POISON; STEP.min(span as usize)];
    let mut off = 0u64;
    while off < span {
        let n = (span - off).min(STEP as u64) as usize;
        peer.upload(r, off, &p[..n])
            .map_err(BenchError::engine("poisoning the destination"))?;
        off += n as u64;
    }
    Ok(())
}

/// Compare `r[..want.len()]` with `want`, read back in steps.
fn check(peer: &LocalPeer, r: &DeviceRegion, want: &[u8]) -> Result<Option<Mismatch>, BenchError> {
    let mut got = vec![0u8; STEP.min(want.len())];
    for (k, w) in want.chunks(STEP).enumerate() {
        let g = &mut got[..w.len()];
        peer.download(r, (k * STEP) as u64, g)
            .map_err(BenchError::engine("reading the destination back"))?;
        if let Some(m) = Mismatch::find(g, w, (k * STEP) as u64) {
            return Ok(Some(m));
        }
    }
    Ok(None)
}

/// Every size: poison, time (device events on a stream of GPU `a`), verify; one row each.
#[allow(clippy::too_many_arguments)]
fn sweep(
    ctx: &Ctx,
    spec: &CaseSpec,
    peer: &LocalPeer,
    a: u32,
    b: u32,
    src: &DeviceRegion,
    dst: &DeviceRegion,
    pat: &[u8],
    params: &Params,
    want: Path,
    note: &str,
    sink: &mut dyn FnMut(Row),
) {
    let w = src.len().min(dst.len());
    let stream = peer
        .context(a)
        .map_err(BenchError::engine(format!("GPU{a}'s context")))
        .and_then(|c| Stream::new(&c).map_err(BenchError::Cuda));
    for &size in &params.sizes {
        let r = (|| {
            // One failure to make the stream fails every size, each with the same message.
            let st = stream
                .as_ref()
                .map_err(|e| BenchError::Unmeasurable(e.chain()))?;
            let n = slots(size, w);
            poison(peer, dst, n * size)?;
            let off = |i: u64| (i % n) * size;
            let mut plan: Option<Plan> = None;
            let mut ops = OpCounter::default();
            let mut enq = |i: u64| -> Result<(), gdx_engine::Error> {
                let ord = Ordering {
                    stream: Some(st),
                    ..Ordering::default()
                };
                let t = peer.transfer_with(dst, off(i), src, off(i), size, ord)?;
                if plan.is_none() {
                    plan = Some(t.plan().clone());
                }
                Ok(())
            };
            let bw = event_batches(params, &[st], size as f64, &mut ops, &mut enq)?;
            let lat = latency(params, &[st], &mut ops, &mut enq)?;
            let mut row = event_row(spec, size, size as f64, &bw, &lat);
            row.add_note(note);
            if let Some(p) = plan.as_ref().filter(|p| p.path != want) {
                row.add_note(format!("the engine planned {p}, not {want}"));
            }
            let tb = touched(size, w, ops.0) as usize;
            let bad = if params.verify {
                Some(check(peer, dst, &pat[..tb])?)
            } else {
                None
            };
            finish(&mut row, params, bad);
            Ok(row)
        })();
        let mut row = r.unwrap_or_else(|m: BenchError| Row::failed(spec, size, m.chain()));
        row.gpu_util_pct = ctx.gpu_util_pct(&[a, b]);
        sink(row);
    }
}
