//! [`RemoteError`]: an engine error in the form it crosses the wire.

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
