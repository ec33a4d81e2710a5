//! The wire protocol: versioned, length-prefixed frames (see `docs/wire-protocol.md`).
//!
//! A frame is a 16-byte header, a body of `body_len` bytes (one [`Msg`]) and, for data frames, a raw
//! payload of `payload_len` bytes that the receiver moves straight into registered memory.
//! This module is a pure codec: [`decode_header`] and [`decode_body`] never panic and never allocate
//! more than the input justifies, whatever bytes they are given (fuzzed and property-tested).

use crate::error::{Error, Result};
use crate::region::{RegionDesc, RegionKey};

// The wire form of an error lives with the errors (the codec depends on them, not back).
pub use crate::error::RemoteError;

/// First two bytes of every frame: `"GX"`.
pub const MAGIC: u16 = 0x4758;
/// The protocol version this build speaks.
pub const VERSION: u8 = 7;
/// Size of the fixed frame header.
pub const HEADER_LEN: usize = 16;
/// Largest frame body accepted (1 MiB).
pub const MAX_BODY: u32 = 1 << 20;
/// Largest payload accepted after one frame (64 MiB); larger ops are chunked.
pub const MAX_PAYLOAD: u32 = 64 << 20;
/// Largest string inside a body.
pub(crate) const MAX_STR: usize = 4096;
/// Most ops in one `ShmBegin` (and errors in one `ShmBeginResult`); more is `Malformed`.
pub const MAX_OPS_PER_BEGIN: usize = 8192;
/// Highest frame type this version knows.
pub const MAX_KIND: u8 = tag::MAX;

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Message type.
    pub kind: u8,
    /// Body length in bytes (≤ [`MAX_BODY`]).
    pub body_len: u32,
    /// Raw payload length after the body (≤ [`MAX_PAYLOAD`]).
    pub payload_len: u32,
}

/// What a peer said in its handshake.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Hello {
    /// Agent name.
    pub agent_name: String,
    /// Random agent id (fresh per process).
    pub agent_id: u128,
    /// Host id (same value means same kernel: shared memory can work).
    pub host_id: u128,
    /// Transports enabled, bit 0 tcp, bit 1 shm.
    pub transports: u32,
    /// Abstract unix socket name for shm, if shm is enabled.
    pub shm_socket: Option<String>,
    /// Address the agent accepts connections on, if it listens.
    pub listen: Option<String>,
    /// Session id (set in the acceptor's reply).
    pub session: u128,
    /// Session token data streams must present (set in the acceptor's reply).
    pub token: u128,
    /// Number of tcp data streams the initiator will open.
    pub streams: u16,
    /// The initiator's fresh random nonce for the challenge–response (0 in the acceptor's
    /// reply, which comes after authentication).
    pub nonce: u128,
    /// The cluster the agent was published in (empty: none). In the acceptor's reply it is
    /// covered by the identity tag, so a caller that asked for an agent of one cluster is never
    /// served by a namesake of another.
    pub cluster: String,
}

/// Most entries of one [`Msg::WriteBatch`] or [`Msg::ReadBatch`]: with the frame's head, one
/// `sendmsg` of at most 1,024 spans (the kernel's `UIO_MAXIOV`).
pub const MAX_BATCH_ENTRIES: usize = 1023;

/// One op chunk inside a [`Msg::WriteBatch`] or [`Msg::ReadBatch`] (a `Write`'s or `Read`'s
/// fields, the length explicit since the bytes of several share the payload).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchEntry {
    /// The op's index in its transfer.
    pub op: u32,
    /// The chunk's index in its op.
    pub chunk: u32,
    /// Target region id.
    pub region: u64,
    /// Key presented.
    pub key: RegionKey,
    /// Offset in the target region.
    pub offset: u64,
    /// Length.
    pub len: u32,
}

/// One op inside an [`Msg::ShmBegin`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShmOp {
    /// True when bytes go into the target region.
    pub write: bool,
    /// Target region id.
    pub region: u64,
    /// Key presented.
    pub key: RegionKey,
    /// Offset in the target region.
    pub offset: u64,
    /// Length.
    pub len: u64,
}

/// Every message of the protocol. Frame type numbers are listed in `docs/wire-protocol.md`.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub enum Msg {
    Hello(Hello),
    Join {
        session: u128,
        token: u128,
        stream: u16,
        nonce: u128,
    },
    Ok,
    Err(Error),
    GetRegion {
        name: String,
    },
    Region(RegionDesc),
    ListRegions,
    Regions(Vec<RegionDesc>),
    Write {
        xfer: u64,
        op: u32,
        chunk: u32,
        region: u64,
        key: RegionKey,
        offset: u64,
    },
    WriteAck {
        xfer: u64,
        op: u32,
        chunk: u32,
    },
    Read {
        xfer: u64,
        op: u32,
        chunk: u32,
        region: u64,
        key: RegionKey,
        offset: u64,
        len: u32,
    },
    ReadData {
        xfer: u64,
        op: u32,
        chunk: u32,
    },
    OpErr {
        xfer: u64,
        op: u32,
        chunk: u32,
        err: Error,
    },
    Notify {
        xfer: u64,
        data: Vec<u8>,
    },
    ShmJoin {
        session: u128,
        token: u128,
        nonce: u128,
    },
    ShmMap {
        region: u64,
        key: RegionKey,
        write: bool,
        /// For a GPU region shared as VMM pieces: which piece's fd (0 otherwise).
        piece: u32,
    },
    ShmMapped {
        len: u64,
        writable: bool,
    },
    ShmBegin {
        xfer: u64,
        ops: Vec<ShmOp>,
    },
    ShmBeginResult {
        errors: Vec<(u32, Error)>,
    },
    ShmStaged {
        xfer: u64,
        op: u32,
        write: bool,
        region: u64,
        key: RegionKey,
        offset: u64,
        len: u64,
    },
    ShmEnd {
        xfer: u64,
        notify: Option<Vec<u8>>,
    },
    Bye,
    /// The initiator's RDMA connection data (`gdx_rdma::ConnData` bytes); the target answers
    /// with its own in the same message, or `Err`.
    RdmaConnect {
        data: Vec<u8>,
    },
    /// Asks for the RDMA address and rkey of a region (checked like any op: key and access).
    RdmaRegion {
        region: u64,
        key: RegionKey,
        write: bool,
    },
    /// `RdmaRegion` for one rail: the region's registration on the target's device `device`
    /// (the rail's remote end), answered by `RdmaRegionInfo` or `Err`.
    RdmaRegionOn {
        region: u64,
        key: RegionKey,
        device: String,
    },
    /// The answer to `RdmaRegion`: where the region is in the target's registration, its rkey
    /// and the registration mechanism (host ibv_reg_mr, dma-buf, peermem).
    RdmaRegionInfo {
        addr: u64,
        len: u64,
        rkey: u32,
        mechanism: String,
    },
    /// The acceptor's half of the challenge–response: its nonce and its proof.
    Challenge {
        nonce: u128,
        mac: [u8; 32],
    },
    /// The initiator's proof.
    Auth {
        mac: [u8; 32],
    },
    /// The initiator's libfabric endpoint address (`fi_getname` bytes); the target inserts it
    /// into its address vector and answers with its own in the same message, or `Err`.
    FabricConnect {
        addr: Vec<u8>,
    },
    /// Asks for the fabric MR of a region (checked like any op: key and access).
    FabricRegion {
        region: u64,
        key: RegionKey,
    },
    /// The answer to `FabricRegion`: the address of the region's byte 0 in the provider's
    /// addressing (virtual address under FI_MR_VIRT_ADDR, else 0), its length and MR key.
    FabricRegionInfo {
        addr: u64,
        len: u64,
        mr_key: u64,
    },
    /// Shm: attaches the control ring (its memfd travels with the frame); `slots` and
    /// `slot_bytes` must match the target's layout (`shm_ring.rs`).
    ShmRing {
        slots: u32,
        slot_bytes: u32,
    },
    /// Shm: asks the target to let this initiator copy straight into and out of its borrowed
    /// host regions (`cma`); answered by `ShmCmaProbe` or `Err` (declined, with why).
    ShmCmaGrant,
    /// The answer to `ShmCmaGrant`: where in the target's memory a 16-byte probe holds `value`,
    /// for the initiator to read with `process_vm_readv` (the kernel's verdict, and proof that
    /// the socket's peer pid is the target).
    ShmCmaProbe {
        addr: u64,
        value: u128,
    },
    /// Asks for a borrowed host region's address in the target's memory (checked like any op:
    /// key and access); answered by `ShmCmaAddr` or `Err`.
    ShmCmaRegion {
        region: u64,
        key: RegionKey,
        write: bool,
    },
    /// The answer to `ShmCmaRegion`: the region's byte 0 in the target's address space.
    ShmCmaAddr {
        addr: u64,
        len: u64,
        writable: bool,
    },
    /// A data stream's batch of write chunks (a block list): the payload is their bytes back
    /// to back; answered by one `WriteBatchAck` once every accepted one landed.
    WriteBatch {
        xfer: u64,
        entries: Vec<BatchEntry>,
    },
    /// The answer to `WriteBatch`: the entries refused (index into the batch, why); the rest
    /// landed.
    WriteBatchAck {
        xfer: u64,
        errors: Vec<(u32, Error)>,
    },
    /// A data stream's batch of read chunks; answered by one `ReadBatchData`.
    ReadBatch {
        xfer: u64,
        entries: Vec<BatchEntry>,
    },
    /// The answer to `ReadBatch`: the entries refused; the payload is the bytes of the others,
    /// back to back in batch order.
    ReadBatchData {
        xfer: u64,
        errors: Vec<(u32, Error)>,
    },
    /// The acceptor's answer to a control `Hello`: its nonce and its SPAKE2 message.
    Pake {
        nonce: u128,
        msg: [u8; 33],
    },
    /// The initiator's SPAKE2 message and its key confirmation.
    PakeAuth {
        msg: [u8; 33],
        mac: [u8; 32],
    },
}

impl Msg {
    /// The frame type number.
    pub fn kind(&self) -> u8 {
        match self {
            Msg::Hello(_) => tag::HELLO,
            Msg::Join { .. } => tag::JOIN,
            Msg::Ok => tag::OK,
            Msg::Err(_) => tag::ERR,
            Msg::GetRegion { .. } => tag::GET_REGION,
            Msg::Region(_) => tag::REGION,
            Msg::ListRegions => tag::LIST_REGIONS,
            Msg::Regions(_) => tag::REGIONS,
            Msg::Write { .. } => tag::WRITE,
            Msg::WriteAck { .. } => tag::WRITE_ACK,
            Msg::Read { .. } => tag::READ,
            Msg::ReadData { .. } => tag::READ_DATA,
            Msg::OpErr { .. } => tag::OP_ERR,
            Msg::Notify { .. } => tag::NOTIFY,
            Msg::ShmJoin { .. } => tag::SHM_JOIN,
            Msg::ShmMap { .. } => tag::SHM_MAP,
            Msg::ShmMapped { .. } => tag::SHM_MAPPED,
            Msg::ShmBegin { .. } => tag::SHM_BEGIN,
            Msg::ShmBeginResult { .. } => tag::SHM_BEGIN_RESULT,
            Msg::ShmStaged { .. } => tag::SHM_STAGED,
            Msg::ShmEnd { .. } => tag::SHM_END,
            Msg::Bye => tag::BYE,
            Msg::RdmaConnect { .. } => tag::RDMA_CONNECT,
            Msg::RdmaRegion { .. } => tag::RDMA_REGION,
            Msg::RdmaRegionInfo { .. } => tag::RDMA_REGION_INFO,
            Msg::Challenge { .. } => tag::CHALLENGE,
            Msg::Auth { .. } => tag::AUTH,
            Msg::FabricConnect { .. } => tag::FABRIC_CONNECT,
            Msg::FabricRegion { .. } => tag::FABRIC_REGION,
            Msg::FabricRegionInfo { .. } => tag::FABRIC_REGION_INFO,
            Msg::ShmRing { .. } => tag::SHM_RING,
            Msg::ShmCmaGrant => tag::SHM_CMA_GRANT,
            Msg::ShmCmaProbe { .. } => tag::SHM_CMA_PROBE,
            Msg::ShmCmaRegion { .. } => tag::SHM_CMA_REGION,
            Msg::ShmCmaAddr { .. } => tag::SHM_CMA_ADDR,
            Msg::WriteBatch { .. } => tag::WRITE_BATCH,
            Msg::WriteBatchAck { .. } => tag::WRITE_BATCH_ACK,
            Msg::ReadBatch { .. } => tag::READ_BATCH,
            Msg::ReadBatchData { .. } => tag::READ_BATCH_DATA,
            Msg::RdmaRegionOn { .. } => tag::RDMA_REGION_ON,
            Msg::Pake { .. } => tag::PAKE,
            Msg::PakeAuth { .. } => tag::PAKE_AUTH,
        }
    }

    /// Whether a frame of this type may carry a payload.
    fn allows_payload(kind: u8) -> bool {
        tag::WITH_PAYLOAD.contains(&kind)
    }
}

/// Decodes and validates a header: magic, version, type range and both size limits.
pub fn decode_header(b: &[u8; HEADER_LEN]) -> Result<Header> {
    let magic = u16::from_le_bytes([b[0], b[1]]);
    if magic != MAGIC {
        return Err(Error::BadMagic(magic));
    }
    if b[2] != VERSION {
        return Err(Error::UnknownVersion(b[2]));
    }
    let kind = b[3];
    if !(1..=MAX_KIND).contains(&kind) {
        return Err(Error::UnknownFrame(kind));
    }
    let body_len = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let payload_len = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
    if body_len > MAX_BODY {
        return Err(Error::FrameTooLarge {
            len: body_len.into(),
            limit: MAX_BODY.into(),
        });
    }
    if payload_len > MAX_PAYLOAD {
        return Err(Error::FrameTooLarge {
            len: payload_len.into(),
            limit: MAX_PAYLOAD.into(),
        });
    }
    if payload_len > 0 && !Msg::allows_payload(kind) {
        return Err(Error::Malformed(format!(
            "frame type {kind} cannot carry a payload"
        )));
    }
    Ok(Header {
        kind,
        body_len,
        payload_len,
    })
}

/// Encodes `msg` as header + body, announcing `payload_len` payload bytes to follow.
pub fn encode(msg: &Msg, payload_len: u32) -> Vec<u8> {
    let mut out = vec![0u8; HEADER_LEN];
    put_body(&mut out, msg);
    let body_len = (out.len() - HEADER_LEN) as u32;
    out[0..2].copy_from_slice(&MAGIC.to_le_bytes());
    out[2] = VERSION;
    out[3] = msg.kind();
    out[4..8].copy_from_slice(&body_len.to_le_bytes());
    out[8..12].copy_from_slice(&payload_len.to_le_bytes());
    out
}

/// Decodes a whole frame from `buf`: `Ok(None)` if more bytes are needed, else the message, the
/// payload length that follows, and the bytes consumed (header + body).
pub fn decode_frame(buf: &[u8]) -> Result<Option<(Msg, u32, usize)>> {
    let Some(h) = buf.first_chunk::<HEADER_LEN>() else {
        return Ok(None);
    };
    let h = decode_header(h)?;
    let end = HEADER_LEN + h.body_len as usize;
    if buf.len() < end {
        return Ok(None);
    }
    let msg = decode_body(h.kind, &buf[HEADER_LEN..end])?;
    Ok(Some((msg, h.payload_len, end)))
}

mod body;
pub mod tag;

pub use body::decode_body;
use body::put_body;
pub(crate) use body::{get_desc, put_desc, Reader};

// The text form of a region descriptor (`gdx1:<hex>`) is its wire encoding.
impl std::fmt::Display for RegionDesc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut buf = Vec::new();
        put_desc(&mut buf, self);
        f.write_str("gdx1:")?;
        for b in buf {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for RegionDesc {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let hex = s
            .trim()
            .strip_prefix("gdx1:")
            .ok_or_else(|| Error::InvalidArgument("region token must start with gdx1:".into()))?;
        if hex.len() % 2 != 0 || hex.len() > 2 * 4096 {
            return Err(Error::InvalidArgument("bad region token length".into()));
        }
        let bytes = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
            .collect::<std::result::Result<Vec<u8>, _>>()
            .map_err(|e| Error::InvalidArgument(format!("bad region token: {e}")))?;
        let mut r = Reader::new(&bytes);
        let d = get_desc(&mut r)?;
        r.finish()?;
        Ok(d)
    }
}
