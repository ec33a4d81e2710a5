//! GPU cases: host ↔ GPU on the copy engines (pinned and pageable), GPU ↔ GPU p2p for each
//! ordered pair and both directions at once, staged through pinned host memory, and ipc.
//!
//! The bodies ([`copy`]) use `gdx_sys::cuda` directly, because the engine's GPU paths were
//! being written alongside this crate. **Engine-based cases go here**: `ipc` needs a second
//! process importing an exported allocation (CUDA IPC) and is waived until the engine's
//! `LocalPeer::export_ipc` / `import_ipc` are used for it; `staged` is measured with a
//! gdx-sys pipeline of the same shape as the engine's (chunked, [`copy::STAGED_DEPTH`]
//! bounce buffers), and should switch to the engine's staged transfers to measure what
//! users get.
//!
//! Without a CUDA driver every case is waived with the loader's reason.

pub mod copy;
pub mod timing;

use crate::case::{BenchCase, CaseSpec, End, Params, PathKind, Waived};
use crate::report::Row;
use crate::Ctx;
use copy::Kind;

/// A GPU case: a spec and what it copies (`None` for ipc, not measurable yet).
struct GpuCase {
    spec: CaseSpec,
    kind: Option<Kind>,
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
        let cuda = ctx.cuda().map_err(|e| {
            Waived(format!(
                "no CUDA driver ({})",
                e.split(": tried").next().unwrap_or(&e)
            ))
        })?;
        let count = cuda.device_count().unwrap_or(0);
        for g in self.gpus() {
            if g >= count {
                return Err(Waived(format!(
                    "GPU{g} is not present ({count} CUDA device{})",
                    if count == 1 { "" } else { "s" }
                )));
            }
        }
        let Some(kind) = self.kind else {
            return Err(Waived(
                "ipc (a second process importing a CUDA IPC handle) is not wired into gdx bench yet; \
                 p2p measures the same link within one process"
                    .into(),
            ));
        };
        if let Kind::P2p { src: a, dst: b } | Kind::Bidir { a, b } = kind {
            match cuda.can_access_peer(a, b) {
                Ok(true) => {}
                Ok(false) => {
                    return Err(Waived(format!(
                        "GPU{a} cannot map GPU{b}'s memory (cuDeviceCanAccessPeer = 0): no p2p; staged is the path"
                    )))
                }
                Err(e) => return Err(Waived(format!("cannot ask about peer access: {e}"))),
            }
        }
        Ok(())
    }

    fn run(&self, ctx: &Ctx, params: &Params, sink: &mut dyn FnMut(Row)) -> Result<(), String> {
        match self.kind {
            Some(kind) => copy::run(ctx, &self.spec, kind, params, sink),
            None => Err("ipc is not measurable yet".into()),
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
    kind: Option<Kind>,
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
        kind,
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
                Some(Kind::ToGpu { gpu: g, pinned }),
            ));
            v.push(case(
                format!("gpu{g}_to_host_{mem}_ce"),
                format!("copy engine: GPU{g} → {mem} host memory (cuMemcpyDtoHAsync)"),
                path,
                End::Gpu(g),
                End::Host,
                false,
                Some(Kind::ToHost { gpu: g, pinned }),
            ));
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
                Some(Kind::P2p { src: a, dst: b }),
            ));
            if a < b {
                v.push(case(
                    format!("gpu{a}_gpu{b}_p2p_bidir"),
                    format!("copy engine: GPU{a} → GPU{b} and GPU{b} → GPU{a} at once; bandwidth is the total"),
                    PathKind::P2p,
                    End::Gpu(a),
                    End::Gpu(b),
                    true,
                    Some(Kind::Bidir { a, b }),
                ));
            }
            v.push(case(
                format!("gpu{a}_to_gpu{b}_staged"),
                format!("GPU{a} → pinned host bounce buffers → GPU{b}, chunked and pipelined on two streams"),
                PathKind::Staged,
                End::Gpu(a),
                End::Gpu(b),
                false,
                Some(Kind::Staged { src: a, dst: b }),
            ));
            v.push(case(
                format!("gpu{a}_to_gpu{b}_ipc"),
                format!("GPU{a} in this process → GPU{b} memory of a second process (CUDA IPC)"),
                PathKind::Ipc,
                End::Gpu(a),
                End::Gpu(b),
                false,
                None,
            ));
        }
    }
    v
}
