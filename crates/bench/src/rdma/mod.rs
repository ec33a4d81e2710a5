//! RDMA cases (`gdx bench --path rdma`, opt-in): perftest-style RDMA WRITE and READ bandwidth
//! and latency over gdx-rdma's single operations ([`gdx_rdma::link`]), with host or GPU memory
//! here and host or GPU 0 memory on the other side. [`session`] times them and holds the bench
//! server `gdx serve --rdma-listen` runs; [`proto`] is the control protocol between the two.
//!
//! The other side is `gdx serve --rdma-listen` at the address given (`--peer`, or
//! `--rdma-peer` when the shm/tcp cases run against the engine agent in the same run), or,
//! without one, a loopback server in this process whose traffic loops through the NIC.
//!
//! Without libibverbs, without an RDMA device or without an ACTIVE port, every case is waived
//! with gdx-rdma's discovery reason ("no RDMA device: libibverbs lists no devices and ...").
//!
//! Method (this module's own, not the wall-clock loop of the other cases): per size, `--warmup`
//! operations, then `--min-samples` bandwidth samples of `--iters` operations (default
//! `--max-samples`, fewer for large sizes so one sample stays near `--duration` at
//! [`ASSUMED_BYTES_PER_S`]) with a window of operations in flight, then as many single
//! operations timed from post to completion: the latency is one round trip, not perftest's
//! half. Host ↔ host runs are pattern-checked; GPU memory is not. These cases have never run
//! on hardware (see `docs/rdma.md`).

use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

pub mod proto;
pub mod session;

pub use proto::{bench_key, BenchMem, BenchOp, Control, TcpControl, BENCH_VERSION};
pub use session::{run_client, run_loopback, serve, serve_on, RdmaParams, RdmaRun, SizeTimes};

use crate::case::{BenchCase, CaseSpec, End, Params, PathKind, Waived};
use crate::error::BenchError;
use crate::figures::fill_row;
use crate::report::Row;
use crate::Ctx;
use gdx_rdma::RdmaError;

/// The rate a bandwidth sample is sized for (NIC ports run up to 400 Gb/s = 50 GB/s), so a
/// sample of a large size stays near `--duration`.
pub const ASSUMED_BYTES_PER_S: f64 = 25e9;

/// The header note of a run with rdma cases: their method differs from the other cases'.
pub const METHOD_NOTE: &str = "rdma cases: their own method: per size, warm-up operations, then --min-samples bandwidth samples of --iters operations (default --max-samples; fewer for large sizes) with 64 in flight, median reported; latency = post to completion of one operation (a round trip, not perftest's half); run on Soft-RoCE (rxe) in CI, not yet on a hardware NIC";

/// The name of the other side when there is no peer.
pub const LOOPBACK: &str = "loopback";

/// One RDMA case: an operation between memory here and memory there.
struct RdmaCase {
    spec: CaseSpec,
    op: BenchOp,
    local: BenchMem,
    remote: BenchMem,
    peer: Option<String>,
}

fn describe(mem: BenchMem) -> String {
    match mem {
        BenchMem::Host => "host memory".into(),
        BenchMem::Gpu(n) => format!("GPU{n} memory"),
    }
}

fn end(mem: BenchMem, remote: Option<&str>) -> End {
    match (mem, remote) {
        (BenchMem::Host, None) => End::Host,
        (BenchMem::Gpu(n), None) => End::Gpu(n),
        (BenchMem::Host, Some(a)) => End::Remote(a.to_string()),
        (BenchMem::Gpu(n), Some(a)) => End::RemoteGpu(a.to_string(), n),
    }
}

/// The session's parameters for one case under the run's `params`.
pub fn bench_params(
    ctx: &Ctx,
    params: &Params,
    op: BenchOp,
    local: BenchMem,
    remote: BenchMem,
) -> RdmaParams {
    let iterations = params.iters.unwrap_or(params.max_samples).max(1);
    RdmaParams {
        op,
        local,
        remote,
        sizes: params.sizes.clone(),
        iterations,
        warmup: params.warmup,
        samples: params.min_samples.max(1),
        device: ctx.rdma_device.clone(),
        // A fixed --iters is taken as given; otherwise large sizes run fewer operations.
        max_bytes_per_sample: params
            .iters
            .is_none()
            .then_some((params.duration.as_secs_f64() * ASSUMED_BYTES_PER_S) as u64),
        // ... and are fitted to --duration at the rate the warm-up measured, so a slow device
        // (Soft-RoCE, a downtrained link) runs a sample in about that time too.
        sample_time: params.iters.is_none().then_some(params.duration),
        ..RdmaParams::default()
    }
}

/// The run's rows in the bench's terms, summarised by the framework ([`fill_row`]):
/// bandwidth median, min and max from the samples (`samples_s` holds the seconds per
/// transfer of each sample), latency p50/p99 from the post-to-completion times, the devices
/// and registration mechanisms in the note. `verify` false drops the pattern check's result.
pub fn rows(spec: &CaseSpec, run: &RdmaRun, verify: bool) -> Vec<Row> {
    run.sizes
        .iter()
        .map(|t| {
            let mut row = Row::new(spec, t.size);
            let per_sample = t.size as f64 * f64::from(t.iterations);
            let iters = u64::from(t.iterations) * t.samples.len() as u64;
            fill_row(&mut row, per_sample, &t.samples, &t.latencies, iters);
            // Seconds per transfer, as the other cases report theirs.
            row.samples_s = t
                .samples
                .iter()
                .map(|d| d.as_secs_f64() / f64::from(t.iterations.max(1)))
                .collect();
            row.verified = if verify { run.verified } else { None };
            if let Some(c) = t.counters.as_ref().filter(|c| !c.moved.is_empty()) {
                row.add_note(format!("NIC counters moved: {}", c.describe()));
            }
            row.nic_counters = t.counters.clone();
            if row.verified == Some(false) {
                row.add_note("verification failed: the pattern checksum differs");
            }
            row.add_note(format!(
                "local {} ({}), remote {} ({}), {} QP{}; latency is post to completion (one round trip, not perftest's half)",
                run.local_device,
                run.local_mechanism,
                run.remote_device,
                run.remote_mechanism,
                run.qps,
                if run.qps == 1 { "" } else { "s" }
            ));
            row
        })
        .collect()
}

/// Connect a control channel to `gdx serve --rdma-listen` at `addr`.
fn connect(addr: &str, timeout: Duration) -> Result<TcpControl, BenchError> {
    let what = format!("connecting to gdx serve --rdma-listen at {addr}");
    let addrs: Vec<_> = addr
        .to_socket_addrs()
        .map_err(BenchError::io(what.clone()))?
        .collect();
    let mut last = BenchError::Unmeasurable(format!("{what}: the address resolves to nothing"));
    for a in addrs {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => return Ok(TcpControl(s)),
            Err(e) => last = BenchError::io(format!("{what} ({a})"))(e),
        }
    }
    Err(last)
}

impl BenchCase for RdmaCase {
    fn spec(&self) -> &CaseSpec {
        &self.spec
    }

    fn applicable(&self, ctx: &Ctx) -> Result<(), Waived> {
        ctx.require_rdma()?;
        if let BenchMem::Gpu(n) = self.local {
            ctx.require_gpus(&[n])?;
        }
        // The loopback server's GPU is one of this machine's.
        if let (BenchMem::Gpu(n), None) = (self.remote, &self.peer) {
            ctx.require_gpus(&[n])?;
        }
        Ok(())
    }

    fn run(&self, ctx: &Ctx, params: &Params, sink: &mut dyn FnMut(Row)) -> Result<(), BenchError> {
        let p = bench_params(ctx, params, self.op, self.local, self.remote);
        let run = match &self.peer {
            Some(addr) => {
                let mut ctrl = connect(addr, p.timeout)?;
                run_client(&mut ctrl, &p)
            }
            None => run_loopback(&p),
        }
        // gdx-rdma's error is kept as the source; its control messages already say which
        // side failed ("peer: ..."), so nothing is read back out of the text. A library the
        // peer lacks (no CUDA there for a GPU case) waives the case.
        .map_err(|source| match source {
            RdmaError::Library(u) if self.peer.is_some() => {
                BenchError::Waived(format!("the peer cannot serve this memory: {u}"))
            }
            source => BenchError::Rdma {
                context: format!(
                    "rdma bench against {}",
                    self.peer.as_deref().unwrap_or("the loopback server")
                ),
                source,
            },
        })?;
        for row in rows(&self.spec, &run, params.verify) {
            sink(row);
        }
        Ok(())
    }

    fn opt_in(&self) -> bool {
        true
    }
}

/// Whether `spec` is one of the raw verbs cases below (against a `gdx serve --rdma-listen`
/// server), not the engine's rdma case (`crate::host`, against a `gdx serve` agent).
pub fn is_raw(spec: &CaseSpec) -> bool {
    spec.path == PathKind::Rdma
        && (spec.key.ends_with("_rdma_write") || spec.key.ends_with("_rdma_read"))
}

/// The rdma cases against `peer` (a `gdx serve --rdma-listen` address; a loopback server when
/// `None`): WRITE and READ between host or each of `gpus` GPUs here and host or GPU 0 memory
/// there.
pub fn cases(peer: Option<&str>, gpus: u32) -> Vec<Box<dyn BenchCase>> {
    let there = peer.unwrap_or(LOOPBACK);
    let where_ = peer.map_or(
        "a loopback server in this process (through the NIC)".to_string(),
        |p| format!("the gdx serve --rdma-listen at {p}"),
    );
    let locals: Vec<BenchMem> = std::iter::once(BenchMem::Host)
        .chain((0..gpus).map(BenchMem::Gpu))
        .collect();
    let mut v: Vec<Box<dyn BenchCase>> = Vec::new();
    for op in [BenchOp::Write, BenchOp::Read] {
        for &local in &locals {
            for remote in [BenchMem::Host, BenchMem::Gpu(0)] {
                let (l, r) = (end(local, None), end(remote, Some(there)));
                let (src, dst, description) = match op {
                    BenchOp::Write => (
                        l,
                        r,
                        format!(
                            "RDMA WRITE from {} here into {} of {where_}",
                            describe(local),
                            describe(remote)
                        ),
                    ),
                    BenchOp::Read => (
                        r,
                        l,
                        format!(
                            "RDMA READ from {} of {where_} into {} here",
                            describe(remote),
                            describe(local)
                        ),
                    ),
                };
                v.push(Box::new(RdmaCase {
                    spec: CaseSpec {
                        key: bench_key(op, local, remote),
                        description,
                        path: PathKind::Rdma,
                        src,
                        dst,
                        bidir: false,
                    },
                    op,
                    local,
                    remote,
                    peer: peer.map(str::to_string),
                }));
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Status;
    use gdx_rdma::Mechanism;

    #[test]
    fn keys_ends_and_opt_in() {
        let c = cases(None, 1);
        assert_eq!(c.len(), 8);
        let keys: Vec<&str> = c.iter().map(|c| c.spec().key.as_str()).collect();
        for k in [
            "host_to_remote_host_rdma_write",
            "gpu0_to_remote_gpu0_rdma_write",
            "remote_host_to_host_rdma_read",
            "remote_gpu0_to_gpu0_rdma_read",
        ] {
            assert!(keys.contains(&k), "{k} in {keys:?}");
        }
        assert!(c
            .iter()
            .all(|c| c.opt_in() && c.spec().path == PathKind::Rdma && is_raw(c.spec())));
        let read = c
            .iter()
            .find(|c| c.spec().key == "remote_gpu0_to_host_rdma_read")
            .unwrap();
        assert_eq!(read.spec().src.name(), "remote:loopback/gpu0");
        assert_eq!(read.spec().dst.name(), "host");
        let p = cases(Some("10.0.0.2:7448"), 1);
        assert_eq!(p[0].spec().dst.name(), "remote:10.0.0.2:7448");
        assert!(p[0].spec().description.contains("10.0.0.2:7448"));
    }

    #[test]
    fn without_rdma_every_case_is_waived_with_the_reason() {
        let ctx = Ctx::without_devices();
        for c in cases(None, 1) {
            let w = c.applicable(&ctx).unwrap_err();
            assert!(w.reason.contains("RDMA cases disabled"), "{w}");
            assert_eq!(w.cause.map(|c| c.scope).as_deref(), Some("RDMA cases"));
        }
        // This machine: the reason is gdx-rdma's own.
        let live = Ctx::default();
        if let Err(u) = gdx_rdma::discover() {
            let w = cases(None, 1)[0].applicable(&live).unwrap_err();
            assert_eq!(w.cause.map(|c| c.reason), Some(u.to_string()));
        }
    }

    #[test]
    fn params_follow_the_run() {
        let ctx = Ctx::without_devices();
        let params = Params {
            sizes: vec![8, 1 << 30],
            ..Params::default()
        };
        let p = bench_params(
            &ctx,
            &params,
            BenchOp::Read,
            BenchMem::Host,
            BenchMem::Gpu(0),
        );
        assert_eq!(p.sizes, vec![8, 1 << 30]);
        assert_eq!(p.samples, 3);
        assert_eq!(p.iterations_for(8), 1000);
        assert_eq!(p.iterations_for(1 << 30), 4, "200 ms at 25 GB/s");
        let fixed = bench_params(
            &ctx,
            &Params {
                iters: Some(5),
                ..params
            },
            BenchOp::Write,
            BenchMem::Host,
            BenchMem::Host,
        );
        assert_eq!(fixed.iterations_for(1 << 30), 5);
    }

    #[test]
    fn a_run_becomes_rows() {
        use gdx_topo::sysfs::counters::{CounterDelta, CounterDeltas, CounterKind};
        let spec = cases(None, 0)[0].spec().clone();
        let ms = Duration::from_millis;
        // 100 operations of 1 MiB per sample: 10.486, 5.243 and 8.389 ms are 10, 20 and
        // 12.5 GB/s.
        let bytes = 100.0 * f64::from(1u32 << 20);
        let at = |gbps: f64| Duration::from_secs_f64(bytes / (gbps * 1e9));
        let run = RdmaRun {
            local_device: "mlx5_0 port 1".into(),
            remote_device: "mlx5_1 port 1".into(),
            local_mechanism: Mechanism::HostMr,
            remote_mechanism: Mechanism::DmaBuf,
            qps: 2,
            verified: Some(true),
            sizes: vec![SizeTimes {
                size: 1 << 20,
                iterations: 100,
                samples: vec![at(10.0), at(20.0), at(12.5)],
                latencies: vec![ms(4) / 1000, ms(5) / 1000, ms(6) / 1000],
                counters: Some(CounterDeltas {
                    device: "mlx5_0".into(),
                    port: 1,
                    read: 16,
                    moved: vec![CounterDelta {
                        counter: "hw_counters/out_of_sequence".into(),
                        delta: 42,
                        kind: CounterKind::OutOfSequence,
                    }],
                }),
            }],
        };
        let r = rows(&spec, &run, true);
        assert_eq!(r.len(), 1);
        let row = &r[0];
        assert_eq!(row.status, Status::Passed);
        assert!((row.bw_gbps.unwrap() - 12.5).abs() < 1e-6);
        assert!((row.bw_min_gbps.unwrap() - 10.0).abs() < 1e-6);
        assert!((row.bw_max_gbps.unwrap() - 20.0).abs() < 1e-6);
        assert!((row.lat_p50_us.unwrap() - 5.0).abs() < 1e-6);
        assert_eq!(row.iters, 300);
        assert_eq!(row.samples_s.len(), 3);
        assert!((row.samples_s[0] - at(10.0).as_secs_f64() / 100.0).abs() < 1e-12);
        assert_eq!(row.verified, Some(true));
        let note = row.note.as_deref().unwrap();
        assert!(note.contains("mlx5_0 port 1 (host ibv_reg_mr)") && note.contains("dma-buf"));
        assert!(note.contains("2 QPs"));
        assert_eq!(rows(&spec, &run, false)[0].verified, None);
        // The counters that moved are in the note and, named, in the JSON row.
        assert!(
            note.contains(
                "NIC counters moved: mlx5_0/1: hw_counters/out_of_sequence +42 (out-of-sequence)"
            ),
            "{note}"
        );
        let j = serde_json::to_value(row).unwrap();
        assert_eq!(j["nic_counters"]["read"], 16);
        assert_eq!(
            j["nic_counters"]["moved"][0]["counter"],
            "hw_counters/out_of_sequence"
        );
        assert_eq!(j["nic_counters"]["moved"][0]["delta"], 42);
        assert_eq!(j["nic_counters"]["moved"][0]["kind"], "out-of-sequence");
        // A clean run: the deltas are there, empty, and the note says nothing about them.
        let mut clean = run.clone();
        clean.sizes[0].counters.as_mut().unwrap().moved.clear();
        let row = &rows(&spec, &clean, true)[0];
        assert!(!row.note.as_deref().unwrap().contains("NIC counters"));
        let j = serde_json::to_value(row).unwrap();
        assert_eq!(j["nic_counters"]["moved"].as_array().unwrap().len(), 0);
    }
}
