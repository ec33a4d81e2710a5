//! Blocking waits that release the GIL and stay interruptible.
//!
//! A wait is cut into slices of at most [`SLICE`]; between slices the GIL is taken back only to
//! run `check_signals`, so Ctrl-C raises `KeyboardInterrupt` within about 50 ms while other
//! Python threads run freely during the wait.

use std::time::{Duration, Instant};

use gdx_engine::Error;
use pyo3::prelude::*;

use crate::errors::to_py;

/// Longest stretch without a signal check (the issue allows 100 ms).
pub(crate) const SLICE: Duration = Duration::from_millis(50);

/// Longest timeout taken as given (about 31 years: forever, for a process); larger ones are
/// clamped to it, so `now + timeout` cannot overflow (`wait(timeout=1e19)` used to panic).
pub(crate) const MAX_TIMEOUT_S: f64 = 1e9;

/// Seconds from Python (`None` = `default`) as a `Duration`, clamped to [`MAX_TIMEOUT_S`];
/// negative, NaN or infinite is refused with `gdx.Error`.
pub(crate) fn seconds(t: Option<f64>, default: Duration) -> PyResult<Duration> {
    match t {
        None => Ok(default),
        Some(s) if s.is_finite() && s >= 0.0 => Ok(Duration::from_secs_f64(s.min(MAX_TIMEOUT_S))),
        Some(s) => Err(crate::errors::err(format!(
            "timeout must be a finite number of seconds >= 0, not {s}"
        ))),
    }
}

/// Calls `step(slice)` with the GIL released until it returns something other than
/// `Err(Error::Timeout)` or `timeout` has passed; `step` must block at most `slice`.
pub(crate) fn wait_sliced<T: Send>(
    py: Python<'_>,
    timeout: Duration,
    step: impl Fn(Duration) -> gdx_engine::Result<T> + Sync,
) -> PyResult<T> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let slice = left.min(SLICE);
        match py.allow_threads(|| step(slice)) {
            Err(Error::Timeout(_)) if !left.is_zero() => py.check_signals()?,
            Err(Error::Timeout(_)) => return Err(to_py(Error::Timeout(timeout))),
            other => return other.map_err(to_py),
        }
    }
}
