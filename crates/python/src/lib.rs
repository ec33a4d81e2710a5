//! gdx-python: `import gdx`, the engine from Python (numpy, bytearray, memoryview, torch).
//!
//! A thin skin over `gdx-engine`'s public API: every transfer, plan, check and error is the
//! engine's own; this crate converts arguments, keeps Python objects alive for as long as the
//! engine may touch their memory, releases the GIL while the engine works, and maps errors to
//! typed exceptions. The Python package around it is `python/gdx` (stubs in `__init__.pyi`).

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

mod agent;
mod blocks;
mod checkpoint;
mod cluster;
mod cuda;
mod errors;
mod peer;
mod prepared;
mod region;
mod wait;

use pyo3::prelude::*;

/// The native part of the `gdx` package (`gdx._gdx`); import `gdx` instead.
#[pymodule]
fn _gdx(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add_class::<agent::PyAgent>()?;
    m.add_class::<region::PyRegion>()?;
    m.add_class::<region::PyRemoteRegion>()?;
    m.add_class::<peer::PyPeer>()?;
    m.add_class::<peer::PyTransfer>()?;
    m.add_class::<prepared::PyPreparedTransfer>()?;
    m.add_class::<blocks::PyBlockPool>()?;
    m.add_class::<blocks::PyBlockTransfer>()?;
    m.add_class::<peer::PyOpResult>()?;
    m.add_class::<peer::PyOpResults>()?;
    m.add_class::<peer::PyNotification>()?;
    m.add_function(wrap_pyfunction!(region::_forge_key, m)?)?;
    m.add_function(wrap_pyfunction!(region::_forge_len, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_available, m)?)?;
    m.add_function(wrap_pyfunction!(ipc_stats, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::_st_open, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::_st_load_host, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::_st_load_gpu, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::_st_save, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::_st_gather_gpu, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::_st_save_gpu, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::_st_release_pinned, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

/// Other processes' GPU allocations this process has mapped (CUDA IPC):
/// ``{"opened": N, "live": M}`` — ``opened`` counts opens since the start (one per allocation
/// while it stays mapped, however many regions or transfers use it), ``live`` the mappings
/// alive now (they close with the connection to their peer). Zeros without CUDA.
#[pyfunction]
fn ipc_stats() -> std::collections::BTreeMap<&'static str, u64> {
    let s = cuda::local_peer().map(|lp| lp.ipc_stats()).ok();
    [
        ("opened", s.map_or(0, |s| s.opened)),
        ("live", s.map_or(0, |s| s.live)),
    ]
    .into_iter()
    .collect()
}

/// Whether CUDA can be used here (a driver and a GPU): ``(True, "N GPU(s)")`` or
/// ``(False, why)``.
#[pyfunction]
fn cuda_available() -> (bool, String) {
    match cuda::local_peer() {
        Ok(lp) => (true, format!("{} GPU(s)", lp.gpu_count())),
        Err(e) => (false, e.to_string()),
    }
}
