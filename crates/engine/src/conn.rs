//! A framed connection over a TCP or unix stream socket.
//!
//! Headers and bodies are read through a small fixed buffer (64 KiB, allocated once per connection);
//! payloads bypass it and are received straight into registered memory. File descriptors passed with
//! `SCM_RIGHTS` (unix sockets) are collected on every receive and handed out in order.
//! Every I/O error, EOF and receive timeout becomes [`Error::PeerLost`].

use std::collections::VecDeque;
use std::io;
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::mem::{recv_exact_raw, recv_exact_raw_vectored, send_all_raw};
use crate::wire::{self, Msg, HEADER_LEN};

const BUF: usize = 64 << 10;
const MAX_FDS: usize = 4;

/// The socket under a [`Conn`].
#[derive(Debug)]
pub(crate) enum Sock {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Sock {
    fn fd(&self) -> RawFd {
        match self {
            Sock::Tcp(s) => s.as_raw_fd(),
            Sock::Unix(s) => s.as_raw_fd(),
        }
    }
}

impl AsFd for Sock {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Sock::Tcp(s) => s.as_fd(),
            Sock::Unix(s) => s.as_fd(),
        }
    }
}

/// A framed, buffered connection.
#[derive(Debug)]
pub(crate) struct Conn {
    sock: Sock,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    fds: VecDeque<OwnedFd>,
    what: &'static str,
    /// Whole-handshake deadline: every receive before it is bounded by what is left of it.
    deadline: Option<(Instant, Duration)>,
    /// The bound the deadline enforces, for the error (`handshake_timeout`,
    /// `first_frame_timeout`).
    deadline_name: &'static str,
    /// Largest body accepted (smaller than `MAX_BODY` during a handshake).
    max_body: u32,
    /// How long a server-side connection may wait for the first byte of a frame.
    idle_limit: Option<Duration>,
}

impl Conn {
    pub(crate) fn new(sock: Sock, what: &'static str) -> Self {
        if let Sock::Tcp(s) = &sock {
            let _ = s.set_nodelay(true);
        }
        Conn {
            sock,
            buf: vec![0u8; BUF].into_boxed_slice(),
            start: 0,
            end: 0,
            fds: VecDeque::new(),
            what,
            deadline: None,
            deadline_name: "handshake_timeout",
            max_body: wire::MAX_BODY,
            idle_limit: None,
        }
    }

    /// Bounds the whole exchange until [`Conn::end_handshake`]: receives fail once `deadline`
    /// passed however the bytes trickle in, and bodies are limited to `max_body`.
    /// `limit` is the configured `handshake_timeout` (for the error), `until` when it ends.
    pub(crate) fn start_handshake(&mut self, until: Instant, limit: Duration, max_body: u32) {
        self.deadline = Some((until, limit));
        self.deadline_name = "handshake_timeout";
        self.max_body = max_body;
    }

    /// Server side, before the first frame: receives fail once `limit` passed (or the
    /// handshake deadline, if sooner). [`Conn::start_handshake`] afterwards restores the
    /// whole-handshake deadline.
    pub(crate) fn first_frame_within(&mut self, limit: Duration) {
        let until = Instant::now() + limit;
        if self.deadline.is_none_or(|(d, _)| until < d) {
            self.deadline = Some((until, limit));
            self.deadline_name = "first_frame_timeout";
        }
    }

    /// Back to per-receive timeouts (`io` for a started frame) and the full body limit.
    pub(crate) fn end_handshake(&mut self, io: Duration) -> Result<()> {
        self.deadline = None;
        self.max_body = wire::MAX_BODY;
        self.set_timeout(Some(io))
    }

    /// Server side: close the connection when no frame starts for `limit`.
    pub(crate) fn set_idle_limit(&mut self, limit: Duration) {
        self.idle_limit = Some(limit);
    }

    /// Sets the send and receive timeout (`None`: block forever).
    pub(crate) fn set_timeout(&self, t: Option<Duration>) -> Result<()> {
        let r = match &self.sock {
            Sock::Tcp(s) => s.set_read_timeout(t).and_then(|_| s.set_write_timeout(t)),
            Sock::Unix(s) => s.set_read_timeout(t).and_then(|_| s.set_write_timeout(t)),
        };
        r.map_err(|e| Error::os("setsockopt", e))
    }

    /// A second handle on the socket, used to shut it down from another thread.
    /// This end's address, for a tcp connection.
    pub(crate) fn local_addr(&self) -> Option<std::net::SocketAddr> {
        match &self.sock {
            Sock::Tcp(s) => s.local_addr().ok(),
            Sock::Unix(_) => None,
        }
    }

    pub(crate) fn shutdown_handle(&self) -> Result<Sock> {
        Ok(match &self.sock {
            Sock::Tcp(s) => Sock::Tcp(s.try_clone().map_err(|e| Error::os("dup", e))?),
            Sock::Unix(s) => Sock::Unix(s.try_clone().map_err(|e| Error::os("dup", e))?),
        })
    }

    fn lost(&self, e: io::Error) -> Error {
        let what = self.what;
        if matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ) {
            Error::peer_lost(format!("{what}: no answer within the I/O timeout"))
        } else {
            Error::from_peer_io(what, e)
        }
    }

    /// One `recvmsg` into the free tail of the buffer; collects passed fds. Returns bytes read.
    fn fill(&mut self) -> io::Result<usize> {
        self.fill_with(rustix::net::RecvFlags::empty())
    }

    fn fill_with(&mut self, flags: rustix::net::RecvFlags) -> io::Result<usize> {
        if let Some((d, _)) = self.deadline {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "handshake deadline passed",
                ));
            }
            let r = match &self.sock {
                Sock::Tcp(s) => s.set_read_timeout(Some(left)),
                Sock::Unix(s) => s.set_read_timeout(Some(left)),
            };
            r?;
        }
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.end == self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
        // 128 bytes of control space, as before: room for more fds than a frame ever carries.
        let mut space = [std::mem::MaybeUninit::<u8>::uninit(); 128];
        let mut cmsg = RecvAncillaryBuffer::new(&mut space);
        let n = loop {
            let mut iov = [io::IoSliceMut::new(&mut self.buf[self.end..])];
            match rustix::net::recvmsg(
                &self.sock,
                &mut iov,
                &mut cmsg,
                RecvFlags::CMSG_CLOEXEC | flags,
            ) {
                Ok(r) => break r.bytes,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        };
        for m in cmsg.drain() {
            if let RecvAncillaryMessage::ScmRights(fds) = m {
                self.fds.extend(fds);
            }
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed by peer",
            ));
        }
        self.end += n;
        Ok(n)
    }

    fn ensure(&mut self, n: usize, idle_ok: bool) -> Result<()> {
        let idle_since = Instant::now();
        while self.end - self.start < n {
            match self.fill() {
                Ok(_) => {}
                Err(e)
                    if idle_ok
                        && self.start == self.end
                        && matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                        ) =>
                {
                    if let Some(limit) = self.idle_limit {
                        if idle_since.elapsed() >= limit {
                            return Err(Error::LimitReached {
                                what: format!(
                                    "{}: idle for longer than idle_timeout ({} ms)",
                                    self.what,
                                    limit.as_millis()
                                ),
                                limit: limit.as_millis() as u64,
                            });
                        }
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) && self.deadline.is_some() =>
                {
                    let ms = self.deadline.map_or(0, |(_, w)| w.as_millis() as u64);
                    return Err(Error::LimitReached {
                        what: format!(
                            "{}: handshake not done within {}",
                            self.what, self.deadline_name
                        ),
                        limit: ms,
                    });
                }
                Err(e) => return Err(self.lost(e)),
            }
        }
        Ok(())
    }

    /// Receives one frame: its message and the length of the payload that follows (which the caller
    /// must consume with [`Conn::recv_payload`] or [`Conn::discard_payload`]). With `idle_ok`, a
    /// receive timeout before the first byte of the frame is not an error (the server side waits
    /// for requests indefinitely, but never for the rest of a started frame).
    pub(crate) fn recv_frame(&mut self, idle_ok: bool) -> Result<(Msg, u32)> {
        self.ensure(HEADER_LEN, idle_ok)?;
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(&self.buf[self.start..self.start + HEADER_LEN]);
        let hdr = wire::decode_header(&h)?;
        if hdr.body_len > self.max_body {
            return Err(Error::FrameTooLarge {
                len: hdr.body_len.into(),
                limit: self.max_body.into(),
            });
        }
        let total = HEADER_LEN + hdr.body_len as usize;
        if total > self.buf.len() {
            // Bodies larger than the buffer (big region lists, big batches) take a one-off buffer.
            let mut body = vec![0u8; hdr.body_len as usize];
            let have = self.end - self.start - HEADER_LEN;
            let have = have.min(body.len());
            body[..have].copy_from_slice(
                &self.buf[self.start + HEADER_LEN..self.start + HEADER_LEN + have],
            );
            self.start += HEADER_LEN + have;
            if have < body.len() {
                // SAFETY: body[have..] is a live, exclusively owned Vec span.
                unsafe {
                    recv_exact_raw(
                        self.sock.fd(),
                        body.as_mut_ptr().add(have),
                        body.len() - have,
                    )
                }
                .map_err(|e| self.lost(e))?;
            }
            return Ok((wire::decode_body(hdr.kind, &body)?, hdr.payload_len));
        }
        self.ensure(total, false)?;
        let msg = wire::decode_body(
            hdr.kind,
            &self.buf[self.start + HEADER_LEN..self.start + total],
        );
        self.start += total;
        Ok((msg?, hdr.payload_len))
    }

    /// Receives `len` payload bytes into `ptr` (buffered bytes first, then straight from the socket).
    ///
    /// # Safety
    /// `ptr..ptr+len` must be valid for writes for the duration of the call.
    pub(crate) unsafe fn recv_payload(&mut self, ptr: *mut u8, len: usize) -> Result<()> {
        let have = (self.end - self.start).min(len);
        // SAFETY: the source is within our buffer, the destination within the caller's span.
        unsafe { std::ptr::copy_nonoverlapping(self.buf.as_ptr().add(self.start), ptr, have) };
        self.start += have;
        if have < len {
            // SAFETY: ptr+have..ptr+len is within the caller's span.
            unsafe { recv_exact_raw(self.sock.fd(), ptr.add(have), len - have) }
                .map_err(|e| self.lost(e))?;
        }
        Ok(())
    }

    /// Receives the payload bytes of `parts` in order, each into its span (buffered bytes
    /// first, then straight from the socket with vectored reads): a batch's payloads land in
    /// their regions with a few system calls.
    ///
    /// # Safety
    /// Every `(ptr, len)` of `parts` must be valid for writes for the duration of the call.
    pub(crate) unsafe fn recv_payloads(&mut self, parts: &[(*mut u8, usize)]) -> Result<()> {
        let mut rest = Vec::with_capacity(parts.len());
        for &(ptr, len) in parts {
            let have = (self.end - self.start).min(len);
            // SAFETY: the source is within our buffer, the destination within the span.
            unsafe { std::ptr::copy_nonoverlapping(self.buf.as_ptr().add(self.start), ptr, have) };
            self.start += have;
            if have < len {
                // SAFETY: ptr+have..ptr+len is within the caller's span.
                rest.push((unsafe { ptr.add(have) }, len - have));
            }
        }
        // SAFETY: the spans are within the caller's, as guaranteed.
        unsafe { recv_exact_raw_vectored(self.sock.fd(), &rest) }.map_err(|e| self.lost(e))
    }

    /// Whether a frame's first bytes are already here (buffered, or readable on the socket now),
    /// so that receiving would not block. Lets a server defer replies while more requests are
    /// queued, and send them before it would wait.
    /// Polls, without sleeping, up to `spin` for input; true once some is there. A stream
    /// whose next request comes within `spin` then costs its reader no wake-up from a blocked
    /// read (tens of µs on a VM whose idle vCPU halts), which would otherwise be most of a
    /// small write's round trip.
    pub(crate) fn spin_for_input(&mut self, spin: std::time::Duration) -> bool {
        let start = Instant::now();
        loop {
            if self.poll_input() {
                return true;
            }
            if start.elapsed() >= spin {
                return false;
            }
            std::hint::spin_loop();
        }
    }

    /// Whether input is buffered or arrives now: one non-blocking read into the buffer (what
    /// a poller calls in its loop: a `poll` first and then the read would cost two system
    /// calls per answer, a good part of a loopback round trip on a VM). A closed or failed
    /// socket counts as input: the next read reports it.
    pub(crate) fn poll_input(&mut self) -> bool {
        if self.end > self.start {
            return true;
        }
        if self.deadline.is_some() {
            return self.has_input();
        }
        match self.fill_with(rustix::net::RecvFlags::DONTWAIT) {
            Ok(_) => true,
            Err(e) => e.kind() != io::ErrorKind::WouldBlock,
        }
    }

    /// Waits up to `t` (at most a second) for input, without reading it: true once some is
    /// buffered or readable (a closed socket counts). Lets a reader look up between waits
    /// (a transfer cancelled or out of time) instead of blocking in a read for the I/O timeout.
    pub(crate) fn wait_input(&self, t: std::time::Duration) -> bool {
        if self.end > self.start {
            return true;
        }
        use rustix::event::{PollFd, PollFlags, Timespec};
        let t = t.min(std::time::Duration::from_secs(1));
        let ts = Timespec {
            tv_sec: t.as_secs() as _,
            tv_nsec: t.subsec_nanos() as _,
        };
        let mut p = [PollFd::new(&self.sock, PollFlags::IN)];
        // An interrupted poll reads as "no input yet": the caller looks up and waits again.
        rustix::event::poll(&mut p, Some(&ts)).unwrap_or(0) > 0
    }

    pub(crate) fn has_input(&self) -> bool {
        if self.end > self.start {
            return true;
        }
        use rustix::event::{PollFd, PollFlags};
        let mut p = [PollFd::new(&self.sock, PollFlags::IN)];
        let n = rustix::event::poll(&mut p, Some(&rustix::event::Timespec::default())).unwrap_or(0);
        n > 0
    }

    /// Reads and drops `len` payload bytes (after a rejected write), through the fixed buffer.
    pub(crate) fn discard_payload(&mut self, mut len: usize) -> Result<()> {
        while len > 0 {
            if self.start == self.end {
                self.fill().map_err(|e| self.lost(e))?;
            }
            let n = (self.end - self.start).min(len);
            self.start += n;
            len -= n;
        }
        Ok(())
    }

    /// Sends a frame without payload.
    pub(crate) fn send(&mut self, msg: &Msg) -> Result<()> {
        let head = wire::encode(msg, 0);
        // SAFETY: head is a live Vec.
        unsafe { send_all_raw(self.sock.fd(), &[(head.as_ptr(), head.len())]) }
            .map_err(|e| self.lost(e))
    }

    /// Sends a frame followed by `len` payload bytes read from `ptr`, in one `sendmsg` where possible.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be valid for reads for the duration of the call.
    pub(crate) unsafe fn send_with_payload(
        &mut self,
        msg: &Msg,
        ptr: *const u8,
        len: u32,
    ) -> Result<()> {
        let head = wire::encode(msg, len);
        // SAFETY: head is live; the payload span is guaranteed by the caller.
        unsafe {
            send_all_raw(
                self.sock.fd(),
                &[(head.as_ptr(), head.len()), (ptr, len as usize)],
            )
        }
        .map_err(|e| self.lost(e))
    }

    /// Sends a frame whose payload is `parts` back to back (a batch's chunks), in as few
    /// `sendmsg` calls as the kernel takes (`parts` ≤ `wire::MAX_BATCH_ENTRIES`: one, unless
    /// the socket buffer fills).
    ///
    /// # Safety
    /// Every `(ptr, len)` of `parts` must be readable for the call.
    pub(crate) unsafe fn send_with_payloads(
        &mut self,
        msg: &Msg,
        parts: &[(*const u8, usize)],
    ) -> Result<()> {
        let total: usize = parts.iter().map(|p| p.1).sum();
        let total = u32::try_from(total)
            .map_err(|_| Error::Protocol(format!("a batch payload of {total} bytes")))?;
        let head = wire::encode(msg, total);
        let mut all = Vec::with_capacity(parts.len() + 1);
        all.push((head.as_ptr(), head.len()));
        all.extend_from_slice(parts);
        // SAFETY: head is live; the payload spans are guaranteed by the caller.
        unsafe { send_all_raw(self.sock.fd(), &all) }.map_err(|e| self.lost(e))
    }

    /// Sends a frame with `fd` attached (`SCM_RIGHTS`; unix sockets only).
    pub(crate) fn send_with_fd(&mut self, msg: &Msg, fd: RawFd) -> Result<()> {
        let head = wire::encode(msg, 0);
        use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
        // SAFETY: the caller's fd is open for this call; sendmsg only looks it up (EBADF if not)
        // and the kernel duplicates it into the peer.
        let fds = [unsafe { BorrowedFd::borrow_raw(fd) }];
        let mut space = [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut cmsg = SendAncillaryBuffer::new(&mut space);
        if !cmsg.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err(Error::Protocol("no control space for one fd".into()));
        }
        let iov = [io::IoSlice::new(&head)];
        loop {
            let n = match rustix::net::sendmsg(&self.sock, &iov, &mut cmsg, SendFlags::NOSIGNAL) {
                Ok(n) => n,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(self.lost(e.into())),
            };
            if n < head.len() {
                // The fd went with the first bytes; send the rest plainly.
                let rest = &head[n..];
                // SAFETY: rest is a live slice.
                unsafe { send_all_raw(self.sock.fd(), &[(rest.as_ptr(), rest.len())]) }
                    .map_err(|e| self.lost(e))?;
            }
            return Ok(());
        }
    }

    /// The socket's descriptor (for `poll`; it stays owned by this connection).
    pub(crate) fn raw_fd(&self) -> RawFd {
        self.sock.fd()
    }

    /// The next fd received with `SCM_RIGHTS`, if any.
    pub(crate) fn take_fd(&mut self) -> Option<OwnedFd> {
        self.fds.pop_front()
    }

    /// Sends a request and receives the reply; a `Msg::Err` reply becomes `Err`.
    pub(crate) fn request(&mut self, msg: &Msg) -> Result<Msg> {
        self.send(msg)?;
        match self.recv_frame(false)? {
            (Msg::Err(e), _) => Err(e),
            (_, p) if p > 0 => Err(Error::Protocol("unexpected payload on a reply".into())),
            (m, _) => Ok(m),
        }
    }
}

impl Sock {
    /// Shuts the socket down both ways, waking any thread blocked on it.
    pub(crate) fn shutdown(&self) {
        let _ = match self {
            Sock::Tcp(s) => s.shutdown(Shutdown::Both),
            Sock::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }
}

/// Bounded number of fds collected before the oldest are dropped (a peer cannot make us hoard fds).
pub(crate) fn trim_fds(c: &mut Conn) {
    while c.fds.len() > MAX_FDS {
        c.fds.pop_front();
    }
}
