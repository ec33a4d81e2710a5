//! The pinned bounce buffers of [`super::gather_to_gpu`], kept between calls: page-locking and
//! zeroing 256 MiB costs tens of milliseconds, a sizeable part of a warm load of a few GiB.
//!
//! Invariants: at most [`PINNED_KEEP_BYTES`] stay cached; buffers are portable (any context
//! may copy with them), so a cached one serves any GPU; [`release_pinned_cache`] frees them.

use crate::StorageError;
use gdx_sys::cuda::{Context, PinnedHostBuffer};
use std::sync::Mutex;

/// Most pinned bytes kept for the next call (512 MiB).
pub const PINNED_KEEP_BYTES: u64 = 512 << 20;

static CACHE: Mutex<Vec<PinnedHostBuffer>> = Mutex::new(Vec::new());

/// Buffers taken for one call.
#[derive(Default)]
pub(crate) struct Taken {
    pub(crate) bufs: Vec<PinnedHostBuffer>,
    pub(crate) reused_bytes: u64,
}

impl Taken {
    pub(crate) fn bytes(&self) -> u64 {
        self.bufs.iter().map(|b| b.len() as u64).sum()
    }
}

/// `n` buffers of `len` bytes: cached ones of that size first, the rest allocated on `ctx`.
pub(crate) fn take(ctx: &Context, n: usize, len: usize) -> Result<Taken, StorageError> {
    let mut bufs = Vec::with_capacity(n);
    {
        let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
        while bufs.len() < n {
            match cache.iter().position(|b| b.len() == len) {
                Some(i) => bufs.push(cache.swap_remove(i)),
                None => break,
            }
        }
    }
    let reused_bytes = (bufs.len() * len) as u64;
    while bufs.len() < n {
        bufs.push(
            PinnedHostBuffer::new(ctx, len).map_err(StorageError::cuda(format!(
                "allocating a pinned bounce buffer of {len} bytes"
            )))?,
        );
    }
    Ok(Taken { bufs, reused_bytes })
}

/// Keep `bufs` for the next call, up to [`PINNED_KEEP_BYTES`] in all; free the rest.
pub(crate) fn give_back(bufs: Vec<PinnedHostBuffer>) {
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    let mut held: u64 = cache.iter().map(|b| b.len() as u64).sum();
    for b in bufs {
        if held + b.len() as u64 <= PINNED_KEEP_BYTES {
            held += b.len() as u64;
            cache.push(b);
        }
    }
}

/// Free the cached pinned buffers; returns the bytes freed.
pub fn release_pinned_cache() -> u64 {
    let bufs = std::mem::take(&mut *CACHE.lock().unwrap_or_else(|p| p.into_inner()));
    bufs.iter().map(|b| b.len() as u64).sum()
}
