//! Checkpoints in the safetensors format: read and check headers ([`read_header`],
//! [`open_checkpoint`] for sharded checkpoints and their `model.safetensors.index.json`), load
//! a file's tensors into host or GPU memory as one pipelined copy of its data section
//! ([`load_into_host`], [`load_into_gpu`]; every tensor is a byte range of it), and write one
//! ([`save`]: the header and every tensor gathered into one pipelined write).
//!
//! Every header is checked before any tensor byte moves (see [`header`]); a file gdx refuses
//! is a [`StorageError::BadCheckpoint`] naming the reason. The copies are the planner's
//! (`crate::residency`): a checkpoint in the page cache is read through it, one on the disk
//! with `O_DIRECT` or cuFile, one partly cached split page by page; the report says which.

pub mod header;
mod header_error;

pub use header::{Dtype, TensorInfo, TensorSpec, MAX_HEADER_BYTES};

use crate::{
    copy_file_to_gpu, copy_file_to_host, copy_slices_to_file, CopyOptions, CopyReport, FileRange,
    StorageError,
};
use gdx_sys::cuda::DeviceBuffer;
use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// A checked safetensors header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The tensors, in data order.
    pub tensors: Vec<TensorInfo>,
    /// The `__metadata__` strings.
    pub metadata: BTreeMap<String, String>,
    /// Where the data section starts in the file (8 + the header's length).
    pub data_start: u64,
    /// The data section's bytes (to the end of the file).
    pub data_len: u64,
}

fn bad(path: &Path, reason: impl Into<String>) -> StorageError {
    StorageError::BadCheckpoint {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Read and check the header of the safetensors file `path` (no tensor byte is read).
pub fn read_header(path: &Path) -> Result<Header, StorageError> {
    let read_err = |len, source| StorageError::Read {
        path: path.to_path_buf(),
        offset: 0,
        len,
        source,
    };
    // Non-blocking, the type checked on the descriptor: a FIFO never hangs the reader.
    let (mut f, size) = crate::fileio::open_regular(path, "reading")?;
    if size < 8 {
        return Err(bad(
            path,
            format!("the file is {size} byte(s), shorter than the 8-byte header length"),
        ));
    }
    let mut prefix = [0u8; 8];
    f.read_exact(&mut prefix).map_err(|e| read_err(8, e))?;
    let n = u64::from_le_bytes(prefix);
    if n > MAX_HEADER_BYTES {
        return Err(bad(
            path,
            format!("the header length {n} exceeds the {MAX_HEADER_BYTES}-byte limit"),
        ));
    }
    if n > size - 8 {
        return Err(bad(
            path,
            format!("the {n}-byte header runs past the end of the {size}-byte file"),
        ));
    }
    let mut json = vec![0u8; n as usize];
    f.read_exact(&mut json).map_err(|e| read_err(n, e))?;
    let data_len = size - 8 - n;
    let (tensors, metadata) =
        header::parse(&json, data_len).map_err(|r| bad(path, r.to_string()))?;
    Ok(Header {
        tensors,
        metadata,
        data_start: 8 + n,
        data_len,
    })
}

/// The data section of a checkpoint file, as a copy's source.
pub fn data_range(path: &Path, h: &Header) -> FileRange {
    FileRange::new(path, h.data_start, h.data_len)
}

/// Copy the data section of `path` (whose header is `h`) into the start of `dst`: tensor `t`
/// is then `dst[t.begin..t.end]`. One pipelined copy, planned like any other read.
pub fn load_into_host(
    path: &Path,
    h: &Header,
    dst: &mut [u8],
    opts: &CopyOptions,
) -> Result<CopyReport, StorageError> {
    copy_file_to_host(&data_range(path, h), dst, opts)
}

/// Copy the data section of `path` (whose header is `h`) into `dst` at `dst_offset`: tensor `t`
/// is then the bytes at `dst_offset + t.begin`. One pipelined copy, planned like any other
/// read (cuFile, the staged pipeline, or the page cache).
pub fn load_into_gpu(
    path: &Path,
    h: &Header,
    dst: &mut DeviceBuffer,
    dst_offset: usize,
    opts: &CopyOptions,
) -> Result<CopyReport, StorageError> {
    copy_file_to_gpu(&data_range(path, h), dst, dst_offset, opts)
}

/// Write a safetensors file: `tensors[i]`'s bytes are `data[i]`; laid out as safetensors
/// orders them (larger elements first, then by name). The header is checked as a reader would
/// check it before the file is opened; the file is replaced.
pub fn save(
    path: &Path,
    tensors: &[TensorSpec],
    data: &[&[u8]],
    metadata: &BTreeMap<String, String>,
    opts: &CopyOptions,
) -> Result<CopyReport, StorageError> {
    if tensors.len() != data.len() {
        return Err(StorageError::InvalidOption(format!(
            "{} tensors but {} byte buffers",
            tensors.len(),
            data.len()
        )));
    }
    if let Some((t, d)) = tensors
        .iter()
        .zip(data)
        .find(|(t, d)| t.len != d.len() as u64)
    {
        return Err(StorageError::InvalidOption(format!(
            "tensor {:?}: its spec says {} bytes but its buffer has {}",
            t.name,
            t.len,
            d.len()
        )));
    }
    let order = header::aligned_order(tensors);
    let head = header::encode(tensors, &order, metadata).map_err(|r| bad(path, r.to_string()))?;
    let mut parts: Vec<&[u8]> = vec![&head];
    parts.extend(order.iter().map(|&i| data[i]));
    let opts = CopyOptions {
        truncate: true,
        ..opts.clone()
    };
    copy_slices_to_file(&parts, &FileRange::whole(path), &opts)
}

/// [`save`] from GPU memory: `data[i]` holds tensor `i`'s bytes (a span of GPU `ctx`'s
/// memory, or host bytes for an empty tensor); each chunk of the file is gathered into a pinned
/// buffer and written while the next is gathered (no copy of the whole in host memory).
pub fn save_from_gpu(
    path: &Path,
    tensors: &[TensorSpec],
    data: &[crate::Part<'_>],
    ctx: &gdx_sys::cuda::Context,
    metadata: &BTreeMap<String, String>,
    opts: &CopyOptions,
) -> Result<CopyReport, StorageError> {
    if tensors.len() != data.len() {
        return Err(StorageError::InvalidOption(format!(
            "{} tensors but {} byte spans",
            tensors.len(),
            data.len()
        )));
    }
    if let Some((t, d)) = tensors
        .iter()
        .zip(data)
        .find(|(t, d)| t.len != d.len() as u64)
    {
        return Err(StorageError::InvalidOption(format!(
            "tensor {:?}: its spec says {} bytes but its span has {}",
            t.name,
            t.len,
            d.len()
        )));
    }
    let order = header::aligned_order(tensors);
    let head = header::encode(tensors, &order, metadata).map_err(|r| bad(path, r.to_string()))?;
    let mut parts = vec![crate::Part::Host(&head)];
    parts.extend(order.iter().map(|&i| data[i]));
    let opts = CopyOptions {
        truncate: true,
        ..opts.clone()
    };
    crate::copy_parts_to_file(&parts, ctx, &FileRange::whole(path), &opts)
}

/// The files of a checkpoint at `path`: a `*.index.json` (the shards its `weight_map` names,
/// beside it), a folder (its `model.safetensors.index.json`, else every `*.safetensors` in it,
/// by name), or one file.
pub fn checkpoint_files(path: &Path) -> Result<Vec<PathBuf>, StorageError> {
    if path.is_dir() {
        let index = path.join("model.safetensors.index.json");
        if index.is_file() {
            return Ok(index_map(&index)?.0);
        }
        let list = std::fs::read_dir(path).map_err(|source| StorageError::Open {
            path: path.to_path_buf(),
            purpose: "listing",
            source,
        })?;
        let mut files: Vec<PathBuf> = list
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(bad(
                path,
                "the folder holds no *.safetensors file and no model.safetensors.index.json",
            ));
        }
        return Ok(files);
    }
    if path.to_string_lossy().ends_with(".index.json") {
        return Ok(index_map(path)?.0);
    }
    Ok(vec![path.to_path_buf()])
}

/// An index's shard files (in order of first mention) and its tensor -> file map.
type IndexMap = (Vec<PathBuf>, HashMap<String, PathBuf>);

/// Largest `*.index.json` read (a real one is tens of KiB: one line per tensor).
pub const MAX_INDEX_BYTES: u64 = 16 << 20;

fn index_map(index: &Path) -> Result<IndexMap, StorageError> {
    // A regular file only (a FIFO would hang, `/dev/zero` behind a symlink never end), and
    // at most MAX_INDEX_BYTES of it.
    let (f, size) = crate::fileio::open_regular(index, "reading")?;
    if size > MAX_INDEX_BYTES {
        return Err(bad(
            index,
            format!("the index is {size} bytes, more than the {MAX_INDEX_BYTES}-byte limit"),
        ));
    }
    let mut raw = Vec::new();
    f.take(MAX_INDEX_BYTES + 1)
        .read_to_end(&mut raw)
        .map_err(|source| StorageError::Read {
            path: index.to_path_buf(),
            offset: 0,
            len: size,
            source,
        })?;
    if raw.len() as u64 > MAX_INDEX_BYTES {
        return Err(bad(index, "the index grew past the size limit while read"));
    }
    let text = String::from_utf8(raw).map_err(|_| bad(index, "the index is not UTF-8"))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| bad(index, format!("the index is not valid JSON ({e})")))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad(index, "the index has no \"weight_map\" object"))?;
    let dir = index.parent().unwrap_or(Path::new("."));
    let (mut files, mut names) = (Vec::new(), HashMap::new());
    for (name, file) in map {
        let file = file
            .as_str()
            .filter(|f| !f.contains('/') && !f.is_empty())
            .ok_or_else(|| {
                bad(
                    index,
                    format!("weight_map[{name:?}] is not a file name beside the index"),
                )
            })?;
        let p = dir.join(file);
        if !files.contains(&p) {
            files.push(p.clone());
        }
        names.insert(name.clone(), p);
    }
    files.sort();
    Ok((files, names))
}

/// Resolve a checkpoint ([`checkpoint_files`]) and check every header before any byte moves:
/// each file's own rules, no tensor name in two files, and, with an index, every tensor it
/// names found in the shard it names.
pub fn open_checkpoint(path: &Path) -> Result<Vec<(PathBuf, Header)>, StorageError> {
    let files = checkpoint_files(path)?;
    let headers = files
        .into_iter()
        .map(|f| read_header(&f).map(|h| (f, h)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut seen: HashMap<&str, &Path> = HashMap::new();
    for (f, h) in &headers {
        for t in &h.tensors {
            if let Some(other) = seen.insert(&t.name, f) {
                return Err(bad(
                    f,
                    format!("tensor {:?} is also in {}", t.name, other.display()),
                ));
            }
        }
    }
    let index = if path.is_dir() {
        Some(path.join("model.safetensors.index.json")).filter(|p| p.is_file())
    } else {
        Some(path.to_path_buf()).filter(|p| p.to_string_lossy().ends_with(".index.json"))
    };
    if let Some(index) = index {
        for (name, file) in index_map(&index)?.1 {
            if seen.get(name.as_str()) != Some(&file.as_path()) {
                return Err(bad(
                    &index,
                    format!(
                        "weight_map puts {name:?} in {}, whose header lacks it",
                        file.display()
                    ),
                ));
            }
        }
    }
    Ok(headers)
}

/// Run `f` on every item, `parallel` at a time (at least one), on scoped threads; the results
/// in the items' order.
pub fn in_parallel<T: Sync, R: Send>(
    items: &[T],
    parallel: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<Option<R>>> = Mutex::new((0..items.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..parallel.clamp(1, items.len().max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(i) else { return };
                let r = f(item);
                out.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(r);
            });
        }
    });
    out.into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .into_iter()
        .flatten()
        .collect()
}

#[cfg(test)]
mod tests;
