//! A session's access ends with it: once the control connection ends (here: `Bye`), its data
//! streams and shm connections are shut down, no ring request is served and no stream read
//! answered. Once, ~17,000–30,000 ring requests were served after the close, and a joined data
//! stream kept answering `ReadData` after `Bye`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::raw::{self, closed, send};
use common::shm_raw::*;
use common::*;
use gdx_engine::wire::{Msg, ShmOp};
use gdx_engine::Access;
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// True once `u` reads EOF (false if it stays open for 10 s).
fn eof(u: &UnixStream) -> bool {
    u.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut b = [0u8; 256];
    loop {
        match (&*u).read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => {
                return !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                )
            }
        }
    }
}

#[test]
fn no_ring_request_is_served_after_the_session_ends() {
    let target = agent("target", true);
    let r = target.alloc(1 << 20, Access::READ_WRITE, None).unwrap();
    let d = r.desc();
    let (s, u, ring) = attach_ring(&target);
    let mut control = s.control;
    // Bye from another thread while this one keeps posting, as a hostile peer would.
    let bye = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        send(&mut control, &Msg::Bye);
        assert!(
            closed(&mut control),
            "the control connection stayed open after Bye"
        );
        eof(&u)
    });
    let op_at = |seq: u32| ShmOp {
        write: true,
        region: d.id,
        key: d.key,
        offset: u64::from(seq % (1 << 17)) * 8,
        len: 8,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seq = 0u32;
    let unserved = loop {
        assert!(
            Instant::now() < deadline,
            "the ring still served requests 30 s after Bye ({seq} served)"
        );
        let data = u64::from(seq).wrapping_add(0xa5a5_0000_0000).to_le_bytes();
        ring.post_short(seq, 8 | 1 << 8, &op_at(seq), &data);
        let slot = seq as usize % RING_SLOTS;
        if !ring.slot_reaches(slot, 2) {
            break seq;
        }
        seq += 1;
    };
    assert!(unserved > 0, "the ring served nothing before Bye");
    assert!(
        bye.join().unwrap(),
        "the shm connection stayed open after the session ended"
    );
    // The ring thread is gone: the pending request stays unserved and its bytes never land.
    std::thread::sleep(Duration::from_millis(500));
    let slot = unserved as usize % RING_SLOTS;
    assert_eq!(
        ring.word(4096 + slot * RING_SLOT)
            .load(std::sync::atomic::Ordering::SeqCst),
        1,
        "request {unserved} was answered after the session ended"
    );
    let at = op_at(unserved).offset as usize;
    let want = u64::from(unserved)
        .wrapping_add(0xa5a5_0000_0000)
        .to_le_bytes();
    assert_ne!(
        &r.bytes().unwrap()[at..at + 8],
        &want,
        "request {unserved} wrote the region after the session ended"
    );
    // Served requests did land (the ring worked until then).
    let at0 = op_at(0).offset as usize;
    assert_eq!(
        &r.bytes().unwrap()[at0..at0 + 8],
        &0xa5a5_0000_0000u64.to_le_bytes()
    );
}

#[test]
fn a_joined_stream_answers_no_read_after_bye() {
    let target = agent("target", false);
    let mut r = target.alloc(4096, Access::READ_WRITE, None).unwrap();
    fill_pattern(&mut r.bytes_mut().unwrap(), 9);
    let d = r.desc();
    let mut s = raw::login(addr(&target), &secret(&target));
    let mut stream = raw::join(addr(&target), &s, 0);
    let read = |chunk: u32| Msg::Read {
        xfer: 1,
        op: 0,
        chunk,
        region: d.id,
        key: d.key,
        offset: 0,
        len: 64,
    };
    send(&mut stream, &read(0));
    // The reply and its 64 payload bytes, read whole so nothing of them is left behind.
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    let (m, payload, n) = loop {
        if let Ok(Some((m, p, n))) = gdx_engine::wire::decode_frame(&buf) {
            if buf.len() >= n + p as usize {
                break (m, p, n);
            }
        }
        let got = stream.read(&mut tmp).unwrap();
        assert!(got > 0, "the stream closed while the session was open");
        buf.extend_from_slice(&tmp[..got]);
    };
    assert_eq!(
        m,
        Msg::ReadData {
            xfer: 1,
            op: 0,
            chunk: 0
        }
    );
    assert_eq!(payload, 64);
    assert_eq!(&buf[n..n + 64], &r.bytes().unwrap()[..64]);
    send(&mut s.control, &Msg::Bye);
    assert!(
        closed(&mut s.control),
        "the control connection stayed open after Bye"
    );
    // A read sent after the session ended gets no ReadData: the stream is shut down.
    let _ = std::io::Write::write_all(&mut stream, &gdx_engine::wire::encode(&read(1), 0));
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest);
    let mut at = 0;
    while let Ok(Some((m, payload, n))) = gdx_engine::wire::decode_frame(&rest[at..]) {
        assert!(
            !matches!(m, Msg::ReadData { chunk: 1, .. }),
            "ReadData answered after Bye"
        );
        at += n + payload as usize;
        if at >= rest.len() {
            break;
        }
    }
}
