//! The socket path of the shm transport: a transfer the ring does not carry (`Worker::run`:
//! `ShmBegin`, the copies, `ShmEnd`), the notification, and the copies themselves — once through
//! the mapped remote region (`copy_direct`), GPU to GPU through a CUDA IPC mapping
//! (`copy_ipc`), by the kernel between the processes (`cma.rs`), or twice through the bounce
//! buffer (`copy_staged`).

use std::os::fd::AsRawFd;

use super::ring;
use super::worker::{Worker, BOUNCE_BYTES};
use crate::error::{Error, Result};
use crate::gpu::{copy_span, Dir};
use crate::mem::Mapping;
use crate::region::LeaseKind;
use crate::routing::plan::Path;
use crate::transfer::{OpKind, XferState};
use crate::wire::{Msg, MAX_OPS_PER_BEGIN};

impl Worker {
    /// Runs one transfer (or fails it at once on a broken connection); true when this transfer
    /// broke the connection.
    pub(super) fn run_guarded(&mut self, xfer: &XferState) -> bool {
        if let Some(e) = &self.broken {
            xfer.fail_pending(e);
            return false;
        }
        match self.run(xfer) {
            Ok(()) => false,
            Err(e) => {
                xfer.fail_pending(&e);
                self.broken = Some(e);
                true
            }
        }
    }

    /// Runs one transfer; `Err` means the connection is unusable.
    fn run(&mut self, xfer: &XferState) -> Result<()> {
        let plans: Vec<Path> = xfer.paths().collect();
        let mut ok = vec![true; xfer.ops.len()];
        // Map every agent-allocated remote region once; learn where each borrowed one reached
        // by `cma` lies.
        for (i, op) in xfer.op_refs().enumerate() {
            let again = i > 0 && ok[i - 1] && xfer.op(i - 1).remote.id == op.remote.id;
            let (id, key, write) = (op.remote.id, op.remote.key, op.remote.access.remote_write);
            let r = match plans[i] {
                _ if again => Ok(()),
                Path::Shm if !self.maps.contains_key(&id) => self.map(id, key, write),
                Path::Cma if !self.cma_regions.contains_key(&id) => {
                    self.resolve_cma(id, key, op.kind == OpKind::Write)
                }
                _ => Ok(()),
            };
            if let Err(e) = r {
                if e.is_fatal_for_stream() {
                    return Err(e);
                }
                xfer.chunk_done(i, 0, Err(e));
                ok[i] = false;
            }
        }
        if ok.iter().all(|&k| k) {
            if let Some(r) = self.copy_standing(xfer) {
                return r;
            }
        }
        if self.run_ring(xfer, &plans, &ok)? {
            return Ok(());
        }
        let idx: Vec<usize> = (0..xfer.ops.len()).filter(|&i| ok[i]).collect();
        for batch in idx.chunks(MAX_OPS_PER_BEGIN) {
            let ops = ring::ring_ops(xfer, batch);
            let begin = self.request(&Msg::ShmBegin { xfer: xfer.id, ops })?;
            let Msg::ShmBeginResult { errors } = begin else {
                return Err(Error::Protocol("expected ShmBeginResult".into()));
            };
            let mut batch_ok = vec![true; batch.len()];
            for (j, e) in errors {
                let j = j as usize;
                if j >= batch.len() {
                    return Err(Error::Protocol("ShmBeginResult index out of range".into()));
                }
                batch_ok[j] = false;
                if matches!(e, Error::NoSuchRegion { .. } | Error::RegionGone { .. }) {
                    let gone = xfer.op(batch[j]).remote.id;
                    self.imports.remove(&gone);
                    self.maps.remove(&gone);
                    self.cma_regions.remove(&gone);
                }
                xfer.chunk_done(batch[j], 0, Err(e));
            }
            // The ipc ops move as one batched copy (`copy_ipc_ops`), the `cma` ops together in
            // as few system calls as the kernel takes, the others one by one.
            let ipc: Vec<usize> = (0..batch.len())
                .filter(|&j| batch_ok[j] && plans[batch[j]] == Path::Ipc)
                .map(|j| batch[j])
                .collect();
            let (mut done, fatal) = self.copy_ipc_ops(xfer, &ipc);
            if let Some(e) = fatal {
                return Err(e);
            }
            let cma: Vec<usize> = batch
                .iter()
                .zip(&batch_ok)
                .filter(|&(&i, &ok)| ok && plans[i] == Path::Cma)
                .map(|(&i, _)| i)
                .collect();
            if !cma.is_empty() {
                let (copied, fatal) = self.copy_cma(xfer, &cma);
                done.extend(copied);
                if let Some(e) = fatal {
                    return Err(e);
                }
            }
            for (j, &i) in batch.iter().enumerate() {
                if !batch_ok[j] || matches!(plans[i], Path::Cma | Path::Ipc) {
                    continue;
                }
                if let Some(e) = xfer.halt() {
                    xfer.chunk_done(i, 0, Err(e));
                    continue;
                }
                let r = match plans[i] {
                    Path::Shm => self.copy_direct(xfer, i),
                    _ => self.copy_staged(xfer, i),
                };
                match r {
                    Ok(()) => done.push(i),
                    Err(e) if e.is_fatal_for_stream() => return Err(e),
                    Err(e) => xfer.chunk_done(i, 0, Err(e)),
                }
            }
            let last = batch.last() == idx.last();
            let notify = if last { xfer.notification() } else { None };
            if notify.is_none() {
                // The bytes are in place once the copies above were waited for; the target's
                // reply only says its leases ended. It is read before the next request on this
                // connection (`request`), not waited for here: one round trip less per transfer.
                self.conn.send(&Msg::ShmEnd {
                    xfer: xfer.id,
                    notify,
                })?;
                self.end_unread = true;
                for i in done {
                    xfer.chunk_done(i, xfer.ops[i].len, Ok(()));
                }
                continue;
            }
            match self.request(&Msg::ShmEnd {
                xfer: xfer.id,
                notify,
            }) {
                Ok(Msg::Ok) => {}
                // The target refused the notification (its queue is full): the bytes are in
                // place but the transfer did not complete as asked; the connection is fine.
                Err(e) if !e.is_fatal_for_stream() => {
                    for i in done {
                        xfer.chunk_done(i, 0, Err(e.clone()));
                    }
                    continue;
                }
                Err(e) => return Err(e),
                Ok(m) => {
                    return Err(Error::Protocol(format!(
                        "expected Ok to ShmEnd, got frame type {}",
                        m.kind()
                    )))
                }
            }
            for i in done {
                xfer.chunk_done(i, xfer.ops[i].len, Ok(()));
            }
        }
        Ok(())
    }

    /// A request on the socket, after the reply to an earlier `ShmEnd` sent without waiting
    /// (its error, if any, is logged: that transfer's bytes were in place and it completed).
    pub(super) fn request(&mut self, msg: &Msg) -> Result<Msg> {
        if self.end_unread {
            self.end_unread = false;
            match self.conn.recv_frame(false)? {
                (Msg::Ok, 0) => {}
                (Msg::Err(e), _) if !e.is_fatal_for_stream() => {
                    log::warn!("the target answered a finished transfer's ShmEnd with: {e}");
                }
                (Msg::Err(e), _) => return Err(e),
                (m, _) => {
                    return Err(Error::Protocol(format!(
                        "expected Ok to ShmEnd, got frame type {}",
                        m.kind()
                    )))
                }
            }
        }
        match self.current.clone() {
            None => self.conn.request(msg),
            Some(x) => {
                self.conn.send(msg)?;
                self.reply_or_halt(&x)?;
                match self.conn.recv_frame(false)? {
                    (Msg::Err(e), _) => Err(e),
                    (_, p) if p > 0 => Err(Error::Protocol("unexpected payload on a reply".into())),
                    (m, _) => Ok(m),
                }
            }
        }
    }

    /// Waits for the reply to a request made for `x`, until the I/O timeout, or until `x`
    /// halted (cancelled, past its deadline) and the peer stayed silent for `HALT_GRACE`
    /// more: then `x`'s ops fail with the halt's error and the wait fails with `PeerLost`,
    /// which closes the connection (the peer may still act on the request when it resumes).
    fn reply_or_halt(&self, x: &XferState) -> Result<()> {
        let until = std::time::Instant::now() + self.wait;
        let mut halted: Option<std::time::Instant> = None;
        loop {
            if self.conn.wait_input(super::ring_client::HALT_LOOK) {
                return Ok(());
            }
            if std::time::Instant::now() >= until {
                return Err(Error::peer_lost(
                    "shm connection: no answer within the I/O timeout",
                ));
            }
            if let Some(e) = x.halt() {
                let since = *halted.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() >= super::ring_client::HALT_GRACE {
                    x.fail_pending(&e);
                    return Err(Error::peer_lost(format!(
                        "the shm peer did not answer transfer {} before it ended ({e}); the \
                         connection is closed, since the peer may still act on the request",
                        x.id
                    )));
                }
            }
        }
    }

    /// Delivers the notification of a transfer that ran on the ring (its bytes are in place).
    pub(super) fn send_notify(&mut self, xfer: &XferState, n: Vec<u8>) -> Result<()> {
        match self.request(&Msg::ShmEnd {
            xfer: xfer.id,
            notify: Some(n),
        }) {
            Ok(Msg::Ok) => Ok(()),
            // The target refused it (queue full): the connection is fine, the transfer failed.
            Err(e) if !e.is_fatal_for_stream() => {
                xfer.fail_transfer(e);
                Ok(())
            }
            Err(e) => Err(e),
            Ok(m) => Err(Error::Protocol(format!(
                "expected Ok to ShmEnd, got frame type {}",
                m.kind()
            ))),
        }
    }

    /// `ShmMap`: the fd the target passes for a region (its memfd, or a VMM GPU region's POSIX
    /// fd), with the length to map and whether it is writable.
    pub(super) fn request_fd(
        &mut self,
        region: u64,
        key: crate::region::RegionKey,
        write: bool,
        piece: u32,
    ) -> Result<(std::os::fd::OwnedFd, u64, bool)> {
        match self.request(&Msg::ShmMap {
            region,
            key,
            write,
            piece,
        })? {
            Msg::ShmMapped { len, writable } => {
                let fd = self
                    .conn
                    .take_fd()
                    .ok_or_else(|| Error::Protocol("ShmMapped without an fd".into()))?;
                Ok((fd, len, writable))
            }
            m => Err(Error::Protocol(format!(
                "expected ShmMapped, got frame type {}",
                m.kind()
            ))),
        }
    }

    fn map(&mut self, region: u64, key: crate::region::RegionKey, write: bool) -> Result<()> {
        let (fd, len, writable) = self.request_fd(region, key, write, 0)?;
        let len = usize::try_from(len).map_err(|_| Error::Protocol("mapping too large".into()))?;
        // Sealed against shrink (no SIGBUS if the target truncates it) and at least `len`
        // bytes, checked before the mapping exists.
        crate::mem::verify_memfd(fd.as_raw_fd(), Some(len), !writable)?;
        let m = Mapping::map_fd(fd.as_raw_fd(), len, writable)?;
        self.maps.insert(region, (m, writable));
        Ok(())
    }

    fn copy_direct(&mut self, xfer: &XferState, i: usize) -> Result<()> {
        let op = xfer.op(i);
        let (m, writable) = self.maps.get(&op.remote.id).ok_or(Error::NoSuchRegion {
            region: op.remote.id,
        })?;
        crate::region::check_bounds(op.remote_offset, op.len, m.len() as u64)?;
        // SAFETY: remote_offset + len <= m.len() (checked above).
        let remote = unsafe { m.ptr().add(op.remote_offset as usize) };
        let (kind, dir) = match op.kind {
            OpKind::Write if !writable => {
                return Err(Error::ReadOnly {
                    region: op.remote.id,
                })
            }
            OpKind::Write => (LeaseKind::Source, Dir::OutOfRegion),
            OpKind::Read => (LeaseKind::Sink, Dir::IntoRegion),
        };
        let lease = op.local.lease(kind, self.wait)?;
        // SAFETY: the remote span is checked above, mapped (writable for a write) and leased by
        // the target since ShmBegin; the local span was bounds-checked at submit and is held by
        // the lease; distinct mappings do not overlap.
        unsafe { copy_span(&lease, op.local_offset, remote, op.len as usize, dir) }
    }

    /// The `ipc` path: the remote GPU region mapped through its CUDA IPC handle (once per
    /// allocation, cached by the local peer), copied while the target holds the leases taken
    /// by `ShmBegin`: GPU to GPU, or, for a host region here, between that memory page-locked
    /// in place (once per region) and the mapped GPU memory, one copy on the copy engine.
    pub(super) fn copy_ipc(&mut self, xfer: &XferState, i: usize) -> Result<()> {
        let op = xfer.op(i);
        let (peer, pieces) = self.ipc_mapping(xfer, i)?;
        let ipc = op.remote.ipc.as_ref().ok_or_else(|| {
            Error::unavailable(
                Path::Ipc,
                format!("remote region {} has no IPC handle", op.remote.id),
            )
        })?;
        let kind = match op.kind {
            OpKind::Write => LeaseKind::Source,
            OpKind::Read => LeaseKind::Sink,
        };
        let lease = op.local.lease(kind, self.wait)?;
        // The mapping is the whole allocation (or its pieces, back to back); the region starts
        // `ipc.offset` bytes into it. An op that crosses pieces is one copy per piece.
        let start = ipc.offset + op.remote_offset;
        let end = start + op.len;
        // Every piece's copy is queued before any is waited for, so pieces overlap.
        let mut queued = Vec::new();
        for (at, remote) in &pieces {
            let (lo, hi) = (start.max(*at), end.min(at + remote.len()));
            if lo >= hi {
                continue;
            }
            let (local_offset, remote_offset, len) =
                (op.local_offset + (lo - start), lo - at, hi - lo);
            let Some(dev) = op.local.device() else {
                op.local.pin_for_dma(&peer, remote.gpu())?;
                let p = lease.ptr_at(local_offset)?;
                match op.kind {
                    OpKind::Write => {
                        // SAFETY: the lease holds the local span (bounds-checked at submit) as
                        // a source; nothing writes it while the lease is held.
                        let bytes =
                            unsafe { std::slice::from_raw_parts(p.cast_const(), len as usize) };
                        peer.upload(remote, remote_offset, bytes)?;
                    }
                    OpKind::Read => {
                        // SAFETY: the lease holds the local span (bounds-checked at submit) as
                        // a sink, so nothing else reads or writes it meanwhile.
                        let out = unsafe { std::slice::from_raw_parts_mut(p, len as usize) };
                        peer.download(remote, remote_offset, out)?;
                    }
                }
                continue;
            };
            // `transfer` (not `copy_blocking`): large copies split over several copy engines,
            // as between two GPUs of one process.
            let t = match op.kind {
                OpKind::Write => {
                    peer.transfer(remote, remote_offset, &dev.region, local_offset, len)
                }
                OpKind::Read => {
                    peer.transfer(&dev.region, local_offset, remote, remote_offset, len)
                }
            };
            match t {
                Ok(t) => queued.push(t),
                Err(e) => {
                    // The pieces already queued finish before the target's leases end.
                    for t in queued {
                        let _ = t.wait();
                    }
                    return Err(e);
                }
            }
        }
        let mut first = Ok(());
        for t in queued {
            if let Err(e) = t.wait() {
                first = first.and(Err(e));
            }
        }
        first
    }

    fn copy_staged(&mut self, xfer: &XferState, i: usize) -> Result<()> {
        let op = xfer.op(i);
        let write = op.kind == OpKind::Write;
        let lease = op.local.lease(
            if write {
                LeaseKind::Source
            } else {
                LeaseKind::Sink
            },
            self.wait,
        )?;
        let mut off = 0u64;
        while off < op.len {
            let len = (op.len - off).min(BOUNCE_BYTES as u64);
            let local_off = op.local_offset + off;
            if write {
                // SAFETY: len <= bounce size; the bounce buffer is this worker's own mapping; the
                // local span lies within the leased, bounds-checked op span.
                unsafe {
                    copy_span(
                        &lease,
                        local_off,
                        self.bounce.ptr(),
                        len as usize,
                        Dir::OutOfRegion,
                    )?
                };
            }
            let msg = Msg::ShmStaged {
                xfer: xfer.id,
                op: i as u32,
                write,
                region: op.remote.id,
                key: op.remote.key,
                offset: op.remote_offset + off,
                len,
            };
            match self.request(&msg)? {
                Msg::Ok => {}
                m => {
                    return Err(Error::Protocol(format!(
                        "expected Ok to ShmStaged, got frame type {}",
                        m.kind()
                    )))
                }
            }
            if !write {
                // SAFETY: as above, from the bounce buffer into the local span.
                unsafe {
                    copy_span(
                        &lease,
                        local_off,
                        self.bounce.ptr(),
                        len as usize,
                        Dir::IntoRegion,
                    )?
                };
            }
            off += len;
        }
        Ok(())
    }
}
