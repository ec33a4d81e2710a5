//! The microsecond cases, beside the copy-engine rows of the same run:
//!
//! - `host_to_gpu<g>_mailbox` / `gpu<g>_to_host_mailbox`: one op through gdx-sys's
//!   [`Mailbox`] (a persistent kernel polling mapped pinned host memory), timed on the host
//!   from the call to its completion (a write: the bytes are in device memory; a read: they
//!   are in host memory). Compare with `host_to_gpu<g>_pinned_ce` / `gpu<g>_to_host_pinned_ce`,
//!   whose latency is one copy plus `cuStreamSynchronize`.
//! - `gpu<g>_async_signal`: a kernel, then a device-to-host copy of the row's size, then
//!   `cuStreamWriteValue64` on a mapped word; the host spins on the word (GPUDirect Async: no
//!   `cuStreamSynchronize`). Timed from the launch to the host seeing the word.
//!   `gpu<g>_stream_sync` is the same work the usual way: launch, `cuStreamSynchronize`, copy,
//!   `cuStreamSynchronize`.
//!
//! Sizes above what one mailbox op carries ([`MAX_PAYLOAD`]) are waived per size with the
//! reason. Without a GPU the cases are waived before anything is loaded (the PTX included).

use gdx_sys::cuda::mailbox::MAX_PAYLOAD;
use gdx_sys::cuda::probe::{fill_pattern, POISON};
use gdx_sys::cuda::{
    CudaError, DeviceBuffer, Mailbox, MailboxConfig, MappedHostBuffer, Module, PinnedHostBuffer,
    Signal, Stream, Word,
};
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::copy::SEED;
use crate::case::{CaseSpec, Params};
use crate::error::BenchError;
use crate::host::{compare, fill_wall_row, wall_loop};
use crate::report::{Row, Status};
use crate::Ctx;

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
    let module = match micro {
        Micro::AsyncSignal | Micro::StreamSync => Some(Module::gdx_kernels(&c).map_err(e)?),
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

/// The signal cases: a marker kernel, an `n`-byte copy to pinned host memory, then either a
/// stream-written signal the host spins on, or two `cuStreamSynchronize`s.
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
    let mut last = 0u64;
    let t = wall_loop(
        params,
        n as f64,
        |_| Ok(()),
        |i| {
            last = i + 1;
            stream
                .launch_marker(module, Word::Mapped(&marker, 0), last, Duration::ZERO)
                .map_err(e)?;
            if micro == Micro::StreamSync {
                stream.synchronize().map_err(e)?;
            }
            stream.copy_to_host_at(&mut host, 0, dev, 0, n).map_err(e)?;
            if micro == Micro::StreamSync {
                return stream.synchronize().map_err(e);
            }
            let ticket = signal.arm(stream).map_err(e)?;
            if !signal.wait(ticket, SIGNAL_TIMEOUT) {
                return Err(BenchError::Cuda(CudaError::InvalidArgument {
                    call: "cuStreamWriteValue64_v2",
                    reason: format!("signal {ticket} not seen within {SIGNAL_TIMEOUT:?}"),
                }));
            }
            Ok(())
        },
    )?;
    fill_wall_row(row, n as f64, &t);
    stream.synchronize().map_err(e)?;
    let seen = marker
        .word(0)
        .map(|w| w.load(Ordering::Acquire))
        .unwrap_or(0);
    if seen != last {
        row.add_note(format!("marker {seen} after the last kernel, want {last}"));
        row.verified = Some(false);
    }
    row.add_note(match micro {
        Micro::AsyncSignal => "kernel → copy → cuStreamWriteValue64; host spins on the mapped word",
        _ => "kernel → cuStreamSynchronize → copy → cuStreamSynchronize",
    });
    Ok(compare(host.as_slice().map_err(e)?, &pattern[..n]))
}
