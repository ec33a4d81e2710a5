//! [`QueuePair`]: a reliable-connected (RC) queue pair: created in RESET
//! ([`QueuePair::create_rc`]), moved through INIT → RTR → RTS with the peer's numbers, and fed
//! RDMA WRITE / READ work requests in linked batches ([`QueuePair::post_send`]).
//!
//! Invariants: a queue pair holds its [`RdmaContext`] and its [`CompletionQueue`], so both
//! outlive it; it is destroyed exactly once, on drop, and a failed destroy is logged.
//! Receive queues are not used (one-sided operations only): `max_recv_wr` is 1 because some
//! providers refuse 0.

use super::context::RdmaContext;
use super::cq::CompletionQueue;
use super::error::{Errno, VerbsError};
use super::mr::Access;
use rdma_mummy_sys::{
    ibv_ah_attr, ibv_gid, ibv_global_route, ibv_qp, ibv_qp_attr, ibv_qp_attr_mask,
    ibv_qp_init_attr, ibv_qp_state, ibv_send_wr, ibv_sge, ibv_wr_opcode,
};
use std::ffi::c_int;
use std::fmt;
use std::ptr::NonNull;

/// Sizes asked for when creating a queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Outstanding send work requests.
    pub max_send_wr: u32,
    /// Scatter/gather entries per send work request.
    pub max_send_sge: u32,
    /// Bytes of inline data per work request (0: none).
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 256,
            max_send_sge: 1,
            max_inline_data: 0,
        }
    }
}

/// What the RESET/INIT → RTR transition needs: the peer's numbers and the path to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtrAttr {
    /// The peer's queue pair number.
    pub dest_qp_num: u32,
    /// The first packet sequence number the peer sends (its send PSN).
    pub rq_psn: u32,
    /// Path MTU in bytes: 256, 512, 1024, 2048 or 4096.
    pub path_mtu_bytes: u32,
    /// The peer's LID (InfiniBand without GRH); 0 on RoCE.
    pub dlid: u16,
    /// The peer's GID when a global route header is used (always on RoCE).
    pub dgid: Option<[u8; 16]>,
    /// The local GID index the GRH is sent from.
    pub sgid_index: u8,
    /// GRH hop limit.
    pub hop_limit: u8,
    /// GRH traffic class (DSCP << 2 | ECN on RoCE v2).
    pub traffic_class: u8,
    /// Service level.
    pub sl: u8,
    /// Local port number (from 1).
    pub port: u8,
    /// RDMA READ/atomic requests from the peer this side serves at once.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code (12 = 0.64 ms).
    pub min_rnr_timer: u8,
}

/// What the RTR → RTS transition needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtsAttr {
    /// The first packet sequence number this side sends.
    pub sq_psn: u32,
    /// Local ACK timeout code: 4.096 µs × 2^timeout (14 ≈ 67 ms, 20 ≈ 4.3 s).
    pub timeout: u8,
    /// Transport retries before `IBV_WC_RETRY_EXC_ERR` (0..=7).
    pub retry_cnt: u8,
    /// RNR retries (7 = infinite).
    pub rnr_retry: u8,
    /// RDMA READ/atomic requests this side has outstanding at once.
    pub max_rd_atomic: u8,
}

/// The one-sided operations posted here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RdmaOp {
    /// RDMA WRITE: local memory → remote memory.
    Write,
    /// RDMA READ: remote memory → local memory.
    Read,
}

/// One RDMA WRITE or READ work request with one scatter/gather entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWr {
    /// Reported back in the completion.
    pub wr_id: u64,
    /// Write or read.
    pub op: RdmaOp,
    /// Local address (in the local region's address space).
    pub local_addr: u64,
    /// Local region's lkey.
    pub lkey: u32,
    /// Bytes.
    pub len: u32,
    /// Remote address (in the remote region's address space).
    pub remote_addr: u64,
    /// Remote region's rkey.
    pub rkey: u32,
    /// Ask for a completion (unsignaled requests complete silently, in order).
    pub signaled: bool,
}

/// A batch that was not (fully) posted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ibv_post_send accepted {accepted} of the batch's work requests: {error}")]
pub struct PostError {
    /// Work requests accepted before the one that failed; they will complete.
    pub accepted: usize,
    /// Why the next one was refused.
    pub error: VerbsError,
}

/// An RC queue pair.
pub struct QueuePair {
    qp: NonNull<ibv_qp>,
    qp_num: u32,
    caps: QpCaps,
    ctx: RdmaContext,
    _cq: CompletionQueue,
}

// SAFETY: libibverbs makes `ibv_post_send` and `ibv_modify_qp` on one QP thread-safe
// (providers lock the send queue); the handle is destroyed only in `Drop`.
unsafe impl Send for QueuePair {}
// SAFETY: as above; shared references only post, which libibverbs serialises.
unsafe impl Sync for QueuePair {}

impl fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePair")
            .field("device", &self.ctx.name())
            .field("qp_num", &self.qp_num)
            .field("caps", &self.caps)
            .finish()
    }
}

/// `ibv_mtu` code for an MTU in bytes.
pub fn mtu_code(bytes: u32) -> Option<u32> {
    match bytes {
        256 => Some(1),
        512 => Some(2),
        1024 => Some(3),
        2048 => Some(4),
        4096 => Some(5),
        _ => None,
    }
}

impl QueuePair {
    /// Create an RC queue pair on `cq`'s device, reporting sends to `cq`.
    pub fn create_rc(cq: &CompletionQueue, caps: QpCaps) -> Result<QueuePair, VerbsError> {
        const CALL: &str = "ibv_create_qp";
        let ctx = cq.context().clone();
        let dev = ctx.caps();
        if caps.max_send_wr == 0 || (dev.max_qp_wr > 0 && caps.max_send_wr > dev.max_qp_wr) {
            return Err(VerbsError::InvalidArgument {
                call: CALL,
                reason: format!(
                    "{} send work requests asked; {} allows 1 to {}",
                    caps.max_send_wr,
                    ctx.name(),
                    dev.max_qp_wr
                ),
            });
        }
        // SAFETY: plain C data (pointers and integers); all-zero is a valid value.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = cq.raw().as_ptr();
        init.recv_cq = cq.raw().as_ptr();
        init.qp_type = rdma_mummy_sys::ibv_qp_type::IBV_QPT_RC;
        init.sq_sig_all = 0;
        init.cap.max_send_wr = caps.max_send_wr;
        init.cap.max_recv_wr = 1;
        init.cap.max_send_sge = caps.max_send_sge.max(1);
        init.cap.max_recv_sge = 1;
        init.cap.max_inline_data = caps.max_inline_data;
        // SAFETY: the PD and CQ are live (held by `ctx` and `cq`); `init` is a valid
        // in/out pointer the provider updates with the sizes it granted.
        let qp = unsafe { rdma_mummy_sys::ibv_create_qp(ctx.raw_pd().as_ptr(), &mut init) };
        let Some(qp) = NonNull::new(qp) else {
            return Err(VerbsError::from_errno(
                CALL,
                ctx.name(),
                format!("RC, {} send WRs", caps.max_send_wr),
                Errno::last(),
            ));
        };
        // SAFETY: `qp` was just created and is valid until destroyed in `Drop`.
        let qp_num = unsafe { qp.as_ref().qp_num };
        Ok(QueuePair {
            qp,
            qp_num,
            caps: QpCaps {
                max_send_wr: init.cap.max_send_wr,
                max_send_sge: init.cap.max_send_sge,
                max_inline_data: init.cap.max_inline_data,
            },
            ctx,
            _cq: cq.clone(),
        })
    }

    /// The queue pair number the peer addresses.
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// The sizes the provider granted (at least those asked for).
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    /// The device.
    pub fn context(&self) -> &RdmaContext {
        &self.ctx
    }

    fn modify(
        &self,
        attr: &mut ibv_qp_attr,
        mask: u32,
        step: &'static str,
    ) -> Result<(), VerbsError> {
        let mask = c_int::try_from(mask).unwrap_or(c_int::MAX);
        // SAFETY: the QP is live; `attr` is a valid, initialised attribute block.
        let rc = unsafe { rdma_mummy_sys::ibv_modify_qp(self.qp.as_ptr(), attr, mask) };
        if rc != 0 {
            return Err(VerbsError::from_errno(
                "ibv_modify_qp",
                self.ctx.name(),
                format!("QP {:#x} to {step}", self.qp_num),
                Errno(rc),
            ));
        }
        Ok(())
    }

    fn zeroed_attr() -> ibv_qp_attr {
        // SAFETY: plain C data (integers, unions of bytes); all-zero is a valid value.
        unsafe { std::mem::zeroed() }
    }

    /// RESET → INIT on local `port`, letting peers do what `access` allows.
    pub fn modify_to_init(
        &self,
        port: u8,
        pkey_index: u16,
        access: Access,
    ) -> Result<(), VerbsError> {
        let mut a = Self::zeroed_attr();
        a.qp_state = ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = pkey_index;
        a.port_num = port;
        a.qp_access_flags = u32::try_from(access.bits()).unwrap_or(0);
        let m = ibv_qp_attr_mask::IBV_QP_STATE.0
            | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX.0
            | ibv_qp_attr_mask::IBV_QP_PORT.0
            | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS.0;
        self.modify(&mut a, m, "INIT")
    }

    /// INIT → RTR (ready to receive) towards the peer in `r`.
    pub fn modify_to_rtr(&self, r: &RtrAttr) -> Result<(), VerbsError> {
        let Some(mtu) = mtu_code(r.path_mtu_bytes) else {
            return Err(VerbsError::InvalidArgument {
                call: "ibv_modify_qp",
                reason: format!(
                    "path MTU {} is not 256, 512, 1024, 2048 or 4096",
                    r.path_mtu_bytes
                ),
            });
        };
        let mut a = Self::zeroed_attr();
        a.qp_state = ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = mtu;
        a.dest_qp_num = r.dest_qp_num;
        a.rq_psn = r.rq_psn;
        a.max_dest_rd_atomic = r.max_dest_rd_atomic;
        a.min_rnr_timer = r.min_rnr_timer;
        a.ah_attr = ibv_ah_attr {
            grh: ibv_global_route {
                dgid: ibv_gid {
                    raw: r.dgid.unwrap_or([0; 16]),
                },
                flow_label: 0,
                sgid_index: r.sgid_index,
                hop_limit: r.hop_limit,
                traffic_class: r.traffic_class,
            },
            dlid: r.dlid,
            sl: r.sl,
            src_path_bits: 0,
            static_rate: 0,
            is_global: u8::from(r.dgid.is_some()),
            port_num: r.port,
        };
        let m = ibv_qp_attr_mask::IBV_QP_STATE.0
            | ibv_qp_attr_mask::IBV_QP_AV.0
            | ibv_qp_attr_mask::IBV_QP_PATH_MTU.0
            | ibv_qp_attr_mask::IBV_QP_DEST_QPN.0
            | ibv_qp_attr_mask::IBV_QP_RQ_PSN.0
            | ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC.0
            | ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER.0;
        self.modify(&mut a, m, "RTR")
    }

    /// RTR → RTS (ready to send).
    pub fn modify_to_rts(&self, r: &RtsAttr) -> Result<(), VerbsError> {
        let mut a = Self::zeroed_attr();
        a.qp_state = ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = r.sq_psn;
        a.timeout = r.timeout;
        a.retry_cnt = r.retry_cnt;
        a.rnr_retry = r.rnr_retry;
        a.max_rd_atomic = r.max_rd_atomic;
        let m = ibv_qp_attr_mask::IBV_QP_STATE.0
            | ibv_qp_attr_mask::IBV_QP_TIMEOUT.0
            | ibv_qp_attr_mask::IBV_QP_RETRY_CNT.0
            | ibv_qp_attr_mask::IBV_QP_RNR_RETRY.0
            | ibv_qp_attr_mask::IBV_QP_SQ_PSN.0
            | ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC.0;
        self.modify(&mut a, m, "RTS")
    }

    /// The state the device reports for this queue pair (`ibv_query_qp`): `RESET`, `INIT`,
    /// `RTR`, `RTS`, `SQD`, `SQE`, `ERR`. What a stalled transfer's error names, so a user
    /// can tell a slow link (RTS) from a dead one (ERR).
    pub fn state(&self) -> Result<&'static str, VerbsError> {
        let mut a = Self::zeroed_attr();
        // SAFETY: plain C data; all-zero is a valid value and the call only writes it.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        let mask = c_int::try_from(ibv_qp_attr_mask::IBV_QP_STATE.0).unwrap_or(c_int::MAX);
        // SAFETY: the QP is live; `a` and `init` are valid, writable attribute blocks.
        let rc = unsafe { rdma_mummy_sys::ibv_query_qp(self.qp.as_ptr(), &mut a, mask, &mut init) };
        if rc != 0 {
            return Err(VerbsError::from_errno(
                "ibv_query_qp",
                self.ctx.name(),
                format!("QP {:#x}", self.qp_num),
                Errno(rc),
            ));
        }
        Ok(match a.qp_state {
            ibv_qp_state::IBV_QPS_RESET => "RESET",
            ibv_qp_state::IBV_QPS_INIT => "INIT",
            ibv_qp_state::IBV_QPS_RTR => "RTR",
            ibv_qp_state::IBV_QPS_RTS => "RTS",
            ibv_qp_state::IBV_QPS_SQD => "SQD",
            ibv_qp_state::IBV_QPS_SQE => "SQE",
            ibv_qp_state::IBV_QPS_ERR => "ERR",
            _ => "UNKNOWN",
        })
    }

    /// Any state → ERR: outstanding work requests complete with `IBV_WC_WR_FLUSH_ERR`, and
    /// the device stops touching their memory.
    pub fn modify_to_error(&self) -> Result<(), VerbsError> {
        let mut a = Self::zeroed_attr();
        a.qp_state = ibv_qp_state::IBV_QPS_ERR;
        self.modify(&mut a, ibv_qp_attr_mask::IBV_QP_STATE.0, "ERR")
    }

    /// Post `wrs` as one linked list (`ibv_post_send`). An empty batch posts nothing.
    ///
    /// # Safety
    ///
    /// For every work request:
    /// - `local_addr..local_addr + len` lies inside a live memory region registered on this
    ///   queue pair's device with `lkey`, and the memory behind it stays allocated and
    ///   registered until the request's completion has been polled (or, for an unsignaled
    ///   request, a later signaled one on this queue pair), or until the queue pair has been
    ///   moved to ERR and flushed, or destroyed.
    /// - The caller does not rely on the contents of that local memory while the request
    ///   may run: the device reads it (WRITE) or writes it (READ) at any time until then.
    pub unsafe fn post_send(&self, wrs: &[SendWr]) -> Result<(), PostError> {
        if wrs.is_empty() {
            return Ok(());
        }
        let mut sges: Vec<ibv_sge> = wrs
            .iter()
            .map(|w| ibv_sge {
                addr: w.local_addr,
                length: w.len,
                lkey: w.lkey,
            })
            .collect();
        let mut list: Vec<ibv_send_wr> = Vec::with_capacity(wrs.len());
        for (w, sge) in wrs.iter().zip(sges.iter_mut()) {
            // SAFETY: plain C data (integers, pointers, unions); all-zero is a valid value.
            let mut raw: ibv_send_wr = unsafe { std::mem::zeroed() };
            raw.wr_id = w.wr_id;
            raw.sg_list = sge;
            raw.num_sge = 1;
            raw.opcode = match w.op {
                RdmaOp::Write => ibv_wr_opcode::IBV_WR_RDMA_WRITE,
                RdmaOp::Read => ibv_wr_opcode::IBV_WR_RDMA_READ,
            };
            raw.send_flags = if w.signaled {
                rdma_mummy_sys::ibv_send_flags::IBV_SEND_SIGNALED.0
            } else {
                0
            };
            raw.wr.rdma = rdma_mummy_sys::rdma_t {
                remote_addr: w.remote_addr,
                rkey: w.rkey,
            };
            list.push(raw);
        }
        // Link after the vector is complete: its buffer does not move any more.
        let base = list.as_mut_ptr();
        for i in 0..list.len().saturating_sub(1) {
            // SAFETY: `i + 1 < len`, so the pointer stays inside the vector's buffer.
            list[i].next = unsafe { base.add(i + 1) };
        }
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the QP is live; `base` heads a NULL-terminated list whose entries and SGEs
        // outlive the call; the caller guarantees the local memory (see `# Safety`).
        let rc = unsafe { rdma_mummy_sys::ibv_post_send(self.qp.as_ptr(), base, &mut bad) };
        if rc == 0 {
            return Ok(());
        }
        let accepted = if bad.is_null() {
            0
        } else {
            (bad as usize).saturating_sub(base as usize) / std::mem::size_of::<ibv_send_wr>()
        };
        Err(PostError {
            accepted: accepted.min(wrs.len()),
            error: VerbsError::from_errno(
                "ibv_post_send",
                self.ctx.name(),
                format!("QP {:#x}, {} work requests", self.qp_num, wrs.len()),
                Errno(rc),
            ),
        })
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // SAFETY: this value owns the queue pair; it is destroyed exactly once, here, before
        // the CQ and PD it uses (held by fields dropped after this body).
        let rc = unsafe { rdma_mummy_sys::ibv_destroy_qp(self.qp.as_ptr()) };
        if rc != 0 {
            log::warn!(
                "ibv_destroy_qp on {} (QP {:#x}) failed: {}; the queue pair leaks",
                self.ctx.name(),
                self.qp_num,
                Errno(rc)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_codes() {
        assert_eq!(mtu_code(4096), Some(5));
        assert_eq!(mtu_code(256), Some(1));
        assert_eq!(mtu_code(1500), None);
    }
}
