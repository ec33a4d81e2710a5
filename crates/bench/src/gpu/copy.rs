//! The GPU cases' bodies, through `gdx_sys::cuda` directly: copy-engine copies host ↔ GPU
//! (pinned: device events; pageable: the driver's synchronous staging, host clock), GPU ↔ GPU
//! p2p one way and both ways at once (device events), and a staged pipeline GPU → pinned
//! bounce buffers → GPU on two streams (host clock, the streams being on two contexts). The
//! `gpuA_to_gpuB_staged` case no longer uses [`Kind::Staged`]: it measures the engine's staged
//! transfers ([`super::engine`]); the gdx-sys pipeline stays here as a reference body.
//!
//! Buffers: one window per case (the largest size, or up to [`ROTATE_BYTES`] for small
//! sweeps), filled with a seeded pattern once; each size rotates over slots of the window;
//! the destination is poisoned before each size and its touched part compared with the
//! source afterwards. Device memory is `cuMemAlloc` (never the stream-ordered pool, whose
//! peer copies fall back to a slow path silently).

use gdx_base::pattern::{fill_pattern, POISON};
use gdx_sys::cuda::{Context, Cuda, CudaError, DeviceBuffer, PinnedHostBuffer, Stream};

use super::timing::{event_batches, latency, EventTimed, OpCounter};
use crate::case::{CaseSpec, Params, ROTATE_BYTES};
use crate::error::{BenchError, Mismatch};
use crate::figures::fill_row;
use crate::host::{compare, fill_wall_row, slots, touched, wall_loop};
use crate::report::Row;
use crate::Ctx;

/// The seed of each case's source pattern.
pub(crate) const SEED: u64 = 0x6764_785f_6770_7531;

/// What a GPU case copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Host → GPU, pinned or pageable host memory.
    ToGpu {
        /// GPU ordinal.
        gpu: u32,
        /// Pinned (else pageable).
        pinned: bool,
    },
    /// GPU → host.
    ToHost {
        /// GPU ordinal.
        gpu: u32,
        /// Pinned (else pageable).
        pinned: bool,
    },
    /// GPU → GPU over the peer link.
    P2p {
        /// Source GPU.
        src: u32,
        /// Destination GPU.
        dst: u32,
    },
    /// Both directions between two GPUs at once.
    Bidir {
        /// One GPU.
        a: u32,
        /// The other.
        b: u32,
    },
    /// GPU → pinned host → GPU, chunked, pipelined over bounce buffers.
    Staged {
        /// Source GPU.
        src: u32,
        /// Destination GPU.
        dst: u32,
    },
}

/// Receives each size's row (or its error) with the GPUs involved.
type RowSink<'a> = dyn FnMut(u64, Result<Row, BenchError>, &[u32]) + 'a;

/// Bounce buffers in flight in the staged pipeline.
pub const STAGED_DEPTH: usize = 4;

fn e(err: CudaError) -> BenchError {
    BenchError::Cuda(err)
}

/// The window a case's buffers span.
pub(crate) fn window(params: &Params) -> u64 {
    let max = params.max_size().max(1);
    max.max(ROTATE_BYTES.min(max.saturating_mul(64)))
}

fn pattern_buf(c: &Context, w: usize) -> Result<PinnedHostBuffer, BenchError> {
    let mut p = PinnedHostBuffer::new(c, w).map_err(e)?;
    fill_pattern(p.as_mut_slice().map_err(e)?, SEED);
    Ok(p)
}

fn device_with_pattern(
    c: &Context,
    s: &Stream,
    pat: &PinnedHostBuffer,
) -> Result<DeviceBuffer, BenchError> {
    let mut d = DeviceBuffer::new(c, pat.len()).map_err(e)?;
    s.copy_to_device(&mut d, pat).map_err(e)?;
    s.synchronize().map_err(e)?;
    Ok(d)
}

fn poison(s: &Stream, d: &mut DeviceBuffer) -> Result<(), BenchError> {
    let n = d.len();
    s.memset(d, 0, n, POISON).map_err(e)?;
    s.synchronize().map_err(e)
}

/// Compare the first `tb` bytes of device buffer `d` with `want`.
fn check_device(s: &Stream, d: &DeviceBuffer, want: &[u8]) -> Result<Option<Mismatch>, BenchError> {
    let mut got = vec![0u8; want.len()];
    s.copy_to_pageable(&mut got, d, 0).map_err(e)?;
    Ok(compare(&got, want))
}

pub(crate) fn finish(row: &mut Row, params: &Params, bad: Option<Option<Mismatch>>) {
    if !params.verify {
        return;
    }
    if let Some(b) = bad {
        row.verified = Some(b.is_none());
        if let Some(m) = b {
            row.add_note(m.to_string());
        }
    }
}

pub(crate) fn event_row(
    spec: &CaseSpec,
    size: u64,
    bytes: f64,
    bw: &EventTimed,
    lat: &[std::time::Duration],
) -> Row {
    let mut row = Row::new(spec, size);
    fill_row(
        &mut row,
        bytes,
        &bw.samples,
        lat,
        bw.samples.len() as u64 * bw.batch,
    );
    row.cpu_s_per_gb = bw.cpu_s_per_gb;
    if !bw.held {
        row.add_note("streams not held (no cuLaunchHostFunc): small sizes include enqueue cost");
    }
    row
}

/// Run every size of `kind`, giving each row (or a per-size error row) to `sink`.
pub fn run(
    ctx: &Ctx,
    spec: &CaseSpec,
    kind: Kind,
    params: &Params,
    sink: &mut dyn FnMut(Row),
) -> Result<(), BenchError> {
    let cuda = ctx.cuda().map_err(|u| BenchError::Unavailable(u.clone()))?;
    let w = window(params) as usize;
    let mut each = |size: u64, r: Result<Row, BenchError>, gpus: &[u32]| {
        let mut row = r.unwrap_or_else(|m| Row::failed(spec, size, m.chain()));
        row.gpu_util_pct = ctx.gpu_util_pct(gpus);
        sink(row);
    };
    match kind {
        Kind::ToGpu { gpu, pinned } => {
            let c = cuda.context(gpu).map_err(e)?;
            let s = Stream::new(&c).map_err(e)?;
            let mut dst = DeviceBuffer::new(&c, w).map_err(e)?;
            let src = pattern_buf(&c, w)?;
            let pageable: Vec<u8> = if pinned {
                Vec::new()
            } else {
                src.as_slice().map_err(e)?.to_vec()
            };
            for &size in &params.sizes {
                let r = (|| {
                    poison(&s, &mut dst)?;
                    let n = slots(size, w as u64);
                    let sz = size as usize;
                    let off = |i: u64| ((i % n) * size) as usize;
                    let (mut row, ops) = if pinned {
                        let mut ops = OpCounter::default();
                        let mut enq =
                            |i: u64| s.copy_to_device_at(&mut dst, off(i), &src, off(i), sz);
                        let bw = event_batches(params, &[&s], size as f64, &mut ops, &mut enq)?;
                        let lat = latency(params, &[&s], &mut ops, &mut enq)?;
                        (event_row(spec, size, size as f64, &bw, &lat), ops.0)
                    } else {
                        let mut ops = 0;
                        let t = wall_loop(
                            params,
                            size as f64,
                            |_| Ok(()),
                            |i| {
                                ops = i + 1;
                                s.copy_from_pageable(
                                    &mut dst,
                                    off(i),
                                    &pageable[off(i)..off(i) + sz],
                                )
                                .map_err(e)
                            },
                        )?;
                        let mut row = Row::new(spec, size);
                        fill_wall_row(&mut row, size as f64, &t);
                        (row, ops)
                    };
                    let tb = touched(size, w as u64, ops) as usize;
                    let bad = if params.verify {
                        Some(check_device(&s, &dst, &src.as_slice().map_err(e)?[..tb])?)
                    } else {
                        None
                    };
                    finish(&mut row, params, bad);
                    Ok(row)
                })();
                each(size, r, &[gpu]);
            }
        }
        Kind::ToHost { gpu, pinned } => {
            let c = cuda.context(gpu).map_err(e)?;
            let s = Stream::new(&c).map_err(e)?;
            let pat = pattern_buf(&c, w)?;
            let src = device_with_pattern(&c, &s, &pat)?;
            let mut dst_pinned = if pinned {
                Some(PinnedHostBuffer::new(&c, w).map_err(e)?)
            } else {
                None
            };
            let mut dst_vec: Vec<u8> = if pinned { Vec::new() } else { vec![0u8; w] };
            for &size in &params.sizes {
                let r = (|| {
                    let n = slots(size, w as u64);
                    let sz = size as usize;
                    let span = (n * size) as usize;
                    let off = |i: u64| ((i % n) * size) as usize;
                    let (mut row, ops) = if let Some(dst) = dst_pinned.as_mut() {
                        dst.as_mut_slice().map_err(e)?[..span].fill(POISON);
                        let mut ops = OpCounter::default();
                        let mut enq = |i: u64| s.copy_to_host_at(dst, off(i), &src, off(i), sz);
                        let bw = event_batches(params, &[&s], size as f64, &mut ops, &mut enq)?;
                        let lat = latency(params, &[&s], &mut ops, &mut enq)?;
                        (event_row(spec, size, size as f64, &bw, &lat), ops.0)
                    } else {
                        dst_vec[..span].fill(POISON);
                        let mut ops = 0;
                        let t = wall_loop(
                            params,
                            size as f64,
                            |_| Ok(()),
                            |i| {
                                ops = i + 1;
                                s.copy_to_pageable(&mut dst_vec[off(i)..off(i) + sz], &src, off(i))
                                    .map_err(e)
                            },
                        )?;
                        let mut row = Row::new(spec, size);
                        fill_wall_row(&mut row, size as f64, &t);
                        (row, ops)
                    };
                    let tb = touched(size, w as u64, ops) as usize;
                    let bad = if params.verify {
                        let want = &pat.as_slice().map_err(e)?[..tb];
                        Some(match dst_pinned.as_ref() {
                            Some(d) => compare(&d.as_slice().map_err(e)?[..tb], want),
                            None => compare(&dst_vec[..tb], want),
                        })
                    } else {
                        None
                    };
                    finish(&mut row, params, bad);
                    Ok(row)
                })();
                each(size, r, &[gpu]);
            }
        }
        Kind::P2p { src: a, dst: b } | Kind::Bidir { a, b } | Kind::Staged { src: a, dst: b } => {
            run_pair(cuda, spec, kind, a, b, params, w, &mut each)?;
        }
    }
    Ok(())
}

/// The two-GPU kinds.
#[allow(clippy::too_many_arguments)]
fn run_pair(
    cuda: &Cuda,
    spec: &CaseSpec,
    kind: Kind,
    a: u32,
    b: u32,
    params: &Params,
    w: usize,
    each: &mut RowSink<'_>,
) -> Result<(), BenchError> {
    let ca = cuda.context(a).map_err(e)?;
    let cb = cuda.context(b).map_err(e)?;
    let staged = matches!(kind, Kind::Staged { .. });
    if !staged {
        ca.enable_peer_access(&cb).map_err(e)?;
        cb.enable_peer_access(&ca).map_err(e)?;
    }
    let sa = Stream::new(&ca).map_err(e)?;
    let sb = Stream::new(&cb).map_err(e)?;
    let pat = pattern_buf(&ca, w)?;
    let src_a = device_with_pattern(&ca, &sa, &pat)?;
    let mut dst_b = DeviceBuffer::new(&cb, w).map_err(e)?;
    let bidir = matches!(kind, Kind::Bidir { .. });
    let (src_b, mut dst_a) = if bidir {
        (
            Some(device_with_pattern(&cb, &sb, &pat)?),
            Some(DeviceBuffer::new(&ca, w).map_err(e)?),
        )
    } else {
        (None, None)
    };
    let chunk = params.staged_chunk.clamp(4096, w as u64) as usize;
    let mut bounce = Vec::new();
    if staged {
        for _ in 0..STAGED_DEPTH {
            bounce.push(PinnedHostBuffer::new(&ca, chunk).map_err(e)?);
        }
    }
    for &size in &params.sizes {
        let r = (|| {
            poison(&sb, &mut dst_b)?;
            if let Some(d) = dst_a.as_mut() {
                poison(&sa, d)?;
            }
            let n = slots(size, w as u64);
            let sz = size as usize;
            let off = |i: u64| ((i % n) * size) as usize;
            let (mut row, ops) = if staged {
                let mut ops = 0;
                let t = wall_loop(
                    params,
                    size as f64,
                    |_| Ok(()),
                    |i| {
                        ops = i + 1;
                        let base = off(i);
                        let mut done = 0;
                        let mut k = 0;
                        while done < sz {
                            let len = chunk.min(sz - done);
                            let bb = &mut bounce[k % STAGED_DEPTH];
                            sa.copy_to_host_at(bb, 0, &src_a, base + done, len)
                                .map_err(e)?;
                            sb.copy_to_device_at(&mut dst_b, base + done, bb, 0, len)
                                .map_err(e)?;
                            done += len;
                            k += 1;
                        }
                        sb.synchronize().map_err(e)?;
                        sa.synchronize().map_err(e)
                    },
                )?;
                let mut row = Row::new(spec, size);
                fill_wall_row(&mut row, size as f64, &t);
                row.add_note(format!(
                    "gdx-sys pipeline: {} x {} KiB pinned bounce buffers, 2 streams, host clock",
                    STAGED_DEPTH,
                    chunk >> 10
                ));
                (row, ops)
            } else if let (Some(sbuf), Some(dbuf)) = (src_b.as_ref(), dst_a.as_mut()) {
                let mut ops = OpCounter::default();
                let mut enq = |i: u64| {
                    sa.copy_peer(&mut dst_b, off(i), &src_a, off(i), sz)?;
                    sb.copy_peer(dbuf, off(i), sbuf, off(i), sz)
                };
                let bytes = 2.0 * size as f64;
                let bw = event_batches(params, &[&sa, &sb], bytes, &mut ops, &mut enq)?;
                let lat = latency(params, &[&sa, &sb], &mut ops, &mut enq)?;
                (event_row(spec, size, bytes, &bw, &lat), ops.0)
            } else {
                let mut ops = OpCounter::default();
                let mut enq = |i: u64| sa.copy_peer(&mut dst_b, off(i), &src_a, off(i), sz);
                let bw = event_batches(params, &[&sa], size as f64, &mut ops, &mut enq)?;
                let lat = latency(params, &[&sa], &mut ops, &mut enq)?;
                (event_row(spec, size, size as f64, &bw, &lat), ops.0)
            };
            let tb = touched(size, w as u64, ops) as usize;
            let bad = if params.verify {
                let want = &pat.as_slice().map_err(e)?[..tb];
                let mut bad = check_device(&sb, &dst_b, want)?;
                if let Some(d) = dst_a.as_ref() {
                    bad = bad.or(check_device(&sa, d, want)?);
                }
                Some(bad)
            } else {
                None
            };
            finish(&mut row, params, bad);
            Ok(row)
        })();
        each(size, r, &[a, b]);
    }
    Ok(())
}
