//! Host cases: `host_to_host_memcpy` (the baseline), and `host_to_host_shm` /
//! `host_to_host_tcp` between two gdx agents — a loopback agent this process starts, or a
//! `gdx serve` elsewhere (`--peer HOST:PORT`, perftest style).
//!
//! Every op is timed with a monotonic clock around submit + wait, so bandwidth and latency
//! come from the same samples. The source rotates over a window of up to
//! [`crate::ROTATE_BYTES`]; after the timed loop the touched part of the destination is
//! compared with the source (read back from the peer; in loopback read directly).

use std::cell::RefCell;
use std::time::{Duration, Instant};

use gdx_base::pattern::fill_pattern;

use crate::case::{BenchCase, CaseSpec, End, Params, PathKind, Waived, ROTATE_BYTES};
use crate::error::{BenchError, Mismatch};
use crate::figures::fill_row;
use crate::report::Row;
use crate::Ctx;
use gdx_base::clock;
use gdx_sys::timer::CpuClock;

#[path = "host_agent.rs"]
mod agent;
pub(crate) use agent::AgentCase;

/// What one timed loop measured.
#[derive(Debug)]
pub(crate) struct Timed {
    /// Wall time of each timed op.
    pub samples: Vec<Duration>,
    /// Ops run untimed first.
    pub warmed: u64,
    /// CPU seconds per GB during the timed ops.
    pub cpu_s_per_gb: Option<f64>,
}

/// The wall-clock protocol: the warm-up ops (all on slot 0) estimate the time per op (their
/// fastest), `prepare(n)` is told how many timed ops follow, then timed op `i` (0..n) does
/// the `i`-th transfer of `bytes` bytes through `op(i)`; slot 0 must hold the pattern before
/// the call, `prepare` fills the rest.
pub(crate) fn wall_loop(
    params: &Params,
    bytes: f64,
    prepare: impl FnMut(u64) -> Result<(), BenchError>,
    op: impl FnMut(u64) -> Result<(), BenchError>,
) -> Result<Timed, BenchError> {
    wall_loop_between(params, bytes, Warmup::NONE, prepare, op, |_| Duration::ZERO)
}

/// `wall_loop`, calling `between(i)` before timed op `i`, outside its timing; `between`
/// returns the CPU time it spent, which the row's CPU figure leaves out. The warm-up runs at
/// least `params.warmup` ops, then goes on while it is under `warm` (`Warmup::NONE`: no more).
pub(crate) fn wall_loop_between(
    params: &Params,
    bytes: f64,
    warm: Warmup,
    mut prepare: impl FnMut(u64) -> Result<(), BenchError>,
    mut op: impl FnMut(u64) -> Result<(), BenchError>,
    mut between: impl FnMut(u64) -> Duration,
) -> Result<Timed, BenchError> {
    let mut est = Duration::MAX;
    let began = Instant::now();
    let mut warmed = 0u64;
    while warmed < u64::from(params.warmup.max(1))
        || (warmed < warm.ops && began.elapsed() < warm.at_most)
    {
        let (done, d) = clock::wall(|| op(0));
        done?;
        est = est.min(d);
        warmed += 1;
    }
    let iters = u64::from(params.plan_iters(est));
    prepare(iters)?;
    let cpu = CpuClock::now();
    let mut samples = Vec::with_capacity(iters as usize);
    let mut excluded = Duration::ZERO;
    for i in 0..iters {
        excluded += between(i);
        let (done, d) = clock::wall(|| op(i));
        done?;
        samples.push(d);
    }
    Ok(Timed {
        samples,
        cpu_s_per_gb: cpu.shifted(excluded).per_gb_since(bytes * iters as f64),
        warmed,
    })
}

/// How long a timed loop warms up past `--warmup`: up to `ops` ops, for at most `at_most`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Warmup {
    pub ops: u64,
    pub at_most: Duration,
}

impl Warmup {
    /// `--warmup` alone.
    pub const NONE: Warmup = Warmup {
        ops: 0,
        at_most: Duration::ZERO,
    };
    /// The small host rows (latency beside a floor, message rate): as many transfers as the
    /// run-wide floors' warm-up round trips, within 50 ms. An engine's first few thousand
    /// small transfers after it connects run well above its steady state (its threads and
    /// the vCPUs under them settle: on the 2-vCPU CI-class VM the 8 B shm p50 of 1,000
    /// samples after 2 warm-up transfers is 0.72–0.82 µs, after 20,000 it is 0.54–0.56 µs),
    /// while the floor it is judged against is timed after its own warm-up.
    pub const SMALL_HOST: Warmup = Warmup {
        ops: crate::floors::WARMUP as u64,
        at_most: Duration::from_millis(50),
    };
}

/// Fill a row from wall-clock samples: bandwidth and latency come from the same samples, so
/// `lat_samples_s` stays empty (see `samples_s`).
pub(crate) fn fill_wall_row(row: &mut Row, bytes: f64, t: &Timed) {
    fill_row(row, bytes, &t.samples, &t.samples, t.samples.len() as u64);
    row.lat_samples_s.clear();
    row.cpu_s_per_gb = t.cpu_s_per_gb;
}

/// Largest size a host row is judged against a latency floor at (and warmed up for).
const NEAR_MAX: u64 = 64 << 10;

pub use crate::report::WINDOW_NOTE;

/// Marks a row measured with prepared transfers (`--prepared`).
pub const PREPARED_NOTE: &str = "prepared transfers";

/// Most transfers `--prepared` prepares per size.
const MOST_PREPARED: u64 = 1024;

/// The slots `--prepared` rotates over, of the `n` the fresh transfers would: at most
/// `MOST_PREPARED` transfers' worth, a whole number of `batch`-op transfers when there is room
/// for one.
fn prepared_slots(n: u64, batch: u64) -> u64 {
    let n = n.min(MOST_PREPARED * batch);
    if n >= batch {
        n - n % batch
    } else {
        n
    }
}

/// Slots of `size` bytes the buffers rotate over inside a `window`-byte buffer.
pub(crate) fn slots(size: u64, window: u64) -> u64 {
    (window.min(ROTATE_BYTES.max(size)) / size.max(1)).max(1)
}

/// Bytes from offset 0 that `ops` rotating ops of `size` bytes touched.
pub(crate) fn touched(size: u64, window: u64, ops: u64) -> u64 {
    slots(size, window).min(ops) * size
}

/// A per-size seed, so a later size cannot pass on bytes an earlier one left.
pub(crate) fn seed_for(size: u64) -> u64 {
    0x6764_785f_6265_6e63 ^ size.rotate_left(17)
}

/// The first differing byte of two equal-length slices.
pub(crate) fn compare(got: &[u8], want: &[u8]) -> Option<Mismatch> {
    Mismatch::find(got, want, 0)
}

struct Memcpy {
    spec: CaseSpec,
}

impl BenchCase for Memcpy {
    fn spec(&self) -> &CaseSpec {
        &self.spec
    }

    fn applicable(&self, _ctx: &Ctx) -> Result<(), Waived> {
        Ok(())
    }

    fn run(
        &self,
        _ctx: &Ctx,
        params: &Params,
        sink: &mut dyn FnMut(Row),
    ) -> Result<(), BenchError> {
        let window = params.max_size().max(1);
        let mut src = vec![0u8; window as usize];
        let mut dst = vec![0u8; window as usize];
        for &size in &params.sizes {
            let n = slots(size, window);
            let s = size as usize;
            fill_pattern(&mut src[..s], seed_for(size));
            dst.fill(0);
            let mut total = 0;
            let cell = RefCell::new(&mut src);
            let timed = wall_loop(
                params,
                size as f64,
                |t| {
                    total = t;
                    let tb = touched(size, window, t) as usize;
                    fill_pattern(&mut cell.borrow_mut()[..tb], seed_for(size));
                    Ok(())
                },
                |i| {
                    let off = ((i % n) * size) as usize;
                    let src = cell.borrow();
                    dst[off..off + s].copy_from_slice(std::hint::black_box(&src[off..off + s]));
                    std::hint::black_box(&mut dst);
                    Ok(())
                },
            )?;
            let mut row = Row::new(&self.spec, size);
            fill_wall_row(&mut row, size as f64, &timed);
            row.cpu_s_per_gb = timed.cpu_s_per_gb;
            if params.verify {
                let tb = touched(size, window, total) as usize;
                let bad = compare(&dst[..tb], &src[..tb]);
                row.verified = Some(bad.is_none());
                if let Some(b) = bad {
                    row.add_note(b.to_string());
                }
            }
            sink(row);
        }
        Ok(())
    }
}

/// The host cases, against `peer` (a `gdx serve` address) or a loopback agent.
pub fn cases_for(peer: Option<&str>, region: &str) -> Vec<Box<dyn BenchCase>> {
    let dst = peer.map_or(End::Host, |p| End::Remote(p.to_string()));
    let where_ = peer.map_or("a loopback agent in this process".to_string(), |p| {
        format!("the gdx serve agent at {p}")
    });
    let mk = |path: PathKind, how: &str| -> Box<dyn BenchCase> {
        let key = match &dst {
            End::Remote(_) => format!("host_to_remote_{}", path.name()),
            _ => format!("host_to_host_{}", path.name()),
        };
        Box::new(AgentCase {
            spec: CaseSpec {
                key,
                description: format!("write from host memory into {where_}'s region over {how}"),
                path,
                src: End::Host,
                dst: dst.clone(),
                bidir: false,
            },
            peer: peer.map(str::to_string),
            region: region.to_string(),
            provider: None,
        })
    };
    vec![
        Box::new(Memcpy {
            spec: CaseSpec {
                key: "host_to_host_memcpy".into(),
                description: "single-thread memcpy between two host buffers (baseline)".into(),
                path: PathKind::Memcpy,
                src: End::Host,
                dst: End::Host,
                bidir: false,
            },
        }),
        mk(
            PathKind::Shm,
            "shared memory (one copy into the mapped region)",
        ),
        mk(PathKind::Tcp, "TCP (kernel sockets)"),
        mk(
            PathKind::Rdma,
            "the engine's rdma transport (RDMA WRITE; --nics chooses the rails, each row names them)",
        ),
    ]
}

/// The host cases against a loopback agent.
pub fn cases() -> Vec<Box<dyn BenchCase>> {
    cases_for(None, "bench")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_stays_inside_the_window() {
        assert_eq!(slots(8, 1 << 30), ROTATE_BYTES / 8);
        assert_eq!(slots(1 << 30, 1 << 30), 1);
        assert_eq!(slots(1 << 20, 4 << 20), 4);
        assert_eq!(touched(1 << 20, 4 << 20, 10), 4 << 20);
        assert_eq!(touched(1 << 20, 4 << 20, 2), 2 << 20);
    }

    #[test]
    fn loopback_shm_and_tcp_measure_and_verify() {
        let ctx = Ctx::without_devices();
        let params = Params {
            sizes: vec![8, 65536],
            duration: Duration::from_millis(20),
            max_samples: 20,
            ..Params::default()
        };
        for r in run_cases(&ctx, &params, host_only()) {
            assert!(r.bw_gbps.is_some_and(|b| b > 0.0));
            assert!(r.iters >= 3);
        }
    }

    /// Runs `cases` with `params`: every case gives one verified row per size.
    fn run_cases(ctx: &Ctx, params: &Params, cases: Vec<Box<dyn BenchCase>>) -> Vec<Row> {
        let mut all = Vec::new();
        for case in cases {
            let mut rows = Vec::new();
            case.run(ctx, params, &mut |r| rows.push(r))
                .unwrap_or_else(|e| panic!("{}: {e}", case.spec().key));
            assert_eq!(rows.len(), params.sizes.len(), "{}", case.spec().key);
            for r in &rows {
                assert_eq!(r.verified, Some(true), "{} {:?}", r.key, r.note);
            }
            all.extend(rows);
        }
        all
    }

    /// The cases that need no device (all but the opt-in rdma case, which the VM suites run).
    fn host_only() -> Vec<Box<dyn BenchCase>> {
        cases().into_iter().filter(|c| !c.opt_in()).collect()
    }

    /// The shm and tcp cases (the loopback agents), without the memcpy baseline.
    fn agent_cases() -> Vec<Box<dyn BenchCase>> {
        host_only()
            .into_iter()
            .filter(|c| c.spec().key != "host_to_host_memcpy")
            .collect()
    }

    /// The engine's rdma case: opt-in, not one of the raw verbs cases, and waived here with the
    /// reason (no RDMA device). The VM suites run it (`scripts/rdma-vm/suite-*.sh`).
    #[test]
    fn the_engine_rdma_case_is_opt_in_and_says_why_it_is_waived() {
        let rdma: Vec<_> = cases()
            .into_iter()
            .filter(|c| c.spec().path == PathKind::Rdma)
            .collect();
        assert_eq!(rdma.len(), 1);
        assert_eq!(rdma[0].spec().key, "host_to_host_rdma");
        assert!(rdma[0].opt_in());
        assert!(!crate::rdma::is_raw(rdma[0].spec()));
        let w = rdma[0].applicable(&Ctx::without_devices()).unwrap_err();
        assert!(w.reason.contains("RDMA cases disabled"), "{w}");
        let remote = cases_for(Some("10.0.0.2:7447"), "bench")
            .into_iter()
            .find(|c| c.spec().path == PathKind::Rdma)
            .unwrap();
        assert_eq!(remote.spec().key, "host_to_remote_rdma");
    }

    /// `--prepared`, alone, in a batch and in a window: rows measured, verified and marked.
    #[test]
    fn prepared_transfers_measure_verify_and_say_so() {
        let ctx = Ctx::without_devices();
        for (batch, window) in [(1, 1), (4, 1), (1, 8)] {
            let params = Params {
                sizes: vec![8, 65536],
                duration: Duration::from_millis(20),
                max_samples: 20,
                batch,
                window,
                prepared: true,
                ..Params::default()
            };
            for r in run_cases(&ctx, &params, agent_cases()) {
                assert!(
                    r.note.as_deref().is_some_and(|n| n.contains(PREPARED_NOTE)),
                    "{} {:?}",
                    r.key,
                    r.note
                );
            }
        }
    }

    /// A batch row of at least `copyref::MIN_BYTES` per transfer carries a memcpy of the same
    /// bytes measured beside it; a one-op row, a small batch and a window of batches do not.
    #[test]
    fn batch_rows_carry_a_memcpy_of_the_same_bytes() {
        let ctx = Ctx::without_devices();
        for (batch, window, size, want) in [
            (32, 1, 4096, true),
            (1, 1, 65536, false),
            (4, 1, 8, false),
            (32, 2, 4096, false),
        ] {
            // A fixed count of transfers, not a duration: a slow (debug, loaded) build must
            // still fill the blocks a copy is paired with.
            let params = Params {
                sizes: vec![size],
                iters: Some(40),
                max_samples: 40,
                batch,
                window,
                ..Params::default()
            };
            for r in run_cases(&ctx, &params, agent_cases()) {
                assert_eq!(
                    r.copy_near.is_some(),
                    want,
                    "{} batch {batch} window {window}",
                    r.key
                );
                if let Some(n) = &r.copy_near {
                    assert_eq!(n.bytes, 32 * 4096);
                    assert!(n.blocks >= 1 && n.copy_gbps > 0.0, "{n:?}");
                    assert!(n.ratio_min <= n.ratio && n.ratio <= n.ratio_max && n.ratio > 0.0);
                    let line = crate::copyref::beside(&[&r]);
                    assert!(
                        line.contains("single-thread memcpy of the same 128 KiB"),
                        "{line}"
                    );
                }
            }
        }
    }

    /// Small rows are timed after the floors' warm-up (and say so); a row above `NEAR_MAX`
    /// keeps `--warmup` alone.
    #[test]
    fn small_host_rows_warm_up_as_the_floors_do() {
        let ctx = Ctx::without_devices();
        let params = Params {
            sizes: vec![8, 2 * NEAR_MAX],
            duration: Duration::from_millis(20),
            max_samples: 20,
            ..Params::default()
        };
        let shm = cases()
            .into_iter()
            .filter(|c| c.spec().key == "host_to_host_shm")
            .collect();
        let rows = run_cases(&ctx, &params, shm);
        assert_eq!(rows.len(), 2, "{rows:?}");
        for r in rows {
            let noted = r
                .note
                .as_deref()
                .is_some_and(|n| n.contains("warm-up transfer(s)"));
            assert_eq!(
                noted,
                r.size_bytes <= NEAR_MAX,
                "{} B: {:?}",
                r.size_bytes,
                r.note
            );
            assert_eq!(r.verified, Some(true), "{} B: {:?}", r.size_bytes, r.note);
        }
    }

    #[test]
    fn prepared_slots_are_whole_transfers_and_bounded() {
        assert_eq!(prepared_slots(64, 1), 64);
        assert_eq!(prepared_slots(1 << 20, 1), MOST_PREPARED);
        assert_eq!(prepared_slots(1000, 3), 999);
        assert_eq!(prepared_slots(2, 8), 2);
    }
}
