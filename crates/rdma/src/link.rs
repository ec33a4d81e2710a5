//! One side of a one-sided RDMA link between two processes, as single operations: allocate and
//! register a buffer (host or GPU) on the NIC nearest to it, prepare queue pairs, connect them
//! to the peer's [`ConnData`] (exchanged by the caller over a channel of its own), then post a
//! batch of WRITE or READ operations against the peer's advertised region and wait for their
//! completions.
//!
//! No timing, no statistics and no protocol here: gdx-bench's rdma cases time
//! [`Link::run`] and summarise with the bench framework, and its bench server
//! (`gdx serve --rdma-listen`) speaks the control protocol.
//!
//! Host buffers are filled with a seeded pattern ([`pattern_checksum`] gives the checksum of
//! one without building it), so a caller can verify what a WRITE or READ moved; GPU buffers
//! are not filled or checked.

use crate::conn::{ConnData, RemoteRegion};
use crate::cq::{CompletionQueue, MrHandle};
use crate::endpoint::{EndpointConfig, RdmaEndpoint};
use crate::error::RdmaError;
use crate::nic::{choose_nics, GpuRef, MemPlace};
use crate::qp::{PreparedQp, Qp, WorkItem};
use crate::register::{Mechanism, Memory};
use crate::RdmaOp;
use gdx_base::pattern::{fill_pattern_at, pattern};
use gdx_sys::cuda::{Context, Cuda, DeviceBuffer};
use std::sync::Arc;
use std::time::Duration;

/// Where a side's buffer lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkMem {
    /// Host memory.
    Host,
    /// GPU memory (CUDA ordinal).
    Gpu(u32),
}

/// A link buffer: host bytes or a GPU allocation.
enum Buffer {
    Host(Vec<u8>),
    Gpu(Arc<DeviceBuffer>),
}

impl Buffer {
    fn new(mem: LinkMem, len: usize, seed: u8) -> Result<Buffer, RdmaError> {
        match mem {
            LinkMem::Host => Ok(Buffer::Host(pattern(len, u64::from(seed)))),
            LinkMem::Gpu(n) => {
                let cuda = Cuda::load()?;
                let ctx = Context::new(&cuda.device(n)?)?;
                Ok(Buffer::Gpu(Arc::new(DeviceBuffer::new(&ctx, len)?)))
            }
        }
    }

    fn memory(&mut self) -> Memory {
        match self {
            // SAFETY: the vector outlives every registration of it: `Side` and `Link` declare
            // the buffer as their last field, so the queue pairs, the registration and the
            // endpoint (with its cache) are dropped first; its bytes are only read by
            // `checksum`, which takes `&self` while no operation is posted (`run` waits for
            // every completion before it returns).
            Buffer::Host(v) => unsafe { Memory::host(v.as_mut_ptr(), v.len()) },
            Buffer::Gpu(b) => Memory::gpu(Arc::clone(b)),
        }
    }

    fn checksum(&self, len: usize) -> Option<u64> {
        match self {
            Buffer::Host(v) => Some(checksum(&v[..len.min(v.len())])),
            Buffer::Gpu(_) => None,
        }
    }
}

/// The checksum [`Link::checksum`] gives for `len` bytes of the pattern a host buffer opened
/// with `seed` starts with, without building them.
pub fn pattern_checksum(len: usize, seed: u8) -> u64 {
    // Built a block at a time from gdx-base's one pattern: no buffer of `len` bytes.
    let mut block = [0u8; 4096];
    let mut h = FNV_OFFSET;
    let mut done = 0;
    while done < len {
        let n = (len - done).min(block.len());
        fill_pattern_at(&mut block[..n], u64::from(seed), done);
        h = block[..n].iter().fold(h, |h, x| fnv(h, *x));
        done += n;
    }
    h
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

fn fnv(h: u64, x: u8) -> u64 {
    (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3)
}

fn checksum(b: &[u8]) -> u64 {
    b.iter().fold(FNV_OFFSET, |h, x| fnv(h, *x))
}

fn place(mem: LinkMem) -> Result<MemPlace, RdmaError> {
    Ok(match mem {
        LinkMem::Host => MemPlace::Host { numa: None },
        LinkMem::Gpu(n) => {
            let cuda = Cuda::load()?;
            let bdf = cuda.device(n)?.pci_bus_id()?;
            let bdf = bdf
                .parse()
                .map_err(|e| RdmaError::InvalidArgument(format!("GPU {n}: {e}")))?;
            MemPlace::Gpu(GpuRef::Bdf(bdf))
        }
    })
}

/// `device`, or the NIC nearest to `mem` (the first device when the topology says nothing).
fn open_for(
    mem: LinkMem,
    device: Option<&str>,
    config: &EndpointConfig,
) -> Result<RdmaEndpoint, RdmaError> {
    let devices = crate::discovery::discover()?;
    let name = match device {
        Some(d) => d.to_string(),
        None => {
            let topo = gdx_topo::discover().map_err(|e| RdmaError::InvalidArgument(e.to_string()));
            match topo.and_then(|t| Ok(choose_nics(&t, &place(mem)?)?)) {
                Ok(c) => c.rails[0].device.clone(),
                Err(e) => {
                    log::warn!("no topology-based NIC choice ({e}); using the first device");
                    devices[0].name.clone()
                }
            }
        }
    };
    RdmaEndpoint::open(&name, config.clone())
}

/// A side opened and registered, its queue pairs prepared but not connected.
///
/// Fields drop in declaration order: queue pairs, registration, completion queue and endpoint
/// go before the buffer they point into.
pub struct Side {
    prepared: PreparedQp,
    mr: MrHandle,
    cq: CompletionQueue,
    ep: RdmaEndpoint,
    buf: Buffer,
}

impl std::fmt::Debug for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Side")
            .field("device", &self.ep.device())
            .field("mechanism", &self.mr.handle.mechanism())
            .finish_non_exhaustive()
    }
}

impl Side {
    /// Allocate `len` bytes at `mem` (a host buffer holds the pattern of `seed`), open
    /// `device` (or the NIC nearest to `mem`), register the buffer and prepare `qps` queue
    /// pairs (0: the peer decides, as [`RdmaEndpoint::prepare`] takes it).
    ///
    /// # Errors
    /// [`RdmaError::Unavailable`] without libibverbs or a device; allocation, registration and
    /// queue-pair errors as gdx-rdma reports them.
    pub fn open(
        mem: LinkMem,
        len: usize,
        seed: u8,
        device: Option<&str>,
        config: &EndpointConfig,
        qps: u16,
    ) -> Result<Side, RdmaError> {
        // The endpoint is opened first so a machine without RDMA fails typed before any
        // GPU memory is allocated.
        let ep = open_for(mem, device, config)?;
        let mut buf = Buffer::new(mem, len, seed)?;
        let mr = ep.register(&buf.memory())?;
        let cq_qps = if qps == 0 { config.qps_per_peer } else { qps };
        let cq = ep.completion_queue(u32::from(cq_qps.max(1)) * config.max_send_wr)?;
        let prepared = ep.prepare(&cq, qps)?;
        Ok(Side {
            prepared,
            mr,
            cq,
            ep,
            buf,
        })
    }

    /// What the peer needs to connect to this side.
    pub fn conn_data(&self) -> &ConnData {
        self.prepared.conn_data()
    }

    /// Advertise the whole buffer to the peer (in [`Side::conn_data`]) as region 1, and return
    /// it: the side that is written to or read from calls this before sending its data.
    ///
    /// # Errors
    /// [`RdmaError::NotRegistered`] when the registration allows no remote access.
    pub fn advertise_buffer(&mut self) -> Result<RemoteRegion, RdmaError> {
        let region = self
            .mr
            .handle
            .remote_region(1)
            .ok_or_else(|| RdmaError::NotRegistered {
                what: "link buffer".into(),
            })?;
        self.prepared.advertise([region]);
        Ok(region)
    }

    /// How the buffer was registered.
    pub fn mechanism(&self) -> Mechanism {
        self.mr.handle.mechanism()
    }

    /// Connect the prepared queue pairs to the peer's.
    ///
    /// # Errors
    /// Queue-pair transition errors as gdx-rdma reports them.
    pub fn connect(self, remote: &ConnData) -> Result<Link, RdmaError> {
        let Side {
            prepared,
            mr,
            cq,
            ep,
            buf,
        } = self;
        let qp = prepared.connect(remote)?;
        Ok(Link {
            qp,
            mr,
            _cq: cq,
            ep,
            buf,
        })
    }
}

/// A connected side: posts batches against the peer's region.
///
/// Fields drop in declaration order, the buffer last (see [`Side`]).
pub struct Link {
    qp: Qp,
    mr: MrHandle,
    _cq: CompletionQueue,
    ep: RdmaEndpoint,
    buf: Buffer,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("device", &self.ep.device())
            .field("qps", &self.qps())
            .finish_non_exhaustive()
    }
}

impl Link {
    /// Post `count` operations `op` of `size` bytes each, from offset 0 of this side's buffer
    /// to offset 0 of `remote`, and wait for all of their completions (at most `timeout`).
    /// Returns the bytes moved.
    ///
    /// # Errors
    /// [`RdmaError::OutOfBounds`] when `size` exceeds either buffer; posting, completion and
    /// timeout errors as [`Qp::run`] reports them.
    pub fn run(
        &mut self,
        op: RdmaOp,
        remote: &RemoteRegion,
        size: u64,
        count: u32,
        timeout: Duration,
    ) -> Result<u64, RdmaError> {
        let item = WorkItem::between(&self.mr, 0, remote, 0, size)?;
        let items: Vec<WorkItem<'_>> = (0..count).map(|_| item.clone()).collect();
        self.qp.run(op, &items, timeout)
    }

    /// The checksum of the first `len` bytes of a host buffer; `None` for GPU memory.
    pub fn checksum(&self, len: usize) -> Option<u64> {
        self.buf.checksum(len)
    }

    /// How the buffer was registered.
    pub fn mechanism(&self) -> Mechanism {
        self.mr.handle.mechanism()
    }

    /// `mlx5_0 port 1`.
    pub fn local_device(&self) -> String {
        format!("{} port {}", self.ep.device(), self.ep.port().number)
    }

    /// The local RDMA device's name and port number, e.g. (`rxe0`, 1): where its counters are.
    pub fn local_port(&self) -> (String, u32) {
        (
            self.ep.device().to_string(),
            u32::from(self.ep.port().number),
        )
    }

    /// `mlx5_1 port 1`: the peer's device, from its connection data.
    pub fn remote_device(&self) -> String {
        let r = self.qp.remote();
        format!("{} port {}", r.device, r.port)
    }

    /// Queue pairs in use.
    pub fn qps(&self) -> usize {
        self.qp.local().qps.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_checksum_matches_a_built_buffer() {
        let b = Buffer::new(LinkMem::Host, 10_000, 2).unwrap();
        assert_eq!(b.checksum(10_000), Some(pattern_checksum(10_000, 2)));
        assert_ne!(pattern_checksum(10_000, 1), pattern_checksum(10_000, 2));
        assert_eq!(b.checksum(5), Some(pattern_checksum(5, 2)));
    }

    #[test]
    fn without_rdma_opening_a_side_fails_typed() {
        // On a machine with RDMA the hardware tests cover this path.
        let absent = crate::discovery::discover().is_err();
        if !gdx_base::testenv::precondition("no RDMA device", absent) {
            return;
        }
        let r = Side::open(LinkMem::Host, 4096, 1, None, &EndpointConfig::default(), 0);
        assert!(matches!(r, Err(RdmaError::Unavailable(_))), "{r:?}");
    }
}
