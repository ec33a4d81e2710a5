//! The typed exceptions and the one mapping from the engine's [`Error`] to them.
//!
//! Every engine error ([`EngineError`]) becomes a `gdx.Error` subclass chosen by its variant, so Python code can
//! `except gdx.PeerLost` without parsing messages; the message is the engine's `Display` text.

use gdx_engine::Error as EngineError;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    gdx,
    Error,
    PyException,
    "Base class of every error gdx raises (the engine's error, with its message)."
);
create_exception!(
    gdx,
    PeerLost,
    Error,
    "The connection to the peer broke (died, reset, or no answer within the I/O timeout)."
);
create_exception!(
    gdx,
    Timeout,
    Error,
    "A wait ran out of time; the transfer may still be running (wait again)."
);
create_exception!(
    gdx,
    AccessDenied,
    Error,
    "Wrong region key, a write to a read-only region, a read of a non-readable one, or failed \
     authentication (wrong or missing secret)."
);
create_exception!(
    gdx,
    OutOfBounds,
    Error,
    "offset + length lies outside the region."
);
create_exception!(
    gdx,
    NotFound,
    Error,
    "No region with this name or id (never registered, or already closed)."
);
create_exception!(
    gdx,
    Unavailable,
    Error,
    "A library, device or transport is missing; the message names it and says why."
);
create_exception!(
    gdx,
    StrictViolation,
    Error,
    "Strict mode refused a plan that leaves the direct path; the message is the plan's reason."
);

create_exception!(
    gdx,
    BadCheckpoint,
    Error,
    "A checkpoint gdx refuses (a bad or hostile safetensors header, an index that does not \
     match its shards), found before any tensor byte moved; the message names the reason."
);

/// The Python exception for a storage error (checkpoints, file copies).
pub(crate) fn storage_to_py(e: gdx_storage::StorageError) -> PyErr {
    use gdx_storage::StorageError as S;
    let msg = e.to_string();
    match e {
        S::BadCheckpoint { .. } => BadCheckpoint::new_err(msg),
        S::OutOfBounds { .. } => OutOfBounds::new_err(msg),
        S::NoCudaDriver { .. } | S::Unavailable(_) | S::PathUnavailable { .. } => {
            Unavailable::new_err(msg)
        }
        _ => Error::new_err(msg),
    }
}

/// The Python exception for an engine error.
pub(crate) fn to_py(e: EngineError) -> PyErr {
    let msg = e.to_string();
    match e {
        EngineError::PeerLost { .. } => PeerLost::new_err(msg),
        EngineError::Timeout(_) => Timeout::new_err(msg),
        EngineError::BadKey { .. }
        | EngineError::ReadOnly { .. }
        | EngineError::NotReadable { .. }
        | EngineError::AuthFailed { .. } => AccessDenied::new_err(msg),
        EngineError::OutOfBounds { .. } => OutOfBounds::new_err(msg),
        EngineError::NoSuchRegion { .. }
        | EngineError::NoSuchName { .. }
        | EngineError::RegionGone { .. } => NotFound::new_err(msg),
        EngineError::Unavailable(_) => Unavailable::new_err(msg),
        EngineError::Strict { .. } => StrictViolation::new_err(msg),
        _ => Error::new_err(msg),
    }
}

/// Converts an engine `Result` at the binding's edge, through [`to_py`].
pub(crate) trait PyResultExt<T> {
    /// The value, or the typed Python exception.
    fn py_err(self) -> PyResult<T>;
}

impl<T> PyResultExt<T> for gdx_engine::Result<T> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

/// A `gdx.Error` raised by the binding itself (a closed object, a bad argument).
pub(crate) fn err(msg: impl Into<String>) -> PyErr {
    Error::new_err(msg.into())
}

/// Adds the exception classes to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    m.add("PeerLost", py.get_type::<PeerLost>())?;
    m.add("Timeout", py.get_type::<Timeout>())?;
    m.add("AccessDenied", py.get_type::<AccessDenied>())?;
    m.add("OutOfBounds", py.get_type::<OutOfBounds>())?;
    m.add("NotFound", py.get_type::<NotFound>())?;
    m.add("Unavailable", py.get_type::<Unavailable>())?;
    m.add("StrictViolation", py.get_type::<StrictViolation>())?;
    m.add("BadCheckpoint", py.get_type::<BadCheckpoint>())?;
    Ok(())
}
