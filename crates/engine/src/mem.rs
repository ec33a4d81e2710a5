//! Raw host memory: memfd-backed shared mappings (shareable with a same-host peer by passing the fd),
//! plain mappings of a received fd, and raw socket I/O straight into / out of such memory.
//!
//! Invariant: a [`Mapping`] owns its `ptr..ptr+len` mapping until it is dropped; nobody else unmaps it.
//! The socket helpers take raw pointers so that the kernel, not a Rust reference, writes the bytes:
//! no `&mut [u8]` is ever formed over memory a peer may also be touching.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;

use crate::error::{Error, Result};

/// An `mmap`ed span, unmapped on drop; optionally backed by a memfd that can be shared.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    fd: Option<OwnedFd>,
}

// SAFETY: the mapping is plain memory owned by this value; access through the raw pointer is
// coordinated by the region lease protocol (region.rs), not by this type.
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` only hands out the pointer and the fd.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Allocates `len` bytes of zeroed memory in a fresh memfd, mapped shared and pre-faulted.
    pub(crate) fn memfd(len: usize, name: &str) -> Result<Self> {
        if len == 0 {
            return Err(Error::InvalidArgument("region length must be > 0".into()));
        }
        let cname = std::ffi::CString::new(format!("gdx:{name}")).unwrap_or_default();
        // SAFETY: cname is a valid NUL-terminated string; flags are valid memfd flags.
        let raw = unsafe {
            libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if raw < 0 {
            return Err(Error::os("memfd_create", io::Error::last_os_error()));
        }
        // SAFETY: raw is a freshly created fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: fd is a valid memfd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(Error::os("ftruncate", io::Error::last_os_error()));
        }
        let mut m = Self::map_fd(fd.as_raw_fd(), len, true)?;
        // Whoever gets this fd (a same-host peer) can never shrink it under our mapping (the
        // SIGBUS attack) nor grow it.
        add_seals(fd.as_raw_fd(), SIZE_SEALS)?;
        m.fd = Some(fd);
        Ok(m)
    }

    /// Forbids every future writable mapping and `write(2)` of the memfd, by anyone, even
    /// through a `/proc/self/fd` reopen; this mapping (made before) stays writable. Used for
    /// regions peers may only read. Without kernel support (Linux < 5.1) the fd is dropped,
    /// so the region is not shared by fd at all (peers use the staged path) rather than
    /// shared writable.
    pub(crate) fn seal_future_write(&mut self) {
        let Some(fd) = &self.fd else { return };
        if let Err(e) = add_seals(fd.as_raw_fd(), libc::F_SEAL_FUTURE_WRITE) {
            log::warn!("read-only region not shared by fd: {e}");
            self.fd = None;
        }
    }

    /// Maps `len` bytes of `fd` shared, writable if `write`, pre-faulted (`MAP_POPULATE`).
    /// The returned mapping does not own `fd` (the mapping keeps the file alive by itself).
    pub(crate) fn map_fd(fd: RawFd, len: usize, write: bool) -> Result<Self> {
        if len == 0 {
            return Err(Error::InvalidArgument("mapping length must be > 0".into()));
        }
        let prot = if write {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh mapping at a kernel-chosen address; it aliases no Rust object.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::os("mmap", io::Error::last_os_error()));
        }
        let ptr = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| Error::os("mmap", io::Error::other("null")))?;
        Ok(Mapping { ptr, len, fd: None })
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn fd(&self) -> Option<RawFd> {
        self.fd.as_ref().map(|f| f.as_raw_fd())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len describe a mapping created by `map_fd` and owned solely by self.
        let rc = unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        if rc != 0 {
            log::warn!(
                "munmap of {} bytes failed: {}",
                self.len,
                io::Error::last_os_error()
            );
        }
    }
}

/// The seals every shared memfd carries.
pub(crate) const SIZE_SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;

fn add_seals(fd: RawFd, seals: libc::c_int) -> Result<()> {
    // SAFETY: fcntl on a valid fd with an integer argument.
    if unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, seals) } != 0 {
        return Err(Error::os("fcntl(F_ADD_SEALS)", io::Error::last_os_error()));
    }
    Ok(())
}

/// Checks a memfd received from a peer before it is mapped: it must be sealed against
/// shrinking and growing (so the peer cannot make our mapping SIGBUS by truncating it later),
/// hold at least `want_len` bytes and, when `read_only` is asked, refuse writable mappings.
/// Returns its size.
pub(crate) fn verify_memfd(fd: RawFd, want_len: Option<usize>, read_only: bool) -> Result<usize> {
    let bad = |why: String| Error::Protocol(format!("received memfd refused: {why}"));
    // SAFETY: fcntl F_GET_SEALS on a valid fd.
    let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
    if seals < 0 {
        return Err(bad(format!(
            "not a sealable memfd ({})",
            io::Error::last_os_error()
        )));
    }
    if seals & SIZE_SEALS != SIZE_SEALS {
        return Err(bad(format!(
            "not sealed against shrink and grow (seals {seals:#x})"
        )));
    }
    if read_only && seals & (libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_WRITE) == 0 {
        return Err(bad("a read-only mapping without a write seal".into()));
    }
    // SAFETY: fstat on a valid fd into a zeroed stat buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is valid; st is a valid out-pointer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(Error::os("fstat", io::Error::last_os_error()));
    }
    let size = usize::try_from(st.st_size).map_err(|_| bad("negative size".into()))?;
    if let Some(w) = want_len {
        if size < w {
            return Err(bad(format!("{size} bytes, {w} announced")));
        }
    }
    Ok(size)
}

/// The uid of the process at the other end of a unix socket (`SO_PEERCRED`).
pub(crate) fn peer_uid(fd: RawFd) -> Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, a live local.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(Error::os(
            "getsockopt(SO_PEERCRED)",
            io::Error::last_os_error(),
        ));
    }
    Ok(cred.uid)
}

/// This process's effective uid.
pub(crate) fn my_uid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// Receives exactly `len` bytes from socket `fd` into `ptr`. EOF, reset and `SO_RCVTIMEO` expiry are
/// returned as `io::Error`s.
///
/// # Safety
/// - `ptr..ptr+len` must be valid for writes for the whole call and not be freed or unmapped during it.
pub(crate) unsafe fn recv_exact_raw(fd: RawFd, mut ptr: *mut u8, mut len: usize) -> io::Result<()> {
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

/// Sends `parts` (raw spans) completely on socket `fd`, using `sendmsg` with an iovec so that a
/// small header and a large payload go out in one call.
///
/// # Safety
/// - every `(ptr, len)` in `parts` must be valid for reads for the whole call.
pub(crate) unsafe fn send_all_raw(fd: RawFd, parts: &[(*const u8, usize)]) -> io::Result<()> {
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

/// Fills `buf` from the kernel's random source (`getrandom(2)`).
pub(crate) fn random_bytes(buf: &mut [u8]) -> Result<()> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: writes at most buf.len()-done bytes into buf[done..].
        let n = unsafe { libc::getrandom(buf[done..].as_mut_ptr().cast(), buf.len() - done, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(Error::os("getrandom", e));
        }
        done += n as usize;
    }
    Ok(())
}

/// A fresh random 128-bit value.
pub(crate) fn random_u128() -> Result<u128> {
    let mut b = [0u8; 16];
    random_bytes(&mut b)?;
    Ok(u128::from_le_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The initiator's side of #15 item 3: a memfd a peer passes is mapped only when sealed
    /// against shrink/grow, as long as announced and (for read-only use) write-sealed.
    #[test]
    fn received_memfds_must_be_sealed() {
        let m = Mapping::memfd(4096, "t").unwrap_or_else(|e| panic!("{e}"));
        let fd = m.fd().unwrap_or_else(|| panic!("memfd"));
        assert_eq!(verify_memfd(fd, Some(4096), false).ok(), Some(4096));
        assert!(
            verify_memfd(fd, Some(8192), false).is_err(),
            "shorter than announced"
        );
        assert!(
            verify_memfd(fd, Some(4096), true).is_err(),
            "read-only without write seal"
        );
        let mut ro = Mapping::memfd(4096, "ro").unwrap_or_else(|e| panic!("{e}"));
        ro.seal_future_write();
        let rofd = ro
            .fd()
            .unwrap_or_else(|| panic!("kernel without F_SEAL_FUTURE_WRITE"));
        assert!(verify_memfd(rofd, Some(4096), true).is_ok());
        // The owner still writes through the mapping made before the seal.
        // SAFETY: ro owns 4096 mapped bytes.
        unsafe { ro.ptr().write(7) };

        let name = std::ffi::CString::new("unsealed").unwrap_or_default();
        // SAFETY: valid name and flags.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: a fresh fd nobody else owns.
        let unsealed = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: plain syscall on our fd.
        assert_eq!(unsafe { libc::ftruncate(unsealed.as_raw_fd(), 4096) }, 0);
        let e = verify_memfd(unsealed.as_raw_fd(), Some(4096), false)
            .expect_err("an unsealed memfd must be refused");
        assert!(
            e.to_string().contains("sealed") || e.to_string().contains("sealable"),
            "{e}"
        );
    }
}
