//! The few POSIX calls that rustix (the workspace's one syscall crate) does not offer, each
//! behind a small wrapper so that no crate above this one needs `libc` or `unsafe` for them:
//!
//! - [`process_cpu_time`]: `getrusage(2)` (rustix has no `getrusage`).
//! - [`SignalSet`]: `pthread_sigmask(3)` and `sigwait(3)`, which rustix leaves to libc
//!   (`rustix::not_implemented::libc_internals`).
//! - [`recv_exact_raw`] and [`send_all_raw`]: socket I/O straight into / out of raw spans of
//!   memory a peer may also be touching (shared mappings). rustix takes `&mut [u8]` /
//!   `IoSlice` buffers, i.e. Rust references, which must never be formed over such memory;
//!   these take raw pointers so that only the kernel reads or writes the bytes.
//! - [`page_residency`]: which pages of a file are in the page cache, `mincore(2)` on a
//!   read-only mapping (rustix has `mmap` but not `mincore`, and leaves `cachestat` out).
//! - [`cross_memory_copy`]: `process_vm_readv(2)`/`process_vm_writev(2)`, one kernel copy
//!   between this process's memory and another's (rustix has neither).

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::RawFd;
use std::time::Duration;

/// User + system CPU time of the whole process (all threads) so far (`getrusage(RUSAGE_SELF)`).
///
/// # Errors
/// The OS error of `getrusage`.
pub fn process_cpu_time() -> io::Result<Duration> {
    let mut u = MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: RUSAGE_SELF with a valid out-pointer to a live local, which getrusage fills.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, u.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: getrusage returned 0, so it filled the whole struct.
    let u = unsafe { u.assume_init() };
    let t = |tv: libc::timeval| {
        Duration::from_secs(tv.tv_sec.max(0) as u64)
            + Duration::from_micros(tv.tv_usec.max(0) as u64)
    };
    Ok(t(u.ru_utime) + t(u.ru_stime))
}

/// A set of signals to block and then wait for synchronously on a thread of one's own.
#[derive(Clone, Copy)]
pub struct SignalSet(libc::sigset_t);

impl std::fmt::Debug for SignalSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SignalSet")
    }
}

impl SignalSet {
    /// SIGINT, SIGTERM and SIGHUP: the signals that ask a command to stop.
    pub fn termination() -> SignalSet {
        let mut set = MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: sigemptyset initialises the set behind a valid pointer (it cannot fail then).
        unsafe { libc::sigemptyset(set.as_mut_ptr()) };
        // SAFETY: initialised just above.
        let mut set = unsafe { set.assume_init() };
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: a valid set and a valid signal number (so it cannot fail).
            unsafe { libc::sigaddset(&mut set, s) };
        }
        SignalSet(set)
    }

    /// Blocks these signals in the calling thread (`pthread_sigmask(SIG_BLOCK)`); threads it
    /// starts afterwards inherit the block.
    ///
    /// # Errors
    /// The error `pthread_sigmask` returns.
    pub fn block_in_this_thread(&self) -> io::Result<()> {
        // SAFETY: a valid set; a null old-set pointer is allowed.
        let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &self.0, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(())
    }

    /// Waits until one of these (blocked) signals is pending and returns its number (`sigwait`).
    ///
    /// # Errors
    /// The error `sigwait` returns (an invalid set).
    pub fn wait(&self) -> io::Result<i32> {
        let mut sig = 0;
        // SAFETY: a valid set and a valid out-pointer to a live local.
        let rc = unsafe { libc::sigwait(&self.0, &mut sig) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(sig)
    }
}

/// Receives exactly `len` bytes from socket `fd` into `ptr`. EOF, reset and `SO_RCVTIMEO` expiry are
/// returned as `io::Error`s.
///
/// # Safety
/// - `ptr..ptr+len` must be valid for writes for the whole call and not be freed or unmapped during it.
pub unsafe fn recv_exact_raw(fd: RawFd, mut ptr: *mut u8, mut len: usize) -> io::Result<()> {
    while len > 0 {
        // SAFETY: the caller guarantees ptr..ptr+len is writable.
        let n = unsafe { libc::recv(fd, ptr.cast(), len, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed by peer",
            ));
        }
        let n = n as usize;
        // SAFETY: n <= len, so the result stays within the caller's span.
        ptr = unsafe { ptr.add(n) };
        len -= n;
    }
    Ok(())
}

/// Receives exactly the bytes of `parts` (raw spans, filled in order) from socket `fd`, with
/// `recvmsg` over up to [`CMA_MAX_IOV`] spans a call: a batch of small payloads lands in its
/// places with a few system calls instead of one each. EOF, reset and `SO_RCVTIMEO` expiry are
/// returned as `io::Error`s.
///
/// # Safety
/// - every `(ptr, len)` in `parts` must be valid for writes for the whole call and not be freed
///   or unmapped during it.
pub unsafe fn recv_exact_raw_vectored(fd: RawFd, parts: &[(*mut u8, usize)]) -> io::Result<()> {
    let mut iov: Vec<libc::iovec> = parts
        .iter()
        .filter(|p| p.1 > 0)
        .map(|&(p, l)| libc::iovec {
            iov_base: p.cast(),
            iov_len: l,
        })
        .collect();
    let mut start = 0;
    while start < iov.len() {
        // SAFETY: zeroed msghdr is a valid "no name, no control" header.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov[start..].as_mut_ptr();
        msg.msg_iovlen = (iov.len() - start).min(CMA_MAX_IOV) as _;
        // SAFETY: the iovecs point at spans the caller guarantees writable.
        let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_WAITALL) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed by peer",
            ));
        }
        let mut n = n as usize;
        while n > 0 && start < iov.len() {
            if n >= iov[start].iov_len {
                n -= iov[start].iov_len;
                start += 1;
            } else {
                // SAFETY: advancing within the span by n < iov_len.
                iov[start].iov_base = unsafe { iov[start].iov_base.cast::<u8>().add(n) }.cast();
                iov[start].iov_len -= n;
                n = 0;
            }
        }
    }
    Ok(())
}

/// Sends `parts` (raw spans) completely on socket `fd`, using `sendmsg` with an iovec so that a
/// small header and a large payload go out in one call.
///
/// # Safety
/// - every `(ptr, len)` in `parts` must be valid for reads for the whole call.
pub unsafe fn send_all_raw(fd: RawFd, parts: &[(*const u8, usize)]) -> io::Result<()> {
    let mut iov: Vec<libc::iovec> = parts
        .iter()
        .filter(|p| p.1 > 0)
        .map(|&(p, l)| libc::iovec {
            iov_base: p as *mut libc::c_void,
            iov_len: l,
        })
        .collect();
    let mut start = 0;
    while start < iov.len() {
        // SAFETY: zeroed msghdr is a valid "no name, no control" header.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov[start..].as_mut_ptr();
        msg.msg_iovlen = (iov.len() - start) as _;
        // SAFETY: the iovecs point at spans the caller guarantees readable.
        let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        let mut n = n as usize;
        while n > 0 && start < iov.len() {
            if n >= iov[start].iov_len {
                n -= iov[start].iov_len;
                start += 1;
            } else {
                // SAFETY: advancing within the span by n < iov_len.
                iov[start].iov_base = unsafe { iov[start].iov_base.cast::<u8>().add(n) }.cast();
                iov[start].iov_len -= n;
                n = 0;
            }
        }
    }
    Ok(())
}

/// Most iovecs one `process_vm_readv`/`process_vm_writev` call takes on each side (the
/// kernel's `UIO_MAXIOV`, which `IOV_MAX` reports on Linux).
pub const CMA_MAX_IOV: usize = 1024;

/// Which way a [`cross_memory_copy`] moves the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmaDir {
    /// From this process into the other (`process_vm_writev`).
    ToPeer,
    /// From the other process into this one (`process_vm_readv`).
    FromPeer,
}

/// A cursor over a list of spans: the entry it is in and how far into it.
struct SpanCursor {
    entry: usize,
    into: usize,
}

impl SpanCursor {
    /// Up to `CMA_MAX_IOV` iovecs from the cursor on.
    fn window(&self, spans: &[(usize, usize)]) -> Vec<libc::iovec> {
        spans[self.entry..]
            .iter()
            .enumerate()
            .filter(|(_, s)| s.1 > 0)
            .take(CMA_MAX_IOV)
            .map(|(k, &(base, len))| {
                let skip = if k == 0 { self.into } else { 0 };
                libc::iovec {
                    iov_base: (base + skip) as *mut libc::c_void,
                    iov_len: len - skip,
                }
            })
            .collect()
    }

    /// Moves the cursor `n` bytes on.
    fn advance(&mut self, spans: &[(usize, usize)], mut n: usize) {
        while n > 0 && self.entry < spans.len() {
            let left = spans[self.entry].1 - self.into;
            if n < left {
                self.into += n;
                return;
            }
            n -= left;
            self.entry += 1;
            self.into = 0;
        }
        while self.entry < spans.len() && spans[self.entry].1 == 0 {
            self.entry += 1;
        }
    }
}

/// Copies between spans of this process (`local`) and spans of process `pid` (`remote`, its
/// virtual addresses) with one kernel copy: the bytes of `local`, in order, go to the bytes of
/// `remote`, in order (or the other way for [`CmaDir::FromPeer`]), up to [`CMA_MAX_IOV`] spans
/// a side per system call, resuming after a partial copy. Returns the system calls made.
///
/// The kernel checks that this process may access `pid` as `ptrace` would
/// (`PTRACE_MODE_ATTACH_REALCREDS`: same user and the Yama policy, or `CAP_SYS_PTRACE`); when
/// it may not, the call fails with `EPERM` before any byte moves.
///
/// # Errors
/// `InvalidInput` when the two sides' totals differ; the OS error of the call (`EPERM`,
/// `ESRCH` for a process that is gone, `EFAULT` for a remote span not mapped there, `ENOSYS`
/// for a kernel without cross-memory attach). Bytes copied before a failing call stay copied.
///
/// # Safety
/// - every local span must be valid for reads ([`CmaDir::ToPeer`]) or writes
///   ([`CmaDir::FromPeer`]) for the whole call, and not be touched by anything else meanwhile
///   for a read into it;
/// - the caller must hold the other process's consent to write its remote spans (the kernel
///   checks permission, not intent).
pub unsafe fn cross_memory_copy(
    pid: u32,
    dir: CmaDir,
    local: &[(*mut u8, usize)],
    remote: &[(u64, usize)],
) -> io::Result<usize> {
    let local: Vec<(usize, usize)> = local.iter().map(|&(p, l)| (p as usize, l)).collect();
    let remote: Vec<(usize, usize)> = remote.iter().map(|&(a, l)| (a as usize, l)).collect();
    let total: usize = local.iter().map(|s| s.1).sum();
    if total != remote.iter().map(|s| s.1).sum::<usize>() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "cross-memory copy: the local and remote spans hold different byte counts",
        ));
    }
    let (mut l, mut r) = (
        SpanCursor { entry: 0, into: 0 },
        SpanCursor { entry: 0, into: 0 },
    );
    l.advance(&local, 0);
    r.advance(&remote, 0);
    let (mut moved, mut calls) = (0usize, 0usize);
    while moved < total {
        let (lw, rw) = (l.window(&local), r.window(&remote));
        calls += 1;
        // SAFETY: the local iovecs lie within the caller's spans (valid for the call, by the
        // contract); the remote ones are addresses in the other process, which the kernel
        // checks (EFAULT) and this process never dereferences.
        let n = unsafe {
            match dir {
                CmaDir::ToPeer => libc::process_vm_writev(
                    pid as libc::pid_t,
                    lw.as_ptr(),
                    lw.len() as libc::c_ulong,
                    rw.as_ptr(),
                    rw.len() as libc::c_ulong,
                    0,
                ),
                CmaDir::FromPeer => libc::process_vm_readv(
                    pid as libc::pid_t,
                    lw.as_ptr(),
                    lw.len() as libc::c_ulong,
                    rw.as_ptr(),
                    rw.len() as libc::c_ulong,
                    0,
                ),
            }
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            // Nothing moved and no error: a remote span the kernel could not reach.
            return Err(io::Error::from_raw_os_error(libc::EFAULT));
        }
        let n = n as usize;
        l.advance(&local, n);
        r.advance(&remote, n);
        moved += n;
    }
    Ok(calls)
}

/// The page size (`sysconf(_SC_PAGESIZE)`), 4096 where the call fails.
pub fn page_size() -> u64 {
    // SAFETY: sysconf reads a constant of the running system; no pointers.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

/// Bytes mapped at once by [`page_residency`]: 1 GiB windows keep the address space it takes
/// small whatever the file's size.
const RESIDENCY_WINDOW: u64 = 1 << 30;

/// Which pages of `len` bytes of the open file `fd` at `offset` are in the page cache: one
/// `bool` per page of [`page_size`] bytes, the first for the page that holds `offset`. Asked of
/// the kernel with `mincore(2)` on a read-only shared mapping of the range (mapped 1 GiB at a
/// time and unmapped before returning); no byte of the file is touched, so nothing is read in.
///
/// # Errors
/// The OS error of `mmap` (e.g. a file that cannot be mapped) or `mincore`.
pub fn page_residency(
    fd: std::os::fd::BorrowedFd<'_>,
    offset: u64,
    len: u64,
) -> io::Result<Vec<bool>> {
    use std::os::fd::AsRawFd;
    let page = page_size();
    let start = offset - offset % page;
    let end = offset
        .checked_add(len)
        .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mut out = Vec::new();
    if len == 0 {
        return Ok(out);
    }
    let mut at = start;
    while at < end {
        let wlen = RESIDENCY_WINDOW.min(end - at);
        let map_len =
            usize::try_from(wlen).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let file_off =
            libc::off_t::try_from(at).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: a fresh read-only shared mapping chosen by the kernel (no fixed address, so
        // nothing of ours is replaced); its memory is never read here, only passed to mincore,
        // and it is unmapped below on every path.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                file_off,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let pages = map_len.div_ceil(page as usize);
        let mut vec = vec![0u8; pages];
        // SAFETY: addr..addr + map_len is the mapping made just above, and vec has one byte
        // per page of it, as mincore requires.
        let rc = unsafe { libc::mincore(addr, map_len, vec.as_mut_ptr()) };
        let mincore_err = (rc != 0).then(io::Error::last_os_error);
        // SAFETY: the mapping made above, of that length, unmapped once; nothing refers to it.
        unsafe { libc::munmap(addr, map_len) };
        if let Some(e) = mincore_err {
            return Err(e);
        }
        out.extend(vec.iter().map(|b| b & 1 == 1));
        at += wlen;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn cpu_time_grows_with_work() {
        let a = process_cpu_time().unwrap();
        let mut x = 0u64;
        let until = std::time::Instant::now() + Duration::from_millis(30);
        while std::time::Instant::now() < until {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        std::hint::black_box(x);
        let b = process_cpu_time().unwrap();
        assert!(b > a, "{a:?} then {b:?}");
    }

    #[test]
    fn raw_spans_cross_a_socket_intact() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let head = [1u8, 2, 3];
        let body = gdx_base::pattern::pattern(100_000, 251);
        let sender = std::thread::spawn(move || {
            // SAFETY: both spans are live locals for the whole call.
            unsafe {
                send_all_raw(
                    a.as_raw_fd(),
                    &[(head.as_ptr(), head.len()), (body.as_ptr(), body.len())],
                )
            }
            .unwrap();
            body
        });
        let mut got = vec![0u8; 3 + 100_000];
        // SAFETY: got is a live buffer of exactly that length.
        unsafe { recv_exact_raw(b.as_raw_fd(), got.as_mut_ptr(), got.len()) }.unwrap();
        let body = sender.join().unwrap();
        assert_eq!(&got[..3], &[1, 2, 3]);
        assert_eq!(&got[3..], &body[..]);
        drop(b);
        let mut more = [0u8; 1];
        // SAFETY: a live one-byte buffer.
        let e = unsafe { recv_exact_raw(-1, more.as_mut_ptr(), 1) }.unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF));
    }

    #[test]
    fn a_blocked_signal_is_waited_for() {
        let set = SignalSet::termination();
        set.block_in_this_thread().unwrap();
        // SAFETY: raising a signal this thread blocks only makes it pending for this thread.
        let rc = unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGHUP) };
        assert_eq!(rc, 0);
        assert_eq!(set.wait().unwrap(), libc::SIGHUP);
    }

    #[test]
    fn residency_covers_every_page_and_sees_what_was_just_written() {
        let dir = std::env::temp_dir().join(format!("gdx-residency-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("f");
        let page = page_size() as usize;
        std::fs::write(&p, vec![7u8; 3 * page + 10]).unwrap();
        let f = std::fs::File::open(&p).unwrap();
        use std::os::fd::AsFd;
        // Just written, so every page is in the page cache (dirty or clean).
        let r = page_residency(f.as_fd(), 0, 3 * page as u64 + 10).unwrap();
        assert_eq!(r, vec![true; 4]);
        let r = page_residency(f.as_fd(), page as u64 + 1, page as u64).unwrap();
        assert_eq!(r.len(), 2);
        assert!(page_residency(f.as_fd(), 5, 0).unwrap().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
    #[test]
    fn cross_memory_copy_moves_uneven_spans_in_order_over_many_calls() {
        // 3-byte local spans against 5-byte remote spans, 3,000 of one and 1,800 of the other:
        // every window of 1,024 iovecs ends mid-span on one side.
        let src = gdx_base::pattern::pattern(9_000, 7);
        let mut dst = vec![0u8; 9_000 + 64];
        let local: Vec<(*mut u8, usize)> = src
            .chunks(3)
            .map(|c| (c.as_ptr().cast_mut(), c.len()))
            .collect();
        let base = dst.as_mut_ptr() as u64 + 32;
        let remote: Vec<(u64, usize)> = (0..1_800).map(|k| (base + 5 * k, 5)).collect();
        let pid = std::process::id();
        // SAFETY: src is read, dst[32..9032] written, both live locals; this process consents.
        let calls = unsafe { cross_memory_copy(pid, CmaDir::ToPeer, &local, &remote) }.unwrap();
        assert!(calls >= 3, "{calls} calls for 3,000 local spans");
        assert_eq!(&dst[32..9_032], &src[..]);
        assert!(dst[..32].iter().chain(&dst[9_032..]).all(|&b| b == 0));
        // And back, into a fresh buffer.
        let mut back = vec![0u8; 9_000];
        let into: Vec<(*mut u8, usize)> = back
            .chunks_mut(4_500)
            .map(|c| (c.as_mut_ptr(), c.len()))
            .collect();
        // SAFETY: back is a live local written only by this call.
        unsafe { cross_memory_copy(pid, CmaDir::FromPeer, &into, &remote) }.unwrap();
        assert_eq!(back, src);
        // Mismatched totals are refused before any call.
        // SAFETY: nothing is copied.
        let e = unsafe { cross_memory_copy(pid, CmaDir::ToPeer, &local[..1], &remote[..1]) }
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn cross_memory_copy_to_an_unmapped_address_fails_by_name() {
        let src = [1u8; 8];
        // SAFETY: src is read; the remote address is page 0, never mapped.
        let e = unsafe {
            cross_memory_copy(
                std::process::id(),
                CmaDir::ToPeer,
                &[(src.as_ptr().cast_mut(), 8)],
                &[(16, 8)],
            )
        }
        .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EFAULT), "{e}");
    }

    #[test]
    fn a_vectored_receive_fills_every_span_in_order() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let body = gdx_base::pattern::pattern(50_000, 9);
        let sent = body.clone();
        let sender = std::thread::spawn(move || {
            // SAFETY: a live span for the whole call.
            unsafe { send_all_raw(a.as_raw_fd(), &[(sent.as_ptr(), sent.len())]) }.unwrap();
        });
        // 2,000 spans of 25 bytes: more than one recvmsg's worth of iovecs.
        let mut got = vec![0u8; 50_000 + 2_000];
        let parts: Vec<(*mut u8, usize)> =
            got.chunks_mut(26).map(|c| (c.as_mut_ptr(), 25)).collect();
        // SAFETY: every span is 25 bytes inside `got`, a live local.
        unsafe { recv_exact_raw_vectored(b.as_raw_fd(), &parts) }.unwrap();
        sender.join().unwrap();
        for (k, c) in got.chunks(26).enumerate() {
            assert_eq!(&c[..25], &body[k * 25..(k + 1) * 25], "span {k}");
            assert_eq!(c[25], 0, "the gap after span {k}");
        }
    }
}
