//! The same one-sided RMA between two processes through libfabric's shm provider (it offers
//! FI_RMA on one host): sizes up to 1 MiB at unaligned offsets, bytes verified, and a wrong
//! key that leaves the target's bytes alone. Needs libfabric with the shm provider (Debian's libfabric1 has it).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use std::time::Duration;

use common::{fill, first_mismatch, provider, Target, TARGET_SEED};
use gdx_fabric::{Endpoint, FabricError, Memory, RmaKind, RmaOp};

#[test]
#[ignore = "helper: the target process that the two-process tests start; not a test on its own"]
fn target_process() {
    common::target_main();
}

#[test]
fn shm_write_read_unaligned_and_wrong_key() {
    let size = (1 << 20) + 64;
    let mut t = Target::start_on("shm", size);
    let ep = Endpoint::open(&provider("shm")).expect("open shm");
    assert_eq!(ep.provider().core(), "shm", "{:?}", ep.provider());
    let peer = ep.insert_peer(&t.addr).expect("peer");
    let local = ep.register(Memory::alloc(size)).expect("register");
    for (k, len) in [1usize, 4099, 1 << 20].into_iter().enumerate() {
        let (loff, roff) = (1 + k, 7 + k);
        fill(local.memory(), loff, len, 40 + k as u64);
        let w = RmaOp {
            kind: RmaKind::Write,
            local: &local,
            local_offset: loff as u64,
            peer,
            remote: t.region,
            remote_offset: roff as u64,
            len: len as u64,
        };
        ep.run(std::slice::from_ref(&w), Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("write {len}: {e}"));
        assert_eq!(
            t.ask(&format!("check {roff} {len} {} {loff}", 40 + k)),
            "ok"
        );
        assert_eq!(t.ask(&format!("fill {roff} {len} {}", 50 + k)), "ok");
        let r = RmaOp {
            kind: RmaKind::Read,
            local_offset: roff as u64,
            ..w
        };
        ep.run(&[r], Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("read {len}: {e}"));
        assert_eq!(
            first_mismatch(local.memory(), roff, len, 50 + k as u64),
            None
        );
    }
    let mut bad = RmaOp {
        kind: RmaKind::Write,
        local: &local,
        local_offset: 0,
        peer,
        remote: t.region,
        remote_offset: 0,
        len: 64,
    };
    bad.remote.key ^= 0x5a5a;
    // Reset the span the earlier ops wrote, so an untouched span is recognisable.
    assert_eq!(t.ask(&format!("fill 0 64 {TARGET_SEED}")), "ok");
    // Measured with libfabric 1.17's shm: the target refuses the key but no completion (not
    // even an error) comes back, so the batch ends at gdx's deadline as `Timeout`; the bytes
    // stay untouched. (tcp reports the refusal; see tcp_two_process.rs.)
    let e = ep
        .run(&[bad], Duration::from_secs(3))
        .expect_err("wrong key");
    assert!(
        matches!(
            e,
            FabricError::Timeout { .. } | FabricError::RemoteAccess { .. }
        ),
        "{e}"
    );
    assert_eq!(t.ask(&format!("check 0 64 {TARGET_SEED}")), "ok");
}
