//! The local planner: which path a copy between this process's GPUs and pinned host memory
//! (or a GPU region imported from another process) takes, and why; and [`Policy`], which can
//! force a path or make any departure from the direct path an error (strict mode).
//!
//! Pure: it sees only [`OpFacts`] (where the ends are, how the two GPUs are linked, whether
//! the regions are peer-mapped, the size) plus the [`Policy`] and [`Calibration`], so every rule
//! is unit-tested without a GPU.
//!
//! Rules, in order:
//! 1. Host ↔ GPU: `mailbox` when a mailbox runs on that GPU ([`MailboxFacts`]), the op is at
//!    most the crossover (calibrated, else [`crate::routing::calibration::DEFAULT_MAILBOX_CROSSOVER`])
//!    and not ordered with a caller's stream; else `host-to-gpu` / `gpu-to-host` on the GPU's
//!    copy engine, the reason saying why the mailbox was not taken. Strict mode refuses a
//!    stream-ordered op the mailbox would otherwise take.
//! 2. Same GPU: `device-local` (or `ipc` when one end is imported).
//! 3. Two GPUs: the direct path (`p2p`, or `ipc` when one end is imported) when peer access
//!    works and both regions are peer-mapped; else `staged`, with the reason.
//! 4. A forced path (`Policy::force`, `GDX_FORCE_PATH=staged`) or a calibration crossover can
//!    replace the direct path by `staged`; the reason says so.
//! 5. Strict mode: a plan that is not the direct path while the topology or the driver says a
//!    direct path should exist is an [`Error::Strict`] carrying that reason.

use crate::error::{Error, Result};
use crate::region::Location;
use crate::routing::calibration::Calibration;
use crate::routing::plan::{Path, Plan};
use gdx_base::bytesize::human_bytes;

/// The variable that turns strict mode on (`1`, `true`, `yes`).
pub const STRICT_ENV: &str = "GDX_STRICT";
/// The variable that forces a path for GPU-to-GPU copies (`staged`).
pub const FORCE_PATH_ENV: &str = "GDX_FORCE_PATH";

/// `GDX_STRICT` read as a switch (`1`, `true`, `yes` / `0`, `false`, `no`, empty); unset is off.
///
/// # Errors
/// [`Error::InvalidArgument`] for any other value, so a typo never silently means "off".
pub(crate) fn strict_from_env() -> Result<bool> {
    match std::env::var(STRICT_ENV) {
        Err(_) => Ok(false),
        Ok(v) => match v.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(true),
            "" | "0" | "false" | "no" | "off" => Ok(false),
            other => Err(Error::InvalidArgument(format!(
                "{STRICT_ENV}={other:?}: want 1/true/yes or 0/false/no"
            ))),
        },
    }
}

/// How the planner may choose.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// Fail instead of leaving the direct path the topology says exists.
    pub strict: bool,
    /// Take this path for GPU-to-GPU copies even when a direct path exists (only `Staged` is
    /// meaningful: a direct path that does not exist cannot be forced).
    pub force: Option<Path>,
    /// Do not grant other GPUs access to stream-ordered pool memory
    /// (`cuMemPoolSetAccess`) when registering it; such regions then report themselves as not
    /// peer-mapped and plan to `staged`.
    pub no_pool_grant: bool,
}

impl Policy {
    /// Strict mode, nothing forced.
    pub fn strict() -> Policy {
        Policy {
            strict: true,
            ..Policy::default()
        }
    }

    /// `self` with `GDX_STRICT` and `GDX_FORCE_PATH` applied.
    pub fn with_env(mut self) -> Result<Policy> {
        if std::env::var_os(STRICT_ENV).is_some() {
            self.strict = strict_from_env()?;
        }
        match std::env::var(FORCE_PATH_ENV) {
            Ok(v) if v.trim() == "staged" => self.force = Some(Path::Staged),
            Ok(v) if v.trim().is_empty() => {}
            Ok(v) => {
                return Err(Error::InvalidArgument(format!(
                    "{FORCE_PATH_ENV}={v}: only `staged` can be forced"
                )))
            }
            Err(_) => {}
        }
        Ok(self)
    }
}

/// Whether two GPUs can use the direct path, as the driver answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerStatus {
    /// Peer access is enabled both ways.
    Enabled,
    /// `cuDeviceCanAccessPeer` says no.
    NotSupported,
    /// Enabling peer access failed (the driver's message).
    Failed(String),
}

/// How two GPUs are linked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuLink {
    /// The topology's path class between them (`NV18`, `PIX`, `SYS`), when known.
    pub class: Option<String>,
    /// Whether the class says a direct path should exist (NVLink, or PCIe below one switch).
    pub class_expects_p2p: bool,
    /// The driver's answer.
    pub peer: PeerStatus,
}

/// One end of an op, as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndFacts {
    /// Where the bytes are.
    pub location: Location,
    /// Mapped from another process (CUDA IPC).
    pub imported: bool,
    /// Why the region is not mapped for the other GPU of the op (stream-ordered pool memory
    /// without access), if it is not.
    pub not_peer_mapped: Option<String>,
}

impl EndFacts {
    /// An end with no special property.
    pub fn at(location: Location) -> EndFacts {
        EndFacts {
            location,
            imported: false,
            not_peer_mapped: None,
        }
    }
}

/// Everything the planner needs about one op.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpFacts {
    /// Source end.
    pub src: EndFacts,
    /// Destination end.
    pub dst: EndFacts,
    /// Bytes.
    pub len: u64,
    /// The link, for two different GPUs.
    pub link: Option<GpuLink>,
}

/// A running mailbox, as the planner sees it (see [`crate::gpu::LocalPeer::start_mailbox`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MailboxFacts {
    /// The GPU it serves.
    pub gpu: u32,
    /// Streaming multiprocessors its kernel occupies.
    pub sms: u32,
    /// Largest payload one op carries.
    pub max_payload: u64,
    /// The op is ordered with a caller's stream or event, which the mailbox (running outside
    /// streams) cannot honour.
    pub stream_ordered: bool,
}

/// What the mailbox rule decided for a host ↔ GPU op.
enum MailboxChoice {
    /// The mailbox takes it.
    Take(Plan),
    /// The copy engine does; the note (empty, or `; why`) is appended to its reason.
    Pass(String),
}

/// The mailbox plan for a host ↔ GPU op, or why the copy engine takes it instead.
fn plan_mailbox(
    facts: &OpFacts,
    gpu: u32,
    over: Path,
    mailbox: Option<&MailboxFacts>,
    policy: &Policy,
    cal: &Calibration,
) -> Result<MailboxChoice> {
    let Some(m) = mailbox.filter(|m| m.gpu == gpu) else {
        return Ok(MailboxChoice::Pass(String::new()));
    };
    let (crossover, source) = cal.mailbox_crossover(over);
    let limit = crossover.min(m.max_payload);
    let len = facts.len;
    if len > limit {
        return Ok(MailboxChoice::Pass(format!(
            "; mailbox running on GPU{gpu} but {} > {} crossover ({source})",
            human_bytes(len),
            human_bytes(limit)
        )));
    }
    if m.stream_ordered {
        let why = format!(
            "mailbox on GPU{gpu} not used: the op is ordered with a stream or event, and the \
             mailbox kernel runs outside streams ({} ≤ {} crossover)",
            human_bytes(len),
            human_bytes(limit)
        );
        if policy.strict {
            return Err(Error::strict(
                over,
                format!(
                    "{why}; strict mode refuses the copy engine here (drop the ordering, or stop \
                 the mailbox)"
                ),
            ));
        }
        return Ok(MailboxChoice::Pass(format!("; {why}")));
    }
    let dir = if over == Path::HostToGpu {
        format!("pinned host → GPU{gpu}")
    } else {
        format!("GPU{gpu} → pinned host")
    };
    Ok(MailboxChoice::Take(Plan {
        path: Path::Mailbox,
        reason: format!(
            "mailbox: {} ≤ {} crossover ({source}), {} SM reserved; {dir} through the GPU's \
             persistent kernel, no copy-engine submission",
            human_bytes(len),
            human_bytes(limit),
            m.sms
        )
        .into(),
    }))
}

fn gpu_name(l: Location) -> String {
    match l {
        Location::Gpu(n) => format!("GPU{n}"),
        Location::PinnedHost => "pinned host".to_string(),
        Location::Host => "host".to_string(),
        Location::File => "file".to_string(),
    }
}

/// Plan one op (no mailbox running).
pub fn plan_local(facts: &OpFacts, policy: &Policy, cal: &Calibration) -> Result<Plan> {
    plan_local_with(facts, policy, cal, None)
}

/// Plan one op, with the mailbox that runs (if any).
pub fn plan_local_with(
    facts: &OpFacts,
    policy: &Policy,
    cal: &Calibration,
    mailbox: Option<&MailboxFacts>,
) -> Result<Plan> {
    let (s, d) = (facts.src.location, facts.dst.location);
    let ipc = facts.src.imported || facts.dst.imported;
    let direct_path = if ipc { Path::Ipc } else { Path::P2p };
    match (s, d) {
        (Location::PinnedHost, Location::Gpu(g)) => {
            match plan_mailbox(facts, g, Path::HostToGpu, mailbox, policy, cal)? {
                MailboxChoice::Take(p) => Ok(p),
                MailboxChoice::Pass(note) => Ok(Plan {
                    path: Path::HostToGpu,
                    reason: format!(
                        "host-to-gpu: pinned host → GPU{g} on GPU{g}'s copy engine{note}"
                    ).into(),
                }),
            }
        }
        (Location::Gpu(g), Location::PinnedHost) => {
            match plan_mailbox(facts, g, Path::GpuToHost, mailbox, policy, cal)? {
                MailboxChoice::Take(p) => Ok(p),
                MailboxChoice::Pass(note) => Ok(Plan {
                    path: Path::GpuToHost,
                    reason: format!(
                        "gpu-to-host: GPU{g} → pinned host on GPU{g}'s copy engine{note}"
                    ).into(),
                }),
            }
        }
        (Location::Gpu(a), Location::Gpu(b)) if a == b => Ok(if ipc {
            Plan {
                path: Path::Ipc,
                reason: format!("ipc: GPU{a}→GPU{a} within one GPU, region imported from another process").into(),
            }
        } else {
            Plan {
                path: Path::DeviceLocal,
                reason: format!("device-local: GPU{a} copy within device memory").into(),
            }
        }),
        (Location::Gpu(a), Location::Gpu(b)) => {
            let link = facts.link.clone().unwrap_or(GpuLink {
                class: None,
                class_expects_p2p: false,
                peer: PeerStatus::NotSupported,
            });
            let class = link.class.as_deref().unwrap_or("topology unknown");
            let unmapped = facts
                .src
                .not_peer_mapped
                .as_deref()
                .map(|w| format!("source region {w}"))
                .or_else(|| {
                    facts
                        .dst
                        .not_peer_mapped
                        .as_deref()
                        .map(|w| format!("destination region {w}"))
                });
            let blocked = match (&link.peer, unmapped) {
                (PeerStatus::NotSupported, _) => {
                    Some(format!("P2P not supported between GPU{a} and GPU{b} ({class})"))
                }
                (PeerStatus::Failed(why), _) => Some(format!(
                    "enabling peer access between GPU{a} and GPU{b} ({class}) failed: {why}"
                )),
                (PeerStatus::Enabled, Some(why)) => Some(why),
                (PeerStatus::Enabled, None) => None,
            };
            let direct_expected = link.class_expects_p2p || link.peer == PeerStatus::Enabled;
            let staged = |why: String| -> Result<Plan> {
                let reason = format!("staged: {why}");
                if policy.strict && direct_expected {
                    return Err(Error::strict(Path::Staged, format!(
                        "{reason}; strict mode refuses to leave the direct path \
                         ({direct_path} GPU{a}→GPU{b} {class})"
                    )));
                }
                Ok(Plan {
                    path: Path::Staged,
                    reason: reason.into(),
                })
            };
            if let Some(why) = blocked {
                return staged(why);
            }
            if policy.force == Some(Path::Staged) {
                return staged(format!(
                    "forced by policy ({FORCE_PATH_ENV}=staged); the direct path \
                     {direct_path} GPU{a}→GPU{b} {class} exists"
                ));
            }
            if let Some(c) = cal.prefers(Path::Staged, direct_path, facts.len) {
                return staged(format!(
                    "{} bytes < {} where staged beat {direct_path} ({})",
                    facts.len,
                    c.below_bytes,
                    cal.name()
                ));
            }
            Ok(Plan {
                path: direct_path,
                reason: if ipc {
                    format!("ipc: GPU{a}→GPU{b} {class}, region imported from another process, mapped once").into()
                } else {
                    format!("p2p: GPU{a}→GPU{b} {class}").into()
                },
            })
        }
        _ => Err(Error::InvalidArgument(format!(
            "no local path from {} to {}: both ends must be GPU or pinned host memory, not both host",
            gpu_name(s),
            gpu_name(d)
        ))),
    }
}

#[cfg(test)]
mod tests;
