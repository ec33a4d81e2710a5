//! Two agents in one process: both transports, writes and reads, borrowed and owned regions,
//! batches, notifications, and every rejection.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::*;
use gdx_engine::{Access, Error, OpStatus, Path, Status, Transfer};
use std::time::Duration;

fn roundtrip(shm: bool, len: usize, expect: Path) {
    let target = agent("target", true);
    let init = agent("init", shm);
    let mut dst = target
        .alloc(len as u64 + 64, Access::READ_WRITE, Some("dst"))
        .unwrap();
    let peer = init.connect(target.listen_addr().unwrap()).unwrap();
    assert_eq!(
        peer.route().transport,
        if expect == Path::Tcp {
            Path::Tcp
        } else {
            Path::Shm
        },
        "{:?}",
        peer.route()
    );
    assert_eq!(peer.info().name, "target");
    let remote = peer.region("dst").unwrap();
    assert_eq!(remote, dst.desc());

    let data = pattern(len, len as u64);
    let mut src = init.alloc(len as u64 + 16, Access::LOCAL, None).unwrap();
    src.bytes_mut().unwrap()[3..3 + len].copy_from_slice(&data);
    let mut t = Transfer::new();
    t.write(&src, 3, &remote, 7, len as u64).notify("written");
    let h = peer.submit(t).unwrap();
    let rep = h.wait(WAIT).unwrap();
    assert_eq!(h.status(), Status::Completed);
    assert_eq!(rep.bytes, len as u64);
    assert_eq!(rep.ops[0].plan.path, expect, "{}", rep.ops[0].plan);
    assert!(!rep.ops[0].plan.reason.is_empty());
    assert!(
        dst.bytes().unwrap()[7..7 + len] == data[..],
        "written bytes differ"
    );
    let n = target.wait_notification(Duration::from_secs(10)).unwrap();
    assert_eq!(n.data, b"written");

    // Change the remote bytes locally, read them back into another region.
    let data2 = pattern(len, 99 + len as u64);
    dst.bytes_mut().unwrap()[5..5 + len].copy_from_slice(&data2);
    let back = init.alloc(len as u64 + 1, Access::LOCAL, None).unwrap();
    let mut t = Transfer::new();
    t.read(&back, 1, &remote, 5, len as u64);
    let rep = peer.submit(t).unwrap().wait(WAIT).unwrap();
    assert_eq!(rep.ops[0].plan.path, expect);
    assert!(
        back.bytes().unwrap()[1..1 + len] == data2[..],
        "read bytes differ"
    );
}

#[test]
fn tcp_roundtrip_small_and_unaligned() {
    for len in [1, 3, 4095, 65_537, 3 << 20] {
        roundtrip(false, len, Path::Tcp);
    }
}

#[test]
fn tcp_roundtrip_multi_chunk() {
    // 8 MiB chunks: 37 MiB + 5 bytes spans several chunks over both streams.
    roundtrip(false, (37 << 20) + 5, Path::Tcp);
}

#[test]
fn shm_roundtrip_small_and_unaligned() {
    for len in [1, 3, 4095, 65_537, 3 << 20] {
        roundtrip(true, len, Path::Shm);
    }
}

#[test]
fn shm_cma_for_borrowed_remote_region() {
    borrowed_remote_region(true, Path::Cma);
}

#[test]
fn shm_staged_for_borrowed_remote_region_when_the_target_declines_cma() {
    borrowed_remote_region(false, Path::ShmStaged);
}

fn borrowed_remote_region(cma: bool, want: Path) {
    let mut cfg = config("target", true);
    cfg.shm_cma = cma;
    let target = gdx_engine::Agent::new(cfg).unwrap();
    let init = agent("init", true);
    let peer = init.connect(target.listen_addr().unwrap()).unwrap();
    let len = (9 << 20) + 13; // more than the 8 MiB bounce buffer
    let data = pattern(len, 5);
    let mut buf = vec![0u8; len + 10];
    target.scope(|s| {
        let r = s
            .register(&mut buf, Access::READ_WRITE, Some("borrowed"))
            .unwrap();
        let remote = peer.region("borrowed").unwrap();
        assert!(!remote.shareable);
        let mut src = init.alloc(len as u64, Access::LOCAL, None).unwrap();
        src.bytes_mut().unwrap().copy_from_slice(&data);
        let mut t = Transfer::new();
        t.write(&src, 0, &remote, 10, len as u64);
        let rep = peer.submit(t).unwrap().wait(WAIT).unwrap();
        assert_eq!(rep.ops[0].plan.path, want, "{}", rep.ops[0].plan);
        assert!(r.bytes().unwrap()[10..] == data[..]);
        assert!(r.bytes().unwrap()[..10].iter().all(|&b| b == 0));
        let back = init.alloc(len as u64, Access::LOCAL, None).unwrap();
        let mut t = Transfer::new();
        t.read(&back, 0, &remote, 10, len as u64);
        peer.submit(t).unwrap().wait(WAIT).unwrap();
        assert!(back.bytes().unwrap()[..] == data[..]);
    });
    assert!(buf[10..] == data[..]);
    // The scope ended: the region is gone for peers.
    assert!(matches!(
        peer.region("borrowed"),
        Err(Error::NoSuchName { .. })
    ));
}

#[test]
fn borrowed_regions_over_tcp() {
    let target = agent("target", false);
    let init = agent("init", false);
    let peer = init.connect(target.listen_addr().unwrap()).unwrap();
    let data = pattern(100_003, 11);
    let mut tbuf = vec![0u8; 100_003];
    let mut ibuf = data.clone();
    target.scope(|ts| {
        let _r = ts.register(&mut tbuf, Access::WRITE, Some("t")).unwrap();
        init.scope(|is| {
            let src = is.register(&mut ibuf, Access::LOCAL, None).unwrap();
            let remote = peer.region("t").unwrap();
            let mut t = Transfer::new();
            t.write(&src, 0, &remote, 0, 100_003);
            peer.submit(t).unwrap().wait(WAIT).unwrap();
        });
    });
    assert_eq!(tbuf, data);
}

fn batch_of_small_ops(shm: bool) {
    let target = agent("target", true);
    let init = agent("init", shm);
    let _dst = target
        .alloc(1 << 20, Access::READ_WRITE, Some("dst"))
        .unwrap();
    let peer = init.connect(target.listen_addr().unwrap()).unwrap();
    let remote = peer.region("dst").unwrap();
    let data = pattern(1000 * 97, 3);
    let mut src = init.alloc(data.len() as u64, Access::LOCAL, None).unwrap();
    src.bytes_mut().unwrap().copy_from_slice(&data);
    let mut t = Transfer::new();
    for i in 0..1000u64 {
        // op i: 97 bytes from src[i*97] to dst[i*101 + 1] (unaligned, with gaps)
        t.write(&src, i * 97, &remote, i * 101 + 1, 97);
    }
    t.notify("batch");
    let rep = peer.submit(t).unwrap().wait(WAIT).unwrap();
    assert_eq!(rep.ops.len(), 1000);
    assert!(rep.ops.iter().all(|o| o.status == OpStatus::Completed));
    let back = init.alloc(1000 * 97, Access::LOCAL, None).unwrap();
    let mut t = Transfer::new();
    for i in 0..1000u64 {
        t.read(&back, i * 97, &remote, i * 101 + 1, 97);
    }
    peer.submit(t).unwrap().wait(WAIT).unwrap();
    assert!(back.bytes().unwrap()[..] == data[..]);
    assert_eq!(
        target
            .wait_notification(Duration::from_secs(10))
            .unwrap()
            .data,
        b"batch"
    );
}

#[test]
fn tcp_batch_of_1000_small_ops() {
    batch_of_small_ops(false);
}

#[test]
fn shm_batch_of_1000_small_ops() {
    batch_of_small_ops(true);
}

/// Target-side rejections: forge descriptors so the initiator's own checks pass.
fn rejections(shm: bool) {
    let target = agent("target", true);
    let init = agent("init", shm);
    let mut ro = target.alloc(4096, Access::READ, Some("ro")).unwrap();
    ro.bytes_mut().unwrap().fill(0xAA);
    let mut wo = target.alloc(4096, Access::WRITE, Some("wo")).unwrap();
    wo.bytes_mut().unwrap().fill(0xBB);
    let peer = init.connect(target.listen_addr().unwrap()).unwrap();
    let ro_d = peer.region("ro").unwrap();
    let wo_d = peer.region("wo").unwrap();
    let src = init.alloc(8192, Access::LOCAL, None).unwrap();
    let run = |t: Transfer| -> Error {
        let h = peer.submit(t).unwrap();
        let e = h.wait(WAIT).unwrap_err();
        assert!(matches!(h.status(), Status::Failed { .. }));
        e
    };

    let mut bad_key = wo_d.clone();
    bad_key.key.0 ^= 1;
    let mut t = Transfer::new();
    t.write(&src, 0, &bad_key, 0, 16);
    assert_eq!(run(t), Error::BadKey { region: wo_d.id });

    let mut too_long = wo_d.clone();
    too_long.len = 1 << 40;
    let mut t = Transfer::new();
    t.write(&src, 0, &too_long, 4000, 200);
    assert_eq!(
        run(t),
        Error::OutOfBounds {
            offset: 4000,
            len: 200,
            region_len: 4096
        }
    );

    let mut writable_ro = ro_d.clone();
    writable_ro.access = Access::READ_WRITE;
    let mut t = Transfer::new();
    t.write(&src, 0, &writable_ro, 0, 16);
    assert_eq!(run(t), Error::ReadOnly { region: ro_d.id });

    let mut readable_wo = wo_d.clone();
    readable_wo.access = Access::READ_WRITE;
    let mut t = Transfer::new();
    t.read(&src, 0, &readable_wo, 0, 16);
    assert_eq!(run(t), Error::NotReadable { region: wo_d.id });

    let mut missing = wo_d.clone();
    missing.id = 999_999;
    let mut t = Transfer::new();
    t.write(&src, 0, &missing, 0, 16);
    assert_eq!(run(t), Error::NoSuchRegion { region: 999_999 });

    // Rejected ops never touched memory.
    assert!(ro.bytes().unwrap().iter().all(|&b| b == 0xAA));
    assert!(wo.bytes().unwrap().iter().all(|&b| b == 0xBB));

    // A mixed batch: the good op completes, the bad one fails with its own reason.
    let mut t = Transfer::new();
    t.write(&src, 0, &wo_d, 0, 8).write(&src, 0, &bad_key, 0, 8);
    let h = peer.submit(t).unwrap();
    assert_eq!(h.wait(WAIT).unwrap_err(), Error::BadKey { region: wo_d.id });
    let ops = h.op_results();
    assert_eq!(ops[0].status, OpStatus::Completed);
    assert_eq!(
        ops[1].status,
        OpStatus::Failed(Error::BadKey { region: wo_d.id })
    );

    // The connection is still usable after rejections.
    let mut t = Transfer::new();
    t.read(&src, 0, &ro_d, 0, 4096);
    peer.submit(t).unwrap().wait(WAIT).unwrap();
    assert!(src.bytes().unwrap()[..4096].iter().all(|&b| b == 0xAA));
    assert!(peer.is_alive());
}

#[test]
fn tcp_rejections() {
    rejections(false);
}

#[test]
fn shm_rejections() {
    rejections(true);
}

#[test]
fn initiator_checks_before_sending() {
    let target = agent("target", true);
    let init = agent("init", false);
    let _ro = target.alloc(4096, Access::READ, Some("ro")).unwrap();
    let peer = init.connect(target.listen_addr().unwrap()).unwrap();
    let ro = peer.region("ro").unwrap();
    let src = init.alloc(100, Access::LOCAL, None).unwrap();
    let mut t = Transfer::new();
    t.write(&src, 0, &ro, 0, 10);
    assert_eq!(
        peer.submit(t).unwrap_err(),
        Error::ReadOnly { region: ro.id }
    );
    let mut t = Transfer::new();
    t.read(&src, 50, &ro, 0, 51);
    assert!(matches!(
        peer.submit(t).unwrap_err(),
        Error::OutOfBounds { .. }
    ));
    let mut t = Transfer::new();
    t.read(&src, 0, &ro, 4090, 10);
    assert!(matches!(
        peer.submit(t).unwrap_err(),
        Error::OutOfBounds { .. }
    ));
    assert!(matches!(
        peer.submit(Transfer::new()).unwrap_err(),
        Error::InvalidArgument(_)
    ));
    // The name travels back typed, with how many names the peer publishes (its "kv" at least).
    match peer.region("nope") {
        Err(Error::NoSuchName { name, published }) => {
            assert_eq!(name, "nope");
            assert!(published >= 1, "{published}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn standalone_notify_and_accept() {
    let target = agent("target", true);
    let init = agent("init", false);
    let peer = init.connect(target.listen_addr().unwrap()).unwrap();
    let who = target.accept(Duration::from_secs(5)).unwrap();
    assert_eq!(who.name, "init");
    assert_eq!(who.agent_id, init.id());
    peer.notify("hello").unwrap();
    let n = target.wait_notification(Duration::from_secs(5)).unwrap();
    assert_eq!(
        (n.from.as_str(), n.data.as_slice()),
        ("init", &b"hello"[..])
    );
    assert!(matches!(
        target.wait_notification(Duration::from_millis(50)),
        Err(Error::Timeout(_))
    ));
}

#[test]
fn region_desc_token_roundtrip() {
    let a = agent("a", true);
    let r = a.alloc(123, Access::READ, Some("x")).unwrap();
    let d = r.desc();
    let s = d.to_string();
    assert!(s.starts_with("gdx1:"));
    assert_eq!(s.parse::<gdx_engine::RegionDesc>().unwrap(), d);
    let j = serde_json::to_string(&d).unwrap();
    assert_eq!(
        serde_json::from_str::<gdx_engine::RegionDesc>(&j).unwrap(),
        d
    );
    assert!("gdx1:zz".parse::<gdx_engine::RegionDesc>().is_err());
}

#[test]
fn dropped_region_is_rejected_and_closed_peer_fails_fast() {
    let target = agent("target", true);
    let init = agent("init", false);
    let dst = target.alloc(4096, Access::READ_WRITE, Some("dst")).unwrap();
    let peer = init.connect(target.listen_addr().unwrap()).unwrap();
    let remote = peer.region("dst").unwrap();
    drop(dst);
    let src = init.alloc(16, Access::LOCAL, None).unwrap();
    let mut t = Transfer::new();
    t.write(&src, 0, &remote, 0, 16);
    assert_eq!(
        peer.submit(t).unwrap().wait(WAIT).unwrap_err(),
        Error::NoSuchRegion { region: remote.id }
    );
    peer.close();
    let mut t = Transfer::new();
    t.write(&src, 0, &remote, 0, 16);
    assert!(matches!(peer.submit(t), Err(Error::PeerLost { .. })));
}

/// A connect that nothing answers is `Unreachable` (nothing was ever connected), not
/// `PeerLost` (a connection that broke): the two call for different fixes.
#[test]
fn a_refused_connect_is_unreachable_not_peer_lost() {
    // A port that was just free: bind, note it, close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let me = agent("lonely", false);
    match me.connect(("127.0.0.1", port)) {
        Err(e @ Error::Unreachable { .. }) => {
            let Error::Unreachable { addr, why } = &e else {
                unreachable!()
            };
            assert_eq!(addr, &format!("127.0.0.1:{port}"));
            assert!(!why.is_empty(), "{e:?}");
            let shown = e.to_string();
            assert!(
                shown.starts_with(&format!("cannot reach 127.0.0.1:{port}: ")),
                "{shown}"
            );
            assert!(shown.contains("gdx serve --listen"), "{shown}");
        }
        other => panic!("connect to a closed port: {other:?}"),
    }
}
