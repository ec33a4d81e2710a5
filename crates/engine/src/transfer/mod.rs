//! Transfers: a batch of one-sided ops, the handle returned by submit, statuses and per-op results.
//!
//! Invariants: an op is `Completed` only after the target confirmed its bytes are in place (tcp: a
//! per-chunk ack sent after the payload landed; shm: the end-of-batch reply). A transfer is
//! `Completed` only when every op is, and its notification (if any) was delivered. Anything else ends
//! as `Failed { reason }`, the first error seen.
//!
//! # The completion state machine (one, for every transport)
//!
//! The state is [`XferState`]; its progress (each op's state, chunks left, the first error) sits
//! under one lock, and every transition below takes it once.
//!
//! - An op starts `PENDING` with one chunk (`set_chunks` cuts it into more: tcp's chunks; rdma
//!   confirms an op once all its rail pieces landed, as one chunk).
//! - `chunk_done(i, bytes, Ok)`: one chunk confirmed; the op becomes `COMPLETED` with its last.
//!   `ops_done` does the same for whole single-chunk ops in one update.
//! - `chunk_done(i, _, Err(e))`: the op becomes `FAILED`; `fail_pending(e)`: every op still
//!   pending does (peer lost, timeout); the first error is kept as the transfer's reason.
//! - `fail_transfer(e)`: the transfer fails without changing an op (its notification was lost).
//! - `finish` (or `finish_with`, the last ops and the end in one update): the transfer ends. An op
//!   still pending then was never confirmed and fails; the counters are fed once; waiters wake.
//!   Nothing moves a state after this.
//!
//! Who drives it: a transport ([`crate::transport::Transport`]) takes the state at submit and
//! calls the transitions from its own thread (tcp's stream threads, shm's worker, rdma's
//! completion thread), ending with `transport::notify_and_finish` when the transfer carries a
//! notification. A transport that completes some transfers on request instead (the shm ring's
//! inline slots, posted by the submitting thread) also gives the peer a [`Drive`]: a waiter
//! polls it before sleeping and `park`s it when it is about to, so the completion needs no
//! thread hand-off on the fast path and still happens when nobody waits.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// The clock of transfer start, end and deadline (raw ticks: `clock.rs`).
type Clock = clock::Tick;

use crate::error::{Error, Result};

mod builder;
pub(crate) mod clock;
mod handle;
mod ops;
mod runs;
mod spare;
mod status;

use crate::stats::Stats;
pub use builder::Transfer;
pub use handle::TransferHandle;
pub(crate) use ops::{Op, OpRef, Regions};
pub(crate) use runs::Plans;
pub use runs::{OpResult, OpResults, OpResultsIter};
pub(crate) use spare::rearm;
pub(crate) use status::Outcome;
pub use status::{OpKind, OpStatus, Status};

/// How a transfer's ops became copies: `ops` of them moved in `copies` batched copies (one
/// kernel launch each, `gdx_copy_batch`), the rest one copy per op. A block list of 1,000
/// blocks over ipc is one copy per ring slot, not 1,000.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Batching {
    /// Ops moved by batched copies.
    pub ops: u64,
    /// Batched copies (kernel launches) that moved them.
    pub copies: u64,
    /// Ops copied under the target's standing lease (`cma`): no round trip to the target.
    pub standing: u64,
}

impl std::fmt::Display for Batching {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.standing > 0 {
            write!(
                f,
                "{} ops copied under the target's standing lease (no round trip to it); ",
                self.standing
            )?;
        }
        if self.copies == 0 {
            return write!(f, "no batched copy: one copy per op");
        }
        write!(
            f,
            "{} ops in {} batched cop{} (gdx_copy_batch: one kernel launch each, where the copy \
             engine takes one copy per op and pays its fixed cost per op)",
            self.ops,
            self.copies,
            if self.copies == 1 { "y" } else { "ies" }
        )
    }
}

/// What a completed transfer did.
#[derive(Debug, Clone)]
pub struct TransferReport {
    /// Bytes moved (sum of op lengths).
    pub bytes: u64,
    /// Time from submit to completion.
    pub elapsed: Duration,
    /// One entry per op, in submission order (stored once per run of equal results).
    pub ops: OpResults,
}

impl TransferReport {
    /// Throughput in bytes per second.
    pub fn bytes_per_sec(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// An op's outcome as the progress lock keeps it: pending, completed, or failed with
/// `Progress::errors[k]`. Four bytes per op; an error that fails many ops (a lost peer) is
/// stored once for all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct OpState(u32);

impl OpState {
    const PENDING: OpState = OpState(0);
    const COMPLETED: OpState = OpState(1);

    fn failed(k: usize) -> OpState {
        OpState(u32::try_from(k).unwrap_or(u32::MAX - 2) + 2)
    }

    /// The index of its error in `Progress::errors`, if it failed.
    fn error(self) -> Option<usize> {
        (self.0 >= 2).then(|| (self.0 - 2) as usize)
    }
}

#[derive(Debug)]
struct Progress {
    /// Each op's outcome so far (its plan is the transfer's, outside the lock).
    state: smallvec::SmallVec<[OpState; 4]>,
    /// The errors failed ops point at (`OpState::failed`).
    errors: Vec<Error>,
    /// Chunks still unconfirmed per op (most transfers have a few ops: kept inline).
    pending_chunks: smallvec::SmallVec<[u32; 4]>,
    first_error: Option<Error>,
    done: Option<Clock>,
    /// Threads sleeping on `cv` (`finish` wakes them only when there are some).
    waiters: u32,
}

impl Progress {
    /// Every one of `n` ops pending, in one chunk each.
    fn new(n: usize) -> Progress {
        Progress {
            state: smallvec::smallvec![OpState::PENDING; n],
            errors: Vec::new(),
            pending_chunks: smallvec::smallvec![1; n],
            first_error: None,
            done: None,
            waiters: 0,
        }
    }

    /// Fails op `i` with `e` if it is still pending (its first error stays).
    fn fail(&mut self, i: usize, e: &Error) {
        if self.state[i] != OpState::PENDING {
            return;
        }
        let k = match self.errors.last() {
            Some(last) if last == e => self.errors.len() - 1,
            _ => {
                self.errors.push(e.clone());
                self.errors.len() - 1
            }
        };
        self.state[i] = OpState::failed(k);
    }

    /// Fails every op still pending with `e`.
    fn fail_all_pending(&mut self, e: &Error) {
        for i in 0..self.state.len() {
            self.fail(i, e);
        }
    }

    fn outcome(&self, i: usize) -> Outcome<'_> {
        match self.state[i] {
            OpState::PENDING => Outcome::Pending,
            OpState::COMPLETED => Outcome::Completed,
            s => match s.error().and_then(|k| self.errors.get(k)) {
                Some(e) => Outcome::Failed(e),
                None => Outcome::Pending,
            },
        }
    }
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
    /// Ended fresh transfers' states, kept for the next submits (`spare.rs`).
    pub(crate) spares: spare::Spares,
    /// The rails of the peer's connection, for transports that have them (tcp).
    pub(crate) rails: Option<Arc<crate::rails::Rails>>,
}

/// Ids a thread reserves at a time (`next_id`).
const ID_BLOCK: u64 = 1 << 20;

/// The next block of transfer ids to reserve.
static NEXT_ID_BLOCK: AtomicU64 = AtomicU64::new(ID_BLOCK);

thread_local! {
    /// This thread's reserved ids: the next one and the end of its block.
    static IDS: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
}

/// A transfer id unique in this process (acks and results are matched by it). Each thread
/// reserves a block of ids from a global counter, so a submit costs no atomic read-modify-write
/// (one per million transfers a thread submits).
pub(crate) fn next_id() -> u64 {
    IDS.with(|ids| {
        let (mut next, mut end) = ids.get();
        if next >= end {
            next = NEXT_ID_BLOCK.fetch_add(ID_BLOCK, Ordering::Relaxed);
            end = next + ID_BLOCK;
        }
        ids.set((next + 1, end));
        next
    })
}

#[cfg(test)]
#[test]
fn ids_are_unique_across_threads_and_blocks() {
    let per = (ID_BLOCK + 10) as usize;
    let ids: Vec<Vec<u64>> = (0..3)
        .map(|_| std::thread::spawn(move || (0..per).map(|_| next_id()).collect::<Vec<u64>>()))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().expect("thread"))
        .collect();
    let mut all: Vec<u64> = ids.into_iter().flatten().collect();
    let n = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), n, "an id was handed out twice");
    assert!(all[0] > 0);
}

/// State shared between a [`TransferHandle`] and the transport running the transfer.
#[derive(Debug)]
pub(crate) struct XferState {
    pub(crate) id: u64,
    pub(crate) ops: smallvec::SmallVec<[Op; 1]>,
    /// The regions the ops join (`op`, `op_refs`).
    regions: Regions,
    pub(crate) notify: Option<Vec<u8>>,
    /// Each op's plan, as made at submit (read without the lock).
    plans: Plans,
    pub(crate) started: Clock,
    pub(crate) deadline: Clock,
    /// What `deadline` is `started` plus (reported as it was given, not rounded by the clock).
    timeout: Duration,
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
    /// Bytes landed over each rail of the peer's connection (`TransferHandle::rails`).
    pub(crate) rail_bytes: [AtomicU64; crate::rails::MAX_RAILS],
    /// Ops moved by batched copies, the copies, ops copied under a standing lease (`Batching`).
    batched: [AtomicU64; 3],
    /// Set by [`TransferHandle::cancel`]: the transport starts nothing more of it (`halt`).
    cancelled: AtomicBool,
}

/// A submitted transfer whose state is not built yet (`Transport::submit_new`): a transport
/// that can put the request on the wire first builds the state after, while the peer works
/// (the peer's shared part is referenced until then, and its reference taken by `build`).
///
/// The ops and plans are borrowed from the submitting call's frame and taken out when the
/// state is built: passed by value, the ~250 bytes of a transfer were copied (`memcpy`) at
/// each of three calls on the way from `Peer::submit` to the state, just after being written,
/// which costs more than the copy's size suggests (each copy's loads wait on the stores).
#[derive(Debug)]
pub(crate) struct NewTransfer<'a> {
    pub(crate) id: u64,
    pub(crate) t: &'a mut Transfer,
    pub(crate) plans: &'a mut Plans,
    pub(crate) timeout: Duration,
    pub(crate) shared: &'a Arc<XferShared>,
    /// When it was submitted (the transfer's start, whenever its state is built).
    pub(crate) started: Clock,
}

impl<'a> NewTransfer<'a> {
    /// Starts the clock of a transfer submitted now.
    pub(crate) fn now(
        id: u64,
        t: &'a mut Transfer,
        plans: &'a mut Plans,
        timeout: Duration,
        shared: &'a Arc<XferShared>,
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
    fn new(n: NewTransfer<'_>) -> Self {
        let NewTransfer {
            id,
            t,
            plans,
            timeout,
            shared,
            started,
        } = n;
        let n = t.ops.len();
        debug_assert_eq!(plans.len(), n, "one plan per op");
        let timeout = t.timeout.unwrap_or(timeout);
        XferState {
            id,
            ops: std::mem::take(&mut t.ops),
            regions: std::mem::take(&mut t.regions),
            notify: t.notify.take(),
            plans: std::mem::take(plans),
            started,
            // A timeout too long for the clock (`Duration::MAX` for "never") saturates.
            deadline: started.plus(timeout),
            timeout,
            bytes_done: AtomicU64::new(0),
            ended: AtomicBool::new(false),
            ok: AtomicBool::new(false),
            elapsed_ns: AtomicU64::new(0),
            progress: Mutex::new(Progress::new(n)),
            cv: Condvar::new(),
            shared: Arc::clone(shared),
            driven: AtomicBool::new(false),
            rail_bytes: Default::default(),
            batched: Default::default(),
            cancelled: AtomicBool::new(false),
        }
    }

    /// Op `i` with its regions.
    pub(crate) fn op(&self, i: usize) -> OpRef<'_> {
        self.regions.get(&self.ops[i])
    }

    /// Each op with its regions.
    pub(crate) fn op_refs(&self) -> impl ExactSizeIterator<Item = OpRef<'_>> + Clone + '_ {
        ops::with_regions(&self.ops, &self.regions)
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
                if *left == 0 && p.state[i] == OpState::PENDING {
                    p.state[i] = OpState::COMPLETED;
                }
            }
            Err(e) => {
                p.fail(i, &e);
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
            if *left == 0 && p.state[i] == OpState::PENDING {
                p.state[i] = OpState::COMPLETED;
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
        p.fail_all_pending(e);
        p.first_error.get_or_insert_with(|| e.clone());
    }

    /// Marks the transfer failed without touching op statuses (e.g. the notification was lost).
    pub(crate) fn fail_transfer(&self, e: Error) {
        self.lock().first_error.get_or_insert(e);
    }

    /// The path of every op (no copies of the reasons).
    pub(crate) fn paths(&self) -> impl ExactSizeIterator<Item = crate::routing::plan::Path> + '_ {
        self.plans.paths()
    }

    /// The path of op `i`.
    pub(crate) fn path(&self, i: usize) -> crate::routing::plan::Path {
        self.plans.at(i).path
    }

    /// Each op's result as it stands.
    fn results(&self, p: &Progress) -> OpResults {
        self.results_by(|i| p.outcome(i))
    }

    /// Each op's result, op `i`'s outcome being `outcome(i)`.
    fn results_by<'a>(&self, outcome: impl Fn(usize) -> Outcome<'a>) -> OpResults {
        if let [op] = &self.ops[..] {
            return OpResults::one(OpResult {
                kind: op.kind,
                len: op.len,
                plan: self.plans.at(0).clone(),
                status: outcome(0).status(),
            });
        }
        let mut r = OpResults::default();
        for (i, (op, plan)) in self.ops.iter().zip(self.plans.iter()).enumerate() {
            r.push_with(
                op.kind,
                op.len,
                plan,
                || outcome(i).status(),
                |st| outcome(i).is(st),
            );
        }
        r
    }

    /// The report of an ended transfer whose ops' results are `ops`.
    fn report(&self, ops: OpResults) -> TransferReport {
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
        if p.state.contains(&OpState::PENDING) {
            let unconfirmed = Error::Protocol("op was never confirmed by the peer".into());
            p.fail_all_pending(&unconfirmed);
            p.first_error.get_or_insert(unconfirmed);
        }
        let now = Clock::now();
        let ns = now.nanos_since(self.started);
        if let (None, [op], [OpState::COMPLETED]) = (p.done, &self.ops[..], &p.state[..]) {
            // One op, completed (a small transfer): counted without the walk below.
            let path = self.plans.at(0).path;
            self.shared.stats.record_one(op.kind, op.len, path, ns);
        } else if p.done.is_none() {
            let ops = self.ops.iter().zip(self.plans.paths()).enumerate();
            self.shared.stats.record(
                ops.map(|(i, (op, path))| (op.kind, op.len, path, p.outcome(i))),
                p.first_error.is_some(),
                Duration::from_nanos(ns),
            );
        }
        p.done = Some(now);
        // What a waiter of a completed transfer reads without the lock (`report_if_ok`):
        // stored before `ended`, which publishes them.
        self.ok.store(p.first_error.is_none(), Ordering::Relaxed);
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
        Some(self.report(self.results_by(|_| Outcome::Completed)))
    }

    /// `ops` ops of this transfer moved as one batched copy.
    pub(crate) fn note_batched(&self, ops: usize) {
        self.batched[0].fetch_add(ops as u64, Ordering::Relaxed);
        self.batched[1].fetch_add(1, Ordering::Relaxed);
    }

    /// `ops` ops of this transfer copied under the target's standing lease.
    pub(crate) fn note_standing(&self, ops: usize) {
        self.batched[2].fetch_add(ops as u64, Ordering::Relaxed);
    }

    /// How many of the ops moved in batched copies, and in how many.
    pub(crate) fn batching(&self) -> Batching {
        Batching {
            ops: self.batched[0].load(Ordering::Relaxed),
            copies: self.batched[1].load(Ordering::Relaxed),
            standing: self.batched[2].load(Ordering::Relaxed),
        }
    }

    pub(crate) fn expired(&self) -> bool {
        Clock::now() >= self.deadline
    }

    /// Why nothing more of this transfer may start, if so: it was cancelled
    /// ([`Error::Cancelled`]) or its deadline passed ([`Error::Timeout`]). Transports ask
    /// before each piece of work they start (a chunk, a ring run, an rdma piece) and fail
    /// what is left with this error.
    pub(crate) fn halt(&self) -> Option<Error> {
        if self.cancelled.load(Ordering::Acquire) {
            return Some(Error::Cancelled);
        }
        self.expired().then(|| self.timeout_error())
    }

    /// The notification to deliver now that the ops ended: none when an op failed, nor for a
    /// cancelled transfer, which then fails with [`Error::Cancelled`] (the peer must not act
    /// on a transfer its initiator gave up).
    pub(crate) fn notification(&self) -> Option<Vec<u8>> {
        let n = self.notify.as_ref()?;
        if self.is_cancelled() {
            self.fail_transfer(Error::Cancelled);
            return None;
        }
        (!self.has_failed()).then(|| n.clone())
    }

    /// Whether [`TransferHandle::cancel`] was called on it.
    pub(crate) fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }

    /// Time until the deadline (zero once it passed).
    pub(crate) fn time_left(&self) -> Duration {
        self.deadline.left()
    }

    pub(crate) fn timeout_error(&self) -> Error {
        Error::Timeout(self.timeout)
    }
}
