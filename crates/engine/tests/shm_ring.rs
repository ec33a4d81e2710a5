//! The shm control ring (#17): windows of outstanding transfers, big batches, and the ring
//! protocol under random op mixes with the target process killed at random points — every op
//! ends completed with verified bytes or failed with a named reason (`PeerLost`, `Timeout`),
//! never both and never a hang. The killed target is this same test binary re-run with
//! `GDX_TEST_ROLE=ring-server`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed unwrap is a failed test

mod common;

use common::*;
use gdx_engine::serve::{self, ServeConfig};
use gdx_engine::{
    Access, Agent, AgentConfig, Error, OpStatus, Path, Peer, Region, RegionDesc, Transfer,
};
use proptest::prelude::*;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const LEN: u64 = 8 << 20;
const SEED: u64 = 1717;

/// Child: serve an 8 MiB region filled with `fill_pattern(SEED)` until killed or stdin closes.
#[test]
#[ignore = "a role: run as a child process by the tests of this file"]
fn role_ring_server() {
    assert_eq!(
        std::env::var("GDX_TEST_ROLE").as_deref(),
        Ok("ring-server"),
        "a role: run only as a child of the tests of this file"
    );
    let mut h = serve::run(ServeConfig {
        agent: AgentConfig::from_env().unwrap(),
        region_len: LEN,
        ..ServeConfig::default()
    })
    .unwrap();
    fill_pattern(&mut h.region().bytes_mut().unwrap(), SEED);
    println!("{}", h.summary_line());
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}

struct Server(Child);
impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_server() -> (Server, String, RegionDesc) {
    let mut c = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "role_ring_server",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("GDX_TEST_ROLE", "ring-server")
        .env("GDX_SECRET_FILE", secret_file())
        .env("GDX_TRANSPORTS", "tcp,shm")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = c.stdout.take().unwrap();
    let server = Server(c);
    for l in BufReader::new(out).lines() {
        let l = l.unwrap();
        if let Some(i) = l.find("GDX_SERVE ") {
            let f = |k: &str| {
                l[i..]
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix(k))
                    .unwrap()
                    .to_string()
            };
            return (server, f("addr="), f("region=").parse().unwrap());
        }
    }
    panic!("the ring server printed no GDX_SERVE line");
}

/// Two shm agents of this process (kept alive by the first element: bind it first, so it is
/// dropped last), the initiator's peer, its descriptor of the target's `len`-byte region "r",
/// that region (`dst`) and a local `len`-byte source filled with `seed`'s pattern.
type Pair = (
    (Agent, Agent),
    Peer,
    RegionDesc,
    Region<'static>,
    Region<'static>,
);

fn pair(len: u64, seed: u64) -> Pair {
    let target = agent("target", true);
    let init = agent("init", true);
    let dst = target.alloc(len, Access::READ_WRITE, Some("r")).unwrap();
    let peer = init.connect(target.listen_addr().unwrap()).unwrap();
    assert_eq!(peer.route().transport, Path::Shm);
    let remote = peer.region("r").unwrap();
    let mut src = init.alloc(len, Access::LOCAL, None).unwrap();
    fill_pattern(&mut src.bytes_mut().unwrap(), seed);
    ((target, init), peer, remote, dst, src)
}

/// 64 transfers in flight at once (writes of 1 B .. 1 MiB, each to its own span), every one
/// completing on its own; then 64 reads in flight, each verified byte for byte.
#[test]
fn a_window_of_64_outstanding_transfers_is_verified_byte_for_byte() {
    let span = 64u64 << 10;
    let (agents, peer, remote, dst, src) = pair(64 * span, 5);
    // Sizes from 1 B to the span: inline ones and leased ones mixed.
    let len = |i: u64| [1, 7, 8, 64, 4096, 16 << 10, (16 << 10) + 1, span][i as usize % 8];
    let handles: Vec<_> = (0..64u64)
        .map(|i| {
            let mut t = Transfer::new();
            t.write(&src, i * span, &remote, i * span, len(i));
            peer.submit(t).unwrap()
        })
        .collect();
    for (i, h) in handles.iter().enumerate() {
        let rep = h.wait(WAIT).unwrap();
        assert_eq!(rep.ops[0].plan.path, Path::Shm, "transfer {i}");
    }
    {
        let got = dst.bytes().unwrap();
        let want = src.bytes().unwrap();
        for i in 0..64u64 {
            let (o, n) = ((i * span) as usize, len(i) as usize);
            assert_eq!(
                first_diff(&got[o..o + n], &want[o..o + n]),
                None,
                "write {i}"
            );
        }
    }
    let back = agents.1.alloc(64 * span, Access::LOCAL, None).unwrap();
    let handles: Vec<_> = (0..64u64)
        .map(|i| {
            let mut t = Transfer::new();
            t.read(&back, i * span, &remote, i * span, len(i));
            peer.submit(t).unwrap()
        })
        .collect();
    for h in &handles {
        h.wait(WAIT).unwrap();
    }
    let got = back.bytes().unwrap();
    let want = src.bytes().unwrap();
    for i in 0..64u64 {
        let (o, n) = ((i * span) as usize, len(i) as usize);
        assert_eq!(
            first_diff(&got[o..o + n], &want[o..o + n]),
            None,
            "read {i}"
        );
    }
}

/// A batch of 1,000 × 4 KiB ops in one transfer (one ring slot), written and read back.
#[test]
fn a_batch_of_1000_4k_ops_round_trips() {
    let n = 1000u64;
    let (agents, peer, remote, dst, src) = pair(n * 4096, 9);
    let mut t = Transfer::new();
    for i in 0..n {
        // Reversed placement, so an op landing at the wrong offset shows.
        t.write(&src, i * 4096, &remote, (n - 1 - i) * 4096, 4096);
    }
    let rep = peer.submit(t).unwrap().wait(WAIT).unwrap();
    assert_eq!(rep.bytes, n * 4096);
    assert!(rep.ops.iter().all(|o| o.status == OpStatus::Completed));
    {
        let got = dst.bytes().unwrap();
        let want = src.bytes().unwrap();
        for i in 0..n as usize {
            let (a, b) = (i * 4096, (n as usize - 1 - i) * 4096);
            assert_eq!(got[b..b + 4096], want[a..a + 4096], "op {i}");
        }
    }
    let back = agents.1.alloc(n * 4096, Access::LOCAL, None).unwrap();
    let mut t = Transfer::new();
    for i in 0..n {
        t.read(&back, i * 4096, &remote, (n - 1 - i) * 4096, 4096);
    }
    peer.submit(t).unwrap().wait(WAIT).unwrap();
    assert_eq!(
        first_diff(&back.bytes().unwrap(), &src.bytes().unwrap()),
        None
    );
}

/// Small transfers left in flight by the submitting thread complete without `wait`: polled
/// through `status`, or by a later transfer (its slot needs the earlier ones answered), and a
/// write submitted after them (over the socket) starts only after their bytes landed. More
/// transfers than the ring has slots, none waited for until the end.
#[test]
fn small_transfers_in_flight_complete_when_polled_or_overtaken() {
    let n = 100u64;
    let (_agents, peer, remote, dst, src) = pair(n * 64 + (1 << 20), 21);
    let submit = |off: u64, len: u64| {
        let mut t = Transfer::new();
        t.write(&src, off, &remote, off, len);
        peer.submit(t).unwrap()
    };
    let polled: Vec<_> = (0..n).map(|i| submit(i * 64, 1 + i % 64)).collect();
    // Dropped handles: completed by whoever drives the connection next.
    for i in 0..n {
        drop(submit(n * 64 + i * 8, 8));
    }
    let big = submit(n * 64 + 4096, (1 << 20) - 4096);
    for h in &polled {
        let deadline = std::time::Instant::now() + WAIT;
        while h.status() == gdx_engine::Status::Pending {
            assert!(std::time::Instant::now() < deadline, "never completed");
            std::thread::yield_now();
        }
        assert_eq!(h.status(), gdx_engine::Status::Completed);
    }
    big.wait(WAIT).unwrap();
    let got = dst.bytes().unwrap();
    let want = src.bytes().unwrap();
    for i in 0..n as usize {
        let (o, l) = (i * 64, 1 + i % 64);
        assert_eq!(
            first_diff(&got[o..o + l], &want[o..o + l]),
            None,
            "polled {i}"
        );
    }
    let tail = (n * 64) as usize;
    assert_eq!(
        first_diff(
            &got[tail..tail + n as usize * 8],
            &want[tail..tail + n as usize * 8]
        ),
        None
    );
    assert_eq!(
        first_diff(&got[tail + 4096..], &want[tail + 4096..]),
        None,
        "big"
    );
}

fn named(e: &Error) -> bool {
    matches!(e, Error::PeerLost { .. } | Error::Timeout(_))
}

/// A fresh ring server, an agent of this process (transfers time out after 20 s) connected to
/// it over shm, the server's region and the bytes it holds.
fn ring_client(name: &str) -> (Server, Agent, Peer, RegionDesc, Vec<u8>) {
    let (server, addr, remote) = spawn_server();
    let me = Agent::new(AgentConfig {
        listen: None,
        transfer_timeout: Duration::from_secs(20),
        ..config(name, true)
    })
    .unwrap();
    let peer = me.connect(addr.as_str()).unwrap();
    assert_eq!(peer.route().transport, Path::Shm);
    let mut want = vec![0u8; LEN as usize];
    fill_pattern(&mut want, SEED);
    (server, me, peer, remote, want)
}

/// A transfer's ops: each one's `dst` offset, the server's offset and the length.
type Spans = Vec<(u64, u64, u64)>;

/// Kills `server` after `kill_after_us` (if any), then checks every transfer of `handles`
/// (`check_ended`).
fn kill_then_check(
    mut server: Server,
    kill_after_us: Option<u64>,
    handles: &[(gdx_engine::TransferHandle, Spans)],
    dst: &Region<'_>,
    want: &[u8],
) -> Result<(), TestCaseError> {
    if let Some(us) = kill_after_us {
        std::thread::sleep(Duration::from_micros(us));
        let _ = server.0.kill();
    }
    for (h, spans) in handles {
        check_ended(h, dst, want, spans, kill_after_us.is_some())?;
    }
    Ok(())
}

/// Waits for `h` (a hang shows as `Timeout` from `wait(WAIT)`, which is not accepted) and
/// checks each op of `spans` (`dst` offset, the server's offset, length): completed with the
/// server's bytes (`want`) or failed with a named reason, never pending; a failed transfer has
/// a failed op; without a kill, everything completed.
fn check_ended(
    h: &gdx_engine::TransferHandle,
    dst: &Region<'_>,
    want: &[u8],
    spans: &[(u64, u64, u64)],
    killed: bool,
) -> Result<(), TestCaseError> {
    let r = h.wait(WAIT);
    if !killed {
        prop_assert!(r.is_ok(), "no kill, yet {:?}", r.err());
    }
    let results = h.op_results();
    prop_assert_eq!(results.len(), spans.len());
    let got = dst.bytes().unwrap();
    for (j, (res, &(local, off, len))) in results.iter().zip(spans).enumerate() {
        match &res.status {
            OpStatus::Completed => prop_assert_eq!(
                first_diff(
                    &got[local as usize..(local + len) as usize],
                    &want[off as usize..(off + len) as usize]
                ),
                None,
                "op {} completed with wrong bytes",
                j
            ),
            OpStatus::Failed(e) => prop_assert!(named(e), "op {} failed: {}", j, e),
            OpStatus::Pending => prop_assert!(false, "op {} still pending", j),
        }
    }
    if let Err(e) = &r {
        prop_assert!(named(e) || killed, "{}", e);
        prop_assert!(
            results
                .iter()
                .any(|o| matches!(o.status, OpStatus::Failed(_))),
            "transfer failed ({}) with every op completed",
            e
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Random mixes of reads (1 B .. 1 MiB, verified against the server's pattern) over the
    /// ring, several transfers in flight, the server killed at a random moment (or not at all).
    #[test]
    fn ring_ops_complete_verified_or_fail_named_under_peer_death(
        ops in proptest::collection::vec((0u64..LEN, 1u64..=(1 << 20), any::<bool>()), 1..24),
        per_xfer in 1usize..6,
        kill_after_us in proptest::option::of(0u64..3000),
    ) {
        let (server, me, peer, remote, want) = ring_client("ring-prop");
        // Each op reads into its own span of `dst`; some are small enough to travel inline.
        let ops: Vec<(u64, u64)> = ops
            .into_iter()
            .map(|(off, len, small)| {
                let len = if small { 1 + len % (16 << 10) } else { len };
                let off = off.min(LEN - len);
                (off, len)
            })
            .collect();
        let total: u64 = ops.iter().map(|o| o.1).sum();
        let dst = me.alloc(total, Access::LOCAL, None).unwrap();
        let mut at = 0;
        let mut handles = Vec::new();
        for chunk in ops.chunks(per_xfer) {
            let mut t = Transfer::new();
            let mut spans = Vec::new();
            for &(off, len) in chunk {
                t.read(&dst, at, &remote, off, len);
                spans.push((at, off, len));
                at += len;
            }
            handles.push((peer.submit(t).unwrap(), spans));
        }
        kill_then_check(server, kill_after_us, &handles, &dst, &want)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    /// Leased batches of 128..=1000 small reads, which the initiator posts in several slots
    /// back to back (the target leases one part while the one before is copied), two in
    /// flight, the server killed at a random moment (or not at all): every op completes with
    /// verified bytes or fails with a named reason, never both, never a hang.
    #[test]
    fn leased_batches_in_parts_complete_verified_or_fail_named_under_peer_death(
        n_ops in 128usize..=1000,
        len in 160u64..=4096,
        seed in any::<u64>(),
        kill_after_us in proptest::option::of(0u64..400),
    ) {
        let (server, me, peer, remote, want) = ring_client("ring-parts");
        let dst = me.alloc((2 * n_ops as u64 * len).max(1 << 20), Access::LOCAL, None).unwrap();
        // A first leased read, waited for, has the initiator map the region: the batches
        // after it are then posted by the submitting thread, in parts.
        let mut t = Transfer::new();
        t.read(&dst, 0, &remote, 0, 1 << 20);
        peer.submit(t).unwrap().wait(WAIT).unwrap();
        let mut handles = Vec::new();
        for x in 0..2u64 {
            let mut t = Transfer::with_capacity(n_ops);
            let mut spans = Vec::new();
            for j in 0..n_ops as u64 {
                // Offsets scattered over the region (a multiplicative step), each op its own
                // local span.
                let off = (seed.wrapping_add((x * 1000 + j).wrapping_mul(0x9e37_79b9))) % (LEN - len);
                let local = (x * n_ops as u64 + j) * len;
                t.read(&dst, local, &remote, off, len);
                spans.push((local, off, len));
            }
            handles.push((peer.submit(t).unwrap(), spans));
        }
        kill_then_check(server, kill_after_us, &handles, &dst, &want)?;
    }
}

/// The ring thread keeps the last region it served (no table look-up per op): a region freed
/// right after a write through the ring is refused on the next op, by name, and its bytes are
/// not touched; a region allocated in its place under the same name takes writes again, with
/// the plan (cached per region pair) made afresh.
#[test]
fn a_region_freed_after_ring_writes_is_refused_at_once() {
    let (agents, peer, remote, dst, src) = pair(4096, 13);
    three_small_writes(&peer, &src, &remote, &dst);
    drop(dst);
    let mut t = Transfer::new();
    t.write(&src, 0, &remote, 0, 8);
    let e = peer.submit(t).unwrap().wait(WAIT).unwrap_err();
    assert!(
        matches!(e, Error::NoSuchRegion { .. } | Error::RegionGone { .. }),
        "{e}"
    );
    let again = agents.0.alloc(4096, Access::READ_WRITE, Some("r")).unwrap();
    let remote2 = peer.region("r").unwrap();
    assert_ne!(remote2.id, remote.id);
    let mut t = Transfer::new();
    t.write(&src, 64, &remote2, 64, 16);
    let rep = peer.submit(t).unwrap().wait(WAIT).unwrap();
    assert_eq!(rep.ops[0].plan.path, Path::Shm);
    assert_eq!(
        first_diff(
            &again.bytes().unwrap()[64..80],
            &src.bytes().unwrap()[64..80]
        ),
        None
    );
}

/// A leased transfer (over 16 KiB) is posted by the submitting thread and copied by whoever
/// waits; with nobody waiting (the handle dropped at once) the connection's own thread still
/// completes it, so the target's leases end and the bytes land.
#[test]
fn a_leased_transfer_nobody_waits_for_still_completes() {
    let len = 1u64 << 20;
    let (_agents, peer, remote, dst, src) = pair(len, 17);
    let mut t = Transfer::new();
    t.write(&src, 0, &remote, 0, len);
    drop(peer.submit(t).unwrap());
    // The target's view: readable once the initiator's copy ended (its lease is gone).
    let until = std::time::Instant::now() + WAIT;
    loop {
        if let Ok(got) = dst.bytes() {
            if first_diff(&got, &src.bytes().unwrap()).is_none() {
                break;
            }
        }
        assert!(
            std::time::Instant::now() < until,
            "the undriven transfer never completed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // And the connection still carries transfers, waited for as usual.
    let mut t = Transfer::new();
    t.write(&src, 8, &remote, 8, 8);
    peer.submit(t).unwrap().wait(WAIT).unwrap();
}

/// Three times as many small transfers as the ring has slots, one after another, with a leased
/// (`BEGIN`) transfer every 50: inline slots are reused as the target left them (`DONE`),
/// leased ones after their `END`; every write is read back through the ring and verified, and
/// the initiator's counters equal what was moved.
#[test]
fn more_small_transfers_than_the_ring_has_slots_reuse_them_in_order() {
    let len = 1u64 << 20;
    let (agents, peer, remote, dst, src) = pair(len, 23);
    let back = agents.1.alloc(len, Access::LOCAL, None).unwrap();
    let (mut writes, mut reads, mut bytes) = (0u64, 0u64, 0u64);
    for i in 0..384u64 {
        let (off, n) = if i % 50 == 49 {
            (256 << 10, 64 << 10) // over INLINE_MAX: leased with BEGIN, then END
        } else {
            ((i * 24) % (128 << 10), 1 + i % 24)
        };
        let mut t = Transfer::new();
        t.write(&src, off, &remote, off, n);
        let rep = peer.submit(t).unwrap().wait(WAIT).unwrap();
        assert_eq!(rep.ops[0].status, OpStatus::Completed);
        let mut t = Transfer::new();
        t.read(&back, off, &remote, off, n);
        peer.submit(t).unwrap().wait(WAIT).unwrap();
        let (a, b) = (off as usize, (off + n) as usize);
        let want = &src.bytes().unwrap()[a..b];
        assert_eq!(
            first_diff(&back.bytes().unwrap()[a..b], want),
            None,
            "read back {i} ({n} B at {off})"
        );
        assert_eq!(
            first_diff(&dst.bytes().unwrap()[a..b], want),
            None,
            "target's view {i} ({n} B at {off})"
        );
        writes += 1;
        reads += 1;
        bytes += n;
    }
    let s = agents.1.stats();
    let by = |dir: &str| {
        s.paths
            .iter()
            .find(|p| p.path == "shm" && p.direction == dir)
            .map(|p| (p.ops, p.bytes))
    };
    assert_eq!(by("write"), Some((writes, bytes)));
    assert_eq!(by("read"), Some((reads, bytes)));
    assert_eq!(
        (s.transfers_completed, s.transfers_failed),
        (writes + reads, 0)
    );
    assert_eq!(s.latency.count, writes + reads);
}

/// A transfer whose timeout the clock cannot represent (`Duration::MAX`, "never") runs as one
/// that never times out, instead of failing or panicking at submit.
#[test]
fn a_transfer_with_an_endless_timeout_completes() {
    let (_agents, peer, remote, dst, src) = pair(4096, 29);
    let mut t = Transfer::new();
    t.write(&src, 0, &remote, 0, 64).timeout(Duration::MAX);
    peer.submit(t).unwrap().wait(WAIT).unwrap();
    assert_eq!(
        first_diff(&dst.bytes().unwrap()[..64], &src.bytes().unwrap()[..64]),
        None
    );
}

/// Posts at gaps on both sides of the target's sleep (it spins 200 µs after its last request;
/// a post under 100 µs after the previous one skips the doorbell check, any later one checks
/// and wakes a sleeping target): every write, each a fresh pattern over the same bytes, lands
/// and reads back through the ring.
#[test]
fn posts_close_together_and_after_the_target_slept_all_land() {
    let (_agents, peer, remote, dst, mut src) = pair(4096, 41);
    let gaps_us = [0u64, 10, 90, 110, 150, 250, 1_000, 20_000, 0, 0, 300, 5];
    for (i, gap) in gaps_us.into_iter().enumerate() {
        std::thread::sleep(Duration::from_micros(gap));
        fill_pattern(&mut src.bytes_mut().unwrap()[..64], 100 + i as u64);
        let mut t = Transfer::new();
        t.write(&src, 0, &remote, 0, 64);
        peer.submit(t).unwrap().wait(WAIT).unwrap();
        assert_eq!(
            first_diff(&dst.bytes().unwrap()[..64], &src.bytes().unwrap()[..64]),
            None,
            "write {i} after a {gap} µs gap"
        );
    }
}

/// A small write whose local region was freed after the transfer was built: the slot goes out
/// with the op withdrawn, the transfer fails with the region's error, and the connection keeps
/// carrying transfers.
#[test]
fn a_small_write_from_a_freed_local_region_fails_and_the_ring_goes_on() {
    let (agents, peer, remote, dst, src) = pair(4096, 31);
    let mut t = Transfer::new();
    t.write(&src, 0, &remote, 0, 8);
    drop(src);
    let e = peer.submit(t).unwrap().wait(WAIT).unwrap_err();
    assert!(matches!(e, Error::RegionGone { .. }), "{e}");
    let mut src2 = agents.1.alloc(4096, Access::LOCAL, None).unwrap();
    fill_pattern(&mut src2.bytes_mut().unwrap(), 37);
    three_small_writes(&peer, &src2, &remote, &dst);
}

/// Three 8 B writes of `src[0..24]` through the ring, then the target's bytes verified.
fn three_small_writes(peer: &Peer, src: &Region<'_>, remote: &RegionDesc, dst: &Region<'_>) {
    for i in 0..3u64 {
        let mut t = Transfer::new();
        t.write(src, i * 8, remote, i * 8, 8);
        peer.submit(t).unwrap().wait(WAIT).unwrap();
    }
    assert_eq!(
        first_diff(&dst.bytes().unwrap()[..24], &src.bytes().unwrap()[..24]),
        None
    );
}

/// Ops of 1..=9 bytes at odd offsets, one per transfer: up to 8 bytes they travel as short
/// requests (the op in the slot's control block), 9 as an inline one. Each write lands exactly
/// (the bytes around it untouched), and each read brings back the target's bytes; then the
/// same ops all in flight at once.
#[test]
fn short_writes_and_reads_of_every_length_up_to_nine_bytes_land_exactly() {
    let (agents, peer, remote, dst, src) = pair(4096, 41);
    let mut at = 3u64;
    for len in 1..=9u64 {
        let mut t = Transfer::new();
        t.write(&src, at, &remote, at, len);
        let rep = peer.submit(t).unwrap().wait(WAIT).unwrap();
        assert_eq!(rep.bytes, len);
        let got = dst.bytes().unwrap();
        let want = src.bytes().unwrap();
        let (a, b) = (at as usize, (at + len) as usize);
        assert_eq!(first_diff(&got[a..b], &want[a..b]), None, "{len} B write");
        assert_eq!(got[a - 1], 0, "the byte before a {len} B write changed");
        assert_eq!(got[b], 0, "the byte after a {len} B write changed");
        at += len + 2;
    }
    // Reads of the same spans into a fresh local region.
    let back = agents.1.alloc(4096, Access::LOCAL, None).unwrap();
    let mut handles = Vec::new();
    let mut at = 3u64;
    for len in 1..=9u64 {
        let mut t = Transfer::new();
        t.read(&back, at, &remote, at, len);
        handles.push(peer.submit(t).unwrap());
        at += len + 2;
    }
    for h in handles {
        h.wait(WAIT).unwrap();
    }
    let (got, want) = (back.bytes().unwrap(), dst.bytes().unwrap());
    assert_eq!(first_diff(&got[..at as usize], &want[..at as usize]), None);
    assert!(
        got[3..at as usize].iter().any(|&b| b != 0),
        "nothing was read"
    );
}
