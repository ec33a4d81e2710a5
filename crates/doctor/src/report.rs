//! The report: a header describing what was examined, per-path verdicts a user reads first,
//! every finding, and the exit code. Serialises to
//! `{"schema_version":1,"header":{..},"summary":{..},"findings":[..],"verdicts":[..]}`.

use crate::finding::{Finding, Status};
use serde::{Deserialize, Serialize};

/// Version of the JSON layout; bumped on incompatible changes.
pub const SCHEMA_VERSION: u32 = 1;

/// Exit code when the doctor itself could not run (bad root, usage).
pub const EXIT_DOCTOR_ERROR: u8 = 2;

/// Which data path a pair's bytes will take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataPath {
    /// GPU peer-to-peer copies (NVLink or PCIe).
    P2p,
    /// NIC DMA straight to/from GPU memory.
    Gdr,
    /// Through pinned host memory.
    Staged,
    /// No path at all (e.g. NIC has no active port).
    None,
    /// Not enough information to say.
    Unknown,
}

/// A finding that decided a verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FindingRef {
    /// Check id.
    pub id: String,
    /// Finding subject.
    pub subject: String,
    /// Its status.
    pub status: Status,
}

impl FindingRef {
    /// Refer to a finding.
    pub fn to(f: &Finding) -> Self {
        FindingRef {
            id: f.id.clone(),
            subject: f.subject.clone(),
            status: f.status,
        }
    }
}

/// What data between two endpoints will do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// `GPU0-GPU1`, `GPU0-NIC3`, `GPU0-network`.
    pub subject: String,
    /// `gpu-gpu` or `gpu-nic`.
    pub kind: String,
    /// The path.
    pub path: DataPath,
    /// Path class between the two (`NV18`, `PIX`, `SYS`), when known.
    pub class: Option<String>,
    /// How, in words: `p2p over NV18`, `gdr via dma-buf (PIX)`, `staged through host: ...`.
    pub summary: String,
    /// Measured GB/s for this pair (best direction), when a probe ran.
    pub measured_gbps: Option<f64>,
    /// The findings that decided it.
    pub decided_by: Vec<FindingRef>,
}

/// Counts per status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// Failures.
    pub fail: usize,
    /// Warnings.
    pub warn: usize,
    /// Passes.
    pub pass: usize,
    /// Skips.
    pub skip: usize,
}

impl Summary {
    /// Count findings.
    pub fn of(findings: &[Finding]) -> Self {
        let mut s = Summary::default();
        for f in findings {
            match f.status {
                Status::Fail => s.fail += 1,
                Status::Warn => s.warn += 1,
                Status::Pass => s.pass += 1,
                Status::Skip => s.skip += 1,
            }
        }
        s
    }
}

/// A device named in the header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeaderDevice {
    /// `GPU0`, `NIC0`.
    pub label: String,
    /// PCI address.
    pub bdf: Option<String>,
    /// Name (RDMA device name, GPU product name) when known.
    pub name: Option<String>,
}

/// What was examined and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// `gdx-doctor <version>`.
    pub tool: String,
    /// The root read (`/` for this machine).
    pub root: String,
    /// Whether live library facts were consulted.
    pub live: bool,
    /// Where the topology came from, or why there is none.
    pub topology: String,
    /// NVIDIA GPUs found.
    pub gpus: Vec<HeaderDevice>,
    /// RDMA devices found.
    pub rdma_devices: Vec<HeaderDevice>,
    /// Whether probes ran (`ran in 1.2 s`) or why not.
    pub probes: String,
    /// Which environment the `NCCL_*`/`CUDA_*` checks judged: `environment` (this shell),
    /// `capture:gdx/env.json`, or why none.
    #[serde(default)]
    pub environment: String,
    /// Things a reader should know first (no GPU, no RDMA, topology notes).
    pub notes: Vec<String>,
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// What was examined.
    pub header: Header,
    /// Counts.
    pub summary: Summary,
    /// Every finding, in check order.
    pub findings: Vec<Finding>,
    /// Per-path verdicts.
    pub verdicts: Vec<Verdict>,
}

impl Report {
    /// 0 when nothing failed (pass/warn/skip only), 1 when any finding failed. (2, for a
    /// doctor that could not run, is [`EXIT_DOCTOR_ERROR`], returned by the CLI on `Err`.)
    pub fn exit_code(&self) -> u8 {
        u8::from(self.findings.iter().any(|f| f.status == Status::Fail))
    }

    /// Findings of one check.
    pub fn by_id<'a>(&'a self, id: &'a str) -> impl Iterator<Item = &'a Finding> + 'a {
        self.findings.iter().filter(move |f| f.id == id)
    }

    /// The verdict on one pair, e.g. `GPU0-GPU1` or `GPU0-NIC0`.
    pub fn verdict(&self, subject: &str) -> Option<&Verdict> {
        self.verdicts.iter().find(|v| v.subject == subject)
    }

    /// The report as pretty JSON.
    pub fn to_json(&self) -> String {
        // Serialising plain data with string keys cannot fail; keep a fallback anyway.
        serde_json::to_string_pretty(self)
            .unwrap_or_else(|e| format!("{{\"error\":\"cannot serialise report: {e}\"}}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(statuses: &[Status]) -> Report {
        let findings: Vec<Finding> = statuses
            .iter()
            .map(|s| Finding::with_status("x", *s, "host", "m"))
            .collect();
        Report {
            schema_version: SCHEMA_VERSION,
            header: Header {
                tool: "t".into(),
                root: "/".into(),
                live: false,
                topology: "none".into(),
                gpus: vec![],
                rdma_devices: vec![],
                probes: "off".into(),
                environment: "environment".into(),
                notes: vec![],
            },
            summary: Summary::of(&findings),
            findings,
            verdicts: vec![],
        }
    }

    #[test]
    fn exit_codes() {
        assert_eq!(
            report(&[Status::Pass, Status::Warn, Status::Skip]).exit_code(),
            0
        );
        assert_eq!(report(&[Status::Pass, Status::Fail]).exit_code(), 1);
        assert_eq!(report(&[]).exit_code(), 0);
    }

    #[test]
    fn json_has_the_contract_keys() {
        let r = report(&[Status::Fail]);
        let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert!(v["findings"].is_array());
        assert!(v["verdicts"].is_array());
        assert_eq!(v["findings"][0]["status"], "fail");
        assert_eq!(v["summary"]["fail"], 1);
        let back: Report = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(back, r);
    }
}
