//! `gdx.BlockPool` and `gdx.BlockTransfer`: paged KV-cache blocks (`docs/blocks.md`), over the
//! engine's `BlockPool`/`BlockTransfer`.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use gdx_engine::{BlockPool, BlockTransfer, OpKind};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyRange, PySlice, PyTuple};

use crate::cuda;
use crate::errors::{err, PyResultExt};
use crate::peer::{PyPeer, PyTransfer};
use crate::region::{PyRegion, PyRemoteRegion};
use crate::wait::seconds;

/// A pool of ``num_blocks`` blocks of ``block_bytes`` bytes in every segment of every layer.
/// ``layers`` has one entry per layer: a region, a ``(region, offset, stride)`` tuple, or a
/// list of those (the layer's segments, e.g. K and V). Block ``b`` of a segment lies at
/// ``offset + b * stride`` in its region (stride defaults to ``block_bytes``, offset to 0).
/// Regions are all local (``Region``) or all the peer's (``RemoteRegion``).
#[pyclass(name = "BlockPool", module = "gdx", frozen)]
pub struct PyBlockPool {
    pool: BlockPool,
    /// The local regions, kept alive (and open) while the pool is.
    _regions: Vec<Py<PyRegion>>,
}

/// One segment as given: the region object, offset, stride.
type Given<'py> = (Bound<'py, PyAny>, u64, u64);

fn segment<'py>(item: &Bound<'py, PyAny>, block_bytes: u64, where_: &str) -> PyResult<Given<'py>> {
    if let Ok(t) = item.downcast::<PyTuple>() {
        if t.len() != 3 {
            return Err(err(format!(
                "{where_}: a segment tuple is (region, offset, stride), got {} items",
                t.len()
            )));
        }
        return Ok((
            t.get_item(0)?,
            t.get_item(1)?.extract()?,
            t.get_item(2)?.extract()?,
        ));
    }
    Ok((item.clone(), 0, block_bytes))
}

#[pymethods]
impl PyBlockPool {
    #[new]
    #[pyo3(signature = (layers, num_blocks, block_bytes))]
    fn new(layers: &Bound<'_, PyAny>, num_blocks: u64, block_bytes: u64) -> PyResult<Self> {
        let mut pool = BlockPool::new(num_blocks, block_bytes).py_err()?;
        let mut keep = Vec::new();
        for (l, layer) in layers.try_iter()?.enumerate() {
            let layer = layer?;
            let items: Vec<Bound<'_, PyAny>> = match layer.downcast::<PyList>() {
                Ok(list) => list.iter().collect(),
                Err(_) => vec![layer],
            };
            let mut segs = Vec::with_capacity(items.len());
            for (s, item) in items.iter().enumerate() {
                segs.push(segment(
                    item,
                    block_bytes,
                    &format!("layer {l} segment {s}"),
                )?);
            }
            let Some(first) = segs.first() else {
                return Err(err(format!(
                    "layer {l}: a layer needs at least one segment"
                )));
            };
            if first.0.downcast::<PyRemoteRegion>().is_ok() {
                let mut descs = Vec::with_capacity(segs.len());
                for (s, (obj, offset, stride)) in segs.iter().enumerate() {
                    let r = obj.downcast::<PyRemoteRegion>().map_err(|_| {
                        err(format!(
                            "layer {l} segment {s}: expected a gdx.RemoteRegion like segment 0 \
                             (a pool never mixes local and remote regions)"
                        ))
                    })?;
                    descs.push((r.get().desc.clone(), *offset, *stride));
                }
                let refs: Vec<_> = descs.iter().map(|(d, o, s)| (d, *o, *s)).collect();
                pool.remote_layer(&refs).py_err()?;
            } else {
                let mut regions = Vec::with_capacity(segs.len());
                for (s, (obj, _, _)) in segs.iter().enumerate() {
                    let r = obj.downcast::<PyRegion>().map_err(|_| {
                        err(format!(
                            "layer {l} segment {s}: expected a gdx.Region like segment 0 (a pool \
                             never mixes local and remote regions)"
                        ))
                    })?;
                    regions.push(r.clone());
                }
                // Each distinct region is opened (locked) once: a layer's segments often
                // share one region, and its lock is not reentrant.
                let mut distinct: Vec<&Bound<'_, PyRegion>> = Vec::new();
                let index: Vec<usize> = regions
                    .iter()
                    .map(|r| match distinct.iter().position(|d| d.is(r)) {
                        Some(k) => k,
                        None => {
                            distinct.push(r);
                            distinct.len() - 1
                        }
                    })
                    .collect();
                let guards = distinct
                    .iter()
                    .map(|r| r.get().open())
                    .collect::<PyResult<Vec<_>>>()?;
                let mut refs = Vec::with_capacity(segs.len());
                for (&k, (_, offset, stride)) in index.iter().zip(&segs) {
                    let live = guards[k].as_ref().ok_or_else(|| err("closed"))?;
                    refs.push((&live.region, *offset, *stride));
                }
                pool.local_layer(&refs).py_err()?;
                drop(guards);
                keep.extend(regions.into_iter().map(Bound::unbind));
            }
        }
        if pool.num_layers() == 0 {
            return Err(err("a block pool needs at least one layer"));
        }
        Ok(PyBlockPool {
            pool,
            _regions: keep,
        })
    }

    /// Layers.
    #[getter]
    fn num_layers(&self) -> usize {
        self.pool.num_layers()
    }
    /// Blocks per segment.
    #[getter]
    fn num_blocks(&self) -> u64 {
        self.pool.num_blocks()
    }
    /// Bytes per block.
    #[getter]
    fn block_bytes(&self) -> u64 {
        self.pool.block_bytes()
    }
    /// Segments per layer.
    #[getter]
    fn segments(&self) -> usize {
        self.pool.segments()
    }

    fn __repr__(&self) -> String {
        format!(
            "BlockPool(layers={}, segments={}, num_blocks={}, block_bytes={})",
            self.pool.num_layers(),
            self.pool.segments(),
            self.pool.num_blocks(),
            self.pool.block_bytes()
        )
    }
}

/// Two pools checked to match (``Peer.prepare_blocks``): ``post`` moves block lists.
#[pyclass(name = "BlockTransfer", module = "gdx", frozen)]
pub struct PyBlockTransfer {
    bt: Arc<BlockTransfer>,
    num_layers: usize,
    /// The local pool (keeps its regions alive).
    _local: Py<PyBlockPool>,
}

pub(crate) fn prepare(
    peer: &PyPeer,
    py: Python<'_>,
    local: &Bound<'_, PyBlockPool>,
    remote: &Bound<'_, PyBlockPool>,
    op: &str,
    timeout: Option<f64>,
) -> PyResult<PyBlockTransfer> {
    let kind = match op {
        "write" => OpKind::Write,
        "read" => OpKind::Read,
        other => return Err(err(format!("op={other:?}: expected \"write\" or \"read\""))),
    };
    let mut bt = peer
        .peer()
        .prepare_blocks(&local.get().pool, &remote.get().pool, kind)
        .py_err()?;
    if let Some(s) = timeout {
        bt.set_timeout(seconds(Some(s), Duration::ZERO)?);
    }
    let _ = py;
    Ok(PyBlockTransfer {
        bt: Arc::new(bt),
        num_layers: local.get().pool.num_layers(),
        _local: local.clone().unbind(),
    })
}

/// A block list as u64s: a sequence of ints, a numpy integer array or a CPU torch tensor
/// (converted through ``tolist()``, one call instead of one per element).
fn block_ids(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<u64>> {
    let obj = if obj.hasattr("tolist")? {
        obj.call_method0("tolist")?
    } else {
        obj.clone()
    };
    obj.extract::<Vec<u64>>().map_err(|_| {
        err(format!(
            "{name}: expected a sequence of non-negative block ids (ints, a numpy integer \
             array or a CPU tensor)"
        ))
    })
}

/// ``layers=``: None (all), an int, a range or slice with step 1, or a list of consecutive
/// ints.
fn layer_range(layers: Option<&Bound<'_, PyAny>>, n: usize) -> PyResult<Range<usize>> {
    let Some(l) = layers else {
        return Ok(0..n);
    };
    if let Ok(i) = l.extract::<i64>() {
        let i =
            usize::try_from(i).map_err(|_| err(format!("layers={i}: a layer index is >= 0")))?;
        return Ok(i..i + 1);
    }
    let ids: Vec<usize> = if let Ok(s) = l.downcast::<PySlice>() {
        let ind = s.indices(n as isize)?;
        (0..ind.slicelength)
            .map(|k| (ind.start + k as isize * ind.step) as usize)
            .collect()
    } else if l.downcast::<PyRange>().is_ok()
        || l.downcast::<PyList>().is_ok()
        || l.downcast::<PyTuple>().is_ok()
    {
        l.extract()?
    } else {
        return Err(err(
            "layers: expected None, an int, a range, a slice or a list of ints",
        ));
    };
    let (Some(&first), Some(&last)) = (ids.first(), ids.last()) else {
        return Err(err("layers: an empty selection"));
    };
    if ids.windows(2).any(|w| w[1] != w[0] + 1) {
        return Err(err(format!(
            "layers {ids:?}: give consecutive layers (post the others separately)"
        )));
    }
    Ok(first..last + 1)
}

#[pymethods]
impl PyBlockTransfer {
    /// Moves block ``src[i]`` to block ``dst[i]`` for every ``i`` in every segment of
    /// ``layers`` as one transfer; returns its Transfer (``wait()`` it). For a write ``src``
    /// are local blocks and ``dst`` the peer's; for a read the other way round. ``notify``
    /// reaches the peer after the bytes. ``stream``: the work queued on it finishes first.
    #[pyo3(signature = (src, dst, layers=None, notify=None, stream=None))]
    fn post(
        &self,
        py: Python<'_>,
        src: &Bound<'_, PyAny>,
        dst: &Bound<'_, PyAny>,
        layers: Option<&Bound<'_, PyAny>>,
        notify: Option<Vec<u8>>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyTransfer> {
        let (src, dst) = (block_ids(src, "src")?, block_ids(dst, "dst")?);
        let layers = layer_range(layers, self.num_layers)?;
        if let Some(s) = stream {
            cuda::sync_stream(py, cuda::stream_handle(s)?, 0)?;
        }
        let bt = Arc::clone(&self.bt);
        let h = py
            .allow_threads(move || bt.post(&src, &dst, layers, notify))
            .py_err()?;
        let n_ops = h.len();
        Ok(PyTransfer { h, n_ops })
    }

    /// Layers of the pools.
    #[getter]
    fn num_layers(&self) -> usize {
        self.num_layers
    }

    fn __repr__(&self) -> String {
        format!("BlockTransfer(layers={})", self.num_layers)
    }
}
