//! [`FileHandle`] (`cuFileHandleRegister` over an open file), [`BufferRegistration`]
//! (`cuFileBufRegister` over a [`DeviceBuffer`]), and reads and writes between them
//! (`cuFileRead`, `cuFileWrite`), one call or several in flight from scoped threads.
//!
//! Invariants:
//! - A handle owns its [`File`] and a [`Driver`] clone, so the descriptor and the driver outlive
//!   the registration; a buffer registration holds its buffer, so the memory outlives it.
//! - Every read or write first checks the byte range against the buffer, waits for the
//!   buffer's queued stream work (cuFile is not stream-ordered here), and makes the buffer's
//!   context current on the calling thread (cuFile copies through it).
//! - cuFile is called with the buffer's base address and an offset, as it wants for
//!   registered buffers; unregistered buffers work the same way.

use super::api::{self, RawHandle};
use super::{CufileError, Driver};
use crate::cuda::DeviceBuffer;
use std::ffi::c_void;
use std::fmt;
use std::fs::File;
use std::ops::{Deref, DerefMut};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

/// A file registered with cuFile; deregistered (`cuFileHandleDeregister`) when dropped.
pub struct FileHandle {
    driver: Driver,
    raw: RawHandle,
    file: File,
    name: String,
}

// SAFETY: a cuFile handle may be used from any thread and by several at once (cuFile's
// documented thread safety); the other fields are Send + Sync.
unsafe impl Send for FileHandle {}
// SAFETY: as above; `&FileHandle` only passes the handle to thread-safe cuFile calls.
unsafe impl Sync for FileHandle {}

impl fmt::Debug for FileHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileHandle")
            .field("file", &self.name)
            .field("fd", &self.file.as_raw_fd())
            .finish()
    }
}

/// How a transfer is split for [`FileHandle::read_parallel`] and
/// [`FileHandle::write_parallel`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParallelIo {
    /// Bytes per cuFile call (the last may be shorter); at least 1.
    pub chunk_bytes: usize,
    /// Calls in flight at once, one thread each; at least 1.
    pub threads: usize,
}

impl FileHandle {
    /// Register `file` with cuFile (`cuFileHandleRegister`, `CU_FILE_HANDLE_TYPE_OPAQUE_FD`).
    /// `name` (usually the path) labels errors. True GPUDirect Storage needs the file opened
    /// with `O_DIRECT`; compatibility mode takes any descriptor.
    pub fn register(
        driver: &Driver,
        file: File,
        name: impl Into<String>,
    ) -> Result<FileHandle, CufileError> {
        let name = name.into();
        let mut descr = api::Descr {
            kind: api::HANDLE_TYPE_OPAQUE_FD,
            handle: api::DescrHandle {
                fd: file.as_raw_fd(),
            },
            fs_ops: std::ptr::null(),
        };
        let mut raw: RawHandle = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer, `descr` a valid CUfileDescr_t for an open
        // descriptor that this value keeps open until it deregisters the handle.
        let status = unsafe { (driver.cufile().api().cuFileHandleRegister)(&mut raw, &mut descr) };
        CufileError::check(status, || format!("cuFileHandleRegister({name})"))?;
        Ok(FileHandle {
            driver: driver.clone(),
            raw,
            file,
            name,
        })
    }

    /// The registered file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Read `len` bytes at `file_offset` into `dst` at `dst_offset` (`cuFileRead`, repeated
    /// after a partial read). Returns the bytes read: fewer than `len` only at end of file.
    pub fn read(
        &self,
        dst: &mut DeviceBuffer,
        dst_offset: usize,
        len: usize,
        file_offset: u64,
    ) -> Result<usize, CufileError> {
        let io = ParallelIo {
            chunk_bytes: len.max(1),
            threads: 1,
        };
        self.read_parallel(dst, dst_offset, len, file_offset, io, &|_| {})
    }

    /// Write `len` bytes of `src` at `src_offset` to the file at `file_offset` (`cuFileWrite`,
    /// repeated after a partial write). Returns `len`.
    pub fn write(
        &self,
        src: &DeviceBuffer,
        src_offset: usize,
        len: usize,
        file_offset: u64,
    ) -> Result<usize, CufileError> {
        let io = ParallelIo {
            chunk_bytes: len.max(1),
            threads: 1,
        };
        self.write_parallel(src, src_offset, len, file_offset, io, &|_| {})
    }

    /// [`FileHandle::read`] split into `io.chunk_bytes` calls, `io.threads` in flight.
    /// `progress` gets the byte count of each finished chunk. Returns the bytes read from the
    /// start of the range up to the first chunk that ended early (end of file); on the first
    /// error the remaining chunks are not started.
    pub fn read_parallel(
        &self,
        dst: &mut DeviceBuffer,
        dst_offset: usize,
        len: usize,
        file_offset: u64,
        io: ParallelIo,
        progress: &(dyn Fn(usize) + Sync),
    ) -> Result<usize, CufileError> {
        self.transfer(Op::Read, dst, dst_offset, len, file_offset, io, progress)
    }

    /// [`FileHandle::write`] split into `io.chunk_bytes` calls, `io.threads` in flight.
    /// `progress` gets the byte count of each finished chunk. Returns `len`.
    pub fn write_parallel(
        &self,
        src: &DeviceBuffer,
        src_offset: usize,
        len: usize,
        file_offset: u64,
        io: ParallelIo,
        progress: &(dyn Fn(usize) + Sync),
    ) -> Result<usize, CufileError> {
        self.transfer(Op::Write, src, src_offset, len, file_offset, io, progress)
    }

    #[allow(clippy::too_many_arguments)]
    fn transfer(
        &self,
        op: Op,
        buf: &DeviceBuffer,
        buf_offset: usize,
        len: usize,
        file_offset: u64,
        io: ParallelIo,
        progress: &(dyn Fn(usize) + Sync),
    ) -> Result<usize, CufileError> {
        let call = op.call();
        if io.chunk_bytes == 0 || io.threads == 0 {
            return Err(CufileError::InvalidArgument {
                call,
                reason: "chunk size and thread count must be at least 1".to_string(),
            });
        }
        let in_range = buf_offset
            .checked_add(len)
            .is_some_and(|end| end <= buf.len());
        let file_end = u64::try_from(len)
            .ok()
            .and_then(|l| file_offset.checked_add(l))
            .filter(|&e| i64::try_from(e).is_ok());
        if !in_range || file_end.is_none() {
            return Err(CufileError::InvalidArgument {
                call,
                reason: format!(
                    "{len} byte(s) at buffer offset {buf_offset} and file offset {file_offset} \
                     do not fit the {}-byte buffer or the file offset range",
                    buf.len()
                ),
            });
        }
        if len == 0 {
            return Ok(0);
        }
        buf.synchronize()?;
        let ctx = buf.context();
        ctx.make_current()?;
        let chunks = len.div_ceil(io.chunk_bytes);
        let next = AtomicUsize::new(0);
        let stop = AtomicBool::new(false);
        // Per chunk: bytes moved, or the error.
        let done: Mutex<Vec<Option<Result<usize, CufileError>>>> =
            Mutex::new((0..chunks).map(|_| None).collect());
        let base = buf.as_raw();
        let worker = || -> Result<(), CufileError> {
            ctx.make_current()?;
            loop {
                if stop.load(Ordering::Acquire) {
                    return Ok(());
                }
                let i = next.fetch_add(1, Ordering::AcqRel);
                if i >= chunks {
                    return Ok(());
                }
                let off = i * io.chunk_bytes;
                let n = io.chunk_bytes.min(len - off);
                let r = self.call_full(op, base, buf_offset + off, n, file_offset + off as u64);
                let failed_or_short = !matches!(r, Ok(got) if got == n);
                let mut d = done.lock().unwrap_or_else(|p| p.into_inner());
                if let Ok(got) = &r {
                    progress(*got);
                }
                d[i] = Some(r);
                if failed_or_short {
                    stop.store(true, Ordering::Release);
                }
            }
        };
        let threads = io.threads.min(chunks);
        let spawned: Vec<Result<(), CufileError>> = std::thread::scope(|s| {
            let handles: Vec<_> = (1..threads).map(|_| s.spawn(worker)).collect();
            let mut out = vec![worker()];
            for h in handles {
                out.push(h.join().unwrap_or_else(|_| {
                    Err(CufileError::InvalidArgument {
                        call,
                        reason: "an I/O thread panicked".to_string(),
                    })
                }));
            }
            out
        });
        for r in spawned {
            r?;
        }
        let done = done.into_inner().unwrap_or_else(|p| p.into_inner());
        let mut total = 0usize;
        for (i, d) in done.into_iter().enumerate() {
            match d {
                Some(Ok(got)) => {
                    total += got;
                    if got < io.chunk_bytes.min(len - i * io.chunk_bytes) {
                        break;
                    }
                }
                Some(Err(e)) => return Err(e),
                // Not started: an earlier chunk ended early or failed.
                None => break,
            }
        }
        Ok(total)
    }

    /// One chunk: `cuFileRead`/`cuFileWrite` until `len` bytes moved or (reads) end of file.
    fn call_full(
        &self,
        op: Op,
        base: u64,
        buf_offset: usize,
        len: usize,
        file_offset: u64,
    ) -> Result<usize, CufileError> {
        let api = self.driver.cufile().api();
        let mut got = 0usize;
        while got < len {
            let (b_off, f_off) = (buf_offset + got, file_offset + got as u64);
            // Both fit: checked against the buffer and i64 in `transfer`.
            let (b_off_i, f_off_i) = (b_off as i64, f_off as i64);
            let ptr = base as *mut c_void;
            let ret = match op {
                // SAFETY: `ptr` is the base of a live device allocation of the caller's
                // `&mut DeviceBuffer`, `b_off + (len - got)` lies inside it (checked), no
                // stream work uses it (synchronised), and the handle is registered.
                Op::Read => unsafe { (api.cuFileRead)(self.raw, ptr, len - got, f_off_i, b_off_i) },
                // SAFETY: as above, for a source the caller borrows shared; cuFile only reads it.
                Op::Write => unsafe {
                    (api.cuFileWrite)(self.raw, ptr.cast_const(), len - got, f_off_i, b_off_i)
                },
            };
            if ret < 0 {
                let errno = std::io::Error::last_os_error();
                return Err(CufileError::from_io_return(
                    ret,
                    errno,
                    format!(
                        "{}({}, {} bytes at offset {f_off})",
                        op.call(),
                        self.name,
                        len - got
                    ),
                ));
            }
            if ret == 0 {
                if op == Op::Write {
                    return Err(CufileError::Io {
                        call: format!("cuFileWrite({}, at offset {f_off})", self.name),
                        source: std::io::Error::from(std::io::ErrorKind::WriteZero),
                    });
                }
                break;
            }
            got += ret as usize;
        }
        Ok(got)
    }
}

impl Drop for FileHandle {
    fn drop(&mut self) {
        // SAFETY: this value registered the handle and no call through it is running (calls
        // borrow `self`); the descriptor is still open (closed after this, with `file`).
        unsafe { (self.driver.cufile().api().cuFileHandleDeregister)(self.raw) };
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Read,
    Write,
}

impl Op {
    fn call(self) -> &'static str {
        match self {
            Op::Read => "cuFileRead",
            Op::Write => "cuFileWrite",
        }
    }
}

/// A [`DeviceBuffer`] registered with cuFile (`cuFileBufRegister`), which lets true GDS DMA
/// straight into it; deregistered (`cuFileBufDeregister`) when dropped. Holds the buffer
/// through `R`: `&mut DeviceBuffer` for reads into it ([`BufferRegistration::buffer_mut`]),
/// `&DeviceBuffer` for writes from it, or an owner such as `Box<DeviceBuffer>`.
pub struct BufferRegistration<R: Deref<Target = DeviceBuffer>> {
    driver: Driver,
    buf: R,
}

impl<R: Deref<Target = DeviceBuffer>> fmt::Debug for BufferRegistration<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferRegistration")
            .field("buffer", &*self.buf)
            .finish()
    }
}

impl<R: Deref<Target = DeviceBuffer>> BufferRegistration<R> {
    /// Register all of `buf` (flags 0).
    pub fn new(driver: &Driver, buf: R) -> Result<BufferRegistration<R>, CufileError> {
        buf.context().make_current()?;
        let len = buf.len();
        // SAFETY: the address is the base of a live allocation of `len` bytes, which this
        // value holds (through `R`) until it deregisters it; flags must be 0.
        let status = unsafe {
            (driver.cufile().api().cuFileBufRegister)(buf.as_raw() as *const c_void, len, 0)
        };
        CufileError::check(status, || {
            format!(
                "cuFileBufRegister({len} bytes on GPU {})",
                buf.context().ordinal()
            )
        })?;
        Ok(BufferRegistration {
            driver: driver.clone(),
            buf,
        })
    }

    /// The registered buffer.
    pub fn buffer(&self) -> &DeviceBuffer {
        &self.buf
    }
}

impl<R: DerefMut<Target = DeviceBuffer>> BufferRegistration<R> {
    /// The registered buffer, writable (for [`FileHandle::read`]).
    pub fn buffer_mut(&mut self) -> &mut DeviceBuffer {
        &mut self.buf
    }
}

impl<R: Deref<Target = DeviceBuffer>> Drop for BufferRegistration<R> {
    fn drop(&mut self) {
        if let Err(e) = self.buf.context().make_current() {
            log::warn!("cuFileBufDeregister skipped: {e}");
            return;
        }
        // SAFETY: this value registered exactly this base address, and the buffer is still
        // allocated (held through `R`).
        let status = unsafe {
            (self.driver.cufile().api().cuFileBufDeregister)(self.buf.as_raw() as *const c_void)
        };
        if let Err(e) = CufileError::check(status, || "cuFileBufDeregister".to_string()) {
            log::warn!("{e}");
        }
    }
}
