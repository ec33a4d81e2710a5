//! The `cma` path of the shm transport: a peer's borrowed host regions (a caller's buffers, with
//! no memfd to map) copied by the kernel straight between the two processes
//! (`process_vm_writev`/`process_vm_readv`, many ops per system call), one copy instead of two
//! through the bounce buffer.
//!
//! Set-up, once per connection (`probe`): the initiator sends `ShmCmaGrant`; the target, unless
//! its `AgentConfig::shm_cma` is off, lets the socket's peer reach its memory (under Yama's
//! `ptrace_scope` 1, `prctl(PR_SET_PTRACER, peer pid)`; `CmaTarget`) and answers with the
//! address of a random probe value, which the initiator reads with `process_vm_readv`. Only a
//! read that returns the value (the kernel allowed it, and the socket's pid is that agent)
//! makes the peer's plans take `cma`; anything else leaves them staged, their reason naming
//! the refusal (the errno and the policy behind it, or the target's answer).
//!
//! Per region, once: `ShmCmaRegion` gives its address in the target (only to this
//! authenticated peer on this kernel). Per transfer: the target leases the ops (a ring `BEGIN`
//! or `ShmBegin`), then the initiator copies each run of same-direction ops in as few calls as
//! the kernel takes (`CMA_MAX_IOV` spans a side) and ends the batch; where the target holds a
//! standing lease on the region (`standing.rs`), the initiator copies without asking.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use gdx_sys::os::{cross_memory_copy, CmaDir};

use super::worker::{CmaRegion, Skip, Worker};
use crate::conn::Conn;
use crate::error::{Error, Result};
use crate::region::{LeaseKind, Registry};
use crate::routing::plan::{CmaGrant, Path};
use crate::transfer::{OpKind, XferState};
use crate::wire::Msg;

/// `Hello` transport bit: this agent's shm target understands the cma frames (33–36).
pub(crate) const CMA_FRAMES_BIT: u32 = 1 << 4;

/// Asks the target for direct copies and checks with the kernel that they work (see the
/// module comment). `target_pid`: the shm socket's peer, as `SO_PEERCRED` names it (0: not
/// visible from this PID namespace). `understands`: the target's `Hello` set
/// [`CMA_FRAMES_BIT`]. `Err` only for a connection that broke.
pub(super) fn probe(conn: &mut Conn, target_pid: u32, understands: bool) -> Result<CmaGrant> {
    if !understands {
        return Ok(refused(
            "the peer's gdx predates direct copies (no cma frames in its Hello)".into(),
        ));
    }
    let (addr, value) = match conn.request(&Msg::ShmCmaGrant) {
        Ok(Msg::ShmCmaProbe { addr, value }) => (addr, value),
        Ok(m) => {
            return Err(Error::Protocol(format!(
                "expected ShmCmaProbe, got frame type {}",
                m.kind()
            )))
        }
        Err(e) if e.is_fatal_for_stream() => return Err(e),
        Err(e) => return Ok(refused(format!("the peer declined: {e}"))),
    };
    if target_pid == 0 {
        return Ok(refused(
            "the peer's pid is not visible from this PID namespace (SO_PEERCRED gave 0)".into(),
        ));
    }
    let mut got = [0u8; 16];
    // SAFETY: `got` is a live local written only by this call; reading the peer's probe
    // needs no consent beyond the kernel's check.
    let r = unsafe {
        cross_memory_copy(
            target_pid,
            CmaDir::FromPeer,
            &[(got.as_mut_ptr(), got.len())],
            &[(addr, got.len())],
        )
    };
    Ok(match r {
        Ok(_) if u128::from_le_bytes(got) == value => CmaGrant::Granted { pid: target_pid },
        Ok(_) => refused(format!(
            "pid {target_pid} (the shm socket's peer) does not hold the probe value its agent \
             sent: not the same process"
        )),
        Err(e) => refused(kernel_refusal(&e, target_pid, ptrace_scope())),
    })
}

fn refused(why: String) -> CmaGrant {
    CmaGrant::Refused(why.into())
}

/// Yama's `ptrace_scope`, `None` without Yama.
fn ptrace_scope() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Why the kernel refused `process_vm_readv` of `pid`, naming the errno and the policy.
fn kernel_refusal(e: &std::io::Error, pid: u32, scope: Option<u32>) -> String {
    let call = format!("process_vm_readv of the peer (pid {pid})");
    use rustix::io::Errno;
    match Errno::from_io_error(e) {
        Some(Errno::PERM) => {
            let policy = match scope {
                Some(1) => {
                    "Yama ptrace_scope 1: the peer's PR_SET_PTRACER grant does not cover this \
                     process (a process names one ptracer at a time: another peer of it may \
                     hold that grant)"
                }
                Some(2) => "Yama ptrace_scope 2: only a process with CAP_SYS_PTRACE may",
                Some(3) => "Yama ptrace_scope 3: no process may",
                Some(_) => {
                    "Yama ptrace_scope 0: the peer runs as another user or is not dumpable, and \
                     this process lacks CAP_SYS_PTRACE"
                }
                None => {
                    "no Yama: the peer runs as another user or is not dumpable, and this process \
                     lacks CAP_SYS_PTRACE"
                }
            };
            format!("{call} failed with EPERM: the kernel forbids it ({policy})")
        }
        Some(Errno::SRCH) => {
            format!("{call} failed with ESRCH: no such process in this PID namespace")
        }
        Some(Errno::NOSYS) => format!(
            "{call} failed with ENOSYS: the kernel has no cross-memory attach \
             (CONFIG_CROSS_MEMORY_ATTACH)"
        ),
        _ => format!("{call} failed: {e}"),
    }
}

/// Yama allows one ptracer exception per process: the pid it names now and how many shm
/// connections use it.
static PTRACER: Mutex<Option<(u32, usize)>> = Mutex::new(None);

/// The target's side of one connection's direct copies: the probe value, and the Yama
/// exception this connection took (given back when the connection ends).
#[derive(Debug, Default)]
pub(super) struct CmaTarget {
    probe: Option<Box<u128>>,
    ptracer: Option<u32>,
}

impl CmaTarget {
    /// `ShmCmaGrant`: lets `peer` (the socket's pid) reach this process's memory and answers
    /// with the probe, or declines (`Unavailable`, saying why) when `allowed` is off.
    pub(super) fn grant(&mut self, allowed: bool, peer: u32) -> Result<Msg> {
        if !allowed {
            return Err(Error::unavailable(
                Path::Cma,
                "this agent does not let peers copy into its memory directly (GDX_SHM_CMA=0 / \
                 AgentConfig::shm_cma)",
            ));
        }
        if self.ptracer.is_none() && ptrace_scope() == Some(1) && peer != 0 {
            // Under scope 1 only a named ptracer (or an ancestor) may attach; other scopes need
            // no consent (0) or refuse whatever this process says (2, 3): the initiator's
            // probe learns which.
            let mut t = PTRACER.lock().unwrap_or_else(|p| p.into_inner());
            match *t {
                Some((pid, ref mut n)) if pid == peer => *n += 1,
                Some(_) => {} // held for another peer: this one's probe will say EPERM
                None => {
                    if let Some(p) = rustix::process::Pid::from_raw(peer as i32) {
                        if rustix::process::set_ptracer(rustix::process::PTracer::ProcessID(p))
                            .is_ok()
                        {
                            *t = Some((peer, 1));
                        }
                    }
                }
            }
            if t.is_some_and(|(pid, _)| pid == peer) {
                self.ptracer = Some(peer);
            }
        }
        let value = crate::mem::random_u128()?;
        let probe = self.probe.insert(Box::new(value));
        Ok(Msg::ShmCmaProbe {
            addr: std::ptr::from_ref::<u128>(probe) as u64,
            value,
        })
    }
}

impl Drop for CmaTarget {
    fn drop(&mut self) {
        let Some(pid) = self.ptracer else { return };
        let mut t = PTRACER.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((held, n)) = t.as_mut() {
            if *held == pid {
                *n -= 1;
                if *n == 0 {
                    *t = None;
                    if let Err(e) = rustix::process::set_ptracer(rustix::process::PTracer::None) {
                        log::warn!("clearing the Yama ptracer exception failed: {e}");
                    }
                }
            }
        }
    }
}

/// `ShmCmaRegion`: a borrowed host region's address here, for a peer that holds its key
/// (checked like a mapping: key and access). Agent-allocated regions are mapped instead
/// (`ShmMap`), GPU regions have no host bytes.
pub(super) fn region_addr(
    reg: &Registry,
    id: u64,
    key: crate::region::RegionKey,
    write: bool,
) -> Result<Msg> {
    let r = reg.get(id)?;
    if !r.key.ct_eq(&key) {
        return Err(Error::BadKey { region: id });
    }
    if write && !r.access.remote_write {
        return Err(Error::ReadOnly { region: id });
    }
    if !r.access.remote_read && !r.access.remote_write {
        return Err(Error::NotReadable { region: id });
    }
    let ptr = r.host_ptr().ok_or_else(|| {
        Error::InvalidArgument(format!(
            "region {id} is {} memory: it has no host bytes to copy directly",
            r.location
        ))
    })?;
    Ok(Msg::ShmCmaAddr {
        addr: ptr as u64,
        len: r.len,
        writable: r.access.remote_write,
    })
}

impl Worker {
    /// Learns once where the peer's borrowed region `id` lies in its memory (`ShmCmaRegion`).
    pub(super) fn resolve_cma(
        &mut self,
        id: u64,
        key: crate::region::RegionKey,
        write: bool,
    ) -> Result<()> {
        match self.request(&Msg::ShmCmaRegion {
            region: id,
            key,
            write,
        })? {
            Msg::ShmCmaAddr {
                addr,
                len,
                writable,
            } => {
                let standing = self.find_standing(id);
                self.cma_regions.insert(
                    id,
                    CmaRegion {
                        addr,
                        len,
                        writable,
                        standing,
                    },
                );
                Ok(())
            }
            m => Err(Error::Protocol(format!(
                "expected ShmCmaAddr, got frame type {}",
                m.kind()
            ))),
        }
    }

    /// Whether op `i`'s remote region is resolved for the `cma` path.
    pub(super) fn cma_ready(&self, xfer: &XferState, i: usize) -> bool {
        self.cma_regions.contains_key(&xfer.op(i).remote.id)
    }

    /// The copies of a leased batch whose ops include `cma` ones: those go here, in runs of one
    /// direction, as few system calls as the kernel takes; the rest through the mappings
    /// (`copy_runs`). `None` when no op of `batch` is `cma`.
    pub(super) fn copy_runs_cma(
        &self,
        xfer: &XferState,
        batch: &[usize],
        skip: &Skip,
    ) -> Option<(Vec<usize>, Option<Error>)> {
        if !batch.iter().any(|&i| xfer.path(i) == Path::Cma) {
            return None;
        }
        let (mut cma, mut rest) = (Vec::new(), Vec::new());
        for (j, &i) in batch.iter().enumerate() {
            if skip.get(j) {
                continue;
            }
            if xfer.path(i) == Path::Cma {
                cma.push(i);
            } else {
                rest.push(i);
            }
        }
        let (mut done, fatal) = self.copy_cma(xfer, &cma);
        if fatal.is_some() || rest.is_empty() {
            return Some((done, fatal));
        }
        let (more, fatal) = self.copy_runs(xfer, &rest, &Skip::default());
        done.extend(more);
        Some((done, fatal))
    }

    /// Copies the `cma` ops `ops` (leased by the target), consecutive ops of one direction in
    /// one `cross_memory_copy`. Returns the ops copied and the error that broke the
    /// connection, if one did.
    pub(super) fn copy_cma(&self, xfer: &XferState, ops: &[usize]) -> (Vec<usize>, Option<Error>) {
        let CmaGrant::Granted { pid } = self.cma else {
            let e = Error::Protocol("a cma op on a connection without direct copies".into());
            return (Vec::new(), Some(e));
        };
        let mut done = Vec::with_capacity(ops.len());
        let mut j = 0;
        while j < ops.len() {
            let kind = xfer.op(ops[j]).kind;
            let mut end = j + 1;
            while end < ops.len() && xfer.op(ops[end]).kind == kind {
                end += 1;
            }
            let run = &ops[j..end];
            j = end;
            if let Some(e) = xfer.halt() {
                for &i in run {
                    xfer.chunk_done(i, 0, Err(e.clone()));
                }
                continue;
            }
            if let Err(e) = self.copy_cma_run(xfer, run, kind, pid, &mut done) {
                return (done, Some(e));
            }
        }
        (done, None)
    }

    /// One run of same-direction `cma` ops: checks each against the region's address and
    /// rights (a failing op fails alone), leases the local regions, copies.
    fn copy_cma_run(
        &self,
        xfer: &XferState,
        run: &[usize],
        kind: OpKind,
        pid: u32,
        done: &mut Vec<usize>,
    ) -> Result<()> {
        let lease_kind = match kind {
            OpKind::Write => LeaseKind::Source,
            OpKind::Read => LeaseKind::Sink,
        };
        let mut leases = HashMap::new();
        let (mut local, mut remote, mut moving) = (Vec::new(), Vec::new(), Vec::new());
        for &i in run {
            let op = xfer.op(i);
            let checked = self
                .cma_regions
                .get(&op.remote.id)
                .ok_or(Error::NoSuchRegion {
                    region: op.remote.id,
                })
                .and_then(|r| {
                    if kind == OpKind::Write && !r.writable {
                        return Err(Error::ReadOnly {
                            region: op.remote.id,
                        });
                    }
                    crate::region::check_bounds(op.remote_offset, op.len, r.len)?;
                    Ok(r.addr + op.remote_offset)
                });
            let at = Arc::as_ptr(op.local) as usize;
            let lease = match leases.entry(at) {
                std::collections::hash_map::Entry::Occupied(o) => Ok(o.into_mut()),
                std::collections::hash_map::Entry::Vacant(v) => {
                    op.local.lease(lease_kind, self.wait).map(|l| v.insert(l))
                }
            };
            match (checked, lease) {
                (Ok(addr), Ok(l)) => {
                    local.push((l.ptr_at(op.local_offset)?, op.len as usize));
                    remote.push((addr, op.len as usize));
                    moving.push(i);
                }
                (Err(e), _) | (_, Err(e)) if !e.is_fatal_for_stream() => {
                    xfer.chunk_done(i, 0, Err(e));
                }
                (Err(e), _) | (_, Err(e)) => return Err(e),
            }
        }
        let dir = match kind {
            OpKind::Write => CmaDir::ToPeer,
            OpKind::Read => CmaDir::FromPeer,
        };
        // SAFETY: each local span lies in a region leased above (a source for a write, a sink
        // for a read, so nothing else writes it meanwhile), bounds-checked at submit; each
        // remote span lies in a region the peer leases (since BEGIN/ShmBegin, or standing),
        // checked above against its length and rights.
        match unsafe { copy_in_parts(pid, dir, &local, &remote) } {
            Ok(()) => done.extend(moving),
            Err(e) if rustix::io::Errno::from_io_error(&e) == Some(rustix::io::Errno::SRCH) => {
                return Err(Error::peer_lost(format!("pid {pid} is gone (ESRCH)")));
            }
            Err(e) => {
                let call = match dir {
                    CmaDir::ToPeer => "process_vm_writev",
                    CmaDir::FromPeer => "process_vm_readv",
                };
                let e = Error::os(call, e);
                for i in moving {
                    xfer.chunk_done(i, 0, Err(e.clone()));
                }
            }
        }
        Ok(())
    }
}

/// Bytes a thread of a split copy gets at least (`copy_in_parts`).
const PART_MIN_BYTES: usize = 2 << 20;
/// Most threads one copy is split over.
const MAX_PARTS: usize = 4;

/// How many threads copy `total` bytes in `n` spans: one per `PART_MIN_BYTES`, up to the
/// cores this process may use and `MAX_PARTS`. The kernel copies a call at one core's memcpy
/// speed, and a KV block list (16 MB and up) has bytes enough for several.
fn parts_for(total: usize, n: usize) -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |c| c.get()));
    (total / PART_MIN_BYTES)
        .min(cores)
        .min(MAX_PARTS)
        .min(n)
        .max(1)
}

/// `cross_memory_copy` of span pairs (`local[i]` and `remote[i]` of one length), split by bytes
/// over `parts_for` threads: this one and scoped others, each a call of its own.
///
/// # Safety
/// As `cross_memory_copy`'s, for every span.
unsafe fn copy_in_parts(
    pid: u32,
    dir: CmaDir,
    local: &[(*mut u8, usize)],
    remote: &[(u64, usize)],
) -> std::io::Result<()> {
    let total: usize = local.iter().map(|s| s.1).sum();
    let parts = parts_for(total, local.len());
    if parts == 1 {
        // SAFETY: the caller's contract.
        return unsafe { cross_memory_copy(pid, dir, local, remote) }.map(|_| ());
    }
    // Cut at span boundaries, each part about `total / parts` bytes.
    let mut cuts = vec![0];
    let mut acc = 0;
    for (i, s) in local.iter().enumerate() {
        acc += s.1;
        if acc * parts >= total * cuts.len() && cuts.len() < parts && i + 1 < local.len() {
            cuts.push(i + 1);
        }
    }
    cuts.push(local.len());
    std::thread::scope(|sc| {
        let others: Vec<_> = cuts[1..]
            .windows(2)
            .map(|w| {
                let (a, b) = (w[0], w[1]);
                // Addresses as integers: a raw pointer does not cross threads.
                let l: Vec<(usize, usize)> =
                    local[a..b].iter().map(|&(p, n)| (p as usize, n)).collect();
                let r = &remote[a..b];
                sc.spawn(move || {
                    let l: Vec<(*mut u8, usize)> =
                        l.iter().map(|&(p, n)| (p as *mut u8, n)).collect();
                    // SAFETY: a sub-list of the caller's spans, under its contract; the
                    // parts are disjoint, and the scope ends before the caller returns.
                    unsafe { cross_memory_copy(pid, dir, &l, r) }.map(|_| ())
                })
            })
            .collect();
        let (a, b) = (cuts[0], cuts[1]);
        // SAFETY: as above.
        let mine = unsafe { cross_memory_copy(pid, dir, &local[a..b], &remote[a..b]) };
        let mut r = mine.map(|_| ());
        for h in others {
            let theirs = h
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("a cma copy thread panicked")));
            r = r.and(theirs);
        }
        r
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_splits_by_bytes_only_when_each_part_gets_enough() {
        assert_eq!(parts_for(1 << 20, 1000), 1);
        assert_eq!(parts_for(16 << 20, 1), 1);
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        assert_eq!(parts_for(16 << 20, 1000), cores.min(MAX_PARTS));
    }

    #[test]
    fn split_copies_move_every_span_to_its_place() {
        // This process to itself: the kernel allows it, and both ends can be checked.
        let src: Vec<u8> = (0..(9 << 20)).map(|i: usize| (i % 251) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        let block = 64 << 10;
        let n = src.len() / block;
        // Block i goes to block n - 1 - i.
        let local: Vec<(*mut u8, usize)> = (0..n)
            .map(|i| (src[i * block..].as_ptr().cast_mut(), block))
            .collect();
        let remote: Vec<(u64, usize)> = (0..n)
            .map(|i| (dst[(n - 1 - i) * block..].as_mut_ptr() as u64, block))
            .collect();
        // SAFETY: every span lies in `src` (read) or `dst` (written, not touched meanwhile),
        // both alive for the call; the process may write its own memory.
        unsafe { copy_in_parts(std::process::id(), CmaDir::ToPeer, &local, &remote) }.unwrap();
        for i in 0..n {
            let d = n - 1 - i;
            assert!(
                dst[d * block..(d + 1) * block] == src[i * block..(i + 1) * block],
                "block {i}"
            );
        }
    }

    #[test]
    fn an_eperm_names_the_policy_behind_it() {
        let perm = std::io::Error::from(rustix::io::Errno::PERM);
        for (scope, says) in [
            (
                None,
                "no Yama: the peer runs as another user or is not dumpable",
            ),
            (Some(0), "Yama ptrace_scope 0"),
            (Some(1), "PR_SET_PTRACER grant does not cover this process"),
            (Some(2), "only a process with CAP_SYS_PTRACE may"),
            (Some(3), "Yama ptrace_scope 3: no process may"),
        ] {
            let why = kernel_refusal(&perm, 42, scope);
            assert!(why.contains("pid 42"), "{why}");
            assert!(why.contains("EPERM"), "{why}");
            assert!(why.contains(says), "{scope:?}: {why}");
        }
        let gone = std::io::Error::from(rustix::io::Errno::SRCH);
        assert!(kernel_refusal(&gone, 7, None).contains("ESRCH"));
        let nosys = std::io::Error::from(rustix::io::Errno::NOSYS);
        assert!(kernel_refusal(&nosys, 7, None).contains("CONFIG_CROSS_MEMORY_ATTACH"));
    }

    #[test]
    fn a_declining_target_says_how_to_turn_it_on() {
        let mut t = CmaTarget::default();
        match t.grant(false, 1) {
            Err(Error::Unavailable {
                path: Some(Path::Cma),
                why,
            }) => assert!(why.contains("GDX_SHM_CMA"), "{why}"),
            other => panic!("{other:?}"),
        }
        // Allowed: the probe holds the value it names, at the address it names.
        match t.grant(true, 0).unwrap() {
            Msg::ShmCmaProbe { addr, value } => {
                assert_eq!(
                    addr,
                    std::ptr::from_ref::<u128>(t.probe.as_deref().unwrap()) as u64
                );
                assert_eq!(**t.probe.as_ref().unwrap(), value);
            }
            m => panic!("frame type {}", m.kind()),
        }
    }
}
