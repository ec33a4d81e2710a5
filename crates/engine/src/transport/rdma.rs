//! The RDMA transport: RC queue pairs set up through the engine's handshake, one-sided RDMA
//! WRITE and READ straight between registered regions (host memory, or GPU memory that the NIC
//! reaches through dma-buf or nvidia-peermem: GPUDirect RDMA), built on `gdx-rdma`.
//!
//! - **Agent**: at start, [`RdmaNode::open`] finds an RDMA device (`GDX_IB_DEVICE` picks one)
//!   and opens an endpoint; without one the agent does not offer rdma, and the reason goes into
//!   every route that could have used it ([`crate::Agent::rdma_status`]).
//! - **Handshake**: when both agents offer rdma and shm does not apply, the initiator sends its
//!   `ConnData` in `RdmaConnect` on the control connection; the target connects its queue pairs
//!   and answers with its own. Any failure leaves the peer on tcp, with the reason.
//! - **Regions**: the initiator asks for each remote region once (`RdmaRegion`: key and access
//!   checked like any op), and gets its address, rkey and registration mechanism. Regions are
//!   registered on first use through the endpoint's cache and deregistered (invalidated) when
//!   they are dropped, so the NIC never touches freed memory: an op racing a region's drop
//!   fails with a named completion error instead.
//! - **Access**: registrations allow remote read and write, so an rkey is handed out only for a
//!   region open to remote writes; a read-only region is refused over rdma with that reason.
//! - **Ops**: each op becomes work items over the queue pairs, waited for with the transfer's
//!   deadline; a completion error fails the op by name. Consecutive small ops (a block list)
//!   go as one stream of work requests and one wait (`batch.rs`). The notification goes on the control
//!   connection after every completion.
//!
//! Host memory over this transport runs on every CI run on Soft-RoCE (`tests/rdma_vm.rs` in
//! `scripts/test-rdma.sh`); GPU memory over verbs (`gdr`) has not run: no machine here has a GPU
//! and an RDMA NIC together.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gdx_rdma::{
    ConnData, EndpointConfig, Mechanism, Memory, MrHandle, Qp, RdmaEndpoint, RdmaError, RdmaOp,
    RemoteRegion, WorkItem,
};

use crate::conn::Conn;
use crate::error::{Error, Result};
use crate::rails::Rails;
use crate::region::{LeaseKind, NicRegistrations, RegionInner, RegionKey, Registry};
use crate::routing::path::Path;
use crate::transfer::{OpKind, XferState};
use crate::transport::tcp::{MEASURE_BYTES, SPLIT_BYTES};
use crate::transport::{SerialQueue, Transport};
use crate::wire::Msg;

/// Queue pairs per peer connection.
const QPS_PER_PEER: u16 = 2;
/// Completion-queue entries per peer connection.
const CQ_ENTRIES: u32 = 1024;

mod batch;

fn rdma_err(e: impl Into<RdmaError>) -> Error {
    Error::Rdma(Box::new(e.into()))
}

/// This agent's RDMA endpoints (one per device; the first is the default) and the
/// registrations it made for its regions on each.
pub(crate) struct RdmaNode {
    eps: Vec<RdmaEndpoint>,
    /// (endpoint, region id) → its registration (dropped, and the range invalidated, with the
    /// region).
    regs: Mutex<HashMap<(usize, u64), MrHandle>>,
}

impl std::fmt::Debug for RdmaNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl NicRegistrations for RdmaNode {
    /// Drops a region's registration and invalidates its range: called when the region is
    /// removed, so the NIC stops touching the memory before it is freed.
    fn forget(&self, region: u64) {
        for (i, ep) in self.eps.iter().enumerate() {
            let h = self
                .regs
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&(i, region));
            if let Some(h) = h {
                ep.invalidate(&h.range);
            }
        }
    }
}

impl RdmaNode {
    /// The first RDMA device whose endpoint opens (or `GDX_IB_DEVICE`), or why there is none:
    /// [`Error::Rdma`] with the verbs error (no device, or the one device failed),
    /// [`Error::InvalidArgument`] for a `GDX_IB_DEVICE` that names no device,
    /// [`Error::Refused`] naming each device when several failed.
    pub(crate) fn open() -> Result<RdmaNode> {
        let devices = gdx_rdma::discover().map_err(rdma_err)?;
        let want = std::env::var("GDX_IB_DEVICE")
            .ok()
            .filter(|v| !v.is_empty());
        let mut why = Vec::new();
        for d in devices
            .iter()
            .filter(|d| want.as_deref().is_none_or(|w| w == d.name))
        {
            match RdmaEndpoint::open(&d.name, EndpointConfig::default()) {
                Ok(ep) => {
                    // The other devices too (a peer's rails may name them; a target answers a
                    // rail on its device of the same name); one that does not open is left out.
                    let mut eps = vec![ep];
                    if want.is_none() {
                        for o in devices.iter().filter(|o| o.name != d.name) {
                            match RdmaEndpoint::open(&o.name, EndpointConfig::default()) {
                                Ok(ep) => eps.push(ep),
                                Err(e) => log::debug!("gdx: rdma device {} left out: {e}", o.name),
                            }
                        }
                    }
                    return Ok(RdmaNode {
                        eps,
                        regs: Mutex::new(HashMap::new()),
                    });
                }
                Err(e) => why.push((d.name.as_str(), e)),
            }
        }
        match why.len() {
            0 => {
                let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
                Err(Error::InvalidArgument(format!(
                    "GDX_IB_DEVICE={} is not among the RDMA devices ({})",
                    want.unwrap_or_default(),
                    names.join(", ")
                )))
            }
            // One device tried: its error is the cause.
            1 => Err(rdma_err(why.swap_remove(0).1)),
            // Several: one error cannot hold them all as sources; name each.
            _ => {
                let each: Vec<String> = why.iter().map(|(d, e)| format!("{d}: {e}")).collect();
                Err(Error::refused(
                    Path::Rdma,
                    None,
                    format!("no RDMA device port opened: {}", each.join("; ")),
                ))
            }
        }
    }

    /// "mlx5_0 port 1 (Ethernet, GID index 3)" (the default endpoint; then the others' names).
    pub(crate) fn describe(&self) -> String {
        self.describe_ep(0)
    }

    /// Endpoint `i` as [`RdmaNode::describe`] gives it.
    fn describe_ep(&self, i: usize) -> String {
        let ep = &self.eps[i];
        let mut s = format!(
            "{} port {} ({}, GID index {})",
            ep.device(),
            ep.port().number,
            ep.link(),
            ep.gid().index
        );
        if i == 0 && self.eps.len() > 1 {
            let others: Vec<&str> = self.eps[1..].iter().map(|e| e.device()).collect();
            s.push_str(&format!("; also {}", others.join(", ")));
        }
        s
    }

    /// The endpoint on device `name`.
    pub(crate) fn endpoint(&self, name: &str) -> Option<usize> {
        self.eps.iter().position(|e| e.device() == name)
    }

    /// The endpoints whose port is ACTIVE (or says nothing), the default one first: the rails
    /// of a peer when the agent names none ([`crate::AgentConfig::nics`]).
    pub(crate) fn active_endpoints(&self) -> Vec<usize> {
        (0..self.eps.len())
            .filter(|&i| matches!(self.eps[i].port_state().as_str(), "ACTIVE" | "unknown"))
            .collect()
    }

    /// The device of endpoint `i`.
    pub(crate) fn device(&self, i: usize) -> &str {
        self.eps[i].device()
    }

    /// The registration of a region on endpoint `ep`, made on first use.
    fn register(&self, ep: usize, r: &RegionInner) -> Result<MrHandle> {
        let mut regs = self.regs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = regs.get(&(ep, r.id)) {
            return Ok(Arc::clone(h));
        }
        let mem = match (r.device(), r.host_ptr()) {
            (Some(dev), _) => {
                let buf = dev.region.inner.lock();
                // SAFETY: the region's device memory stays allocated while the region is
                // registered in the agent; its registration is dropped and invalidated
                // (`RdmaNode::forget`) when the region is removed, before the memory can go.
                let view = unsafe {
                    gdx_sys::cuda::DeviceBuffer::from_raw_parts(
                        buf.context(),
                        buf.as_raw(),
                        buf.len(),
                    )
                };
                Memory::gpu(Arc::new(view))
            }
            (None, Some(ptr)) => {
                // SAFETY: host memory of a registered region stays mapped until the region is
                // removed, and removal invalidates this registration first (`forget`); the
                // NIC's accesses follow the region's one-sided access rights.
                unsafe { Memory::host(ptr, r.len as usize) }
            }
            (None, None) => {
                return Err(Error::InvalidArgument(format!(
                    "region {} has no memory to register",
                    r.id
                )))
            }
        };
        let h = self.eps[ep].register(&mem).map_err(rdma_err)?;
        if h.handle.mechanism() == Mechanism::Staged {
            return Err(Error::refused(
                Path::Rdma,
                Some(r.id),
                format!(
                    "region {} ({}) has no GPUDirect RDMA registration on {} (tried: {:?}); \
                 connect with GDX_TRANSPORTS=tcp,shm to stage it over tcp",
                    r.id,
                    r.location,
                    self.eps[ep].device(),
                    h.handle.attempts()
                ),
            ));
        }
        regs.insert((ep, r.id), Arc::clone(&h));
        Ok(h)
    }

    /// The target's answer to `RdmaRegion` (default device) and `RdmaRegionOn` (`device`):
    /// checks the key and access, registers the region on that device and says where it is.
    pub(crate) fn expose(
        &self,
        reg: &Registry,
        id: u64,
        key: RegionKey,
        device: Option<&str>,
    ) -> Result<Msg> {
        let ep = match device {
            None => 0,
            Some(d) => self.endpoint(d).ok_or_else(|| {
                Error::unavailable(Path::Rdma, format!("rdma: no endpoint on device {d} here"))
            })?,
        };
        let r = reg.get(id)?;
        if !r.key.ct_eq(&key) {
            return Err(Error::BadKey { region: id });
        }
        if !r.access.remote_write {
            // Registrations allow remote read and write; an rkey would also allow writes.
            return Err(Error::ReadOnly { region: id });
        }
        let h = self.register(ep, &r)?;
        let remote = h.handle.remote_region(id).ok_or_else(|| {
            Error::refused(
                Path::Rdma,
                Some(id),
                format!("region {id} has no rkey (it is not registered)"),
            )
        })?;
        Ok(Msg::RdmaRegionInfo {
            addr: remote.addr,
            len: remote.len,
            rkey: remote.rkey,
            mechanism: h.handle.mechanism().to_string(),
        })
    }

    /// The target's side of `RdmaConnect`: connects queue pairs to the initiator's, on this
    /// agent's device of the same name as the initiator's (rail-aligned NICs), else on the
    /// default one, and returns them with this side's connection data.
    pub(crate) fn accept(&self, initiator: &[u8]) -> Result<(Qp, Vec<u8>)> {
        let theirs = ConnData::decode(initiator).map_err(rdma_err)?;
        let ep = &self.eps[self.endpoint(&theirs.device).unwrap_or(0)];
        let cq = ep.completion_queue(CQ_ENTRIES).map_err(rdma_err)?;
        let prepared = ep.prepare(&cq, QPS_PER_PEER).map_err(rdma_err)?;
        let mine = prepared.conn_data().encode().map_err(rdma_err)?;
        let qp = prepared.connect(&theirs).map_err(rdma_err)?;
        Ok((qp, mine))
    }

    /// The initiator's side: queue pairs on endpoint `ep` connected through `control`
    /// (`RdmaConnect` both ways). Refused while the endpoint's port is not ACTIVE (a rail
    /// whose link is down is not re-probed into use).
    pub(crate) fn connect(&self, ep: usize, control: &mut Conn) -> Result<Qp> {
        let e = &self.eps[ep];
        let state = e.port_state();
        if state != "ACTIVE" && state != "unknown" {
            return Err(Error::unavailable(
                Path::Rdma,
                format!("rdma: {} port {} is {state}", e.device(), e.port().number),
            ));
        }
        let cq = e.completion_queue(CQ_ENTRIES).map_err(rdma_err)?;
        let prepared = e.prepare(&cq, QPS_PER_PEER).map_err(rdma_err)?;
        let data = prepared.conn_data().encode().map_err(rdma_err)?;
        let theirs = match control.request(&Msg::RdmaConnect { data })? {
            Msg::RdmaConnect { data } => ConnData::decode(&data).map_err(rdma_err)?,
            m => {
                return Err(Error::Protocol(format!(
                    "expected RdmaConnect, got frame type {}",
                    m.kind()
                )))
            }
        };
        prepared.connect(&theirs).map_err(rdma_err)
    }
}

/// One rail of a peer connection: queue pairs on one of this agent's endpoints (none while
/// the rail is paused: queue pairs in error are dropped and made anew by a re-probe).
struct RailQp {
    ep: usize,
    qp: Option<Qp>,
    /// The peer's device at the other end.
    remote_dev: String,
    /// Remote region id → where it is on the peer's device (asked once per region).
    remote: HashMap<u64, RemoteRegion>,
}

struct Worker {
    node: Arc<RdmaNode>,
    rails: Vec<RailQp>,
    stats: Arc<Rails>,
    control: Arc<Mutex<Conn>>,
    wait: Duration,
}

/// The rdma transport: the worker's queue, and the rails it stripes over.
#[derive(Debug)]
pub(crate) struct RdmaTransport {
    q: SerialQueue,
    rails: Arc<Rails>,
}

impl Transport for RdmaTransport {
    fn submit(&self, xfer: Arc<XferState>) {
        self.q.submit(xfer);
    }

    fn rails(&self) -> Option<Arc<Rails>> {
        // One rail: nothing to stripe or fail over; the route's reason names the device.
        (self.rails.len() > 1).then(|| Arc::clone(&self.rails))
    }

    fn is_alive(&self) -> bool {
        // One rail keeps the meaning it had: alive until the peer is lost (a paused rail is
        // re-probed); several: while one takes work.
        self.q.is_alive() && (self.rails.len() == 1 || self.rails.any_active())
    }

    fn close(&self) {
        self.q.close();
    }
}

/// Queue pairs on each endpoint of `eps` connected through `control`: the rails of a peer
/// connection, in order, with the peer's device at the other end of each.
pub(crate) fn connect_rails(
    node: &RdmaNode,
    eps: &[usize],
    control: &mut Conn,
) -> Result<Vec<(usize, Qp, String)>> {
    eps.iter()
        .map(|&ep| {
            let qp = node.connect(ep, control)?;
            let remote = qp.remote().device.clone();
            Ok((ep, qp, remote))
        })
        .collect()
}

/// Starts the worker thread that runs transfers over one peer's rails (queue pairs on one or
/// more endpoints), one transfer at a time; each op is spread over the active rails.
pub(crate) fn spawn(
    node: Arc<RdmaNode>,
    rails: Vec<(usize, Qp, String)>,
    control: Arc<Mutex<Conn>>,
    wait: Duration,
) -> Result<RdmaTransport> {
    let ends = rails
        .iter()
        .map(|(ep, _, remote)| (node.device(*ep).to_string(), remote.clone()))
        .collect();
    let stats = Arc::new(Rails::new(ends, (0..rails.len()).collect()));
    let w = Worker {
        node,
        rails: rails
            .into_iter()
            .map(|(ep, qp, remote_dev)| RailQp {
                ep,
                qp: Some(qp),
                remote_dev,
                remote: HashMap::new(),
            })
            .collect(),
        stats: Arc::clone(&stats),
        control,
        wait,
    };
    let q = SerialQueue::spawn("gdx-rdma", move |rx, alive| worker(w, rx, alive))?;
    Ok(RdmaTransport { q, rails: stats })
}

/// Byte ranges of an op: (offset in the op, length).
type Ranges = Vec<(u64, u64)>;

/// A rail's run of its ranges: done, or failed with the error and the pieces not finished.
type RailRun = std::result::Result<(), (Error, Ranges)>;

/// Each pending range split over the active rails by their weights: (rail, offset, length).
fn spread(todo: &Ranges, active: &[usize], weights: &[f64]) -> Vec<(usize, u64, u64)> {
    let mut plan = Vec::new();
    for &(off, len) in todo {
        for (r, o, n) in split(len, active, weights) {
            plan.push((r, off + o, n));
        }
    }
    plan
}

/// A rail's ranges cut into pieces of at most `PIECE` bytes, each waited for on its own.
fn pieces(ranges: &Ranges) -> Ranges {
    let mut pieces = Vec::new();
    for &(off, n) in ranges {
        let mut o = 0;
        while o < n {
            let len = (n - o).min(PIECE);
            pieces.push((off + o, len));
            o += len;
        }
    }
    pieces
}

/// Largest piece a rail runs at a time: its wait is for progress, and what goes again on
/// another rail when the rail fails is what it had not finished, in pieces of this size.
const PIECE: u64 = 8 << 20;

/// How long the idle worker waits for a transfer before it looks at paused rails again.
const IDLE: Duration = Duration::from_millis(100);

fn worker(mut w: Worker, rx: Receiver<Arc<XferState>>, alive: Arc<AtomicBool>) {
    loop {
        w.reprobe();
        let xfer = match rx.recv_timeout(IDLE) {
            Ok(x) => x,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => continue,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        };
        // Ops before `batched` completed in a batch; ops before `solo` run one by one (their
        // batch failed: each op then gets its own verdict, and failover, from `run_op`).
        let (mut batched, mut solo) = (0, 0);
        for i in 0..xfer.ops.len() {
            if i < batched {
                continue;
            }
            if let Some(e) = xfer.halt() {
                xfer.chunk_done(i, 0, Err(e));
                continue;
            }
            let n = if i < solo {
                0
            } else {
                batch::batch_len(&xfer, i)
            };
            if n >= 2 {
                if w.run_batch(&xfer, i, n) {
                    batched = i + n;
                    continue;
                }
                solo = i + n;
            }
            let r = w.run_op(&xfer, i);
            if let Err(e) = &r {
                if matches!(e, Error::PeerLost { .. }) && !w.stats.any_active() {
                    alive.store(false, Ordering::SeqCst);
                }
            }
            match r {
                Ok(()) => xfer.chunk_done(i, xfer.ops[i].len, Ok(())),
                Err(e) => xfer.chunk_done(i, 0, Err(e)),
            }
        }
        super::notify_and_finish(&xfer, &w.control);
    }
}

/// Whether `e` is the op's own fault (its regions: a key, a bound, an access right), not the
/// rail's: the op fails, and the rail only needs fresh queue pairs (any completion error puts
/// them in the error state).
fn region_fault(e: &Error) -> bool {
    use gdx_rdma::WcStatus as S;
    matches!(e, Error::Rdma(b) if matches!(&**b, RdmaError::Completion(wc) if matches!(
        wc.status,
        S::RemoteAccess | S::LocalProtection | S::LocalAccess | S::RemoteInvalidRequest
            | S::LocalLength
    )))
}

/// Splits `len` bytes into one contiguous range per rail of `active`, in proportion to
/// `weights`, each a multiple of 4 KiB but the last.
fn split(len: u64, active: &[usize], weights: &[f64]) -> Vec<(usize, u64, u64)> {
    let total: f64 = weights.iter().sum();
    let mut out = Vec::with_capacity(active.len());
    let mut off = 0;
    for (k, (&r, &w)) in active.iter().zip(weights).enumerate() {
        let n = if k + 1 == active.len() {
            len - off
        } else {
            (((len as f64) * w / total) as u64 / 4096 * 4096).min(len - off)
        };
        if n > 0 {
            out.push((r, off, n));
        }
        off += n;
    }
    out
}

impl Worker {
    /// Re-probes each paused rail whose backoff has passed.
    fn reprobe(&mut self) {
        for r in 0..self.rails.len() {
            if self.rails[r].qp.is_none() && self.stats.probe_due(r) {
                self.reopen(r);
            }
        }
    }

    /// Fresh queue pairs for rail `r` through the control connection (refused while its port
    /// is not ACTIVE): the rail takes work again, or stays paused with a longer backoff.
    fn reopen(&mut self, r: usize) {
        let res = {
            let mut c = self.control.lock().unwrap_or_else(|p| p.into_inner());
            self.node.connect(self.rails[r].ep, &mut c)
        };
        match res {
            Ok(qp) => {
                self.rails[r].qp = Some(qp);
                self.stats.resume(r);
            }
            Err(e) => {
                self.stats.pause(r, &e);
                self.stats.probe_failed(r, &e);
            }
        }
    }

    fn remote_region(&mut self, r: usize, id: u64, key: RegionKey) -> Result<RemoteRegion> {
        if let Some(x) = self.rails[r].remote.get(&id) {
            return Ok(*x);
        }
        // One rail: the message every target knows; several: the region on each rail's device.
        let msg = if self.rails.len() == 1 {
            Msg::RdmaRegion {
                region: id,
                key,
                write: true,
            }
        } else {
            Msg::RdmaRegionOn {
                region: id,
                key,
                device: self.rails[r].remote_dev.clone(),
            }
        };
        let reply = self
            .control
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .request(&msg)?;
        let Msg::RdmaRegionInfo {
            addr, len, rkey, ..
        } = reply
        else {
            return Err(Error::Protocol(format!(
                "expected RdmaRegionInfo, got frame type {}",
                reply.kind()
            )));
        };
        let x = RemoteRegion {
            id,
            addr,
            len,
            rkey,
        };
        self.rails[r].remote.insert(id, x);
        Ok(x)
    }

    /// The rails that take work now, and their weights.
    fn active(&self) -> (Vec<usize>, Vec<f64>) {
        let active: Vec<usize> = (0..self.rails.len())
            .filter(|&r| self.rails[r].qp.is_some() && self.stats.is_active(r))
            .collect();
        let weights = self.stats.weights(&active);
        (active, weights)
    }

    /// Runs op `i`: one range per active rail (the best rail only for an op under
    /// `SPLIT_BYTES`), the rails at once; a range whose rail fails is run again on the rails
    /// left, until every byte is confirmed, no rail is left, or the transfer's time is up.
    fn run_op(&mut self, xfer: &XferState, i: usize) -> Result<()> {
        let op = xfer.op(i);
        let (kind, rdma) = match op.kind {
            OpKind::Write => (LeaseKind::Source, RdmaOp::Write),
            OpKind::Read => (LeaseKind::Sink, RdmaOp::Read),
        };
        let _lease = op.local.lease(kind, self.wait)?;
        let mut todo: Ranges = vec![(0, op.len)];
        let mut last: Option<Error> = None;
        while !todo.is_empty() {
            if let Some(e) = xfer.halt() {
                return Err(e);
            }
            let (mut active, weights) = self.active();
            if active.is_empty() {
                return Err(match last {
                    // One rail: its own error, as before rails.
                    Some(e) if self.rails.len() == 1 => e,
                    _ => Error::peer_lost(format!(
                        "no rail left (paused ones are re-probed): {}",
                        self.stats.causes()
                    )),
                });
            }
            let mut weights = weights;
            let small = todo.iter().map(|t| t.1).sum::<u64>() < SPLIT_BYTES;
            if small && active.len() > 1 {
                let best = self.stats.best().filter(|b| active.contains(b));
                let b = best.unwrap_or(active[0]);
                active = vec![b];
                weights = vec![1.0];
            }
            let plan = spread(&todo, &active, &weights);
            // What each rail needs, asked before the rails run (the control connection is
            // one): the remote region and this side's registration on the rail's device.
            let mut per_rail: Vec<(usize, Ranges, MrHandle, RemoteRegion)> = Vec::new();
            for &r in &active {
                let ranges: Ranges = plan
                    .iter()
                    .filter(|p| p.0 == r)
                    .map(|p| (p.1, p.2))
                    .collect();
                if ranges.is_empty() {
                    continue;
                }
                let remote = self.remote_region(r, op.remote.id, op.remote.key)?;
                let mr = self.node.register(self.rails[r].ep, op.local)?;
                per_rail.push((r, ranges, mr, remote));
            }
            let wait = self.wait;
            let (lo, ro) = (op.local_offset, op.remote_offset);
            let stats = &self.stats;
            let mut qps: Vec<(usize, &mut Qp)> = self
                .rails
                .iter_mut()
                .enumerate()
                .filter_map(|(r, x)| x.qp.as_mut().map(|q| (r, q)))
                .collect();
            // Each rail runs its ranges piece by piece: a piece's wait is for progress (the
            // I/O timeout, within the transfer's time), so a rail whose link went silent fails
            // after that long instead of holding the transfer to its deadline, and only the
            // pieces it had not finished go again.
            let results: Vec<(usize, RailRun)> = std::thread::scope(|sc| {
                let mut hs = Vec::new();
                for (r, ranges, mr, remote) in &per_rail {
                    let Some(k) = qps.iter().position(|(q, _)| q == r) else {
                        continue;
                    };
                    let (_, qp) = qps.swap_remove(k);
                    let mut run = move || {
                        let t0 = std::time::Instant::now();
                        let mut done = 0u64;
                        let pieces = pieces(ranges);
                        for (k, &(off, n)) in pieces.iter().enumerate() {
                            // Cancelled or out of time: nothing more is posted; the pieces
                            // already run have completed (their completions were reaped).
                            if let Some(e) = xfer.halt() {
                                return Err((e, pieces[k..].to_vec()));
                            }
                            let res = WorkItem::between(mr, lo + off, remote, ro + off, n)
                                .map_err(rdma_err)
                                .and_then(|item| {
                                    let t = xfer.time_left().min(wait);
                                    qp.run(rdma, &[item], t).map_err(rdma_err)
                                });
                            if let Err(e) = res {
                                return Err((e, pieces[k..].to_vec()));
                            }
                            done += n;
                            stats.add_bytes(*r, n);
                            if let Some(b) = xfer.rail_bytes.get(*r) {
                                b.fetch_add(n, Ordering::Relaxed);
                            }
                        }
                        if done >= MEASURE_BYTES {
                            stats.measured(*r, done, t0.elapsed());
                        }
                        Ok(())
                    };
                    if per_rail.len() == 1 {
                        // One rail: on this thread.
                        return vec![(*r, run())];
                    }
                    hs.push((*r, ranges.clone(), sc.spawn(run)));
                }
                hs.into_iter()
                    .map(|(r, ranges, h)| {
                        let res = h.join().unwrap_or_else(|_| {
                            let e = Error::unavailable(Path::Rdma, "rdma rail thread panicked");
                            Err((e, ranges))
                        });
                        (r, res)
                    })
                    .collect()
            });
            todo.clear();
            let mut op_fault = None;
            for (r, res) in results {
                if let Err((e, left)) = res {
                    if matches!(e, Error::Cancelled | Error::Timeout(_)) && xfer.halt().is_some() {
                        // The transfer stopped, not the rail: its queue pairs are idle and
                        // healthy.
                        op_fault.get_or_insert(e);
                        continue;
                    }
                    if region_fault(&e) {
                        // The op's fault, not the rail's: the same ranges would fail on every
                        // rail. The rail gets fresh queue pairs at once; the op fails.
                        self.rails[r].qp = None;
                        self.reopen(r);
                        op_fault.get_or_insert(e);
                        continue;
                    }
                    // A completion error or a stall leaves the queue pairs in error: the rail
                    // pauses and its unfinished pieces go again on the others (a write puts the
                    // same bytes in the same place; a read fetches them again).
                    self.stats.pause(r, &e);
                    self.rails[r].qp = None;
                    log::debug!("gdx: rdma rail {r} failed ({e}); its pieces go again");
                    todo.extend(left);
                    last = Some(e);
                }
            }
            if let Some(e) = op_fault {
                return Err(e);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{pieces, split, spread, PIECE};

    #[test]
    fn pieces_cover_each_range_in_order_in_pieces_of_at_most_piece_bytes() {
        let ranges = vec![(100, 2 * PIECE + 5), (1 << 40, 3)];
        let p = pieces(&ranges);
        assert_eq!(
            p,
            vec![
                (100, PIECE),
                (100 + PIECE, PIECE),
                (100 + 2 * PIECE, 5),
                (1 << 40, 3)
            ]
        );
        let plan = spread(&ranges, &[0], &[1.0]);
        assert_eq!(plan.iter().map(|x| x.2).sum::<u64>(), 2 * PIECE + 8);
    }

    #[test]
    fn split_follows_the_weights_in_whole_pages_and_covers_every_byte() {
        let len = (64 << 20) + 5;
        let parts = split(len, &[0, 1], &[2.0, 1.0]);
        assert_eq!(parts.len(), 2);
        let (r0, o0, n0) = parts[0];
        let (r1, o1, n1) = parts[1];
        assert_eq!((r0, o0, r1, o1), (0, 0, 1, n0));
        assert_eq!(n0 % 4096, 0);
        assert_eq!(n0 + n1, len);
        let share = n1 as f64 / len as f64;
        assert!((share - 1.0 / 3.0).abs() < 0.001, "{share}");
        // A range smaller than a page goes to the last rail whole.
        assert_eq!(split(100, &[3, 5], &[1.0, 1.0]), vec![(5, 0, 100)]);
        assert_eq!(split(8192, &[7], &[0.5]), vec![(7, 0, 8192)]);
    }
}
