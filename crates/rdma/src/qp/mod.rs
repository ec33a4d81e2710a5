//! RC connections in two typed steps: [`PreparedQp`] (queue pairs in INIT, with the
//! [`ConnData`] to send to the peer) → [`PreparedQp::connect`] with the peer's data → [`Qp`]
//! (queue pairs in RTS), which posts batches of RDMA WRITEs and READs.
//!
//! Posting ([`Qp::post_write`], [`Qp::post_read`]):
//! - every item is checked before anything is posted: the local range lies inside its
//!   registration, the registration is direct (not staged) and on this device, the remote
//!   range does not wrap;
//! - items larger than the configured chunk are split, and chunks are spread round-robin over
//!   the connection's queue pairs (several QPs per peer keep large transfers from being
//!   limited by one QP's outstanding-READ window);
//! - a batch that does not fit the free send-queue slots is refused whole
//!   ([`RdmaError::QueueFull`]): poll, then retry.

use crate::batch::{check_ranges, plan_chunks};
use crate::conn::{ConnData, QpInfo, RemoteRegion, MAX_24BIT};
use crate::cq::{CompletionQueue, MrHandle, Pending, Ticket};
use crate::endpoint::RdmaEndpoint;
use crate::error::RdmaError;
use crate::gid::LinkKind;

mod run;
use gdx_sys::verbs::{self, Access, QpCaps, RdmaOp, RtrAttr, RtsAttr, SendWr};
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::time::Instant;

/// Largest single work request (the verbs length is 32-bit; stay well inside it).
const MAX_WR_BYTES: u64 = 1 << 30;

/// One RDMA WRITE or READ: `len` bytes between local address `local_addr` (inside
/// `local`'s registration) and `remote_addr` in the peer's region with `rkey`.
#[derive(Debug, Clone)]
pub struct WorkItem<'a> {
    /// The local registration.
    pub local: &'a MrHandle,
    /// First local byte, in the registration's address space (host address or GPU device
    /// address).
    pub local_addr: u64,
    /// First remote byte, in the remote region's address space.
    pub remote_addr: u64,
    /// The remote region's key.
    pub rkey: u32,
    /// Bytes.
    pub len: u64,
}

impl<'a> WorkItem<'a> {
    /// `len` bytes at `local_offset` into `local`'s registered range, to or from
    /// `remote_offset` in `remote`; both ranges bounds-checked.
    pub fn between(
        local: &'a MrHandle,
        local_offset: u64,
        remote: &RemoteRegion,
        remote_offset: u64,
        len: u64,
    ) -> Result<WorkItem<'a>, RdmaError> {
        let r = local.range;
        if local_offset.checked_add(len).is_none_or(|e| e > r.len) {
            return Err(RdmaError::OutOfBounds {
                what: "local registration".into(),
                offset: local_offset,
                len,
                size: r.len,
            });
        }
        let remote_addr =
            remote
                .address_of(remote_offset, len)
                .ok_or_else(|| RdmaError::OutOfBounds {
                    what: format!("remote region {}", remote.id),
                    offset: remote_offset,
                    len,
                    size: remote.len,
                })?;
        Ok(WorkItem {
            local,
            local_addr: r.addr + local_offset,
            remote_addr,
            rkey: remote.rkey,
            len,
        })
    }
}

/// Random 24-bit packet sequence numbers (std's per-process random keys; no extra crate).
fn random_psn() -> u32 {
    let mut h = RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    (h.finish() as u32) & MAX_24BIT
}

/// Queue pairs in INIT and this side's connection data; connect with the peer's.
pub struct PreparedQp {
    ep: RdmaEndpoint,
    cq: CompletionQueue,
    qps: Vec<verbs::QueuePair>,
    local: ConnData,
    depth: u32,
}

impl fmt::Debug for PreparedQp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PreparedQp")
            .field("local", &self.local)
            .finish()
    }
}

impl PreparedQp {
    pub(crate) fn new(
        ep: RdmaEndpoint,
        cq: &CompletionQueue,
        n: u16,
    ) -> Result<PreparedQp, RdmaError> {
        let n = usize::from(n);
        if n == 0 || n > crate::conn::MAX_QPS {
            return Err(RdmaError::InvalidArgument(format!(
                "{n} queue pairs asked; 1 to {} allowed",
                crate::conn::MAX_QPS
            )));
        }
        if !cq.shared.cq.context().same(&ep.inner.ctx) {
            return Err(RdmaError::InvalidArgument(format!(
                "the completion queue belongs to {}, not {}",
                cq.shared.device,
                ep.device()
            )));
        }
        let cfg = &ep.inner.config;
        let depth = cfg.max_send_wr.min(ep.caps().max_qp_wr.max(1));
        cq.reserve(n, depth)?;
        let port = ep.inner.port.number;
        let mut qps = Vec::with_capacity(n);
        let made = (|| {
            for _ in 0..n {
                let qp = verbs::QueuePair::create_rc(
                    &cq.shared.cq,
                    QpCaps {
                        max_send_wr: depth,
                        max_send_sge: 1,
                        max_inline_data: 0,
                    },
                )?;
                qp.modify_to_init(port, 0, Access::ALL)?;
                qps.push(qp);
            }
            Ok::<(), RdmaError>(())
        })();
        if let Err(e) = made {
            // The queue pairs made so far are destroyed with `qps`; nothing was posted.
            drop(qps);
            cq.release(n, depth);
            return Err(e);
        }
        let p = &ep.inner.port;
        let mtu = p
            .active_mtu_bytes
            .unwrap_or(1024)
            .min(cfg.max_mtu.unwrap_or(4096));
        let mtu = [4096, 2048, 1024, 512, 256]
            .into_iter()
            .find(|m| *m <= mtu)
            .unwrap_or(256);
        let gid = &ep.inner.gid;
        let local = ConnData {
            device: ep.device().chars().take(crate::conn::MAX_NAME).collect(),
            port,
            link: ep.inner.link,
            lid: p.lid,
            gid: gid.gid,
            gid_index: u8::try_from(gid.index).unwrap_or(0),
            mtu_bytes: mtu,
            max_rd_atomic: ep.caps().max_qp_rd_atom.clamp(1, 16),
            qps: qps
                .iter()
                .map(|q| QpInfo {
                    qpn: q.qp_num(),
                    psn: random_psn(),
                })
                .collect(),
            regions: Vec::new(),
        };
        Ok(PreparedQp {
            ep,
            cq: cq.clone(),
            qps,
            local,
            depth,
        })
    }

    /// This side's connection data, to send to the peer.
    pub fn conn_data(&self) -> &ConnData {
        &self.local
    }

    /// Add regions the peer may target to this side's connection data.
    pub fn advertise(&mut self, regions: impl IntoIterator<Item = RemoteRegion>) {
        self.local.regions.extend(regions);
    }

    /// Move every queue pair to RTS towards the peer described by `remote` (queue pairs are
    /// paired by position). On failure the queue pairs are destroyed.
    pub fn connect(self, remote: &ConnData) -> Result<Qp, RdmaError> {
        remote.validate()?;
        let me = &self.local;
        if remote.qps.len() != self.qps.len() {
            return Err(RdmaError::Mismatch(format!(
                "this side has {} queue pair(s), the peer {}",
                self.qps.len(),
                remote.qps.len()
            )));
        }
        if remote.link != me.link {
            return Err(RdmaError::Mismatch(format!(
                "this side's link layer is {}, the peer's {}",
                me.link, remote.link
            )));
        }
        if me.link == LinkKind::InfiniBand && remote.lid == 0 {
            return Err(RdmaError::Mismatch(format!(
                "the peer ({} port {}) is InfiniBand with LID 0: its port has no LID (subnet manager?)",
                remote.device, remote.port
            )));
        }
        let cfg = &self.ep.inner.config;
        let path_mtu = me.mtu_bytes.min(remote.mtu_bytes);
        let use_grh = self.ep.inner.gid.use_grh;
        let caps = self.ep.caps();
        let rd_init = caps
            .max_qp_init_rd_atom
            .clamp(1, 16)
            .min(remote.max_rd_atomic.max(1));
        for (i, qp) in self.qps.iter().enumerate() {
            let (mine, theirs) = (me.qps[i], remote.qps[i]);
            qp.modify_to_rtr(&RtrAttr {
                dest_qp_num: theirs.qpn,
                rq_psn: theirs.psn,
                path_mtu_bytes: path_mtu,
                dlid: remote.lid,
                dgid: use_grh.then(|| remote.gid.octets()),
                sgid_index: me.gid_index,
                hop_limit: 255,
                traffic_class: cfg.traffic_class,
                sl: cfg.service_level,
                port: me.port,
                max_dest_rd_atomic: me.max_rd_atomic,
                min_rnr_timer: 12,
            })?;
            qp.modify_to_rts(&RtsAttr {
                sq_psn: mine.psn,
                timeout: cfg.ack_timeout,
                retry_cnt: cfg.retry_cnt.min(7),
                rnr_retry: cfg.rnr_retry.min(7),
                max_rd_atomic: rd_init,
            })?;
        }
        log::info!(
            "{} port {} connected to {} port {} ({} QP(s), MTU {path_mtu}, {})",
            me.device,
            me.port,
            remote.device,
            remote.port,
            self.qps.len(),
            me.link
        );
        let chunk = cfg.chunk_bytes.clamp(4096, MAX_WR_BYTES);
        // Move the queue pairs out; `self` then drops with none left (releasing nothing).
        let mut this = self;
        let qps = std::mem::take(&mut this.qps);
        Ok(Qp {
            chunk,
            depth: this.depth,
            ep: this.ep.clone(),
            cq: this.cq.clone(),
            qps,
            local: this.local.clone(),
            remote: remote.clone(),
            next: 0,
        })
    }
}

impl Drop for PreparedQp {
    fn drop(&mut self) {
        // Queue pairs never connected: nothing is outstanding on them.
        let n = self.qps.len();
        self.qps.clear();
        self.cq.release(n, self.depth);
    }
}

/// A connected set of RC queue pairs to one peer.
pub struct Qp {
    ep: RdmaEndpoint,
    cq: CompletionQueue,
    qps: Vec<verbs::QueuePair>,
    local: ConnData,
    remote: ConnData,
    depth: u32,
    chunk: u64,
    next: usize,
}

impl fmt::Debug for Qp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Qp")
            .field("device", &self.ep.device())
            .field("qps", &self.local.qps)
            .field("peer", &self.remote.device)
            .finish()
    }
}

impl Qp {
    /// This side's connection data.
    pub fn local(&self) -> &ConnData {
        &self.local
    }

    /// The peer's connection data (with the regions it advertised).
    pub fn remote(&self) -> &ConnData {
        &self.remote
    }

    /// The completion queue this connection reports to.
    pub fn completion_queue(&self) -> &CompletionQueue {
        &self.cq
    }

    /// Free send-queue slots over all queue pairs.
    pub fn free_slots(&self) -> usize {
        let t = self.cq.shared.lock();
        self.qps
            .iter()
            .map(|q| (self.depth as usize).saturating_sub(t.outstanding(q.qp_num())))
            .sum()
    }

    /// Post RDMA WRITEs (local → remote) for `items` as one batch.
    pub fn post_write(&mut self, items: &[WorkItem<'_>]) -> Result<Ticket, RdmaError> {
        self.post(RdmaOp::Write, items)
    }

    /// Post RDMA READs (remote → local) for `items` as one batch.
    pub fn post_read(&mut self, items: &[WorkItem<'_>]) -> Result<Ticket, RdmaError> {
        self.post(RdmaOp::Read, items)
    }

    fn check(&self, it: &WorkItem<'_>) -> Result<u32, RdmaError> {
        let reg = &it.local.handle;
        let Some(lkey) = reg.lkey() else {
            return Err(RdmaError::NotRegistered {
                what: it.local.range.to_string(),
            });
        };
        if reg.device() != self.ep.device() {
            return Err(RdmaError::WrongDevice {
                region_device: reg.device().to_string(),
                qp_device: self.ep.device().to_string(),
            });
        }
        check_ranges(it.local.range, it.local_addr, it.remote_addr, it.len)?;
        Ok(lkey)
    }

    fn post(&mut self, op: RdmaOp, items: &[WorkItem<'_>]) -> Result<Ticket, RdmaError> {
        let qp_nums: Vec<u32> = self.qps.iter().map(verbs::QueuePair::qp_num).collect();
        if let Some((qp_num, why)) = self.cq.shared.lock().broken(&qp_nums) {
            return Err(RdmaError::Broken { qp_num, why });
        }
        let lkeys = items
            .iter()
            .map(|it| self.check(it))
            .collect::<Result<Vec<u32>, _>>()?;
        let lens: Vec<u64> = items.iter().map(|it| it.len).collect();
        let mut t = self.cq.shared.lock();
        let free: Vec<usize> = qp_nums
            .iter()
            .map(|q| (self.depth as usize).saturating_sub(t.outstanding(*q)))
            .collect();
        let plan = plan_chunks(&lens, self.chunk, &free, self.next)?;
        self.next = plan.next;
        let ticket = t.open_ticket(&plan.per_item);
        let mut lists: Vec<Vec<SendWr>> = vec![Vec::new(); self.qps.len()];
        let mut ids: Vec<Vec<u64>> = vec![Vec::new(); self.qps.len()];
        for c in &plan.chunks {
            let it = &items[c.item];
            let id = t.add(Pending {
                ticket,
                item: c.item,
                op,
                len: c.len,
                remote_addr: it.remote_addr + c.offset,
                rkey: it.rkey,
                qp_num: qp_nums[c.qp],
                _keep: Some(it.local.clone()),
            });
            lists[c.qp].push(SendWr {
                wr_id: id,
                op,
                local_addr: it.local_addr + c.offset,
                lkey: lkeys[c.item],
                // Chunks are at most MAX_WR_BYTES (1 GiB).
                len: c.len as u32,
                remote_addr: it.remote_addr + c.offset,
                rkey: it.rkey,
                signaled: true,
            });
            ids[c.qp].push(id);
        }
        drop(t);
        for (q, list) in lists.iter().enumerate() {
            // SAFETY: every request's local range was checked to lie inside its registration,
            // which is on this device (`check`) and is kept alive by its table entry (the
            // `MrHandle` in `Pending`) until the completion is polled or the queue pair is
            // destroyed (`Qp::drop` destroys the queue pairs before forgetting the entries).
            // The memory behind a registration outlives it (`Memory`'s contract for host
            // memory; the registration holds GPU buffers).
            if let Err(e) = unsafe { self.qps[q].post_send(list) } {
                let mut t = self.cq.shared.lock();
                let unposted: Vec<u64> = ids[q][e.accepted..]
                    .iter()
                    .copied()
                    .chain(ids[q + 1..].iter().flatten().copied())
                    .collect();
                t.unpost(&unposted);
                for n in &qp_nums {
                    t.mark_broken(*n, e.to_string());
                }
                drop(t);
                // Flush what was accepted; the connection is unusable from here.
                for qp in &self.qps {
                    if let Err(err) = qp.modify_to_error() {
                        log::warn!("{err}");
                    }
                }
                return Err(RdmaError::Verbs(e.error));
            }
        }
        Ok(Ticket(ticket))
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        let nums: Vec<u32> = self.qps.iter().map(verbs::QueuePair::qp_num).collect();
        // Destroy first: after ibv_destroy_qp the NIC no longer touches the memory, so the
        // registrations held by the outstanding entries may go.
        self.qps.clear();
        let n = nums.len();
        self.cq.shared.lock().forget_qps(&nums);
        self.cq.release(n, self.depth);
    }
}
