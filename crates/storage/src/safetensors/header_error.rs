//! Why a safetensors header is refused ([`HeaderError`]): one variant per check of
//! [`super::header::parse`] and [`super::header::encode`], each carrying the tensor and the
//! numbers, so a caller can tell a hostile shape from a truncated file. The text is what
//! `StorageError::BadCheckpoint` shows as its reason.

/// A header [`super::header::parse`] or [`super::header::encode`] refuses.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    /// The header's bytes are not UTF-8.
    #[error("the header is not UTF-8 ({0})")]
    NotUtf8(#[from] std::str::Utf8Error),
    /// The header is not JSON.
    #[error("the header is not valid JSON ({0})")]
    NotJson(#[source] serde_json::Error),
    /// The header is JSON but not an object.
    #[error("the header is not a JSON object")]
    NotAnObject,
    /// `__metadata__` is not an object of strings.
    #[error("\"__metadata__\" must be an object of strings")]
    BadMetadata,
    /// A tensor's entry is malformed, or (`encode`) its name is given twice.
    #[error("tensor {tensor:?}{problem}")]
    Entry {
        /// The tensor.
        tensor: String,
        /// What is wrong with it.
        problem: EntryProblem,
    },
    /// A dtype safetensors does not define.
    #[error("tensor {tensor:?}: unknown dtype {dtype:?}")]
    UnknownDtype {
        /// The tensor.
        tensor: String,
        /// The dtype as written.
        dtype: String,
    },
    /// More dimensions than an array can have.
    #[error("tensor {tensor:?}: {dims} dimensions, more than the {limit} an array can have")]
    TooManyDims {
        /// The tensor.
        tensor: String,
        /// Its dimensions.
        dims: usize,
        /// The limit ([`super::header::MAX_DIMS`]).
        limit: usize,
    },
    /// The shape's byte count does not fit in 64 bits, or its non-zero dimensions exceed what
    /// an array can index (2^63 - 1 bytes).
    #[error("tensor {tensor:?}: shape {shape:?} of {dtype} {}", if *signed {
        "has dimensions too large for an array (their product exceeds 2^63 - 1 bytes)"
    } else {
        "has more bytes than fit in 64 bits"
    })]
    ShapeTooLarge {
        /// The tensor.
        tensor: String,
        /// Its dtype's name.
        dtype: &'static str,
        /// Its shape.
        shape: Vec<u64>,
        /// Whether the limit hit is an array's (2^63 - 1 bytes) rather than 64 bits.
        signed: bool,
    },
    /// `data_offsets` end before they begin.
    #[error("tensor {tensor:?}: data_offsets [{begin}, {end}] end before they begin")]
    OffsetsReversed {
        /// The tensor.
        tensor: String,
        /// First byte.
        begin: u64,
        /// End.
        end: u64,
    },
    /// `data_offsets` run past the data section.
    #[error(
        "tensor {tensor:?}: data_offsets [{begin}, {end}] run past the end of the data \
         ({data_len} bytes after the header)"
    )]
    PastEnd {
        /// The tensor.
        tensor: String,
        /// First byte.
        begin: u64,
        /// End.
        end: u64,
        /// Bytes after the header.
        data_len: u64,
    },
    /// The offsets give another byte count than dtype and shape need.
    #[error(
        "tensor {tensor:?}: {dtype} {shape:?} needs {need} bytes but data_offsets \
         [{begin}, {end}] give {}", end - begin
    )]
    SizeMismatch {
        /// The tensor.
        tensor: String,
        /// Its dtype as written.
        dtype: String,
        /// Its shape.
        shape: Vec<u64>,
        /// The bytes they need.
        need: u64,
        /// First byte.
        begin: u64,
        /// End.
        end: u64,
    },
    /// Two tensors share bytes.
    #[error("tensors {a:?} [{}, {}] and {b:?} [{}, {}] overlap", a_span.0, a_span.1, b_span.0, b_span.1)]
    Overlap {
        /// The first tensor.
        a: String,
        /// Its [begin, end).
        a_span: (u64, u64),
        /// The second tensor.
        b: String,
        /// Its [begin, end).
        b_span: (u64, u64),
    },
    /// `encode` was given an order index past the tensors.
    #[error("tensor index {index} out of range")]
    IndexOutOfRange {
        /// The index.
        index: usize,
    },
    /// `__metadata__` used as a tensor name.
    #[error("\"__metadata__\" is reserved and cannot name a tensor")]
    ReservedName,
    /// `encode` was given a byte count its dtype and shape do not need.
    #[error("tensor {tensor:?}: {dtype} {shape:?} needs {need} bytes but {given} were given")]
    LenMismatch {
        /// The tensor.
        tensor: String,
        /// Its dtype's name.
        dtype: &'static str,
        /// Its shape.
        shape: Vec<u64>,
        /// The bytes they need.
        need: u64,
        /// The bytes given.
        given: u64,
    },
    /// The JSON could not be written.
    #[error("{0}")]
    Encode(#[source] serde_json::Error),
}

/// What is wrong with one tensor's entry ([`HeaderError::Entry`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EntryProblem {
    /// The entry is not a JSON object.
    #[error(": its entry is not a JSON object")]
    NotAnObject,
    /// No `dtype` string.
    #[error(": no \"dtype\" string")]
    NoDtype,
    /// `shape` is not a list of non-negative integers.
    #[error(": \"shape\" must be a list of non-negative integers")]
    BadShape,
    /// `data_offsets` is not two non-negative integers.
    #[error(": \"data_offsets\" must be [begin, end], two non-negative integers")]
    BadOffsets,
    /// `encode` was given the name twice.
    #[error(" is given twice")]
    GivenTwice,
}
