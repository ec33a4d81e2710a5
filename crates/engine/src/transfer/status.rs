//! The value types of a transfer and its ops: an op's direction ([`OpKind`]), its outcome
//! ([`OpStatus`], and [`Outcome`], its borrowed form) and the transfer's ([`Status`]). Below everything else in `transfer/` (and
//! `stats.rs`, which counts by direction), so those name them without reaching the state
//! machine in `mod.rs`.

use serde::Serialize;

use crate::error::Error;

/// Direction of an op, seen from the initiator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    /// Local region → remote region.
    Write,
    /// Remote region → local region.
    Read,
}

/// Where a transfer stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Still running.
    Pending,
    /// Every op completed and the notification (if any) was delivered.
    Completed,
    /// At least one op failed; `reason` is the first error seen.
    Failed {
        /// The first error.
        reason: Error,
    },
}

/// The outcome of one op.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpStatus {
    /// Not finished yet.
    Pending,
    /// The bytes are in place.
    Completed,
    /// The op failed; its bytes may be partly written.
    Failed(Error),
}

/// An op's outcome, borrowed from the progress state (`Stats::record`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Outcome<'a> {
    Pending,
    Completed,
    Failed(&'a Error),
}

impl Outcome<'_> {
    /// The public form (the error cloned).
    pub(super) fn status(self) -> OpStatus {
        match self {
            Outcome::Pending => OpStatus::Pending,
            Outcome::Completed => OpStatus::Completed,
            Outcome::Failed(e) => OpStatus::Failed(e.clone()),
        }
    }

    /// Whether this is `st` (without building the public form).
    pub(super) fn is(self, st: &OpStatus) -> bool {
        match (self, st) {
            (Outcome::Pending, OpStatus::Pending) | (Outcome::Completed, OpStatus::Completed) => {
                true
            }
            (Outcome::Failed(a), OpStatus::Failed(b)) => a == b,
            _ => false,
        }
    }
}
