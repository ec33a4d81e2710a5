//! The engine's one error type.
//!
//! Every rejection the wire protocol can produce has a named variant, and the same variant is used on
//! both sides: the target rejects an op with [`Error::BadKey`], the wire carries the code
//! ([`Error::code`]), and the initiator's per-op result carries [`Error::BadKey`] again
//! ([`Error::from_wire`]). `Display` is lowercase with no trailing period.
//!
//! Locally an error keeps its cause as `source()` (the verbs error, the `io::Error`, the storage
//! error); what crosses the wire is its [`RemoteError`] form (code, three numbers, text), since a
//! cause cannot travel. Two errors are equal when their wire forms are.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use crate::routing::path::Path;

/// Result alias used throughout the engine.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the engine.
#[derive(Debug, thiserror::Error, Clone)]
#[non_exhaustive]
pub enum Error {
    /// The connection to the peer broke (reset, EOF, no answer within the I/O timeout); the bytes of
    /// any op not yet acknowledged did not provably arrive.
    #[error("peer lost: {reason}")]
    PeerLost {
        /// What broke, and when.
        reason: String,
        /// The OS error number when the loss came from a socket call (`ECONNRESET`, `EPIPE`,
        /// `ETIMEDOUT`), so a reset can be told from a silent peer; `None` otherwise (EOF, a
        /// thread that ended).
        errno: Option<i32>,
    },
    /// A wait or an operation ran out of time.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The transfer was cancelled ([`crate::TransferHandle::cancel`]) before all its ops
    /// completed: its ops not completed by then failed with this, and its notification was
    /// not sent. Raised locally, never sent by a target.
    #[error("cancelled")]
    Cancelled,
    /// The 128-bit key presented for a region does not match.
    #[error("bad key for region {region}")]
    BadKey {
        /// Region id the key was presented for.
        region: u64,
    },
    /// No region with this id is registered (never was, or already dropped).
    #[error("no such region {region}")]
    NoSuchRegion {
        /// Region id asked for.
        region: u64,
    },
    /// No region is published under this name.
    #[error("no region named {name:?}")]
    NoSuchName {
        /// The name asked for.
        name: String,
        /// How many names the agent publishes: 0 while a peer that is still starting has
        /// published none (worth a retry), more when the name is wrong.
        published: u64,
    },
    /// `offset + len` lies outside the region.
    #[error("out of bounds: offset {offset} + len {len} > region length {region_len}")]
    OutOfBounds {
        /// Byte offset of the access.
        offset: u64,
        /// Length of the access in bytes.
        len: u64,
        /// Length of the region in bytes.
        region_len: u64,
    },
    /// A write was aimed at a region not registered for remote write.
    #[error("region {region} is read-only for remote peers")]
    ReadOnly {
        /// Region id.
        region: u64,
    },
    /// A read was aimed at a region not registered for remote read.
    #[error("region {region} is not readable by remote peers")]
    NotReadable {
        /// Region id.
        region: u64,
    },
    /// A frame announced a body or payload larger than the protocol allows.
    #[error("frame too large: {len} bytes > limit {limit}")]
    FrameTooLarge {
        /// Announced size.
        len: u64,
        /// Limit that applies.
        limit: u64,
    },
    /// The frame's protocol version is not one this build speaks.
    #[error("unknown protocol version {0}")]
    UnknownVersion(u8),
    /// The frame does not start with the protocol magic.
    #[error("bad frame magic {0:#06x}")]
    BadMagic(u16),
    /// The frame type is not known.
    #[error("unknown frame type {0}")]
    UnknownFrame(u8),
    /// The frame body could not be decoded.
    #[error("malformed frame: {0}")]
    Malformed(String),
    /// The peer sent something the protocol does not allow at this point.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// The region is being dropped (or its scope ended) and accepts no new accesses.
    #[error("region {region} is gone")]
    RegionGone {
        /// Region id.
        region: u64,
    },
    /// An argument given by the caller is invalid.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// An entry of a block list ([`crate::BlockTransfer::post`]) that no transfer may carry.
    #[error("{list}[{index}] = {block} is {why}")]
    BadBlock {
        /// The list it is in.
        list: BlockList,
        /// Its index in the list.
        index: usize,
        /// The block id given.
        block: u64,
        /// Why it is refused (out of range, given twice).
        why: String,
    },
    /// The requested path, transport or library is not available (with the reason).
    #[error("unavailable: {why}")]
    Unavailable {
        /// The path that cannot run (`rdma`, `fabric`, `ipc`, `cma`, `gds` ...), when the
        /// refusal is about one; `None` for what no single path needs (CUDA itself, a GPU).
        path: Option<Path>,
        /// What is missing, and why.
        why: String,
    },
    /// A CUDA driver call failed. (Boxed, like the other large causes, so that an `Error`, and
    /// every `Result` and op status that holds one, stays a few words long.)
    #[error("{0}")]
    Cuda(#[source] Box<gdx_sys::cuda::CudaError>),
    /// Strict mode refused a plan that leaves the direct path; the message is the plan's reason.
    #[error("strict mode: {reason}")]
    Strict {
        /// The fallback path refused (`staged`, `fabric-staged`, `file-staged` ...), when one
        /// was planned; `None` when the direct path failed while running.
        path: Option<Path>,
        /// Why the direct path was not taken.
        reason: String,
    },
    /// An RDMA verbs step failed here (registration, connection, a work completion error by
    /// name: remote access, retry exceeded, local protection, flushed ...); the verbs error is
    /// the source.
    #[error("rdma: {0}")]
    Rdma(#[source] Box<gdx_rdma::RdmaError>),
    /// RDMA or fabric cannot serve what was asked, for a reason the engine found (a staged
    /// registration, a region without an rkey, GPU memory without FI_HMEM), or the peer's RDMA
    /// or fabric failure as it arrived over the wire (its cause stays on the peer). Same wire
    /// code as [`Error::Rdma`] (path `rdma`) or [`Error::Fabric`] (path `fabric`).
    #[error("{path}: {reason}")]
    Refused {
        /// [`Path::Rdma`] or [`Path::Fabric`].
        path: Path,
        /// The region refused, when the refusal is about one.
        region: Option<u64>,
        /// Why.
        reason: String,
    },
    /// A libfabric step failed (provider choice, registration, address exchange, a completion
    /// error by name: refused access, cancelled, ...); gdx-fabric's error is the source (shared,
    /// so that the error stays cloneable).
    #[error("fabric: {0}")]
    Fabric(#[source] Arc<gdx_fabric::FabricError>),
    /// The peer did not prove it holds this agent's secret, or this side refused the peer's
    /// authentication mode (one side `insecure`, the other not). Nothing was shared.
    #[error("authentication failed: {why}")]
    AuthFailed {
        /// Which check failed.
        kind: AuthFailure,
        /// The check's account, with the remedy.
        why: String,
    },
    /// Nothing answered the connect: refused (no agent listens at that address), no route, or no
    /// answer within the I/O timeout. Unlike [`Error::PeerLost`], no connection ever existed and
    /// nothing was sent.
    #[error(
        "cannot reach {addr}: {why} (is a gdx agent listening there? `gdx serve --listen` starts \
         one)"
    )]
    Unreachable {
        /// The address tried.
        addr: String,
        /// Why it did not answer (the connect's error).
        why: String,
    },
    /// A configured bound was hit (connections, names, queued notifications, leases, handshake
    /// or idle deadline); `what` names the bound and its setting.
    #[error("limit reached: {what} (limit {limit})")]
    LimitReached {
        /// Which bound, with the setting that raises it.
        what: String,
        /// The bound in force.
        limit: u64,
    },
    /// An operating-system call failed.
    #[error("{call} failed: {source}")]
    Os {
        /// The call that failed (`memfd_create`, `mmap`, `connect` ...).
        call: &'static str,
        /// The OS error, shared so that the error stays cloneable (`source()` is the `Arc`;
        /// [`Error::os_error`] gives the `io::Error`).
        #[source]
        source: Arc<io::Error>,
    },
    /// A file copy through `gdx-storage` failed (I/O, cuFile); travels as an OS error (code
    /// 18).
    #[error("file copy failed: {0}")]
    Storage(#[source] Arc<gdx_storage::StorageError>),
    /// The peer reported an error whose cause stayed on the peer (an OS call, CUDA) or a code
    /// this build does not know: its wire form as it arrived.
    #[error(transparent)]
    Remote(Box<RemoteError>),
}

impl From<gdx_sys::cuda::CudaError> for Error {
    fn from(e: gdx_sys::cuda::CudaError) -> Error {
        Error::Cuda(Box::new(e))
    }
}

impl From<gdx_rdma::RdmaError> for Error {
    fn from(e: gdx_rdma::RdmaError) -> Error {
        Error::Rdma(Box::new(e))
    }
}

impl PartialEq for Error {
    /// Equal when they travel alike: the same code, numbers and text (sources cannot be
    /// compared, and a source-carrying error equals its text as the peer sees it).
    fn eq(&self, other: &Self) -> bool {
        RemoteError::from(self) == RemoteError::from(other)
    }
}

impl Eq for Error {}

impl From<&Error> for RemoteError {
    fn from(e: &Error) -> Self {
        let (a, b, c) = e.wire_args();
        RemoteError {
            code: e.code(),
            args: [a, b, c],
            message: e.wire_message(),
        }
    }
}

impl From<RemoteError> for Error {
    fn from(r: RemoteError) -> Self {
        let [a, b, c] = r.args;
        Error::from_wire(r.code, a, b, c, r.message)
    }
}

impl Error {
    /// Wraps an OS error with the name of the call that failed.
    pub fn os(call: &'static str, err: io::Error) -> Self {
        Error::Os {
            call,
            source: Arc::new(err),
        }
    }

    /// The OS error of an [`Error::Os`] (its errno, its kind).
    pub fn os_error(&self) -> Option<&io::Error> {
        match self {
            Error::Os { source, .. } => Some(source),
            _ => None,
        }
    }

    /// Maps an I/O error on a peer connection: timeouts and broken connections become
    /// [`Error::PeerLost`], since the peer did not answer.
    pub(crate) fn from_peer_io(what: &str, err: io::Error) -> Self {
        Error::PeerLost {
            errno: err.raw_os_error(),
            reason: format!("{what}: {err}"),
        }
    }

    /// [`Error::PeerLost`] without an OS error (EOF, a thread that ended, a peer that went
    /// silent).
    pub fn peer_lost(reason: impl Into<String>) -> Self {
        Error::PeerLost {
            reason: reason.into(),
            errno: None,
        }
    }

    /// [`Error::AuthFailed`] of `kind`.
    pub(crate) fn auth(kind: AuthFailure, why: impl Into<String>) -> Self {
        Error::AuthFailed {
            kind,
            why: why.into(),
        }
    }

    /// [`Error::Strict`] refusing `path` (`None`: no fallback was planned).
    pub(crate) fn strict(path: impl Into<Option<Path>>, reason: impl Into<String>) -> Self {
        Error::Strict {
            path: path.into(),
            reason: reason.into(),
        }
    }

    /// [`Error::Unavailable`] for `path` (`None`: not about one path).
    pub fn unavailable(path: impl Into<Option<Path>>, why: impl Into<String>) -> Self {
        Error::Unavailable {
            path: path.into(),
            why: why.into(),
        }
    }

    /// [`Error::Refused`] on `path` (rdma or fabric), about `region` if any.
    pub(crate) fn refused(path: Path, region: Option<u64>, reason: impl Into<String>) -> Self {
        Error::Refused {
            path,
            region,
            reason: reason.into(),
        }
    }

    /// The code this error travels as on the wire (see `docs/wire-protocol.md`).
    pub fn code(&self) -> u16 {
        match self {
            Error::PeerLost { .. } => 1,
            Error::Timeout(_) => 2,
            Error::BadKey { .. } => 3,
            Error::NoSuchRegion { .. } => 4,
            Error::NoSuchName { .. } => 5,
            Error::OutOfBounds { .. } => 6,
            Error::ReadOnly { .. } => 7,
            Error::NotReadable { .. } => 8,
            Error::FrameTooLarge { .. } => 9,
            Error::UnknownVersion(_) => 10,
            Error::BadMagic(_) => 11,
            Error::UnknownFrame(_) => 12,
            Error::Malformed(_) => 13,
            Error::Protocol(_) => 14,
            Error::RegionGone { .. } => 15,
            Error::InvalidArgument(_) | Error::BadBlock { .. } => 16,
            Error::Unavailable { .. } => 17,
            Error::Os { .. } | Error::Storage(_) => 18,
            Error::Cuda(_) => 19,
            Error::Strict { .. } => 20,
            Error::Rdma(_) => 21,
            Error::Refused { path, .. } if *path == Path::Rdma => 21,
            Error::AuthFailed { .. } => 22,
            Error::LimitReached { .. } => 23,
            Error::Unreachable { .. } => 24,
            Error::Fabric(_) | Error::Refused { .. } => 25,
            Error::Cancelled => 26,
            Error::Remote(r) => r.code,
        }
    }

    /// Rebuilds an error from its wire code, the numeric argument and the message the peer sent.
    /// Codes carrying structured data keep it (`region`, offsets); codes whose local variant
    /// holds a source (an OS call, CUDA) and unknown codes become [`Error::Remote`]; an RDMA
    /// or fabric failure becomes [`Error::Refused`] with the peer's text.
    pub fn from_wire(code: u16, a: u64, b: u64, c: u64, message: String) -> Self {
        // A present `Option<u64>` travels as its value in one number and 1 in the next.
        let opt = |v: u64, present: u64| (present == 1).then_some(v);
        match code {
            1 => Error::PeerLost {
                reason: message,
                errno: opt(a, b).and_then(|e| i32::try_from(e).ok()),
            },
            2 => Error::Timeout(Duration::from_millis(a)),
            3 => Error::BadKey { region: a },
            4 => Error::NoSuchRegion { region: a },
            5 => Error::NoSuchName {
                name: message,
                published: a,
            },
            6 => Error::OutOfBounds {
                offset: a,
                len: b,
                region_len: c,
            },
            7 => Error::ReadOnly { region: a },
            8 => Error::NotReadable { region: a },
            9 => Error::FrameTooLarge { len: a, limit: b },
            10 => Error::UnknownVersion(a as u8),
            11 => Error::BadMagic(a as u16),
            12 => Error::UnknownFrame(a as u8),
            13 => Error::Malformed(message),
            14 => Error::Protocol(message),
            15 => Error::RegionGone { region: a },
            16 => Error::InvalidArgument(message),
            17 => Error::Unavailable {
                path: opt(a, b).and_then(|i| Path::ALL.get(i as usize).copied()),
                why: message,
            },
            20 => Error::Strict {
                path: opt(a, b).and_then(|i| Path::ALL.get(i as usize).copied()),
                reason: message,
            },
            21 => Error::Refused {
                path: Path::Rdma,
                region: opt(a, b),
                reason: message,
            },
            22 => Error::AuthFailed {
                kind: AuthFailure::from_code(a),
                why: message,
            },
            23 => Error::LimitReached {
                what: message,
                limit: a,
            },
            24 => {
                // An address holds no ": " (host:port, [v6]:port), so the first one ends it.
                let (addr, why) = message.split_once(": ").unwrap_or((&message, ""));
                Error::Unreachable {
                    addr: addr.to_string(),
                    why: why.to_string(),
                }
            }
            25 => Error::Refused {
                path: Path::Fabric,
                region: opt(a, b),
                reason: message,
            },
            26 => Error::Cancelled,
            code => Error::Remote(Box::new(RemoteError {
                code,
                args: [a, b, c],
                message,
            })),
        }
    }

    /// The numeric arguments that travel with [`Error::code`] (see [`Error::from_wire`]).
    pub fn wire_args(&self) -> (u64, u64, u64) {
        let some = |v: Option<u64>| v.map_or((0, 0, 0), |v| (v, 1, 0));
        match self {
            Error::Timeout(d) => (d.as_millis() as u64, 0, 0),
            Error::Remote(r) => (r.args[0], r.args[1], r.args[2]),
            Error::BadKey { region }
            | Error::NoSuchRegion { region }
            | Error::ReadOnly { region }
            | Error::NotReadable { region }
            | Error::RegionGone { region } => (*region, 0, 0),
            Error::OutOfBounds {
                offset,
                len,
                region_len,
            } => (*offset, *len, *region_len),
            Error::FrameTooLarge { len, limit } => (*len, *limit, 0),
            Error::UnknownVersion(v) => (u64::from(*v), 0, 0),
            Error::BadMagic(m) => (u64::from(*m), 0, 0),
            Error::UnknownFrame(k) => (u64::from(*k), 0, 0),
            Error::LimitReached { limit, .. } => (*limit, 0, 0),
            Error::NoSuchName { published, .. } => (*published, 0, 0),
            Error::PeerLost { errno, .. } => some(errno.map(|e| e as u64)),
            Error::Strict { path, .. } | Error::Unavailable { path, .. } => {
                some(path.map(|p| p.index() as u64))
            }
            Error::Refused { region, .. } => some(*region),
            Error::AuthFailed { kind, .. } => (kind.code(), 0, 0),
            _ => (0, 0, 0),
        }
    }

    /// The text that travels with [`Error::code`]: the inner string for string-carrying variants
    /// (so they round-trip), the source's text for [`Error::Rdma`] (it arrives as
    /// [`Error::Refused`], which adds the `rdma: ` again), the display text otherwise.
    pub fn wire_message(&self) -> String {
        match self {
            Error::PeerLost { reason: s, .. }
            | Error::NoSuchName { name: s, .. }
            | Error::Malformed(s)
            | Error::Protocol(s)
            | Error::InvalidArgument(s)
            | Error::Unavailable { why: s, .. }
            | Error::Strict { reason: s, .. }
            | Error::Refused { reason: s, .. }
            | Error::AuthFailed { why: s, .. } => s.clone(),
            Error::Unreachable { addr, why } => format!("{addr}: {why}"),
            Error::LimitReached { what, .. } => what.clone(),
            Error::Rdma(source) => source.to_string(),
            Error::Fabric(source) => source.to_string(),
            Error::Remote(r) => r.message.clone(),
            other => other.to_string(),
        }
    }

    /// True for errors after which the connection cannot be trusted to stay in sync (the stream is
    /// closed rather than answered).
    pub(crate) fn is_fatal_for_stream(&self) -> bool {
        matches!(
            self,
            Error::PeerLost { .. }
                | Error::FrameTooLarge { .. }
                | Error::UnknownVersion(_)
                | Error::BadMagic(_)
                | Error::UnknownFrame(_)
                | Error::Malformed(_)
                | Error::Protocol(_)
                | Error::AuthFailed { .. }
        )
    }
}

/// An error as it travels between agents: the wire code of its [`crate::Error`] variant, the
/// three numbers that carry structured fields (a region id, offsets, a limit) and its text.
/// Every [`crate::Error`] converts into one (`RemoteError::from(&e)`) and back
/// (`Error::from(r)`); the local error keeps its cause as `source()`, the wire carries only its
/// text, since a cause cannot travel. See `docs/wire-protocol.md` for the codes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("remote error {code}: {message}")]
pub struct RemoteError {
    /// Wire code ([`crate::Error::code`]).
    pub code: u16,
    /// The numeric arguments ([`crate::Error::wire_args`]).
    pub args: [u64; 3],
    /// The text ([`crate::Error::wire_message`]).
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn an_os_error_keeps_its_source_and_travels_as_code_18_text() {
        let e = Error::os("mmap", io::Error::from_raw_os_error(12));
        let src = e.source().expect("the io::Error stays the source");
        assert!(src.downcast_ref::<Arc<io::Error>>().is_some(), "{src:?}");
        assert_eq!(e.os_error().and_then(io::Error::raw_os_error), Some(12));
        let r = RemoteError::from(&e);
        assert_eq!(r.code, 18);
        assert!(r.message.starts_with("mmap failed: "), "{}", r.message);
        // On the peer the cause is gone: the wire form is what arrives.
        let back = Error::from(r.clone());
        assert!(matches!(&back, Error::Remote(x) if **x == r), "{back:?}");
        assert!(back.source().is_none());
        assert_eq!(back, e, "equal as they travel");
    }

    #[test]
    fn an_rdma_error_arrives_with_the_same_text() {
        let local = Error::from(gdx_rdma::RdmaError::Mismatch("mtu 1024 vs 4096".into()));
        assert!(local.source().is_some());
        let back = Error::from(RemoteError::from(&local));
        assert!(
            matches!(
                back,
                Error::Refused {
                    path: Path::Rdma,
                    ..
                }
            ),
            "{back:?}"
        );
        assert_eq!(back.to_string(), local.to_string());
        assert_eq!(back.code(), 21);
    }

    #[test]
    fn structured_errors_round_trip_through_their_wire_form() {
        for e in [
            Error::OutOfBounds {
                offset: 8,
                len: 16,
                region_len: 20,
            },
            Error::BadKey { region: 7 },
            Error::LimitReached {
                what: "max_leases (GDX_MAX_LEASES)".into(),
                limit: 4,
            },
            Error::PeerLost {
                reason: "data stream: connection reset".into(),
                errno: Some(104),
            },
            Error::peer_lost("control connection closed"),
            Error::strict(Path::Staged, "staged: no peer access"),
            Error::strict(None, "the copy could not use GDS"),
            Error::unavailable(Path::Cma, "GDX_SHM_CMA=0"),
            Error::unavailable(None, "the CUDA driver reports no GPU"),
            Error::refused(Path::Fabric, Some(3), "no FI_HMEM"),
            Error::refused(Path::Rdma, None, "no RDMA device port opened"),
            Error::auth(AuthFailure::Mode, "the peer runs without authentication"),
            Error::Unreachable {
                addr: "[::1]:7447".into(),
                why: "Connection refused (os error 111)".into(),
            },
            Error::NoSuchName {
                name: "kv".into(),
                published: 3,
            },
            Error::Remote(Box::new(RemoteError {
                code: 900,
                args: [1, 2, 3],
                message: "from a newer build".into(),
            })),
        ] {
            let back = Error::from(RemoteError::from(&e));
            assert_eq!(format!("{back:?}"), format!("{e:?}"));
        }
    }
}

/// Which authentication check failed ([`Error::AuthFailed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AuthFailure {
    /// A proof was wrong or invalid: the two sides hold different secrets (or the exchange
    /// was altered on the way).
    Proof,
    /// One side runs without authentication (insecure) and the other does not.
    Mode,
    /// The agent reached is not the one expected (another name, instance or cluster).
    WrongAgent,
    /// A data stream or shm connection named a session that does not exist, or a wrong token.
    Session,
    /// The peer sent a frame the authentication exchange does not allow at that step.
    Sequence,
    /// The shm socket belongs to a user this agent does not accept.
    User,
    /// A check this build does not know (from a newer peer).
    Other,
}

impl AuthFailure {
    /// By wire number: 0 is `Other`, so an error from a build that sends no kind reads as
    /// unknown rather than as a named check.
    const ALL: [AuthFailure; 7] = [
        AuthFailure::Other,
        AuthFailure::Proof,
        AuthFailure::Mode,
        AuthFailure::WrongAgent,
        AuthFailure::Session,
        AuthFailure::Sequence,
        AuthFailure::User,
    ];

    /// Its name: `proof`, `mode`, `wrong-agent`, `session`, `sequence`, `user`, `other`.
    pub fn as_str(self) -> &'static str {
        match self {
            AuthFailure::Proof => "proof",
            AuthFailure::Mode => "mode",
            AuthFailure::WrongAgent => "wrong-agent",
            AuthFailure::Session => "session",
            AuthFailure::Sequence => "sequence",
            AuthFailure::User => "user",
            AuthFailure::Other => "other",
        }
    }

    /// Its number on the wire.
    fn code(self) -> u64 {
        Self::ALL.iter().position(|k| *k == self).unwrap_or(0) as u64
    }

    fn from_code(c: u64) -> Self {
        Self::ALL
            .get(c as usize)
            .copied()
            .unwrap_or(AuthFailure::Other)
    }
}

/// Which list of a post an entry is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockList {
    /// The source blocks.
    Src,
    /// The destination blocks.
    Dst,
}

impl std::fmt::Display for BlockList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BlockList::Src => "src",
            BlockList::Dst => "dst",
        })
    }
}
