//! Active probes: prove paths by using them. Copy between every GPU pair and between each GPU
//! and pinned host memory, verify the bytes, time the copies and compare GB/s with the link
//! ceiling; where RDMA devices exist, register GPU memory through dma-buf and through peermem.
//!
//! The CUDA/verbs work itself is behind [`ProbeBackend`]: **this is the hook where the
//! `gdx_sys::cuda` copies (and `gdx_sys::verbs` registrations) plug in**. The doctor decides
//! what to probe, how much, the ceilings and the verdict; the backend only moves bytes.
//! Backends must allocate with `cuMemAlloc` (not the stream-ordered pool, whose peer copies
//! silently fall back to a slow path unless `cuMemPoolSetAccess` is set) and pinned host memory.

use crate::context::{Context, GpuRef};
use crate::DoctorError;
use gdx_sys::timer::Timer;
use serde::Serialize;
use std::time::Duration;

/// One end of a timed copy ([`crate::measure::Loc`]).
pub use crate::measure::Loc;

/// What a backend measured for one copy direction.
#[derive(Debug, Clone, PartialEq)]
pub struct CopySamples {
    /// Bytes per copy.
    pub bytes: u64,
    /// Time of each timed copy (device events around the copy, warm-up excluded).
    pub samples: Vec<Duration>,
    /// True when the destination held the seeded source pattern after the copies.
    pub verified: bool,
    /// Where verification failed, if it did (first bad offset, expected vs found).
    pub mismatch: Option<String>,
}

/// How GPU memory is registered with an RDMA device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RegMethod {
    /// `cuMemGetHandleForAddressRange` (dma-buf fd) + `ibv_reg_dmabuf_mr`.
    DmaBuf,
    /// `ibv_reg_mr` on a device pointer (needs nvidia-peermem / nv_peer_mem).
    PeerMem,
}

/// The part of the probes that needs CUDA and verbs. Implemented by [`crate::live::SystemProbe`]
/// ([`crate::measure`]'s measurements and `gdx-sys`'s registration).
pub trait ProbeBackend {
    /// Allocate `bytes` at `from` and at `to`, fill `from` with a seeded pattern, enable peer
    /// access where both are GPUs, copy once to warm up, then `reps` timed copies, and
    /// verify `to` afterwards. `Err` when the copy could not be done at all.
    fn copy(&self, from: Loc, to: Loc, bytes: u64, reps: u32) -> Result<CopySamples, DoctorError>;

    /// Whether [`ProbeBackend::register`] is implemented. A backend without it (verbs
    /// registration not wired yet) makes `probe-register` skip rather than fail.
    fn can_register(&self) -> bool {
        true
    }

    /// Allocate `bytes` on GPU `gpu` (CUDA ordinal) and register it with RDMA device
    /// `rdma_device` using `method`, then deregister. `Err` carries the failing call and errno.
    fn register(
        &self,
        gpu: u32,
        rdma_device: &str,
        method: RegMethod,
        bytes: u64,
    ) -> Result<(), DoctorError>;

    /// Whether [`ProbeBackend::mailbox`] is implemented (a backend without it leaves the
    /// mailbox probe out, reported as a skip).
    fn can_mailbox(&self) -> bool {
        false
    }

    /// Start the mailbox on GPU `gpu`, time `reps` 8-byte write-then-read round trips (bytes
    /// checked), stop it. `Err` names what failed. The default: this backend has none.
    fn mailbox(&self, gpu: u32, reps: u32) -> Result<Vec<Duration>, DoctorError> {
        let _ = (gpu, reps);
        Err(DoctorError::NoMailbox)
    }
}

/// The mailbox round trip measured on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MailboxProbe {
    /// GPU label.
    pub gpu: String,
    /// Median 8-byte host→GPU→host round trip (a write then a read), µs.
    pub p50_us: Option<f64>,
    /// What failed, if anything.
    pub error: Option<String>,
}

/// How much to probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbePlan {
    /// Bytes per copy.
    pub copy_bytes: u64,
    /// Timed copies per direction.
    pub reps: u32,
    /// Bytes per registration.
    pub register_bytes: u64,
    /// Stop starting new probes after this long, so probes finish in seconds.
    pub budget: Duration,
}

impl Default for ProbePlan {
    fn default() -> Self {
        ProbePlan {
            copy_bytes: 256 << 20,
            reps: 5,
            register_bytes: 8 << 20,
            budget: Duration::from_secs(20),
        }
    }
}

/// One measured copy direction.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CopyProbe {
    /// Source: a GPU label or `host`.
    pub from: String,
    /// Destination: a GPU label or `host`.
    pub to: String,
    /// Bytes per copy.
    pub bytes: u64,
    /// Median of the timed copies in GB/s (1e9 B/s).
    pub gbps: Option<f64>,
    /// The link's one-direction ceiling in GB/s, when known.
    pub ceiling_gbps: Option<f64>,
    /// What the ceiling is (`NV18 x 26.56 GB/s`, `PCIe Gen5 x16 (GPU0)`).
    pub ceiling_basis: Option<String>,
    /// Bytes verified at the destination.
    pub verified: bool,
    /// The backend's error or the verification mismatch.
    pub error: Option<String>,
}

impl CopyProbe {
    /// Measured fraction of the ceiling.
    pub fn fraction(&self) -> Option<f64> {
        Some(self.gbps? / self.ceiling_gbps.filter(|c| *c > 0.0)?)
    }

    /// `394.8 GB/s (83% of 478 GB/s NV18 x 26.56 GB/s)`.
    pub fn describe(&self) -> String {
        if let Some(e) = &self.error {
            return format!("{} -> {}: {e}", self.from, self.to);
        }
        let Some(g) = self.gbps else {
            return format!("{} -> {}: no timing", self.from, self.to);
        };
        let mut s = format!("{} -> {}: {g:.1} GB/s", self.from, self.to);
        if let (Some(f), Some(c)) = (self.fraction(), self.ceiling_gbps) {
            let basis = self.ceiling_basis.as_deref().unwrap_or("link");
            s.push_str(&format!(" ({:.0}% of {c:.0} GB/s {basis})", f * 100.0));
        }
        s.push_str(if self.verified {
            ", bytes verified"
        } else {
            ", NOT verified"
        });
        s
    }
}

/// One GPU × RDMA device registration attempt.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RegisterProbe {
    /// GPU label.
    pub gpu: String,
    /// NIC label.
    pub nic: String,
    /// RDMA device name.
    pub rdma_device: String,
    /// dma-buf registration: `None` when it worked, else the error.
    pub dmabuf_error: Option<String>,
    /// peermem registration: `None` when it worked, else the error.
    pub peermem_error: Option<String>,
}

/// Everything the probes found.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ProbeResults {
    /// Copies.
    pub copies: Vec<CopyProbe>,
    /// Registrations.
    pub registrations: Vec<RegisterProbe>,
    /// Mailbox round trips, one per GPU.
    pub mailbox: Vec<MailboxProbe>,
    /// Probes not run because the time budget ran out.
    pub skipped_for_time: usize,
    /// Why registrations were not tried, when the backend cannot do them.
    pub registration_skipped: Option<String>,
    /// Wall time of all probes.
    pub elapsed_s: f64,
}

impl ProbeResults {
    /// The copy from `a` to `b` (labels or `host`).
    pub fn copy(&self, from: &str, to: &str) -> Option<&CopyProbe> {
        self.copies.iter().find(|c| c.from == from && c.to == to)
    }
}

/// Whether probes ran.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "detail")]
pub enum ProbeState {
    /// Not run, and why (`--no-probe`, no GPU, captured root, no backend).
    NotRun(String),
    /// Ran.
    Ran(ProbeResults),
}

fn endpoint_name(e: Loc, gpus: &[(GpuRef, u32)]) -> String {
    match e {
        Loc::PinnedHost => "host".to_string(),
        Loc::Gpu(o) => gpus
            .iter()
            .find(|(_, ord)| *ord == o)
            .map(|(g, _)| g.label.clone())
            .unwrap_or_else(|| format!("cuda{o}")),
    }
}

/// Run the probes: copies for every GPU with a CUDA ordinal, registrations for every GPU ×
/// RDMA device. Never fails as a whole: each probe records its own error.
pub fn run(ctx: &Context, backend: &dyn ProbeBackend, plan: &ProbePlan) -> ProbeResults {
    // The one timer's wall clock: both the budget and the figure reported as `elapsed_s`.
    let mut clock = Timer::wall();
    let _ = clock.start(); // a wall clock cannot fail
    let spent = || clock.read().unwrap_or_default();
    let mut out = ProbeResults::default();
    let gpus: Vec<(GpuRef, u32)> = ctx
        .gpus()
        .iter()
        .filter_map(|g| Some((g.clone(), ctx.cuda_ordinal(g.bdf)?)))
        .collect();
    let mut jobs: Vec<(Loc, Loc)> = Vec::new();
    for (_, o) in &gpus {
        jobs.push((Loc::Gpu(*o), Loc::PinnedHost));
        jobs.push((Loc::PinnedHost, Loc::Gpu(*o)));
    }
    for (_, a) in &gpus {
        for (_, b) in &gpus {
            if a != b {
                jobs.push((Loc::Gpu(*a), Loc::Gpu(*b)));
            }
        }
    }
    for (from, to) in jobs {
        if spent() > plan.budget {
            out.skipped_for_time += 1;
            continue;
        }
        let (fname, tname) = (endpoint_name(from, &gpus), endpoint_name(to, &gpus));
        let (ceiling_gbps, ceiling_basis) = match ctx.ceiling(&fname, &tname) {
            Some(c) => (Some(c.gbps), Some(c.basis)),
            None => (None, None),
        };
        let mut p = CopyProbe {
            from: fname,
            to: tname,
            bytes: plan.copy_bytes,
            gbps: None,
            ceiling_gbps,
            ceiling_basis,
            verified: false,
            error: None,
        };
        match backend.copy(from, to, plan.copy_bytes, plan.reps) {
            Ok(s) => {
                p.bytes = s.bytes;
                p.gbps = gdx_base::stats::median_rate_gbps(s.bytes, &s.samples);
                p.verified = s.verified;
                if !s.verified {
                    p.error = Some(format!(
                        "bytes differ after copy: {}",
                        s.mismatch.as_deref().unwrap_or("no detail")
                    ));
                }
            }
            Err(e) => p.error = Some(e.to_string()),
        }
        out.copies.push(p);
    }
    for (g, o) in gpus.iter().filter(|_| backend.can_mailbox()) {
        if spent() > plan.budget {
            out.skipped_for_time += 1;
            continue;
        }
        let (p50_us, error) = match backend.mailbox(*o, 2000) {
            Ok(s) => {
                let us: Vec<f64> = s.iter().map(|d| d.as_secs_f64() * 1e6).collect();
                (gdx_base::stats::median(&us), None)
            }
            Err(e) => (None, Some(e.to_string())),
        };
        out.mailbox.push(MailboxProbe {
            gpu: g.label.clone(),
            p50_us,
            error,
        });
    }
    if !backend.can_register() && !ctx.rdma().is_empty() {
        out.registration_skipped =
            Some("the probe backend cannot register GPU memory with verbs yet".into());
    }
    for (g, o) in gpus.iter().filter(|_| backend.can_register()) {
        for nic in ctx.rdma() {
            if spent() > plan.budget {
                out.skipped_for_time += 1;
                continue;
            }
            let reg = |m| {
                backend
                    .register(*o, &nic.name, m, plan.register_bytes)
                    .err()
                    .map(|e| e.to_string())
            };
            out.registrations.push(RegisterProbe {
                gpu: g.label.clone(),
                nic: ctx.nic_label(nic),
                rdma_device: nic.name.clone(),
                dmabuf_error: reg(RegMethod::DmaBuf),
                peermem_error: reg(RegMethod::PeerMem),
            });
        }
    }
    out.elapsed_s = spent().as_secs_f64();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_describe() {
        let p = CopyProbe {
            from: "GPU0".into(),
            to: "GPU1".into(),
            bytes: 1,
            gbps: Some(394.8),
            ceiling_gbps: Some(478.1),
            ceiling_basis: Some("NV18 x 26.56 GB/s".into()),
            verified: true,
            error: None,
        };
        assert_eq!(
            p.describe(),
            "GPU0 -> GPU1: 394.8 GB/s (83% of 478 GB/s NV18 x 26.56 GB/s), bytes verified"
        );
    }
}
