//! `gdx.Region` (this process's registered memory) and `gdx.RemoteRegion` (a peer's descriptor).
//!
//! Invariants that keep Python users away from freed memory:
//! - A host region registered from a Python object holds a buffer *export* of it (`Py_buffer`) for
//!   as long as it is open: the object cannot be freed, and resizable ones (bytearray, numpy with
//!   `resize`) refuse to resize while exported. A CUDA region holds a strong reference to its
//!   tensor, whose storage therefore stays allocated.
//! - `close()` (or `with`, or garbage collection) first drops the engine region, which refuses new
//!   accesses and waits for running ones, and only then releases the export / reference.
//! - Memoryviews of a region (`view()`) keep the Region object alive, and `close()` refuses while
//!   any is exported, so a view never outlives the memory it shows.
//! - Every method of a closed region raises `gdx.Error`; ops naming it fail `NotFound`.

use std::ffi::c_int;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use gdx_engine::{Access, Region, RegionDesc};
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::err;

/// Parses `access=`: what *peers* may do ("rw", "r", "w", "none"); local use is always allowed.
pub(crate) fn parse_access(s: &str) -> PyResult<Access> {
    match s {
        "rw" | "wr" => Ok(Access::READ_WRITE),
        "r" => Ok(Access::READ),
        "w" => Ok(Access::WRITE),
        "none" | "local" | "" => Ok(Access::LOCAL),
        other => Err(err(format!(
            "access={other:?}: expected \"rw\", \"r\", \"w\" or \"none\" (what peers may do)"
        ))),
    }
}

pub(crate) fn access_str(a: Access) -> &'static str {
    match (a.remote_read, a.remote_write) {
        (true, true) => "rw",
        (true, false) => "r",
        (false, true) => "w",
        (false, false) => "none",
    }
}

/// A location as the Python API spells it: `"host"`, `"gpu:N"` (the engine's `Display` says
/// `gpu0`; the colon matches torch's `"cuda:0"` and `device="gpu:0"`).
pub(crate) fn location_str(l: gdx_engine::Location) -> String {
    match l {
        gdx_engine::Location::Gpu(n) => format!("gpu:{n}"),
        other => other.to_string(),
    }
}

/// A buffer export of a Python object, released (under the GIL) when the region closes.
pub(crate) struct Export(Box<ffi::Py_buffer>);

// SAFETY: the Py_buffer is only read or released while the GIL is held (region close / drop take
// it); between those points it is inert data that keeps the exporter's memory pinned.
unsafe impl Send for Export {}
// SAFETY: as above; no `&Export` method touches the Py_buffer without the GIL.
unsafe impl Sync for Export {}

impl Export {
    /// Exports `obj`'s bytes as one C-contiguous span: writable if the object allows it, else
    /// read-only (then the region may only be a source). Non-contiguous arrays are refused.
    pub(crate) fn get(obj: &Bound<'_, PyAny>, need_write: bool) -> PyResult<(Export, bool)> {
        // SAFETY: a zeroed Py_buffer is the documented "empty" state PyObject_GetBuffer fills.
        let mut view: Box<ffi::Py_buffer> = Box::new(unsafe { std::mem::zeroed() });
        let mut writable = true;
        // SAFETY: obj is a live object (we hold a Bound), view points to a Py_buffer we own.
        let mut rc = unsafe {
            ffi::PyObject_GetBuffer(
                obj.as_ptr(),
                &mut *view,
                ffi::PyBUF_C_CONTIGUOUS | ffi::PyBUF_WRITABLE,
            )
        };
        if rc != 0 {
            let first = PyErr::fetch(obj.py());
            // SAFETY: as above; the failed call left view untouched.
            rc = unsafe {
                ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, ffi::PyBUF_C_CONTIGUOUS)
            };
            if rc != 0 {
                let second = PyErr::fetch(obj.py());
                let kind = obj
                    .get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default();
                return Err(err(format!(
                    "cannot register this {kind} as one contiguous span ({second}; {first}): \
                     non-contiguous arrays are refused, pass numpy.ascontiguousarray(a) \
                     (a copy) or register each contiguous piece"
                )));
            }
            writable = false;
        }
        let export = Export(view);
        if !writable && need_write {
            return Err(err(
                "the object is read-only: register it with access=\"r\" or \"none\" (peers \
                 cannot write it, and it cannot be the destination of a read)",
            ));
        }
        if export.0.len <= 0 {
            return Err(err("cannot register an empty buffer"));
        }
        Ok((export, writable))
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.0.buf.cast()
    }

    pub(crate) fn len(&self) -> u64 {
        self.0.len as u64
    }
}

impl Drop for Export {
    /// Releases the export, on every path: a closed region, and a registration that failed
    /// after the export was taken (a name in use), which would otherwise leave the object
    /// locked against resizing.
    fn drop(&mut self) {
        Python::with_gil(|_py| {
            // SAFETY: the GIL is held, and the view was filled by PyObject_GetBuffer and is
            // released exactly once (here, as the Export goes).
            unsafe { ffi::PyBuffer_Release(&mut *self.0) }
        });
    }
}

/// What keeps a region's memory alive besides the engine.
pub(crate) enum Keep {
    /// Agent-allocated memory: the engine region owns it.
    Owned,
    /// A Python object's buffer export.
    Buffer(Export),
    /// A CUDA array: the engine's device region (never frees) plus the object.
    Cuda(gdx_engine::DeviceRegion),
}

/// The open state of a region.
pub(crate) struct Live {
    pub(crate) region: Region<'static>,
    pub(crate) keep: Keep,
    /// What owns the memory when it is not `obj` itself (a DLPack capsule, the numpy view of a
    /// CPU tensor); released after `keep`.
    pub(crate) owner: Option<Py<PyAny>>,
    /// The registered Python object (its lifetime is tied to the region's).
    pub(crate) obj: Option<Py<PyAny>>,
}

/// Memory registered with an agent: a numpy array, bytearray, memoryview, torch tensor (CPU or
/// CUDA) or agent-allocated buffer. Peers reach it by name through ``Peer.region(name)``.
///
/// Close it with ``close()`` or a ``with`` block (garbage collection closes it too); using a
/// closed region raises ``gdx.Error``. The registered object is kept alive until then.
#[pyclass(name = "Region", module = "gdx", frozen)]
pub struct PyRegion {
    live: Mutex<Option<Live>>,
    nbytes: u64,
    location: String,
    name: Option<String>,
    access: Access,
    /// The bytes can be written locally (false for a read-only Python buffer or CUDA array).
    pub(crate) writable: bool,
    /// The host address for `view()`; `None` for GPU memory.
    host: Option<usize>,
    /// Views exported through the buffer protocol that are still alive.
    exports: AtomicUsize,
    /// GPU memory gdx allocated for this region: freed only when the Region object goes, since
    /// `__cuda_array_interface__` consumers (torch) hold the object, not a count we could check.
    gpu_memory: Option<gdx_engine::DeviceRegion>,
}

impl PyRegion {
    pub(crate) fn new(live: Live, writable: bool) -> PyRegion {
        let r = &live.region;
        PyRegion {
            nbytes: r.len(),
            location: location_str(r.location()),
            name: r.desc().name,
            access: r.desc().access,
            writable,
            host: r.host_ptr().map(|p| p as usize),
            exports: AtomicUsize::new(0),
            gpu_memory: None,
            live: Mutex::new(Some(live)),
        }
    }

    /// Marks the region as owning gdx-allocated GPU memory (see `gpu_memory`).
    pub(crate) fn with_gpu_memory(mut self, d: gdx_engine::DeviceRegion) -> PyRegion {
        self.gpu_memory = Some(d);
        self
    }

    /// The open state, or `gdx.Error` once closed.
    pub(crate) fn open(&self) -> PyResult<MutexGuard<'_, Option<Live>>> {
        let g = self.live.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            return Err(err(format!("{} is closed", self.describe())));
        }
        Ok(g)
    }

    fn describe(&self) -> String {
        match &self.name {
            Some(n) => format!("region {n:?}"),
            None => "region".to_string(),
        }
    }

    /// Deregisters (waiting for running accesses, without the GIL), then lets go of the object.
    fn shut(&self, py: Python<'_>) {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(Live {
            region,
            keep,
            owner,
            obj,
        }) = live
        else {
            return;
        };
        // Dropping the engine region retires it: no access starts after, running ones end first.
        py.allow_threads(move || drop(region));
        match keep {
            // Released under the GIL (Export's Drop), only now that no access can run.
            Keep::Buffer(e) => drop(e),
            Keep::Cuda(d) => py.allow_threads(move || drop(d)),
            Keep::Owned => {}
        }
        drop(owner);
        drop(obj);
    }
}

#[pymethods]
impl PyRegion {
    /// Size in bytes.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.nbytes
    }

    /// Where the bytes live: ``"host"`` or ``"gpu:N"``.
    #[getter]
    fn location(&self) -> &str {
        &self.location
    }

    /// The name peers find it under, or None.
    #[getter]
    fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// What peers may do: ``"rw"``, ``"r"``, ``"w"`` or ``"none"``.
    #[getter]
    fn access(&self) -> &'static str {
        access_str(self.access)
    }

    /// True once ``close()`` ran.
    #[getter]
    fn closed(&self) -> bool {
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }

    /// The registered object (None for agent-allocated memory). Raises once closed.
    #[getter]
    fn obj(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        Ok(self
            .open()?
            .as_ref()
            .and_then(|l| l.obj.as_ref().map(|o| o.clone_ref(py))))
    }

    /// This region's descriptor, as a peer would see it (``Peer.region`` gives the peer's).
    fn desc(&self) -> PyResult<PyRemoteRegion> {
        let g = self.open()?;
        let live = g.as_ref().ok_or_else(|| err("closed"))?;
        Ok(PyRemoteRegion {
            desc: live.region.desc(),
        })
    }

    /// A writable ``memoryview`` of the bytes (host memory only), e.g. ``numpy.frombuffer(
    /// r.view(), dtype=...)``. The view keeps the region open: ``close()`` refuses while one
    /// lives. Reading it while a peer writes the region shows a mix of old and new bytes: wait
    /// for the transfer (or its notification) first.
    fn view<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let mv = py.import("builtins")?.getattr("memoryview")?;
        mv.call1((slf,))
    }

    /// For GPU memory gdx allocated (``Agent.alloc(device=...)``): the CUDA Array Interface, so
    /// ``torch.as_tensor(region, device="cuda")`` views it (as uint8). The memory lives as long
    /// as this object, even after ``close()``.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let Some(d) = &self.gpu_memory else {
            return Err(pyo3::exceptions::PyAttributeError::new_err(
                "__cuda_array_interface__: only GPU memory from Agent.alloc(device=...) has one",
            ));
        };
        let cai = PyDict::new(py);
        cai.set_item("shape", (self.nbytes,))?;
        cai.set_item("typestr", "|u1")?;
        cai.set_item("data", (d.device_ptr(), false))?;
        cai.set_item("strides", py.None())?;
        cai.set_item("version", 3)?;
        Ok(cai)
    }

    /// Deregisters the region: peers get NotFound from now on, running accesses finish first,
    /// then the object is released. Idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let n = self.exports.load(Ordering::Acquire);
        if n > 0 {
            return Err(PyBufferError::new_err(format!(
                "{} has {n} live view(s): release them (del, or memoryview.release()) before \
                 closing",
                self.describe()
            )));
        }
        self.shut(py);
        Ok(())
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __len__(&self) -> usize {
        self.nbytes as usize
    }

    fn __repr__(&self) -> String {
        format!(
            "Region(name={:?}, nbytes={}, location={:?}, access={:?}{})",
            self.name,
            self.nbytes,
            self.location,
            access_str(self.access),
            if self.closed() { ", closed" } else { "" }
        )
    }

    /// Buffer protocol: a view of the host bytes (see ``view()``).
    ///
    /// # Safety
    /// Called by the interpreter with a valid `view` and the GIL held.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let this = slf.get();
        let _open = this.open()?;
        let Some(ptr) = this.host else {
            return Err(PyBufferError::new_err(format!(
                "{} is {} memory: it has no host view",
                this.describe(),
                this.location
            )));
        };
        let readonly = c_int::from(!this.writable);
        if readonly == 1 && flags & ffi::PyBUF_WRITABLE != 0 {
            return Err(PyBufferError::new_err("the region's memory is read-only"));
        }
        // SAFETY: `view` is valid (the interpreter's contract); ptr..ptr+nbytes stays valid while
        // the region is open, and it stays open while this export lives (close() refuses and the
        // view holds a reference to slf, so no garbage collection either).
        let rc = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                ptr as *mut std::ffi::c_void,
                this.nbytes as ffi::Py_ssize_t,
                readonly,
                flags,
            )
        };
        if rc != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        this.exports.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// # Safety
    /// Called by the interpreter for a view `__getbuffer__` filled.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        self.exports.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for PyRegion {
    fn drop(&mut self) {
        // Garbage collection: the interpreter holds the GIL while it deallocates.
        Python::with_gil(|py| self.shut(py));
    }
}

/// A peer's region as its descriptor says: name, length, location, access (and the key, which is
/// never shown). Target it in ``Peer.write``/``Peer.read``.
#[pyclass(name = "RemoteRegion", module = "gdx", frozen)]
pub struct PyRemoteRegion {
    pub(crate) desc: RegionDesc,
}

#[pymethods]
impl PyRemoteRegion {
    /// Size in bytes.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.desc.len
    }

    /// ``"host"`` or ``"gpu:N"`` (on the peer).
    #[getter]
    fn location(&self) -> String {
        location_str(self.desc.location)
    }

    /// The name it is published under.
    #[getter]
    fn name(&self) -> Option<&str> {
        self.desc.name.as_deref()
    }

    /// What this side may do: ``"rw"``, ``"r"``, ``"w"`` or ``"none"``.
    #[getter]
    fn access(&self) -> &'static str {
        access_str(self.desc.access)
    }

    /// The region id inside the peer's agent.
    #[getter]
    fn id(&self) -> u64 {
        self.desc.id
    }

    fn __repr__(&self) -> String {
        format!(
            "RemoteRegion(name={:?}, id={}, nbytes={}, location={:?}, access={:?})",
            self.desc.name,
            self.desc.id,
            self.desc.len,
            location_str(self.desc.location),
            access_str(self.desc.access)
        )
    }
}

/// For tests of the error mapping: the same descriptor with another key (a forged one).
#[pyfunction]
pub(crate) fn _forge_key(r: &PyRemoteRegion) -> PyRemoteRegion {
    let mut desc = r.desc.clone();
    desc.key = gdx_engine::RegionKey(desc.key.0 ^ 1);
    PyRemoteRegion { desc }
}

/// For tests of bounds checks made by the *target*: the same descriptor claiming `nbytes`.
#[pyfunction]
pub(crate) fn _forge_len(r: &PyRemoteRegion, nbytes: u64) -> PyRemoteRegion {
    let mut desc = r.desc.clone();
    desc.len = nbytes;
    PyRemoteRegion { desc }
}
