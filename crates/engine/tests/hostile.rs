//! The attacks of issue #15 ("Why", items 1-4 and 7), replayed from loopback against a real
//! agent with hand-made frames. Each test failed on the version-2 code (no authentication,
//! unsealed memfds, per-receive deadlines, unbounded queues and leases, no op cap) and asserts
//! the outcome, never a duration.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::raw::{self, closed, pake_start, read_msg, send};
use common::shm_raw::*;
use common::*;
use gdx_engine::wire::{decode_frame, encode, Hello, Msg, ShmOp, MAX_OPS_PER_BEGIN};
use gdx_engine::{Access, Agent, AgentConfig, Error, Limits, RegionDesc, RegionKey, Transfer};
use rustix::io::Errno;
use std::io::Write;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

// ---- 1: the key is handed to anyone who asks ----------------------------------------------

#[test]
fn unauthenticated_client_gets_no_key_and_no_bytes() {
    let target = agent("target", false);
    let mut r = target.alloc(4096, Access::READ_WRITE, Some("kv")).unwrap();
    r.bytes_mut().unwrap().fill(0x5A);
    let key = r.desc().key;

    // Hello, then straight to ListRegions / GetRegion as the v2 attack did.
    let mut s = TcpStream::connect(addr(&target)).unwrap();
    send(
        &mut s,
        &Msg::Hello(Hello {
            agent_name: "mallory".into(),
            nonce: 1,
            ..Hello::default()
        }),
    );
    send(&mut s, &Msg::ListRegions);
    send(&mut s, &Msg::GetRegion { name: "kv".into() });
    let got = frames_until_close(&mut s);
    assert!(
        matches!(got.first(), Some(Msg::Pake { .. })),
        "first answer must be the SPAKE2 message: {got:?}"
    );
    for m in &got {
        assert!(
            !matches!(m, Msg::Regions(_) | Msg::Region(_) | Msg::Hello(_)),
            "leaked {m:?}"
        );
        let bytes = encode(m, 0);
        assert!(
            !bytes.windows(16).any(|w| w == key.0.to_le_bytes()),
            "the region key crossed the wire"
        );
    }
    assert!(
        matches!(got.last(), Some(Msg::Err(Error::AuthFailed { .. }))),
        "{got:?}"
    );

    // A forged proof: refused, closed, counted.
    let mut s = TcpStream::connect(addr(&target)).unwrap();
    send(
        &mut s,
        &Msg::Hello(Hello {
            nonce: 2,
            ..Hello::default()
        }),
    );
    let Some(Msg::Pake { .. }) = read_msg(&mut s) else {
        panic!("no Pake")
    };
    let (_, mine) = pake_start(b"not the secret, a guess at it");
    send(
        &mut s,
        &Msg::PakeAuth {
            msg: mine,
            mac: [7u8; 32],
        },
    );
    assert!(matches!(
        read_msg(&mut s),
        Some(Msg::Err(Error::AuthFailed { .. }))
    ));
    assert!(closed(&mut s));
    assert!(target.limit_hits().auth_failures.load(Relaxed) >= 2);

    // An agent holding a different secret learns nothing and moves no byte.
    let other = Agent::new(AgentConfig {
        secret: Some(gdx_engine::Secret::generate().unwrap()),
        ..config("other", false)
    })
    .unwrap();
    let e = other.connect(addr(&target)).expect_err("wrong secret");
    assert!(matches!(e, Error::AuthFailed { .. }), "{e}");
    assert!(r.bytes().unwrap().iter().all(|&b| b == 0x5A));
}

#[test]
fn a_leaked_key_is_useless_without_a_session_and_rotates_on_re_registration() {
    let target = agent("target", false);
    let r = target.alloc(4096, Access::READ_WRITE, Some("kv")).unwrap();
    let old = r.desc();
    // A data stream with the right key but a made-up session is refused before any op.
    let mut d = TcpStream::connect(addr(&target)).unwrap();
    send(
        &mut d,
        &Msg::Join {
            session: 1,
            token: 0,
            stream: 0,
            nonce: 3,
        },
    );
    let mut f = encode(
        &Msg::Write {
            xfer: 1,
            op: 0,
            chunk: 0,
            region: old.id,
            key: old.key,
            offset: 0,
        },
        4,
    );
    f.extend_from_slice(b"evil");
    let _ = d.write_all(&f);
    assert!(matches!(
        read_msg(&mut d),
        Some(Msg::Err(Error::AuthFailed { .. }))
    ));
    assert!(r.bytes().unwrap().iter().all(|&b| b == 0));

    // Re-registering under the same name gives a new id and a new key.
    drop(r);
    let r2 = target.alloc(4096, Access::READ_WRITE, Some("kv")).unwrap();
    let new = r2.desc();
    assert_ne!(new.key, old.key);
    assert_ne!(new.id, old.id);
    let s = raw::login(addr(&target), &secret(&target));
    let mut d = raw::join(addr(&target), &s, 0);
    for (region, key, want) in [
        (old.id, old.key, Error::NoSuchRegion { region: old.id }),
        (new.id, old.key, Error::BadKey { region: new.id }),
    ] {
        let mut f = encode(
            &Msg::Write {
                xfer: 1,
                op: 0,
                chunk: 0,
                region,
                key,
                offset: 0,
            },
            4,
        );
        f.extend_from_slice(b"evil");
        d.write_all(&f).unwrap();
        match read_msg(&mut d) {
            Some(Msg::OpErr { err, .. }) => assert_eq!(err, want),
            other => panic!("{other:?}"),
        }
    }
    assert!(r2.bytes().unwrap().iter().all(|&b| b == 0));
}

// ---- 2 and 3: shm: reopen-to-write, SIGBUS by truncation ----------------------------------

/// What the target answered when asked over a fresh shm session (sealed bounce buffer) to
/// map region `d`; the session stays open while this is held.
struct Mapped {
    _session: (raw::Session, UnixStream, OwnedFd),
    writable: bool,
    /// The region's memfd.
    fd: OwnedFd,
}

fn shm_map(target: &Agent, d: &RegionDesc, write: bool) -> Mapped {
    let bounce = memfd(1 << 16, true);
    let (s, u, reply) = shm_join(target, &bounce);
    assert_eq!(reply, Some(Msg::Ok));
    (&u).write_all(&encode(
        &Msg::ShmMap {
            region: d.id,
            key: d.key,
            write,
            piece: 0,
        },
        0,
    ))
    .unwrap();
    let Some((Msg::ShmMapped { writable, .. }, fds)) = recv_with_fds(&u) else {
        panic!("no ShmMapped")
    };
    let fd = fds.into_iter().next().expect("an fd");
    Mapped {
        _session: (s, u, bounce),
        writable,
        fd,
    }
}

#[test]
fn read_only_region_cannot_be_written_through_a_reopened_fd() {
    let target = agent("target", true);
    let mut ro = target.alloc(8192, Access::READ, Some("ro")).unwrap();
    ro.bytes_mut().unwrap().fill(0x33);
    let mapped = shm_map(&target, &ro.desc(), false);
    assert!(!mapped.writable);
    let fd = mapped.fd;
    // The v2 attack: reopen /proc/self/fd/N read-write, then map it shared writable or write.
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    use rustix::fs::{Mode, OFlags};
    if let Ok(rw) = rustix::fs::open(path, OFlags::RDWR | OFlags::CLOEXEC, Mode::empty()) {
        use rustix::mm::{MapFlags, ProtFlags};
        // SAFETY: a fresh mapping request; a success would be unmapped below.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                8192,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &rw,
                0,
            )
        };
        if let Ok(p) = p {
            // SAFETY: the mapping just made, of 8192 bytes.
            let _ = unsafe { rustix::mm::munmap(p, 8192) };
            panic!("a writable shared mapping was granted");
        }
        assert_eq!(
            rustix::io::pwrite(&rw, b"evil", 0).err(),
            Some(Errno::PERM),
            "write(2) through the reopened fd"
        );
        // Nor shrunk or grown (truncation = SIGBUS for the target's own mapping).
        assert_eq!(rustix::fs::ftruncate(&rw, 0).err(), Some(Errno::PERM));
        assert_eq!(rustix::fs::ftruncate(&rw, 1 << 20).err(), Some(Errno::PERM));
    }
    assert!(rustix::fs::ftruncate(&fd, 0).is_err());
    assert!(ro.bytes().unwrap().iter().all(|&b| b == 0x33));
}

#[test]
fn truncating_a_shared_memfd_cannot_crash_either_side() {
    let target = agent("target", true);
    // The server refuses an unsealed bounce buffer before mapping it: truncating it later
    // cannot reach the server.
    let unsealed = memfd(1 << 16, false);
    let (_s, _u, reply) = shm_join(&target, &unsealed);
    match reply {
        Some(Msg::Err(e)) => assert!(e.to_string().contains("sealed"), "{e}"),
        other => panic!("an unsealed bounce buffer was accepted: {other:?}"),
    }
    rustix::fs::ftruncate(&unsealed, 0).unwrap();

    // A region memfd the target hands out is sealed: the receiver cannot shrink it.
    let rw = target.alloc(8192, Access::READ_WRITE, Some("rw")).unwrap();
    let mapped = shm_map(&target, &rw.desc(), true);
    assert_eq!(
        rustix::fs::ftruncate(&mapped.fd, 0).err(),
        Some(Errno::PERM)
    );
    // The target still serves (it did not die of SIGBUS), through its own sealed bounce too.
    legit_round_trip(&target, 3);
}

// ---- 4: exhaustion ------------------------------------------------------------------------

/// Writes `bytes` to `s` one per 50 ms until they are all sent, a write fails (the peer
/// closed) or `stop` says so; returns how many were sent.
fn drip(s: &mut TcpStream, bytes: &[u8], stop: impl Fn() -> bool) -> usize {
    let mut sent = 0;
    for b in bytes {
        if s.write_all(&[*b]).is_err() {
            break;
        }
        sent += 1;
        std::thread::sleep(Duration::from_millis(50));
        if stop() {
            break;
        }
    }
    sent
}

/// An shm op writing the first 64 bytes of region `d`.
fn write_64(d: &RegionDesc) -> ShmOp {
    ShmOp {
        write: true,
        region: d.id,
        key: d.key,
        offset: 0,
        len: 64,
    }
}

fn short_limits() -> Limits {
    Limits {
        handshake_timeout: Duration::from_millis(600),
        idle_timeout: Duration::from_millis(600),
        ..Limits::default()
    }
}

#[test]
fn a_dripped_hello_is_cut_off_at_the_handshake_deadline() {
    let target = with_limits("target", false, 2000, short_limits());
    let hello = encode(
        &Msg::Hello(Hello {
            agent_name: "drip".repeat(20),
            nonce: 5,
            ..Hello::default()
        }),
        0,
    );
    let mut s = TcpStream::connect(addr(&target)).unwrap();
    // One byte per 50 ms: each receive is well inside the 2 s I/O timeout, the whole Hello
    // (200 bytes, 10 s) is not inside the 0.6 s handshake deadline.
    let sent = drip(&mut s, &hello, || {
        target.limit_hits().handshake_timeouts.load(Relaxed) > 0
    });
    assert!(sent < hello.len(), "the whole dripped Hello was read");
    assert!(closed(&mut s));
    assert_eq!(target.limit_hits().handshake_timeouts.load(Relaxed), 1);
    legit_round_trip(&target, 4);
}

#[test]
fn idle_and_silent_connections_are_cut_off_while_a_legit_client_is_served() {
    let target = with_limits("target", false, 200, short_limits());
    // Silent before Hello: cut at the handshake deadline.
    let mut silent: Vec<TcpStream> = (0..20)
        .map(|_| TcpStream::connect(addr(&target)).unwrap())
        .collect();
    // Authenticated, then idle: cut at the idle deadline.
    let mut idle: Vec<raw::Session> = (0..4)
        .map(|_| raw::login(addr(&target), &secret(&target)))
        .collect();
    legit_round_trip(&target, 5);
    for s in &mut silent {
        assert!(closed(s), "a silent connection was kept");
    }
    for s in &mut idle {
        assert!(closed(&mut s.control), "an idle session was kept");
    }
    // Silent connections beyond max_pending_per_addr (8) are evicted by newer ones; the rest
    // reach the handshake deadline.
    let hits = target.limit_hits();
    assert!(hits.handshake_timeouts.load(Relaxed) + hits.evictions.load(Relaxed) >= 20);
    assert!(hits.handshake_timeouts.load(Relaxed) >= 1);
    assert!(target.limit_hits().idle_timeouts.load(Relaxed) >= 4);
    legit_round_trip(&target, 6);
}

/// Opens `n` TCP connections to `target` and holds them; returns them with how many the
/// target closed at once (a read of 0 bytes within 100 ms = refused).
fn open_and_count_refused(target: &Agent, n: usize) -> (Vec<TcpStream>, usize) {
    let mut conns: Vec<TcpStream> = (0..n)
        .map(|_| TcpStream::connect(addr(target)).unwrap())
        .collect();
    let mut refused = 0;
    for s in &mut conns {
        s.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let mut b = [0u8; 1];
        if matches!(std::io::Read::read(s, &mut b), Ok(0)) {
            refused += 1;
        }
    }
    (conns, refused)
}

/// A flood beyond the pending caps evicts the oldest pending connections, never the newcomer:
/// the 22 oldest of 30 are closed, the 8 newest are kept (until their first-frame deadline).
#[test]
fn a_connection_flood_evicts_the_oldest_pending() {
    let target = with_limits(
        "target",
        false,
        200,
        Limits {
            max_pending: 8,
            ..short_limits()
        },
    );
    let (mut flood, closed_at_once) = open_and_count_refused(&target, 30);
    assert!(
        closed_at_once >= 22,
        "only {closed_at_once} of 30 evicted with max_pending 8"
    );
    assert!(target.limit_hits().evictions.load(Relaxed) >= 22);
    for s in &mut flood {
        assert!(closed(s));
    }
    legit_round_trip(&target, 7);
}

/// Attack #1 of issue 42: silent connections held (and reopened as they are dropped) locked
/// every other peer out. Now a legitimate peer gets in within 2 s while 64 are held.
#[test]
fn a_legit_peer_gets_in_while_64_silent_connections_are_held() {
    let target = with_limits("target", false, 2000, Limits::default());
    let r = target.alloc(1 << 16, Access::READ_WRITE, None).unwrap();
    let a = addr(&target);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let st = std::sync::Arc::clone(&stop);
    // The attacker: 64 silent connections, each reopened as soon as the target drops it.
    let attacker = std::thread::spawn(move || {
        let mut held: Vec<TcpStream> = (0..64).map(|_| TcpStream::connect(a).unwrap()).collect();
        let mut reopened = 0usize;
        while !st.load(Relaxed) {
            for s in &mut held {
                s.set_nonblocking(true).unwrap();
                let mut b = [0u8; 64];
                if matches!(std::io::Read::read(s, &mut b), Ok(0)) {
                    if let Ok(n) = TcpStream::connect(a) {
                        *s = n;
                        reopened += 1;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        reopened
    });
    std::thread::sleep(Duration::from_millis(300));
    let me = agent("legit", false);
    let t0 = std::time::Instant::now();
    let peer = me.connect(a).expect("the legitimate peer was locked out");
    let took = t0.elapsed();
    let mut src = me.alloc(1 << 16, Access::LOCAL, None).unwrap();
    fill_pattern(&mut src.bytes_mut().unwrap(), 11);
    let mut t = Transfer::new();
    t.write(&src, 0, &r.desc(), 0, 1 << 16);
    peer.submit(t).unwrap().wait(WAIT).unwrap();
    stop.store(true, Relaxed);
    let reopened = attacker.join().unwrap();
    assert!(took < Duration::from_secs(2), "the connect took {took:?}");
    assert_eq!(first_diff(&r.bytes().unwrap(), &src.bytes().unwrap()), None);
    let hits = target.limit_hits();
    assert!(
        hits.evictions.load(Relaxed) + hits.first_frame_timeouts.load(Relaxed) > 0,
        "no silent connection was evicted or timed out ({reopened} reopened)"
    );
}

#[test]
fn hellos_with_huge_names_are_refused() {
    let target = agent("target", false);
    let mut s = TcpStream::connect(addr(&target)).unwrap();
    send(
        &mut s,
        &Msg::Hello(Hello {
            agent_name: "n".repeat(4096),
            nonce: 1,
            ..Hello::default()
        }),
    );
    assert!(matches!(
        read_msg(&mut s),
        Some(Msg::Err(Error::LimitReached { limit: 256, .. }))
    ));
    assert!(closed(&mut s));
    assert_eq!(target.limit_hits().names.load(Relaxed), 1);
}

#[test]
fn notifications_are_bounded_and_the_sender_is_told() {
    let target = with_limits(
        "target",
        false,
        300,
        Limits {
            max_queued_notifications: 4,
            ..Limits::default()
        },
    );
    let me = agent("sender", false);
    let peer = me.connect(addr(&target)).unwrap();
    for i in 0..4 {
        peer.notify(vec![i; 1024]).unwrap();
    }
    match peer.notify(vec![9; 1024]) {
        Err(Error::LimitReached { limit: 4, .. }) => {}
        other => panic!("a fifth queued notification: {other:?}"),
    }
    assert_eq!(target.limit_hits().notifications.load(Relaxed), 1);
    // Nothing acknowledged was dropped; taking one makes room again.
    assert_eq!(target.try_notification().unwrap().data, vec![0; 1024]);
    peer.notify(vec![5; 8]).unwrap();
    let rest: Vec<u8> = std::iter::from_fn(|| target.try_notification())
        .map(|n| n.data[0])
        .collect();
    assert_eq!(rest, vec![1, 2, 3, 5]);
}

#[test]
fn an_oversized_notification_is_refused_locally_and_the_connection_lives() {
    // It used to reach the peer as a frame over its limit, which closed the whole connection.
    let target = agent("target", false);
    let me = agent("sender", false);
    let peer = me.connect(addr(&target)).unwrap();
    let max = gdx_engine::MAX_NOTIFICATION_BYTES;
    match peer.notify(vec![1; 2 << 20]) {
        Err(Error::InvalidArgument(why)) => {
            assert!(why.contains("MAX_NOTIFICATION_BYTES"), "{why}")
        }
        other => panic!("a 2 MiB notification: {other:?}"),
    }
    assert!(matches!(
        peer.notify(vec![1; max + 1]),
        Err(Error::InvalidArgument(_))
    ));
    peer.notify(vec![7; max]).unwrap();
    let n = target.wait_notification(Duration::from_secs(10)).unwrap();
    assert_eq!(n.data, vec![7; max]);
}

#[test]
fn leases_do_not_accumulate_across_shm_begin_without_shm_end() {
    let target = with_limits(
        "target",
        true,
        2000,
        Limits {
            max_leases_per_conn: 16,
            ..Limits::default()
        },
    );
    let r = target.alloc(4096, Access::READ_WRITE, None).unwrap();
    let d = r.desc();
    let bounce = memfd(1 << 16, true);
    let (_s, u, reply) = shm_join(&target, &bounce);
    assert_eq!(reply, Some(Msg::Ok));
    let op = write_64(&d);
    let mut refused = 0;
    for xfer in 0..4 {
        (&u).write_all(&encode(
            &Msg::ShmBegin {
                xfer,
                ops: vec![op; 10],
            },
            0,
        ))
        .unwrap();
        let Some((Msg::ShmBeginResult { errors }, _)) = recv_with_fds(&u) else {
            panic!("no ShmBeginResult")
        };
        for (_, e) in &errors {
            assert!(matches!(e, Error::LimitReached { limit: 16, .. }), "{e}");
        }
        refused += errors.len();
    }
    assert_eq!(refused, 40 - 16);
    assert!(target.limit_hits().leases.load(Relaxed) >= 1);
    // ShmEnd releases them: the next batch is accepted whole.
    (&u).write_all(&encode(
        &Msg::ShmEnd {
            xfer: 9,
            notify: None,
        },
        0,
    ))
    .unwrap();
    assert!(matches!(recv_with_fds(&u), Some((Msg::Ok, _))));
    (&u).write_all(&encode(
        &Msg::ShmBegin {
            xfer: 10,
            ops: vec![op; 16],
        },
        0,
    ))
    .unwrap();
    assert!(matches!(
        recv_with_fds(&u),
        Some((Msg::ShmBeginResult { errors }, _)) if errors.is_empty()
    ));
}

// ---- 7: the documented op cap -------------------------------------------------------------

#[test]
fn shm_begin_over_the_documented_op_cap_is_malformed() {
    let op = ShmOp {
        write: false,
        region: 1,
        key: RegionKey(0),
        offset: 0,
        len: 1,
    };
    let ok = encode(
        &Msg::ShmBegin {
            xfer: 1,
            ops: vec![op; MAX_OPS_PER_BEGIN],
        },
        0,
    );
    assert!(matches!(decode_frame(&ok), Ok(Some(_))));
    let over = encode(
        &Msg::ShmBegin {
            xfer: 1,
            ops: vec![op; 25_000],
        },
        0,
    );
    assert!(matches!(decode_frame(&over), Err(Error::Malformed(_))));
}

// ---- 4 (client side): the initiator's handshake has one deadline too ----------------------

#[test]
fn a_dripping_server_cannot_stall_connect_past_the_handshake_deadline() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let at = l.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let _ = read_msg(&mut s); // the Hello
        let frame = encode(
            &Msg::Pake {
                nonce: 1,
                msg: [0; 33],
            },
            0,
        );
        // One byte per 50 ms: always inside the client's 2 s I/O timeout.
        drip(&mut s, &frame, || false)
    });
    let me = Agent::new(AgentConfig {
        io_timeout: Duration::from_secs(2),
        limits: Limits {
            handshake_timeout: Duration::from_millis(500),
            ..Limits::default()
        },
        listen: None,
        ..config("client", false)
    })
    .unwrap();
    match me.connect(at) {
        Err(Error::LimitReached { what, .. }) => assert!(what.contains("handshake"), "{what}"),
        other => panic!("connect to a dripping server: {other:?}"),
    }
    let sent = server.join().unwrap();
    assert!(
        sent < 64,
        "the client read the whole dripped frame ({sent} bytes)"
    );
}

// ---- 2: SO_PEERCRED on the shm socket ----------------------------------------------------

/// The child of `another_user_is_refused_on_the_shm_socket` (the same test binary, run as
/// another user with GDX_HOSTILE_SHM set): connect to that shm socket and say whether the agent
/// answered. Not a test of its own, so nothing reports `ok` without having run.
fn peercred_client(name: &str) {
    let a = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let u = UnixStream::connect_addr(&a).unwrap();
    let bounce = memfd(4096, true);
    let join = Msg::ShmJoin {
        session: 1,
        token: 0,
        nonce: 1,
    };
    // The agent may close before the join is even sent (it checks SO_PEERCRED on accept):
    // a failed send is the same answer as a closed socket.
    if try_send_with_fd(&u, &join, &bounce) < 0 {
        println!("GDX_PEERCRED closed");
        return;
    }
    match recv_with_fds(&u) {
        Some((m, _)) => println!("GDX_PEERCRED answered {}", m.kind()),
        None => println!("GDX_PEERCRED closed"),
    }
}

/// The other user's side of `another_user_is_refused_on_the_shm_socket`.
#[test]
#[ignore = "a role: run as a child process by another_user_is_refused_on_the_shm_socket"]
fn role_peercred_client() {
    let name = std::env::var("GDX_HOSTILE_SHM")
        .expect("a role: run only as a child of another_user_is_refused_on_the_shm_socket");
    peercred_client(&name);
}

#[test]
#[ignore = "requires root, to start a process as another user (CI runs it with --ignored --exact)"]
fn another_user_is_refused_on_the_shm_socket() {
    assert!(
        rustix::process::geteuid().is_root(),
        "another_user_is_refused_on_the_shm_socket needs root to start a process as another user"
    );
    let target = agent("target", true);
    let s = raw::login(addr(&target), &secret(&target));
    let name = s.hello.shm_socket.clone().expect("shm offered");
    use std::os::unix::process::CommandExt;
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "role_peercred_client",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("GDX_HOSTILE_SHM", &name)
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("GDX_PEERCRED closed"), "{text}\n{err}");
    assert_eq!(target.limit_hits().peer_uid.load(Relaxed), 1);
}

#[test]
fn connection_caps_total_and_per_address_are_enforced() {
    for (limits, counter) in [
        (
            Limits {
                max_connections_per_addr: 3,
                ..short_limits()
            },
            "per_addr",
        ),
        (
            Limits {
                max_connections: 3,
                ..short_limits()
            },
            "total",
        ),
    ] {
        let target = with_limits("target", false, 200, limits);
        let (mut held, refused) = open_and_count_refused(&target, 5);
        assert_eq!(refused, 2, "{counter}: 5 connections, cap 3");
        let hits = target.limit_hits();
        let n = match counter {
            "per_addr" => hits.connections_per_addr.load(Relaxed),
            _ => hits.connections.load(Relaxed),
        };
        assert_eq!(n, 2, "{counter}");
        for s in &mut held {
            assert!(closed(s));
        }
        // Slots are given back: a legitimate client (3 connections: control + 2 streams) fits.
        legit_round_trip(&target, 8);
    }
}

// ---- #17: the shm control ring, driven by hand ----------------------------------------------

#[test]
fn a_ring_begin_holds_its_lease_until_end() {
    let target = Agent::new(AgentConfig {
        transfer_timeout: Duration::from_millis(300),
        ..config("target", true)
    })
    .unwrap();
    let mut r = target.alloc(4096, Access::READ_WRITE, None).unwrap();
    let d = r.desc();
    let (_s, _u, ring) = attach_ring(&target);
    let op = write_64(&d);
    ring.post(0, 2, &[op]);
    assert!(ring.reaches(2), "BEGIN never DONE");
    assert_eq!(
        ring.word(4096 + 20).load(Relaxed),
        0,
        "an empty result (no error: nothing encoded)"
    );
    // The target holds a lease for the remote writer: the owner cannot write (or free) now.
    assert!(matches!(r.bytes_mut(), Err(Error::Timeout(_))));
    ring.word(4096)
        .store(3, std::sync::atomic::Ordering::SeqCst);
    ring.word(4)
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    assert!(ring.reaches(0), "END never released the slot");
    r.bytes_mut().expect("the lease outlived END");
}

/// A short request (docs/wire-protocol.md: one op of at most 8 bytes in the control block)
/// writes and reads through the documented fields, and a wrong key is refused in the result
/// with the region untouched.
#[test]
fn a_short_ring_request_moves_bytes_in_its_control_block() {
    let target = agent("target", true);
    let r = target.alloc(4096, Access::READ_WRITE, None).unwrap();
    let d = r.desc();
    let (_s, _u, ring) = attach_ring(&target);
    let op = ShmOp {
        write: true,
        region: d.id,
        key: d.key,
        offset: 100,
        len: 7,
    };
    ring.post_short(0, 7 | 1 << 8, &op, b"abcdefg");
    assert!(ring.slot_reaches(0, 2), "short write never DONE");
    assert_eq!(
        ring.word(4096 + 20).load(Relaxed),
        0,
        "no error, nothing encoded"
    );
    assert_eq!(&r.bytes().unwrap()[100..107], b"abcdefg");
    assert_eq!(
        r.bytes().unwrap()[107],
        0,
        "one byte past the op was written"
    );
    // A read of 5 of those bytes lands in the slot's data bytes.
    let read = ShmOp {
        write: false,
        offset: 101,
        len: 5,
        ..op
    };
    ring.post_short(1, 5, &read, &[]);
    assert!(ring.slot_reaches(1, 2), "short read never DONE");
    assert_eq!(ring.word(4096 + RING_SLOT + 20).load(Relaxed), 0);
    assert_eq!(&ring.short_data(1)[..5], b"bcdef");
    // A wrong key: the op is refused in the slot's result, the region keeps its bytes.
    let bad = ShmOp {
        key: RegionKey(d.key.0 ^ 1),
        offset: 200,
        ..op
    };
    ring.post_short(2, 7 | 1 << 8, &bad, b"XXXXXXX");
    assert!(ring.slot_reaches(2, 2), "refused short write never DONE");
    assert_ne!(
        ring.word(4096 + 2 * RING_SLOT + 20).load(Relaxed),
        0,
        "no error reported"
    );
    assert_eq!(&r.bytes().unwrap()[200..207], &[0u8; 7]);
}

#[test]
fn a_short_ring_request_out_of_protocol_closes_the_connection() {
    let target = agent("target", true);
    let r = target.alloc(4096, Access::READ_WRITE, None).unwrap();
    let d = r.desc();
    let op = ShmOp {
        len: 8,
        ..write_64(&d)
    };
    // No bytes, more than 8 bytes, an unknown flag bit.
    for word in [1 << 8, 9 | 1 << 8, 4 | 1 << 9] {
        let (_s, u, ring) = attach_ring(&target);
        ring.post_short(0, word, &op, &[1; 8]);
        assert!(recv_with_fds(&u).is_none(), "word {word:#x}");
        assert_ne!(ring.word(4096).load(std::sync::atomic::Ordering::SeqCst), 2);
        assert_eq!(
            &r.bytes().unwrap()[..8],
            &[0u8; 8],
            "word {word:#x} wrote bytes"
        );
    }
    legit_round_trip(&target, 4);
}

#[test]
fn a_ring_request_out_of_protocol_closes_the_connection() {
    let target = agent("target", true);
    let r = target.alloc(4096, Access::READ_WRITE, None).unwrap();
    let d = r.desc();
    let op = write_64(&d);
    // An unknown request kind, an out-of-order seq, more inline bytes than an op may carry.
    for (seq, kind, len) in [(0, 9, 64), (5, 1, 64), (0, 1, 1 << 20)] {
        let (_s, u, ring) = attach_ring(&target);
        ring.post(seq, kind, &[ShmOp { len, ..op }]);
        assert!(
            recv_with_fds(&u).is_none(),
            "kind {kind} seq {seq} len {len}"
        );
        assert_ne!(ring.word(4096).load(std::sync::atomic::Ordering::SeqCst), 2);
    }
    // A ring of the wrong size is refused before it is mapped.
    let bounce = memfd(1 << 16, true);
    let (_s, u, _) = shm_join(&target, &bounce);
    let small = memfd(RING_BYTES - 4096, true);
    send_with_fd(
        &u,
        &Msg::ShmRing {
            slots: RING_SLOTS as u32,
            slot_bytes: RING_SLOT as u32,
        },
        &small,
    );
    assert!(!matches!(recv_with_fds(&u), Some((Msg::Ok, _))));
    // The target is still serving legitimate peers.
    legit_round_trip(&target, 3);
}
