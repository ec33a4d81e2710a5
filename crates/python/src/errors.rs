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
    Cancelled,
    Error,
    "The transfer was cancelled (``Transfer.cancel()``) before all of its ops completed."
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

/// The Python exception for an engine error. The exception also carries the error's fields a
/// caller matches on, as attributes: `errno` on `PeerLost`; `path` (a path name or `None`) on
/// `StrictViolation` and `Unavailable` and on the rdma/fabric refusals; `kind` (`"proof"`,
/// `"mode"`, `"wrong-agent"`, `"session"`, `"sequence"`, `"user"`) on an authentication
/// failure's `AccessDenied`; `region` where an error names one; `name` on `NotFound` for a
/// name; `addr` on an unreachable address.
pub(crate) fn to_py(e: EngineError) -> PyErr {
    let msg = e.to_string();
    let path_name = |p: &Option<gdx_engine::Path>| p.map(|p| p.to_string());
    let (err, attrs): (PyErr, Vec<(&str, Attr)>) = match e {
        EngineError::PeerLost { errno, .. } => (
            PeerLost::new_err(msg),
            vec![("errno", Attr::Int(errno.map(i64::from)))],
        ),
        EngineError::Timeout(_) => (Timeout::new_err(msg), vec![]),
        EngineError::Cancelled => (Cancelled::new_err(msg), vec![]),
        EngineError::BadKey { region }
        | EngineError::ReadOnly { region }
        | EngineError::NotReadable { region } => (
            AccessDenied::new_err(msg),
            vec![("region", Attr::Int(i64::try_from(region).ok()))],
        ),
        EngineError::AuthFailed { kind, .. } => (
            AccessDenied::new_err(msg),
            vec![("kind", Attr::Str(Some(kind.as_str().to_string())))],
        ),
        EngineError::OutOfBounds { .. } => (OutOfBounds::new_err(msg), vec![]),
        EngineError::NoSuchRegion { region } | EngineError::RegionGone { region } => (
            NotFound::new_err(msg),
            vec![("region", Attr::Int(i64::try_from(region).ok()))],
        ),
        EngineError::NoSuchName { name, published } => (
            NotFound::new_err(msg),
            vec![
                ("name", Attr::Str(Some(name))),
                ("published", Attr::Int(i64::try_from(published).ok())),
            ],
        ),
        EngineError::Unavailable { path, .. } => (
            Unavailable::new_err(msg),
            vec![("path", Attr::Str(path_name(&path)))],
        ),
        EngineError::Strict { path, .. } => (
            StrictViolation::new_err(msg),
            vec![("path", Attr::Str(path_name(&path)))],
        ),
        EngineError::Refused { path, region, .. } => (
            Error::new_err(msg),
            vec![
                ("path", Attr::Str(Some(path.to_string()))),
                (
                    "region",
                    Attr::Int(region.and_then(|r| i64::try_from(r).ok())),
                ),
            ],
        ),
        EngineError::Unreachable { addr, .. } => {
            (Error::new_err(msg), vec![("addr", Attr::Str(Some(addr)))])
        }
        _ => (Error::new_err(msg), vec![]),
    };
    if !attrs.is_empty() {
        Python::with_gil(|py| {
            let value = err.value(py);
            for (name, attr) in attrs {
                // Setting an attribute on a fresh exception instance does not fail; if it
                // did, the exception would still carry its class and message.
                let _ = match attr {
                    Attr::Int(v) => value.setattr(name, v),
                    Attr::Str(v) => value.setattr(name, v),
                };
            }
        });
    }
    err
}

/// An attribute value set on an exception.
enum Attr {
    Int(Option<i64>),
    Str(Option<String>),
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
    m.add("Cancelled", py.get_type::<Cancelled>())?;
    m.add("AccessDenied", py.get_type::<AccessDenied>())?;
    m.add("OutOfBounds", py.get_type::<OutOfBounds>())?;
    m.add("NotFound", py.get_type::<NotFound>())?;
    m.add("Unavailable", py.get_type::<Unavailable>())?;
    m.add("StrictViolation", py.get_type::<StrictViolation>())?;
    m.add("BadCheckpoint", py.get_type::<BadCheckpoint>())?;
    // The fields `to_py` sets, `None` on the class: every instance has them, set or not.
    let fields: [(&Bound<'_, pyo3::types::PyType>, &[&str]); 5] = [
        (&py.get_type::<PeerLost>(), &["errno"]),
        (&py.get_type::<AccessDenied>(), &["kind", "region"]),
        (&py.get_type::<NotFound>(), &["name", "published", "region"]),
        (&py.get_type::<Unavailable>(), &["path"]),
        (&py.get_type::<StrictViolation>(), &["path"]),
    ];
    for (class, names) in fields {
        for name in names {
            class.setattr(*name, py.None())?;
        }
    }
    let base = py.get_type::<Error>();
    for name in ["path", "region", "addr"] {
        base.setattr(name, py.None())?;
    }
    Ok(())
}
