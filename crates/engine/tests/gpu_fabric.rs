//! GPU memory over a fabric route (libfabric's tcp provider on 127.0.0.1, two agents that look
//! like two hosts). Debian's libfabric has no CUDA, so no provider offers FI_HMEM: this end's
//! GPU memory is staged through the fabric bounce buffer (`fabric-staged`, the plan says why),
//! strict mode refuses that fallback, and the peer's GPU memory is refused at plan time.
//! Random data, destination poisoned first, bytes verified after (and the poison around them).
//!
//! Needs a GPU with the CUDA driver and libfabric; reported as ignored where there is none.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::*;
use gdx_engine::{Access, Error, LocalPeer, OpStatus, Path, Policy, Transfer};

const POISON: u8 = 0x5A;

#[test]
#[ignore = "requires a CUDA GPU: cargo test -p gdx-engine --test gpu_fabric -- --ignored"]
fn gpu_memory_over_fabric_is_staged_with_the_reason_and_strict_refuses_it() {
    let lp = match LocalPeer::open(Policy::default(), Default::default()) {
        Ok(p) => p,
        Err(e) => panic!("this test requires a GPU with the CUDA driver: {e}"),
    };
    let (target, me, peer) = fabric_pair(0xe1);
    // Over the 4 MiB bounce buffer, so the staged op takes several chunks; odd offsets.
    let len: u64 = (9 << 20) + 3;
    let size = len + 64;
    let dev = lp.alloc_device(0, size).unwrap();
    let local = me.register_gpu(&lp, &dev, Access::LOCAL, None).unwrap();
    let mut dst = target.alloc(size, Access::READ_WRITE, Some("h")).unwrap();
    let remote = peer.region("h").unwrap();

    // GPU -> remote host: GPU-to-host copy, then fi_write, chunk by chunk.
    let data = pattern(size as usize, 7);
    lp.upload(&dev, 0, &data).unwrap();
    dst.bytes_mut().unwrap().fill(POISON);
    let mut t = Transfer::new();
    t.write(&local, 5, &remote, 11, len);
    let rep = peer.submit(t).unwrap().wait(WAIT).unwrap();
    let op = &rep.ops[0];
    assert_eq!(op.status, OpStatus::Completed, "{}", op.plan);
    assert_eq!(op.plan.path, Path::FabricStaged, "{}", op.plan);
    assert!(
        op.plan.reason.starts_with("staged: ") && op.plan.reason.contains("FI_HMEM"),
        "{}",
        op.plan.reason
    );
    {
        let d = dst.bytes().unwrap();
        assert_eq!(
            first_diff(&d[11..11 + len as usize], &data[5..5 + len as usize]),
            None
        );
        assert_eq!(d[10], POISON);
        assert_eq!(d[11 + len as usize], POISON);
    }

    // Remote host -> GPU: fi_read into the bounce buffer, then host-to-GPU copy.
    let back = pattern(size as usize, 8);
    dst.bytes_mut().unwrap().copy_from_slice(&back);
    lp.upload(&dev, 0, &vec![POISON; size as usize]).unwrap();
    let mut t = Transfer::new();
    t.read(&local, 3, &remote, 1, len);
    let rep = peer.submit(t).unwrap().wait(WAIT).unwrap();
    assert_eq!(
        rep.ops[0].plan.path,
        Path::FabricStaged,
        "{}",
        rep.ops[0].plan
    );
    let mut got = vec![0u8; size as usize];
    lp.download(&dev, 0, &mut got).unwrap();
    assert_eq!(
        first_diff(&got[3..3 + len as usize], &back[1..1 + len as usize]),
        None
    );
    assert_eq!(got[2], POISON);
    assert_eq!(got[3 + len as usize], POISON);

    // Strict mode refuses the staged fallback, before anything moves.
    me.set_strict(true);
    dst.bytes_mut().unwrap().fill(POISON);
    let mut t = Transfer::new();
    t.write(&local, 0, &remote, 0, 4096);
    match peer.submit(t) {
        Err(Error::Strict { reason: why, .. }) => {
            assert!(why.contains("fabric staged fallback"), "{why}")
        }
        other => panic!("strict mode let a staged fabric op run: {other:?}"),
    }
    assert!(
        dst.bytes().unwrap().iter().all(|&b| b == POISON),
        "nothing moved"
    );
    me.set_strict(false);

    // The peer's GPU memory: refused at plan time, strict or not (no target-side staging).
    let remote_dev = lp.alloc_device(0, 4096).unwrap();
    let _served = target
        .register_gpu(&lp, &remote_dev, Access::READ_WRITE, Some("g"))
        .unwrap();
    let host = me.alloc(4096, Access::LOCAL, None).unwrap();
    let mut t = Transfer::new();
    t.write(&host, 0, &peer.region("g").unwrap(), 0, 4096);
    match peer.submit(t) {
        Err(Error::Refused {
            path: Path::Fabric,
            reason: why,
            ..
        }) => {
            assert!(why.contains("GDX_TRANSPORTS=tcp,shm"), "{why}")
        }
        other => panic!("the peer's GPU memory over fabric was not refused: {other:?}"),
    }
}
