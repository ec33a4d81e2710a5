//! `gdx.PreparedTransfer`: a batch checked and planned once (`Peer.prepare_write` /
//! `prepare_read`), posted again and again.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use gdx_engine::{OpKind, PreparedTransfer};
use pyo3::prelude::*;

use crate::cuda;
use crate::errors::PyResultExt;
use crate::peer::{PyOpResults, PyPeer, PyTransfer};
use crate::wait::{seconds, wait_sliced};

/// A batch prepared once (``Peer.prepare_write``/``prepare_read``): ``post()`` starts it
/// again and returns a Transfer, ``run()`` posts and waits.
#[pyclass(name = "PreparedTransfer", module = "gdx", frozen)]
pub struct PyPreparedTransfer {
    // Posting re-arms the engine's state in place: one post at a time per object (posts from
    // several threads take turns; each still returns its own Transfer).
    p: Arc<Mutex<PreparedTransfer>>,
    gpu: Option<u32>,
    n_ops: usize,
}

pub(crate) fn prepare(
    peer: &PyPeer,
    py: Python<'_>,
    ops: &Bound<'_, PyAny>,
    kind: OpKind,
    notify: Option<Vec<u8>>,
    timeout: Option<f64>,
) -> PyResult<PyPreparedTransfer> {
    let (t, gpu) = peer.transfer(ops, kind, notify, timeout)?;
    let n_ops = t.len();
    let engine = Arc::clone(peer.peer());
    let p = py.allow_threads(move || engine.prepare(t)).py_err()?;
    Ok(PyPreparedTransfer {
        p: Arc::new(Mutex::new(p)),
        gpu,
        n_ops,
    })
}

impl PyPreparedTransfer {
    fn post_now(&self, py: Python<'_>) -> PyResult<PyTransfer> {
        let p = Arc::clone(&self.p);
        let h = py
            .allow_threads(move || p.lock().unwrap_or_else(|e| e.into_inner()).post())
            .py_err()?;
        Ok(PyTransfer {
            h,
            n_ops: self.n_ops,
        })
    }
}

#[pymethods]
impl PyPreparedTransfer {
    /// Starts the batch once more and returns its Transfer (``wait()`` it). ``stream``: as
    /// ``Peer.write``'s, the work queued on it before this call finishes first.
    #[pyo3(signature = (stream=None))]
    fn post(&self, py: Python<'_>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<PyTransfer> {
        if let Some(s) = stream {
            cuda::sync_stream(py, cuda::stream_handle(s)?, self.gpu.unwrap_or(0))?;
        }
        self.post_now(py)
    }

    /// Posts and waits up to ``timeout`` seconds (default 60); returns one OpResult per op, or
    /// raises as ``Transfer.wait`` does.
    #[pyo3(signature = (timeout=None))]
    fn run(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<PyOpResults> {
        let timeout = seconds(timeout, Duration::from_secs(60))?;
        let t = self.post_now(py)?;
        let report = wait_sliced(py, timeout, |s| t.h.wait(s))?;
        Ok(PyOpResults::from(report.ops))
    }

    /// The path each op was planned on (``"shm"``, ``"tcp"`` ...).
    #[getter]
    fn paths(&self) -> Vec<String> {
        let p = self.p.lock().unwrap_or_else(|e| e.into_inner());
        p.paths().iter().map(ToString::to_string).collect()
    }

    fn __len__(&self) -> usize {
        self.n_ops
    }

    fn __repr__(&self) -> String {
        format!(
            "PreparedTransfer(ops={}, paths={:?})",
            self.n_ops,
            self.paths()
        )
    }
}
