//! [`LocalPeer`] transfers between a file range and a GPU or pinned host region (see
//! [`crate::file`] for the paths, the planner and strict mode).

use super::{LocalPeer, Mem};
use crate::error::{Error, Result};
use crate::file::{finish, plan_inner, FileOptions, FileRange};
use crate::routing::plan::Plan;

impl LocalPeer {
    /// The plan for a copy between a file and `mem` under this peer's policy: `gds` where cuFile
    /// runs true GPUDirect Storage, else `file-staged`, with the reason.
    ///
    /// # Errors
    /// As [`crate::file::plan_file`] (strict mode refuses leaving true GDS).
    pub fn plan_file(&self, mem: Mem<'_>, opts: &FileOptions) -> Result<Plan> {
        plan_inner(mem.location(), opts, &self.shared.policy).map(|p| p.plan)
    }

    /// Copy the file range `src` (to the end of the file when its length is `None`) into `dst`
    /// at `dst_offset`. Waits for copies queued on `dst` first; returns when the bytes have
    /// landed, with the plan of the path taken (`gds`, `file-staged` or `buffered`) and the
    /// bytes copied.
    ///
    /// # Errors
    /// [`Error::Strict`] when strict mode refuses a fallback from true GDS; out-of-bounds and
    /// storage errors (open, read, cuFile) otherwise.
    pub fn copy_file_to(
        &self,
        dst: Mem<'_>,
        dst_offset: u64,
        src: &FileRange,
        opts: &FileOptions,
    ) -> Result<(Plan, u64)> {
        let loc = dst.location();
        let fp = plan_inner(loc, opts, &self.shared.policy)?;
        if dst_offset > dst.len() {
            return Err(Error::OutOfBounds {
                offset: dst_offset,
                len: 0,
                region_len: dst.len(),
            });
        }
        let off = super::to_usize(dst_offset)?;
        let got = match dst {
            Mem::Gpu(r) => {
                r.synchronize()?;
                let mut buf = r.inner.lock();
                gdx_storage::copy_file_to_gpu(src, &mut buf, off, &fp.opts)
            }
            Mem::Pinned(r) => {
                r.with_bytes_mut(|b| gdx_storage::copy_file_to_host(src, &mut b[off..], &fp.opts))?
            }
        };
        finish(&fp, got, loc)
    }

    /// Copy `len` bytes of `src` at `src_offset` to the file range `dst` (created if needed; its
    /// length, if given, must be `len`). Waits for copies queued on `src` first; returns the plan
    /// of the path taken and the bytes copied. With [`FileOptions::sync`] the bytes are on the
    /// disk when it returns.
    ///
    /// # Errors
    /// As [`LocalPeer::copy_file_to`].
    pub fn copy_to_file(
        &self,
        src: Mem<'_>,
        src_offset: u64,
        len: u64,
        dst: &FileRange,
        opts: &FileOptions,
    ) -> Result<(Plan, u64)> {
        let loc = src.location();
        let fp = plan_inner(loc, opts, &self.shared.policy)?;
        crate::region::check_bounds(src_offset, len, src.len())?;
        let (off, n) = (super::to_usize(src_offset)?, super::to_usize(len)?);
        let got = match src {
            Mem::Gpu(r) => {
                r.synchronize()?;
                let buf = r.inner.lock();
                gdx_storage::copy_gpu_to_file(&buf, off, len, dst, &fp.opts)
            }
            Mem::Pinned(r) => {
                r.with_bytes(|b| gdx_storage::copy_host_to_file(&b[off..off + n], dst, &fp.opts))?
            }
        };
        finish(&fp, got, loc)
    }
}
