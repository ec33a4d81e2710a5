//! gdx-doctor: is this machine (or a captured one) ready for GPU-direct data movement? Checks
//! with stable ids read sysfs/proc files, PCI config bytes and, on the live machine, facts from
//! the vendor libraries; active probes prove paths by using them. The result is a [`Report`]:
//! findings (`pass`/`warn`/`fail`/`skip`, each with evidence and a fix), per-path verdicts
//! (which path GPU↔GPU and GPU↔NIC data will take, and which findings decide it), and an exit
//! code. The library returns data; [`render`] turns it into text or JSON for the CLI.
//!
//! ```no_run
//! use gdx_doctor::{live, run, Options};
//! let (facts, probe) = (live::SystemFacts, live::SystemProbe);
//! let mut opts = Options::new("/");
//! opts.env = std::env::vars().collect();
//! opts.live = Some(&facts); // consulted only when the root is this machine
//! opts.probe = Some(&probe); // None for --no-probe
//! let report = run(&opts).expect("root exists");
//! print!("{}", gdx_doctor::render::render_text(&report, false));
//! std::process::exit(report.exit_code().into());
//! ```
//!
//! Layout: [`checks`] holds one module per check, all registered in [`checks::all_checks`];
//! [`context`] is what checks see; [`facts`] the live-library trait and [`live`] its
//! gdx-sys implementation; [`probe`] the active probes and their backend trait; [`verdict`] the
//! per-path summary. Files under the root are read through topo's one sysfs layer
//! ([`gdx_topo::sysfs`]: root-confined reads, PCI and RDMA device facts, config space).
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod checks;
pub mod context;
pub mod facts;
pub mod finding;
pub mod live;
pub mod measure;
pub mod probe;
pub mod probe_fabric;
pub mod probe_rdma;
pub mod render;
pub mod report;
#[cfg(test)]
mod testutil;
pub mod verdict;

pub use context::Context;
pub use facts::{LiveFacts, StaticFacts, Unavailable};
pub use finding::{Finding, Status};
pub use probe::{ProbeBackend, ProbePlan};
pub use render::{render_json, render_text};
pub use report::{DataPath, Report, Verdict, EXIT_DOCTOR_ERROR};

use facts::Gathered;
use probe::ProbeState;
use report::{Header, HeaderDevice, Summary};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Why the doctor could not run at all (exit code 2: the two root variants), and why a part of
/// it could not be looked at (the others: each becomes a `skip` finding's or a note's reason,
/// keeping the library's error as its source).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DoctorError {
    /// The root does not exist.
    #[error("root {0}: no such file or directory (give a folder or .tar.gz written by `gdx topo --capture`, or leave --root out for this machine)")]
    RootMissing(PathBuf),
    /// The root is neither a folder nor a readable capture archive.
    #[error("root {path}: {why}")]
    RootUnusable {
        /// The root given.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// No topology could be built from the root.
    #[error("{0}")]
    Topology(#[source] gdx_topo::TopoError),
    /// No topology was given (a test's context).
    #[error("no topology was given")]
    NoTopology,
    /// A file under the root could not be read (it names the file).
    #[error("{0}")]
    File(#[from] gdx_topo::sysfs::files::FileError),
    /// A register could not be read from a device's config space.
    #[error("{0}")]
    Config(#[from] gdx_topo::sysfs::config::CfgError),
    /// The bridges above a device are unknown.
    #[error("{0}")]
    Chain(#[from] gdx_topo::sysfs::devices::ChainError),
    /// Live library facts describe this machine, and the root is a captured one.
    #[error(
        "--root {} is a captured machine: live libraries describe this machine, not that one",
        .0.display()
    )]
    CapturedRoot(PathBuf),
    /// The caller gave no live library facts.
    #[error("no live library facts were provided")]
    NoLiveFacts,
    /// A vendor library a probe needs did not load.
    #[error("{0}")]
    Unavailable(#[from] gdx_sys::Unavailable),
    /// A CUDA call of a probe failed.
    #[error("{0}")]
    Cuda(#[from] gdx_sys::cuda::CudaError),
    /// The probe's GPU memory could not be registered with the RDMA device.
    #[error("{0}")]
    Register(#[from] gdx_sys::verbs::RegisterError),
    /// A probe size this machine cannot address.
    #[error("{0} bytes do not fit usize")]
    TooLarge(u64),
    /// A libfabric call of the fabric probe failed; the step names which.
    #[error("{step}: {source}")]
    FabricStep {
        /// What the probe was doing (`registering the source`, `fi_write of N bytes` …).
        step: String,
        /// gdx-fabric's error.
        #[source]
        source: gdx_fabric::FabricError,
    },
    /// A buffer of the fabric probe could not be written or read.
    #[error("{0}")]
    FabricBuffer(&'static str),
    /// After the fabric probe's `fi_write` or `fi_read` the bytes were not the pattern.
    #[error("after {op}: {mismatch}")]
    FabricMismatch {
        /// `fi_write` or `fi_read`.
        op: &'static str,
        /// The first byte that differs.
        mismatch: gdx_base::pattern::Mismatch,
    },
    /// The probe backend has no mailbox (the mailbox probe is then left out).
    #[error("this probe backend has no mailbox")]
    NoMailbox,
    /// A mailbox round trip read back other bytes than it wrote.
    #[error("mailbox round trip {round}: wrote {wrote:02x?}, read {read:02x?}")]
    MailboxMismatch {
        /// Which round trip (from 0).
        round: u64,
        /// The bytes written.
        wrote: [u8; 8],
        /// The bytes read back.
        read: [u8; 8],
    },
}

/// What to examine and with what.
pub struct Options<'a> {
    /// `/` for this machine, or a captured tree (folder or `.tar.gz`).
    pub root: PathBuf,
    /// The environment the checks see (`NCCL_*`, `CUDA_VISIBLE_DEVICES`) when the root is this
    /// machine; the CLI passes `std::env::vars()`. A captured root is judged on the
    /// environment its capture recorded instead, never on this one.
    pub env: BTreeMap<String, String>,
    /// A topology already built by the caller (e.g. `gdx_topo::discover()` on the live
    /// machine, which adds NVML's NVLinks); `None` builds one with `gdx_topo::from_root`.
    pub topology: Option<gdx_topo::Topology>,
    /// Live library facts. Consulted only when `root` is `/`: they describe this machine,
    /// not a captured one.
    pub live: Option<&'a dyn LiveFacts>,
    /// Probe backend; `None` means `--no-probe`. Probes run only on the live machine, with a
    /// GPU and working CUDA facts.
    pub probe: Option<&'a dyn ProbeBackend>,
    /// How much the probes do.
    pub probe_plan: ProbePlan,
    /// Whether `root` shows this machine, so live facts and probes apply to it. `None`
    /// detects it (the root resolves to `/`); `Some(true)` for the host's sysfs mounted
    /// elsewhere (a container's `/host`) or facts saved alongside a capture; `Some(false)`
    /// never consults the libraries. An unpacked `.tar.gz` is never this machine, whatever
    /// this says.
    pub root_is_this_machine: Option<bool>,
}

impl<'a> Options<'a> {
    /// Examine `root` with an empty environment, no live facts and no probes.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Options {
            root: root.into(),
            env: BTreeMap::new(),
            topology: None,
            live: None,
            probe: None,
            probe_plan: ProbePlan::default(),
            root_is_this_machine: None,
        }
    }
}

/// Run every check (and the probes) and build the report.
///
/// # Errors
/// [`DoctorError`] only when the root is missing or unusable; everything odd inside the tree
/// becomes a `skip` finding instead.
pub fn run(opts: &Options<'_>) -> Result<Report, DoctorError> {
    use gdx_topo::sysfs::archive::{open_root, Require};
    let opened = open_root(&opts.root, Require::Nothing).map_err(|e| match e {
        gdx_topo::TopoError::RootMissing { path } => DoctorError::RootMissing(path),
        e => DoctorError::RootUnusable {
            path: opts.root.clone(),
            why: root_why(e),
        },
    })?;
    let dir = opened.dir().to_path_buf();
    // An unpacked archive is never this machine, whatever its folder resolves to.
    let is_live = !opened.is_archive()
        && opts
            .root_is_this_machine
            .unwrap_or_else(|| gdx_topo::sysfs::rootfs::is_host_root(&dir));

    let mut topo: Result<gdx_topo::Topology, DoctorError> = match &opts.topology {
        Some(t) => Ok(t.clone()),
        None => gdx_topo::from_open_root(&opened).map_err(DoctorError::Topology),
    };
    // On this machine sysfs cannot see NVLinks: add NVML's view, as `gdx_topo::discover`
    // does, unless the caller's topology or a capture's snapshot already has it.
    if let (true, None, Some(src), Ok(t)) = (is_live, &opts.topology, opts.live, topo.as_mut()) {
        if !t.nvml_enriched {
            if let Some(snap) = src.nvml_snapshot() {
                gdx_topo::enrich::apply(t, &snap);
            }
        }
    }
    let topo_desc = match &topo {
        Ok(t) => match &t.source {
            gdx_topo::Source::Sysfs(p) => format!(
                "sysfs ({p}){}",
                if t.nvml_enriched { " + NVML" } else { "" }
            ),
            gdx_topo::Source::NcclXml(p) => format!("NCCL XML ({p})"),
        },
        Err(e) => format!("unavailable: {e}"),
    };
    let (env, env_origin, env_note) = environment(opts, &dir, is_live);
    let live: Result<Gathered, DoctorError> = match (is_live, opts.live) {
        (false, _) => Err(DoctorError::CapturedRoot(opts.root.clone())),
        (true, None) => Err(DoctorError::NoLiveFacts),
        (true, Some(src)) => Ok(Gathered::from(src)),
    };
    let fs = if opened.is_archive() {
        gdx_topo::sysfs::RootFs::shown_as(&dir, "capture:")
    } else {
        gdx_topo::sysfs::RootFs::new(&dir)
    };
    let mut ctx = Context::with_fs(fs, env, topo, live);
    ctx.set_env_origin(env_origin);

    let probes = match (opts.probe, is_live) {
        (None, _) => ProbeState::NotRun("probes off (--no-probe)".into()),
        (Some(_), false) => {
            ProbeState::NotRun("probes run only on this machine, not on a captured root".into())
        }
        (Some(_), true) if ctx.gpus().is_empty() => ProbeState::NotRun(ctx.no_gpu_reason()),
        (Some(b), true) => match ctx.live().map(|l| l.cuda.as_ref()) {
            Err(why) => ProbeState::NotRun(format!("probes need CUDA: {why}")),
            Ok(Err(u)) => ProbeState::NotRun(format!("probes need CUDA: {u}")),
            Ok(Ok(_)) => ProbeState::Ran(probe::run(&ctx, b, &opts.probe_plan)),
        },
    };
    let probe_desc = match &probes {
        ProbeState::NotRun(why) => format!("not run: {why}"),
        ProbeState::Ran(r) => format!(
            "ran in {:.1} s ({} copies, {} registrations)",
            r.elapsed_s,
            r.copies.len(),
            r.registrations.len()
        ),
    };
    ctx.set_probes(probes);
    // The fabric probe needs no GPU: it runs whenever probes are on for this machine.
    ctx.set_fabric_probe(match (opts.probe, is_live) {
        (None, _) => probe_fabric::FabricProbeState::NotRun("probes off (--no-probe)".into()),
        (Some(_), false) => probe_fabric::FabricProbeState::NotRun(
            "probes run only on this machine, not on a captured root".into(),
        ),
        (Some(_), true) => probe_fabric::run(
            ctx.env("GDX_FABRIC_PROVIDER")
                .filter(|v| !v.is_empty() && *v != "auto")
                .map(str::to_string),
        ),
    });

    // So does the verbs probe (host memory through each RDMA device).
    ctx.set_rdma_probe(match (opts.probe, is_live) {
        (None, _) => probe_rdma::RdmaProbeState::NotRun("probes off (--no-probe)".into()),
        (Some(_), false) => probe_rdma::RdmaProbeState::NotRun(
            "probes run only on this machine, not on a captured root".into(),
        ),
        (Some(_), true) => probe_rdma::run(8),
    });

    let findings = checks::run_checks(&ctx, &checks::all_checks());
    let verdicts = verdict::compute(&ctx, &findings);
    let mut header = header(&ctx, opts, is_live, topo_desc, probe_desc);
    header.environment = ctx.env_origin().to_string();
    if let Some(n) = env_note {
        header.notes.insert(0, n);
    }
    Ok(Report {
        schema_version: report::SCHEMA_VERSION,
        header,
        summary: Summary::of(&findings),
        findings,
        verdicts,
    })
}

/// The root's message without its path (the doctor's error adds it) and with control
/// characters of archive names already escaped by the unpacker.
fn root_why(e: gdx_topo::TopoError) -> String {
    match e {
        gdx_topo::TopoError::RootUnusable {
            why,
            source: Some(s),
            ..
        } => format!("{why}: {s}"),
        gdx_topo::TopoError::RootUnusable { why, .. } => why,
        e => e.to_string(),
    }
}

/// The environment the checks judge: the live shell's for this machine; for a captured one,
/// what the capture recorded (`gdx/env.json`), or nothing, with a note, for a capture made
/// before gdx recorded it. The live shell's variables never describe a captured machine.
fn environment(
    opts: &Options<'_>,
    dir: &std::path::Path,
    is_live: bool,
) -> (BTreeMap<String, String>, String, Option<String>) {
    if is_live {
        return (opts.env.clone(), "environment".into(), None);
    }
    let origin = format!("capture:{}", gdx_topo::capture::ENV_PATH);
    match gdx_topo::read_captured_env(dir) {
        Ok(Some(env)) => {
            let note = (!env.redacted.is_empty()).then(|| {
                format!(
                    "environment of the captured shell: values of {} were not recorded (they look secret)",
                    env.redacted.join(", ")
                )
            });
            (env.vars, origin, note)
        }
        Ok(None) => (
            BTreeMap::new(),
            "environment not captured: judged as empty".into(),
            Some(format!(
                "environment not captured: this capture has no {} (made by an older gdx), so the                  NCCL_*/CUDA_* checks judge an empty environment, not this shell's; re-capture                  with `gdx topo --capture` to judge the machine's own",
                gdx_topo::capture::ENV_PATH
            )),
        ),
        Err(e) => (
            BTreeMap::new(),
            "environment unreadable: judged as empty".into(),
            Some(format!("{e}: the NCCL_*/CUDA_* checks judge an empty environment")),
        ),
    }
}

fn header(
    ctx: &Context,
    opts: &Options<'_>,
    live: bool,
    topology: String,
    probes: String,
) -> Header {
    let gpus = ctx
        .gpus()
        .iter()
        .map(|g| HeaderDevice {
            label: g.label.clone(),
            bdf: Some(g.bdf.to_string()),
            name: ctx
                .live()
                .ok()
                .and_then(|l| l.cuda_device(g.bdf))
                .and_then(|d| d.name.clone())
                .or_else(|| ctx.topo_device(g.bdf).and_then(|d| d.name.clone())),
        })
        .collect();
    let rdma_devices = ctx
        .rdma()
        .iter()
        .map(|d| HeaderDevice {
            label: ctx.nic_label(d),
            bdf: d.bdf.map(|b| b.to_string()),
            name: Some(d.name.clone()),
        })
        .collect();
    let mut notes = Vec::new();
    if ctx.gpus().is_empty() {
        notes.push(format!("{}: GPU checks are skipped", ctx.no_gpu_reason()));
    }
    if ctx.rdma().is_empty() {
        notes.push("no RDMA devices: GPUDirect RDMA and RDMA checks do not apply; network traffic would be staged through host memory".into());
    }
    match ctx.topology() {
        Ok(t) => notes.extend(t.notes.iter().take(10).map(|n| format!("topology: {n}"))),
        Err(e) => notes.push(format!("no topology ({e}): path-class checks are skipped")),
    }
    if let Err(why) = ctx.live() {
        notes.push(format!("library checks skipped: {why}"));
    }
    Header {
        tool: format!("gdx-doctor {}", env!("CARGO_PKG_VERSION")),
        root: opts.root.display().to_string(),
        live,
        topology,
        gpus,
        rdma_devices,
        probes,
        environment: String::new(),
        notes,
    }
}
