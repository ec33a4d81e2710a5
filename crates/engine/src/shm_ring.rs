//! The shm control ring: the layout both agents map, its slot state machine and the doorbells.
//!
//! The initiator creates one ring memfd per shm connection (sealed against shrink/grow like every
//! shared memfd) and passes it with `ShmRing` on the unix socket; after that a transfer costs one
//! ring round trip instead of two socket round trips. The socket stays for set-up, fd passing,
//! notifications and liveness.
//!
//! Layout: a 4 KiB header (`magic`, `doorbell`, `target_sleeping`, the standing-lease table at
//! `STANDING_AT`), then `SLOTS` slots of
//! `SLOT_BYTES`. A slot: a 64-byte control block (`state`, `waiting`, `seq`, `kind`, `n_ops`,
//! `result_len`, `xfer`), the op table (`n_ops` × `OP_BYTES`), right after it the inline data
//! (the ops' bytes, packed in op order, from `data_at(n_ops)`), and at the slot's end a result
//! area (`RESULT_BYTES`: the body of a `ShmBeginResult`, encoded with the wire codec;
//! `result_len` 0: no op failed). The data follows the op table closely so that a one-op
//! request of a few bytes spans two adjacent cache lines (control block, op + data), which is
//! what the other side's core has to fetch per request. A short request (`KIND_SHORT`: one op
//! of up to `SHORT_MAX` bytes) fits in the control block alone: one line.
//!
//! Slot states (`state`): `FREE` → (initiator fills it) `POSTED` → (target checked every op;
//! inline ops copied; `BEGIN` ops leased) `DONE` → for `INLINE`: the initiator reads the
//! result (and the read data) and frees the slot; for `BEGIN`: the initiator copies through its
//! mappings and sets `END` → the target drops the slot's leases and sets `FREE`. Slots are used in
//! sequence order (`seq`), so the target needs no queue besides the slots.
//!
//! Everything the other side writes is untrusted: the target copies the control block and op
//! table out of shared memory once and checks them before acting (`read_request`); the initiator
//! decodes the result with the bounded wire decoder.
//!
//! Waiting: spin briefly, then sleep on a futex (shared, not `FUTEX_PRIVATE`: the word lives in
//! a memfd two processes map) with a short timeout, so a missed wake or a dead peer costs at most
//! one timeout before the waiter re-checks liveness.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

pub(crate) use crate::spin::spin_until;

use crate::error::{Error, Result};
use crate::mem::Mapping;
use crate::region::RegionKey;
use crate::wire::ShmOp;

/// Number of slots.
pub(crate) const SLOTS: usize = 128;
/// Bytes per slot.
pub(crate) const SLOT_BYTES: usize = 256 << 10;
/// The header before the slots.
pub(crate) const HEADER_BYTES: usize = 4096;
/// Total size of the ring memfd; the target accepts exactly this size.
pub(crate) const RING_BYTES: usize = HEADER_BYTES + SLOTS * SLOT_BYTES;
const CTRL_BYTES: usize = 64;
/// Room for the encoded `ShmBeginResult` body.
pub(crate) const RESULT_BYTES: usize = 64 << 10;
/// One op in the table: flags u32, pad u32, region u64, key u128, offset u64, len u64.
const OP_BYTES: usize = 48;
/// Most ops one slot carries (a larger transfer takes several slots).
pub(crate) const MAX_RING_OPS: usize = 1024;
const OPS_AT: usize = CTRL_BYTES;
const RESULT_AT: usize = SLOT_BYTES - RESULT_BYTES;
/// Inline data room per slot (whatever `n_ops`: the data of a full op table ends here too).
pub(crate) const DATA_BYTES: usize = RESULT_AT - data_at(MAX_RING_OPS);

// The figure docs/wire-protocol.md gives, and the layout fits its slot.
const _: () = assert!(DATA_BYTES == 147_392 && data_at(MAX_RING_OPS) + DATA_BYTES <= RESULT_AT);

/// Where the inline data of a request of `n` ops starts in its slot (16-byte aligned).
const fn data_at(n: usize) -> usize {
    (OPS_AT + n * OP_BYTES).next_multiple_of(16)
}

/// The indices `0..n` of a slot's ops (`&IDENTITY[..n]`), for the many calls that take the
/// ops of a slot as a list of indices, without building one per transfer.
pub(crate) static IDENTITY: [usize; MAX_RING_OPS] = {
    let mut a = [0; MAX_RING_OPS];
    let mut i = 0;
    while i < MAX_RING_OPS {
        a[i] = i;
        i += 1;
    }
    a
};
/// Largest op that travels inline (its bytes copied through the slot by both sides); larger
/// ops are leased in the ring and copied once through the initiator's mapping.
pub(crate) const INLINE_MAX: u64 = 16 << 10;

const MAGIC: u32 = 0x4758_5247; // "GRXG"

pub(crate) const FREE: u32 = 0;
pub(crate) const POSTED: u32 = 1;
pub(crate) const DONE: u32 = 2;
pub(crate) const END: u32 = 3;

/// Ops copied by the target through the slot.
pub(crate) const KIND_INLINE: u32 = 1;
/// Ops leased by the target and copied by the initiator through its mappings.
pub(crate) const KIND_BEGIN: u32 = 2;
/// One inline op of at most `SHORT_MAX` bytes, carried whole in the slot's control block: the
/// target's core fetches one cache line per request instead of two (the control block, then
/// the op table and data), which is most of what a small op costs past the flag round trip.
pub(crate) const KIND_SHORT: u32 = 3;
/// Largest op a short request carries (the room left in its control block).
pub(crate) const SHORT_MAX: usize = 8;
/// A short request's fields after `result_len`: the op's region, key and offset, then its
/// bytes (a write's, or a read's once the target answered).
const SHORT_REGION_AT: usize = 24;
const SHORT_KEY_AT: usize = 32;
const SHORT_OFFSET_AT: usize = 48;
const SHORT_DATA_AT: usize = 56;
/// In a short request's `n_ops` word: the op is a write (the low byte is its length).
const SHORT_WRITE: u32 = 1 << 8;
const _: () = assert!(SHORT_DATA_AT + SHORT_MAX == CTRL_BYTES);

/// Standing leases (the header's second KiB): the target holds a lease on one of its regions
/// for the connection, so the initiator copies (`cma`) without a `BEGIN` round trip. Per
/// entry: region id (two words), state, copies under way. The target writes the id, then
/// `STANDING_OPEN`; to end it, `STANDING_CLOSED`, then it waits for `busy` 0 before it lets the
/// region go. The initiator raises `busy`, then checks the state and id, copies, lowers
/// `busy`: both sides' first access is sequentially consistent, so either the initiator sees
/// the entry closed or the target sees the copy under way.
pub(crate) const STANDING_AT: usize = 1024;
/// Entries in the table.
pub(crate) const STANDING_MAX: usize = 64;
const STANDING_BYTES: usize = 16;
const _: () = assert!(STANDING_AT + STANDING_MAX * STANDING_BYTES <= HEADER_BYTES);
/// An entry the target holds a lease for.
pub(crate) const STANDING_OPEN: u32 = 1;
/// An entry the target let go of (it stays closed).
pub(crate) const STANDING_CLOSED: u32 = 2;

/// One standing-lease entry of the ring header ([`Ring::standing`]).
pub(crate) struct Standing<'a> {
    lo: &'a AtomicU32,
    hi: &'a AtomicU32,
    pub(crate) state: &'a AtomicU32,
    pub(crate) busy: &'a AtomicU32,
}

impl Standing<'_> {
    /// The entry's region (read after its state).
    pub(crate) fn region(&self) -> u64 {
        u64::from(self.lo.load(Ordering::Acquire))
            | (u64::from(self.hi.load(Ordering::Acquire)) << 32)
    }

    /// Target side: the entry now stands for `region` (`state` is set after).
    pub(crate) fn set_region(&self, region: u64) {
        self.lo.store(region as u32, Ordering::Release);
        self.hi.store((region >> 32) as u32, Ordering::Release);
    }

    /// Initiator side: starts a copy under the entry if it is open for `region`; the caller
    /// ends it with `leave` (also when this returns false).
    pub(crate) fn enter(&self, region: u64) -> bool {
        self.busy.fetch_add(1, Ordering::SeqCst);
        self.state.load(Ordering::SeqCst) == STANDING_OPEN && self.region() == region
    }

    /// Initiator side: the copy `enter` started is over.
    pub(crate) fn leave(&self) {
        self.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How long a waiter sleeps on the futex before it re-checks the peer.
pub(crate) const NAP: Duration = Duration::from_millis(2);

/// How long the target spins after its last request before it may sleep on the doorbell. Part
/// of the protocol: an initiator relies on it to skip the doorbell check for a post soon after
/// the previous one (`docs/wire-protocol.md`).
pub(crate) const TARGET_SPIN: Duration = Duration::from_micros(200);

/// A request as the target read it out of a slot (its own copy: the initiator cannot change it).
/// The ring thread keeps one and refills it per request (no allocation per request).
#[derive(Debug, Default)]
pub(crate) struct Request {
    pub(crate) seq: u32,
    pub(crate) kind: u32,
    pub(crate) xfer: u64,
    pub(crate) ops: Vec<ShmOp>,
    /// Offset of each op's inline bytes within the data area (inline requests).
    pub(crate) data_off: Vec<usize>,
    /// Ops the initiator withdrew after writing the request (its local copy failed): the target
    /// neither copies nor reports them.
    pub(crate) skip: Vec<bool>,
}

/// One side's view of a ring mapping.
#[derive(Debug)]
pub(crate) struct Ring {
    map: Mapping,
}

impl Ring {
    /// A fresh ring (initiator side): a sealed memfd of `RING_BYTES`, zeroed (every slot `FREE`).
    pub(crate) fn create() -> Result<Ring> {
        let map = Mapping::memfd_with(RING_BYTES, "ring", false)?;
        let r = Ring { map };
        r.word(0).store(MAGIC, Ordering::Release);
        Ok(r)
    }

    /// Maps a ring the initiator passed (target side), after checking its seals and size.
    pub(crate) fn attach(fd: std::os::fd::RawFd) -> Result<Ring> {
        let size = crate::mem::verify_memfd(fd, None, false)?;
        if size != RING_BYTES {
            return Err(Error::Protocol(format!(
                "shm ring of {size} bytes, expected {RING_BYTES}"
            )));
        }
        let map = Mapping::map_fd_with(fd, RING_BYTES, true, false)?;
        let r = Ring { map };
        if r.word(0).load(Ordering::Acquire) != MAGIC {
            return Err(Error::Protocol("shm ring without its magic".into()));
        }
        Ok(r)
    }

    pub(crate) fn fd(&self) -> Option<std::os::fd::RawFd> {
        self.map.fd()
    }

    /// The 32-bit word at byte `at` of the mapping.
    fn word(&self, at: usize) -> &AtomicU32 {
        debug_assert!(at.is_multiple_of(4) && at + 4 <= RING_BYTES);
        // SAFETY: `at` is 4-aligned and inside the mapping (all callers pass constants within
        // the header or a slot's control block); the mapping is page-aligned and lives as long
        // as `self`; the word is only ever accessed atomically by both processes.
        unsafe { &*self.map.ptr().add(at).cast::<AtomicU32>() }
    }

    fn slot_at(slot: usize) -> usize {
        HEADER_BYTES + (slot % SLOTS) * SLOT_BYTES
    }

    /// The doorbell the target sleeps on; bumped after every post and every `END`.
    pub(crate) fn doorbell(&self) -> &AtomicU32 {
        self.word(4)
    }

    /// Non-zero while the target sleeps on the doorbell.
    pub(crate) fn target_sleeping(&self) -> &AtomicU32 {
        self.word(8)
    }

    pub(crate) fn state(&self, slot: usize) -> &AtomicU32 {
        self.word(Self::slot_at(slot))
    }

    /// Standing lease `k`'s words (`STANDING_AT`): its region id (low, high), its state
    /// (`STANDING_OPEN` while the target holds the lease), and the initiator's copies under
    /// way.
    pub(crate) fn standing(&self, k: usize) -> Standing<'_> {
        let at = STANDING_AT + (k % STANDING_MAX) * STANDING_BYTES;
        Standing {
            lo: self.word(at),
            hi: self.word(at + 4),
            state: self.word(at + 8),
            busy: self.word(at + 12),
        }
    }

    /// Non-zero while the initiator sleeps on the slot's state.
    pub(crate) fn waiting(&self, slot: usize) -> &AtomicU32 {
        self.word(Self::slot_at(slot) + 4)
    }

    fn field(&self, slot: usize, at: usize) -> &AtomicU32 {
        self.word(Self::slot_at(slot) + at)
    }

    /// Pointer to byte `at` of slot `slot`.
    pub(crate) fn slot_ptr(&self, slot: usize, at: usize) -> *mut u8 {
        debug_assert!(at <= SLOT_BYTES);
        // SAFETY: the slot lies within the mapping and `at <= SLOT_BYTES`.
        unsafe { self.map.ptr().add(Self::slot_at(slot) + at) }
    }

    /// Pointer to inline data byte `off` of the request of `kind` and `n_ops` ops in `slot`: in
    /// the control block for a short request, else after the op table (`data_ptr`).
    pub(crate) fn request_data(&self, slot: usize, kind: u32, n_ops: usize, off: usize) -> *mut u8 {
        if kind == KIND_SHORT {
            return self.slot_ptr(slot, SHORT_DATA_AT + off.min(SHORT_MAX));
        }
        self.data_ptr(slot, n_ops, off)
    }

    /// Initiator: writes a short request (`KIND_SHORT`) for `op` into `slot`, with `data` (a
    /// write's bytes; empty for a read): the op first, its control fields last, just before
    /// the state is published. `op.len` is 1..=`SHORT_MAX` and, for a write, `data`'s length.
    pub(crate) fn write_short(&self, slot: usize, seq: u32, op: &ShmOp, data: &[u8]) {
        debug_assert!((1..=SHORT_MAX as u64).contains(&op.len));
        const R: usize = SHORT_REGION_AT;
        let mut b = [0u8; CTRL_BYTES - R];
        b[..8].copy_from_slice(&op.region.to_le_bytes());
        b[SHORT_KEY_AT - R..][..16].copy_from_slice(&op.key.0.to_le_bytes());
        b[SHORT_OFFSET_AT - R..][..8].copy_from_slice(&op.offset.to_le_bytes());
        let n = data.len().min(SHORT_MAX);
        b[SHORT_DATA_AT - R..][..n].copy_from_slice(&data[..n]);
        // SAFETY: [SHORT_REGION_AT, CTRL_BYTES) lies in the slot's control block; `b` is on the
        // stack, so the spans do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(b.as_ptr(), self.slot_ptr(slot, SHORT_REGION_AT), b.len())
        };
        let len = op.len.min(SHORT_MAX as u64) as u32;
        let flags = if op.write { SHORT_WRITE } else { 0 };
        self.field(slot, 8).store(seq, Ordering::Relaxed);
        self.field(slot, 12).store(KIND_SHORT, Ordering::Relaxed);
        self.field(slot, 16).store(len | flags, Ordering::Relaxed);
    }

    /// Target: a short request's op, copied out of the control block and checked.
    fn read_short(&self, slot: usize, req: &mut Request) -> Result<()> {
        let word = self.field(slot, 16).load(Ordering::Relaxed);
        let len = word & 0xff;
        if word & !(0xff | SHORT_WRITE) != 0 || len == 0 || len as usize > SHORT_MAX {
            return Err(Error::Protocol(format!(
                "shm ring short request word {word:#x} (length 1..={SHORT_MAX}, bit 8 write)"
            )));
        }
        let mut b = [0u8; SHORT_DATA_AT - SHORT_REGION_AT];
        // SAFETY: [SHORT_REGION_AT, SHORT_DATA_AT) lies in the slot's control block; `b` is
        // private (read out of shared memory once, then used).
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.slot_ptr(slot, SHORT_REGION_AT),
                b.as_mut_ptr(),
                b.len(),
            )
        };
        // Field offsets within `b`, as `write_short` lays them out.
        const R: usize = SHORT_REGION_AT;
        let u64_at = |at: usize| u64::from_le_bytes(b[at - R..][..8].try_into().unwrap_or([0; 8]));
        let key = u128::from_le_bytes(b[SHORT_KEY_AT - R..][..16].try_into().unwrap_or([0; 16]));
        req.ops.push(ShmOp {
            write: word & SHORT_WRITE != 0,
            region: u64_at(SHORT_REGION_AT),
            key: RegionKey(key),
            offset: u64_at(SHORT_OFFSET_AT),
            len: u64::from(len),
        });
        req.data_off.push(0);
        req.skip.push(false);
        Ok(())
    }

    /// Pointer to inline data byte `off` of slot `slot`, whose request has `n_ops` ops.
    pub(crate) fn data_ptr(&self, slot: usize, n_ops: usize, off: usize) -> *mut u8 {
        self.slot_ptr(slot, data_at(n_ops.min(MAX_RING_OPS)) + off.min(DATA_BYTES))
    }

    /// Initiator: writes the op table of a request into `slot` (free to reuse); the control
    /// block follows with `write_control`, right before the slot is posted.
    pub(crate) fn write_ops(&self, slot: usize, ops: impl Iterator<Item = ShmOp>) {
        for (j, op) in ops.take(MAX_RING_OPS).enumerate() {
            let mut e = [0u8; OP_BYTES];
            e[0..4].copy_from_slice(&u32::from(op.write).to_le_bytes());
            e[8..16].copy_from_slice(&op.region.to_le_bytes());
            e[16..32].copy_from_slice(&op.key.0.to_le_bytes());
            e[32..40].copy_from_slice(&op.offset.to_le_bytes());
            e[40..48].copy_from_slice(&op.len.to_le_bytes());
            // SAFETY: j < MAX_RING_OPS, so the entry lies in the slot's op table; `e` is on the
            // stack, so the spans do not overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    e.as_ptr(),
                    self.slot_ptr(slot, OPS_AT + j * OP_BYTES),
                    OP_BYTES,
                )
            };
        }
    }

    /// Initiator: the control block of the request whose ops `write_ops` wrote. Written last,
    /// just before the state: the target polls this cache line, and every store to it between
    /// two of its reads costs a transfer of the line between the cores, so the fields and the
    /// state land together.
    pub(crate) fn write_control(&self, slot: usize, seq: u32, kind: u32, n_ops: usize, xfer: u64) {
        self.field(slot, 8).store(seq, Ordering::Relaxed);
        self.field(slot, 12).store(kind, Ordering::Relaxed);
        self.field(slot, 16)
            .store(n_ops.min(MAX_RING_OPS) as u32, Ordering::Relaxed);
        self.field(slot, 24).store(xfer as u32, Ordering::Relaxed);
        self.field(slot, 28)
            .store((xfer >> 32) as u32, Ordering::Relaxed);
    }

    /// Initiator: withdraws op `j` of the request prepared in `slot` (before it is posted).
    pub(crate) fn skip_op(&self, slot: usize, j: usize) {
        if j < MAX_RING_OPS {
            let at = Self::slot_at(slot) + OPS_AT + j * OP_BYTES;
            let flags = self.word(at).load(Ordering::Relaxed);
            self.word(at).store(flags | 2, Ordering::Relaxed);
        }
    }

    /// Target: copies the request in `slot` out of shared memory into `req` and checks it.
    /// `Err` means the initiator broke the ring protocol (the connection is closed).
    pub(crate) fn read_request(&self, slot: usize, req: &mut Request) -> Result<()> {
        let seq = self.field(slot, 8).load(Ordering::Relaxed);
        let kind = self.field(slot, 12).load(Ordering::Relaxed);
        req.ops.clear();
        req.data_off.clear();
        req.skip.clear();
        if kind == KIND_SHORT {
            // No transfer id: the control block's room holds the op.
            req.seq = seq;
            req.kind = kind;
            req.xfer = 0;
            return self.read_short(slot, req);
        }
        let n = self.field(slot, 16).load(Ordering::Relaxed) as usize;
        let xfer = u64::from(self.field(slot, 24).load(Ordering::Relaxed))
            | (u64::from(self.field(slot, 28).load(Ordering::Relaxed)) << 32);
        if kind != KIND_INLINE && kind != KIND_BEGIN {
            return Err(Error::Protocol(format!("shm ring request of kind {kind}")));
        }
        if n == 0 || n > MAX_RING_OPS {
            return Err(Error::Protocol(format!(
                "shm ring request with {n} ops (1..={MAX_RING_OPS})"
            )));
        }
        req.seq = seq;
        req.kind = kind;
        req.xfer = xfer;
        let (ops, data_off, skip) = (&mut req.ops, &mut req.data_off, &mut req.skip);
        let mut total = 0usize;
        for j in 0..n {
            let mut c = [0u8; OP_BYTES];
            // SAFETY: j < n <= MAX_RING_OPS, so the entry lies in the slot's op table; `c` is
            // private (each entry is read out of shared memory once, then checked).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.slot_ptr(slot, OPS_AT + j * OP_BYTES),
                    c.as_mut_ptr(),
                    OP_BYTES,
                )
            };
            let u64_at = |i: usize| u64::from_le_bytes(c[i..i + 8].try_into().unwrap_or([0; 8]));
            let flags = u32::from_le_bytes(c[0..4].try_into().unwrap_or([0; 4]));
            if flags > 3 {
                return Err(Error::Protocol(format!("shm ring op flags {flags}")));
            }
            skip.push(flags & 2 != 0);
            let key = u128::from_le_bytes(c[16..32].try_into().unwrap_or([0; 16]));
            let op = ShmOp {
                write: flags & 1 != 0,
                region: u64_at(8),
                key: RegionKey(key),
                offset: u64_at(32),
                len: u64_at(40),
            };
            if kind == KIND_INLINE {
                let len = usize::try_from(op.len).unwrap_or(usize::MAX);
                if op.len > INLINE_MAX || total + len > DATA_BYTES {
                    return Err(Error::Protocol(format!(
                        "shm ring inline data beyond the slot ({} + {} > {DATA_BYTES})",
                        total, op.len
                    )));
                }
                data_off.push(total);
                total += len;
            }
            ops.push(op);
        }
        Ok(())
    }

    /// Target: stores the encoded result of `slot` (no errors: an empty result, nothing
    /// encoded).
    pub(crate) fn write_result(&self, slot: usize, errors: Vec<(u32, Error)>) {
        if errors.is_empty() {
            self.field(slot, 20).store(0, Ordering::Relaxed);
            return;
        }
        let mut body = encode_result(&errors);
        if body.len() > RESULT_BYTES {
            // Too many long messages: keep codes and arguments, drop the texts.
            let short = errors
                .into_iter()
                .map(|(i, e)| {
                    let (a, b, c) = e.wire_args();
                    (i, Error::from_wire(e.code(), a, b, c, String::new()))
                })
                .collect::<Vec<_>>();
            body = encode_result(&short);
        }
        let n = body.len().min(RESULT_BYTES);
        // SAFETY: the result area holds RESULT_BYTES from RESULT_AT; `n` is capped to it.
        unsafe { std::ptr::copy_nonoverlapping(body.as_ptr(), self.slot_ptr(slot, RESULT_AT), n) };
        self.field(slot, 20).store(n as u32, Ordering::Relaxed);
    }

    /// Initiator: whether the target reported any error for `slot` (a result to decode).
    pub(crate) fn has_result(&self, slot: usize) -> bool {
        self.field(slot, 20).load(Ordering::Relaxed) != 0
    }

    /// Initiator: decodes the result the target wrote into `slot` (bounded; untrusted).
    pub(crate) fn read_result(&self, slot: usize) -> Result<Vec<(u32, Error)>> {
        let n = self.field(slot, 20).load(Ordering::Relaxed) as usize;
        if n > RESULT_BYTES {
            return Err(Error::Protocol(format!("shm ring result of {n} bytes")));
        }
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut b = vec![0u8; n];
        // SAFETY: n <= RESULT_BYTES: the span lies in the slot's result area; `b` is private.
        unsafe { std::ptr::copy_nonoverlapping(self.slot_ptr(slot, RESULT_AT), b.as_mut_ptr(), n) };
        match crate::wire::decode_body(crate::wire::tag::SHM_BEGIN_RESULT, &b)? {
            crate::wire::Msg::ShmBeginResult { errors } => Ok(errors),
            _ => Err(Error::Protocol(
                "shm ring result is not a ShmBeginResult".into(),
            )),
        }
    }
}

fn encode_result(errors: &[(u32, Error)]) -> Vec<u8> {
    let frame = crate::wire::encode(
        &crate::wire::Msg::ShmBeginResult {
            errors: errors.to_vec(),
        },
        0,
    );
    frame[crate::wire::HEADER_LEN..].to_vec()
}

/// Sleeps while `word` holds `expected`, at most `timeout` (spurious returns are fine: callers
/// re-check).
pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = rustix::thread::futex::Timespec {
        tv_sec: timeout.as_secs() as _,
        tv_nsec: timeout.subsec_nanos() as _,
    };
    // FUTEX_WAIT, shared (no PRIVATE flag: the word is in a MAP_SHARED memfd mapping other
    // processes use); an error (EAGAIN: the word changed, EINTR, ETIMEDOUT) is a return too.
    let _ = rustix::thread::futex::wait(
        word,
        rustix::thread::futex::Flags::empty(),
        expected,
        Some(&ts),
    );
}

/// Wakes every waiter on `word`.
pub(crate) fn futex_wake(word: &AtomicU32) {
    let _ =
        rustix::thread::futex::wake(word, rustix::thread::futex::Flags::empty(), i32::MAX as u32);
}
