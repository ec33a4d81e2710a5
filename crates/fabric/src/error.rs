//! The crate's error type: one variant per failing libfabric call or gdx-side check, each naming
//! what failed, so a caller (the engine, doctor) can tell a dead peer from a bad key.

use gdx_sys::fabric::{bindings as ffi, LibfabricError};
use gdx_sys::Unavailable;

/// Errors from libfabric calls and from the checks this crate makes before posting.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FabricError {
    /// libfabric could not be loaded (not installed, or too old).
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
    /// A libfabric call returned an error code.
    #[error("{call} failed: {message} (-{code})")]
    Call {
        /// The C call, e.g. `fi_getinfo`.
        call: &'static str,
        /// The positive `FI_E*` / errno value.
        code: i32,
        /// `fi_strerror` of `code`.
        message: String,
    },
    /// The provider's endpoint could not be enabled, with what is known to cause it here.
    #[error("{source}: {why}")]
    Enable {
        /// The failed call.
        #[source]
        source: Box<FabricError>,
        /// The likely cause and what to do.
        why: String,
    },
    /// No provider offers what was asked (FI_RMA on an RDM endpoint, or the named provider).
    #[error("no libfabric provider: {why}")]
    NoProvider {
        /// The provider asked for (`GDX_FABRIC_PROVIDER`, or the one found unusable); `None`:
        /// the automatic choice.
        wanted: Option<String>,
        /// The providers libfabric offered (their core names), where the list was read.
        offered: Vec<String>,
        /// What is missing, naming them.
        why: String,
    },
    /// The chosen provider would use something other than loopback while gdx requires it.
    #[error("refused: {0}")]
    NotLoopback(String),
    /// The provider needs an MR mode this crate does not handle (FI_MR_RAW keys, say).
    #[error("provider {provider} needs an unsupported memory-registration mode: {what}")]
    UnsupportedMrMode {
        /// Provider name.
        provider: String,
        /// The mode bit or key size that is not handled.
        what: String,
    },
    /// GPU memory offered for registration on an endpoint whose provider was not opened with
    /// FI_HMEM; refused by gdx before the provider sees it.
    #[error(
        "provider {provider} was not opened with FI_HMEM, so GPU{device} memory cannot be \
         registered with it (stage it through host memory)"
    )]
    NoHmem {
        /// Provider name.
        provider: String,
        /// The GPU ordinal of the memory.
        device: i32,
    },
    /// An operation's local or remote span is outside its registration; refused by gdx before
    /// posting.
    #[error("{side} span {offset}+{len} is outside the {size}-byte registration")]
    OutOfBounds {
        /// "local" or "remote".
        side: &'static str,
        /// Offset asked for.
        offset: u64,
        /// Length asked for.
        len: u64,
        /// Registered size.
        size: u64,
    },
    /// The peer's address could not be inserted into the address vector.
    #[error("bad peer address ({len} bytes): {why}")]
    BadAddress {
        /// Length of the address given.
        len: usize,
        /// What was wrong.
        why: String,
    },
    /// The remote side refused the access (the provider reported a protection or key error
    /// in the completion): wrong key, out-of-range address, or a registration that is gone.
    #[error("remote access refused by the provider: {text}")]
    RemoteAccess {
        /// The completion's error code (`FI_E*`, or the errno the provider put in
        /// `prov_errno`).
        code: i32,
        /// The provider's text for it.
        text: String,
    },
    /// The peer went away (connection refused/reset, or the provider reports it unreachable).
    #[error("peer lost: {text}")]
    PeerLost {
        /// The completion's error code (`FI_E*` or errno); `None` when the peer's own channel
        /// said it is gone.
        code: Option<i32>,
        /// The provider's text, or what was outstanding.
        text: String,
    },
    /// A completion carried an error not covered above.
    #[error("completion error: {text}")]
    Completion {
        /// The completion's error code (`FI_E*`).
        code: i32,
        /// The provider's own code (`prov_errno`).
        prov_errno: i32,
        /// The provider's text for it.
        text: String,
    },
    /// Posted operations did not complete within the deadline; the endpoint keeps them
    /// parked until they complete or the endpoint closes.
    #[error("{pending} of {posted} operation(s) not complete after {waited_ms} ms")]
    Timeout {
        /// Operations still outstanding.
        pending: usize,
        /// Operations posted in the batch.
        posted: usize,
        /// How long it waited.
        waited_ms: u128,
    },
    /// The endpoint's progress thread could not be started.
    #[error("endpoint closed: progress thread: {0}")]
    ProgressThread(#[source] std::io::Error),
    /// An error of gdx-sys's libfabric layer this crate has no variant of yet
    /// (`LibfabricError` is non-exhaustive).
    #[error("endpoint closed: {0}")]
    Sys(#[source] LibfabricError),
}

impl From<LibfabricError> for FabricError {
    /// Each of gdx-sys's errors as the variant of the same name; an object of another domain
    /// (which this crate never passes) as the EINVAL it would have been.
    fn from(e: LibfabricError) -> Self {
        match e {
            LibfabricError::Unavailable(u) => FabricError::Unavailable(u),
            LibfabricError::Call {
                call,
                code,
                message,
            } => FabricError::Call {
                call,
                code,
                message,
            },
            e @ (LibfabricError::NoEntry { .. } | LibfabricError::NulInName { .. }) => {
                let why = e.to_string();
                FabricError::NoProvider {
                    wanted: None,
                    offered: Vec::new(),
                    why: why
                        .strip_prefix("no libfabric provider: ")
                        .unwrap_or(&why)
                        .to_string(),
                }
            }
            LibfabricError::OutOfBounds {
                side,
                offset,
                len,
                size,
            } => FabricError::OutOfBounds {
                side,
                offset,
                len,
                size,
            },
            LibfabricError::BadAddress { len, why } => FabricError::BadAddress { len, why },
            e @ LibfabricError::ForeignObject { call, .. } => FabricError::Call {
                call,
                code: ffi::FI_EINVAL as i32,
                message: e.to_string(),
            },
            // LibfabricError is non-exhaustive: a later variant is kept whole.
            e => FabricError::Sys(e),
        }
    }
}

/// This crate's result.
pub type Result<T> = std::result::Result<T, FabricError>;
