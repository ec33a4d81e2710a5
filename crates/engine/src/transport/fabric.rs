//! The fabric transport: one-sided `fi_write`/`fi_read` between registered host regions over
//! libfabric (`gdx-fabric`), with the same shape as the rdma transport.
//!
//! - **Agent**: when `GDX_TRANSPORTS` names `fabric`, the agent opens one RDM endpoint at start
//!   (provider from `GDX_FABRIC_PROVIDER`, or efa > verbs > cxi > tcp; tcp on 127.0.0.1 only);
//!   without one it does not offer fabric and the reason goes into every route that could have
//!   used it ([`crate::Agent::fabric_status`]).
//! - **Handshake**: when both agents offer fabric and neither shm nor rdma applies, the
//!   initiator sends its endpoint address in `FabricConnect` on the authenticated control
//!   connection; the target inserts it into its address vector and answers with its own.
//! - **Regions**: the initiator asks for each remote region once (`FabricRegion`: key and access
//!   checked by the target like any op) and gets its address, length and MR key. Regions are
//!   registered on first use and the registration is closed when the region is removed.
//! - **Access**: registrations allow remote read and write, so a key is handed out only for a
//!   region open to remote writes; a read-only region is refused with that reason.
//! - **GPU memory**: registered through `fi_mr_regattr` with FI_HMEM_CUDA when the endpoint's
//!   provider has FI_HMEM (never the case with Debian's libfabric, which has no CUDA: built and
//!   decision-tested only). Otherwise this end's GPU memory is staged
//!   through one registered host bounce buffer per peer (`FabricStaged`, the plan says so and
//!   why; strict mode refuses it); the peer's GPU memory is refused at plan time, since
//!   one-sided RMA gives the target no step in which to copy it (see `plan::plan_fabric`).
//! - **Peer death**: a waiting batch watches the control connection; a peer whose control socket
//!   closes fails the op with `PeerLost` without waiting for the deadline.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gdx_fabric::{
    Endpoint, FabricConfig, FabricError, Memory, MemoryRegion, PeerAddr, RemoteRegion, RmaKind,
    RmaOp,
};

use crate::conn::Conn;
use crate::error::{Error, Result};
use crate::gpu::AgentGpu;
use crate::region::{LeaseKind, NicRegistrations, RegionInner, RegionKey, Registry};
use crate::routing::plan::{FabricMem, Path};
use crate::transfer::{OpKind, XferState};
use crate::transport::SerialQueue;
use crate::wire::Msg;

fn fabric_err(e: FabricError) -> Error {
    match e {
        FabricError::PeerLost { text, .. } => Error::peer_lost(format!("fabric: {text}")),
        other => Error::Fabric(Arc::new(other)),
    }
}

/// This agent's fabric endpoint and the registrations it made for its regions.
pub(crate) struct FabricNode {
    ep: Endpoint,
    /// Region id → its registration (closed when the region is removed).
    regs: Mutex<HashMap<u64, MemoryRegion>>,
}

impl std::fmt::Debug for FabricNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl NicRegistrations for FabricNode {
    /// Closes a region's registration: called when the region is removed, before its memory
    /// can go.
    fn forget(&self, region: u64) {
        self.regs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&region);
    }
}

impl FabricNode {
    /// An endpoint on `provider` (`None`: `GDX_FABRIC_PROVIDER`, else automatic), or why
    /// there is none.
    pub(crate) fn open(provider: Option<String>) -> Result<FabricNode> {
        let ep = Endpoint::open(&FabricConfig { provider }).map_err(fabric_err)?;
        Ok(FabricNode {
            ep,
            regs: Mutex::new(HashMap::new()),
        })
    }

    /// "tcp;ofi_rxm on lo (127.0.0.1:40123), chosen because ...".
    pub(crate) fn describe(&self) -> String {
        let p = self.ep.provider();
        format!(
            "{} on {} ({}), {}",
            p.provider,
            p.domain,
            self.ep.bound_address(),
            self.ep.reason()
        )
    }

    /// What this node can do with GPU memory, for the planner: GPU regions are registered
    /// through FI_HMEM_CUDA when the endpoint's provider entry has FI_HMEM.
    pub(crate) fn mem(&self) -> FabricMem {
        let p = self.ep.provider();
        FabricMem {
            provider: p.provider.clone(),
            offers_hmem: p.hmem,
            registers_cuda: self.ep.registers_hmem(),
        }
    }

    /// Live registrations and refused closes of this node's domain.
    pub(crate) fn registrations(&self) -> (usize, usize) {
        self.ep.registrations()
    }

    fn register(&self, r: &RegionInner) -> Result<MemoryRegion> {
        let mut regs = self.regs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = regs.get(&r.id) {
            return Ok(m.clone());
        }
        if let Some(dev) = r.device() {
            if !self.ep.registers_hmem() {
                return Err(Error::refused(
                    Path::Fabric,
                    Some(r.id),
                    format!(
                        "region {} is GPU memory ({}); provider {} does not offer FI_HMEM, and a \
                     target's GPU memory cannot be staged over one-sided RMA; connect with \
                     GDX_TRANSPORTS=tcp,shm to stage it over tcp",
                        r.id,
                        r.location,
                        self.ep.provider().provider
                    ),
                ));
            }
            let len = usize::try_from(r.len).map_err(|_| {
                Error::InvalidArgument(format!("region {} is too large to register", r.id))
            })?;
            // SAFETY: the region's device memory stays allocated while the region exists
            // (the region holds its DeviceRegion), and removal closes this registration first
            // (`forget`); gdx-fabric never dereferences it on the host.
            let mem =
                unsafe { Memory::from_cuda(dev.region.device_ptr(), len, dev.region.gpu() as i32) };
            let m = self.ep.register(mem).map_err(fabric_err)?;
            regs.insert(r.id, m.clone());
            return Ok(m);
        }
        let Some(ptr) = r.host_ptr() else {
            return Err(Error::InvalidArgument(format!(
                "region {} has no memory to register",
                r.id
            )));
        };
        // SAFETY: host memory of a registered region stays mapped until the region is removed,
        // and removal closes this registration first (`forget`); the provider's accesses follow
        // the region's one-sided access rights (a key is handed out only for writable regions).
        let mem = unsafe { Memory::from_raw(ptr, r.len as usize) };
        let m = self.ep.register(mem).map_err(fabric_err)?;
        regs.insert(r.id, m.clone());
        Ok(m)
    }

    /// The target's answer to `FabricRegion`: checks key and access, registers, says where.
    pub(crate) fn expose(&self, reg: &Registry, id: u64, key: RegionKey) -> Result<Msg> {
        let r = reg.get(id)?;
        if !r.key.ct_eq(&key) {
            return Err(Error::BadKey { region: id });
        }
        if !r.access.remote_write {
            // Registrations allow remote read and write; the MR key would allow writes too.
            return Err(Error::ReadOnly { region: id });
        }
        let m = self.register(&r)?;
        let rr = m.remote();
        Ok(Msg::FabricRegionInfo {
            addr: rr.addr,
            len: rr.len,
            mr_key: rr.key,
        })
    }

    /// The target's side of `FabricConnect`: the initiator's address into the AV, and ours back.
    pub(crate) fn accept(&self, initiator: &[u8]) -> Result<Vec<u8>> {
        self.ep.insert_peer(initiator).map_err(fabric_err)?;
        self.ep.address().map_err(fabric_err)
    }

    /// The initiator's side: addresses exchanged through `control`.
    pub(crate) fn connect(&self, control: &mut Conn) -> Result<PeerAddr> {
        let addr = self.ep.address().map_err(fabric_err)?;
        match control.request(&Msg::FabricConnect { addr })? {
            Msg::FabricConnect { addr } => self.ep.insert_peer(&addr).map_err(fabric_err),
            m => Err(Error::Protocol(format!(
                "expected FabricConnect, got frame type {}",
                m.kind()
            ))),
        }
    }
}

struct Worker {
    node: Arc<FabricNode>,
    peer: PeerAddr,
    control: Arc<Mutex<Conn>>,
    /// Remote region id → where it is (asked once per region).
    remote: HashMap<u64, RemoteRegion>,
    wait: Duration,
    /// The registered host bounce buffer staged GPU ops go through (made on first use).
    bounce: Option<MemoryRegion>,
    /// Host copy of one chunk between the GPU and the bounce buffer.
    scratch: Vec<u8>,
}

/// Bytes of GPU memory staged per chunk.
const BOUNCE: usize = 4 << 20;

/// Starts the worker thread that runs transfers to one peer, one at a time; the returned
/// [`SerialQueue`] is the whole submitting side.
pub(crate) fn spawn(
    node: Arc<FabricNode>,
    peer: PeerAddr,
    control: Arc<Mutex<Conn>>,
    wait: Duration,
) -> Result<SerialQueue> {
    let w = Worker {
        node,
        peer,
        control,
        remote: HashMap::new(),
        wait,
        bounce: None,
        scratch: Vec::new(),
    };
    SerialQueue::spawn("gdx-fabric", move |rx, alive| worker(w, rx, alive))
}

fn worker(mut w: Worker, rx: Receiver<Arc<XferState>>, alive: Arc<AtomicBool>) {
    for xfer in rx {
        for i in 0..xfer.ops.len() {
            if let Some(e) = xfer.halt() {
                xfer.chunk_done(i, 0, Err(e));
                continue;
            }
            match w.run_op(&xfer, i) {
                Ok(()) => xfer.chunk_done(i, xfer.ops[i].len, Ok(())),
                Err(e) => {
                    if matches!(e, Error::PeerLost { .. }) {
                        alive.store(false, Ordering::SeqCst);
                    }
                    xfer.chunk_done(i, 0, Err(e));
                }
            }
        }
        super::notify_and_finish(&xfer, &w.control);
    }
}

impl Worker {
    fn remote_region(&mut self, id: u64, key: RegionKey) -> Result<RemoteRegion> {
        if let Some(r) = self.remote.get(&id) {
            return Ok(*r);
        }
        let reply = self
            .control
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .request(&Msg::FabricRegion { region: id, key })?;
        let Msg::FabricRegionInfo { addr, len, mr_key } = reply else {
            return Err(Error::Protocol(format!(
                "expected FabricRegionInfo, got frame type {}",
                reply.kind()
            )));
        };
        let r = RemoteRegion {
            addr,
            len,
            key: mr_key,
        };
        self.remote.insert(id, r);
        Ok(r)
    }

    fn run_op(&mut self, xfer: &XferState, i: usize) -> Result<()> {
        let op = xfer.op(i);
        let remote = self.remote_region(op.remote.id, op.remote.key)?;
        let (lease, kind) = match op.kind {
            OpKind::Write => (LeaseKind::Source, RmaKind::Write),
            OpKind::Read => (LeaseKind::Sink, RmaKind::Read),
        };
        let _lease = op.local.lease(lease, self.wait)?;
        // The plan staged this op unless the provider registers GPU memory (FI_HMEM).
        if let (Some(dev), false) = (op.local.device(), self.node.ep.registers_hmem()) {
            return self.run_staged(xfer, i, dev, kind, remote);
        }
        let mr = self.node.register(op.local)?;
        self.rma(
            xfer,
            RmaOp {
                kind,
                local: &mr,
                local_offset: op.local_offset,
                peer: self.peer,
                remote,
                remote_offset: op.remote_offset,
                len: op.len,
            },
        )
    }

    /// One op whose local end is GPU memory, chunk by chunk through the bounce buffer:
    /// GPU-to-host copy then `fi_write`, or `fi_read` then host-to-GPU copy.
    fn run_staged(
        &mut self,
        xfer: &XferState,
        i: usize,
        dev: &AgentGpu,
        kind: RmaKind,
        remote: RemoteRegion,
    ) -> Result<()> {
        let op = xfer.op(i);
        let bounce = match &self.bounce {
            Some(b) => b.clone(),
            None => {
                let b = self
                    .node
                    .ep
                    .register(Memory::alloc(BOUNCE))
                    .map_err(fabric_err)?;
                self.bounce = Some(b.clone());
                b
            }
        };
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.resize(BOUNCE, 0);
        let mut done = 0u64;
        let result = loop {
            if done >= op.len {
                break Ok(());
            }
            let n = (op.len - done).min(BOUNCE as u64);
            let chunk = &mut scratch[..n as usize];
            let rma = RmaOp {
                kind,
                local: &bounce,
                local_offset: 0,
                peer: self.peer,
                remote,
                remote_offset: op.remote_offset + done,
                len: n,
            };
            let step = match kind {
                RmaKind::Write => dev
                    .read_to_host(op.local_offset + done, chunk)
                    .and_then(|()| bounce_io(bounce.memory().write_at(0, chunk)))
                    .and_then(|()| self.rma(xfer, rma)),
                RmaKind::Read => self
                    .rma(xfer, rma)
                    .and_then(|()| bounce_io(bounce.memory().read_at(0, chunk)))
                    .and_then(|()| dev.write_from_host(op.local_offset + done, chunk)),
            };
            if let Err(e) = step {
                break Err(e);
            }
            done += n;
        };
        self.scratch = scratch;
        result
    }

    fn rma(&self, xfer: &XferState, rma: RmaOp<'_>) -> Result<()> {
        // Between ops nothing is expected on the control connection, so input there (EOF
        // included) while waiting means the peer closed it.
        let control = Arc::clone(&self.control);
        let mut peer_alive = || match control.try_lock() {
            Ok(c) => !c.has_input(),
            Err(_) => true,
        };
        self.node
            .ep
            .run_watched(&[rma], xfer.time_left(), &mut peer_alive)
            .map_err(|e| match e {
                FabricError::Timeout { .. } => xfer.timeout_error(),
                other => fabric_err(other),
            })
    }
}

/// The bounce buffer's copy in or out: it is `BOUNCE` bytes and chunks are at most that.
fn bounce_io(in_bounds: bool) -> Result<()> {
    if in_bounds {
        Ok(())
    } else {
        Err(Error::InvalidArgument(
            "staged chunk larger than the fabric bounce buffer".into(),
        ))
    }
}
