//! GPU memory behind agent regions ([`AgentGpu`], kept by [`crate::Agent::register_gpu`]) and
//! the staging that moves its bytes over the host transports ([`Stager`]).
//!
//! Over tcp a GPU region's bytes cross the wire through pinned bounce buffers, pipelined on
//! both ends: the sender queues the device-to-host copies of the next chunks while it sends
//! the current one, and the receiver queues each chunk's host-to-device copy and goes on
//! receiving the next, acknowledging a chunk only once its copy has finished. Over shm (one
//! kernel) the copies are the driver's pageable copies between the GPU and the mapped memory,
//! unless the IPC path applies (see `transport::shm`).
//!
//! Invariants:
//! - A [`Stager`] belongs to one thread (one connection) and has, per GPU and direction, its
//!   own stream and a ring of [`DEPTH`] pinned slots. A slot is handed out again only after its previous copy
//!   finished (the slots' last-use markers make the wait), so callers keep at most `DEPTH - 1`
//!   tickets outstanding and wait for the oldest before taking another.
//! - GPU memory is never dereferenced on the host: every access is a CUDA copy.

use std::collections::HashMap;

use gdx_sys::cuda::{Dst, PinnedHostBuffer, Src, Stream};

use super::{DeviceRegion, IpcDesc, LocalPeer};
use crate::error::{Error, Result};

/// Pinned slots per GPU lane: one being filled or sent, the others in flight.
pub(crate) const DEPTH: usize = 4;

/// The smallest slot (slots grow to the largest chunk seen).
const MIN_SLOT: usize = 1 << 20;

/// The GPU memory of an agent region, the `LocalPeer` that registered it, and the IPC handle
/// same-host peers map, or why there is none.
#[derive(Clone)]
pub(crate) struct AgentGpu {
    pub(crate) region: DeviceRegion,
    pub(crate) peer: LocalPeer,
    pub(crate) ipc: Option<IpcDesc>,
    pub(crate) no_ipc: Option<String>,
}

impl std::fmt::Debug for AgentGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentGpu")
            .field("region", &self.region)
            .field("ipc", &self.ipc.is_some())
            .finish()
    }
}

impl AgentGpu {
    /// Copies ordinary host bytes into the region at `offset` and waits (the driver stages
    /// pageable memory itself).
    pub(crate) fn write_from_host(&self, offset: u64, src: &[u8]) -> Result<()> {
        let g = self.peer.gpu(self.region.gpu())?;
        self.region.write_from_host(&g.stream, offset, src)
    }

    /// Copies `dst.len()` bytes of the region at `offset` into ordinary host memory and waits.
    pub(crate) fn read_to_host(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        let g = self.peer.gpu(self.region.gpu())?;
        self.region.read_to_host(&g.stream, offset, dst)
    }
}

/// A staged chunk: which slot of which GPU lane holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ticket {
    lane: (u32, bool),
    slot: usize,
    len: usize,
}

struct Lane {
    stream: Stream,
    slots: Vec<Option<PinnedHostBuffer>>,
    next: usize,
}

/// Per-connection staging through pinned slots (see the module docs).
#[derive(Default)]
pub(crate) struct Stager {
    /// (GPU, towards the device) → lane: the two directions never share slots, so a slot
    /// staged for sending is not refilled by a receive.
    lanes: HashMap<(u32, bool), Lane>,
}

impl std::fmt::Debug for Stager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stager")
            .field("gpus", &self.lanes.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Stager {
    /// The lane of `dev`'s GPU and the index of the next slot, grown to hold `len` bytes.
    fn take_slot(
        &mut self,
        dev: &AgentGpu,
        to_device: bool,
        len: usize,
    ) -> Result<(&mut Lane, usize)> {
        let gpu = dev.region.gpu();
        let key = (gpu, to_device);
        let g = dev.peer.gpu(gpu)?;
        let lane = match self.lanes.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(Lane {
                stream: Stream::new(&g.ctx)?,
                slots: (0..DEPTH).map(|_| None).collect(),
                next: 0,
            }),
        };
        let i = lane.next;
        lane.next = (i + 1) % DEPTH;
        let small = lane.slots[i].as_ref().is_none_or(|b| b.len() < len);
        if small {
            // Dropping the old slot waits for its last copy.
            lane.slots[i] = None;
            let size = len.next_power_of_two().max(MIN_SLOT);
            lane.slots[i] = Some(PinnedHostBuffer::new(&g.ctx, size)?);
        }
        Ok((lane, i))
    }

    /// Host-side fill of the next slot: waits until the slot's previous copy is done and
    /// returns its first `len` bytes to receive into. Follow with [`Stager::queue_to_device`].
    pub(crate) fn fill(&mut self, dev: &AgentGpu, len: usize) -> Result<(Ticket, &mut [u8])> {
        let lane_key = (dev.region.gpu(), true);
        let (lane, i) = self.take_slot(dev, true, len)?;
        let buf = lane.slots[i]
            .as_mut()
            .ok_or_else(|| Error::unavailable(None, "staging slot missing"))?
            .as_mut_slice()?;
        Ok((
            Ticket {
                lane: lane_key,
                slot: i,
                len,
            },
            &mut buf[..len],
        ))
    }

    /// Queues the copy of a filled slot into `dev` at `offset`; returns at once.
    pub(crate) fn queue_to_device(&mut self, t: Ticket, dev: &AgentGpu, offset: u64) -> Result<()> {
        let lane = self.lane(t)?;
        let slot = lane.slots[t.slot]
            .as_ref()
            .ok_or_else(|| Error::unavailable(None, "staging slot missing"))?;
        let mut buf = dev.region.inner.lock();
        lane.stream.copy(
            Dst::Device(&mut buf),
            to_usize(offset)?,
            Src::Host(slot),
            0,
            t.len,
        )?;
        Ok(())
    }

    /// Queues the copy of `len` bytes of `dev` at `offset` into the next slot; returns at once.
    /// [`Stager::bytes`] waits for it.
    pub(crate) fn queue_from_device(
        &mut self,
        dev: &AgentGpu,
        offset: u64,
        len: usize,
    ) -> Result<Ticket> {
        let lane_key = (dev.region.gpu(), false);
        let (lane, i) = self.take_slot(dev, false, len)?;
        let slot = lane.slots[i]
            .as_mut()
            .ok_or_else(|| Error::unavailable(None, "staging slot missing"))?;
        let buf = dev.region.inner.lock();
        lane.stream.copy(
            Dst::Host(slot),
            0,
            Src::Device(&buf),
            to_usize(offset)?,
            len,
        )?;
        Ok(Ticket {
            lane: lane_key,
            slot: i,
            len,
        })
    }

    /// Waits for a ticket's copy (either direction).
    pub(crate) fn wait(&self, t: Ticket) -> Result<()> {
        self.bytes(t).map(|_| ())
    }

    /// Waits for a [`Stager::queue_from_device`] copy and returns the staged bytes.
    pub(crate) fn bytes(&self, t: Ticket) -> Result<&[u8]> {
        let lane = self.lanes.get(&t.lane).ok_or_else(|| {
            Error::unavailable(None, format!("no staging lane for GPU {}", t.lane.0))
        })?;
        let slot = lane.slots[t.slot]
            .as_ref()
            .ok_or_else(|| Error::unavailable(None, "staging slot missing"))?;
        Ok(&slot.as_slice()?[..t.len])
    }

    fn lane(&mut self, t: Ticket) -> Result<&mut Lane> {
        self.lanes.get_mut(&t.lane).ok_or_else(|| {
            Error::unavailable(None, format!("no staging lane for GPU {}", t.lane.0))
        })
    }
}

fn to_usize(v: u64) -> Result<usize> {
    usize::try_from(v).map_err(|_| Error::InvalidArgument(format!("offset {v} too large")))
}

/// Which way [`copy_span`] copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dir {
    /// From the region into the host span.
    OutOfRegion,
    /// From the host span into the region.
    IntoRegion,
}

/// Copies `len` bytes between a leased region at `offset` and the host span at `host`:
/// `memcpy` for host regions, the driver's pageable copy (waited for) for GPU regions.
///
/// # Safety
/// `host..host + len` must be valid host memory (writable for [`Dir::OutOfRegion`]) that no
/// Rust reference aliases during the call and that does not overlap the region; the caller
/// has bounds-checked `offset + len` against the region and holds a lease of the right kind.
pub(crate) unsafe fn copy_span(
    lease: &crate::region::Lease,
    offset: u64,
    host: *mut u8,
    len: usize,
    dir: Dir,
) -> Result<()> {
    if let Some(dev) = lease.device() {
        return match dir {
            Dir::OutOfRegion => {
                // SAFETY: per the contract, `host` is valid, writable and unaliased for `len`.
                let out = unsafe { std::slice::from_raw_parts_mut(host, len) };
                dev.read_to_host(offset, out)
            }
            Dir::IntoRegion => {
                // SAFETY: per the contract, `host` is valid for `len` bytes.
                let src = unsafe { std::slice::from_raw_parts(host.cast_const(), len) };
                dev.write_from_host(offset, src)
            }
        };
    }
    let region = lease.ptr_at(offset)?;
    let (src, dst) = match dir {
        Dir::OutOfRegion => (region.cast_const(), host),
        Dir::IntoRegion => (host.cast_const(), region),
    };
    // SAFETY: both spans are `len` bytes of live memory (the region's under the lease,
    // bounds-checked by the caller) and do not overlap (contract).
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
    Ok(())
}
