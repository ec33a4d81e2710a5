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
//!   deadline; a completion error fails the op by name. The notification goes on the control
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
use crate::region::{LeaseKind, RegionInner, RegionKey, Registry};
use crate::transfer::{OpKind, XferState};
use crate::transport::SerialQueue;
use crate::wire::Msg;

/// Queue pairs per peer connection.
const QPS_PER_PEER: u16 = 2;
/// Completion-queue entries per peer connection.
const CQ_ENTRIES: u32 = 1024;

fn rdma_err(e: impl Into<RdmaError>) -> Error {
    Error::Rdma(Box::new(e.into()))
}

/// This agent's RDMA endpoint and the registrations it made for its regions.
pub(crate) struct RdmaNode {
    ep: RdmaEndpoint,
    /// Region id → its registration (dropped, and the range invalidated, with the region).
    regs: Mutex<HashMap<u64, MrHandle>>,
}

impl std::fmt::Debug for RdmaNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl RdmaNode {
    /// The first RDMA device whose endpoint opens (or `GDX_IB_DEVICE`), or why there is none:
    /// [`Error::Rdma`] with the verbs error (no device, or the one device failed),
    /// [`Error::InvalidArgument`] for a `GDX_IB_DEVICE` that names no device,
    /// [`Error::RdmaRefused`] naming each device when several failed.
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
                    return Ok(RdmaNode {
                        ep,
                        regs: Mutex::new(HashMap::new()),
                    })
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
                Err(Error::RdmaRefused(format!(
                    "no RDMA device port opened: {}",
                    each.join("; ")
                )))
            }
        }
    }

    /// "mlx5_0 port 1 (Ethernet, GID index 3)".
    pub(crate) fn describe(&self) -> String {
        format!(
            "{} port {} ({}, GID index {})",
            self.ep.device(),
            self.ep.port().number,
            self.ep.link(),
            self.ep.gid().index
        )
    }

    /// The registration of a region, made on first use.
    fn register(&self, r: &RegionInner) -> Result<MrHandle> {
        let mut regs = self.regs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = regs.get(&r.id) {
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
        let h = self.ep.register(&mem).map_err(rdma_err)?;
        if h.handle.mechanism() == Mechanism::Staged {
            return Err(Error::RdmaRefused(format!(
                "region {} ({}) has no GPUDirect RDMA registration on {} (tried: {:?}); \
                 connect with GDX_TRANSPORTS=tcp,shm to stage it over tcp",
                r.id,
                r.location,
                self.ep.device(),
                h.handle.attempts()
            )));
        }
        regs.insert(r.id, Arc::clone(&h));
        Ok(h)
    }

    /// Drops a region's registration and invalidates its range: called when the region is
    /// removed, so the NIC stops touching the memory before it is freed.
    pub(crate) fn forget(&self, region: u64) {
        let h = self
            .regs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&region);
        if let Some(h) = h {
            self.ep.invalidate(&h.range);
        }
    }

    /// The target's answer to `RdmaRegion`: checks the key and access, registers the region and
    /// says where it is.
    pub(crate) fn expose(&self, reg: &Registry, id: u64, key: RegionKey) -> Result<Msg> {
        let r = reg.get(id)?;
        if !r.key.ct_eq(&key) {
            return Err(Error::BadKey { region: id });
        }
        if !r.access.remote_write {
            // Registrations allow remote read and write; an rkey would also allow writes.
            return Err(Error::ReadOnly { region: id });
        }
        let h = self.register(&r)?;
        let remote = h.handle.remote_region(id).ok_or_else(|| {
            Error::RdmaRefused(format!("region {id} has no rkey (it is not registered)"))
        })?;
        Ok(Msg::RdmaRegionInfo {
            addr: remote.addr,
            len: remote.len,
            rkey: remote.rkey,
            mechanism: h.handle.mechanism().to_string(),
        })
    }

    /// The target's side of `RdmaConnect`: connects queue pairs to the initiator's and returns
    /// them with this side's connection data.
    pub(crate) fn accept(&self, initiator: &[u8]) -> Result<(Qp, Vec<u8>)> {
        let theirs = ConnData::decode(initiator).map_err(rdma_err)?;
        let cq = self.ep.completion_queue(CQ_ENTRIES).map_err(rdma_err)?;
        let prepared = self.ep.prepare(&cq, QPS_PER_PEER).map_err(rdma_err)?;
        let mine = prepared.conn_data().encode().map_err(rdma_err)?;
        let qp = prepared.connect(&theirs).map_err(rdma_err)?;
        Ok((qp, mine))
    }

    /// The initiator's side: queue pairs connected through `control` (`RdmaConnect` both
    /// ways).
    pub(crate) fn connect(&self, control: &mut Conn) -> Result<Qp> {
        let cq = self.ep.completion_queue(CQ_ENTRIES).map_err(rdma_err)?;
        let prepared = self.ep.prepare(&cq, QPS_PER_PEER).map_err(rdma_err)?;
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

struct Worker {
    node: Arc<RdmaNode>,
    qp: Qp,
    control: Arc<Mutex<Conn>>,
    /// Remote region id → where it is (asked once per region).
    remote: HashMap<u64, RemoteRegion>,
    wait: Duration,
}

/// Starts the worker thread that runs transfers over one peer's queue pairs, one at a time; the returned
/// [`SerialQueue`] is the whole submitting side.
pub(crate) fn spawn(
    node: Arc<RdmaNode>,
    qp: Qp,
    control: Arc<Mutex<Conn>>,
    wait: Duration,
) -> Result<SerialQueue> {
    let w = Worker {
        node,
        qp,
        control,
        remote: HashMap::new(),
        wait,
    };
    SerialQueue::spawn("gdx-rdma", move |rx, alive| worker(w, rx, alive))
}

fn worker(mut w: Worker, rx: Receiver<Arc<XferState>>, alive: Arc<AtomicBool>) {
    for xfer in rx {
        for i in 0..xfer.ops.len() {
            if xfer.expired() {
                xfer.chunk_done(i, 0, Err(xfer.timeout_error()));
                continue;
            }
            let r = w.run_op(&xfer, i);
            if let Err(e) = &r {
                if matches!(e, Error::PeerLost(_)) {
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

impl Worker {
    fn remote_region(&mut self, id: u64, key: RegionKey) -> Result<RemoteRegion> {
        if let Some(r) = self.remote.get(&id) {
            return Ok(*r);
        }
        let reply = self
            .control
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .request(&Msg::RdmaRegion {
                region: id,
                key,
                write: true,
            })?;
        let Msg::RdmaRegionInfo {
            addr, len, rkey, ..
        } = reply
        else {
            return Err(Error::Protocol(format!(
                "expected RdmaRegionInfo, got frame type {}",
                reply.kind()
            )));
        };
        let r = RemoteRegion {
            id,
            addr,
            len,
            rkey,
        };
        self.remote.insert(id, r);
        Ok(r)
    }

    fn run_op(&mut self, xfer: &XferState, i: usize) -> Result<()> {
        let op = xfer.op(i);
        let remote = self.remote_region(op.remote.id, op.remote.key)?;
        let (kind, rdma) = match op.kind {
            OpKind::Write => (LeaseKind::Source, RdmaOp::Write),
            OpKind::Read => (LeaseKind::Sink, RdmaOp::Read),
        };
        let _lease = op.local.lease(kind, self.wait)?;
        let mr = self.node.register(op.local)?;
        let item = WorkItem::between(&mr, op.local_offset, &remote, op.remote_offset, op.len)
            .map_err(rdma_err)?;
        let left = xfer.time_left();
        self.qp.run(rdma, &[item], left).map_err(rdma_err)?;
        Ok(())
    }
}
