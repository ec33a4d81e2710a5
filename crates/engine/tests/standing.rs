//! Standing leases on the `cma` path: once the initiator resolved a borrowed region, the target
//! holds a lease on it for the connection and the initiator copies with no round trip
//! (`TransferHandle::batching().standing`); a user view of the region at the target revokes it
//! (later transfers lease per transfer, as before), and so does the region's retirement, after
//! which nothing reaches the caller's buffer. Bytes checked after every transfer.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::*;
use gdx_engine::{Access, Path, Transfer};

const LEN: usize = 64 << 10;
const KIB4: u64 = 4 << 10;

#[test]
fn cma_copies_run_under_the_standing_lease_until_the_target_needs_it_back() {
    let target = agent("target", true);
    let init = agent("init", true);
    let mut buf = vec![0u8; LEN];
    let mut gone_buf = pattern(LEN, 9);
    // SAFETY: both buffers outlive their regions (dropped at the end of the test, after the
    // regions: `region` explicitly, `gone` below) and are read only through them meanwhile.
    let region = unsafe {
        target.register_raw(
            buf.as_mut_ptr(),
            LEN as u64,
            Access::READ_WRITE,
            Some("pool"),
        )
    }
    .unwrap();
    // SAFETY: as above.
    let gone = unsafe {
        target.register_raw(
            gone_buf.as_mut_ptr(),
            LEN as u64,
            Access::READ_WRITE,
            Some("gone"),
        )
    }
    .unwrap();
    let mut local = init.alloc(LEN as u64, Access::LOCAL, None).unwrap();
    fill_pattern(&mut local.bytes_mut().unwrap(), 2);
    let src = local.bytes().unwrap().to_vec();
    let peer = init.connect(target.listen_addr().unwrap()).unwrap();
    let remote = peer.region("pool").unwrap();

    let write = |at: u64, n: u64| {
        let mut t = Transfer::new();
        t.write(&local, at, &remote, at, n);
        let h = peer.submit(t).unwrap();
        let rep = h.wait(WAIT).unwrap();
        assert_eq!(rep.ops[0].plan.path, Path::Cma, "{}", rep.ops[0].plan);
        h.batching()
    };

    // The first transfer resolves the region (the target opens its standing lease then) and
    // copies under it, as every one after it: one op, and a list of 16.
    assert_eq!(write(0, KIB4).standing, 1);
    assert_eq!(write(KIB4, KIB4).standing, 1);
    let mut t = Transfer::new();
    for k in 2..18u64 {
        t.write(&local, k * KIB4 / 4, &remote, 3 * KIB4 + k * 256, 256);
    }
    let h = peer.submit(t).unwrap();
    h.wait(WAIT).unwrap();
    assert_eq!(h.batching().standing, 16);
    assert!(
        h.batching().to_string().contains("standing lease"),
        "{}",
        h.batching()
    );
    // A read, too.
    let back = init.alloc(KIB4, Access::LOCAL, None).unwrap();
    let mut t = Transfer::new();
    t.read(&back, 0, &remote, KIB4, KIB4);
    let h = peer.submit(t).unwrap();
    h.wait(WAIT).unwrap();
    assert_eq!(h.batching().standing, 1);
    assert!(back.bytes().unwrap()[..] == src[KIB4 as usize..2 * KIB4 as usize]);

    // A view at the target revokes it (a user read excludes remote writes); its bytes are the
    // ones written.
    {
        let view = region.bytes().unwrap();
        assert!(view[..2 * KIB4 as usize] == src[..2 * KIB4 as usize]);
        for k in 2..18usize {
            let (s, d) = (k * 1024, 3 * 4096 + k * 256);
            assert!(view[d..d + 256] == src[s..s + 256], "op {k}");
        }
        assert!(
            view[8 * 4096..].iter().all(|&b| b == 0),
            "bytes past the writes changed"
        );
    }
    // Later transfers lease per transfer, and land.
    assert_eq!(write(8 * KIB4, KIB4).standing, 0);
    assert!(region.bytes().unwrap()[8 * 4096..9 * 4096] == src[8 * 4096..9 * 4096]);

    // A region the target drops: its standing lease is revoked before it retires, and the
    // next write fails by name without touching the buffer it was.
    let remote_gone = peer.region("gone").unwrap();
    let write_gone = |n: u64| {
        let mut t = Transfer::new();
        t.write(&local, 0, &remote_gone, 0, n);
        let h = peer.submit(t).unwrap();
        (h.wait(WAIT), h.batching().standing)
    };
    let (r, standing) = write_gone(KIB4);
    r.unwrap();
    assert_eq!(standing, 1);
    drop(gone);
    let (r, standing) = write_gone(2 * KIB4);
    let e = r.unwrap_err().to_string();
    assert!(e.contains("region"), "{e}");
    assert_eq!(standing, 0);
    let mut want = pattern(LEN, 9);
    want[..KIB4 as usize].copy_from_slice(&src[..KIB4 as usize]);
    assert!(
        gone_buf == want,
        "the buffer of a dropped region changed at {:?}",
        first_diff(&gone_buf, &want)
    );
    drop(region);
    drop(buf);
}
