//! [`LocalPeer`]: copies between this process's GPUs and pinned host memory, and into GPU
//! regions imported from other processes on the host — p2p, ipc, staged, host↔GPU — each with
//! a [`Plan`] saying which path and why.
//!
//! CUDA is loaded at run time (`gdx_sys::cuda`): [`LocalPeer::open`] returns
//! [`Error::Unavailable`] on a machine without a driver or GPU, never a panic.
//!
//! Invariants:
//! - Per GPU: one retained primary context and one copy stream, created on first use. Peer access
//!   between two GPUs is enabled once, both ways, on first use of the pair; the outcome is kept.
//! - Copies are submitted on the caller's thread (no worker thread); completion is an event
//!   ([`LocalTransfer::wait`]) or a stream synchronisation ([`LocalPeer::copy_blocking`]).
//! - Nothing falls back silently: every op is planned first ([`crate::routing::planner`]) and runs on the
//!   planned path or fails.

mod batch;
mod exec;
mod file;
mod mailbox;
mod region;
mod share;
mod stage;

pub use batch::Span;
pub(crate) use batch::BATCH_SPAN_MAX;
pub use exec::{LocalTransfer, Ordering, StagedTuning};
pub use region::{DeviceOrigin, DeviceRegion, IpcDesc, Mem, PinnedRegion};
pub use share::IpcStats;
pub(crate) use stage::{copy_span, AgentGpu, Dir, Stager, Ticket, DEPTH};

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use gdx_sys::cuda::{Context, Cuda, DeviceBuffer, Event, PinnedHostBuffer, PoolAccess, Stream};

use crate::error::{Error, Result};
use crate::routing::calibration::Calibration;
use crate::routing::plan::Plan;
use crate::routing::planner::{self, EndFacts, GpuLink, OpFacts, PeerStatus, Policy};
use region::{DeviceInner, PinnedInner};

/// Per-GPU state: context and the copy stream.
pub(crate) struct Gpu {
    pub(crate) ctx: Context,
    pub(crate) stream: Stream,
    /// Extra streams for split p2p copies, created on demand.
    pub(crate) helpers: Mutex<Vec<Arc<Stream>>>,
    /// Completion events, reused.
    pub(crate) events: Mutex<Vec<Event>>,
    /// The batched copy kernel (`LocalPeer::transfer_batch`), loaded on first use.
    pub(crate) batch: Mutex<Option<gdx_sys::cuda::BatchCopy>>,
}

pub(crate) struct Shared {
    pub(crate) cuda: Cuda,
    pub(crate) count: u32,
    pub(crate) gpus: Vec<OnceLock<std::result::Result<Arc<Gpu>, Error>>>,
    pub(crate) policy: Policy,
    pub(crate) calibration: Calibration,
    topo: OnceLock<Option<gdx_topo::Topology>>,
    links: Mutex<HashMap<(u32, u32), GpuLink>>,
    next_id: AtomicU64,
    /// Mappings of other processes' allocations, one per allocation
    /// ([`IpcDesc`]'s import key), alive while any region or connection holds
    /// one.
    imports: Mutex<HashMap<(u32, String), Weak<DeviceInner>>>,
    /// How many times an allocation of another process was opened (`cuIpcOpenMemHandle` or an
    /// fd import): a caller that sees it grow per transfer has found a leak.
    ipc_opened: AtomicU64,
    /// Pinned bounce buffers of the staged path (taken while a transfer is queued).
    pub(crate) bounce: Mutex<Vec<PinnedHostBuffer>>,
    pub(crate) plans: Mutex<HashMap<PlanKey, Plan>>,
    /// The last plan looked up, for tight loops over one route.
    pub(crate) last_plan: Mutex<Option<(PlanKey, Plan)>>,
    /// Running mailboxes, by GPU ([`LocalPeer::start_mailbox`]).
    pub(crate) mailboxes: Mutex<HashMap<u32, Arc<gdx_sys::cuda::Mailbox>>>,
}

/// What a cached plan depends on: both ends (kind and region id) and the size bucket.
pub(crate) type PlanKey = ((bool, u64), (bool, u64), usize);

/// The same-process peer: moves bytes among this process's GPUs and pinned host memory. Cheap to
/// clone; `Send + Sync`.
#[derive(Clone)]
pub struct LocalPeer {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for LocalPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalPeer")
            .field("gpus", &self.shared.count)
            .field("policy", &self.shared.policy)
            .finish()
    }
}

impl LocalPeer {
    /// Load CUDA and open the local peer with `policy` and `calibration`. Contexts are
    /// created when a GPU is first used. [`Error::Unavailable`] without a CUDA driver or GPU.
    pub fn open(policy: Policy, calibration: Calibration) -> Result<LocalPeer> {
        let cuda = Cuda::load().map_err(|e| Error::unavailable(None, e.to_string()))?;
        let count = cuda.device_count()?;
        if count == 0 {
            return Err(Error::unavailable(
                None,
                "the CUDA driver reports no GPU".to_string(),
            ));
        }
        Ok(LocalPeer {
            shared: Arc::new(Shared {
                cuda,
                count,
                gpus: (0..count).map(|_| OnceLock::new()).collect(),
                policy,
                calibration,
                topo: OnceLock::new(),
                links: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(1),
                imports: Mutex::new(HashMap::new()),
                ipc_opened: AtomicU64::new(0),
                bounce: Mutex::new(Vec::new()),
                plans: Mutex::new(HashMap::new()),
                last_plan: Mutex::new(None),
                mailboxes: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// [`LocalPeer::open`] with `GDX_STRICT`, `GDX_FORCE_PATH` and `GDX_CALIBRATION` applied.
    pub fn from_env() -> Result<LocalPeer> {
        let policy = Policy::default().with_env()?;
        let cal = Calibration::from_env()?.unwrap_or_default();
        LocalPeer::open(policy, cal)
    }

    /// Number of GPUs the driver exposes.
    pub fn gpu_count(&self) -> u32 {
        self.shared.count
    }

    /// The policy in force.
    pub fn policy(&self) -> &Policy {
        &self.shared.policy
    }

    /// The calibration in force.
    pub fn calibration(&self) -> &Calibration {
        &self.shared.calibration
    }

    pub(crate) fn gpu(&self, ordinal: u32) -> Result<Arc<Gpu>> {
        let slot = self.shared.gpus.get(ordinal as usize).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "no GPU {ordinal}: the CUDA driver reports {} device(s)",
                self.shared.count
            ))
        })?;
        slot.get_or_init(|| {
            let ctx = self.shared.cuda.context(ordinal)?;
            let stream = Stream::new(&ctx)?;
            Ok(Arc::new(Gpu {
                ctx,
                stream,
                helpers: Mutex::new(Vec::new()),
                events: Mutex::new(Vec::new()),
                batch: Mutex::new(None),
            }))
        })
        .clone()
    }

    /// Whether `other` is this same local peer (a clone of it).
    pub(crate) fn same(&self, other: &LocalPeer) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// The context of GPU `ordinal` (e.g. to make events and streams for [`Ordering`]).
    pub fn context(&self, ordinal: u32) -> Result<Context> {
        Ok(self.gpu(ordinal)?.ctx.clone())
    }

    fn next_id(&self) -> u64 {
        self.shared.next_id.fetch_add(1, AtomicOrdering::Relaxed)
    }

    /// The link between two GPUs: topology class and peer status, enabling peer access both
    /// ways on first use.
    pub fn link(&self, a: u32, b: u32) -> Result<GpuLink> {
        let key = (a.min(b), a.max(b));
        if let Some(l) = self
            .shared
            .links
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return Ok(l.clone());
        }
        let (ga, gb) = (self.gpu(a)?, self.gpu(b)?);
        let peer =
            if self.shared.cuda.can_access_peer(a, b)? && self.shared.cuda.can_access_peer(b, a)? {
                match ga
                    .ctx
                    .enable_peer_access(&gb.ctx)
                    .and_then(|()| gb.ctx.enable_peer_access(&ga.ctx))
                {
                    Ok(()) => PeerStatus::Enabled,
                    Err(e) => PeerStatus::Failed(e.to_string()),
                }
            } else {
                PeerStatus::NotSupported
            };
        let class = self.topo_class(a, b);
        let link = GpuLink {
            class_expects_p2p: matches!(
                class,
                Some(
                    gdx_topo::PathClass::Nv(_)
                        | gdx_topo::PathClass::Pix
                        | gdx_topo::PathClass::Pxb
                )
            ),
            class: class.map(|c| c.to_string()),
            peer,
        };
        self.shared
            .links
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, link.clone());
        Ok(link)
    }

    /// The topology's class between two GPUs, matched by PCI bus id; `None` when the topology
    /// cannot be read or does not list them.
    fn topo_class(&self, a: u32, b: u32) -> Option<gdx_topo::PathClass> {
        let topo = self
            .shared
            .topo
            .get_or_init(|| match gdx_topo::discover() {
                Ok(t) => Some(t),
                Err(e) => {
                    log::warn!("topology not read, plans will say so: {e}");
                    None
                }
            })
            .as_ref()?;
        let find = |o: u32| {
            let bus = self.shared.cuda.device(o).ok()?.pci_bus_id().ok()?;
            let addr: gdx_topo::PciAddr = bus.to_ascii_lowercase().parse().ok()?;
            topo.by_bdf(addr)
        };
        Some(topo.path_class(find(a)?, find(b)?))
    }

    /// Allocate `len` bytes on GPU `gpu` (`cuMemAlloc_v2`: covered by context peer access).
    pub fn alloc_device(&self, gpu: u32, len: u64) -> Result<DeviceRegion> {
        let g = self.gpu(gpu)?;
        let buf = DeviceBuffer::new(&g.ctx, to_usize(len)?)?;
        Ok(self.device_region(gpu, len, DeviceOrigin::Allocated, BTreeMap::new(), buf))
    }

    /// Allocate `len` bytes from GPU `gpu`'s stream-ordered pool (`cuMemAllocFromPoolAsync`,
    /// what cudarc's `alloc_zeros` does), registered like a caller's pool pointer: other GPUs
    /// get pool access unless the policy says `no_pool_grant`, and the region reports which
    /// GPUs cannot reach it ([`DeviceRegion::peer_mapped`]).
    pub fn alloc_device_from_pool(&self, gpu: u32, len: u64) -> Result<DeviceRegion> {
        let g = self.gpu(gpu)?;
        let buf = DeviceBuffer::from_pool(&g.ctx, to_usize(len)?, &g.stream)?;
        let unmapped = self.pool_access(gpu, buf.as_raw())?;
        Ok(self.device_region(gpu, len, DeviceOrigin::Pool, unmapped, buf))
    }

    /// Register `len` bytes of device memory at `ptr` that the caller owns (e.g. a PyTorch
    /// tensor's `data_ptr()`). The driver is asked which GPU holds it and whether the whole range
    /// lies in one allocation; pool memory gets pool access for the other GPUs (unless the
    /// policy says `no_pool_grant`). Dropping the region never frees the memory.
    ///
    /// # Safety
    ///
    /// - The memory stays allocated until the region (all clones) is dropped and every copy
    ///   queued on it is done.
    /// - The caller does not read or write the memory while a copy into it may run, nor write
    ///   it while a copy from it may run.
    pub unsafe fn register_device_ptr(&self, ptr: u64, len: u64) -> Result<DeviceRegion> {
        let cuda = &self.shared.cuda;
        let info = cuda.pointer_info(ptr)?;
        let Some(gpu) = info.device_ordinal else {
            return Err(Error::InvalidArgument(format!(
                "{ptr:#x}: the driver names no GPU for it"
            )));
        };
        if info.memory_type != gdx_sys::cuda::MemoryType::Device {
            return Err(Error::InvalidArgument(format!(
                "{ptr:#x} is {:?} memory, not device memory",
                info.memory_type
            )));
        }
        let (start, size) = cuda.pointer_range(ptr)?;
        if ptr - start + len > size as u64 {
            return Err(Error::InvalidArgument(format!(
                "{len} bytes at {ptr:#x} run past the end of its allocation ({size} bytes at {start:#x})"
            )));
        }
        let g = self.gpu(gpu)?;
        // SAFETY: the caller guarantees lifetime and races (this function's contract); the
        // driver confirmed the range lies in one device allocation of GPU `gpu`.
        let buf = unsafe { DeviceBuffer::from_raw_parts(&g.ctx, ptr, to_usize(len)?) };
        let unmapped = self.pool_access(gpu, ptr)?;
        let origin = if cuda.pointer_mem_pool(ptr)?.is_some() {
            DeviceOrigin::Pool
        } else {
            DeviceOrigin::Foreign
        };
        Ok(self.device_region(gpu, len, origin, unmapped, buf))
    }

    /// For pool memory at `ptr` on `gpu`: grant (unless the policy forbids) and check access
    /// for every other GPU; the GPUs left without access, with the reason.
    fn pool_access(&self, gpu: u32, ptr: u64) -> Result<BTreeMap<u32, String>> {
        let mut unmapped = BTreeMap::new();
        let Some(pool) = self.shared.cuda.pointer_mem_pool(ptr)? else {
            return Ok(unmapped);
        };
        for other in (0..self.shared.count).filter(|&o| o != gpu) {
            if !self.shared.cuda.can_access_peer(other, gpu)? {
                continue;
            }
            let mut access = pool.access(other)?;
            if access != PoolAccess::ReadWrite && !self.shared.policy.no_pool_grant {
                if let Err(e) = pool.set_access(other) {
                    log::warn!("{e}");
                }
                access = pool.access(other)?;
            }
            if access != PoolAccess::ReadWrite {
                let what = if self.shared.policy.no_pool_grant {
                    "not granted: policy no_pool_grant"
                } else {
                    "grant failed"
                };
                unmapped.insert(
                    other,
                    format!(
                        "is stream-ordered pool memory of GPU{gpu} without access for GPU{other} \
                         (cuMemPoolSetAccess {what}; access {access:?})"
                    ),
                );
            }
        }
        Ok(unmapped)
    }

    fn device_region(
        &self,
        gpu: u32,
        len: u64,
        origin: DeviceOrigin,
        not_peer_mapped: BTreeMap<u32, String>,
        buf: DeviceBuffer,
    ) -> DeviceRegion {
        DeviceRegion {
            inner: Arc::new(DeviceInner {
                id: self.next_id(),
                gpu,
                len,
                origin,
                not_peer_mapped,
                buf: Mutex::new(buf),
            }),
        }
    }

    /// Allocate `len` zeroed bytes of pinned (page-locked, portable) host memory.
    pub fn alloc_pinned(&self, len: u64) -> Result<PinnedRegion> {
        let g = self.gpu(0)?;
        let buf = PinnedHostBuffer::new(&g.ctx, to_usize(len)?)?;
        Ok(PinnedRegion {
            inner: Arc::new(PinnedInner {
                id: self.next_id(),
                buf: Mutex::new(buf),
            }),
        })
    }

    /// The plan for copying `len` bytes from `src` to `dst`, or the strict-mode error.
    pub fn plan(&self, dst: Mem<'_>, src: Mem<'_>, len: u64) -> Result<Plan> {
        self.plan_for(dst, src, len, false)
    }

    /// [`LocalPeer::plan`] for an op that is (`stream_ordered`) or is not ordered with a
    /// caller's stream or event (only the mailbox cares).
    pub(crate) fn plan_for(
        &self,
        dst: Mem<'_>,
        src: Mem<'_>,
        len: u64,
        stream_ordered: bool,
    ) -> Result<Plan> {
        let cal = &self.shared.calibration;
        let (sg, dg) = (gpu_of(src), gpu_of(dst));
        let mailbox = self.mailbox_facts(sg.or(dg), stream_ordered);
        // The size bucket: which crossovers the size is under, and whether it is within the
        // mailbox's reach.
        let bucket = cal
            .crossovers
            .iter()
            .filter(|c| len < c.below_bytes)
            .count()
            + 1000 * usize::from(len <= crate::routing::calibration::DEFAULT_MAILBOX_CROSSOVER)
            + 2000 * usize::from(len <= gdx_sys::cuda::mailbox::MAX_PAYLOAD as u64);
        let key = (src.id(), dst.id(), bucket);
        let cacheable = !(stream_ordered && mailbox.is_some());
        if cacheable {
            let mut last = self
                .shared
                .last_plan
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if let Some((k, p)) = last.as_ref() {
                if *k == key {
                    return Ok(p.clone());
                }
            }
            if let Some(p) = self
                .shared
                .plans
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&key)
            {
                *last = Some((key, p.clone()));
                return Ok(p.clone());
            }
        }
        let end = |m: Mem<'_>, other: Option<u32>| EndFacts {
            location: m.location(),
            imported: matches!(m, Mem::Gpu(r) if matches!(r.origin(), DeviceOrigin::Imported { .. })),
            not_peer_mapped: match (m, other) {
                (Mem::Gpu(r), Some(o)) => r.not_peer_mapped(o).map(str::to_string),
                _ => None,
            },
        };
        let link = match (sg, dg) {
            (Some(a), Some(b)) if a != b => Some(self.link(a, b)?),
            _ => None,
        };
        let facts = OpFacts {
            src: end(src, dg),
            dst: end(dst, sg),
            len,
            link,
        };
        let plan = planner::plan_local_with(&facts, &self.shared.policy, cal, mailbox.as_ref())?;
        if cacheable {
            self.shared
                .plans
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key, plan.clone());
        }
        Ok(plan)
    }
}

fn gpu_of(m: Mem<'_>) -> Option<u32> {
    match m {
        Mem::Gpu(r) => Some(r.gpu()),
        Mem::Pinned(_) => None,
    }
}

fn to_usize(len: u64) -> Result<usize> {
    usize::try_from(len)
        .map_err(|_| Error::InvalidArgument(format!("{len} bytes do not fit in memory")))
}
