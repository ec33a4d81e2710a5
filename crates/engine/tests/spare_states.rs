//! Fresh transfers after fresh transfers: an ended transfer's state is reused by the peer's next
//! submit (`transfer/spare.rs`), so nothing of one transfer may show in the next — its ops,
//! results, failure, notification or bytes — and a spare never keeps a region's memory alive.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::*;
use gdx_engine::{Access, OpKind, OpStatus, Transfer};

/// Mappings of this process whose memfd has `name` (`/proc/self/maps`).
fn mappings_of(name: &str) -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let tag = format!("/memfd:gdx:{name} ");
    maps.lines().filter(|l| l.contains(&tag)).count()
}

/// 300 fresh transfers of changing shapes on one peer (shm and tcp): one-op writes and reads
/// of 8 B to 100 KiB, three-op batches mixing both, a notification, and a write to a region
/// the target freed (failed) before the next: each report holds exactly its own ops, lengths,
/// kinds and outcomes, and every byte is the source's.
fn shapes_in_turn(shm: bool) {
    let target = agent("target", true);
    let init = agent("init", shm);
    let mut dst = target
        .alloc(1 << 20, Access::READ_WRITE, Some("dst"))
        .unwrap();
    let gone = target
        .alloc(4096, Access::READ_WRITE, Some("gone"))
        .unwrap();
    let peer = init.connect(target.listen_addr().unwrap()).unwrap();
    let remote = peer.region("dst").unwrap();
    let gone_desc = peer.region("gone").unwrap();
    drop(gone);
    let mut src = init.alloc(1 << 20, Access::LOCAL, None).unwrap();
    let back = init.alloc(1 << 20, Access::LOCAL, None).unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..300u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        fill_pattern(&mut src.bytes_mut().unwrap()[..], i);
        fill_pattern(&mut dst.bytes_mut().unwrap()[512 << 10..], 7000 + i);
        let len = [8u64, 4096, 100 << 10][(x % 3) as usize];
        let mut t = Transfer::new();
        // (kind, len) of each op, in order.
        let mut want: Vec<(OpKind, u64)> = Vec::new();
        match (x >> 8) % 4 {
            0 => {
                t.write(&src, 0, &remote, 0, len);
                want.push((OpKind::Write, len));
            }
            1 => {
                t.read(&back, 0, &remote, 512 << 10, len);
                want.push((OpKind::Read, len));
            }
            2 => {
                t.write(&src, 0, &remote, 0, len);
                t.read(&back, 0, &remote, 512 << 10, 16);
                t.write(&src, 4096, &remote, 300 << 10, 100);
                want.extend([
                    (OpKind::Write, len),
                    (OpKind::Read, 16),
                    (OpKind::Write, 100),
                ]);
            }
            _ => {
                t.write(&src, 0, &remote, 0, len);
                t.notify(format!("n{i}"));
                want.push((OpKind::Write, len));
            }
        }
        let rep = peer.submit(t).unwrap().wait(WAIT).unwrap();
        assert_eq!(rep.ops.len(), want.len(), "transfer {i}");
        assert_eq!(
            rep.bytes,
            want.iter().map(|w| w.1).sum::<u64>(),
            "transfer {i}"
        );
        for (o, w) in rep.ops.iter().zip(&want) {
            assert_eq!((o.kind, o.len), *w, "transfer {i}");
            assert_eq!(o.status, OpStatus::Completed, "transfer {i}");
        }
        let (d, s, b) = (
            dst.bytes().unwrap(),
            src.bytes().unwrap(),
            back.bytes().unwrap(),
        );
        for (k, w) in want.iter().enumerate() {
            let n = w.1 as usize;
            let ok = match ((x >> 8) % 4, k, w.0) {
                (2, 2, _) => first_diff(&d[300 << 10..(300 << 10) + n], &s[4096..4096 + n]),
                (_, _, OpKind::Write) => first_diff(&d[..n], &s[..n]),
                (_, _, OpKind::Read) => first_diff(&b[..n], &d[512 << 10..(512 << 10) + n]),
            };
            assert_eq!(ok, None, "transfer {i} op {k}");
        }
        if (x >> 8) % 4 == 3 {
            let note = target.wait_notification(WAIT).unwrap();
            assert_eq!(note.data, format!("n{i}").into_bytes(), "transfer {i}");
        }
        if i % 50 == 25 {
            // A failed transfer, then the next must start clean.
            let mut t = Transfer::new();
            t.write(&src, 0, &gone_desc, 0, 8);
            let err = peer.submit(t).unwrap().wait(WAIT);
            assert!(err.is_err(), "a write to a freed region failed: {err:?}");
        }
    }
    assert!(target.try_notification().is_none(), "no notification twice");
}

#[test]
fn shm_transfers_after_transfers_carry_nothing_over() {
    shapes_in_turn(true);
}

#[test]
fn tcp_transfers_after_transfers_carry_nothing_over() {
    shapes_in_turn(false);
}

/// A region used by transfers that ended (their states now spares of the peer) is unmapped
/// when the caller drops it; and a dropped peer leaves no mapping of its own behind either.
#[test]
fn spare_states_keep_no_region_alive() {
    let target = agent("target", true);
    let init = agent("init", true);
    let _dst = target
        .alloc(1 << 16, Access::READ_WRITE, Some("dst"))
        .unwrap();
    let peer = init.connect(target.listen_addr().unwrap()).unwrap();
    let remote = peer.region("dst").unwrap();
    let name = format!("spare-src-{}", std::process::id());
    let before = mappings_of(&name);
    let src = init.alloc(1 << 16, Access::LOCAL, Some(&name)).unwrap();
    assert_eq!(mappings_of(&name), before + 1);
    let handles: Vec<_> = (0..8)
        .map(|k| {
            let mut t = Transfer::new();
            t.write(&src, k * 8, &remote, k * 8, 8);
            peer.submit(t).unwrap()
        })
        .collect();
    for h in handles {
        h.wait(WAIT).unwrap();
    }
    drop(src);
    // The connection's worker may still be finishing the completion pass that ended the last
    // transfer (its state holds the region until that pass lets go): wait for it, bounded.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while mappings_of(&name) != before && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(mappings_of(&name), before, "the region was unmapped");
    drop(peer);
}
