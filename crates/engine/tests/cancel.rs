//! `TransferHandle::cancel` (issue 54): a transfer cancelled mid-flight ends with
//! `Error::Cancelled` by name, `wait` afterwards says the same, its local regions can be
//! dropped at once, the bytes that moved are the peer's bytes (verified), no byte moves into
//! a local region after the cancel returned, and the same peer runs the next transfer.
//! Over tcp (slowed by a relay, so the cancel always comes mid-transfer) and shm. Bounded:
//! every wait has a deadline.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::relay::Relay;
use common::*;
use gdx_engine::{
    Access, Agent, AgentConfig, Error, OpStatus, Path, Region, Status, Transfer, TransferHandle,
};
use std::time::{Duration, Instant};

const LEN: u64 = 16 << 20;

/// A tcp target named "target" with a region "kv" of `LEN` bytes holding `fill`.
fn target(shm: bool, fill: u8) -> (Agent, Region<'static>) {
    let t = Agent::new(AgentConfig {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        ..config("target", shm)
    })
    .unwrap();
    let mut r = t.alloc(LEN, Access::READ_WRITE, Some("kv")).unwrap();
    r.bytes_mut().unwrap().fill(fill);
    (t, r)
}

/// A client whose tcp transfers go in 64 KiB chunks over one stream: many chunks, so a
/// cancel lands between them.
fn client(shm: bool) -> Agent {
    Agent::new(AgentConfig {
        chunk_bytes: 64 << 10,
        tcp_streams: 1,
        io_timeout: Duration::from_secs(10),
        ..config("me", shm)
    })
    .unwrap()
}

/// Waits (at most 20 s) until `h` has landed some bytes, and returns how many.
fn until_some_bytes(h: &TransferHandle) -> u64 {
    let until = Instant::now() + Duration::from_secs(20);
    while h.bytes_done() == 0 {
        assert!(Instant::now() < until, "no byte landed in 20 s");
        std::thread::sleep(Duration::from_millis(5));
    }
    h.bytes_done()
}

/// What a cancelled transfer says afterwards, everywhere: `Cancelled`, by name.
fn assert_cancelled(h: &TransferHandle) {
    assert!(
        matches!(h.wait(WAIT), Err(Error::Cancelled)),
        "wait after cancel"
    );
    assert_eq!(
        h.status(),
        Status::Failed {
            reason: Error::Cancelled
        }
    );
    assert_eq!(h.cancel().unwrap_err(), Error::Cancelled, "a second cancel");
    assert!(Error::Cancelled.to_string().contains("cancelled"));
}

#[test]
fn a_tcp_write_cancelled_mid_transfer_stops_and_the_peer_goes_on() {
    let (t, kv) = target(false, 0);
    let relay = Relay::start("127.0.0.6", t.listen_addr().unwrap());
    let me = client(false);
    let peer = me.connect(relay.addr()).unwrap();
    assert_eq!(peer.route().transport, Path::Tcp, "{}", peer.route().reason);
    let remote = peer.region("kv").unwrap();
    let mut src = me.alloc(LEN, Access::LOCAL, None).unwrap();
    fill_pattern(&mut src.bytes_mut().unwrap(), 3);
    relay.set_rate(Some(1 << 20));
    let mut t1 = Transfer::new();
    t1.write(&src, 0, &remote, 0, LEN).notify("must not arrive");
    let h = peer.submit(t1).unwrap();
    until_some_bytes(&h);
    let err = h.cancel().unwrap_err();
    assert_eq!(err, Error::Cancelled, "{err}");
    assert_cancelled(&h);
    let done = h.bytes_done();
    assert!(done > 0 && done < LEN, "{done} of {LEN} bytes confirmed");
    assert!(
        h.op_results()
            .iter()
            .all(|o| o.status == OpStatus::Failed(Error::Cancelled)),
        "{:?}",
        h.op_results()
    );
    // The source can go at once: nothing of this process reads it any more.
    drop(src);
    // The bytes confirmed before the cancel are in place (one stream: in order).
    let want = pattern(LEN as usize, 3);
    assert_eq!(
        first_diff(
            &kv.bytes().unwrap()[..done as usize],
            &want[..done as usize]
        ),
        None
    );
    // The same peer goes on: the abandoned chunks' replies are read and dropped first, and the
    // next transfer's bytes land.
    relay.set_rate(None);
    let mut src2 = me.alloc(4096, Access::LOCAL, None).unwrap();
    fill_pattern(&mut src2.bytes_mut().unwrap(), 9);
    let mut t2 = Transfer::new();
    t2.write(&src2, 0, &remote, LEN - 4096, 4096);
    peer.submit(t2).unwrap().wait(WAIT).unwrap();
    assert_eq!(
        first_diff(
            &kv.bytes().unwrap()[(LEN - 4096) as usize..],
            &pattern(4096, 9)
        ),
        None
    );
    // The cancel did not wait for the chunks in flight (the window was full at 1 MiB/s): the
    // one after the confirmed bytes was already handed to the kernel, and has landed since.
    let next = done as usize..done as usize + (64 << 10);
    assert_eq!(
        first_diff(&kv.bytes().unwrap()[next.clone()], &want[next]),
        None,
        "the chunk in flight at the cancel"
    );
    assert!(
        matches!(
            t.wait_notification(Duration::from_millis(200)),
            Err(Error::Timeout(_))
        ),
        "a cancelled transfer's notification arrived"
    );
}

#[test]
fn a_tcp_read_cancelled_mid_transfer_writes_nothing_more_into_the_region() {
    let (t, mut kv) = target(false, 0);
    fill_pattern(&mut kv.bytes_mut().unwrap(), 4);
    let relay = Relay::start("127.0.0.7", t.listen_addr().unwrap());
    let me = client(false);
    let peer = me.connect(relay.addr()).unwrap();
    let remote = peer.region("kv").unwrap();
    let mut dst = me.alloc(LEN, Access::LOCAL, None).unwrap();
    dst.bytes_mut().unwrap().fill(0xEE);
    relay.set_rate(Some(1 << 20));
    let mut t1 = Transfer::new();
    t1.read(&dst, 0, &remote, 0, LEN);
    let h = peer.submit(t1).unwrap();
    until_some_bytes(&h);
    assert_eq!(h.cancel().unwrap_err(), Error::Cancelled);
    assert_cancelled(&h);
    let done = h.bytes_done() as usize;
    let after_cancel = dst.bytes().unwrap().to_vec();
    assert_eq!(
        first_diff(&after_cancel[..done], &pattern(done, 4)),
        None,
        "the bytes confirmed are the peer's"
    );
    // The abandoned chunks' payloads still come in; the next transfer on the stream reads
    // and drops them, and none of them reaches the region.
    relay.set_rate(None);
    let back = me.alloc(4096, Access::LOCAL, None).unwrap();
    let mut t2 = Transfer::new();
    t2.read(&back, 0, &remote, 0, 4096);
    peer.submit(t2).unwrap().wait(WAIT).unwrap();
    assert_eq!(first_diff(&back.bytes().unwrap(), &pattern(4096, 4)), None);
    assert_eq!(
        first_diff(&dst.bytes().unwrap(), &after_cancel),
        None,
        "a byte moved into the region after the cancel returned"
    );
    drop(dst);
}

#[test]
fn cancelling_an_ended_transfer_returns_its_result() {
    let (t0, kv) = target(false, 0);
    let me = client(false);
    let peer = me.connect(t0.listen_addr().unwrap()).unwrap();
    let remote = peer.region("kv").unwrap();
    let mut src = me.alloc(4096, Access::LOCAL, None).unwrap();
    fill_pattern(&mut src.bytes_mut().unwrap(), 5);
    let mut t = Transfer::new();
    t.write(&src, 0, &remote, 0, 4096);
    let h = peer.submit(t).unwrap();
    let r = h.wait(WAIT).unwrap();
    let c = h.cancel().unwrap();
    assert_eq!((c.bytes, r.bytes), (4096, 4096));
    assert!(h.cancel().is_ok(), "twice");
    assert_eq!(h.status(), Status::Completed);
    assert_eq!(
        first_diff(&kv.bytes().unwrap()[..4096], &pattern(4096, 5)),
        None
    );
    // A failed transfer keeps its own error (the region went before the write came).
    let gone = t0.alloc(4096, Access::READ_WRITE, Some("gone")).unwrap();
    let remote_gone = peer.region("gone").unwrap();
    drop(gone);
    let mut t = Transfer::new();
    t.write(&src, 0, &remote_gone, 0, 4096);
    let h = peer.submit(t).unwrap();
    let failed = h.wait(WAIT).unwrap_err();
    assert_ne!(failed, Error::Cancelled);
    assert_eq!(h.cancel().unwrap_err(), failed);
}

/// Over shm the initiator does every copy: an op the cancel stopped was never copied, so its
/// bytes at the peer are untouched, and a completed op's bytes are all there. `ops` ops of
/// `LEN / ops` bytes; the cancel comes once a first part landed, or after `first`.
fn shm_cancel(ops: u64, first: Duration) {
    let op = LEN / ops;
    let (t, kv) = target(true, 0);
    let me = client(true);
    let peer = me.connect(t.listen_addr().unwrap()).unwrap();
    assert_eq!(peer.route().transport, Path::Shm, "{}", peer.route().reason);
    let remote = peer.region("kv").unwrap();
    let mut src = me.alloc(LEN, Access::LOCAL, None).unwrap();
    fill_pattern(&mut src.bytes_mut().unwrap(), 6);
    let mut tr = Transfer::new();
    for i in 0..ops {
        tr.write(&src, i * op, &remote, i * op, op);
    }
    let h = peer.submit(tr).unwrap();
    // Only `bytes_done` is watched: `status` or `wait` would complete a transfer its waiters
    // drive (the ring's slots of up to 1,024 ops), copies included.
    let until = Instant::now() + first;
    while h.bytes_done() == 0 && Instant::now() < until {
        std::hint::spin_loop();
    }
    let res = h.cancel();
    let results = h.op_results();
    let want = pattern(LEN as usize, 6);
    let got = kv.bytes().unwrap();
    let (mut completed, mut cancelled) = (0, 0);
    for (i, o) in results.iter().enumerate() {
        let span = i * op as usize..(i + 1) * op as usize;
        match &o.status {
            OpStatus::Completed => {
                completed += 1;
                assert_eq!(first_diff(&got[span.clone()], &want[span]), None, "op {i}");
            }
            OpStatus::Failed(Error::Cancelled) => {
                cancelled += 1;
                assert!(
                    got[span].iter().all(|&b| b == 0),
                    "cancelled op {i} was copied"
                );
            }
            other => panic!("op {i}: {other:?}"),
        }
    }
    eprintln!("shm cancel of {ops} ops: {completed} completed, {cancelled} cancelled");
    match res {
        Err(Error::Cancelled) => {
            assert!(cancelled > 0);
            assert_cancelled(&h);
        }
        Ok(r) => assert_eq!((r.bytes, cancelled), (LEN, 0), "ended before the cancel"),
        Err(e) => panic!("{e}"),
    }
    drop(got);
    drop(src);
    // The same peer goes on.
    let mut src2 = me.alloc(4096, Access::LOCAL, None).unwrap();
    fill_pattern(&mut src2.bytes_mut().unwrap(), 8);
    let mut t2 = Transfer::new();
    t2.write(&src2, 0, &remote, 0, 4096);
    peer.submit(t2).unwrap().wait(WAIT).unwrap();
    assert_eq!(
        first_diff(&kv.bytes().unwrap()[..4096], &pattern(4096, 8)),
        None
    );
}

/// 1,024 ops (one ring transfer, its copies made by whoever completes it), cancelled right
/// after the submit.
#[test]
fn an_shm_ring_transfer_cancelled_at_once_copies_no_cancelled_op() {
    shm_cancel(1024, Duration::ZERO);
}

/// 4,096 ops: run by the connection's thread part by part; the cancel stops it between them.
#[test]
fn an_shm_transfer_cancelled_mid_transfer_copies_no_cancelled_op() {
    shm_cancel(4096, Duration::from_secs(20));
}
