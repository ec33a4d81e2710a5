//! GPU cases: host ↔ GPU on the copy engines (pinned and pageable), GPU ↔ GPU p2p for each
//! ordered pair and both directions at once, staged through pinned host memory, and ipc.
//!
//! The copy-engine and p2p bodies ([`copy`]) use `gdx_sys::cuda` directly. The staged and ipc
//! cases go through the engine ([`engine`]): `staged` is the engine's staged transfer
//! (`LocalPeer` with staged forced), so the figure is what users get; `ipc` starts a second
//! process ([`ipc`]: `gdx bench --ipc-child`) that exports GPU B memory, imports it here and
//! copies GPU A → that memory. Both are timed like p2p (device events around batches).
//!
//! Without a CUDA driver every case is waived with one shared reason ([`Ctx::require_gpus`]),
//! which the runner reports once for all of them.

pub mod copy;
pub mod engine;
pub mod floor;
pub mod ipc;
pub mod mailbox;
pub mod timing;

use crate::case::{BenchCase, CaseSpec, End, Params, PathKind, Waived};
use crate::error::BenchError;
use crate::report::Row;
use crate::Ctx;
use copy::Kind;

/// What a GPU case runs.
#[derive(Debug, Clone, Copy)]
enum Body {
    /// A gdx-sys body ([`copy::run`]).
    Copy(Kind),
    /// The engine's staged transfer from GPU `src` to GPU `dst` ([`engine::run_staged`]).
    Staged { src: u32, dst: u32 },
    /// GPU `src` here → GPU `dst` memory of a second process ([`engine::run_ipc`]).
    Ipc { src: u32, dst: u32 },
    /// A microsecond case on one GPU ([`mailbox::run`]).
    Micro { micro: mailbox::Micro, gpu: u32 },
}

/// A GPU case: a spec and what it runs.
struct GpuCase {
    spec: CaseSpec,
    body: Body,
}

impl GpuCase {
    fn gpus(&self) -> Vec<u32> {
        [&self.spec.src, &self.spec.dst]
            .iter()
            .filter_map(|e| match e {
                End::Gpu(n) => Some(*n),
                _ => None,
            })
            .collect()
    }
}

impl BenchCase for GpuCase {
    fn spec(&self) -> &CaseSpec {
        &self.spec
    }

    fn applicable(&self, ctx: &Ctx) -> Result<(), Waived> {
        let cuda = ctx.require_gpus(&self.gpus())?;
        let peer = match self.body {
            Body::Copy(Kind::P2p { src: a, dst: b } | Kind::Bidir { a, b })
            | Body::Ipc { src: a, dst: b } => Some((a, b)),
            _ => None,
        };
        if let Some((a, b)) = peer {
            match cuda.can_access_peer(a, b) {
                Ok(true) => {}
                Ok(false) => {
                    return Err(Waived::new(format!(
                        "GPU{a} cannot map GPU{b}'s memory (cuDeviceCanAccessPeer = 0): no p2p; staged is the path"
                    )))
                }
                Err(e) => return Err(Waived::new(format!("cannot ask about peer access: {e}"))),
            }
        }
        Ok(())
    }

    fn run(&self, ctx: &Ctx, params: &Params, sink: &mut dyn FnMut(Row)) -> Result<(), BenchError> {
        match self.body {
            Body::Copy(kind) => copy::run(ctx, &self.spec, kind, params, sink),
            Body::Staged { src, dst } => {
                engine::run_staged(ctx, &self.spec, src, dst, params, sink)
            }
            Body::Ipc { src, dst } => engine::run_ipc(ctx, &self.spec, src, dst, params, sink),
            Body::Micro { micro, gpu } => mailbox::run(ctx, &self.spec, micro, gpu, params, sink),
        }
    }
}

fn case(
    key: String,
    description: String,
    path: PathKind,
    src: End,
    dst: End,
    bidir: bool,
    body: Body,
) -> Box<dyn BenchCase> {
    Box::new(GpuCase {
        spec: CaseSpec {
            key,
            description,
            path,
            src,
            dst,
            bidir,
        },
        body,
    })
}

/// The GPU cases for GPUs `0..n`.
pub fn cases(n: u32) -> Vec<Box<dyn BenchCase>> {
    let mut v = Vec::new();
    for g in 0..n {
        for pinned in [true, false] {
            let (mem, path) = if pinned {
                ("pinned", PathKind::PinnedCe)
            } else {
                ("pageable", PathKind::PageableCe)
            };
            v.push(case(
                format!("host_to_gpu{g}_{mem}_ce"),
                format!("copy engine: {mem} host memory → GPU{g} (cuMemcpyHtoDAsync)"),
                path,
                End::Host,
                End::Gpu(g),
                false,
                Body::Copy(Kind::ToGpu { gpu: g, pinned }),
            ));
            v.push(case(
                format!("gpu{g}_to_host_{mem}_ce"),
                format!("copy engine: GPU{g} → {mem} host memory (cuMemcpyDtoHAsync)"),
                path,
                End::Gpu(g),
                End::Host,
                false,
                Body::Copy(Kind::ToHost { gpu: g, pinned }),
            ));
        }
        use mailbox::Micro;
        for (key, what, micro, src, dst) in [
            (format!("host_to_gpu{g}_mailbox"), format!("mailbox: pinned host → GPU{g} through a persistent kernel polling mapped host memory, until the bytes are in device memory (1 SM reserved)"), Micro::MailboxToGpu, End::Host, End::Gpu(g)),
            (format!("gpu{g}_to_host_mailbox"), format!("mailbox: GPU{g} → host through a persistent kernel answering in mapped host memory (1 SM reserved)"), Micro::MailboxToHost, End::Gpu(g), End::Host),
            (format!("gpu{g}_async_signal"), format!("GPUDirect Async: kernel on GPU{g} → copy to pinned host → cuStreamWriteValue64; from kernel done (its last store seen) until the host sees the word"), Micro::AsyncSignal, End::Gpu(g), End::Host),
            (format!("gpu{g}_stream_sync"), format!("the same work the usual way on GPU{g}: from kernel done → cuStreamSynchronize → copy → cuStreamSynchronize"), Micro::StreamSync, End::Gpu(g), End::Host),
        ] {
            let path = if matches!(micro, Micro::MailboxToGpu | Micro::MailboxToHost) {
                PathKind::Mailbox
            } else {
                PathKind::Signal
            };
            v.push(case(key, what, path, src, dst, false, Body::Micro { micro, gpu: g }));
        }
    }
    for a in 0..n {
        for b in 0..n {
            if a == b {
                continue;
            }
            v.push(case(
                format!("gpu{a}_to_gpu{b}_p2p"),
                format!("copy engine: GPU{a} → GPU{b} over the peer link (cuMemcpyPeerAsync on GPU{a}'s stream)"),
                PathKind::P2p,
                End::Gpu(a),
                End::Gpu(b),
                false,
                Body::Copy(Kind::P2p { src: a, dst: b }),
            ));
            if a < b {
                v.push(case(
                    format!("gpu{a}_gpu{b}_p2p_bidir"),
                    format!("copy engine: GPU{a} → GPU{b} and GPU{b} → GPU{a} at once; bandwidth is the total"),
                    PathKind::P2p,
                    End::Gpu(a),
                    End::Gpu(b),
                    true,
                    Body::Copy(Kind::Bidir { a, b }),
                ));
            }
            v.push(case(
                format!("gpu{a}_to_gpu{b}_staged"),
                format!("engine staged transfer (staged forced): GPU{a} → pinned host bounce buffers → GPU{b}, chunked and pipelined"),
                PathKind::Staged,
                End::Gpu(a),
                End::Gpu(b),
                false,
                Body::Staged { src: a, dst: b },
            ));
            v.push(case(
                format!("gpu{a}_to_gpu{b}_ipc"),
                format!("engine ipc: GPU{a} in this process → GPU{b} memory exported by a second process it starts (CUDA IPC)"),
                PathKind::Ipc,
                End::Gpu(a),
                End::Gpu(b),
                false,
                Body::Ipc { src: a, dst: b },
            ));
        }
    }
    v
}
