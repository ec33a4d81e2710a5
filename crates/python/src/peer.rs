//! `gdx.Peer` (a connected remote agent), `gdx.Transfer` (a submitted batch's handle),
//! `gdx.OpResult` and `gdx.Notification`.
//!
//! A batch is built from Python tuples while the GIL is held (cheap: it clones region handles),
//! then submitted and waited for with the GIL released; the bytes move on the engine's threads.

use std::sync::Arc;
use std::time::Duration;

use gdx_engine::{
    Notification, OpKind, OpResult, OpResults, OpStatus, Peer, Status, Transfer, TransferHandle,
};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};

use crate::cuda;
use crate::errors::{err, to_py, AccessDenied, PyResultExt};
use crate::region::{PyRegion, PyRemoteRegion};
use crate::wait::{seconds, wait_sliced};

/// Rails as Python dicts: ``{"local", "remote", "bytes", "state", "cause"}`` each (the rows
/// of ``gdx bench --json`` carry the same).
fn rail_dicts<'py>(
    py: Python<'py>,
    rails: &[gdx_engine::RailInfo],
) -> PyResult<Vec<Bound<'py, PyDict>>> {
    rails
        .iter()
        .map(|r| {
            let d = PyDict::new(py);
            d.set_item("local", &r.local)?;
            d.set_item("remote", &r.remote)?;
            d.set_item("bytes", r.bytes)?;
            d.set_item("state", r.state.as_str())?;
            d.set_item("cause", r.cause.as_deref())?;
            Ok(d)
        })
        .collect()
}

/// One line naming each rail, for ``explain()``; empty when there are none.
fn rails_line(rails: &[gdx_engine::RailInfo]) -> String {
    if rails.is_empty() {
        return String::new();
    }
    let each: Vec<String> = rails
        .iter()
        .map(|r| match &r.cause {
            Some(c) => format!(
                "{} -> {} {} B, {} ({c})",
                r.local, r.remote, r.bytes, r.state
            ),
            None => format!("{} -> {} {} B, {}", r.local, r.remote, r.bytes, r.state),
        })
        .collect();
    format!("rails: {}\n", each.join("; "))
}

/// A connected, authenticated remote agent (``Agent.connect``).
#[pyclass(name = "Peer", module = "gdx", frozen)]
pub struct PyPeer {
    peer: Arc<Peer>,
    /// For a peer found by name: the cluster's handle, kept alive so that the cluster's watch
    /// closes `peer` when the instance's lease ends (it holds the handle only weakly).
    _named: Option<gdx_cluster::NamedPeer>,
}

impl PyPeer {
    pub(crate) fn peer(&self) -> &Arc<Peer> {
        &self.peer
    }

    pub(crate) fn new(peer: Peer) -> PyPeer {
        PyPeer {
            peer: Arc::new(peer),
            _named: None,
        }
    }

    pub(crate) fn named(named: gdx_cluster::NamedPeer) -> PyPeer {
        PyPeer {
            peer: Arc::new(named.peer().clone()),
            _named: Some(named),
        }
    }

    /// Builds the engine batch from `(local, local_offset, remote, remote_offset, nbytes)`
    /// tuples; returns it with the GPU of the first GPU region (for `stream=`).
    pub(crate) fn batch(
        &self,
        ops: &Bound<'_, PyAny>,
        kind: OpKind,
    ) -> PyResult<(Transfer, Option<u32>)> {
        let mut t = Transfer::new();
        let mut gpu = None;
        for (i, op) in ops.try_iter()?.enumerate() {
            let op = op?;
            let tup = op.downcast::<PyTuple>().map_err(|_| {
                err(format!(
                    "op {i}: expected (local, local_offset, remote, remote_offset, nbytes)"
                ))
            })?;
            if tup.len() != 5 {
                return Err(err(format!(
                    "op {i}: expected 5 items (local, local_offset, remote, remote_offset, \
                     nbytes), got {}",
                    tup.len()
                )));
            }
            // Borrowed items: no reference-count traffic per field (this loop runs per op).
            let local = tup.get_borrowed_item(0)?;
            let local = local
                .downcast::<PyRegion>()
                .map_err(|_| err(format!("op {i}: item 0 must be a gdx.Region")))?
                .get();
            let lo: u64 = tup.get_borrowed_item(1)?.extract()?;
            let remote = tup.get_borrowed_item(2)?;
            let remote = remote
                .downcast::<PyRemoteRegion>()
                .map_err(|_| err(format!("op {i}: item 2 must be a gdx.RemoteRegion")))?
                .get();
            let ro: u64 = tup.get_borrowed_item(3)?.extract()?;
            let n: u64 = tup.get_borrowed_item(4)?.extract()?;
            if kind == OpKind::Read && !local.writable {
                return Err(AccessDenied::new_err(format!(
                    "op {i}: the local region is read-only memory: it cannot receive a read"
                )));
            }
            let g = local.open()?;
            let live = g.as_ref().ok_or_else(|| err("closed"))?;
            if let (None, gdx_engine::Location::Gpu(n)) = (gpu, live.region.location()) {
                gpu = Some(n);
            }
            match kind {
                OpKind::Write => t.write(&live.region, lo, &remote.desc, ro, n),
                OpKind::Read => t.read(&live.region, lo, &remote.desc, ro, n),
            };
        }
        if t.is_empty() {
            return Err(err("a batch needs at least one op"));
        }
        Ok((t, gpu))
    }

    /// `batch` with the notification and the deadline set (what a submit and a prepare take).
    pub(crate) fn transfer(
        &self,
        ops: &Bound<'_, PyAny>,
        kind: OpKind,
        notify: Option<Vec<u8>>,
        timeout: Option<f64>,
    ) -> PyResult<(Transfer, Option<u32>)> {
        let (mut t, gpu) = self.batch(ops, kind)?;
        if let Some(n) = notify {
            t.notify(n);
        }
        if let Some(s) = timeout {
            t.timeout(seconds(Some(s), Duration::ZERO)?);
        }
        Ok((t, gpu))
    }

    fn submit(
        &self,
        py: Python<'_>,
        ops: &Bound<'_, PyAny>,
        kind: OpKind,
        notify: Option<Vec<u8>>,
        stream: Option<&Bound<'_, PyAny>>,
        timeout: Option<f64>,
    ) -> PyResult<PyTransfer> {
        let (t, gpu) = self.transfer(ops, kind, notify, timeout)?;
        if let Some(s) = stream {
            cuda::sync_stream(py, cuda::stream_handle(s)?, gpu.unwrap_or(0))?;
        }
        let n_ops = t.len();
        let peer = Arc::clone(&self.peer);
        let h = py.allow_threads(move || peer.submit(t)).py_err()?;
        Ok(PyTransfer { h, n_ops })
    }
}

#[pymethods]
impl PyPeer {
    /// The peer agent's name.
    #[getter]
    fn name(&self) -> String {
        self.peer.info().name.clone()
    }

    /// The transport this connection uses (``"shm"`` or ``"tcp"``).
    #[getter]
    fn transport(&self) -> String {
        self.peer.route().transport.to_string()
    }

    /// Why this transport (``"same host ..."``).
    /// The connection's rails now, bytes counted since it was made: a list of
    /// ``{"local", "remote", "bytes", "state", "cause"}`` dicts (empty on shm, rdma, fabric).
    fn rails<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        rail_dicts(py, &self.peer.rails())
    }

    #[getter]
    fn route_reason(&self) -> String {
        self.peer.route().reason.clone()
    }

    /// False once the connection broke.
    #[getter]
    fn alive(&self) -> bool {
        self.peer.is_alive()
    }

    /// The descriptor of the region the peer publishes as ``name``; raises NotFound.
    fn region(&self, py: Python<'_>, name: &str) -> PyResult<PyRemoteRegion> {
        let peer = Arc::clone(&self.peer);
        let desc = py.allow_threads(|| peer.region(name)).py_err()?;
        Ok(PyRemoteRegion { desc })
    }

    /// Every region the peer publishes.
    fn regions(&self, py: Python<'_>) -> PyResult<Vec<PyRemoteRegion>> {
        let peer = Arc::clone(&self.peer);
        let all = py.allow_threads(|| peer.regions()).py_err()?;
        Ok(all
            .into_iter()
            .map(|desc| PyRemoteRegion { desc })
            .collect())
    }

    /// Writes a batch: ``ops`` is a list of ``(local, local_offset, remote, remote_offset,
    /// nbytes)`` with ``local`` a Region and ``remote`` a RemoteRegion. ``notify`` (bytes)
    /// reaches the peer's ``wait_notification`` after every byte is in place. ``stream``
    /// (``torch.cuda.Stream``, anything with ``.cuda_stream``, or an int): the work queued on
    /// it before this call finishes first (the host waits for it, then submits).
    /// Returns a Transfer; ``wait()`` it.
    #[pyo3(signature = (ops, notify=None, stream=None, timeout=None))]
    fn write(
        &self,
        py: Python<'_>,
        ops: &Bound<'_, PyAny>,
        notify: Option<Vec<u8>>,
        stream: Option<&Bound<'_, PyAny>>,
        timeout: Option<f64>,
    ) -> PyResult<PyTransfer> {
        self.submit(py, ops, OpKind::Write, notify, stream, timeout)
    }

    /// Reads a batch: the same ops as ``write``, bytes flowing from the peer's regions into
    /// the local ones.
    #[pyo3(signature = (ops, notify=None, stream=None, timeout=None))]
    fn read(
        &self,
        py: Python<'_>,
        ops: &Bound<'_, PyAny>,
        notify: Option<Vec<u8>>,
        stream: Option<&Bound<'_, PyAny>>,
        timeout: Option<f64>,
    ) -> PyResult<PyTransfer> {
        self.submit(py, ops, OpKind::Read, notify, stream, timeout)
    }

    /// Checks and plans a batch of writes once (the same ops as ``write``), for posting again
    /// and again with ``PreparedTransfer.post()``/``run()``: each post skips building the
    /// batch, validation and planning. The bytes are read at each post, so rewrite the local
    /// region between posts.
    #[pyo3(signature = (ops, notify=None, timeout=None))]
    fn prepare_write(
        &self,
        py: Python<'_>,
        ops: &Bound<'_, PyAny>,
        notify: Option<Vec<u8>>,
        timeout: Option<f64>,
    ) -> PyResult<crate::prepared::PyPreparedTransfer> {
        crate::prepared::prepare(self, py, ops, OpKind::Write, notify, timeout)
    }

    /// ``prepare_write`` for reads.
    #[pyo3(signature = (ops, notify=None, timeout=None))]
    fn prepare_read(
        &self,
        py: Python<'_>,
        ops: &Bound<'_, PyAny>,
        notify: Option<Vec<u8>>,
        timeout: Option<f64>,
    ) -> PyResult<crate::prepared::PyPreparedTransfer> {
        crate::prepared::prepare(self, py, ops, OpKind::Read, notify, timeout)
    }

    /// Checks a local ``BlockPool`` against the peer's once (same layers, segments and block
    /// size; the access ``op`` needs): returns a BlockTransfer whose ``post(src, dst, ...)``
    /// moves block lists. ``op``: ``"write"`` (local blocks to the peer's) or ``"read"``.
    #[pyo3(signature = (local, remote, op="write", timeout=None))]
    fn prepare_blocks(
        &self,
        py: Python<'_>,
        local: &Bound<'_, crate::blocks::PyBlockPool>,
        remote: &Bound<'_, crate::blocks::PyBlockPool>,
        op: &str,
        timeout: Option<f64>,
    ) -> PyResult<crate::blocks::PyBlockTransfer> {
        crate::blocks::prepare(self, py, local, remote, op, timeout)
    }

    /// Sends a notification on its own.
    fn notify(&self, py: Python<'_>, data: Vec<u8>) -> PyResult<()> {
        let peer = Arc::clone(&self.peer);
        py.allow_threads(move || peer.notify(data)).py_err()
    }

    /// Closes the connection.
    fn close(&self) {
        self.peer.close();
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, PyTuple>) -> bool {
        self.peer.close();
        false
    }

    fn __repr__(&self) -> String {
        format!(
            "Peer(name={:?}, transport={:?})",
            self.peer.info().name,
            self.peer.route().transport.to_string()
        )
    }
}

/// A submitted batch (``Peer.write``/``Peer.read``): poll with ``done()``, wait with
/// ``wait()``, read the plan of each op with ``explain()``.
#[pyclass(name = "Transfer", module = "gdx", frozen)]
pub struct PyTransfer {
    pub(crate) h: TransferHandle,
    pub(crate) n_ops: usize,
}

#[pymethods]
impl PyTransfer {
    /// Waits up to ``timeout`` seconds (default 60) and returns one OpResult per op. Raises the
    /// first op's failure as its typed exception (PeerLost, AccessDenied, OutOfBounds,
    /// NotFound ...), Timeout if it is still running. Interruptible with Ctrl-C.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<PyOpResults> {
        let timeout = seconds(timeout, Duration::from_secs(60))?;
        let report = wait_sliced(py, timeout, |s| self.h.wait(s))?;
        Ok(PyOpResults::from(report.ops))
    }

    /// Cancels the batch and returns once none of its bytes will move any more, so its
    /// regions (and the buffers under them) may be closed or freed. Raises Cancelled when
    /// the cancel stopped it (ops not completed fail with Cancelled, the notification is not
    /// sent); returns the results when it had already completed, or raises its own failure.
    /// Cancelling twice, or an ended batch, is fine. ``wait()`` afterwards says the same.
    /// Interruptible with Ctrl-C (the batch stays cancelled; ``wait()`` for its end).
    fn cancel(&self, py: Python<'_>) -> PyResult<PyOpResults> {
        self.h.request_cancel();
        // Every transport ends a cancelled transfer within its I/O timeout.
        let report = wait_sliced(py, Duration::from_secs(3600), |s| self.h.wait(s))?;
        Ok(PyOpResults::from(report.ops))
    }

    /// True once the batch ended (completed or failed); never blocks.
    fn done(&self) -> bool {
        self.h.status() != Status::Pending
    }

    /// ``"pending"``, ``"completed"`` or ``"failed: <reason>"``.
    #[getter]
    fn status(&self) -> String {
        match self.h.status() {
            Status::Pending => "pending".into(),
            Status::Completed => "completed".into(),
            Status::Failed { reason } => format!("failed: {reason}"),
        }
    }

    /// Raises the failure as its typed exception if the batch failed; returns None otherwise.
    fn raise_for_status(&self) -> PyResult<()> {
        match self.h.status() {
            Status::Failed { reason } => Err(to_py(reason)),
            _ => Ok(()),
        }
    }

    /// Bytes confirmed in place so far.
    #[getter]
    fn bytes_done(&self) -> u64 {
        self.h.bytes_done()
    }

    /// The per-op results so far (pending ops included).
    fn results(&self) -> PyOpResults {
        PyOpResults::from(self.h.op_results())
    }

    /// The rails of the peer's connection, each with the bytes this batch moved over it, its
    /// state now and, while paused, why: a list of ``{"local", "remote", "bytes", "state",
    /// "cause"}`` dicts (empty on shm, rdma, fabric).
    fn rails<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        rail_dicts(py, &self.h.rails())
    }

    /// One line per op: kind, size, path and why (the plan), and the outcome so far; then
    /// the rails, with the bytes this batch moved over each.
    fn explain(&self) -> String {
        let ops = self.h.op_results();
        let mut s = String::new();
        for (i, o) in ops.iter().enumerate() {
            s.push_str(&format!(
                "op {i}: {} {} B via {} ({}) - {}\n",
                kind_str(o.kind),
                o.len,
                o.plan.path,
                o.plan.reason,
                status_str(&o.status)
            ));
        }
        let b = self.h.batching();
        if b.copies > 0 || b.standing > 0 {
            s.push_str(&format!("batched: {b}\n"));
        }
        s.push_str(&rails_line(&self.h.rails()));
        s
    }

    fn __len__(&self) -> usize {
        self.n_ops
    }

    fn __repr__(&self) -> String {
        format!("Transfer(ops={}, status={:?})", self.n_ops, self.status())
    }
}

fn kind_str(k: OpKind) -> &'static str {
    match k {
        OpKind::Write => "write",
        OpKind::Read => "read",
    }
}

fn status_str(s: &OpStatus) -> String {
    match s {
        OpStatus::Pending => "pending".into(),
        OpStatus::Completed => "completed".into(),
        OpStatus::Failed(e) => format!("failed: {e}"),
    }
}

/// One op's outcome: the path it took, why, its size and status.
///
/// Holds the engine's result and converts fields when asked: a 1,000-op batch makes 1,000 of
/// these, and most callers read one or none.
#[pyclass(name = "OpResult", module = "gdx", frozen)]
pub struct PyOpResult {
    o: OpResult,
}

impl From<OpResult> for PyOpResult {
    fn from(o: OpResult) -> Self {
        PyOpResult { o }
    }
}

#[pymethods]
impl PyOpResult {
    /// ``"write"`` or ``"read"``.
    #[getter]
    fn kind(&self) -> &'static str {
        kind_str(self.o.kind)
    }

    /// The path (``"shm"``, ``"tcp"``, ``"ipc"``, ``"tcp-staged"`` ...).
    #[getter]
    fn path(&self) -> String {
        self.o.plan.path.to_string()
    }

    /// Why the planner chose it.
    #[getter]
    fn reason(&self) -> &str {
        &self.o.plan.reason
    }

    /// Bytes.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.o.len
    }

    /// ``"completed"``, ``"pending"`` or ``"failed: ..."``.
    #[getter]
    fn status(&self) -> String {
        status_str(&self.o.status)
    }

    fn __repr__(&self) -> String {
        format!(
            "OpResult(path={:?}, reason={:?}, nbytes={}, status={:?})",
            self.path(),
            self.o.plan.reason,
            self.o.len,
            self.status()
        )
    }
}

/// A message a peer sent after its transfer's bytes were in place (or on its own).
#[pyclass(name = "Notification", module = "gdx", frozen)]
pub struct PyNotification {
    n: Notification,
}

impl From<Notification> for PyNotification {
    fn from(n: Notification) -> Self {
        PyNotification { n }
    }
}

#[pymethods]
impl PyNotification {
    /// The sending agent's name.
    #[getter]
    fn sender(&self) -> &str {
        &self.n.from
    }

    /// The message.
    #[getter]
    fn data<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.n.data)
    }

    /// The sender's transfer id (0 for a standalone notification).
    #[getter]
    fn xfer(&self) -> u64 {
        self.n.xfer
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let data = PyBytes::new(py, &self.n.data);
        let data = data
            .repr()
            .map(|r| r.to_string())
            .unwrap_or_else(|_| "?".into());
        format!("Notification(sender={:?}, data={data})", self.n.from)
    }
}

/// The results of a transfer's ops (what ``Transfer.wait`` and ``PreparedTransfer.run``
/// return): a read-only sequence, one ``OpResult`` per op, made when an entry is read. A block
/// list of 1,000 ops completes without building 1,000 objects nobody reads.
#[pyclass(name = "OpResults", module = "gdx", frozen, sequence)]
pub struct PyOpResults {
    ops: Arc<OpResults>,
}

impl From<OpResults> for PyOpResults {
    fn from(ops: OpResults) -> Self {
        PyOpResults { ops: Arc::new(ops) }
    }
}

#[pymethods]
impl PyOpResults {
    fn __len__(&self) -> usize {
        self.ops.len()
    }

    /// An op's result by index (negative from the end), or a list of them by slice.
    fn __getitem__(&self, py: Python<'_>, index: &Bound<'_, PyAny>) -> PyResult<PyObject> {
        let n = self.ops.len();
        if let Ok(s) = index.downcast::<pyo3::types::PySlice>() {
            let ind = s.indices(n as isize)?;
            let list: Vec<PyOpResult> = (0..ind.slicelength)
                .filter_map(|k| self.ops.get((ind.start + k as isize * ind.step) as usize))
                .map(|o| PyOpResult::from(o.clone()))
                .collect();
            return list.into_pyobject(py).map(|l| l.into_any().unbind());
        }
        let i: isize = index.extract()?;
        let at = if i < 0 { i + n as isize } else { i };
        match usize::try_from(at).ok().and_then(|k| self.ops.get(k)) {
            Some(o) => Py::new(py, PyOpResult::from(o.clone())).map(|o| o.into_any()),
            None => Err(pyo3::exceptions::PyIndexError::new_err(format!(
                "op {i} of a transfer of {n} op(s)"
            ))),
        }
    }

    fn __iter__(&self) -> PyOpResultsIter {
        PyOpResultsIter {
            ops: Arc::clone(&self.ops),
            next: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    fn __repr__(&self) -> String {
        let failed = self
            .ops
            .iter()
            .filter(|o| !matches!(o.status, gdx_engine::OpStatus::Completed))
            .count();
        format!(
            "OpResults({} op(s), {} not completed)",
            self.ops.len(),
            failed
        )
    }
}

/// Iterates an ``OpResults``.
#[pyclass(module = "gdx", frozen)]
pub struct PyOpResultsIter {
    ops: Arc<OpResults>,
    next: std::sync::atomic::AtomicUsize,
}

#[pymethods]
impl PyOpResultsIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self) -> Option<PyOpResult> {
        let i = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.ops.get(i).map(|o| PyOpResult::from(o.clone()))
    }
}
