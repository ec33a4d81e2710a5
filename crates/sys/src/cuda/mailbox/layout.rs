//! The mailbox ring's layout and its "LL" word encoding, shared with `gdx_kernels.cu` (the
//! constants there must match these). Pure: unit-tested without a GPU.
//!
//! Every exchanged word is `flag << 32 | data`: 4 payload bytes and the low 32 bits of the op's
//! sequence number. An aligned 8-byte access is atomic over PCIe, so a word whose flag matches
//! the op is complete, and the reader needs no separate ready flag or fence.

/// Words of the control block before the first slot.
pub const CTL_WORDS: usize = 64;
/// Control word: the host sets it to non-zero to stop the kernel.
pub const CTL_STOP: usize = 0;
/// Control word: the host advances it; the kernel's watchdog watches it.
pub const CTL_HEARTBEAT: usize = 8;
/// Control word: the kernel's [`KernelState`].
pub const CTL_STATE: usize = 16;
/// Control word: ops the kernel served, written when it exits.
pub const CTL_SERVED: usize = 24;
/// Control word: the op and length of a refused request (`op << 32 | len`).
pub const CTL_DETAIL: usize = 32;

/// Header words of a request.
pub const HDR_WORDS: usize = 3;
/// Request words warp 0 reads in one poll: payloads of up to
/// `(POLL_WORDS - HDR_WORDS) * 4` bytes arrive with the header. (The host does not need it;
/// the tests check it against the kernel.)
#[allow(dead_code)]
pub const POLL_WORDS: usize = 32;

/// Op code of a host→GPU write.
pub const OP_WRITE: u32 = 1;
/// Op code of a GPU→host read.
pub const OP_READ: u32 = 2;

/// Kernel flag: publish a write's completion with `st.release.sys`.
pub const FLAG_RELEASE_DONE: u32 = 1;
/// Kernel flag: four staggered polls in flight per lane.
pub const FLAG_PIPELINED: u32 = 2;
/// Kernel flag: publish a write's completion after a GPU-scope fence (`__threadfence()`).
pub const FLAG_GPU_FENCE: u32 = 4;

/// Longest payload one op carries, bytes (8 KiB: past the measured crossover, so
/// `gdx calibrate` can find it).
pub const MAX_PAYLOAD: usize = 8192;
/// Payload words of a slot (4 data bytes each).
pub const MAX_WORDS: usize = MAX_PAYLOAD / 4;

/// What the kernel reports in [`CTL_STATE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelState {
    /// Not started yet (the word is still zero).
    NotStarted,
    /// Polling the ring.
    Running,
    /// Exited because the host set the stop word.
    Stopped,
    /// Exited because the host heartbeat stopped advancing.
    Watchdog,
    /// Exited on a request it could not serve (bad op or length; a bug).
    BadOp,
    /// A value this build does not know.
    Other(u64),
}

impl KernelState {
    /// From the control word.
    pub fn from_word(w: u64) -> KernelState {
        match w {
            0 => KernelState::NotStarted,
            1 => KernelState::Running,
            2 => KernelState::Stopped,
            3 => KernelState::Watchdog,
            4 => KernelState::BadOp,
            v => KernelState::Other(v),
        }
    }

    /// Whether the kernel has exited.
    pub fn exited(self) -> bool {
        !matches!(self, KernelState::NotStarted | KernelState::Running)
    }
}

const fn round16(w: usize) -> usize {
    (w + 15) & !15
}

/// Word offset of a slot's done word (from the slot's start).
pub const DONE_OFF: usize = round16(HDR_WORDS + MAX_WORDS);
/// Word offset of a slot's response words.
pub const RESP_OFF: usize = DONE_OFF + 16;
/// Words per slot.
pub const SLOT_WORDS: usize = round16(RESP_OFF + MAX_WORDS);

/// Words of a mapped buffer holding the control block and `nslots` slots.
pub const fn total_words(nslots: usize) -> usize {
    CTL_WORDS + nslots * SLOT_WORDS
}

/// The flag of op `seq` (its low 32 bits).
pub fn flag(seq: u64) -> u32 {
    seq as u32
}

/// An LL word: `flag << 32 | data`.
pub fn ll(flag: u32, data: u32) -> u64 {
    (u64::from(flag) << 32) | u64::from(data)
}

/// The flag of an LL word.
pub fn flag_of(w: u64) -> u32 {
    (w >> 32) as u32
}

/// The data of an LL word.
pub fn data_of(w: u64) -> u32 {
    w as u32
}

/// First word of slot for op `seq` (1-based), from the start of the buffer.
pub fn slot_base(seq: u64, nslots: usize) -> usize {
    CTL_WORDS + ((seq - 1) % nslots as u64) as usize * SLOT_WORDS
}

/// The three header words of op `seq`.
pub fn header(seq: u64, op: u32, len: u32, addr: u64) -> [u64; 3] {
    let f = flag(seq);
    [
        ll(f, (op << 24) | (len & 0x00ff_ffff)),
        ll(f, addr as u32),
        ll(f, (addr >> 32) as u32),
    ]
}

/// Number of payload words for `len` bytes.
pub fn payload_words(len: usize) -> usize {
    len.div_ceil(4)
}

/// Payload word `i` of `bytes` (little-endian, zero-padded at the tail).
pub fn pack_word(bytes: &[u8], i: usize) -> u32 {
    let mut b = [0u8; 4];
    let at = i * 4;
    let n = bytes.len().saturating_sub(at).min(4);
    b[..n].copy_from_slice(&bytes[at..at + n]);
    u32::from_le_bytes(b)
}

/// Write the bytes of payload word `i` (fewer at the tail) into `out`.
pub fn unpack_word(out: &mut [u8], i: usize, data: u32) {
    let at = i * 4;
    let n = out.len().saturating_sub(at).min(4);
    out[at..at + n].copy_from_slice(&data.to_le_bytes()[..n]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_matches_the_kernel() {
        // gdx_kernels.cu: done_off = round16(3 + max_words), resp_off = done_off + 16,
        // slot_words = round16(resp_off + max_words).
        assert_eq!(DONE_OFF, 2064);
        assert_eq!(RESP_OFF, 2080);
        assert_eq!(SLOT_WORDS, 4128);
        assert_eq!(SLOT_WORDS % 16, 0, "slots start on a 128-byte line");
        let src = include_str!("../../../kernels/gdx_kernels.cu");
        for (name, v) in [
            ("CTL_WORDS", CTL_WORDS),
            ("CTL_STOP", CTL_STOP),
            ("CTL_HEARTBEAT", CTL_HEARTBEAT),
            ("CTL_STATE", CTL_STATE),
            ("CTL_SERVED", CTL_SERVED),
            ("CTL_DETAIL", CTL_DETAIL),
            ("HDR_WORDS", HDR_WORDS),
            ("POLL_WORDS", POLL_WORDS),
        ] {
            assert!(
                src.contains(&format!("#define {name} {v}\n")),
                "{name} = {v} differs from gdx_kernels.cu"
            );
        }
        for (name, v) in [
            ("OP_WRITE", OP_WRITE),
            ("OP_READ", OP_READ),
            ("FLAG_RELEASE_DONE", FLAG_RELEASE_DONE),
            ("FLAG_PIPELINED", FLAG_PIPELINED),
            ("FLAG_GPU_FENCE", FLAG_GPU_FENCE),
        ] {
            let v = if name.starts_with("FLAG") {
                format!("{v}u")
            } else {
                v.to_string()
            };
            assert!(src.contains(&format!("#define {name} {v}\n")), "{name}");
        }
    }

    #[test]
    fn ops_go_round_the_ring_in_order() {
        assert_eq!(slot_base(1, 4), CTL_WORDS);
        assert_eq!(slot_base(2, 4), CTL_WORDS + SLOT_WORDS);
        assert_eq!(slot_base(5, 4), CTL_WORDS);
        assert_eq!(total_words(4), CTL_WORDS + 4 * SLOT_WORDS);
    }

    #[test]
    fn flags_tell_a_slot_s_uses_apart() {
        // A slot is reused every nslots ops; the flags of consecutive uses always differ, and
        // differ from zeroed memory, for the first 2^32 ops.
        for nslots in [1u64, 2, 32] {
            for seq in [1u64, 2, 31, 1 << 20, u64::from(u32::MAX) - 1] {
                assert_ne!(flag(seq), flag(seq + nslots));
                assert_ne!(flag(seq), 0);
            }
        }
    }

    #[test]
    fn headers_carry_op_length_and_address() {
        let h = header(7, OP_WRITE, 2048, 0x7f00_1234_5678);
        assert!(h.iter().all(|&w| flag_of(w) == 7));
        assert_eq!(data_of(h[0]) >> 24, OP_WRITE);
        assert_eq!(data_of(h[0]) & 0xff_ffff, 2048);
        let addr = u64::from(data_of(h[1])) | (u64::from(data_of(h[2])) << 32);
        assert_eq!(addr, 0x7f00_1234_5678);
    }

    #[test]
    fn payloads_pack_and_unpack_for_every_length() {
        for len in 0..=37usize {
            let bytes = gdx_base::pattern::pattern(len, 0xa5);
            let mut out = vec![0u8; len];
            for i in 0..payload_words(len) {
                unpack_word(&mut out, i, pack_word(&bytes, i));
            }
            assert_eq!(out, bytes, "len {len}");
        }
        assert_eq!(payload_words(0), 0);
        assert_eq!(payload_words(1), 1);
        assert_eq!(payload_words(MAX_PAYLOAD), MAX_WORDS);
        // The tail word is zero-padded.
        assert_eq!(pack_word(&[1, 2, 3, 4, 5], 1), 5);
    }

    #[test]
    fn kernel_states_read_from_the_word() {
        assert_eq!(KernelState::from_word(0), KernelState::NotStarted);
        assert_eq!(KernelState::from_word(1), KernelState::Running);
        assert!(KernelState::from_word(2).exited());
        assert_eq!(KernelState::from_word(3), KernelState::Watchdog);
        assert_eq!(KernelState::from_word(9), KernelState::Other(9));
        assert!(!KernelState::Running.exited());
    }
}
