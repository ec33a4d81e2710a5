//! Prepared transfers (`Peer::prepare`, `PreparedTransfer::post`): the same ops posted again
//! and again over shm and tcp, each post carrying the bytes the source holds at that post;
//! posts that overlap; what `submit` refuses, `prepare` refuses; a region freed between posts
//! fails the next post's op; a closed peer fails the post itself.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::*;
use gdx_engine::{Access, Error, Path, Transfer};

/// Writes of `len` bytes posted 40 times from one prepared transfer, the source rewritten
/// before each post; every post's bytes verified at the target; then a prepared read.
fn posted_again_and_again(shm: bool, len: u64, expect: Path) {
    let target = agent("target", true);
    let init = agent("init", shm);
    let mut dst = target
        .alloc(len + 64, Access::READ_WRITE, Some("dst"))
        .unwrap();
    let peer = init.connect(target.listen_addr().unwrap()).unwrap();
    let remote = peer.region("dst").unwrap();
    let mut src = init.alloc(len + 16, Access::LOCAL, None).unwrap();
    let mut t = Transfer::new();
    t.write(&src, 5, &remote, 9, len);
    let mut w = peer.prepare(t).unwrap();
    assert_eq!((w.len(), w.is_empty()), (1, false));
    assert_eq!(w.paths(), vec![expect]);
    for i in 0..40u64 {
        fill_pattern(&mut src.bytes_mut().unwrap()[5..5 + len as usize], 1000 + i);
        let rep = w.run(WAIT).unwrap();
        assert_eq!(rep.bytes, len);
        assert_eq!(rep.ops[0].plan.path, expect, "post {i}");
        assert_eq!(
            first_diff(
                &dst.bytes().unwrap()[9..9 + len as usize],
                &src.bytes().unwrap()[5..5 + len as usize]
            ),
            None,
            "post {i}"
        );
    }
    let back = init.alloc(len, Access::LOCAL, None).unwrap();
    let mut t = Transfer::new();
    t.read(&back, 0, &remote, 1, len);
    let mut r = peer.prepare(t).unwrap();
    for i in 0..10u64 {
        fill_pattern(&mut dst.bytes_mut().unwrap()[1..1 + len as usize], 77 + i);
        r.run(WAIT).unwrap();
        assert_eq!(
            first_diff(
                &back.bytes().unwrap(),
                &dst.bytes().unwrap()[1..1 + len as usize]
            ),
            None,
            "read {i}"
        );
    }
}

#[test]
fn a_prepared_shm_write_and_read_carry_each_posts_bytes() {
    posted_again_and_again(true, 8, Path::Shm);
    posted_again_and_again(true, 4096, Path::Shm);
    // Leased (beyond the inline size): copied through the mapping, not the slot.
    posted_again_and_again(true, 1 << 20, Path::Shm);
}

#[test]
fn a_prepared_tcp_write_and_read_carry_each_posts_bytes() {
    posted_again_and_again(false, 8, Path::Tcp);
    posted_again_and_again(false, 3 << 20, Path::Tcp);
}

/// Posts whose handles are all still held run on states of their own: 64 outstanding posts of
/// one prepared batch of two ops, all completing; the bytes are the source's (unchanged).
#[test]
fn posts_in_flight_together_each_complete() {
    for shm in [true, false] {
        let target = agent("target", true);
        let init = agent("init", shm);
        let dst = target
            .alloc(1 << 16, Access::READ_WRITE, Some("dst"))
            .unwrap();
        let peer = init.connect(target.listen_addr().unwrap()).unwrap();
        let remote = peer.region("dst").unwrap();
        let mut src = init.alloc(1 << 16, Access::LOCAL, None).unwrap();
        fill_pattern(&mut src.bytes_mut().unwrap(), 31);
        let mut t = Transfer::new();
        t.write(&src, 0, &remote, 0, 100)
            .write(&src, 4096, &remote, 8192, 30_000);
        let mut p = peer.prepare(t).unwrap();
        let hs: Vec<_> = (0..64).map(|_| p.post().unwrap()).collect();
        for (i, h) in hs.iter().enumerate() {
            let rep = h.wait(WAIT).unwrap();
            assert_eq!(rep.bytes, 30_100, "post {i} (shm {shm})");
            assert_eq!(rep.ops.len(), 2);
        }
        {
            // (Views of the regions are let go before the next post: the target's copy into
            // a region waits while a view of it is held.)
            let (got, want) = (dst.bytes().unwrap(), src.bytes().unwrap());
            assert_eq!(first_diff(&got[..100], &want[..100]), None);
            assert_eq!(first_diff(&got[8192..38_192], &want[4096..34_096]), None);
        }
        // Every handle dropped: the next post reuses the state, and still lands.
        drop(hs);
        p.run(WAIT).unwrap();
    }
}

#[test]
fn prepare_refuses_what_submit_refuses() {
    let target = agent("target", true);
    let init = agent("init", true);
    let _dst = target.alloc(4096, Access::READ, Some("dst")).unwrap();
    let peer = init.connect(target.listen_addr().unwrap()).unwrap();
    let remote = peer.region("dst").unwrap();
    let src = init.alloc(4096, Access::LOCAL, None).unwrap();
    assert!(matches!(
        peer.prepare(Transfer::new()),
        Err(Error::InvalidArgument(_))
    ));
    let mut t = Transfer::new();
    t.read(&src, 0, &remote, 4000, 200);
    assert!(matches!(peer.prepare(t), Err(Error::OutOfBounds { .. })));
    let mut t = Transfer::new();
    t.write(&src, 0, &remote, 0, 8);
    assert!(matches!(peer.prepare(t), Err(Error::ReadOnly { .. })));
}

/// The target checks every post: a region freed after a prepared write ran fails the next
/// post's op (named), and a closed peer fails the post itself, with nothing sent.
#[test]
fn a_freed_region_fails_the_next_post_and_a_closed_peer_the_post() {
    for shm in [true, false] {
        let target = agent("target", true);
        let init = agent("init", shm);
        let dst = target.alloc(4096, Access::READ_WRITE, Some("dst")).unwrap();
        let peer = init.connect(target.listen_addr().unwrap()).unwrap();
        let remote = peer.region("dst").unwrap();
        let mut src = init.alloc(64, Access::LOCAL, None).unwrap();
        fill_pattern(&mut src.bytes_mut().unwrap(), 3);
        let mut t = Transfer::new();
        t.write(&src, 0, &remote, 0, 64);
        let mut p = peer.prepare(t).unwrap();
        p.run(WAIT).unwrap();
        assert_eq!(
            first_diff(&dst.bytes().unwrap()[..64], &src.bytes().unwrap()),
            None
        );
        drop(dst);
        let e = p.run(WAIT).unwrap_err();
        assert!(
            matches!(e, Error::NoSuchRegion { .. } | Error::RegionGone { .. }),
            "shm {shm}: {e}"
        );
        peer.close();
        assert!(
            matches!(p.post(), Err(Error::PeerLost { .. })),
            "shm {shm}: a post on a closed peer"
        );
    }
}
