//! An RDM endpoint with its address vector and completion queue, memory registrations, and
//! batches of one-sided writes and reads.
//!
//! - **Completions**: every operation of a batch carries the batch's id as its context. Whoever
//!   reads the CQ (the batch's own thread while it waits, or the progress thread) counts the
//!   completion against that batch, so two batches never steal each other's completions.
//! - **Progress**: providers with manual data progress (tcp) serve *remote* operations only
//!   while the target polls, so every endpoint runs a progress thread that waits on the CQ.
//! - **Timeouts**: a batch that does not complete by its deadline returns `Timeout`; its
//!   operations stay parked (with clones of their registrations, so no MR is closed under an
//!   operation) until they complete or the endpoint closes.
//! - **Bounds** are checked by gdx before anything is posted; keys are checked by the provider
//!   on the target (a wrong key comes back as a completion error).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::{FabricError, Result};
use crate::provider::{self, FabricConfig, ProviderInfo};
use crate::region::{MemoryRegion, PeerAddr, RmaKind, RmaOp};
use gdx_sys::fabric::{self as sys, bindings as ffi, CqEvent, Memory, Post};

/// How long the progress thread waits on the CQ per call.
const PROGRESS_WAIT_MS: i32 = 10;
/// How often a waiting batch asks whether the peer is still there.
const LIVENESS_EVERY: Duration = Duration::from_millis(20);
/// Largest piece one operation is split into (and never more than the provider's limit).
const MAX_CHUNK: usize = 64 << 20;

#[derive(Default)]
struct Batch {
    outstanding: usize,
    error: Option<FabricError>,
    /// Registrations kept alive while the batch's operations may still run.
    _hold: Vec<MemoryRegion>,
    abandoned: bool,
}

struct Shared {
    ep: Arc<sys::Ep>,
    domain: Arc<sys::Domain>,
    batches: Mutex<HashMap<u64, Batch>>,
    stop: AtomicBool,
    wait_ok: bool,
    /// The provider's prov_errno values are errnos (tcp).
    errno_prov: bool,
}

impl Shared {
    /// One CQ read; completions are credited to their batches.
    fn progress(&self, wait_ms: i32) -> Result<usize> {
        let ev = self.ep.cq().read(wait_ms)?;
        let mut b = self.batches.lock().unwrap_or_else(|p| p.into_inner());
        let mut credit = |ctx: u64, err: Option<FabricError>| {
            if let Some(x) = b.get_mut(&ctx) {
                x.outstanding = x.outstanding.saturating_sub(1);
                if x.error.is_none() {
                    x.error = err;
                }
                if x.abandoned && x.outstanding == 0 {
                    b.remove(&ctx);
                }
            }
        };
        Ok(match ev {
            CqEvent::Empty => 0,
            CqEvent::Done(ctxs) => {
                let n = ctxs.len();
                for c in ctxs {
                    credit(c, None);
                }
                n
            }
            CqEvent::Failed {
                context,
                err,
                prov_errno,
                text,
            } => {
                credit(
                    context,
                    Some(completion_error(err, prov_errno, self.errno_prov, text)),
                );
                1
            }
        })
    }
}

/// A completion's error code, by meaning. The tcp provider reports most failures as
/// ECANCELED with an errno in prov_errno: ENOENT when the target's MR lookup failed (unknown
/// key, or an access outside the registration), ENOTCONN/ECONNRESET/... when the peer went
/// away. `errno_prov` says prov_errno is an errno (tcp); other providers have their own codes.
fn completion_error(err: i32, prov_errno: i32, errno_prov: bool, text: String) -> FabricError {
    let mut e = err as u32;
    if errno_prov && (e == ffi::FI_ECANCELED || e == ffi::FI_EIO) && prov_errno > 0 {
        if prov_errno == libc::ENOENT {
            return FabricError::RemoteAccess {
                code: prov_errno,
                text,
            };
        }
        e = prov_errno as u32;
    }
    if [
        ffi::FI_ECONNREFUSED,
        ffi::FI_ECONNRESET,
        ffi::FI_ENOTCONN,
        ffi::FI_EHOSTUNREACH,
        ffi::FI_ENETUNREACH,
        ffi::FI_ECONNABORTED,
        ffi::FI_ESHUTDOWN,
        libc::EPIPE as u32,
        ffi::FI_ETIMEDOUT,
    ]
    .contains(&e)
    {
        FabricError::PeerLost {
            code: Some(e as i32),
            text,
        }
    } else if [
        ffi::FI_EACCES,
        ffi::FI_EPERM,
        ffi::FI_EKEYREJECTED,
        ffi::FI_EINVAL,
        ffi::FI_EREMOTEIO,
        ffi::FI_EFAULT,
    ]
    .contains(&e)
    {
        FabricError::RemoteAccess {
            code: e as i32,
            text,
        }
    } else {
        FabricError::Completion {
            code: err,
            prov_errno,
            text,
        }
    }
}

/// An open RDM endpoint (fabric, domain, AV, CQ) and its progress thread.
pub struct Endpoint {
    shared: Arc<Shared>,
    info: ProviderInfo,
    reason: String,
    mr_mode: i32,
    addr_format: u32,
    next_key: AtomicU64,
    next_batch: AtomicU64,
    max_chunk: usize,
    window: usize,
    progress: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Endpoint({} {} {})",
            self.info.provider, self.info.fabric, self.info.domain
        )
    }
}

/// `verbs;ofi_rxm` sizes each connection's verbs CQ as (tx + rx size) x `FI_UNIVERSE_SIZE`
/// (256 unless set), past what some devices take (Soft-RoCE: max_cqe 32767), and then fails
/// `fi_enable` with a bare EINVAL; say so, and what makes it work.
fn enable_hint(provider: &str, e: FabricError) -> FabricError {
    let rxm_verbs = provider.starts_with("verbs") && provider.contains("rxm");
    if !rxm_verbs || !matches!(e, FabricError::Call { code: 22, .. }) {
        return e;
    }
    let why = match std::env::var("FI_UNIVERSE_SIZE") {
        Err(_) => "verbs;ofi_rxm sizes its verbs CQ as (tx + rx size) x FI_UNIVERSE_SIZE (256 by \
                   default), more completion entries than this device allows (see max_cqe in \
                   `ibv_devinfo -v`; Soft-RoCE takes 32767): set FI_UNIVERSE_SIZE=64"
            .to_string(),
        Ok(v) => format!(
            "verbs;ofi_rxm sizes its verbs CQ as (tx + rx size) x FI_UNIVERSE_SIZE ({v}): if \
             that is above the device's max_cqe (`ibv_devinfo -v`), lower FI_UNIVERSE_SIZE"
        ),
    };
    FabricError::Enable {
        source: Box::new(e),
        why,
    }
}

impl Endpoint {
    /// Chooses a provider ([`FabricConfig`]) and opens an endpoint on it.
    pub fn open(cfg: &FabricConfig) -> Result<Endpoint> {
        let (info, entry, reason) = provider::choose(cfg)?;
        let pinfo = ProviderInfo::from_entry(&entry);
        let fabric = sys::open_fabric(info)?;
        let domain = fabric.domain()?;
        let depth = entry.tx_size.clamp(64, 4096);
        // A wait object lets the progress thread sleep in the CQ instead of spinning; a
        // provider without one is polled.
        // shm's wait object does not wake for the peer's traffic (measured: a 64 MiB read
        // crawled at one segment per wait), so shm is polled.
        let try_wait = pinfo.core() != "shm";
        let (cq, wait_ok) = match domain.cq(depth * 2, try_wait) {
            Ok(cq) => (cq, try_wait),
            Err(_) => (domain.cq(depth * 2, false)?, false),
        };
        let av = domain.av()?;
        let ep = domain
            .endpoint(&cq, &av)
            .map_err(|e| enable_hint(&pinfo.provider, e.into()))?;
        let seed = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let shared = Arc::new(Shared {
            ep,
            domain,
            batches: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
            wait_ok,
            errno_prov: pinfo.core() == "tcp",
        });
        let s = Arc::clone(&shared);
        let handle = std::thread::Builder::new()
            .name("gdx-fabric-progress".into())
            .spawn(move || progress_loop(&s))
            .map_err(FabricError::ProgressThread)?;
        Ok(Endpoint {
            shared,
            info: pinfo,
            reason,
            mr_mode: entry.mr_mode,
            addr_format: entry.addr_format,
            // Random start (high bit clear) so a key from another endpoint or a stale one
            // does not name a live registration by accident.
            next_key: AtomicU64::new((seed >> 16) | 1),
            next_batch: AtomicU64::new(1),
            max_chunk: entry.max_msg_size.clamp(1, MAX_CHUNK),
            window: depth,
            progress: Mutex::new(Some(handle)),
        })
    }

    /// The provider in use.
    pub fn provider(&self) -> &ProviderInfo {
        &self.info
    }

    /// Why this provider was chosen.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// This endpoint's address, to give to peers.
    pub fn address(&self) -> Result<Vec<u8>> {
        Ok(self.shared.ep.name()?)
    }

    /// This endpoint's address, printed (`127.0.0.1:40123` for tcp).
    pub fn bound_address(&self) -> String {
        match self.address() {
            Ok(a) => provider::sockaddr_text(self.addr_format, &a),
            Err(e) => format!("(no address: {e})"),
        }
    }

    /// Adds a peer's address (from its [`address`](Self::address)).
    pub fn insert_peer(&self, addr: &[u8]) -> Result<PeerAddr> {
        Ok(PeerAddr(self.shared.ep.insert_peer(addr)?))
    }

    /// Registers `mem` for local use and remote read and write.
    pub fn register(&self, mem: Memory) -> Result<MemoryRegion> {
        self.register_shared(&Arc::new(mem))
    }

    /// Whether GPU memory ([`Memory::from_cuda`]) can be registered here: the endpoint's
    /// provider entry has FI_HMEM (registration then goes through `fi_mr_regattr` with
    /// FI_HMEM_CUDA).
    pub fn registers_hmem(&self) -> bool {
        self.info.hmem
    }

    /// Registers memory that may be shared with other registrations.
    ///
    /// # Errors
    /// [`FabricError::NoHmem`] for GPU memory when [`Endpoint::registers_hmem`] is false;
    /// the provider's error otherwise.
    pub fn register_shared(&self, mem: &Arc<Memory>) -> Result<MemoryRegion> {
        crate::region::check_hmem(&self.info, mem)?;
        let access =
            (ffi::FI_READ | ffi::FI_WRITE | ffi::FI_REMOTE_READ | ffi::FI_REMOTE_WRITE) as u64;
        let key = self.next_key.fetch_add(1, Ordering::SeqCst) & (u64::MAX >> 1);
        let ep = (self.mr_mode & ffi::FI_MR_ENDPOINT as i32 != 0).then_some(&self.shared.ep);
        let mr = self.shared.domain.register(mem, access, key, ep)?;
        Ok(MemoryRegion {
            mr: Arc::new(mr),
            virt_addr: self.mr_mode & ffi::FI_MR_VIRT_ADDR as i32 != 0,
        })
    }

    /// Registrations of this endpoint's domain that are not closed yet, and the number of
    /// `fi_close` calls the provider refused.
    pub fn registrations(&self) -> (usize, usize) {
        (
            self.shared.domain.live_registrations(),
            self.shared.domain.close_errors(),
        )
    }

    /// Runs `ops` and waits for all of them, up to `timeout`. Bounds are checked for every op
    /// before anything is posted; the first completion error fails the batch (after the
    /// batch's other operations have completed, so no registration closes under one).
    pub fn run(&self, ops: &[RmaOp<'_>], timeout: Duration) -> Result<()> {
        self.run_watched(ops, timeout, &mut || true)
    }

    /// [`run`](Self::run), asking `peer_alive` every few milliseconds while it waits: a
    /// provider may hold operations to a dead peer until the deadline (tcp keeps
    /// reconnecting), while the caller's own channel to the peer (the engine's control
    /// connection) sees the death at once. When `peer_alive` says no, the batch fails with
    /// `PeerLost` (its operations stay parked like a timed-out batch's).
    pub fn run_watched(
        &self,
        ops: &[RmaOp<'_>],
        timeout: Duration,
        peer_alive: &mut dyn FnMut() -> bool,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        for op in ops {
            check(op)?;
        }
        let id = self.next_batch.fetch_add(1, Ordering::SeqCst);
        self.batches().insert(
            id,
            Batch {
                _hold: ops.iter().map(|o| o.local.clone()).collect(),
                ..Batch::default()
            },
        );
        let mut watch = Watch {
            alive: peer_alive,
            next: Instant::now() + LIVENESS_EVERY,
            dead: false,
        };
        let posted = self.post_all(id, ops, deadline, &mut watch);
        let unposted = *posted.as_ref().unwrap_or(&0);
        let (pending, dead) = if watch.dead {
            (self.outstanding(id).0, true)
        } else {
            self.wait(id, deadline, &mut watch)
        };
        let mut b = self.batches();
        if pending == 0 && unposted == 0 {
            let batch = b.remove(&id);
            drop(b);
            posted?;
            return match batch.and_then(|x| x.error) {
                Some(e) => Err(e),
                None => Ok(()),
            };
        }
        // Park it: the progress thread drops it (and its registration clones) once its last
        // operation completes, or the endpoint closes.
        let err = b.get_mut(&id).and_then(|x| {
            x.abandoned = true;
            x.error.take()
        });
        if pending == 0 {
            b.remove(&id);
        }
        drop(b);
        posted?;
        match err {
            Some(e) => Err(e),
            None if dead => Err(FabricError::PeerLost {
                code: None,
                text: format!(
                    "the peer's own channel reports it gone; {pending} operation(s) outstanding"
                ),
            }),
            None => Err(FabricError::Timeout {
                pending: pending + unposted,
                posted: ops.len(),
                waited_ms: timeout.as_millis(),
            }),
        }
    }

    fn batches(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Batch>> {
        self.shared
            .batches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    fn outstanding(&self, id: u64) -> (usize, bool) {
        let b = self.batches();
        b.get(&id)
            .map_or((0, false), |x| (x.outstanding, x.error.is_some()))
    }

    /// Posts every op in pieces of at most `max_chunk`, keeping at most `window` in flight;
    /// stops at the first error (a failed post or a failed completion). At the deadline it
    /// stops and returns how many ops were not (fully) posted.
    fn post_all(
        &self,
        id: u64,
        ops: &[RmaOp<'_>],
        deadline: Instant,
        watch: &mut Watch<'_>,
    ) -> Result<usize> {
        for (i, op) in ops.iter().enumerate() {
            let mut done = 0u64;
            while done < op.len || (op.len == 0 && done == 0) {
                let n = (op.len - done).min(self.max_chunk as u64);
                loop {
                    let (out, failed) = self.outstanding(id);
                    if failed {
                        return Ok(0);
                    }
                    if out < self.window {
                        break;
                    }
                    if !self.poll(deadline, watch)? {
                        return Ok(ops.len() - i);
                    }
                }
                // Counted before posting: the completion can arrive before `post` returns.
                self.credit_post(id, 1);
                loop {
                    // SAFETY: the batch holds a clone of `op.local` (`Batch::_hold`, taken in
                    // `run_watched` before posting) until every operation it posted has
                    // completed, or, once abandoned (a timeout or a dead peer), until they
                    // complete or the endpoint closes; so the registration outlives the post.
                    let r = unsafe {
                        self.shared.ep.post(
                            op.kind == RmaKind::Write,
                            &op.local.mr,
                            (op.local_offset + done) as usize,
                            n as usize,
                            op.peer.0,
                            op.remote.addr + op.remote_offset + done,
                            op.remote.key,
                            id,
                        )
                    };
                    match r {
                        Ok(Post::Queued) => break,
                        Ok(Post::Again) => match self.poll(deadline, watch) {
                            Ok(true) => {}
                            Ok(false) => {
                                self.credit_post(id, -1);
                                return Ok(ops.len() - i);
                            }
                            Err(e) => {
                                self.credit_post(id, -1);
                                return Err(e);
                            }
                        },
                        Err(e) => {
                            self.credit_post(id, -1);
                            return Err(e.into());
                        }
                    }
                }
                if op.len == 0 {
                    break;
                }
                done += n;
            }
        }
        Ok(0)
    }

    fn credit_post(&self, id: u64, d: isize) {
        if let Some(x) = self.batches().get_mut(&id) {
            x.outstanding = x.outstanding.saturating_add_signed(d);
        }
    }

    /// One progress call from a posting batch; `false` once past the deadline or once the
    /// peer is known dead.
    fn poll(&self, deadline: Instant, watch: &mut Watch<'_>) -> Result<bool> {
        if Instant::now() >= deadline || !watch.check() {
            return Ok(false);
        }
        if self.shared.progress(0)? == 0 {
            std::thread::yield_now();
        }
        Ok(true)
    }

    /// Waits until batch `id` has nothing outstanding, the deadline passes or `peer_alive`
    /// says no; returns how many operations are still outstanding and whether the peer died.
    fn wait(&self, id: u64, deadline: Instant, watch: &mut Watch<'_>) -> (usize, bool) {
        loop {
            let (out, _) = self.outstanding(id);
            if out == 0 {
                return (0, false);
            }
            let now = Instant::now();
            if now >= deadline {
                return (out, false);
            }
            if !watch.check() {
                return (out, true);
            }
            if let Err(e) = self.shared.progress(0) {
                log::debug!("fabric progress: {e}");
            }
            std::thread::yield_now();
        }
    }
}

/// The caller's view of the peer, asked at most every [`LIVENESS_EVERY`].
struct Watch<'a> {
    alive: &'a mut dyn FnMut() -> bool,
    next: Instant,
    dead: bool,
}

impl Watch<'_> {
    /// `false` once the peer is known dead.
    fn check(&mut self) -> bool {
        if self.dead {
            return false;
        }
        let now = Instant::now();
        if now >= self.next {
            self.dead = !(self.alive)();
            self.next = now + LIVENESS_EVERY;
        }
        !self.dead
    }
}

/// gdx's bounds check, before posting.
fn check(op: &RmaOp<'_>) -> Result<()> {
    let l = op.local.len() as u64;
    if op.local_offset.checked_add(op.len).is_none_or(|e| e > l) {
        return Err(FabricError::OutOfBounds {
            side: "local",
            offset: op.local_offset,
            len: op.len,
            size: l,
        });
    }
    if op
        .remote_offset
        .checked_add(op.len)
        .is_none_or(|e| e > op.remote.len)
    {
        return Err(FabricError::OutOfBounds {
            side: "remote",
            offset: op.remote_offset,
            len: op.len,
            size: op.remote.len,
        });
    }
    Ok(())
}

/// Serves remote operations (manual progress) and collects completions nobody is waiting on.
fn progress_loop(s: &Shared) {
    while !s.stop.load(Ordering::SeqCst) {
        let wait = if s.wait_ok { PROGRESS_WAIT_MS } else { 0 };
        match s.progress(wait) {
            Ok(0) if !s.wait_ok => std::thread::sleep(Duration::from_micros(50)),
            Ok(_) => {}
            Err(e) => {
                log::debug!("fabric progress: {e}");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let h = self
            .progress
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(h) = h {
            let _ = h.join();
        }
        // Parked batches' registrations are released with the endpoint (closing it cancels
        // what is still queued).
        self.batches().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_completion_errors_are_named_by_their_errno() {
        let t = String::new;
        let c = ffi::FI_ECANCELED as i32;
        assert!(matches!(
            completion_error(c, libc::ENOENT, true, t()),
            FabricError::RemoteAccess { .. }
        ));
        assert!(matches!(
            completion_error(c, libc::ENOTCONN, true, t()),
            FabricError::PeerLost { .. }
        ));
        assert!(matches!(
            completion_error(c, libc::ECONNRESET, true, t()),
            FabricError::PeerLost { .. }
        ));
        // Another provider's prov_errno is not an errno: ECANCELED stays a plain completion error.
        assert!(matches!(
            completion_error(c, libc::ENOENT, false, t()),
            FabricError::Completion { .. }
        ));
        let k = ffi::FI_EKEYREJECTED as i32;
        assert!(matches!(
            completion_error(k, 0, false, t()),
            FabricError::RemoteAccess { .. }
        ));
    }
}
