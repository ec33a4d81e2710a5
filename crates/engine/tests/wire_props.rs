//! Property tests for the frame decoder: arbitrary bytes never panic and never decode past the
//! input; every message round-trips; every header rejection is the named error.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

use gdx_engine::wire::{
    self, decode_frame, decode_header, encode, Hello, Msg, ShmOp, HEADER_LEN, MAX_BODY, MAX_PAYLOAD,
};
use gdx_engine::{Access, Error, Location, RegionDesc, RegionKey};
use proptest::prelude::*;

fn arb_desc() -> impl Strategy<Value = RegionDesc> {
    (
        any::<u64>(),
        any::<u128>(),
        any::<u64>(),
        0u8..4,
        any::<u32>(),
        0u8..4,
        any::<bool>(),
        proptest::option::of("[a-z]{0,12}"),
        proptest::option::of((any::<u32>(), any::<u64>(), any::<u64>(), "[0-9a-f]{0,128}")),
    )
        .prop_map(
            |(id, key, len, loc, n, acc, shareable, name, ipc)| RegionDesc {
                id,
                key: RegionKey(key),
                len,
                location: match loc {
                    0 => Location::Host,
                    1 => Location::PinnedHost,
                    2 => Location::Gpu(n),
                    _ => Location::File,
                },
                access: Access {
                    remote_read: acc & 1 != 0,
                    remote_write: acc & 2 != 0,
                },
                shareable,
                name,
                ipc: ipc.map(|(pid, region, len, handle)| gdx_engine::IpcDesc {
                    host_id: format!("{region:032x}"),
                    pid,
                    region,
                    pci_bus_id: "00000000:07:00.0".into(),
                    len,
                    posix_fd_alloc_len: handle.is_empty().then_some(len | 0xfff),
                    handle,
                    offset: len / 2,
                    alloc_len: len.saturating_mul(2),
                    pieces: vec![len, len],
                }),
                no_ipc: None,
            },
        )
}

fn arb_err() -> impl Strategy<Value = Error> {
    prop_oneof![
        ("[ -~]{0,40}", proptest::option::of(0..i32::MAX))
            .prop_map(|(reason, errno)| Error::PeerLost { reason, errno }),
        any::<u64>().prop_map(|region| Error::BadKey { region }),
        any::<u64>().prop_map(|region| Error::NoSuchRegion { region }),
        (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(offset, len, region_len)| {
            Error::OutOfBounds {
                offset,
                len,
                region_len,
            }
        }),
        any::<u64>().prop_map(|region| Error::ReadOnly { region }),
        any::<u64>().prop_map(|region| Error::NotReadable { region }),
        (any::<u64>(), any::<u64>()).prop_map(|(len, limit)| Error::FrameTooLarge { len, limit }),
        any::<u8>().prop_map(Error::UnknownVersion),
        "[ -~]{0,40}".prop_map(Error::Malformed),
    ]
}

fn arb_msg() -> impl Strategy<Value = Msg> {
    let key = any::<u128>().prop_map(RegionKey);
    prop_oneof![
        (
            "[ -~]{0,30}",
            any::<u128>(),
            any::<u128>(),
            any::<u32>(),
            proptest::option::of("[a-z0-9-]{0,40}"),
            proptest::option::of("[0-9.:]{0,21}"),
            any::<u128>(),
            any::<u128>(),
            any::<u16>(),
            any::<u128>(),
            "[ -~]{0,30}"
        )
            .prop_map(
                |(
                    agent_name,
                    agent_id,
                    host_id,
                    transports,
                    shm_socket,
                    listen,
                    session,
                    token,
                    streams,
                    nonce,
                    cluster,
                )| Msg::Hello(Hello {
                    agent_name,
                    agent_id,
                    host_id,
                    transports,
                    shm_socket,
                    listen,
                    session,
                    token,
                    streams,
                    nonce,
                    cluster
                })
            ),
        (any::<u128>(), any::<u128>(), any::<u16>(), any::<u128>()).prop_map(
            |(session, token, stream, nonce)| Msg::Join {
                session,
                token,
                stream,
                nonce,
            }
        ),
        (any::<u128>(), any::<u128>(), any::<u128>()).prop_map(|(session, token, nonce)| {
            Msg::ShmJoin {
                session,
                token,
                nonce,
            }
        }),
        (any::<u128>(), any::<[u8; 32]>()).prop_map(|(nonce, mac)| Msg::Challenge { nonce, mac }),
        any::<[u8; 32]>().prop_map(|mac| Msg::Auth { mac }),
        (any::<u128>(), proptest::collection::vec(any::<u8>(), 33)).prop_map(|(nonce, m)| {
            Msg::Pake {
                nonce,
                msg: m.try_into().unwrap_or([0; 33]),
            }
        }),
        (
            proptest::collection::vec(any::<u8>(), 33),
            any::<[u8; 32]>()
        )
            .prop_map(|(m, mac)| {
                Msg::PakeAuth {
                    msg: m.try_into().unwrap_or([0; 33]),
                    mac,
                }
            }),
        (any::<u32>(), any::<u32>())
            .prop_map(|(slots, slot_bytes)| Msg::ShmRing { slots, slot_bytes }),
        (any::<u64>(), any::<u128>(), "[ -~]{0,30}").prop_map(|(region, key, device)| {
            Msg::RdmaRegionOn {
                region,
                key: RegionKey(key),
                device,
            }
        }),
        Just(Msg::Ok),
        Just(Msg::Bye),
        Just(Msg::ListRegions),
        arb_err().prop_map(Msg::Err),
        "[ -~]{0,30}".prop_map(|name| Msg::GetRegion { name }),
        arb_desc().prop_map(Msg::Region),
        proptest::collection::vec(arb_desc(), 0..5).prop_map(Msg::Regions),
        (
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
            key.clone(),
            any::<u64>()
        )
            .prop_map(|(xfer, op, chunk, region, key, offset)| Msg::Write {
                xfer,
                op,
                chunk,
                region,
                key,
                offset
            }),
        (any::<u64>(), any::<u32>(), any::<u32>()).prop_map(|(xfer, op, chunk)| Msg::WriteAck {
            xfer,
            op,
            chunk
        }),
        (
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
            key.clone(),
            any::<u64>(),
            any::<u32>()
        )
            .prop_map(|(xfer, op, chunk, region, key, offset, len)| Msg::Read {
                xfer,
                op,
                chunk,
                region,
                key,
                offset,
                len
            }),
        (any::<u64>(), any::<u32>(), any::<u32>(), arb_err()).prop_map(|(xfer, op, chunk, err)| {
            Msg::OpErr {
                xfer,
                op,
                chunk,
                err,
            }
        }),
        (any::<u64>(), proptest::collection::vec(any::<u8>(), 0..100))
            .prop_map(|(xfer, data)| Msg::Notify { xfer, data }),
        (
            any::<u64>(),
            proptest::collection::vec(
                (
                    any::<bool>(),
                    any::<u64>(),
                    any::<u128>(),
                    any::<u64>(),
                    any::<u64>()
                ),
                0..20
            )
        )
            .prop_map(|(xfer, ops)| Msg::ShmBegin {
                xfer,
                ops: ops
                    .into_iter()
                    .map(|(write, region, k, offset, len)| ShmOp {
                        write,
                        region,
                        key: RegionKey(k),
                        offset,
                        len
                    })
                    .collect()
            }),
        proptest::collection::vec((any::<u32>(), arb_err()), 0..5)
            .prop_map(|errors| Msg::ShmBeginResult { errors }),
        (
            any::<u64>(),
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..50))
        )
            .prop_map(|(xfer, notify)| Msg::ShmEnd { xfer, notify }),
        (any::<u64>(), key.clone(), any::<bool>(), any::<u32>()).prop_map(
            |(region, key, write, piece)| Msg::ShmMap {
                region,
                key,
                write,
                piece
            }
        ),
        proptest::collection::vec(any::<u8>(), 0..300).prop_map(|data| Msg::RdmaConnect { data }),
        (any::<u64>(), key, any::<bool>()).prop_map(|(region, key, write)| Msg::RdmaRegion {
            region,
            key,
            write
        }),
        (any::<u64>(), any::<u64>(), any::<u32>(), "[a-z -]{0,30}").prop_map(
            |(addr, len, rkey, mechanism)| Msg::RdmaRegionInfo {
                addr,
                len,
                rkey,
                mechanism
            }
        ),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(Some((_, _, used))) = decode_frame(&bytes) {
            prop_assert!(used <= bytes.len());
        }
    }

    #[test]
    fn arbitrary_body_after_valid_header(kind in 1u8..=22, body in proptest::collection::vec(any::<u8>(), 0..300)) {
        let mut f = vec![0u8; HEADER_LEN];
        f[0..2].copy_from_slice(&wire::MAGIC.to_le_bytes());
        f[2] = wire::VERSION;
        f[3] = kind;
        f[4..8].copy_from_slice(&(body.len() as u32).to_le_bytes());
        f.extend_from_slice(&body);
        match decode_frame(&f) {
            Ok(Some((m, 0, used))) => { prop_assert_eq!(used, f.len()); prop_assert_eq!(m.kind(), kind); }
            Ok(other) => prop_assert!(false, "unexpected {:?}", other),
            Err(e) => prop_assert!(matches!(e, Error::Malformed(_) | Error::UnknownFrame(_)), "{:?}", e),
        }
    }

    #[test]
    fn messages_roundtrip(msg in arb_msg(), payload in 0u32..1000) {
        let payload = if matches!(msg, Msg::Write { .. } | Msg::ReadData { .. }) { payload } else { 0 };
        let f = encode(&msg, payload);
        let (back, p, used) = decode_frame(&f).unwrap().unwrap();
        prop_assert_eq!(back, msg);
        prop_assert_eq!(p, payload);
        prop_assert_eq!(used, f.len());
        // Every strict prefix asks for more bytes instead of failing or panicking.
        for cut in [0, 1, HEADER_LEN - 1, HEADER_LEN, f.len().saturating_sub(1)] {
            if cut < f.len() {
                prop_assert!(matches!(decode_frame(&f[..cut]), Ok(None)), "prefix {}", cut);
            }
        }
    }

    #[test]
    fn corrupted_byte_never_panics_the_decoder(msg in arb_msg(), pos in any::<prop::sample::Index>(), val in any::<u8>()) {
        let mut f = encode(&msg, 0);
        let i = pos.index(f.len());
        f[i] = val;
        // The claim is only that no byte value panics the decoder: a corrupted frame may be
        // refused or may decode to another valid message (a changed payload byte, say).
        let _ = decode_frame(&f);
    }

    #[test]
    fn header_limits(body_len in any::<u32>(), payload_len in any::<u32>(), version in any::<u8>(), magic in any::<u16>()) {
        let mut h = [0u8; HEADER_LEN];
        h[0..2].copy_from_slice(&magic.to_le_bytes());
        h[2] = version;
        h[3] = 9; // Write: may carry a payload
        h[4..8].copy_from_slice(&body_len.to_le_bytes());
        h[8..12].copy_from_slice(&payload_len.to_le_bytes());
        let r = decode_header(&h);
        if magic != wire::MAGIC {
            prop_assert_eq!(r, Err(Error::BadMagic(magic)));
        } else if version != wire::VERSION {
            prop_assert_eq!(r, Err(Error::UnknownVersion(version)));
        } else if body_len > MAX_BODY || payload_len > MAX_PAYLOAD {
            prop_assert!(matches!(r, Err(Error::FrameTooLarge { .. })), "{:?}", r);
        } else {
            prop_assert!(r.is_ok());
        }
    }
}

#[test]
fn named_header_rejections() {
    let good = encode(&Msg::Ok, 0);
    // Version 1 (before descriptors carried IPC handles) and the next, unknown one.
    for v in [1, wire::VERSION + 1] {
        let mut f = good.clone();
        f[2] = v;
        assert_eq!(decode_frame(&f), Err(Error::UnknownVersion(v)));
    }
    let mut f = good.clone();
    f[3] = 200;
    assert_eq!(decode_frame(&f), Err(Error::UnknownFrame(200)));
    let mut f = good.clone();
    f[4..8].copy_from_slice(&(MAX_BODY + 1).to_le_bytes());
    assert!(matches!(decode_frame(&f), Err(Error::FrameTooLarge { .. })));
    let mut f = good.clone();
    f[8..12].copy_from_slice(&1u32.to_le_bytes());
    assert!(
        matches!(decode_frame(&f), Err(Error::Malformed(_))),
        "payload on Ok"
    );
    let mut f = good;
    f[0] = 0;
    assert!(matches!(decode_frame(&f), Err(Error::BadMagic(_))));
    // A hostile count cannot make the decoder allocate.
    let mut f = encode(&Msg::Regions(vec![]), 0);
    let n = f.len();
    f[n - 4..].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(decode_frame(&f), Err(Error::Malformed(_))));
}
