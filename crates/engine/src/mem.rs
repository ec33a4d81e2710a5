//! Raw host memory: memfd-backed shared mappings (shareable with a same-host peer by passing the fd),
//! plain mappings of a received fd, and raw socket I/O straight into / out of such memory.
//!
//! Invariant: a [`Mapping`] owns its `ptr..ptr+len` mapping until it is dropped; nobody else unmaps it.
//! The socket helpers take raw pointers so that the kernel, not a Rust reference, writes the bytes:
//! no `&mut [u8]` is ever formed over memory a peer may also be touching.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::ptr::NonNull;

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

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
        Self::memfd_with(len, name, true)
    }

    /// `memfd`, pre-faulted or not: the shm control ring is not (most of its 32 MiB, the
    /// op tables and data areas of large requests, is never touched; its pages are faulted in
    /// as slots first use them).
    pub(crate) fn memfd_with(len: usize, name: &str, populate: bool) -> Result<Self> {
        if len == 0 {
            return Err(Error::InvalidArgument("region length must be > 0".into()));
        }
        let cname = std::ffi::CString::new(format!("gdx:{name}")).unwrap_or_default();
        let fd = rustix::fs::memfd_create(&cname, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .map_err(|e| Error::os("memfd_create", e.into()))?;
        rustix::fs::ftruncate(&fd, len as u64).map_err(|e| Error::os("ftruncate", e.into()))?;
        let mut m = Self::map_fd_with(fd.as_raw_fd(), len, true, populate)?;
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
        if let Err(e) = add_seals(fd.as_raw_fd(), SealFlags::FUTURE_WRITE) {
            log::warn!("read-only region not shared by fd: {e}");
            self.fd = None;
        }
    }

    /// Maps `len` bytes of `fd` shared, writable if `write`, pre-faulted (`MAP_POPULATE`).
    /// The returned mapping does not own `fd` (the mapping keeps the file alive by itself).
    pub(crate) fn map_fd(fd: RawFd, len: usize, write: bool) -> Result<Self> {
        Self::map_fd_with(fd, len, write, true)
    }

    /// `map_fd`, pre-faulted or not (see `memfd_with`).
    pub(crate) fn map_fd_with(fd: RawFd, len: usize, write: bool, populate: bool) -> Result<Self> {
        if len == 0 {
            return Err(Error::InvalidArgument("mapping length must be > 0".into()));
        }
        let prot = if write {
            ProtFlags::READ | ProtFlags::WRITE
        } else {
            ProtFlags::READ
        };
        // SAFETY: the caller's fd is open for this call; mmap only looks it up (EBADF if not).
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        // SAFETY: a fresh mapping at a kernel-chosen address; it aliases no Rust object.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                if populate {
                    MapFlags::SHARED | MapFlags::POPULATE
                } else {
                    MapFlags::SHARED
                },
                fd,
                0,
            )
        }
        .map_err(|e| Error::os("mmap", e.into()))?;
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
        let rc = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
        if let Err(e) = rc {
            log::warn!(
                "munmap of {} bytes failed: {}",
                self.len,
                io::Error::from(e)
            );
        }
    }
}

/// The seals every shared memfd carries.
pub(crate) const SIZE_SEALS: SealFlags = SealFlags::SHRINK.union(SealFlags::GROW);

fn add_seals(fd: RawFd, seals: SealFlags) -> Result<()> {
    // SAFETY: the caller's fd is open for this call; fcntl only looks it up (EBADF if not).
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    rustix::fs::fcntl_add_seals(fd, seals).map_err(|e| Error::os("fcntl(F_ADD_SEALS)", e.into()))
}

/// Checks a memfd received from a peer before it is mapped: it must be sealed against
/// shrinking and growing (so the peer cannot make our mapping SIGBUS by truncating it later),
/// hold at least `want_len` bytes and, when `read_only` is asked, refuse writable mappings.
/// Returns its size.
pub(crate) fn verify_memfd(fd: RawFd, want_len: Option<usize>, read_only: bool) -> Result<usize> {
    let bad = |why: String| Error::Protocol(format!("received memfd refused: {why}"));
    // SAFETY: the caller's fd is open for this call; fcntl/fstat only look it up (EBADF if not).
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    let seals = rustix::fs::fcntl_get_seals(fd)
        .map_err(|e| bad(format!("not a sealable memfd ({})", io::Error::from(e))))?;
    if !seals.contains(SIZE_SEALS) {
        return Err(bad(format!(
            "not sealed against shrink and grow (seals {:#x})",
            seals.bits()
        )));
    }
    if read_only && !seals.intersects(SealFlags::FUTURE_WRITE | SealFlags::WRITE) {
        return Err(bad("a read-only mapping without a write seal".into()));
    }
    let st = rustix::fs::fstat(fd).map_err(|e| Error::os("fstat", e.into()))?;
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
    // SAFETY: the caller's fd is open for this call; getsockopt only looks it up (EBADF if not).
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    let cred = rustix::net::sockopt::socket_peercred(fd)
        .map_err(|e| Error::os("getsockopt(SO_PEERCRED)", e.into()))?;
    Ok(cred.uid.as_raw())
}

/// The pid of the process at the other end of unix socket `fd` (`SO_PEERCRED`, as of its
/// connect), in this PID namespace: 0 when that process is not visible from it.
pub(crate) fn peer_pid(fd: RawFd) -> Result<u32> {
    // SAFETY: the caller's fd is open for this call; getsockopt only looks it up (EBADF if not).
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    let cred = rustix::net::sockopt::socket_peercred(fd)
        .map_err(|e| Error::os("getsockopt(SO_PEERCRED)", e.into()))?;
    Ok(cred.pid.as_raw_nonzero().get() as u32)
}

/// This process's effective uid.
pub(crate) fn my_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Socket I/O straight into / out of raw spans (rustix takes Rust slices, which must not be
/// formed over memory a peer may touch), in gdx-sys with the other calls rustix lacks.
pub(crate) use gdx_sys::os::{recv_exact_raw, recv_exact_raw_vectored, send_all_raw};

/// Fills `buf` from the kernel's random source (`getrandom(2)`).
pub(crate) fn random_bytes(buf: &mut [u8]) -> Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match rustix::rand::getrandom(&mut buf[done..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(Error::os("getrandom", e.into())),
        }
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

        let unsealed = rustix::fs::memfd_create("unsealed", MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&unsealed, 4096).unwrap();
        let e = verify_memfd(unsealed.as_raw_fd(), Some(4096), false)
            .expect_err("an unsealed memfd must be refused");
        assert!(
            e.to_string().contains("sealed") || e.to_string().contains("sealable"),
            "{e}"
        );
    }
}
