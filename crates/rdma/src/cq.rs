//! [`CompletionQueue`]: one verbs completion queue plus the book-keeping that turns work
//! completions back into finished batches ([`BatchDone`]), polled with a timeout.
//!
//! Invariants:
//! - Every posted work request has an entry in the queue's table until its completion is
//!   polled or its queue pair is destroyed; the entry holds the local registration
//!   ([`MrHandle`]), so memory the NIC may still touch is never deregistered.
//! - Queue pairs reserve their send-queue depth in the queue's capacity when attached, so
//!   the completion queue cannot overflow (every work request is signaled).
//! - A failed completion marks its queue pair broken: later posts on the connection fail fast
//!   with [`RdmaError::Broken`] (its other requests come back flushed).

use crate::cache::Cached;
use crate::error::RdmaError;
use crate::register::Registration;
use crate::wc::{WcError, WcStatus};
use gdx_sys::verbs::{self, RdmaContext, RdmaOp, WorkCompletion};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A registration as the data path holds it (from [`crate::RdmaEndpoint::register`]).
pub type MrHandle = Arc<Cached<Registration>>;

/// Identifies one posted batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket(pub u64);

/// A finished batch: one result per work item, in posting order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchDone {
    /// The batch.
    pub ticket: Ticket,
    /// Per item: bytes moved, or the first error of its work requests.
    pub items: Vec<Result<u64, WcError>>,
}

impl BatchDone {
    /// Total bytes of the items that succeeded.
    pub fn bytes(&self) -> u64 {
        self.items.iter().filter_map(|r| r.as_ref().ok()).sum()
    }

    /// The first error that is not a flush (the cause), else the first flush.
    pub fn first_error(&self) -> Option<&WcError> {
        let errs = self.items.iter().filter_map(|r| r.as_ref().err());
        errs.clone()
            .find(|e| !e.is_flushed())
            .or_else(|| errs.clone().next())
    }
}

pub(crate) struct Pending {
    pub(crate) ticket: u64,
    pub(crate) item: usize,
    pub(crate) op: RdmaOp,
    pub(crate) len: u64,
    pub(crate) remote_addr: u64,
    pub(crate) rkey: u32,
    pub(crate) qp_num: u32,
    /// Keeps the local registration alive while the NIC may use it (`None` only in tests).
    pub(crate) _keep: Option<MrHandle>,
}

struct ItemState {
    remaining: usize,
    bytes: u64,
    error: Option<WcError>,
}

struct TicketState {
    remaining: usize,
    items: Vec<ItemState>,
    /// Nobody waits for it (its connection failed while posting); drop it when done.
    abandoned: bool,
}

#[derive(Default)]
pub(crate) struct Table {
    next_ticket: u64,
    next_wr: u64,
    pending: HashMap<u64, Pending>,
    tickets: HashMap<u64, TicketState>,
    per_qp: HashMap<u32, usize>,
    broken: HashMap<u32, String>,
    reserved: u64,
    done: Vec<BatchDone>,
}

impl Table {
    /// A new ticket with `items` items of `wrs[i]` work requests each.
    pub(crate) fn open_ticket(&mut self, wrs_per_item: &[usize]) -> u64 {
        self.next_ticket += 1;
        let t = self.next_ticket;
        self.tickets.insert(
            t,
            TicketState {
                remaining: wrs_per_item.iter().sum(),
                items: wrs_per_item
                    .iter()
                    .map(|&n| ItemState {
                        remaining: n,
                        bytes: 0,
                        error: None,
                    })
                    .collect(),
                abandoned: false,
            },
        );
        t
    }

    /// Record a work request about to be posted; returns its id.
    pub(crate) fn add(&mut self, p: Pending) -> u64 {
        self.next_wr += 1;
        let id = self.next_wr;
        *self.per_qp.entry(p.qp_num).or_default() += 1;
        self.pending.insert(id, p);
        id
    }

    /// Forget work requests that were not posted after all, and abandon their ticket.
    pub(crate) fn unpost(&mut self, ids: &[u64]) {
        for id in ids {
            if let Some(p) = self.pending.remove(id) {
                if let Some(n) = self.per_qp.get_mut(&p.qp_num) {
                    *n = n.saturating_sub(1);
                }
                if let Some(t) = self.tickets.get_mut(&p.ticket) {
                    t.remaining = t.remaining.saturating_sub(1);
                    t.abandoned = true;
                    if t.remaining == 0 {
                        self.tickets.remove(&p.ticket);
                    }
                }
            }
        }
    }

    /// Hand finished batches back for the next poll.
    pub(crate) fn done_extend(&mut self, batches: Vec<BatchDone>) {
        self.done.extend(batches);
    }

    pub(crate) fn outstanding(&self, qp_num: u32) -> usize {
        self.per_qp.get(&qp_num).copied().unwrap_or(0)
    }

    pub(crate) fn broken(&self, qp_nums: &[u32]) -> Option<(u32, String)> {
        qp_nums
            .iter()
            .find_map(|q| Some((*q, self.broken.get(q)?.clone())))
    }

    pub(crate) fn mark_broken(&mut self, qp_num: u32, why: String) {
        self.broken.entry(qp_num).or_insert(why);
    }

    /// Drop everything about queue pairs that no longer exist.
    pub(crate) fn forget_qps(&mut self, qp_nums: &[u32]) {
        let ids: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| qp_nums.contains(&p.qp_num))
            .map(|(id, _)| *id)
            .collect();
        self.unpost(&ids);
        for q in qp_nums {
            self.per_qp.remove(q);
            self.broken.remove(q);
        }
    }

    /// Apply one work completion from `device`.
    pub(crate) fn complete(&mut self, wc: &WorkCompletion, device: &str) {
        let Some(p) = self.pending.remove(&wc.wr_id) else {
            log::debug!("{device}: completion for unknown work request {}", wc.wr_id);
            return;
        };
        if let Some(n) = self.per_qp.get_mut(&p.qp_num) {
            *n = n.saturating_sub(1);
        }
        let status = WcStatus::from_code(wc.status);
        let error = (!status.is_success()).then(|| WcError {
            status,
            vendor_err: wc.vendor_err,
            op: match p.op {
                RdmaOp::Write => "RDMA write",
                RdmaOp::Read => "RDMA read",
            },
            device: device.to_string(),
            qp_num: p.qp_num,
            len: p.len,
            remote_addr: p.remote_addr,
            rkey: p.rkey,
        });
        if let Some(e) = &error {
            self.mark_broken(p.qp_num, e.to_string());
        }
        let Some(t) = self.tickets.get_mut(&p.ticket) else {
            return;
        };
        t.remaining = t.remaining.saturating_sub(1);
        if let Some(it) = t.items.get_mut(p.item) {
            it.remaining = it.remaining.saturating_sub(1);
            match error {
                None => it.bytes += p.len,
                Some(e) => {
                    // Keep the cause: a real error replaces a flush, never the reverse.
                    if it
                        .error
                        .as_ref()
                        .is_none_or(|old| old.is_flushed() && !e.is_flushed())
                    {
                        it.error = Some(e);
                    }
                }
            }
        }
        if t.remaining == 0 {
            if let Some(t) = self.tickets.remove(&p.ticket) {
                if !t.abandoned {
                    self.done.push(BatchDone {
                        ticket: Ticket(p.ticket),
                        items: t
                            .items
                            .into_iter()
                            .map(|i| match i.error {
                                Some(e) => Err(e),
                                None => Ok(i.bytes),
                            })
                            .collect(),
                    });
                }
            }
        }
    }
}

pub(crate) struct Shared {
    pub(crate) cq: verbs::CompletionQueue,
    pub(crate) device: String,
    pub(crate) table: Mutex<Table>,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A completion queue shared by the queue pairs of one or more connections on one device.
/// Cheap to clone.
#[derive(Clone)]
pub struct CompletionQueue {
    pub(crate) shared: Arc<Shared>,
}

impl fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = self.shared.lock();
        f.debug_struct("CompletionQueue")
            .field("device", &self.shared.device)
            .field("entries", &self.shared.cq.entries())
            .field("reserved", &t.reserved)
            .field("outstanding", &t.pending.len())
            .finish()
    }
}

impl CompletionQueue {
    pub(crate) fn new(ctx: &RdmaContext, entries: u32) -> Result<CompletionQueue, RdmaError> {
        let cq = verbs::CompletionQueue::new(ctx, entries)?;
        Ok(CompletionQueue {
            shared: Arc::new(Shared {
                cq,
                device: ctx.name().to_string(),
                table: Mutex::new(Table::default()),
            }),
        })
    }

    /// Reserve room for `qps` queue pairs of `depth` work requests each.
    pub(crate) fn reserve(&self, qps: usize, depth: u32) -> Result<(), RdmaError> {
        let mut t = self.shared.lock();
        let need = qps as u64 * u64::from(depth);
        let cap = u64::from(self.shared.cq.entries());
        if t.reserved + need > cap {
            return Err(RdmaError::InvalidArgument(format!(
                "the completion queue has {cap} entries, {} reserved; {qps} queue pair(s) of depth {depth} need {need} more",
                t.reserved
            )));
        }
        t.reserved += need;
        Ok(())
    }

    /// Return the room [`CompletionQueue::reserve`] took.
    pub(crate) fn release(&self, qps: usize, depth: u32) {
        let mut t = self.shared.lock();
        t.reserved = t.reserved.saturating_sub(qps as u64 * u64::from(depth));
    }

    /// Work requests posted and not yet completed.
    pub fn outstanding(&self) -> usize {
        self.shared.lock().pending.len()
    }

    /// Wait up to `timeout` for at least one batch to finish; return every finished batch.
    /// Returns at once with an empty list when nothing is outstanding; fails with
    /// [`RdmaError::Timeout`] when work is outstanding and none finishes in time.
    pub fn poll(&self, timeout: Duration) -> Result<Vec<BatchDone>, RdmaError> {
        let start = Instant::now();
        let mut wcs = [WorkCompletion::default(); 64];
        let mut spins = 0u32;
        loop {
            let n = self.shared.cq.poll(&mut wcs)?;
            let mut t = self.shared.lock();
            for wc in &wcs[..n] {
                t.complete(wc, &self.shared.device);
            }
            if !t.done.is_empty() {
                return Ok(std::mem::take(&mut t.done));
            }
            if t.pending.is_empty() {
                return Ok(Vec::new());
            }
            let outstanding = t.pending.len();
            drop(t);
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(RdmaError::Timeout {
                    waited,
                    outstanding,
                    detail: String::new(),
                });
            }
            // Spin briefly (completions arrive in microseconds), then back off.
            spins += 1;
            if n > 0 || spins < 200 {
                std::hint::spin_loop();
            } else if waited < Duration::from_millis(1) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }

    /// Poll until `ticket` finishes (other batches finishing meanwhile are kept for the next
    /// [`CompletionQueue::poll`]).
    pub fn wait(&self, ticket: Ticket, timeout: Duration) -> Result<BatchDone, RdmaError> {
        let start = Instant::now();
        let mut keep = Vec::new();
        let result = loop {
            let left = timeout.saturating_sub(start.elapsed());
            match self.poll(left) {
                Ok(done) => {
                    let mut found = None;
                    for d in done {
                        if d.ticket == ticket && found.is_none() {
                            found = Some(d);
                        } else {
                            keep.push(d);
                        }
                    }
                    if let Some(d) = found {
                        break Ok(d);
                    }
                    if !self.shared.lock().tickets.contains_key(&ticket.0) {
                        break Err(RdmaError::InvalidArgument(format!(
                            "batch {} is not outstanding on this completion queue",
                            ticket.0
                        )));
                    }
                }
                Err(e) => break Err(e),
            }
        };
        if !keep.is_empty() {
            self.shared.lock().done_extend(keep);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(t: &mut Table, ticket: u64, item: usize, qp: u32, len: u64) -> u64 {
        t.add(Pending {
            ticket,
            item,
            op: RdmaOp::Write,
            len,
            remote_addr: 0x1000 * (item as u64 + 1),
            rkey: 0x77,
            qp_num: qp,
            _keep: None,
        })
    }

    fn wc(wr_id: u64, status: u32, qp: u32) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status,
            opcode: 1,
            vendor_err: if status == 0 { 0 } else { 0x81 },
            byte_len: 0,
            qp_num: qp,
        }
    }

    #[test]
    fn a_batch_finishes_when_every_chunk_has_completed() {
        let mut t = Table::default();
        let ticket = t.open_ticket(&[2, 1]);
        let a = pending(&mut t, ticket, 0, 10, 100);
        let b = pending(&mut t, ticket, 0, 11, 50);
        let c = pending(&mut t, ticket, 1, 10, 7);
        assert_eq!(t.outstanding(10), 2);
        t.complete(&wc(b, 0, 11), "mlx5_0");
        t.complete(&wc(c, 0, 10), "mlx5_0");
        assert!(t.done.is_empty());
        t.complete(&wc(a, 0, 10), "mlx5_0");
        let d = std::mem::take(&mut t.done);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].ticket, Ticket(ticket));
        assert_eq!(d[0].items, vec![Ok(150), Ok(7)]);
        assert_eq!(d[0].bytes(), 157);
        assert_eq!(t.outstanding(10), 0);
        assert!(t.broken(&[10, 11]).is_none());
    }

    #[test]
    fn error_statuses_become_named_errors_and_break_the_connection() {
        for (code, check) in [
            (10u32, WcError::is_remote_access as fn(&WcError) -> bool),
            (12, WcError::is_retry_exceeded),
            (13, WcError::is_retry_exceeded),
            (4, WcError::is_local_protection),
            (5, WcError::is_flushed),
        ] {
            let mut t = Table::default();
            let ticket = t.open_ticket(&[1]);
            let a = pending(&mut t, ticket, 0, 3, 4096);
            t.complete(&wc(a, code, 3), "mlx5_1");
            let d = std::mem::take(&mut t.done);
            let e = d[0].items[0].clone().unwrap_err();
            assert!(check(&e), "{code}: {e}");
            assert_eq!(e.status.code(), code);
            assert_eq!(e.device, "mlx5_1");
            assert_eq!(
                (e.len, e.remote_addr, e.rkey, e.vendor_err),
                (4096, 0x1000, 0x77, 0x81)
            );
            assert_eq!(t.broken(&[3]).map(|(q, _)| q), Some(3), "{code}");
        }
    }

    #[test]
    fn the_cause_is_kept_over_the_flushes_it_triggers() {
        let mut t = Table::default();
        let ticket = t.open_ticket(&[3]);
        let ids: Vec<u64> = (0..3).map(|_| pending(&mut t, ticket, 0, 1, 10)).collect();
        t.complete(&wc(ids[0], 5, 1), "d"); // flushed first (another QP failed)
        t.complete(&wc(ids[1], 10, 1), "d"); // the real cause
        t.complete(&wc(ids[2], 5, 1), "d");
        let d = std::mem::take(&mut t.done);
        let e = d[0].items[0].clone().unwrap_err();
        assert_eq!(e.status, WcStatus::RemoteAccess);
        assert_eq!(d[0].first_error().unwrap().status, WcStatus::RemoteAccess);
    }

    #[test]
    fn unknown_status_codes_and_work_requests_do_not_panic() {
        let mut t = Table::default();
        let ticket = t.open_ticket(&[1]);
        let a = pending(&mut t, ticket, 0, 1, 1);
        t.complete(&wc(9999, 0, 1), "d"); // not ours: ignored
        assert!(t.done.is_empty());
        t.complete(&wc(a, 4242, 1), "d");
        let e = t.done[0].items[0].clone().unwrap_err();
        assert_eq!(e.status, WcStatus::Unknown(4242));
        assert!(e.to_string().contains("4242"), "{e}");
    }

    #[test]
    fn unposted_and_forgotten_work_is_not_reported() {
        let mut t = Table::default();
        let ticket = t.open_ticket(&[2]);
        let a = pending(&mut t, ticket, 0, 1, 1);
        let b = pending(&mut t, ticket, 0, 2, 1);
        t.unpost(&[b]);
        t.complete(&wc(a, 5, 1), "d");
        assert!(t.done.is_empty(), "an abandoned batch is not reported");
        assert!(t.tickets.is_empty() && t.pending.is_empty());

        let ticket = t.open_ticket(&[1]);
        let _c = pending(&mut t, ticket, 0, 7, 1);
        t.mark_broken(7, "x".into());
        t.forget_qps(&[7]);
        assert!(t.pending.is_empty() && t.tickets.is_empty());
        assert!(t.broken(&[7]).is_none());
    }
}
