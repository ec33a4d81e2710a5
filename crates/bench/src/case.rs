//! One bench case is one small unit (nvbandwidth's testcase): a [`CaseSpec`] saying what it
//! moves where, [`BenchCase::applicable`] saying whether it can run here (or [`Waived`] with
//! the reason), and [`BenchCase::run`] measuring every requested size and handing each
//! [`Row`] to a sink as soon as it is measured, so a later failure keeps the earlier rows.
//!
//! Invariant: a case never panics on purpose and never aborts the run; every failure is a
//! [`BenchError`] (the library's error kept as its source), which the runner records as that
//! case's error.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::BenchError;
use crate::report::Row;
use crate::Ctx;

/// Which path a case measures (the `path` field of a result).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PathKind {
    /// Single-thread host `memcpy` between two buffers (a baseline, not a transport).
    Memcpy,
    /// Copy engine between pinned host memory and a GPU.
    PinnedCe,
    /// Copy engine between pageable host memory and a GPU (the driver stages it).
    PageableCe,
    /// Copy engine between two GPUs over their direct link (peer access enabled).
    P2p,
    /// GPU → pinned host bounce buffers → GPU, chunked and pipelined.
    Staged,
    /// Like p2p, across two processes (CUDA IPC).
    Ipc,
    /// Same-host shared memory between two agents.
    Shm,
    /// Kernel TCP between two agents.
    Tcp,
    /// The deterministic mock backend (tests only).
    Mock,
    /// Between a file and GPU or host memory through `gdx-storage` (`gds`, `file-staged`, the
    /// naive baseline; the key says which). Opt-in: `--path file`.
    File,
    /// RDMA WRITE or READ through `gdx-rdma`, host or GPU memory on either side, against
    /// `gdx serve --rdma-listen` or a loopback server in this process. Opt-in: `--path rdma`.
    Rdma,
    /// One-sided RMA through libfabric (the engine's fabric transport) between two agents,
    /// over the provider `--provider` names or the automatic choice. Opt-in: `--path fabric`.
    Fabric,
    /// The mailbox: a persistent kernel polling mapped pinned host memory moves small payloads
    /// host ↔ GPU (one SM reserved while it runs).
    Mailbox,
    /// Stream-ordered signalling: a kernel, then a copy, then a stream memory operation the
    /// host sees (GPUDirect Async), or the `cuStreamSynchronize` way it is compared with.
    Signal,
}

impl PathKind {
    /// The name used in keys, tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            PathKind::Memcpy => "memcpy",
            PathKind::PinnedCe => "pinned-ce",
            PathKind::PageableCe => "pageable-ce",
            PathKind::P2p => "p2p",
            PathKind::Staged => "staged",
            PathKind::Ipc => "ipc",
            PathKind::Shm => "shm",
            PathKind::Tcp => "tcp",
            PathKind::Mock => "mock",
            PathKind::File => "file",
            PathKind::Rdma => "rdma",
            PathKind::Fabric => "fabric",
            PathKind::Mailbox => "mailbox",
            PathKind::Signal => "signal",
        }
    }
}

impl fmt::Display for PathKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One end of a transfer.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum End {
    /// Host memory of this process (or of the loopback agent).
    Host,
    /// The GPU with this CUDA ordinal.
    Gpu(u32),
    /// Host memory of a `gdx serve` agent at this address.
    Remote(String),
    /// GPU memory (this CUDA ordinal there) of a `gdx serve` at this address (rdma cases).
    RemoteGpu(String, u32),
    /// A scratch file (`gdx bench --path file`).
    File,
}

impl End {
    /// `host`, `gpu0`, `remote:HOST:PORT`, `remote:HOST:PORT/gpu0`: the spelling used in the
    /// `src`/`dst` fields.
    pub fn name(&self) -> String {
        match self {
            End::Host => "host".into(),
            End::Gpu(n) => format!("gpu{n}"),
            End::Remote(a) => format!("remote:{a}"),
            End::RemoteGpu(a, n) => format!("remote:{a}/gpu{n}"),
            End::File => "file".into(),
        }
    }

    /// The topology label (`GPU0`), for GPUs.
    pub fn topo_label(&self) -> Option<String> {
        match self {
            End::Gpu(n) => Some(format!("GPU{n}")),
            _ => None,
        }
    }
}

/// What a case measures. Keys follow nvbandwidth: `<src>_to_<dst>_<transport>[_bidir]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaseSpec {
    /// Stable key, e.g. `gpu0_to_gpu1_p2p`.
    pub key: String,
    /// One line: what is measured, which direction, what is only interference.
    pub description: String,
    /// The path.
    pub path: PathKind,
    /// Source.
    pub src: End,
    /// Destination.
    pub dst: End,
    /// Both directions at once (bandwidth is the sum of both).
    pub bidir: bool,
}

#[cfg(test)]
impl CaseSpec {
    /// A one-way spec with no description, for tests.
    pub(crate) fn bare(key: &str, path: PathKind, src: End, dst: End) -> CaseSpec {
        CaseSpec {
            key: key.into(),
            description: String::new(),
            path,
            src,
            dst,
            bidir: false,
        }
    }
}

/// Why a case cannot run here. The reason is shown to the user.
///
/// A waiver with a [`Cause`] is one many cases share (no CUDA driver, GPU5 missing, no RDMA
/// device): the runner reports those cases as one [`crate::WaivedGroup`] line instead of one
/// line per case, so a machine without a GPU does not print fifteen invented GPU cases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waived {
    /// The reason, in words.
    pub reason: String,
    /// The shared cause, when the reason is not particular to this case.
    pub cause: Option<Cause>,
}

/// A reason shared by every case of a scope ("GPU cases: no CUDA driver").
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Cause {
    /// Which cases it stops: `GPU cases`, `GPU1 cases`, `RDMA cases`.
    pub scope: String,
    /// Why, short: `no CUDA driver`.
    pub reason: String,
    /// The loader's or discovery's full message, given once.
    pub detail: Option<String>,
    /// What to do about it.
    pub fix: Option<String>,
}

impl Waived {
    /// A waiver particular to one case.
    pub fn new(reason: impl Into<String>) -> Waived {
        Waived {
            reason: reason.into(),
            cause: None,
        }
    }

    /// A waiver shared by every case `cause` names.
    pub fn shared(cause: Cause) -> Waived {
        Waived {
            reason: cause.one_line(),
            cause: Some(cause),
        }
    }
}

impl Cause {
    /// `no CUDA driver (libcuda.so.1 could not be loaded; install the NVIDIA driver)`.
    pub fn one_line(&self) -> String {
        match &self.fix {
            Some(fix) => format!("{}; {fix}", self.reason),
            None => self.reason.clone(),
        }
    }
}

impl fmt::Display for Waived {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

/// The measurement protocol's knobs (see `docs/bench/README.md`, "Method").
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// Transfer sizes in bytes, ascending.
    pub sizes: Vec<u64>,
    /// Untimed runs before the timed loop, per size.
    pub warmup: u32,
    /// Target duration of the timed loop, per size (the iteration count follows from it).
    pub duration: Duration,
    /// Fewest timed samples per size.
    pub min_samples: u32,
    /// Most timed samples per size (and most latency samples).
    pub max_samples: u32,
    /// A fixed iteration count instead of `duration` (still within the bounds above).
    pub iters: Option<u32>,
    /// Check the destination against the source after the timed loop.
    pub verify: bool,
    /// Chunk of the staged pipeline in bytes.
    pub staged_chunk: u64,
    /// Ops per transfer in the host shm/tcp cases (`--batch`): each transfer carries this many
    /// ops of the row's size, and Mop/s counts ops.
    pub batch: u32,
    /// Transfers in flight at once in the host shm/tcp cases (`--window`): each timed
    /// iteration submits this many transfers, then waits for all of them; Mop/s counts ops.
    pub window: u32,
    /// Host shm/tcp cases (`--prepared`): each transfer is prepared once
    /// (`Peer::prepare`) and posted again, instead of built and submitted afresh.
    pub prepared: bool,
}

/// The default sweep: 8 B to 1 GiB in steps of ×4, plus 1 GiB.
pub fn default_sizes() -> Vec<u64> {
    let mut v: Vec<u64> = (0..14).map(|i| 8u64 << (2 * i)).collect();
    v.push(1 << 30);
    v
}

/// Bytes the buffers rotate over for sizes below it, so caches cannot serve repeats.
pub const ROTATE_BYTES: u64 = 256 << 20;

impl Default for Params {
    fn default() -> Self {
        Params {
            sizes: default_sizes(),
            warmup: 2,
            duration: Duration::from_millis(200),
            min_samples: 3,
            max_samples: 1000,
            iters: None,
            verify: true,
            staged_chunk: 16 << 20,
            batch: 1,
            window: 1,
            prepared: false,
        }
    }
}

impl Params {
    /// The largest size requested (0 when none).
    pub fn max_size(&self) -> u64 {
        self.sizes.iter().copied().max().unwrap_or(0)
    }

    /// How many timed iterations to run when one takes about `per_op`: `iters` when fixed,
    /// else what fits in `duration`, within `min_samples..=max_samples`.
    pub fn plan_iters(&self, per_op: Duration) -> u32 {
        let lo = self.min_samples.max(1);
        let hi = self.max_samples.max(lo);
        if let Some(n) = self.iters {
            return n.clamp(lo, hi);
        }
        let per = per_op.as_secs_f64().max(1e-7);
        let n = (self.duration.as_secs_f64() / per).floor();
        (n.min(f64::from(hi)) as u32).clamp(lo, hi)
    }
}

/// A benchmark case (see the module docs).
pub trait BenchCase: Send + Sync {
    /// What it measures.
    fn spec(&self) -> &CaseSpec;

    /// `Ok` when it can run here, else the reason it is waived.
    ///
    /// # Errors
    /// [`Waived`] with a reason the user can act on.
    fn applicable(&self, ctx: &Ctx) -> Result<(), Waived>;

    /// Measure every size in `params`, giving each row to `sink` as soon as it is measured.
    ///
    /// # Errors
    /// The failure that stopped the case; rows already given stay.
    fn run(&self, ctx: &Ctx, params: &Params, sink: &mut dyn FnMut(Row)) -> Result<(), BenchError>;

    /// Whether the case runs only when asked for by name (see [`crate::select`]): `false` by
    /// default; the file cases, which write large scratch files, and the rdma cases, which
    /// need a device and run long on a software one, say `true`.
    fn opt_in(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_sizes_span_8_bytes_to_1_gib() {
        let s = default_sizes();
        assert_eq!(s.first(), Some(&8));
        assert_eq!(s.last(), Some(&(1 << 30)));
        assert!(s.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn iterations_follow_the_duration_within_bounds() {
        let p = Params::default();
        assert_eq!(p.plan_iters(Duration::from_millis(100)), 3);
        assert_eq!(p.plan_iters(Duration::from_nanos(1)), 1000);
        assert_eq!(p.plan_iters(Duration::from_millis(1)), 200);
        let fixed = Params {
            iters: Some(7),
            ..Params::default()
        };
        assert_eq!(fixed.plan_iters(Duration::from_secs(1)), 7);
    }
}
