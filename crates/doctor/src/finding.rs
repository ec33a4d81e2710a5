//! One finding: what a check concluded about one subject, with the evidence it read and the fix.
//!
//! Findings are the JSON contract other tools consume: `id` is the stable check id, `status`
//! is one of `pass` / `warn` / `fail` / `skip`, and a `skip` always carries its reason.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Outcome of a check for one subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Something is broken: a data path is off, fails, or is silently slow.
    Fail,
    /// Works, but not as well as it could, or a risk worth knowing.
    Warn,
    /// Checked and fine.
    Pass,
    /// Could not be checked here (missing hardware, file, privilege or library); see `reason`.
    Skip,
}

impl Status {
    /// Lower-case name, as in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Fail => "fail",
            Status::Warn => "warn",
            Status::Pass => "pass",
            Status::Skip => "skip",
        }
    }

    /// Display order in reports: failures first.
    pub fn severity_rank(self) -> u8 {
        match self {
            Status::Fail => 0,
            Status::Warn => 1,
            Status::Pass => 2,
            Status::Skip => 3,
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one check concluded about one subject.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// Stable check id, e.g. `acs`, `gpu-nic-distance`.
    pub id: String,
    /// The verdict.
    pub status: Status,
    /// What it is about: `GPU0`, `GPU0-NIC3`, `0000:17:00.0`, `mlx5_0/1`, `host`.
    pub subject: String,
    /// One-line conclusion a person reads.
    pub message: String,
    /// What was read to conclude it: `file: value`, `API() = result`.
    pub evidence: Vec<String>,
    /// A command or setting that fixes it (fail/warn only).
    pub fix: Option<String>,
    /// Why it was skipped (skip only).
    pub reason: Option<String>,
}

impl Finding {
    fn new(
        id: &str,
        status: Status,
        subject: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Finding {
            id: id.to_string(),
            status,
            subject: subject.into(),
            message: message.into(),
            evidence: Vec::new(),
            fix: None,
            reason: None,
        }
    }

    /// A passing finding.
    pub fn pass(id: &str, subject: impl Into<String>, message: impl Into<String>) -> Self {
        Finding::new(id, Status::Pass, subject, message)
    }

    /// A warning.
    pub fn warn(id: &str, subject: impl Into<String>, message: impl Into<String>) -> Self {
        Finding::new(id, Status::Warn, subject, message)
    }

    /// A failure.
    pub fn fail(id: &str, subject: impl Into<String>, message: impl Into<String>) -> Self {
        Finding::new(id, Status::Fail, subject, message)
    }

    /// A skip; the reason doubles as the message so a reader never sees an empty line.
    pub fn skip(id: &str, subject: impl Into<String>, reason: impl Into<String>) -> Self {
        let reason = reason.into();
        let mut f = Finding::new(id, Status::Skip, subject, format!("skipped: {reason}"));
        f.reason = Some(reason);
        f
    }

    /// A finding with the given status (for checks that compute it).
    pub fn with_status(
        id: &str,
        status: Status,
        subject: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        if status == Status::Skip {
            return Finding::skip(id, subject, message);
        }
        Finding::new(id, status, subject, message)
    }

    /// Add one piece of evidence.
    pub fn evidence(mut self, e: impl Into<String>) -> Self {
        self.evidence.push(e.into());
        self
    }

    /// Add several pieces of evidence.
    pub fn evidence_all<I, S>(mut self, es: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.evidence.extend(es.into_iter().map(Into::into));
        self
    }

    /// Set the fix. Ignored on pass and skip findings, which have nothing to fix.
    pub fn fix(mut self, fix: impl Into<String>) -> Self {
        if matches!(self.status, Status::Fail | Status::Warn) {
            self.fix = Some(fix.into());
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_serialise_lowercase_and_skip_has_reason() {
        let f = Finding::skip("acs", "0000:17:00.0", "extended config space needs root");
        let v = serde_json::to_value(&f).unwrap();
        assert_eq!(v["status"], "skip");
        assert_eq!(v["reason"], "extended config space needs root");
        assert_eq!(v["fix"], serde_json::Value::Null);
        let p = Finding::pass("acs", "x", "ok").fix("nothing");
        assert_eq!(p.fix, None, "a pass has no fix");
        let w = Finding::warn("acs", "x", "meh").fix("do this");
        assert_eq!(w.fix.as_deref(), Some("do this"));
    }

    #[test]
    fn failures_sort_first() {
        let mut v = [Status::Skip, Status::Pass, Status::Fail, Status::Warn];
        v.sort_by_key(|s| s.severity_rank());
        assert_eq!(v, [Status::Fail, Status::Warn, Status::Pass, Status::Skip]);
    }
}
