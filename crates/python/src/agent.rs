//! `gdx.Agent`: one per process; registers memory, serves peers, connects to peers.
//!
//! The keyword arguments mirror `AgentConfig`; every `GDX_*` variable applies first
//! (`AgentConfig::from_env`), so `GDX_SECRET_FILE` is read when `secret=` is absent.

use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use gdx_engine::{Agent, AgentConfig, Secret, Transports};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::cuda;
use crate::errors::{err, to_py, PyResultExt};
use crate::peer::{PyNotification, PyPeer};
use crate::region::{parse_access, Export, Keep, Live, PyRegion, PyRemoteRegion};
use crate::wait::{seconds, wait_sliced, SLICE};

/// One per process: registers memory (``register``, ``alloc``), serves peers (when ``listen``
/// is set) and connects to peers (``connect``).
///
/// Keyword arguments mirror the engine's ``AgentConfig``; ``GDX_*`` environment variables apply
/// first. ``secret=`` (bytes, at least 16) is what peers must share; without it the agent reads
/// ``GDX_SECRET_FILE``, and without that it uses a secret of this process only (so only agents
/// of this process can connect). ``insecure=True`` turns authentication off.
///
/// Example::
///
///     a = gdx.Agent("decode", listen="127.0.0.1:0", secret=key)
///     kv = a.register(numpy.zeros(1 << 20, numpy.uint8), name="kv", access="rw")
///     print(a.address)
#[pyclass(name = "Agent", module = "gdx", frozen)]
pub struct PyAgent {
    agent: Mutex<Option<Arc<Agent>>>,
    /// Set by `join_cluster`; left (lease revoked) at `close`.
    cluster: Mutex<Option<gdx_cluster::ClusterAgent>>,
}

impl PyAgent {
    pub(crate) fn get(&self) -> PyResult<Arc<Agent>> {
        self.agent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| err("the agent is closed"))
    }
}

fn transports(list: Vec<String>) -> PyResult<Transports> {
    let mut t = Transports {
        tcp: false,
        shm: false,
        rdma: false,
        fabric: false,
    };
    for s in list {
        match s.as_str() {
            "tcp" => t.tcp = true,
            "shm" => t.shm = true,
            "rdma" => t.rdma = true,
            "fabric" => t.fabric = true,
            other => {
                return Err(err(format!(
                    "unknown transport {other:?} (tcp, shm, rdma, fabric)"
                )))
            }
        }
    }
    Ok(t)
}

#[pymethods]
impl PyAgent {
    #[new]
    #[pyo3(signature = (
        name=None, *, listen=Some("127.0.0.1:0".to_string()), transports=None, strict=None,
        secret=None, insecure=None, tcp_streams=None, chunk_bytes=None, io_timeout=None,
        timeout=None, nics=None
    ), text_signature = "(name=None, *, listen='127.0.0.1:0', transports=None, strict=None, \
        secret=None, insecure=None, tcp_streams=None, chunk_bytes=None, io_timeout=None, \
        timeout=None, nics=None)")]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        name: Option<String>,
        listen: Option<String>,
        transports: Option<Vec<String>>,
        strict: Option<bool>,
        secret: Option<Vec<u8>>,
        insecure: Option<bool>,
        tcp_streams: Option<usize>,
        chunk_bytes: Option<u32>,
        io_timeout: Option<f64>,
        timeout: Option<f64>,
        nics: Option<Vec<String>>,
    ) -> PyResult<PyAgent> {
        let mut cfg = AgentConfig::from_env().py_err()?;
        if let Some(n) = name {
            cfg.name = n;
        }
        cfg.listen = match listen.as_deref() {
            None | Some("none") | Some("") => None,
            Some(a) => Some(gdx_engine::parse_listen(a).py_err()?),
        };
        if let Some(t) = transports {
            cfg.transports = self::transports(t)?;
        }
        if let Some(s) = secret {
            cfg.secret = Some(Secret::from_bytes(s).py_err()?);
            cfg.insecure = false;
        }
        if let Some(i) = insecure {
            cfg.insecure = i;
            if i {
                cfg.secret = None;
            }
        }
        if let Some(n) = tcp_streams {
            cfg.tcp_streams = n;
        }
        if let Some(n) = chunk_bytes {
            cfg.chunk_bytes = n;
        }
        if let Some(n) = nics {
            cfg.nics = n;
        }
        cfg.io_timeout = seconds(io_timeout, cfg.io_timeout)?;
        cfg.transfer_timeout = seconds(timeout, cfg.transfer_timeout)?;
        let agent = py.allow_threads(|| Agent::new(cfg)).py_err()?;
        if let Some(s) = strict {
            agent.set_strict(s);
        }
        // Where this process has CUDA, host arrays (numpy) reach a same-host peer's GPU memory
        // by the ipc path (page-locked in place, one copy) rather than through the bounce
        // buffer. Without a driver this fails fast and changes nothing.
        if let Ok(lp) = py.allow_threads(crate::cuda::local_peer) {
            agent.use_cuda(&lp);
        }
        Ok(PyAgent {
            agent: Mutex::new(Some(Arc::new(agent))),
            cluster: Mutex::new(None),
        })
    }

    /// The agent's name (what peers see as ``Notification.sender``).
    #[getter]
    fn name(&self) -> PyResult<String> {
        Ok(self.get()?.name().to_string())
    }

    /// ``"host:port"`` peers connect to (the real port when 0 was asked for), or None.
    #[getter]
    fn address(&self) -> PyResult<Option<String>> {
        Ok(self.get()?.listen_addr().map(|a| a.to_string()))
    }

    /// Strict mode: GPU-to-GPU ops that would leave the direct path raise StrictViolation.
    #[getter]
    fn strict(&self) -> PyResult<bool> {
        Ok(self.get()?.strict())
    }

    #[setter]
    fn set_strict(&self, on: bool) -> PyResult<()> {
        self.get()?.set_strict(on);
        Ok(())
    }

    /// Registers ``obj``'s memory and publishes it under ``name`` (if given).
    ///
    /// ``obj``: anything exporting one C-contiguous buffer (numpy array, bytearray, memoryview,
    /// a CPU torch tensor through ``__dlpack__``), or a CUDA array (``__cuda_array_interface__``
    /// or a CUDA ``__dlpack__``: torch, cupy), registered as GPU memory. Non-contiguous arrays are
    /// refused. ``access`` is what peers may do: ``"rw"``, ``"r"``, ``"w"`` or ``"none"``.
    ///
    /// The region keeps ``obj`` alive until it is closed. Raises Unavailable for a CUDA array
    /// when CUDA cannot be loaded. Ordering your own reads and writes of ``obj`` against
    /// transfers is yours, as with any DMA engine: wait for the transfer (or its notification),
    /// or pass ``stream=`` for CUDA work queued before a write.
    #[pyo3(signature = (obj, name=None, access="rw"))]
    fn register(
        &self,
        py: Python<'_>,
        obj: Bound<'_, PyAny>,
        name: Option<&str>,
        access: &str,
    ) -> PyResult<PyRegion> {
        let access = parse_access(access)?;
        let agent = self.get()?;
        if let Some((span, keep)) = cuda::cuda_span(&obj)? {
            if span.readonly && access.remote_write {
                return Err(err(
                    "the CUDA array is read-only: register it with access=\"r\" or \"none\"",
                ));
            }
            let (lp, dr) = cuda::register_span(py, &span)?;
            let region = agent.register_gpu(&lp, &dr, access, name).py_err()?;
            // With DLPack the capsule is the memory's owner: it stays with the region too.
            let live = Live {
                region,
                keep: Keep::Cuda(dr),
                owner: keep.map(Bound::unbind),
                obj: Some(obj.unbind()),
            };
            let r = PyRegion::new(live, !span.readonly);
            return Ok(r);
        }
        let target = if obj.hasattr("__dlpack__")? && !is_buffer(&obj) {
            // A CPU tensor (torch) has no buffer protocol: numpy views the same memory.
            py.import("numpy")?.call_method1("from_dlpack", (&obj,))?
        } else {
            obj.clone()
        };
        let (export, writable) = Export::get(&target, access.remote_write)?;
        // SAFETY: the export pins ptr..ptr+len (the object can neither be freed nor resized)
        // until the region is closed, and closing drops the engine region (waiting for running
        // accesses) before it releases the export. No Rust reference to the bytes exists; a
        // read-only export is never a destination (remote write refused above, and local reads
        // into it are refused by Peer.read).
        let region =
            unsafe { agent.register_raw(export.ptr(), export.len(), access, name) }.py_err()?;
        let live = Live {
            region,
            keep: Keep::Buffer(export),
            owner: Some(target.unbind()),
            obj: Some(obj.unbind()),
        };
        Ok(PyRegion::new(live, writable))
    }

    /// Allocates ``nbytes`` owned by the agent (host memory comes zeroed), published under ``name`` if given.
    ///
    /// ``device=None``: host shared memory (a same-host peer copies into it once); ``view()``
    /// gives its bytes. ``device="gpu:N"`` (or an int): GPU memory gdx allocates, whose
    /// descriptor carries a CUDA IPC handle, so a same-host peer with GPU memory copies GPU to
    /// GPU (``ipc``); ``torch.as_tensor(region, device="cuda")`` views it through
    /// ``__cuda_array_interface__``. GPU memory is freed when the Region object is garbage
    /// collected (not at ``close()``, which only deregisters), so such views stay valid.
    #[pyo3(signature = (nbytes, name=None, access="rw", device=None))]
    fn alloc(
        &self,
        py: Python<'_>,
        nbytes: u64,
        name: Option<&str>,
        access: &str,
        device: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyRegion> {
        let access = parse_access(access)?;
        let agent = self.get()?;
        let Some(device) = device.filter(|d| !d.is_none()) else {
            let region = agent.alloc(nbytes, access, name).py_err()?;
            let live = Live {
                region,
                keep: Keep::Owned,
                owner: None,
                obj: None,
            };
            return Ok(PyRegion::new(live, true));
        };
        let gpu = parse_device(device)?;
        let lp = cuda::local_peer()?;
        let dr = py.allow_threads(|| lp.alloc_device(gpu, nbytes)).py_err()?;
        let region = agent.register_gpu(&lp, &dr, access, name).py_err()?;
        let live = Live {
            region,
            keep: Keep::Cuda(dr.clone()),
            owner: None,
            obj: None,
        };
        Ok(PyRegion::new(live, true).with_gpu_memory(dr))
    }

    /// Connects to the agent at ``address`` (``"host:port"``) and authenticates. Raises
    /// AccessDenied if the secrets differ, PeerLost if nobody answers, Timeout after ``timeout``
    /// seconds (default: the agent's I/O timeout).
    #[pyo3(signature = (address, timeout=None))]
    fn connect(&self, py: Python<'_>, address: String, timeout: Option<f64>) -> PyResult<PyPeer> {
        let agent = self.get()?;
        let timeout = seconds(timeout, agent.config().io_timeout)?;
        // The engine's connect has no deadline of its own: run it on a thread and wait for it
        // in slices, so the wait has this timeout and Ctrl-C interrupts it.
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("gdx-py-connect".into())
            .spawn(move || {
                let _ = tx.send(agent.connect(address.as_str()));
            })
            .map_err(|e| err(format!("cannot start a connect thread: {e}")))?;
        // A Receiver is not Sync; the Mutex lets the GIL-free closure borrow it.
        let rx = Mutex::new(rx);
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let got = py.allow_threads(|| {
                let rx = rx.lock().unwrap_or_else(|p| p.into_inner());
                rx.recv_timeout(left.min(SLICE))
            });
            match got {
                Ok(r) => return Ok(PyPeer::new(r.map_err(to_py)?)),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(err("the connect thread ended without an answer"))
                }
                Err(mpsc::RecvTimeoutError::Timeout) if left.is_zero() => {
                    return Err(to_py(gdx_engine::Error::Timeout(timeout)))
                }
                Err(mpsc::RecvTimeoutError::Timeout) => py.check_signals()?,
            }
        }
    }

    /// Publishes this agent in etcd under its name (``/gdx/<cluster>/agents/<name>``) with the
    /// regions it has published so far, on a lease of ``ttl`` seconds kept alive in the
    /// background, so peers find it with ``connect_named``; a crashed agent's entry goes
    /// within ``ttl``. ``etcd``: client URL(s), comma-separated. The agent must listen. Raises
    /// Unavailable when etcd does not answer within ``timeout`` seconds (default 3), Error when
    /// another live agent holds the name (the message names it). ``close()`` leaves.
    #[pyo3(signature = (etcd, cluster, ttl=10, timeout=None))]
    fn join_cluster(
        &self,
        py: Python<'_>,
        etcd: &str,
        cluster: &str,
        ttl: i64,
        timeout: Option<f64>,
    ) -> PyResult<()> {
        let mut slot = self.cluster.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_some() {
            return Err(err("this agent has already joined a cluster"));
        }
        let timeout = seconds(timeout, Duration::from_secs(3))?;
        *slot = Some(crate::cluster::join(
            py,
            self.get()?,
            etcd,
            cluster,
            ttl,
            timeout,
        )?);
        Ok(())
    }

    /// Connects to the agent etcd lists as ``name`` in the joined cluster, checking that the
    /// instance answering is the one listed. When that instance's lease ends, the connection
    /// closes and running transfers fail with PeerLost. Raises NotFound when no live agent
    /// has the name.
    fn connect_named(&self, py: Python<'_>, name: &str) -> PyResult<PyPeer> {
        let slot = self.cluster.lock().unwrap_or_else(|p| p.into_inner());
        let ca = slot
            .as_ref()
            .ok_or_else(|| err("join_cluster(etcd, cluster) first: this agent is in no cluster"))?;
        let named = py
            .allow_threads(|| ca.connect_named(name))
            .map_err(crate::cluster::cluster_to_py)?;
        Ok(PyPeer::named(named))
    }

    /// Waits up to ``timeout`` seconds (default 60) for the next notification from any peer;
    /// raises Timeout. Interruptible with Ctrl-C.
    #[pyo3(signature = (timeout=None))]
    fn wait_notification(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<PyNotification> {
        let agent = self.get()?;
        let timeout = seconds(timeout, Duration::from_secs(60))?;
        let n = wait_sliced(py, timeout, |s| agent.wait_notification(s))?;
        Ok(PyNotification::from(n))
    }

    /// The next queued notification, or None.
    fn try_notification(&self) -> PyResult<Option<PyNotification>> {
        Ok(self.get()?.try_notification().map(PyNotification::from))
    }

    /// The descriptors this agent publishes by name.
    fn published(&self) -> PyResult<Vec<PyRemoteRegion>> {
        Ok(self
            .get()?
            .published()
            .into_iter()
            .map(|desc| PyRemoteRegion { desc })
            .collect())
    }

    /// The secret peers must hold, as bytes (None in insecure mode): hand it to processes you
    /// start so they can connect.
    #[getter]
    fn secret<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        Ok(self.get()?.secret().map(|s| PyBytes::new(py, s.as_bytes())))
    }

    /// Stops serving (listeners and inbound connections). Regions and peers stay usable until
    /// closed. Idempotent.
    fn close(&self, py: Python<'_>) {
        let c = self
            .cluster
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let a = self.agent.lock().unwrap_or_else(|p| p.into_inner()).take();
        py.allow_threads(move || {
            if let Some(c) = c {
                // Revoking the lease now spares peers the TTL. If etcd does not answer, the
                // lease expires by itself within the TTL, which is all a caller could do.
                let _ = c.leave();
            }
            drop(a)
        });
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close(py);
        false
    }

    fn __repr__(&self) -> String {
        match self.get() {
            Ok(a) => match a.listen_addr() {
                Some(addr) => format!("Agent(name={:?}, address=\"{addr}\")", a.name()),
                None => format!("Agent(name={:?}, address=None)", a.name()),
            },
            Err(_) => "Agent(closed)".to_string(),
        }
    }
}

/// `device=`: `"gpu:N"`, `"cuda:N"`, `"cuda"` (GPU 0) or an int.
fn parse_device(d: &Bound<'_, PyAny>) -> PyResult<u32> {
    if let Ok(n) = d.extract::<u32>() {
        return Ok(n);
    }
    let s: String = d.str()?.extract()?;
    let n = match s.split_once(':') {
        Some(("gpu" | "cuda", n)) => n.parse().ok(),
        None if s == "cuda" || s == "gpu" => Some(0),
        _ => None,
    };
    n.ok_or_else(|| {
        err(format!(
            "device={s:?}: expected \"gpu:N\", \"cuda:N\" or an int"
        ))
    })
}

/// Whether `obj` exports the buffer protocol.
fn is_buffer(obj: &Bound<'_, PyAny>) -> bool {
    obj.py()
        .import("builtins")
        .and_then(|b| b.getattr("memoryview"))
        .and_then(|mv| mv.call1((obj,)))
        .and_then(|v| v.call_method0("release"))
        .is_ok()
}
