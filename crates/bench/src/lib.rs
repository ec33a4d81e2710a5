//! gdx-bench: `gdx bench` and `gdx calibrate` as a library — every data path this machine
//! has, every size, each figure judged against the topology's ceiling. It returns data
//! ([`Report`], [`Row`]); the CLI renders it.
//!
//! # Shape (nvbandwidth's, with hyperfine's exports)
//!
//! - A [`BenchCase`] is one small unit with a stable key (`gpu0_to_gpu1_p2p`,
//!   `host_to_host_shm`), registered in [`all_cases`]. It is applicable here or [`Waived`] with
//!   a reason; one case's error never aborts the others ([`run`] also catches panics).
//! - [`Ctx`] is what cases may look at: the topology, the CUDA driver (loaded on first use),
//!   NVML, the measured `memcpy` baseline. [`Ctx::mock`] gives the deterministic mock backend
//!   that the CLI tests use (`gdx bench --mock`): fixed figures, no timing.
//! - [`Params`] is the protocol (sizes, warm-up, duration per size, sample bounds, verify).
//! - [`ceiling`] turns the topology into a ceiling per path and flags figures far below it.
//! - [`render`] (tables), [`plot`] (SVG), [`compare`] (ratio to an earlier run) and
//!   [`calibrate`] (crossovers, written in the engine's [`gdx_engine::Calibration`] format).
//!
//! The method and the JSON schema are documented in `docs/bench/README.md`.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod calibrate;
pub mod case;
pub mod ceiling;
pub mod compare;
pub mod copyref;
pub mod ctx;
pub mod error;
pub mod export;
pub mod fabric;
pub mod figures;
pub mod file;
pub mod floors;
pub mod gpu;
pub mod header;
pub mod host;
pub mod hostceil;
pub mod mock;
pub mod plot;
pub mod rdma;
pub mod render;
pub mod report;
pub mod spec;

pub use case::{
    default_sizes, BenchCase, CaseSpec, Cause, End, Params, PathKind, Waived, ROTATE_BYTES,
};
pub use ctx::{gpu_missing, Ctx};
pub use error::{BenchError, Mismatch};
pub use export::Exporter;
pub use report::{CaseOutcome, Header, Method, Report, Row, Status, WaivedGroup, SCHEMA_VERSION};

use std::panic::{catch_unwind, AssertUnwindSafe};

/// Every case for this context, in a stable order: host paths first, then host ↔ GPU, then
/// GPU ↔ GPU. GPU cases are listed for at least two GPUs so `--list` shows them anywhere
/// (they are waived where the GPUs are missing). The mock context lists the mock cases.
pub fn all_cases(ctx: &Ctx) -> Vec<Box<dyn BenchCase>> {
    if ctx.mock {
        return mock::cases();
    }
    let mut v = match &ctx.peer {
        Some((addr, region)) => host::cases_for(Some(addr), region),
        None => host::cases(),
    };
    v.extend(gpu::cases(ctx.gpu_count().max(2)));
    v.extend(file::cases(ctx.gpu_count().max(1)));
    v.extend(rdma::cases(
        ctx.rdma_peer.as_deref(),
        ctx.gpu_count().max(1),
    ));
    v.extend(fabric::cases(ctx));
    v
}

/// Keep the cases matching any of `selectors`: a key, an index into `cases` (as `--list`
/// prints it), a key prefix, or a path name (`p2p`, `shm`). Empty selectors keep all but the
/// opt-in cases ([`BenchCase::opt_in`]: the `file` and `rdma` cases), which a selector keeps
/// only when it is their key, their index, their path name (`file`, `rdma`) or a key prefix
/// that names their path.
///
/// A `--path` selector that matched no case.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--path {selector:?} matches no case (give a key, an index, a key prefix or a path name; `gdx bench --list` shows them: {})", keys.join(", "))]
pub struct NoCaseMatches {
    /// The selector.
    pub selector: String,
    /// The keys there are.
    pub keys: Vec<String>,
}

/// # Errors
/// The selector that matched nothing, with the keys to choose from.
pub fn select(
    cases: Vec<Box<dyn BenchCase>>,
    selectors: &[String],
) -> Result<Vec<Box<dyn BenchCase>>, NoCaseMatches> {
    if selectors.is_empty() {
        return Ok(cases.into_iter().filter(|c| !c.opt_in()).collect());
    }
    let matches = |i: usize, c: &dyn BenchCase, s: &str| {
        let spec = c.spec();
        s.parse::<usize>().ok() == Some(i)
            || spec.key == s
            || (spec.key.starts_with(s) && (!c.opt_in() || s.contains(spec.path.name())))
            || spec.path.name() == s
    };
    for s in selectors {
        if !cases
            .iter()
            .enumerate()
            .any(|(i, c)| matches(i, c.as_ref(), s))
        {
            return Err(NoCaseMatches {
                selector: s.clone(),
                keys: cases.iter().map(|c| c.spec().key.clone()).collect(),
            });
        }
    }
    Ok(cases
        .into_iter()
        .enumerate()
        .filter(|(i, c)| selectors.iter().any(|s| matches(*i, c.as_ref(), s)))
        .map(|(_, c)| c)
        .collect())
}

/// Keep host-only cases, host ↔ GPU cases of GPU `a` or `b`, and GPU ↔ GPU cases between `a`
/// and `b` (either direction).
pub fn filter_pair(cases: Vec<Box<dyn BenchCase>>, a: u32, b: u32) -> Vec<Box<dyn BenchCase>> {
    let in_pair = |e: &End| matches!(e, End::Gpu(n) if *n == a || *n == b);
    cases
        .into_iter()
        .filter(|c| {
            let s = c.spec();
            match (&s.src, &s.dst) {
                (End::Gpu(x), End::Gpu(y)) => {
                    (*x == a && *y == b) || (*x == b && *y == a) || (x == y && in_pair(&s.src))
                }
                (End::Gpu(_), _) => in_pair(&s.src),
                (_, End::Gpu(_)) => in_pair(&s.dst),
                _ => true,
            }
        })
        .collect()
}

/// What the runner tells its caller as it goes (progress, incremental exports, streaming
/// tables). Every method has an empty default.
pub trait Observer {
    /// Cases waived for a shared reason, once, before the first case runs.
    fn waived_groups(&mut self, _groups: &[WaivedGroup]) {}
    /// Case `index` of `total` starts.
    fn case_started(&mut self, _spec: &CaseSpec, _index: usize, _total: usize) {}
    /// A row was measured (ceiling already applied).
    fn row(&mut self, _row: &Row, _done_sizes: usize, _total_sizes: usize) {}
    /// A case ended; `report` holds everything so far.
    fn case_finished(&mut self, _outcome: &CaseOutcome, _report: &Report) {}
}

/// An observer that ignores everything.
#[derive(Debug, Default)]
pub struct Quiet;
impl Observer for Quiet {}

/// A case to run, with its own waiver when it has one (it is then recorded, not run).
pub type Planned<'c> = (&'c dyn BenchCase, Option<Waived>);

/// Sort `cases` into those to run (with their individual waivers) and the groups of cases
/// waived for a shared [`Cause`], in first-seen order.
pub fn plan<'c>(
    cases: &'c [Box<dyn BenchCase>],
    ctx: &Ctx,
) -> (Vec<Planned<'c>>, Vec<WaivedGroup>) {
    let mut run = Vec::new();
    let mut groups: Vec<WaivedGroup> = Vec::new();
    for case in cases {
        match case.applicable(ctx) {
            Ok(()) => run.push((case.as_ref(), None)),
            Err(Waived { cause: Some(c), .. }) => match groups
                .iter_mut()
                .find(|g| g.scope == c.scope && g.reason == c.reason)
            {
                Some(g) => g.cases += 1,
                None => groups.push(WaivedGroup {
                    scope: c.scope,
                    reason: c.reason,
                    detail: c.detail,
                    fix: c.fix,
                    cases: 1,
                }),
            },
            Err(w) => run.push((case.as_ref(), Some(w))),
        }
    }
    (run, groups)
}

/// Fill what follows from a row's figures alone (the message rate).
fn finish_row(row: &mut Row) {
    if row.msg_rate_mops.is_none() && row.size_bytes > 0 {
        row.msg_rate_mops = row.bw_gbps.map(|b| b * 1e3 / row.size_bytes as f64);
    }
}

/// Run `cases` in order and collect the report. Cases waived for a shared reason become one
/// [`WaivedGroup`] each reason; other waived cases are recorded with their reason; a case's
/// error (or panic) is recorded with its message and the run goes on.
pub fn run(
    cases: &[Box<dyn BenchCase>],
    ctx: &Ctx,
    params: &Params,
    header: Header,
    obs: &mut dyn Observer,
) -> Report {
    let (todo, groups) = plan(cases, ctx);
    obs.waived_groups(&groups);
    let mut report = Report {
        schema_version: SCHEMA_VERSION,
        header,
        cases: Vec::new(),
        waived: groups,
        results: Vec::new(),
    };
    let total = todo.len();
    for (i, (case, waived)) in todo.into_iter().enumerate() {
        let spec = case.spec();
        obs.case_started(spec, i, total);
        let mut timer = gdx_sys::timer::Timer::wall();
        let _ = timer.start(); // a wall clock cannot fail
        let outcome = match waived {
            Some(w) => CaseOutcome::new(spec, Status::Waived, Some(w.reason), 0.0),
            None => {
                let ceil = ceiling::ceiling(ctx, spec);
                let mut rows = Vec::new();
                let nsizes = params.sizes.len();
                let result = catch_unwind(AssertUnwindSafe(|| {
                    case.run(ctx, params, &mut |mut row: Row| {
                        finish_row(&mut row);
                        ceiling::apply(spec, ceil.as_ref(), &mut row);
                        obs.row(&row, rows.len() + 1, nsizes);
                        rows.push(row);
                    })
                }))
                .unwrap_or_else(|p| {
                    let msg = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "unknown panic".into());
                    Err(BenchError::Panicked(msg))
                });
                report.results.extend(rows);
                let secs = timer.read().unwrap_or_default().as_secs_f64();
                match result {
                    Ok(()) => CaseOutcome::new(spec, Status::Passed, None, secs),
                    Err(BenchError::Waived(why)) => {
                        CaseOutcome::new(spec, Status::Waived, Some(why), secs)
                    }
                    Err(e) => CaseOutcome::new(spec, Status::Error, Some(e.chain()), secs),
                }
            }
        };
        report.cases.push(outcome);
        if report.header.host_ceiling.is_none() {
            report.header.host_ceiling = ctx.host_ceiling_if_measured().cloned();
        }
        if let Some(last) = report.cases.last() {
            obs.case_finished(last, &report);
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_by_key_index_prefix_and_path() {
        let ctx = Ctx::mock();
        let n = all_cases(&ctx).len();
        assert!(n >= 3);
        let one = select(all_cases(&ctx), &["mock_host_to_host_fast".into()]).unwrap();
        assert_eq!(one.len(), 1);
        let idx = select(all_cases(&ctx), &["0".into()]).unwrap();
        assert_eq!(idx[0].spec().key, all_cases(&ctx)[0].spec().key);
        let prefix = select(all_cases(&ctx), &["mock_".into()]).unwrap();
        assert_eq!(prefix.len(), n);
        let err = select(all_cases(&ctx), &["nope".into()])
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("nope") && err.contains("mock_host_to_host_fast"));
    }

    #[test]
    fn live_case_keys_are_unique_and_well_formed() {
        let ctx = Ctx::without_devices();
        let cases = all_cases(&ctx);
        let mut keys: Vec<&str> = cases.iter().map(|c| c.spec().key.as_str()).collect();
        assert!(keys.contains(&"host_to_host_shm"));
        assert!(keys.contains(&"host_to_host_tcp"));
        assert!(keys.contains(&"host_to_gpu0_pinned_ce"));
        assert!(keys.contains(&"gpu0_to_gpu1_p2p"));
        assert!(keys.contains(&"gpu0_gpu1_p2p_bidir"));
        let n = keys.len();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), n);
        let pair = filter_pair(all_cases(&ctx), 1, 0);
        assert!(pair.iter().any(|c| c.spec().key == "gpu1_to_gpu0_p2p"));
    }

    #[test]
    fn cases_waived_for_one_reason_are_one_group() {
        // No CUDA here (or disabled): every GPU case shares the one reason.
        let ctx = Ctx::without_devices();
        let cases = all_cases(&ctx);
        let gpu_cases = cases
            .iter()
            .filter(|c| {
                let s = c.spec();
                !c.opt_in() && (matches!(s.src, End::Gpu(_)) || matches!(s.dst, End::Gpu(_)))
            })
            .count();
        let cases = select(cases, &[]).unwrap();
        let (todo, groups) = plan(&cases, &ctx);
        assert_eq!(groups.len(), 1, "{groups:?}");
        assert_eq!(groups[0].scope, "GPU cases");
        assert!(groups[0].reason.starts_with("no CUDA driver"));
        assert_eq!(groups[0].cases, gpu_cases);
        assert!(gpu_cases >= 10);
        assert!(todo.iter().all(|(c, w)| w.is_none()
            && !matches!(c.spec().src, End::Gpu(_))
            && !matches!(c.spec().dst, End::Gpu(_))));
    }

    #[test]
    fn errors_and_panics_do_not_stop_the_run() {
        let ctx = Ctx::mock();
        let cases = all_cases(&ctx);
        let params = Params {
            sizes: vec![8, 4096],
            ..Params::default()
        };
        let report = run(
            &cases,
            &ctx,
            &params,
            header::mock_header(&params),
            &mut Quiet,
        );
        // Every case is a case outcome or counted in a waived group (the two GPU8 cases).
        let grouped: usize = report.waived.iter().map(|g| g.cases).sum();
        assert_eq!(grouped, 2);
        assert_eq!(report.cases.len() + grouped, cases.len());
        assert!(report.cases.iter().any(|c| c.status == Status::Error));
        assert!(report
            .cases
            .iter()
            .any(|c| c.status == Status::Waived
                && c.reason.as_deref().is_some_and(|r| !r.is_empty())));
        assert!(report.results.iter().all(|r| r.msg_rate_mops.is_some()));
        assert!(report.cases.iter().any(|c| c.status == Status::Passed));
        assert!(report.has_failures());
    }
}
