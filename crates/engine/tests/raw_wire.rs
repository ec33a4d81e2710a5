//! Hostile bytes on real sockets: each header rejection comes back as the named error in an `Err`
//! frame and the connection is closed; a forged data stream without an authenticated session is
//! refused; a write frame aimed at a read-only region never touches its memory.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::*;
use gdx_engine::wire::{self, encode, Msg, HEADER_LEN, MAX_BODY, MAX_PAYLOAD};
use gdx_engine::{Access, Error, RegionKey};
use std::io::Write;
use std::net::TcpStream;

fn read_reply(s: &mut TcpStream) -> Option<Msg> {
    raw::read_msg(s)
}

fn closed(s: &mut TcpStream) -> bool {
    raw::closed(s)
}

fn header(version: u8, kind: u8, body: u32, payload: u32) -> Vec<u8> {
    let mut h = vec![0u8; HEADER_LEN];
    h[0..2].copy_from_slice(&gdx_engine::wire::MAGIC.to_le_bytes());
    h[2] = version;
    h[3] = kind;
    h[4..8].copy_from_slice(&body.to_le_bytes());
    h[8..12].copy_from_slice(&payload.to_le_bytes());
    h
}

fn expect_rejection(bytes: &[u8], want: impl Fn(&Error) -> bool) {
    let target = agent("target", false);
    let mut s = TcpStream::connect(target.listen_addr().unwrap()).unwrap();
    s.write_all(bytes).unwrap();
    match read_reply(&mut s) {
        Some(Msg::Err(e)) => assert!(want(&e), "got {e:?}"),
        other => panic!("expected an Err frame, got {other:?}"),
    }
    assert!(
        closed(&mut s),
        "connection should be closed after a fatal frame"
    );
}

#[test]
fn unknown_version_is_rejected() {
    expect_rejection(&header(9, 1, 0, 0), |e| *e == Error::UnknownVersion(9));
}

#[test]
fn oversize_body_is_rejected() {
    expect_rejection(&header(wire::VERSION, 1, MAX_BODY + 1, 0), |e| {
        matches!(e, Error::FrameTooLarge { .. })
    });
}

#[test]
fn oversize_payload_is_rejected() {
    expect_rejection(&header(wire::VERSION, 9, 0, MAX_PAYLOAD + 1), |e| {
        matches!(e, Error::FrameTooLarge { .. })
    });
}

#[test]
fn unknown_frame_type_is_rejected() {
    expect_rejection(&header(wire::VERSION, 99, 0, 0), |e| {
        *e == Error::UnknownFrame(99)
    });
}

#[test]
fn bad_magic_is_rejected() {
    expect_rejection(&[0u8; HEADER_LEN], |e| matches!(e, Error::BadMagic(0)));
}

#[test]
fn data_stream_without_token_is_refused() {
    let bytes = encode(
        &Msg::Join {
            session: 1,
            token: 2,
            stream: 0,
            nonce: 3,
        },
        0,
    );
    expect_rejection(&bytes, |e| matches!(e, Error::AuthFailed { .. }));
}

/// Joins a real session by hand, then sends raw Write frames.
#[test]
fn raw_writes_are_checked_before_memory_is_touched() {
    let target = agent("target", false);
    let mut ro = target.alloc(4096, Access::READ, Some("ro")).unwrap();
    ro.bytes_mut().unwrap().fill(0x11);
    let mut rw = target.alloc(4096, Access::READ_WRITE, Some("rw")).unwrap();
    rw.bytes_mut().unwrap().fill(0x22);
    let (ro_d, rw_d) = (ro.desc(), rw.desc());
    let addr = target.listen_addr().unwrap();

    let session = raw::login(addr, target.secret().unwrap().as_bytes());
    let mut data = raw::join(addr, &session, 0);

    let send_write =
        |s: &mut TcpStream, region: u64, key: RegionKey, offset: u64, payload: &[u8]| {
            let m = Msg::Write {
                xfer: 1,
                op: 0,
                chunk: 0,
                region,
                key,
                offset,
            };
            let mut f = encode(&m, payload.len() as u32);
            f.extend_from_slice(payload);
            s.write_all(&f).unwrap();
            read_reply(s)
        };
    let junk = [0xFFu8; 64];
    let cases: Vec<(u64, RegionKey, u64, Error)> = vec![
        (ro_d.id, ro_d.key, 0, Error::ReadOnly { region: ro_d.id }),
        (
            rw_d.id,
            RegionKey(rw_d.key.0 ^ (1 << 100)),
            0,
            Error::BadKey { region: rw_d.id },
        ),
        (
            rw_d.id,
            rw_d.key,
            4095,
            Error::OutOfBounds {
                offset: 4095,
                len: 64,
                region_len: 4096,
            },
        ),
        (
            rw_d.id,
            rw_d.key,
            u64::MAX - 10,
            Error::OutOfBounds {
                offset: u64::MAX - 10,
                len: 64,
                region_len: 4096,
            },
        ),
        (12345, rw_d.key, 0, Error::NoSuchRegion { region: 12345 }),
    ];
    for (region, key, offset, want) in cases {
        match send_write(&mut data, region, key, offset, &junk) {
            Some(Msg::OpErr { err, .. }) => assert_eq!(err, want),
            other => panic!("expected OpErr({want:?}), got {other:?}"),
        }
    }
    // The stream stayed in sync through the rejected payloads: a valid write still works.
    assert_eq!(
        send_write(&mut data, rw_d.id, rw_d.key, 100, &junk),
        Some(Msg::WriteAck {
            xfer: 1,
            op: 0,
            chunk: 0
        })
    );
    assert!(ro.bytes().unwrap().iter().all(|&b| b == 0x11));
    let rw_bytes = rw.bytes().unwrap();
    assert!(rw_bytes[..100]
        .iter()
        .chain(&rw_bytes[164..])
        .all(|&b| b == 0x22));
    assert!(rw_bytes[100..164].iter().all(|&b| b == 0xFF));
}

/// A `WriteBatch` by hand: each entry is checked on its own; the refused ones (read-only,
/// bad key, out of bounds) are named in the one `WriteBatchAck` and their bytes drained, the
/// others land; a `ReadBatch` answers the accepted entries' bytes back to back.
#[test]
fn raw_batches_check_each_entry_and_land_the_rest() {
    use gdx_engine::wire::BatchEntry;
    let target = agent("target", false);
    let mut ro = target.alloc(4096, Access::READ, Some("ro")).unwrap();
    ro.bytes_mut().unwrap().fill(0x11);
    let mut rw = target.alloc(4096, Access::READ_WRITE, Some("rw")).unwrap();
    rw.bytes_mut().unwrap().fill(0x22);
    let (ro_d, rw_d) = (ro.desc(), rw.desc());
    let addr = target.listen_addr().unwrap();
    let session = raw::login(addr, target.secret().unwrap().as_bytes());
    let mut data = raw::join(addr, &session, 0);
    let e = |op: u32, region: u64, key: RegionKey, offset: u64| BatchEntry {
        op,
        chunk: 0,
        region,
        key,
        offset,
        len: 64,
    };
    let entries = vec![
        e(0, rw_d.id, rw_d.key, 0),
        e(1, ro_d.id, ro_d.key, 0),
        e(2, rw_d.id, RegionKey(rw_d.key.0 ^ 1), 64),
        e(3, rw_d.id, rw_d.key, 4090),
        e(4, rw_d.id, rw_d.key, 128),
    ];
    let mut payload = Vec::new();
    for k in 0..5u8 {
        payload.extend_from_slice(&[0xA0 + k; 64]);
    }
    let m = Msg::WriteBatch {
        xfer: 9,
        entries: entries.clone(),
    };
    let mut f = encode(&m, payload.len() as u32);
    f.extend_from_slice(&payload);
    data.write_all(&f).unwrap();
    let want = vec![
        (1, Error::ReadOnly { region: ro_d.id }),
        (2, Error::BadKey { region: rw_d.id }),
        (
            3,
            Error::OutOfBounds {
                offset: 4090,
                len: 64,
                region_len: 4096,
            },
        ),
    ];
    assert_eq!(
        read_reply(&mut data),
        Some(Msg::WriteBatchAck {
            xfer: 9,
            errors: want.clone()
        })
    );
    {
        let b = rw.bytes().unwrap();
        assert!(b[..64].iter().all(|&x| x == 0xA0));
        assert!(b[128..192].iter().all(|&x| x == 0xA4));
        assert!(b[64..128].iter().chain(&b[192..]).all(|&x| x == 0x22));
        assert!(ro.bytes().unwrap().iter().all(|&x| x == 0x11));
    }
    // Read the same entries back: the refused ones (ro is readable, so only 2 and 3 now)
    // are named, the rest come back to back.
    data.write_all(&encode(&Msg::ReadBatch { xfer: 10, entries }, 0))
        .unwrap();
    data.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let mut got = Vec::new();
    let mut tmp = [0u8; 4096];
    let (msg, body_end, pay) = loop {
        if let Ok(Some((m, pay, used))) = gdx_engine::wire::decode_frame(&got) {
            break (m, used, pay);
        }
        let n = std::io::Read::read(&mut data, &mut tmp).unwrap();
        assert!(n > 0, "the stream closed");
        got.extend_from_slice(&tmp[..n]);
    };
    let Msg::ReadBatchData { xfer: 10, errors } = msg else {
        panic!("{msg:?}")
    };
    assert_eq!(errors, want[1..].to_vec());
    assert_eq!(pay, 3 * 64);
    while got.len() < body_end + 3 * 64 {
        let n = std::io::Read::read(&mut data, &mut tmp).unwrap();
        got.extend_from_slice(&tmp[..n]);
    }
    let bytes = &got[body_end..body_end + 3 * 64];
    assert!(bytes[..64].iter().all(|&x| x == 0xA0));
    assert!(bytes[64..128].iter().all(|&x| x == 0x11));
    assert!(bytes[128..].iter().all(|&x| x == 0xA4));
}

#[test]
fn reconnect_after_close() {
    let target = agent("target", true);
    let init = agent("init", false);
    let _r = target.alloc(4096, Access::READ_WRITE, Some("r")).unwrap();
    let peer = init.connect(target.listen_addr().unwrap()).unwrap();
    let remote = peer.region("r").unwrap();
    peer.close();
    let src = init.alloc(16, Access::LOCAL, None).unwrap();
    let mut t = gdx_engine::Transfer::new();
    t.write(&src, 0, &remote, 0, 16);
    assert!(matches!(peer.submit(t), Err(Error::PeerLost { .. })));
    let peer = peer.reconnect().unwrap();
    let mut t = gdx_engine::Transfer::new();
    t.write(&src, 0, &remote, 0, 16);
    peer.submit(t).unwrap().wait(WAIT).unwrap();
}
