//! Every frame type's number, once: the encoder ([`Msg::kind`](super::Msg::kind)), the decoder
//! ([`decode_body`](super::decode_body)) and the header check read them from here, and a test
//! holds `docs/wire-protocol.md`'s "Messages" table to [`ALL`]. The numbers are the protocol: a
//! new frame takes the next free one, and none is ever reused.

/// Declares each frame type's constant and lists them all, with the name the protocol document
/// gives the frame, in [`ALL`].
macro_rules! frames {
    ($($(#[$doc:meta])* $name:ident = $n:literal, $frame:literal;)*) => {
        $($(#[$doc])* pub const $name: u8 = $n;)*
        /// Every frame type: (its name in `docs/wire-protocol.md`, its number).
        pub const ALL: &[(&str, u8)] = &[$(($frame, $n)),*];
    };
}

frames! {
    /// `Hello`.
    HELLO = 1, "Hello";
    /// `Join`.
    JOIN = 2, "Join";
    /// `Ok`.
    OK = 3, "Ok";
    /// `Err`.
    ERR = 4, "Err";
    /// `GetRegion`.
    GET_REGION = 5, "GetRegion";
    /// `Region`.
    REGION = 6, "Region";
    /// `ListRegions`.
    LIST_REGIONS = 7, "ListRegions";
    /// `Regions`.
    REGIONS = 8, "Regions";
    /// `Write`.
    WRITE = 9, "Write";
    /// `WriteAck`.
    WRITE_ACK = 10, "WriteAck";
    /// `Read`.
    READ = 11, "Read";
    /// `ReadData`.
    READ_DATA = 12, "ReadData";
    /// `OpErr`.
    OP_ERR = 13, "OpErr";
    /// `Notify`.
    NOTIFY = 14, "Notify";
    /// `ShmJoin`.
    SHM_JOIN = 15, "ShmJoin";
    /// `ShmMap`.
    SHM_MAP = 16, "ShmMap";
    /// `ShmMapped`.
    SHM_MAPPED = 17, "ShmMapped";
    /// `ShmBegin`.
    SHM_BEGIN = 18, "ShmBegin";
    /// `ShmBeginResult`.
    SHM_BEGIN_RESULT = 19, "ShmBeginResult";
    /// `ShmStaged`.
    SHM_STAGED = 20, "ShmStaged";
    /// `ShmEnd`.
    SHM_END = 21, "ShmEnd";
    /// `Bye`.
    BYE = 22, "Bye";
    /// `RdmaConnect`.
    RDMA_CONNECT = 23, "RdmaConnect";
    /// `RdmaRegion`.
    RDMA_REGION = 24, "RdmaRegion";
    /// `RdmaRegionInfo`.
    RDMA_REGION_INFO = 25, "RdmaRegionInfo";
    /// `Challenge`.
    CHALLENGE = 26, "Challenge";
    /// `Auth`.
    AUTH = 27, "Auth";
    /// `FabricConnect`.
    FABRIC_CONNECT = 28, "FabricConnect";
    /// `FabricRegion`.
    FABRIC_REGION = 29, "FabricRegion";
    /// `FabricRegionInfo`.
    FABRIC_REGION_INFO = 30, "FabricRegionInfo";
    /// `ShmRing`.
    SHM_RING = 31, "ShmRing";
    /// `RdmaRegionOn`.
    RDMA_REGION_ON = 32, "RdmaRegionOn";
    /// `ShmCmaGrant`.
    SHM_CMA_GRANT = 33, "ShmCmaGrant";
    /// `ShmCmaProbe`.
    SHM_CMA_PROBE = 34, "ShmCmaProbe";
    /// `ShmCmaRegion`.
    SHM_CMA_REGION = 35, "ShmCmaRegion";
    /// `ShmCmaAddr`.
    SHM_CMA_ADDR = 36, "ShmCmaAddr";
    /// `WriteBatch`.
    WRITE_BATCH = 37, "WriteBatch";
    /// `WriteBatchAck`.
    WRITE_BATCH_ACK = 38, "WriteBatchAck";
    /// `ReadBatch`.
    READ_BATCH = 39, "ReadBatch";
    /// `ReadBatchData`.
    READ_BATCH_DATA = 40, "ReadBatchData";
    /// `Pake`.
    PAKE = 41, "Pake";
    /// `PakeAuth`.
    PAKE_AUTH = 42, "PakeAuth";
}

/// The highest frame type this version knows.
pub const MAX: u8 = PAKE_AUTH;

/// The frame types that may carry a raw payload after their body.
pub(crate) const WITH_PAYLOAD: [u8; 4] = [WRITE, READ_DATA, WRITE_BATCH, READ_BATCH_DATA];
