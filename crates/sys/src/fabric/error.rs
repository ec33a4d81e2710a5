//! [`LibfabricError`]: a failing libfabric call, or a check this module makes before one.

use crate::Unavailable;

/// Errors of libfabric calls and of the checks made before calling (gdx-fabric maps each onto
/// its own `FabricError` variant of the same name).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LibfabricError {
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
    /// No `fi_info` entry `index` in a list of `len`.
    #[error("no libfabric provider: no entry {index} (the list has {len})")]
    NoEntry {
        /// The entry asked for.
        index: usize,
        /// Entries in the list.
        len: usize,
    },
    /// A name libfabric cannot take: it holds a NUL byte.
    #[error("no libfabric provider: {name:?} contains a NUL byte")]
    NulInName {
        /// The name.
        name: String,
        /// Where its first NUL is.
        at: usize,
    },
    /// An operation's local span is outside its registration; refused before posting.
    #[error("{side} span {offset}+{len} is outside the {size}-byte registration")]
    OutOfBounds {
        /// "local" (the only side this module can check).
        side: &'static str,
        /// Offset asked for.
        offset: u64,
        /// Length asked for.
        len: u64,
        /// Registered size.
        size: u64,
    },
    /// A peer's address was refused before or by `fi_av_insert`.
    #[error("bad peer address ({len} bytes): {why}")]
    BadAddress {
        /// Length of the address given.
        len: usize,
        /// What was wrong.
        why: String,
    },
    /// Objects of different domains (or fabrics) were given to one call; refused before
    /// libfabric sees them.
    #[error("{call}: {what} belongs to another domain")]
    ForeignObject {
        /// The call that was not made.
        call: &'static str,
        /// Which argument.
        what: &'static str,
    },
}
