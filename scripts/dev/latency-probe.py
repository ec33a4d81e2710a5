#!/usr/bin/env python3
"""Puts a temporary timing probe into a gdx checkout, for finding where a small shm transfer's
time goes (issue #17; BENCHMARKS.md, thirteenth session, has what it found).

    python3 scripts/dev/latency-probe.py [REPO]          # default: this checkout
    cargo build --release -p gdx-bench --example shm_lat
    ./target/release/examples/shm_lat 8 200000           # add SHM_LAT_PREPARED=1 for prepared
    git checkout -- crates && rm crates/engine/src/probe.rs   # take it out again

shm_lat then prints "probe ns: tN <ns>...": the mean time from the start of `Peer::submit`
(or `PreparedTransfer::post`) to each mark, over the iterations of under ~1.3 µs (the rest are
dropped as preempted). Marks: t1 slot published, t5 target sees it, t6 target stores DONE, t2
initiator sees DONE (reap), t3 wait has the report, t4 handle and report dropped; fresh
transfers also t7 state built, t8 in flight, t9 submit returns. Each mark is an `rdtsc` and a
store (~15 ns), so later marks read high; compare two builds with the same marks, interleaved.
The marks find their places by exact text: when the code moved, this stops with the anchor it
could not find. Never commit a checkout with the probe in it.
"""
import os
import sys

os.chdir(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))


def sub(path, old, new, count=1):
    s=open(path).read()
    if old not in s:
        sys.exit(f"latency-probe: {path}: anchor not found (the code moved): {old[:60]!r}")
    s=s.replace(old,new,count)
    open(path,'w').write(s)
open('crates/engine/src/probe.rs','w').write('''//! TEMPORARY timing probe (not for commit).
#![allow(missing_docs, clippy::all)]
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
pub static T: [AtomicU64; 16] = [const { AtomicU64::new(0) }; 16];
pub static SUM: [AtomicU64; 16] = [const { AtomicU64::new(0) }; 16];
#[inline(always)]
// SAFETY: rdtsc reads the time-stamp counter; nothing else.
pub fn now() -> u64 { unsafe { core::arch::x86_64::_rdtsc() } }
#[inline(always)]
pub fn mark(i: usize) { T[i].store(now(), Relaxed); }
#[inline(always)]
pub fn mark_once(i: usize) { if T[i].load(Relaxed) == 0 { T[i].store(now(), Relaxed); } }
pub fn fold() {
    let t0 = T[0].load(Relaxed);
    if t0 == 0 { return; }
    let t4 = T[4].load(Relaxed);
    if t4 < t0 || t4 - t0 > 4000 { for i in 0..16 { T[i].store(0, Relaxed); } return; }
    for i in 1..16 { let t = T[i].load(Relaxed); if t >= t0 { SUM[i].fetch_add(t - t0, Relaxed); } T[i].store(0, Relaxed); }
    SUM[0].fetch_add(1, Relaxed);
    T[0].store(0, Relaxed);
}
pub fn rate() -> f64 { let a=now(); let i=std::time::Instant::now(); std::thread::sleep(std::time::Duration::from_millis(50)); (now()-a) as f64 / i.elapsed().as_nanos() as f64 }
pub fn report() -> String {
    let r = rate();
    let n = SUM[0].load(Relaxed).max(1);
    (1..16).filter(|&i| SUM[i].load(Relaxed) > 0).map(|i| format!("t{i} {:.0}", SUM[i].load(Relaxed) as f64 / n as f64 / r)).collect::<Vec<_>>().join(" ")
}
''')
sub('crates/engine/src/lib.rs', "mod agent;\n", "pub mod probe;\nmod agent;\n")
sub('crates/engine/src/server/shm_ring.rs', "            ring.prefetch_control_for_write(s);\n", "            crate::probe::mark_once(5);\n            ring.prefetch_control_for_write(s);\n")
sub('crates/engine/src/server/shm_ring.rs', "            set_state(ring, s, DONE);\n", "            crate::probe::mark_once(6);\n            set_state(ring, s, DONE);\n")
sub('crates/engine/src/transport/shm_ring_client.rs', "        let now = Tick::now();\n        let recent", "        let now = Tick::now();\n        crate::probe::mark_once(1);\n        let recent")
sub('crates/engine/src/transport/shm_ring.rs', "            let Some(mut f) = self.inflight.pop_front() else {", "            crate::probe::mark_once(2);\n            let Some(mut f) = self.inflight.pop_front() else {")
sub('crates/engine/src/peer/mod.rs', "    pub fn submit(&self, mut t: Transfer) -> Result<TransferHandle> {\n", "    pub fn submit(&self, mut t: Transfer) -> Result<TransferHandle> {\n        crate::probe::mark(0);\n")
sub('crates/engine/src/transfer/prepared.rs', "    pub fn post(&mut self) -> Result<TransferHandle> {\n", "    pub fn post(&mut self) -> Result<TransferHandle> {\n        crate::probe::mark(0);\n")
sub('crates/engine/src/transfer/handle.rs', "        if let Some(r) = self.state.report_if_ok() {\n            return Ok(r);", "        if let Some(r) = self.state.report_if_ok() {\n            crate::probe::mark_once(3);\n            return Ok(r);")
sub('crates/engine/src/transport/shm.rs', "            Ok(Some(e)) => {\n                let x = n.into_state();\n                w.in_flight_early(Arc::clone(&x), e);\n", "            Ok(Some(e)) => {\n                let x = n.into_state();\n                crate::probe::mark_once(7);\n                w.in_flight_early(Arc::clone(&x), e);\n                crate::probe::mark_once(8);\n")
sub('crates/engine/src/transport/shm.rs', "        drop(w);\n        done.finish();\n        x\n", "        drop(w);\n        done.finish();\n        crate::probe::mark_once(9);\n        x\n")
p='crates/bench/examples/shm_lat.rs'
s=open(p).read()
s=s.replace("""            h.wait(wait).unwrap();
        }
        let _ = one.stop();
        let us = one.read().unwrap_or_default().as_secs_f64() * 1e6;""","""            h.wait(wait).unwrap();
        }
        gdx_engine::probe::mark(4);
        let _ = one.stop();
        let us = one.read().unwrap_or_default().as_secs_f64() * 1e6;
        if i >= iters / 10 { gdx_engine::probe::fold(); } else { gdx_engine::probe::T[0].store(0, std::sync::atomic::Ordering::Relaxed); }""")
s=s.replace("""        ops * size as f64 / total / 1e9
    );""","""        ops * size as f64 / total / 1e9
    );
    println!("probe ns: {}", gdx_engine::probe::report());""")
open(p,'w').write(s)
