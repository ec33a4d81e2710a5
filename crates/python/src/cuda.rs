//! CUDA arrays (`__cuda_array_interface__`, `__dlpack__`) and streams (`stream=`).
//!
//! A CUDA array becomes a GPU region through the engine's own calls: the process's
//! [`LocalPeer`] registers the device pointer (the driver confirms the GPU and that the span lies
//! in one allocation), and `Agent::register_gpu` publishes it. Nothing here copies bytes.

use std::ffi::c_void;
use std::sync::OnceLock;

use gdx_engine::{DeviceRegion, LocalPeer};
use gdx_sys::cuda::Stream;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict};

use crate::errors::{err, to_py, PyResultExt};

/// The process's local GPU peer, opened on first use (or why there is none).
pub(crate) fn local_peer() -> PyResult<LocalPeer> {
    static LP: OnceLock<Result<LocalPeer, gdx_engine::Error>> = OnceLock::new();
    LP.get_or_init(LocalPeer::from_env).clone().map_err(to_py)
}

/// A CUDA array's span: device address, length in bytes, read-only flag.
pub(crate) struct Span {
    pub(crate) ptr: u64,
    pub(crate) nbytes: u64,
    pub(crate) readonly: bool,
}

/// Bytes per element of a `__cuda_array_interface__` typestr such as `"<f4"` or `"|u1"`.
fn itemsize(typestr: &str) -> PyResult<u64> {
    typestr
        .get(2..)
        .and_then(|n| n.parse::<u64>().ok())
        .filter(|n| *n > 0)
        .ok_or_else(|| err(format!("typestr {typestr:?} has no item size")))
}

/// Checks `strides` (bytes) describe a C-contiguous array of `shape`; dims of length 1 may
/// carry any stride.
fn c_contiguous(shape: &[u64], strides: &[i64], item: u64) -> bool {
    let mut want = item as i64;
    for (&n, &s) in shape.iter().zip(strides).rev() {
        if n != 1 && s != want {
            return false;
        }
        want *= n as i64;
    }
    true
}

fn refuse_noncontiguous() -> PyErr {
    err(
        "non-contiguous CUDA arrays are refused: pass t.contiguous() (a copy) or register each \
         contiguous piece",
    )
}

/// The span of an object with `__cuda_array_interface__` (versions 0-3).
pub(crate) fn from_cai(cai: &Bound<'_, PyDict>) -> PyResult<Span> {
    let get = |k: &str| -> PyResult<Bound<'_, PyAny>> {
        cai.get_item(k)?
            .ok_or_else(|| err(format!("__cuda_array_interface__ has no {k:?}")))
    };
    let (ptr, readonly): (u64, bool) = get("data")?.extract()?;
    let shape: Vec<u64> = get("shape")?.extract()?;
    let item = itemsize(&get("typestr")?.extract::<String>()?)?;
    let nbytes = shape.iter().product::<u64>() * item;
    if let Some(st) = cai.get_item("strides")?.filter(|s| !s.is_none()) {
        let strides: Vec<i64> = st.extract()?;
        if !c_contiguous(&shape, &strides, item) {
            return Err(refuse_noncontiguous());
        }
    }
    if nbytes == 0 || ptr == 0 {
        return Err(err("cannot register an empty CUDA array"));
    }
    Ok(Span {
        ptr,
        nbytes,
        readonly,
    })
}

/// DLPack's C structs (v0.x `DLManagedTensor`), as far as we read them.
#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device_type: i32,
    device_id: i32,
    ndim: i32,
    dtype_code: u8,
    dtype_bits: u8,
    dtype_lanes: u16,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

const DL_CUDA: i32 = 2;

/// The span of a CUDA tensor exported through `__dlpack__()` (a `"dltensor"` capsule). The
/// capsule stays with the region (it holds the producer's reference to the memory), unconsumed:
/// its destructor then gives the memory back when the region lets go of it.
pub(crate) fn from_dlpack(capsule: &Bound<'_, PyCapsule>) -> PyResult<Span> {
    let name = capsule.name()?;
    let is_dl = name.is_some_and(|n| n.to_bytes() == b"dltensor");
    if !is_dl {
        return Err(err("__dlpack__() did not return a \"dltensor\" capsule"));
    }
    // SAFETY: a "dltensor" capsule's pointer is a DLManagedTensor, whose first member is the
    // DLTensor (the DLPack ABI); the producer keeps it valid while the capsule is unconsumed.
    let t = unsafe { &*(capsule.pointer() as *const DlTensor) };
    if t.device_type != DL_CUDA {
        return Err(err(format!(
            "DLPack device type {} is not CUDA (2)",
            t.device_type
        )));
    }
    let ndim = usize::try_from(t.ndim).map_err(|_| err("negative DLPack ndim"))?;
    let item = u64::from(t.dtype_bits).div_ceil(8) * u64::from(t.dtype_lanes.max(1));
    // SAFETY: shape has ndim entries (DLPack ABI); strides is null or has ndim entries.
    let shape: Vec<u64> = (0..ndim)
        .map(|i| unsafe { *t.shape.add(i) }.max(0) as u64)
        .collect();
    if !t.strides.is_null() {
        // SAFETY: as above; DLPack strides count elements, not bytes.
        let strides: Vec<i64> = (0..ndim)
            .map(|i| unsafe { *t.strides.add(i) } * item as i64)
            .collect();
        if !c_contiguous(&shape, &strides, item) {
            return Err(refuse_noncontiguous());
        }
    }
    let nbytes = shape.iter().product::<u64>() * item;
    let ptr = t.data as u64 + t.byte_offset;
    if nbytes == 0 || ptr == 0 {
        return Err(err("cannot register an empty CUDA array"));
    }
    Ok(Span {
        ptr,
        nbytes,
        readonly: false,
    })
}

/// The CUDA span of `obj`, if it is a CUDA array (`__cuda_array_interface__`, or `__dlpack__`
/// with a CUDA `__dlpack_device__`); the second value is what must be kept alive with it.
pub(crate) fn cuda_span<'py>(
    obj: &Bound<'py, PyAny>,
) -> PyResult<Option<(Span, Option<Bound<'py, PyAny>>)>> {
    if let Ok(cai) = obj.getattr("__cuda_array_interface__") {
        let cai = cai.downcast_into::<PyDict>()?;
        return Ok(Some((from_cai(&cai)?, None)));
    }
    if let Ok(dev) = obj.getattr("__dlpack_device__") {
        let (kind, _id): (i32, i32) = dev.call0()?.extract()?;
        if kind == DL_CUDA {
            let cap = obj.call_method0("__dlpack__")?;
            let span = from_dlpack(cap.downcast::<PyCapsule>()?)?;
            return Ok(Some((span, Some(cap))));
        }
    }
    Ok(None)
}

/// Registers a CUDA span with the local peer.
pub(crate) fn register_span(py: Python<'_>, span: &Span) -> PyResult<(LocalPeer, DeviceRegion)> {
    let lp = local_peer()?;
    let (ptr, len) = (span.ptr, span.nbytes);
    let lp2 = lp.clone();
    // SAFETY: the region built from this DeviceRegion holds a strong reference to the Python
    // object that owns the allocation (the tensor, or its DLPack capsule), so the memory stays
    // allocated until the region is closed, which first waits for every copy on it. Races with
    // the user's own kernels are the user's to order (stream=, or waiting for the transfer), as
    // with any DMA engine; they cannot free memory under the engine.
    let dr = py
        .allow_threads(move || unsafe { lp2.register_device_ptr(ptr, len) })
        .py_err()?;
    Ok((lp, dr))
}

/// The raw stream handle of `stream=`: an int, or an object with `.cuda_stream` (torch).
pub(crate) fn stream_handle(stream: &Bound<'_, PyAny>) -> PyResult<usize> {
    if let Ok(h) = stream.extract::<usize>() {
        return Ok(h);
    }
    if let Ok(h) = stream.getattr("cuda_stream") {
        return h.extract::<usize>();
    }
    Err(err(
        "stream= takes an int (a CUstream) or an object with .cuda_stream (torch.cuda.Stream)",
    ))
}

/// Waits, without the GIL, until the work queued on the raw stream `handle` before this call
/// is done (`cuStreamSynchronize`), so a transfer submitted afterwards reads what that work
/// wrote. `gpu` picks the context the stream belongs to.
pub(crate) fn sync_stream(py: Python<'_>, handle: usize, gpu: u32) -> PyResult<()> {
    let lp = local_peer()?;
    let ctx = lp.context(gpu).py_err()?;
    py.allow_threads(move || {
        // SAFETY: the caller passed a stream of this context (torch's current stream, or 0 for
        // the legacy default stream) that outlives this call; from_raw does not take ownership.
        let s = unsafe { Stream::from_raw(&ctx, handle as *mut c_void) };
        s.synchronize().map_err(gdx_engine::Error::from)
    })
    .py_err()
}
