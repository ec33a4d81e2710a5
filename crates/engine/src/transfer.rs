//! Transfers: a batch of one-sided ops, the handle returned by submit, statuses and per-op results.
//!
//! Invariants: an op is `Completed` only after the target confirmed its bytes are in place (tcp: a
//! per-chunk ack sent after the payload landed; shm: the end-of-batch reply). A transfer is
//! `Completed` only when every op is, and its notification (if any) was delivered. Anything else ends
//! as `Failed { reason }`, the first error seen.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The clock of transfer start, end and deadline (`quanta`: the TSC where it is usable, else
/// the OS clock; cheaper to read than `Instant`, and read twice per transfer).
type Clock = quanta::Instant;

/// Reads the transfer clock once, so its calibration is done before the first transfer.
pub(crate) fn warm_clock() {
    let _ = Clock::now();
}

use serde::Serialize;

use crate::error::{Error, Result};
use crate::plan::Plan;
use crate::region::{check_bounds, Region, RegionDesc, RegionInner};
use crate::stats::Stats;

/// Direction of an op, seen from the initiator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    /// Local region → remote region.
    Write,
    /// Remote region → local region.
    Read,
}

/// One op of a batch.
#[derive(Debug, Clone)]
pub(crate) struct Op {
    pub(crate) kind: OpKind,
    pub(crate) local: Arc<RegionInner>,
    pub(crate) local_offset: u64,
    /// Shared by consecutive ops on the same remote region (a batch clones it once).
    pub(crate) remote: Arc<RegionDesc>,
    pub(crate) remote_offset: u64,
    pub(crate) len: u64,
}

/// A batch of ops to one peer, built with [`Transfer::write`] / [`Transfer::read`] and handed to
/// [`crate::Peer::submit`].
#[derive(Debug, Default)]
pub struct Transfer {
    pub(crate) ops: smallvec::SmallVec<[Op; 1]>,
    pub(crate) notify: Option<Vec<u8>>,
    pub(crate) timeout: Option<Duration>,
}

impl Transfer {
    /// An empty batch.
    pub fn new() -> Self {
        Transfer::default()
    }

    /// Adds an op that copies `len` bytes from `local[local_offset..]` to `remote[remote_offset..]`.
    pub fn write(
        &mut self,
        local: &Region<'_>,
        local_offset: u64,
        remote: &RegionDesc,
        remote_offset: u64,
        len: u64,
    ) -> &mut Self {
        self.push(
            OpKind::Write,
            local,
            local_offset,
            remote,
            remote_offset,
            len,
        )
    }

    /// Adds an op that copies `len` bytes from `remote[remote_offset..]` to `local[local_offset..]`.
    pub fn read(
        &mut self,
        local: &Region<'_>,
        local_offset: u64,
        remote: &RegionDesc,
        remote_offset: u64,
        len: u64,
    ) -> &mut Self {
        self.push(
            OpKind::Read,
            local,
            local_offset,
            remote,
            remote_offset,
            len,
        )
    }

    fn push(
        &mut self,
        kind: OpKind,
        local: &Region<'_>,
        lo: u64,
        remote: &RegionDesc,
        ro: u64,
        len: u64,
    ) -> &mut Self {
        let remote = match self.ops.last() {
            Some(prev) if *prev.remote == *remote => Arc::clone(&prev.remote),
            _ => shared_desc(remote),
        };
        self.ops.push(Op {
            kind,
            local: Arc::clone(&local.inner),
            local_offset: lo,
            remote,
            remote_offset: ro,
            len,
        });
        self
    }

    /// Delivers `msg` (≤ 64 KiB) to the peer's agent after every op's bytes are in place; see
    /// [`crate::Agent::wait_notification`].
    pub fn notify(&mut self, msg: impl Into<Vec<u8>>) -> &mut Self {
        self.notify = Some(msg.into());
        self
    }

    /// Overrides the agent's default transfer deadline.
    pub fn timeout(&mut self, t: Duration) -> &mut Self {
        self.timeout = Some(t);
        self
    }

    /// Number of ops.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// True when no op was added.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Checks every op against what the initiator knows (local region, remote descriptor) before
    /// anything is sent; the target checks again.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.ops.is_empty() {
            return Err(Error::InvalidArgument(
                "a transfer needs at least one op".into(),
            ));
        }
        if self.notify.as_ref().is_some_and(|n| n.len() > 64 << 10) {
            return Err(Error::InvalidArgument(
                "notification larger than 64 KiB".into(),
            ));
        }
        for op in &self.ops {
            if op.len == 0 {
                return Err(Error::InvalidArgument("op of length 0".into()));
            }
            check_bounds(op.local_offset, op.len, op.local.len)?;
            check_bounds(op.remote_offset, op.len, op.remote.len)?;
            match op.kind {
                OpKind::Write if !op.remote.access.remote_write => {
                    return Err(Error::ReadOnly {
                        region: op.remote.id,
                    })
                }
                OpKind::Read if !op.remote.access.remote_read => {
                    return Err(Error::NotReadable {
                        region: op.remote.id,
                    })
                }
                _ => {}
            }
        }
        Ok(())
    }
}

thread_local! {
    /// The remote descriptor this thread's last transfer shared (see `shared_desc`).
    static LAST_DESC: std::cell::RefCell<Option<Arc<RegionDesc>>> =
        const { std::cell::RefCell::new(None) };
}

/// An `Arc` of `remote`: this thread's last one when equal (a stream of transfers to one
/// remote region clones its descriptor, name included, once, not once per transfer).
fn shared_desc(remote: &RegionDesc) -> Arc<RegionDesc> {
    LAST_DESC.with(|last| {
        let mut last = last.borrow_mut();
        match last.as_ref() {
            Some(a) if **a == *remote => Arc::clone(a),
            _ => {
                let a = Arc::new(remote.clone());
                *last = Some(Arc::clone(&a));
                a
            }
        }
    })
}

/// Where a transfer stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Still running.
    Pending,
    /// Every op completed and the notification (if any) was delivered.
    Completed,
    /// At least one op failed; `reason` is the first error seen.
    Failed {
        /// The first error.
        reason: Error,
    },
}

/// The outcome of one op.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpStatus {
    /// Not finished yet.
    Pending,
    /// The bytes are in place.
    Completed,
    /// The op failed; its bytes may be partly written.
    Failed(Error),
}

/// Per-op result: the path taken, why, and the outcome.
#[derive(Debug, Clone)]
pub struct OpResult {
    /// Write or read.
    pub kind: OpKind,
    /// Length in bytes.
    pub len: u64,
    /// Path and reason.
    pub plan: Plan,
    /// Outcome.
    pub status: OpStatus,
}

/// What a completed transfer did.
#[derive(Debug, Clone)]
pub struct TransferReport {
    /// Bytes moved (sum of op lengths).
    pub bytes: u64,
    /// Time from submit to completion.
    pub elapsed: Duration,
    /// One entry per op, in submission order.
    pub ops: Vec<OpResult>,
}

impl TransferReport {
    /// Throughput in bytes per second.
    pub fn bytes_per_sec(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

#[derive(Debug)]
struct Progress {
    /// Each op's outcome so far (its plan is the transfer's, outside the lock).
    status: smallvec::SmallVec<[OpStatus; 1]>,
    /// Chunks still unconfirmed per op (most transfers have a few ops: kept inline).
    pending_chunks: smallvec::SmallVec<[u32; 4]>,
    first_error: Option<Error>,
    done: Option<Clock>,
    /// Threads sleeping on `cv` (`finish` wakes them only when there are some).
    waiters: u32,
}

/// A transport that completes some transfers when asked rather than on a thread of its own (the
/// shm ring's inline slots: the submitting thread posts them and returns). Whoever waits drives
/// it, so the completion costs no thread hand-off.
pub(crate) trait Drive: Send + Sync + std::fmt::Debug {
    /// Completes what has finished by now, without blocking.
    fn poll(&self);
    /// The caller is about to sleep on `xfer`: something else must now complete it (and
    /// notice a dead peer).
    fn park(&self, xfer: &Arc<XferState>);
}

/// What the transfers of one peer share: the initiating agent's counters (fed once per
/// transfer, when it ends) and the connection's driver, for transports that have one.
#[derive(Debug)]
pub(crate) struct XferShared {
    pub(crate) stats: Arc<Stats>,
    pub(crate) driver: Option<Arc<dyn Drive>>,
}

/// The deadline of a transfer whose timeout the clock cannot represent (about 136 years).
const FOREVER: Duration = Duration::from_secs(1 << 32);

/// State shared between a [`TransferHandle`] and the transport running the transfer.
#[derive(Debug)]
pub(crate) struct XferState {
    pub(crate) id: u64,
    pub(crate) ops: smallvec::SmallVec<[Op; 1]>,
    pub(crate) notify: Option<Vec<u8>>,
    /// Each op's plan, as made at submit (read without the lock).
    plans: smallvec::SmallVec<[Plan; 4]>,
    pub(crate) started: Clock,
    pub(crate) deadline: Clock,
    bytes_done: AtomicU64,
    /// Set once `finish` ran: a waiter spins on it briefly before it sleeps on `cv`.
    ended: AtomicBool,
    /// Set by `finish` (before `ended`): no op failed, so every op completed.
    ok: AtomicBool,
    /// Set by `finish` (before `ended`): submit to end.
    elapsed_ns: AtomicU64,
    progress: Mutex<Progress>,
    cv: Condvar,
    /// The peer's counters and driver (one reference per transfer for both).
    shared: Arc<XferShared>,
    /// Set by the transport when it left this transfer to be completed by whoever waits.
    driven: AtomicBool,
}

/// A submitted transfer whose state is not built yet (`Transport::submit_new`): a transport
/// that can put the request on the wire first builds the state after, while the peer works.
#[derive(Debug)]
pub(crate) struct NewTransfer {
    pub(crate) id: u64,
    pub(crate) t: Transfer,
    pub(crate) plans: smallvec::SmallVec<[Plan; 4]>,
    pub(crate) timeout: Duration,
    pub(crate) shared: Arc<XferShared>,
    /// When it was submitted (the transfer's start, whenever its state is built).
    pub(crate) started: Clock,
}

impl NewTransfer {
    /// Starts the clock of a transfer submitted now.
    pub(crate) fn now(
        id: u64,
        t: Transfer,
        plans: smallvec::SmallVec<[Plan; 4]>,
        timeout: Duration,
        shared: Arc<XferShared>,
    ) -> Self {
        NewTransfer {
            id,
            t,
            plans,
            timeout,
            shared,
            started: Clock::now(),
        }
    }

    pub(crate) fn build(self) -> XferState {
        XferState::new(self)
    }
}

impl XferState {
    fn new(n: NewTransfer) -> Self {
        let NewTransfer {
            id,
            t,
            plans,
            timeout,
            shared,
            started,
        } = n;
        let n = t.ops.len();
        XferState {
            id,
            ops: t.ops,
            notify: t.notify,
            plans,
            started,
            // A timeout too long for the clock (`Duration::MAX` for "never") saturates.
            deadline: started
                .checked_add(t.timeout.unwrap_or(timeout))
                .unwrap_or_else(|| started + FOREVER),
            bytes_done: AtomicU64::new(0),
            ended: AtomicBool::new(false),
            ok: AtomicBool::new(false),
            elapsed_ns: AtomicU64::new(0),
            progress: Mutex::new(Progress {
                status: smallvec::smallvec![OpStatus::Pending; n],
                pending_chunks: smallvec::smallvec![1; n],
                first_error: None,
                done: None,
                waiters: 0,
            }),
            cv: Condvar::new(),
            shared,
            driven: AtomicBool::new(false),
        }
    }

    /// The transport left this transfer to whoever waits for it (`Drive`): waiters poll the
    /// driver, and the last handle dropped hands it to the driver.
    pub(crate) fn set_driven(&self) {
        self.driven.store(true, Ordering::Release);
    }

    /// Whether the transport left it to be driven (`set_driven`).
    pub(crate) fn driven(&self) -> bool {
        self.driven.load(Ordering::Acquire)
    }

    /// The driver to poll, once the transfer is driven.
    fn drive(&self) -> Option<&Arc<dyn Drive>> {
        self.shared.driver.as_ref().filter(|_| self.driven())
    }

    /// Whether `finish` ran.
    pub(crate) fn ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    fn lock(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Declares how many chunks op `i` is cut into (default 1).
    pub(crate) fn set_chunks(&self, counts: Vec<u32>) {
        self.lock().pending_chunks = counts.into();
    }

    /// Records one chunk of op `i`: on success the op completes when its last chunk does; a failure
    /// fails the op (first error wins).
    pub(crate) fn chunk_done(&self, i: usize, bytes: u64, res: Result<()>) {
        let mut p = self.lock();
        match res {
            Ok(()) => {
                self.add_bytes(&mut p, bytes);
                let left = &mut p.pending_chunks[i];
                *left = left.saturating_sub(1);
                if *left == 0 && p.status[i] == OpStatus::Pending {
                    p.status[i] = OpStatus::Completed;
                }
            }
            Err(e) => {
                if p.status[i] == OpStatus::Pending {
                    p.status[i] = OpStatus::Failed(e.clone());
                }
                p.first_error.get_or_insert(e);
            }
        }
    }

    /// Adds to the bytes confirmed. Every writer holds the progress lock (`_held` is its
    /// guard's contents), so a load and a store do: no atomic read-modify-write per completion.
    fn add_bytes(&self, _held: &mut Progress, bytes: u64) {
        let b = self.bytes_done.load(Ordering::Relaxed);
        self.bytes_done.store(b + bytes, Ordering::Relaxed);
    }

    /// Records the whole of each op in `ops` (single-chunk ops) as done, in one update.
    pub(crate) fn ops_done(&self, ops: impl IntoIterator<Item = usize>) {
        let mut ops = ops.into_iter().peekable();
        if ops.peek().is_none() {
            return;
        }
        let mut p = self.lock();
        self.mark_done(&mut p, ops);
    }

    fn mark_done(&self, p: &mut Progress, ops: impl Iterator<Item = usize>) {
        let mut bytes = 0;
        for i in ops {
            let left = &mut p.pending_chunks[i];
            *left = left.saturating_sub(1);
            if *left == 0 && p.status[i] == OpStatus::Pending {
                p.status[i] = OpStatus::Completed;
            }
            bytes += self.ops[i].len;
        }
        self.add_bytes(p, bytes);
    }

    /// `ops_done` for every op `done(i)` is true of, then `finish`, in one update (a small
    /// transfer's completion takes the lock once, not twice).
    pub(crate) fn finish_with(&self, done: impl Fn(usize) -> bool) {
        let mut p = self.lock();
        self.mark_done(&mut p, (0..self.ops.len()).filter(|&i| done(i)));
        self.finish_locked(p);
    }

    /// Fails every op not yet completed with `e` (peer lost, notification failed ...).
    pub(crate) fn fail_pending(&self, e: &Error) {
        let mut p = self.lock();
        for st in p.status.iter_mut() {
            if *st == OpStatus::Pending {
                *st = OpStatus::Failed(e.clone());
            }
        }
        p.first_error.get_or_insert_with(|| e.clone());
    }

    /// Marks the transfer failed without touching op statuses (e.g. the notification was lost).
    pub(crate) fn fail_transfer(&self, e: Error) {
        self.lock().first_error.get_or_insert(e);
    }

    /// The path of every op (no copies of the reasons).
    pub(crate) fn paths(&self) -> impl ExactSizeIterator<Item = crate::plan::Path> + '_ {
        self.plans.iter().map(|p| p.path)
    }

    /// The path of op `i`.
    pub(crate) fn path(&self, i: usize) -> crate::plan::Path {
        self.plans[i].path
    }

    /// Each op's result as it stands.
    fn results(&self, p: &Progress) -> Vec<OpResult> {
        self.results_by(|i| p.status[i].clone())
    }

    /// Each op's result, with op `i`'s outcome `status(i)`.
    fn results_by(&self, status: impl Fn(usize) -> OpStatus) -> Vec<OpResult> {
        self.ops
            .iter()
            .zip(&self.plans)
            .enumerate()
            .map(|(i, (op, plan))| OpResult {
                kind: op.kind,
                len: op.len,
                plan: plan.clone(),
                status: status(i),
            })
            .collect()
    }

    /// The report of an ended transfer whose ops' results are `ops`.
    fn report(&self, ops: Vec<OpResult>) -> TransferReport {
        TransferReport {
            bytes: self.ops.iter().map(|o| o.len).sum(),
            elapsed: Duration::from_nanos(self.elapsed_ns.load(Ordering::Relaxed)),
            ops,
        }
    }

    /// True if some op failed so far.
    pub(crate) fn has_failed(&self) -> bool {
        self.lock().first_error.is_some()
    }

    /// Ends the transfer: ops still pending fail (they were never confirmed), waiters wake.
    pub(crate) fn finish(&self) {
        self.finish_locked(self.lock());
    }

    fn finish_locked(&self, mut p: MutexGuard<'_, Progress>) {
        if p.status.contains(&OpStatus::Pending) {
            let unconfirmed = Error::Protocol("op was never confirmed by the peer".into());
            for st in p.status.iter_mut() {
                if *st == OpStatus::Pending {
                    *st = OpStatus::Failed(unconfirmed.clone());
                }
            }
            p.first_error.get_or_insert(unconfirmed);
        }
        let now = Clock::now();
        if p.done.is_none() {
            let ops = self.ops.iter().zip(&self.plans).zip(&p.status);
            self.shared.stats.record(
                ops.map(|((op, plan), st)| (op.kind, op.len, plan.path, st)),
                p.first_error.is_some(),
                now - self.started,
            );
        }
        p.done = Some(now);
        // What a waiter of a completed transfer reads without the lock (`report_if_ok`):
        // stored before `ended`, which publishes them.
        self.ok.store(p.first_error.is_none(), Ordering::Relaxed);
        let ns = u64::try_from((now - self.started).as_nanos()).unwrap_or(u64::MAX);
        self.elapsed_ns.store(ns, Ordering::Relaxed);
        self.ended.store(true, Ordering::Release);
        let wake = p.waiters > 0;
        drop(p);
        if wake {
            self.cv.notify_all();
        }
    }

    /// The report of a transfer that ended with every op completed, built without the lock
    /// (from what `finish` published with `ended`); `None` if it has not ended so.
    fn report_if_ok(&self) -> Option<TransferReport> {
        if !(self.ended() && self.ok.load(Ordering::Relaxed)) {
            return None;
        }
        Some(self.report(self.results_by(|_| OpStatus::Completed)))
    }

    pub(crate) fn expired(&self) -> bool {
        Clock::now() >= self.deadline
    }

    /// Time until the deadline (zero once it passed).
    pub(crate) fn time_left(&self) -> Duration {
        self.deadline.saturating_duration_since(Clock::now())
    }

    pub(crate) fn timeout_error(&self) -> Error {
        Error::Timeout(self.deadline - self.started)
    }
}

/// How long [`TransferHandle::wait`] spins (yielding) before it sleeps.
const WAIT_SPIN: Duration = Duration::from_micros(50);

/// The handle [`crate::Peer::submit`] returns. Cheap to clone; dropping it does not cancel.
#[derive(Debug, Clone)]
pub struct TransferHandle {
    pub(crate) state: Arc<XferState>,
}

impl Drop for TransferHandle {
    /// The last handle of a transfer its waiters drive (`Drive`) hands it to the transport's
    /// thread, so it completes (and a target's leases end) with nobody waiting. Counted
    /// conservatively: the transport's in-flight entry holds one reference; any other holder is
    /// another handle (whose drop does this) or a completion pass (which finishes it).
    fn drop(&mut self) {
        if let Some(d) = self.state.drive() {
            if !self.state.ended() && Arc::strong_count(&self.state) <= 2 {
                d.park(&self.state);
            }
        }
    }
}

impl TransferHandle {
    /// Where the transfer stands now.
    pub fn status(&self) -> Status {
        if let Some(d) = self.state.drive() {
            d.poll();
        }
        let p = self.state.lock();
        match (p.done, &p.first_error) {
            (None, _) => Status::Pending,
            (Some(_), None) => Status::Completed,
            (Some(_), Some(e)) => Status::Failed { reason: e.clone() },
        }
    }

    /// Bytes confirmed in place so far.
    pub fn bytes_done(&self) -> u64 {
        self.state.bytes_done.load(Ordering::Relaxed)
    }

    /// Per-op results so far (path, reason, outcome).
    pub fn op_results(&self) -> Vec<OpResult> {
        self.state.results(&self.state.lock())
    }

    /// Waits up to `timeout` for the transfer to end.
    ///
    /// # Errors
    /// [`Error::Timeout`] if it is still pending after `timeout` (it keeps running; wait again or
    /// drop the handle), or the transfer's failure reason.
    pub fn wait(&self, timeout: Duration) -> Result<TransferReport> {
        // A small transfer ends within a round trip: catching that by spinning saves the
        // condition variable's sleep and wake-up, which would cost more than the round trip.
        let spin = WAIT_SPIN.min(timeout);
        let drive = self.state.drive();
        let ended = crate::ring::spin_until(spin, || {
            if let Some(d) = drive {
                d.poll();
            }
            self.state.ended()
        });
        if let (false, Some(d)) = (ended, drive) {
            d.park(&self.state);
        }
        if let Some(r) = self.state.report_if_ok() {
            return Ok(r);
        }
        let mut p = self.state.lock();
        // Read the clock only when the wait has to sleep (the spin above ends most waits).
        let mut deadline: Option<Instant> = None;
        while p.done.is_none() {
            let now = Instant::now();
            let deadline = *deadline.get_or_insert(now + timeout.saturating_sub(spin));
            if now >= deadline {
                return Err(Error::Timeout(timeout));
            }
            p.waiters += 1;
            p = self
                .state
                .cv
                .wait_timeout(p, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            p.waiters -= 1;
        }
        if let Some(e) = &p.first_error {
            return Err(e.clone());
        }
        // Ended (`done` is set): `finish` stored the elapsed time with it.
        Ok(self.state.report(self.state.results(&p)))
    }
}
