//! The microsecond cases, beside the copy-engine rows of the same run:
//!
//! - `host_to_gpu<g>_mailbox` / `gpu<g>_to_host_mailbox`: one op through gdx-sys's
//!   [`Mailbox`] (a persistent kernel polling mapped pinned host memory), timed on the host
//!   from the call to its completion (a write: the bytes are in device memory; a read: they
//!   are in host memory). Compare with `host_to_gpu<g>_pinned_ce` / `gpu<g>_to_host_pinned_ce`,
//!   whose latency is one copy plus `cuStreamSynchronize`.
//! - `gpu<g>_async_signal`: a kernel, then a device-to-host copy of the row's size, then
//!   `cuStreamWriteValue64` on a mapped word; the host spins on the word (GPUDirect Async: no
//!   `cuStreamSynchronize`). Timed from kernel done (the host sees the kernel's last store) to
//!   the host seeing the word; the launch is out of the figure. `gpu<g>_stream_sync` is the
//!   same work the usual way: kernel done, `cuStreamSynchronize`, copy, `cuStreamSynchronize`.
//! - Beside the mailbox rows, the floor of the same run ([`super::floor`]): one GPU
//!   thread answering a host ping through mapped memory, bare and with the op's device step.
//!
//! Sizes above what one mailbox op carries ([`MAX_PAYLOAD`]) are waived per size with the
//! reason. Without a GPU the cases are waived before anything is loaded (the PTX included).

use gdx_base::pattern::{fill_pattern, POISON};
use gdx_sys::cuda::mailbox::MAX_PAYLOAD;
use gdx_sys::cuda::{
    CudaError, DeviceBuffer, FloorStep, Mailbox, MailboxConfig, MappedHostBuffer, Module,
    PinnedHostBuffer, Signal, Stream, Word,
};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::copy::SEED;
use super::floor;
use crate::case::{CaseSpec, Params};
use crate::error::BenchError;
use crate::host::{compare, fill_wall_row, wall_loop, Timed};
use crate::report::{Row, Status};
use crate::Ctx;
use gdx_base::clock::wall;
use gdx_sys::timer::CpuClock;

/// What a microsecond case runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Micro {
    /// Host → GPU through the mailbox.
    MailboxToGpu,
    /// GPU → host through the mailbox.
    MailboxToHost,
    /// Kernel → copy → stream-written signal the host spins on.
    AsyncSignal,
    /// Kernel → `cuStreamSynchronize` → copy → `cuStreamSynchronize`.
    StreamSync,
}

fn e(err: CudaError) -> BenchError {
    BenchError::Cuda(err)
}

/// How long the host waits for one signal before calling the op lost.
const SIGNAL_TIMEOUT: Duration = Duration::from_secs(5);

/// Run every size of `micro` on GPU `gpu`.
pub fn run(
    ctx: &Ctx,
    spec: &CaseSpec,
    micro: Micro,
    gpu: u32,
    params: &Params,
    sink: &mut dyn FnMut(Row),
) -> Result<(), BenchError> {
    let cuda = ctx.cuda().map_err(|u| BenchError::Unavailable(u.clone()))?;
    let c = cuda.context(gpu).map_err(e)?;
    let w = MAX_PAYLOAD;
    let mut pattern = vec![0u8; w];
    fill_pattern(&mut pattern, SEED);
    let stream = Stream::new(&c).map_err(e)?;
    let mut dev = DeviceBuffer::new(&c, w).map_err(e)?;
    // Kernels first: loading one while a persistent kernel runs may wait for it (CUDA's lazy
    // loading synchronises the context).
    let module = Some(Module::gdx_kernels(&c).map_err(e)?);
    // The mailbox rows' reference, measured before the mailbox starts (two persistent kernels
    // would compete for the bus): one GPU thread answering a host ping, bare and with the
    // op's device step.
    let floor = match (micro, &module) {
        (Micro::MailboxToGpu, Some(m)) => Some(Floor::measure(&c, m, FloorStep::StoreFenceSystem)?),
        (Micro::MailboxToHost, Some(m)) => Some(Floor::measure(&c, m, FloorStep::Load)?),
        _ => None,
    };
    let mailbox = match micro {
        Micro::MailboxToGpu | Micro::MailboxToHost => {
            Some(Mailbox::start(&c, MailboxConfig::default()).map_err(e)?)
        }
        _ => None,
    };
    for &size in &params.sizes {
        if size as usize > w {
            let mut row = Row::new(spec, size);
            row.status = Status::Waived;
            row.add_note(format!(
                "above {MAX_PAYLOAD} bytes, what one mailbox op carries (a latency case)"
            ));
            sink(row);
            continue;
        }
        let n = size as usize;
        let r = (|| -> Result<Row, BenchError> {
            let mut row = Row::new(spec, size);
            let bad = match (micro, &mailbox, &module) {
                (Micro::MailboxToGpu, Some(mb), _) => {
                    stream
                        .copy_from_pageable(&mut dev, 0, &vec![POISON; w])
                        .map_err(e)?;
                    let t = wall_loop(
                        params,
                        size as f64,
                        |_| Ok(()),
                        |_| mb.write(&dev, 0, &pattern[..n]).map_err(e),
                    )?;
                    fill_wall_row(&mut row, size as f64, &t);
                    let mut got = vec![0u8; n];
                    stream.copy_to_pageable(&mut got, &dev, 0).map_err(e)?;
                    compare(&got, &pattern[..n])
                }
                (Micro::MailboxToHost, Some(mb), _) => {
                    stream
                        .copy_from_pageable(&mut dev, 0, &pattern)
                        .map_err(e)?;
                    let mut out = vec![POISON; n];
                    let t = wall_loop(
                        params,
                        size as f64,
                        |_| Ok(()),
                        |_| mb.read(&dev, 0, &mut out).map_err(e),
                    )?;
                    fill_wall_row(&mut row, size as f64, &t);
                    compare(&out, &pattern[..n])
                }
                (Micro::AsyncSignal | Micro::StreamSync, _, Some(m)) => signal_case(
                    &c, &stream, m, &mut dev, &pattern, micro, n, params, &mut row,
                )?,
                _ => {
                    return Err(BenchError::Cuda(CudaError::InvalidArgument {
                        call: "bench mailbox case",
                        reason: "set-up missing (a bug)".to_string(),
                    }))
                }
            };
            if params.verify {
                row.verified = Some(bad.is_none() && row.verified != Some(false));
                if let Some(m) = bad {
                    row.add_note(m.to_string());
                }
            }
            if let Some(mb) = &mailbox {
                row.add_note(format!(
                    "{} SM reserved by the mailbox kernel; host spins {:?} then yields",
                    mb.sms_reserved(),
                    gdx_sys::cuda::mailbox::SPIN
                ));
            }
            if let (Some(f), Some(p50)) = (&floor, row.lat_p50_us) {
                row.add_note(f.beside(p50));
            }
            Ok(row)
        })();
        let mut row = r.unwrap_or_else(|m| Row::failed(spec, size, m.chain()));
        row.gpu_util_pct = ctx.gpu_util_pct(&[gpu]);
        sink(row);
    }
    if let Some(mb) = mailbox {
        mb.stop().map_err(e)?;
    }
    Ok(())
}

/// Round trips per floor measurement.
const FLOOR_ROUNDS: usize = 5_000;

/// The same-run floor beside a mailbox row: p50 of the bare GPU-polled round trip and of the
/// one with the op's device step.
struct Floor {
    bare_us: f64,
    step: FloorStep,
    step_us: f64,
}

impl Floor {
    fn measure(
        c: &gdx_sys::cuda::Context,
        m: &Module,
        step: FloorStep,
    ) -> Result<Floor, BenchError> {
        let p50 = |s: FloorStep| -> Result<f64, BenchError> {
            let us: Vec<f64> = floor::round_trips(c, m, s, 0, FLOOR_ROUNDS)?
                .iter()
                .map(|d| d.as_secs_f64() * 1e6)
                .collect();
            Ok(gdx_base::stats::Summary::of(&us).map_or(f64::NAN, |s| s.median))
        };
        Ok(Floor {
            bare_us: p50(FloorStep::Bare)?,
            step,
            step_us: p50(step)?,
        })
    }

    fn beside(&self, p50_us: f64) -> String {
        format!(
            "floor (same run, one GPU thread answering a host ping through mapped memory): bare \
             {:.2} µs, with {} {:.2} µs; this row p50 = {:.2}× the bare floor, {:.2}× the one \
             with its device step",
            self.bare_us,
            self.step.name(),
            self.step_us,
            p50_us / self.bare_us,
            p50_us / self.step_us
        )
    }
}

/// How long the marker kernel spins before its store: long enough that the host has queued
/// everything behind it (the copy, the signal) before it ends, so launch and enqueue costs,
/// the same for both ways, stay out of the figure.
const SPIN_AHEAD: Duration = Duration::from_micros(30);

/// The signal cases, timed from "kernel done" (the host sees the marker kernel's last store)
/// to the host knowing the `n`-byte copy behind it landed in pinned host memory: through a
/// stream-written signal the host spins on (queued before the kernel ended), or the usual way
/// (`cuStreamSynchronize`, then the copy, then `cuStreamSynchronize`).
#[allow(clippy::too_many_arguments)]
fn signal_case(
    c: &gdx_sys::cuda::Context,
    stream: &Stream,
    module: &Module,
    dev: &mut DeviceBuffer,
    pattern: &[u8],
    micro: Micro,
    n: usize,
    params: &Params,
    row: &mut Row,
) -> Result<Option<crate::error::Mismatch>, BenchError> {
    let marker = MappedHostBuffer::new(c, 8).map_err(e)?;
    let signal = Signal::new(c).map_err(e)?;
    let mut host = PinnedHostBuffer::new(c, n).map_err(e)?;
    stream.copy_from_pageable(dev, 0, pattern).map_err(e)?;
    let lost = |what: &str| {
        BenchError::Cuda(CudaError::InvalidArgument {
            call: "cuStreamWriteValue64_v2",
            reason: format!("{what} not seen within {SIGNAL_TIMEOUT:?}"),
        })
    };
    let mut last = 0u64;
    let mut one = || -> Result<Duration, BenchError> {
        last += 1;
        stream
            .launch_marker(module, Word::Mapped(&marker, 0), last, SPIN_AHEAD)
            .map_err(e)?;
        let ticket = if micro == Micro::AsyncSignal {
            stream.copy_to_host_at(&mut host, 0, dev, 0, n).map_err(e)?;
            Some(signal.arm(stream).map_err(e)?)
        } else {
            None
        };
        let word = marker.word(0).ok_or_else(|| lost("marker word"))?;
        let waiting = Instant::now();
        while word.load(Ordering::Acquire) != last {
            if waiting.elapsed() > SIGNAL_TIMEOUT {
                return Err(lost(&format!("marker {last}")));
            }
            std::hint::spin_loop();
        }
        // Timed from the marker's release: what is left is how the host learns of the copy.
        let (done, d) = wall(|| -> Result<(), BenchError> {
            match ticket {
                Some(t) if !signal.wait(t, SIGNAL_TIMEOUT) => {
                    return Err(lost(&format!("signal {t}")))
                }
                Some(_) => {}
                None => {
                    stream.synchronize().map_err(e)?;
                    stream.copy_to_host_at(&mut host, 0, dev, 0, n).map_err(e)?;
                    stream.synchronize().map_err(e)?;
                }
            }
            Ok(())
        });
        done.map(|()| d)
    };
    let mut est = Duration::MAX;
    for _ in 0..params.warmup.max(1) {
        est = est.min(one()?);
    }
    let iters = params.plan_iters(est + SPIN_AHEAD);
    let cpu = CpuClock::now();
    let samples = (0..iters).map(|_| one()).collect::<Result<Vec<_>, _>>()?;
    let t = Timed {
        cpu_s_per_gb: cpu.per_gb_since(n as f64 * f64::from(iters)),
        samples,
        warmed: 0,
    };
    fill_wall_row(row, n as f64, &t);
    stream.synchronize().map_err(e)?;
    row.add_note(match micro {
        Micro::AsyncSignal => {
            "from kernel done (its last store seen by the host) → copy → cuStreamWriteValue64 seen; \
             launch and enqueue excluded (the kernel spins 30 µs first)"
        }
        _ => "from kernel done (its last store seen by the host) → cuStreamSynchronize → copy → cuStreamSynchronize",
    });
    Ok(compare(host.as_slice().map_err(e)?, &pattern[..n]))
}
