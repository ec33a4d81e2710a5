//! Checkpoints (safetensors) for `gdx.load_safetensors` / `gdx.save_safetensors` (the Python
//! side is `python/gdx/_checkpoint.py`). Headers, their checks, the plan of each copy and the
//! copies are gdx-storage's; this module converts arguments, lends the copies memory that
//! Python owns (a numpy pool, a torch CUDA pool) and releases the GIL while they run.

use std::collections::BTreeMap;

use gdx_storage::safetensors::{self, Dtype, Header, TensorSpec};
use gdx_storage::{
    CopyOptions, CopyReport, GatherOptions, GatherRange, GatherReport, PathChoice, WarmMethod,
};
use gdx_sys::cuda::DeviceBuffer;
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{err, storage_to_py, PyResultExt};

fn options(via: &str, chunk_bytes: usize, depth: usize) -> PyResult<CopyOptions> {
    let path = match via {
        "auto" => PathChoice::Auto,
        "gds" => PathChoice::Gds,
        "file-staged" | "direct" => PathChoice::FileStaged,
        "buffered" => PathChoice::Buffered,
        other => {
            return Err(err(format!(
                "via={other:?}: expected \"auto\", \"buffered\", \"file-staged\" or \"gds\""
            )))
        }
    };
    let o = CopyOptions {
        path,
        chunk_bytes,
        depth,
        ..Default::default()
    };
    o.validate().map_err(storage_to_py)?;
    Ok(o)
}

fn report<'py>(py: Python<'py>, file: &str, r: &CopyReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("file", file)?;
    d.set_item("bytes", r.bytes)?;
    d.set_item("path", r.path.key())?;
    d.set_item("reason", &r.reason)?;
    d.set_item("elapsed_s", r.elapsed.as_secs_f64())?;
    d.set_item("gbps", r.gbps())?;
    let split = r.split.unwrap_or_default();
    d.set_item("page_cache_bytes", r.split.map(|_| split.page_cache))?;
    d.set_item("direct_bytes", r.split.map(|_| split.direct))?;
    Ok(d)
}

/// One file of a checkpoint: (file, data_start, data_len, tensors, metadata), each tensor
/// (name, dtype, shape, begin, end).
type FileEntry = (
    String,
    u64,
    u64,
    Vec<(String, &'static str, Vec<u64>, u64, u64)>,
    BTreeMap<String, String>,
);

/// Resolve a checkpoint (a file, a folder of shards, an index.json) and check every header.
#[pyfunction]
pub(crate) fn _st_open(py: Python<'_>, path: String) -> PyResult<Vec<FileEntry>> {
    let files = py
        .allow_threads(|| safetensors::open_checkpoint(std::path::Path::new(&path)))
        .map_err(storage_to_py)?;
    Ok(files
        .into_iter()
        .map(|(f, h): (_, Header)| {
            let tensors = h
                .tensors
                .into_iter()
                .map(|t| (t.name, t.dtype.name(), t.shape, t.begin, t.end))
                .collect();
            (
                f.display().to_string(),
                h.data_start,
                h.data_len,
                tensors,
                h.metadata,
            )
        })
        .collect())
}

/// The data section the Python side passes back (from `_st_open`): only it is read.
fn header(data_start: u64, data_len: u64) -> Header {
    Header {
        tensors: Vec::new(),
        metadata: BTreeMap::new(),
        data_start,
        data_len,
    }
}

/// Copy the data section of `file` into the writable, contiguous byte buffer `dst`.
#[pyfunction]
#[pyo3(signature = (file, data_start, data_len, dst, via="auto", chunk_bytes=16 << 20, depth=4))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn _st_load_host<'py>(
    py: Python<'py>,
    file: String,
    data_start: u64,
    data_len: u64,
    dst: &Bound<'py, PyAny>,
    via: &str,
    chunk_bytes: usize,
    depth: usize,
) -> PyResult<Bound<'py, PyDict>> {
    let opts = options(via, chunk_bytes, depth)?;
    let buf = PyBuffer::<u8>::get(dst)?;
    if buf.readonly() || !buf.is_c_contiguous() {
        return Err(err(
            "the destination must be a writable, contiguous byte buffer",
        ));
    }
    let (ptr, len) = (buf.buf_ptr() as usize, buf.len_bytes());
    let h = header(data_start, data_len);
    let r = py
        .allow_threads(|| {
            let dst: &mut [u8] = if len == 0 {
                &mut []
            } else {
                // SAFETY: `buf` holds an export of the destination for the whole call (it is
                // dropped after this closure), so its `len` bytes at `ptr` stay allocated; it
                // is a writable C-contiguous byte buffer (checked above) that the Python side
                // allocated for this load and does not touch until the call returns.
                unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) }
            };
            safetensors::load_into_host(std::path::Path::new(&file), &h, dst, &opts)
        })
        .map_err(storage_to_py)?;
    drop(buf);
    report(py, &file, &r)
}

/// Copy the data section of `file` into `nbytes` of GPU `gpu`'s memory at `ptr` (a torch
/// tensor's storage, which the caller keeps alive and leaves alone until this returns).
#[pyfunction]
#[pyo3(signature = (file, data_start, data_len, ptr, nbytes, gpu, via="auto", chunk_bytes=16 << 20, depth=4))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn _st_load_gpu<'py>(
    py: Python<'py>,
    file: String,
    data_start: u64,
    data_len: u64,
    ptr: u64,
    nbytes: usize,
    gpu: u32,
    via: &str,
    chunk_bytes: usize,
    depth: usize,
) -> PyResult<Bound<'py, PyDict>> {
    let opts = options(via, chunk_bytes, depth)?;
    // A Python process loads many checkpoints: once a load has opened cuFile's driver (a cold
    // file, auto or gds), it stays open for the next instead of being closed and reopened.
    gdx_storage::keep_cufile_open();
    let ctx = crate::cuda::local_peer()?.context(gpu).py_err()?;
    let h = header(data_start, data_len);
    let r = py
        .allow_threads(|| {
            // SAFETY: the Python side passes the storage of a CUDA tensor of `nbytes` bytes on
            // GPU `gpu`, holds a reference to it until this call returns, and has synchronised
            // its stream before the call; every copy queued here is waited for before
            // load_into_gpu returns, and the borrowed buffer never frees the memory.
            let mut dev = unsafe { DeviceBuffer::from_raw_parts(&ctx, ptr, nbytes) };
            safetensors::load_into_gpu(std::path::Path::new(&file), &h, &mut dev, 0, &opts)
        })
        .map_err(storage_to_py)?;
    report(py, &file, &r)
}

/// The gather loader's report as a dict (`summary`, `readers`, `pinned_bytes`, per file ...).
fn gather_report<'py>(py: Python<'py>, r: &GatherReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("bytes", r.bytes)?;
    d.set_item("elapsed_s", r.elapsed.as_secs_f64())?;
    d.set_item("setup_s", r.setup.as_secs_f64())?;
    d.set_item("gbps", r.gbps())?;
    d.set_item("warm", r.warm.key())?;
    d.set_item("readers", r.readers)?;
    d.set_item("chunk_bytes", r.chunk_bytes)?;
    d.set_item("buffers", r.buffers)?;
    d.set_item("pinned_bytes", r.pinned_bytes)?;
    d.set_item("pinned_reused_bytes", r.pinned_reused_bytes)?;
    d.set_item("registered_peak_bytes", r.registered_peak_bytes)?;
    d.set_item("summary", &r.summary)?;
    let files = r
        .files
        .iter()
        .map(|f| {
            let e = PyDict::new(py);
            e.set_item("file", f.path.display().to_string())?;
            e.set_item("bytes", f.bytes)?;
            e.set_item("path", f.read.key())?;
            e.set_item("registered", f.registered)?;
            e.set_item("reason", &f.reason)?;
            e.set_item("page_cache_bytes", f.split.page_cache)?;
            e.set_item("direct_bytes", f.split.direct)?;
            Ok(e)
        })
        .collect::<PyResult<Vec<_>>>()?;
    d.set_item("files", files)?;
    Ok(d)
}

/// Copy byte ranges of checkpoint files into GPU `gpu`'s memory in one call: `ranges` holds
/// (file index, file offset, bytes, device address), each address the storage of a CUDA tensor
/// the caller keeps alive and leaves alone until this returns (its stream synchronised before).
#[pyfunction]
#[pyo3(signature = (files, ranges, gpu, via="auto", warm="readers", readers=0, chunk_bytes=16 << 20, buffers=2, progress=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn _st_gather_gpu<'py>(
    py: Python<'py>,
    files: Vec<String>,
    ranges: Vec<(usize, u64, u64, u64)>,
    gpu: u32,
    via: &str,
    warm: &str,
    readers: usize,
    chunk_bytes: usize,
    buffers: usize,
    progress: Option<Py<PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    let path = options(via, chunk_bytes, 4)?.path;
    // Called from the reader threads, which take the GIL for it; an exception in the callback
    // is printed (as Python does for callbacks it cannot raise through) and the load goes on.
    let progress = progress.map(|cb| -> gdx_storage::ProgressFn {
        std::sync::Arc::new(move |done: u64, total: u64| {
            Python::with_gil(|py| {
                if let Err(e) = cb.call1(py, (done, total)) {
                    e.print(py);
                }
            })
        })
    });
    let opts = GatherOptions {
        path,
        warm: WarmMethod::parse(warm).map_err(storage_to_py)?,
        readers: if readers == 0 {
            gdx_storage::default_readers()
        } else {
            readers
        },
        chunk_bytes,
        buffers,
        progress,
    };
    opts.validate().map_err(storage_to_py)?;
    gdx_storage::keep_cufile_open();
    let ctx = crate::cuda::local_peer()?.context(gpu).py_err()?;
    let mut list = Vec::with_capacity(ranges.len());
    for (file, offset, len, ptr) in ranges {
        if len == 0 {
            continue;
        }
        let n = usize::try_from(len).map_err(|_| err(format!("a range of {len} bytes")))?;
        // SAFETY: the Python side passes the storage of a live CUDA tensor of at least `len`
        // bytes at `ptr` on GPU `gpu`, holds it until this call returns, and synchronised its
        // stream before the call; gather_to_gpu waits for every copy it queues before it
        // returns, and a borrowed buffer never frees the memory.
        let dst = unsafe { DeviceBuffer::from_raw_parts(&ctx, ptr, n) };
        list.push(GatherRange {
            file,
            offset,
            len,
            dst,
            dst_offset: 0,
        });
    }
    let paths: Vec<std::path::PathBuf> = files.iter().map(Into::into).collect();
    let r = py
        .allow_threads(|| gdx_storage::gather_to_gpu(&paths, list, &opts))
        .map_err(storage_to_py)?;
    gather_report(py, &r)
}

/// Write a safetensors file from GPU `gpu`'s memory: `tensors` is a list of (name, dtype,
/// shape, device address, bytes), each address the storage of a contiguous CUDA tensor the
/// caller keeps alive and leaves alone (its stream synchronised) until this returns.
#[pyfunction]
#[pyo3(signature = (path, tensors, metadata, gpu, via="auto", sync=true, chunk_bytes=16 << 20, depth=4))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn _st_save_gpu<'py>(
    py: Python<'py>,
    path: String,
    tensors: Vec<(String, String, Vec<u64>, u64, u64)>,
    metadata: BTreeMap<String, String>,
    gpu: u32,
    via: &str,
    sync: bool,
    chunk_bytes: usize,
    depth: usize,
) -> PyResult<Bound<'py, PyDict>> {
    let opts = CopyOptions {
        sync,
        ..options(via, chunk_bytes, depth)?
    };
    let ctx = crate::cuda::local_peer()?.context(gpu).py_err()?;
    let mut specs = Vec::with_capacity(tensors.len());
    let mut bufs = Vec::with_capacity(tensors.len());
    for (name, dtype, shape, ptr, len) in tensors {
        let d = Dtype::parse(&dtype).ok_or_else(|| {
            err(format!(
                "tensor {name:?}: unknown safetensors dtype {dtype:?}"
            ))
        })?;
        let n = usize::try_from(len).map_err(|_| err(format!("tensor {name:?}: {len} bytes")))?;
        bufs.push((n > 0).then(|| {
            // SAFETY: the Python side passes the storage of a live, contiguous CUDA tensor of
            // `len` bytes at `ptr` on GPU `gpu`, holds it until this call returns and has
            // synchronised its stream; the save waits for every copy it queues before it
            // returns, only reads the memory, and a borrowed buffer never frees it.
            unsafe { DeviceBuffer::from_raw_parts(&ctx, ptr, n) }
        }));
        specs.push(TensorSpec {
            name,
            dtype: d,
            shape,
            len,
        });
    }
    let r = py
        .allow_threads(|| {
            let parts: Vec<gdx_storage::Part<'_>> = bufs
                .iter()
                .map(|b| match b {
                    Some(buf) => gdx_storage::Part::Gpu {
                        buf,
                        offset: 0,
                        len: buf.len(),
                    },
                    None => gdx_storage::Part::Host(&[]),
                })
                .collect();
            let p = std::path::Path::new(&path);
            safetensors::save_from_gpu(p, &specs, &parts, &ctx, &metadata, &opts)
        })
        .map_err(storage_to_py)?;
    report(py, &path, &r)
}

/// Free the pinned bounce buffers kept between loads; returns the bytes freed.
#[pyfunction]
pub(crate) fn _st_release_pinned() -> u64 {
    gdx_storage::release_pinned_cache()
}

/// Write a safetensors file: `tensors` is a list of (name, dtype, shape, contiguous byte
/// buffer).
#[pyfunction]
#[pyo3(signature = (path, tensors, metadata, via="auto", sync=true, chunk_bytes=16 << 20, depth=4))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn _st_save<'py>(
    py: Python<'py>,
    path: String,
    tensors: Vec<(String, String, Vec<u64>, Bound<'py, PyAny>)>,
    metadata: BTreeMap<String, String>,
    via: &str,
    sync: bool,
    chunk_bytes: usize,
    depth: usize,
) -> PyResult<Bound<'py, PyDict>> {
    let opts = CopyOptions {
        sync,
        ..options(via, chunk_bytes, depth)?
    };
    let mut specs = Vec::with_capacity(tensors.len());
    let mut bufs = Vec::with_capacity(tensors.len());
    for (name, dtype, shape, obj) in tensors {
        let d = Dtype::parse(&dtype).ok_or_else(|| {
            err(format!(
                "tensor {name:?}: unknown safetensors dtype {dtype:?}"
            ))
        })?;
        let b = PyBuffer::<u8>::get(&obj)?;
        if !b.is_c_contiguous() {
            return Err(err(format!(
                "tensor {name:?}: its bytes are not contiguous"
            )));
        }
        specs.push(TensorSpec {
            name,
            dtype: d,
            shape,
            len: b.len_bytes() as u64,
        });
        bufs.push(b);
    }
    let spans: Vec<(usize, usize)> = bufs
        .iter()
        .map(|b| (b.buf_ptr() as usize, b.len_bytes()))
        .collect();
    let r = py
        .allow_threads(|| {
            let data: Vec<&[u8]> = spans
                .iter()
                .map(|&(p, n)| match n {
                    0 => &[][..],
                    // SAFETY: each span is a non-empty contiguous buffer export held in `bufs`
                    // until after this closure; the save only reads it.
                    _ => unsafe { std::slice::from_raw_parts(p as *const u8, n) },
                })
                .collect();
            safetensors::save(std::path::Path::new(&path), &specs, &data, &metadata, &opts)
        })
        .map_err(storage_to_py)?;
    drop(bufs);
    report(py, &path, &r)
}
