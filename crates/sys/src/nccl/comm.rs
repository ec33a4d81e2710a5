//! NCCL communicators and collectives for one process driving every local GPU
//! (`ncclCommInitAll`), as `gdx nccl run` needs them: all-reduce, all-gather, reduce-scatter
//! and a ring of send/recv, on `f32` data with `ncclSum`.
//!
//! [`Nccl::load`] resolves its own table of symbols (the probe's table only checks that the
//! library is NCCL) and never panics: a missing library or symbol is an [`Unavailable`].
//! [`launch`] checks every buffer, stream and count before the first NCCL call, wraps the
//! per-rank calls in `ncclGroupStart`/`ncclGroupEnd` (required when one thread drives several
//! communicators), and marks each buffer as used by its stream, so host access and `Drop`
//! wait for the collective like they wait for a copy.

use super::{default_candidates, NcclVersion, SONAME};
use crate::cuda::{Context, CudaError, DeviceBuffer, Stream};
use crate::loader::{self, Opened};
use crate::Unavailable;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::fmt;
use std::sync::{Arc, OnceLock};

/// `ncclFloat32`.
const NCCL_FLOAT32: c_int = 7;
/// `ncclSum`.
const NCCL_SUM: c_int = 0;
/// Bytes per element (`f32`).
pub const ELEMENT_BYTES: usize = 4;

loader::fn_table! {
    /// The calls `gdx nccl run` makes (prototypes from nccl.h; `ncclComm_t` and
    /// `cudaStream_t` as `*mut c_void`, enums as `c_int`).
    struct CollApi {
        ncclGetVersion: fn(*mut c_int) -> c_int;
        ncclGetErrorString: fn(c_int) -> *const c_char;
        ncclCommInitAll: fn(*mut *mut c_void, c_int, *const c_int) -> c_int;
        ncclCommDestroy: fn(*mut c_void) -> c_int;
        ncclAllReduce: fn(*const c_void, *mut c_void, usize, c_int, c_int, *mut c_void, *mut c_void) -> c_int;
        ncclAllGather: fn(*const c_void, *mut c_void, usize, c_int, *mut c_void, *mut c_void) -> c_int;
        ncclReduceScatter: fn(*const c_void, *mut c_void, usize, c_int, c_int, *mut c_void, *mut c_void) -> c_int;
        ncclSend: fn(*const c_void, usize, c_int, c_int, *mut c_void, *mut c_void) -> c_int;
        ncclRecv: fn(*mut c_void, usize, c_int, c_int, *mut c_void, *mut c_void) -> c_int;
        ncclGroupStart: fn() -> c_int;
        ncclGroupEnd: fn() -> c_int;
    }
    optional {}
}

/// A failed NCCL call, or a bad argument caught before one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NcclError {
    /// NCCL returned an error.
    #[error("{call} failed: ncclResult_t {code}: {text}")]
    Call {
        /// The call, with its rank when per rank.
        call: String,
        /// `ncclResult_t`.
        code: i32,
        /// `ncclGetErrorString`.
        text: String,
    },
    /// A CUDA call around it failed.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// Refused before calling NCCL.
    #[error("{call}: {reason}")]
    InvalidArgument {
        /// The call that was not made.
        call: &'static str,
        /// Why.
        reason: String,
    },
}

/// The loaded NCCL library. Cheap to clone.
#[derive(Clone)]
pub struct Nccl {
    inner: Arc<Inner>,
}

struct Inner {
    api: CollApi,
    path: String,
    _lib: Opened,
}

impl fmt::Debug for Nccl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nccl")
            .field("path", &self.inner.path)
            .finish()
    }
}

impl Nccl {
    /// The process-wide library, loaded from [`default_candidates`] once.
    pub fn load() -> Result<Nccl, Unavailable> {
        static NCCL: OnceLock<Result<Nccl, Unavailable>> = OnceLock::new();
        NCCL.get_or_init(|| Nccl::load_from(&default_candidates()))
            .clone()
    }

    /// Load from an explicit candidate list, bypassing the cache.
    pub fn load_from<S: AsRef<str>>(candidates: &[S]) -> Result<Nccl, Unavailable> {
        let opened = loader::open_first(SONAME, candidates)?;
        // SAFETY: `opened` was found under NCCL's names; the table's prototypes copy nccl.h.
        let api = unsafe { CollApi::resolve(&opened) }
            .map_err(|m| m.into_unavailable(SONAME, &opened))?;
        let path = opened.file(api.ncclGetVersion as *const c_void);
        Ok(Nccl {
            inner: Arc::new(Inner {
                api,
                path,
                _lib: opened,
            }),
        })
    }

    /// The file loaded.
    pub fn path(&self) -> &str {
        &self.inner.path
    }

    /// `ncclGetVersion`.
    pub fn version(&self) -> Result<NcclVersion, NcclError> {
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid out-pointer for one int.
        let rc = unsafe { (self.inner.api.ncclGetVersion)(&mut v) };
        self.check(rc, "ncclGetVersion".into())?;
        Ok(NcclVersion(v))
    }

    fn check(&self, rc: c_int, call: String) -> Result<(), NcclError> {
        if rc == 0 {
            return Ok(());
        }
        // SAFETY: `ncclGetErrorString` accepts any result code and returns a static string.
        let p = unsafe { (self.inner.api.ncclGetErrorString)(rc) };
        let text = if p.is_null() {
            "unknown error".to_string()
        } else {
            // SAFETY: non-null: a static NUL-terminated string in libnccl.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        };
        Err(NcclError::Call {
            call,
            code: rc,
            text,
        })
    }

    /// One communicator per context, all in one clique (`ncclCommInitAll`), rank `i` on
    /// `ctxs[i]`'s GPU.
    pub fn init_all(&self, ctxs: &[Context]) -> Result<Vec<Comm>, NcclError> {
        if ctxs.is_empty() {
            return Err(NcclError::InvalidArgument {
                call: "ncclCommInitAll",
                reason: "no GPU given".into(),
            });
        }
        let devs: Vec<c_int> = ctxs
            .iter()
            .map(|c| c_int::try_from(c.ordinal()).unwrap_or(c_int::MAX))
            .collect();
        let n = c_int::try_from(devs.len()).unwrap_or(c_int::MAX);
        let mut raw: Vec<*mut c_void> = vec![std::ptr::null_mut(); devs.len()];
        // SAFETY: `raw` has room for `n` communicators and `devs` holds `n` device ordinals;
        // NCCL writes one handle per device and reads nothing else.
        let rc = unsafe { (self.inner.api.ncclCommInitAll)(raw.as_mut_ptr(), n, devs.as_ptr()) };
        self.check(rc, format!("ncclCommInitAll({} GPUs)", devs.len()))?;
        Ok(raw
            .into_iter()
            .zip(ctxs)
            .enumerate()
            .map(|(rank, (raw, ctx))| Comm {
                nccl: self.clone(),
                raw,
                ctx: ctx.clone(),
                rank: rank as u32,
                nranks: devs.len() as u32,
            })
            .collect())
    }
}

/// One rank's communicator; `ncclCommDestroy` on drop.
pub struct Comm {
    nccl: Nccl,
    raw: *mut c_void,
    ctx: Context,
    rank: u32,
    nranks: u32,
}

impl fmt::Debug for Comm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Comm")
            .field("rank", &self.rank)
            .field("nranks", &self.nranks)
            .field("gpu", &self.ctx.ordinal())
            .finish()
    }
}

impl Comm {
    /// Rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }
    /// Communicator size.
    pub fn nranks(&self) -> u32 {
        self.nranks
    }
    /// The GPU's context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // SAFETY: this value owns the handle from `ncclCommInitAll` and drops it once.
        let rc = unsafe { (self.nccl.inner.api.ncclCommDestroy)(self.raw) };
        if let Err(e) = self
            .nccl
            .check(rc, format!("ncclCommDestroy(rank {})", self.rank))
        {
            log::warn!("{e}");
        }
    }
}

/// A collective, as nccl-tests names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Collective {
    /// `ncclAllReduce`: `count` in, `count` out.
    AllReduce,
    /// `ncclAllGather`: `count` in, `count × nranks` out.
    AllGather,
    /// `ncclReduceScatter`: `count × nranks` in, `count` out.
    ReduceScatter,
    /// `ncclSend` to rank+1 and `ncclRecv` from rank−1: `count` each way.
    SendRecv,
}

impl Collective {
    /// (send, receive) element counts per rank for `count`.
    pub fn elements(self, count: usize, nranks: usize) -> (usize, usize) {
        match self {
            Collective::AllReduce | Collective::SendRecv => (count, count),
            Collective::AllGather => (count, count.saturating_mul(nranks)),
            Collective::ReduceScatter => (count.saturating_mul(nranks), count),
        }
    }
}

/// Enqueue `op` with `count` elements on every rank: rank `i` uses `send[i]`, `recv[i]`,
/// `streams[i]`. Returns once queued; synchronise the streams to wait.
pub fn launch(
    comms: &[Comm],
    op: Collective,
    count: usize,
    send: &[DeviceBuffer],
    recv: &mut [DeviceBuffer],
    streams: &[Stream],
) -> Result<(), NcclError> {
    let n = comms.len();
    let bad = |reason: String| NcclError::InvalidArgument {
        call: "launch",
        reason,
    };
    if n == 0 || send.len() != n || recv.len() != n || streams.len() != n {
        return Err(bad(format!(
            "{n} communicators, {} send, {} receive buffers, {} streams: need one of each per rank",
            send.len(),
            recv.len(),
            streams.len()
        )));
    }
    if count == 0 {
        return Err(bad("count must be at least 1".into()));
    }
    let (s_el, r_el) = op.elements(count, n);
    for (i, c) in comms.iter().enumerate() {
        let need = |el: usize| el.checked_mul(ELEMENT_BYTES);
        let (Some(s_b), Some(r_b)) = (need(s_el), need(r_el)) else {
            return Err(bad(format!("{count} elements overflow a buffer size")));
        };
        if send[i].len() < s_b || recv[i].len() < r_b {
            return Err(bad(format!(
                "rank {i}: {op:?} of {count} elements needs {s_b} B to send and {r_b} B to receive, buffers hold {} and {}",
                send[i].len(),
                recv[i].len()
            )));
        }
        let same = send[i].context().same(&c.ctx)
            && recv[i].context().same(&c.ctx)
            && streams[i].context().same(&c.ctx);
        if !same {
            return Err(bad(format!(
                "rank {i}: buffers and stream must be on GPU {}",
                c.ctx.ordinal()
            )));
        }
        if comms.iter().skip(i + 1).any(|o| o.raw == c.raw) {
            return Err(bad("the same communicator appears twice".into()));
        }
    }
    for i in 0..n {
        send[i].pending.order_before(&streams[i])?;
        recv[i].pending.order_before(&streams[i])?;
        streams[i].enter()?;
    }
    let nccl = &comms[0].nccl;
    let api = &nccl.inner.api;
    // SAFETY: takes no arguments; paired with the `ncclGroupEnd` below on every path.
    nccl.check(unsafe { (api.ncclGroupStart)() }, "ncclGroupStart".into())?;
    let mut first_err: Option<NcclError> = None;
    for i in 0..n {
        let c = &comms[i];
        let s = send[i].as_raw() as *const c_void;
        let r = recv[i].as_raw() as *mut c_void;
        let st = streams[i].as_raw();
        let peer_next = ((i + 1) % n) as c_int;
        let peer_prev = ((i + n - 1) % n) as c_int;
        // SAFETY: `s` and `r` are device addresses of live buffers of this rank's GPU, at
        // least as long as the element counts checked above need; `recv[i]` is borrowed
        // mutably and `send[i]` shared until the call returns, and both are marked used by
        // `st` below, so they outlive the queued work. `c.raw` is a live communicator and
        // `st` a stream of its GPU.
        let rc = unsafe {
            match op {
                Collective::AllReduce => {
                    (api.ncclAllReduce)(s, r, count, NCCL_FLOAT32, NCCL_SUM, c.raw, st)
                }
                Collective::AllGather => (api.ncclAllGather)(s, r, count, NCCL_FLOAT32, c.raw, st),
                Collective::ReduceScatter => {
                    (api.ncclReduceScatter)(s, r, count, NCCL_FLOAT32, NCCL_SUM, c.raw, st)
                }
                Collective::SendRecv => {
                    let a = (api.ncclSend)(s, count, NCCL_FLOAT32, peer_next, c.raw, st);
                    if a != 0 {
                        a
                    } else {
                        (api.ncclRecv)(r, count, NCCL_FLOAT32, peer_prev, c.raw, st)
                    }
                }
            }
        };
        if let Err(e) = nccl.check(rc, format!("{op:?} (rank {i})")) {
            first_err.get_or_insert(e);
            break;
        }
    }
    // SAFETY: closes the group opened above.
    let end = nccl.check(unsafe { (api.ncclGroupEnd)() }, "ncclGroupEnd".into());
    if let Some(e) = first_err {
        return Err(e);
    }
    end?;
    for i in 0..n {
        send[i].pending.mark(&streams[i])?;
        recv[i].pending.mark(&streams[i])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_library_without_the_collectives_is_unavailable_naming_them() {
        let e = Nccl::load_from(&["libc.so.6"]).unwrap_err();
        assert_eq!(e.library, SONAME);
        assert!(e.reason.contains("ncclCommInitAll"), "{}", e.reason);
        assert!(e.reason.contains("ncclAllReduce"), "{}", e.reason);
        let e = Nccl::load_from(&["/nonexistent/gdx/libnccl.so.2"]).unwrap_err();
        assert!(
            e.reason.contains("/nonexistent/gdx/libnccl.so.2"),
            "{}",
            e.reason
        );
    }

    #[test]
    fn load_is_ok_or_unavailable_and_cached() {
        match Nccl::load() {
            Ok(n) => assert!(n.version().unwrap().parts().0 >= 2),
            Err(u) => assert!(!u.reason.is_empty()),
        }
        assert_eq!(Nccl::load().is_ok(), Nccl::load().is_ok());
    }

    #[test]
    fn element_counts_per_collective() {
        assert_eq!(Collective::AllReduce.elements(10, 4), (10, 10));
        assert_eq!(Collective::AllGather.elements(10, 4), (10, 40));
        assert_eq!(Collective::ReduceScatter.elements(10, 4), (40, 10));
        assert_eq!(Collective::SendRecv.elements(10, 1), (10, 10));
    }
}
