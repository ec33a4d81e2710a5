//! Hand-made hostile clients shared by the hostile test files: agents with chosen limits, a
//! legitimate round trip, the shm socket driven frame by frame, the shm control ring driven by
//! hand (layout from docs/wire-protocol.md).

use super::raw::{self, hmac};
use super::{agent, config, fill_pattern, first_diff, WAIT};
use gdx_engine::wire::{decode_frame, encode, Msg, ShmOp};
use gdx_engine::{Access, Agent, AgentConfig, Limits, Transfer};
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

pub fn with_limits(name: &str, shm: bool, io_ms: u64, limits: Limits) -> Agent {
    Agent::new(AgentConfig {
        io_timeout: Duration::from_millis(io_ms),
        limits,
        ..config(name, shm)
    })
    .unwrap()
}

pub fn addr(a: &Agent) -> SocketAddr {
    a.listen_addr().unwrap()
}

pub fn secret(a: &Agent) -> Vec<u8> {
    a.secret().unwrap().as_bytes().to_vec()
}

/// Every frame the server sends until it closes the connection.
pub fn frames_until_close(s: &mut TcpStream) -> Vec<Msg> {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut all = Vec::new();
    let _ = std::io::Read::read_to_end(s, &mut all);
    let mut v = Vec::new();
    let mut at = 0;
    while let Ok(Some((m, _, n))) = decode_frame(&all[at..]) {
        v.push(m);
        at += n;
    }
    assert_eq!(at, all.len(), "undecodable bytes from the server");
    v
}

/// A legitimate client writes random bytes and reads them back through `target`.
pub fn legit_round_trip(target: &Agent, seed: u64) {
    let r = target.alloc(1 << 16, Access::READ_WRITE, None).unwrap();
    let me = agent("legit", false);
    let peer = me.connect(addr(target)).unwrap();
    let mut src = me.alloc(1 << 16, Access::LOCAL, None).unwrap();
    fill_pattern(&mut src.bytes_mut().unwrap(), seed);
    let mut t = Transfer::new();
    t.write(&src, 0, &r.desc(), 0, 1 << 16);
    peer.submit(t).unwrap().wait(WAIT).unwrap();
    assert_eq!(first_diff(&r.bytes().unwrap(), &src.bytes().unwrap()), None);
}

pub fn memfd(len: usize, seal: bool) -> OwnedFd {
    use rustix::fs::{MemfdFlags, SealFlags};
    let fd = rustix::fs::memfd_create("hostile", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
        .unwrap();
    rustix::fs::ftruncate(&fd, len as u64).unwrap();
    if seal {
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW).unwrap();
    }
    fd
}

pub fn send_with_fd(s: &UnixStream, m: &Msg, fd: impl AsFd) {
    let sent = try_send_with_fd(s, m, fd);
    assert_eq!(sent, encode(m, 0).len() as isize);
}

/// `sendmsg` of one frame with one fd; what it returned (-1 when the peer already closed).
pub fn try_send_with_fd(s: &UnixStream, m: &Msg, fd: impl AsFd) -> isize {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let bytes = encode(m, 0);
    let fds = [fd.as_fd()];
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut cmsg = SendAncillaryBuffer::new(&mut space);
    assert!(cmsg.push(SendAncillaryMessage::ScmRights(&fds)));
    let iov = [std::io::IoSlice::new(&bytes)];
    rustix::net::sendmsg(s, &iov, &mut cmsg, SendFlags::NOSIGNAL).map_or(-1, |n| n as isize)
}

/// One frame from a unix socket, with any fds that came with it.
pub fn recv_with_fds(s: &UnixStream) -> Option<(Msg, Vec<OwnedFd>)> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (mut buf, mut fds) = (Vec::new(), Vec::new());
    loop {
        if let Ok(Some((m, _, _))) = decode_frame(&buf) {
            return Some((m, fds));
        }
        let mut tmp = [0u8; 4096];
        let mut space = [std::mem::MaybeUninit::uninit(); 128];
        let mut cmsg = RecvAncillaryBuffer::new(&mut space);
        let mut iov = [std::io::IoSliceMut::new(&mut tmp)];
        let n = match rustix::net::recvmsg(s, &mut iov, &mut cmsg, RecvFlags::CMSG_CLOEXEC) {
            Ok(r) => r.bytes,
            Err(_) => 0,
        };
        for m in cmsg.drain() {
            if let RecvAncillaryMessage::ScmRights(got) = m {
                fds.extend(got);
            }
        }
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    }
}

/// An authenticated shm connection made by hand (the control session must stay open).
pub fn shm_join(target: &Agent, bounce: &OwnedFd) -> (raw::Session, UnixStream, Option<Msg>) {
    let s = raw::login(addr(target), &secret(target));
    let name = s.hello.shm_socket.clone().expect("shm offered");
    let a = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let u = UnixStream::connect_addr(&a).unwrap();
    let (session, cn) = (s.hello.session, 99u128);
    send_with_fd(
        &u,
        &Msg::ShmJoin {
            session,
            token: 0,
            nonce: cn,
        },
        bounce,
    );
    let Some((Msg::Challenge { nonce: sn, mac }, _)) = recv_with_fds(&u) else {
        panic!("no shm challenge")
    };
    let t = [
        &session.to_le_bytes()[..],
        &cn.to_le_bytes(),
        &sn.to_le_bytes(),
    ];
    assert_eq!(mac, hmac(&s.key, "gdx/3 shm acceptor", &t));
    let mac = hmac(&s.key, "gdx/3 shm initiator", &t);
    (&u).write_all(&encode(&Msg::Auth { mac }, 0)).unwrap();
    let reply = recv_with_fds(&u).map(|(m, _)| m);
    (s, u, reply)
}

/// The documented ring layout (docs/wire-protocol.md, "The shm control ring").
pub const RING_SLOTS: usize = 128;
pub const RING_SLOT: usize = 256 << 10;
pub const RING_BYTES: usize = 4096 + RING_SLOTS * RING_SLOT;

pub struct RawRing {
    pub fd: OwnedFd,
    pub ptr: *mut u8,
}

impl RawRing {
    pub fn new() -> RawRing {
        let fd = memfd(RING_BYTES, true);
        use rustix::mm::{MapFlags, ProtFlags};
        // SAFETY: a fresh shared mapping of our own memfd.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                RING_BYTES,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &fd,
                0,
            )
        }
        .unwrap();
        let r = RawRing { fd, ptr: p.cast() };
        r.word(0)
            .store(0x4758_5247, std::sync::atomic::Ordering::SeqCst);
        r
    }

    pub fn word(&self, at: usize) -> &std::sync::atomic::AtomicU32 {
        assert!(at.is_multiple_of(4) && at + 4 <= RING_BYTES);
        // SAFETY: aligned, inside the mapping, only accessed atomically.
        unsafe { &*self.ptr.add(at).cast() }
    }

    /// Writes a request into slot 0 and posts it.
    pub fn post(&self, seq: u32, kind: u32, ops: &[ShmOp]) {
        let s = 4096;
        self.word(s + 8).store(seq, Relaxed);
        self.word(s + 12).store(kind, Relaxed);
        self.word(s + 16).store(ops.len() as u32, Relaxed);
        let mut at = s + 64;
        for op in ops {
            let mut b = Vec::new();
            b.extend_from_slice(&u32::from(op.write).to_le_bytes());
            b.extend_from_slice(&[0; 4]);
            b.extend_from_slice(&op.region.to_le_bytes());
            b.extend_from_slice(&op.key.0.to_le_bytes());
            b.extend_from_slice(&op.offset.to_le_bytes());
            b.extend_from_slice(&op.len.to_le_bytes());
            // SAFETY: the op table lies inside slot 0.
            unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), self.ptr.add(at), b.len()) };
            at += b.len();
        }
        self.word(s).store(1, std::sync::atomic::Ordering::SeqCst);
        self.word(4)
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Waits (bounded) for slot 0 to reach `state`.
    pub fn reaches(&self, state: u32) -> bool {
        self.slot_reaches(0, state)
    }

    /// Waits (bounded) for slot `slot` to reach `state`.
    pub fn slot_reaches(&self, slot: usize, state: u32) -> bool {
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < until {
            if self
                .word(4096 + slot * RING_SLOT)
                .load(std::sync::atomic::Ordering::SeqCst)
                == state
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }

    /// Writes a short request (kind 3: one op wholly in the control block; `word` is its
    /// `n_ops` word, length | bit 8 write) into slot `seq % 128` and posts it.
    pub fn post_short(&self, seq: u32, word: u32, op: &ShmOp, data: &[u8]) {
        let s = 4096 + (seq as usize % RING_SLOTS) * RING_SLOT;
        let mut b = Vec::new();
        b.extend_from_slice(&op.region.to_le_bytes());
        b.extend_from_slice(&op.key.0.to_le_bytes());
        b.extend_from_slice(&op.offset.to_le_bytes());
        b.extend_from_slice(data);
        assert!(b.len() <= 40);
        // SAFETY: [24, 24 + 40) of the slot lies inside it.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), self.ptr.add(s + 24), b.len()) };
        self.word(s + 8).store(seq, Relaxed);
        self.word(s + 12).store(3, Relaxed);
        self.word(s + 16).store(word, Relaxed);
        self.word(s).store(1, std::sync::atomic::Ordering::SeqCst);
        self.word(4)
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// The 8 data bytes of slot `slot`'s control block (a short request's).
    pub fn short_data(&self, slot: usize) -> [u8; 8] {
        let mut b = [0u8; 8];
        // SAFETY: [56, 64) of the slot lies inside it.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.add(4096 + slot * RING_SLOT + 56),
                b.as_mut_ptr(),
                8,
            )
        };
        b
    }
}

impl Drop for RawRing {
    fn drop(&mut self) {
        // SAFETY: our own mapping.
        let _ = unsafe { rustix::mm::munmap(self.ptr.cast(), RING_BYTES) };
    }
}

pub fn attach_ring(target: &Agent) -> (raw::Session, UnixStream, RawRing) {
    let bounce = memfd(1 << 16, true);
    let (s, u, reply) = shm_join(target, &bounce);
    assert_eq!(reply, Some(Msg::Ok));
    let ring = RawRing::new();
    send_with_fd(
        &u,
        &Msg::ShmRing {
            slots: RING_SLOTS as u32,
            slot_bytes: RING_SLOT as u32,
        },
        &ring.fd,
    );
    assert!(matches!(recv_with_fds(&u), Some((Msg::Ok, _))));
    (s, u, ring)
}
