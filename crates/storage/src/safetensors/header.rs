//! The safetensors header: an 8-byte little-endian length `N`, `N` bytes of JSON (an object of
//! tensor name -> `{"dtype", "shape", "data_offsets": [begin, end]}`, and an optional
//! `"__metadata__"` object of strings), then the data, offsets counted from its start.
//!
//! [`parse`] checks everything before a byte of data moves, and names what is wrong: the JSON,
//! each tensor's dtype, shape (an element count that overflows), offsets (reversed, or past the
//! end of the data), the size its dtype and shape need against the bytes its offsets give, and
//! overlaps between tensors. [`encode`] writes a header the same rules accept.

use serde_json::{Map, Value};

pub use super::header_error::{EntryProblem, HeaderError};
use std::collections::BTreeMap;

/// The largest header accepted (safetensors' own limit): a longer length prefix is refused
/// before anything is allocated.
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// A safetensors element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)] // the names are the format's
pub enum Dtype {
    Bool,
    U8,
    I8,
    F8E5M2,
    F8E4M3,
    F8E8M0,
    I16,
    U16,
    F16,
    BF16,
    I32,
    U32,
    F32,
    I64,
    U64,
    F64,
}

const DTYPES: [(Dtype, &str, u64); 16] = [
    (Dtype::Bool, "BOOL", 1),
    (Dtype::U8, "U8", 1),
    (Dtype::I8, "I8", 1),
    (Dtype::F8E5M2, "F8_E5M2", 1),
    (Dtype::F8E4M3, "F8_E4M3", 1),
    (Dtype::F8E8M0, "F8_E8M0", 1),
    (Dtype::I16, "I16", 2),
    (Dtype::U16, "U16", 2),
    (Dtype::F16, "F16", 2),
    (Dtype::BF16, "BF16", 2),
    (Dtype::I32, "I32", 4),
    (Dtype::U32, "U32", 4),
    (Dtype::F32, "F32", 4),
    (Dtype::I64, "I64", 8),
    (Dtype::U64, "U64", 8),
    (Dtype::F64, "F64", 8),
];

impl Dtype {
    /// The format's name (`F32`, `BF16`, ...), or `None` for one gdx does not know.
    pub fn parse(name: &str) -> Option<Dtype> {
        DTYPES.iter().find(|d| d.1 == name).map(|d| d.0)
    }

    /// The format's name.
    pub fn name(self) -> &'static str {
        DTYPES.iter().find(|d| d.0 == self).map_or("?", |d| d.1)
    }

    /// Bytes per element.
    pub fn size(self) -> u64 {
        DTYPES.iter().find(|d| d.0 == self).map_or(1, |d| d.2)
    }
}

/// One tensor of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Its name.
    pub name: String,
    /// Its element type.
    pub dtype: Dtype,
    /// Its shape (`[]` for a scalar).
    pub shape: Vec<u64>,
    /// Its bytes in the data section: `[begin, end)`, from the data's first byte.
    pub begin: u64,
    /// See `begin`.
    pub end: u64,
}

impl TensorInfo {
    /// Its bytes.
    pub fn len(&self) -> u64 {
        self.end - self.begin
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.end == self.begin
    }
}

/// The tensors in data order (by `begin`) and the metadata of a parsed header.
pub type Parsed = (Vec<TensorInfo>, BTreeMap<String, String>);

/// The bytes `shape` of `dtype` needs, or why it cannot be counted.
pub fn tensor_bytes(name: &str, dtype: Dtype, shape: &[u64]) -> Result<u64, HeaderError> {
    shape
        .iter()
        .try_fold(dtype.size(), |n, &d| n.checked_mul(d))
        .ok_or_else(|| HeaderError::ShapeTooLarge {
            tensor: name.to_string(),
            dtype: dtype.name(),
            shape: shape.to_vec(),
            signed: false,
        })
}

/// Most dimensions a tensor may have: what every numpy can make (numpy 1.x's limit is 32), so a
/// shape loads the same in the CLI and in Python.
pub const MAX_DIMS: usize = 32;

/// A shape every reader can hold: at most [`MAX_DIMS`] dimensions, each and the product of the
/// non-zero ones (in bytes) within `i64::MAX` (numpy's sizes are signed: `[0, 2^64-1]` holds
/// no byte, but no array can have that shape).
fn check_shape(name: &str, dtype: Dtype, shape: &[u64]) -> Result<(), HeaderError> {
    if shape.len() > MAX_DIMS {
        return Err(HeaderError::TooManyDims {
            tensor: name.to_string(),
            dims: shape.len(),
            limit: MAX_DIMS,
        });
    }
    let max = i64::MAX as u64;
    let nonzero = shape
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(dtype.size(), |n, &d| n.checked_mul(d).filter(|&n| n <= max));
    if nonzero.is_none() {
        return Err(HeaderError::ShapeTooLarge {
            tensor: name.to_string(),
            dtype: dtype.name(),
            shape: shape.to_vec(),
            signed: true,
        });
    }
    Ok(())
}

/// The error for `name`'s entry.
fn bad_entry(name: &str, problem: EntryProblem) -> HeaderError {
    HeaderError::Entry {
        tensor: name.to_string(),
        problem,
    }
}

fn offsets(name: &str, v: Option<&Value>) -> Result<(u64, u64), HeaderError> {
    let bad = || bad_entry(name, EntryProblem::BadOffsets);
    let arr = v.and_then(Value::as_array).ok_or_else(bad)?;
    match arr.as_slice() {
        [b, e] => Ok((b.as_u64().ok_or_else(bad)?, e.as_u64().ok_or_else(bad)?)),
        _ => Err(bad()),
    }
}

fn tensor(name: &str, v: &Value, data_len: u64) -> Result<TensorInfo, HeaderError> {
    let obj = v
        .as_object()
        .ok_or_else(|| bad_entry(name, EntryProblem::NotAnObject))?;
    let dtype_name = obj
        .get("dtype")
        .and_then(Value::as_str)
        .ok_or_else(|| bad_entry(name, EntryProblem::NoDtype))?;
    let dtype = Dtype::parse(dtype_name).ok_or_else(|| HeaderError::UnknownDtype {
        tensor: name.to_string(),
        dtype: dtype_name.to_string(),
    })?;
    let bad_shape = || bad_entry(name, EntryProblem::BadShape);
    let shape = obj
        .get("shape")
        .and_then(Value::as_array)
        .ok_or_else(bad_shape)?
        .iter()
        .map(|d| d.as_u64().ok_or_else(bad_shape))
        .collect::<Result<Vec<u64>, HeaderError>>()?;
    check_shape(name, dtype, &shape)?;
    let (begin, end) = offsets(name, obj.get("data_offsets"))?;
    if end < begin {
        return Err(HeaderError::OffsetsReversed {
            tensor: name.to_string(),
            begin,
            end,
        });
    }
    if end > data_len {
        return Err(HeaderError::PastEnd {
            tensor: name.to_string(),
            begin,
            end,
            data_len,
        });
    }
    let need = tensor_bytes(name, dtype, &shape)?;
    if need != end - begin {
        return Err(HeaderError::SizeMismatch {
            tensor: name.to_string(),
            dtype: dtype_name.to_string(),
            shape,
            need,
            begin,
            end,
        });
    }
    Ok(TensorInfo {
        name: name.to_string(),
        dtype,
        shape,
        begin,
        end,
    })
}

fn metadata(v: &Value) -> Result<BTreeMap<String, String>, HeaderError> {
    let bad = || HeaderError::BadMetadata;
    v.as_object()
        .ok_or_else(bad)?
        .iter()
        .map(|(k, v)| Ok((k.clone(), v.as_str().ok_or_else(bad)?.to_string())))
        .collect()
}

/// Parse and check the header's JSON against a data section of `data_len` bytes (see the
/// module docs); the error is the reason, naming the tensor.
pub fn parse(json: &[u8], data_len: u64) -> Result<Parsed, HeaderError> {
    let text = std::str::from_utf8(json)?;
    let value: Value = serde_json::from_str(text).map_err(HeaderError::NotJson)?;
    let obj = value.as_object().ok_or(HeaderError::NotAnObject)?;
    let mut meta = BTreeMap::new();
    let mut tensors = Vec::with_capacity(obj.len());
    for (name, v) in obj {
        if name == "__metadata__" {
            meta = metadata(v)?;
        } else {
            tensors.push(tensor(name, v, data_len)?);
        }
    }
    tensors.sort_by_key(|t| (t.begin, t.end));
    for w in tensors.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        if b.begin < a.end {
            return Err(HeaderError::Overlap {
                a: a.name.clone(),
                a_span: (a.begin, a.end),
                b: b.name.clone(),
                b_span: (b.begin, b.end),
            });
        }
    }
    Ok((tensors, meta))
}

/// A tensor to write: its name, dtype, shape and byte count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// Its name.
    pub name: String,
    /// Its element type.
    pub dtype: Dtype,
    /// Its shape.
    pub shape: Vec<u64>,
    /// Its bytes (must be what dtype and shape need).
    pub len: u64,
}

/// The header for `tensors` laid out in the order `order` gives (indices into `tensors`), with
/// `metadata`: the 8-byte length, then the JSON padded with spaces to a multiple of 8 bytes,
/// so that the data starts 8-byte aligned.
pub fn encode(
    tensors: &[TensorSpec],
    order: &[usize],
    metadata: &BTreeMap<String, String>,
) -> Result<Vec<u8>, HeaderError> {
    let mut obj = Map::new();
    if !metadata.is_empty() {
        let m = metadata
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.clone())))
            .collect();
        obj.insert("__metadata__".into(), Value::Object(m));
    }
    let mut at = 0u64;
    for &i in order {
        let t = tensors
            .get(i)
            .ok_or(HeaderError::IndexOutOfRange { index: i })?;
        if t.name == "__metadata__" {
            return Err(HeaderError::ReservedName);
        }
        let need = tensor_bytes(&t.name, t.dtype, &t.shape)?;
        if need != t.len {
            return Err(HeaderError::LenMismatch {
                tensor: t.name.clone(),
                dtype: t.dtype.name(),
                shape: t.shape.clone(),
                need,
                given: t.len,
            });
        }
        let entry = serde_json::json!({
            "dtype": t.dtype.name(),
            "shape": t.shape,
            "data_offsets": [at, at + t.len],
        });
        if obj.insert(t.name.clone(), entry).is_some() {
            return Err(bad_entry(&t.name, EntryProblem::GivenTwice));
        }
        at += t.len;
    }
    let mut json = serde_json::to_vec(&Value::Object(obj)).map_err(HeaderError::Encode)?;
    while (json.len() + 8) % 8 != 0 {
        json.push(b' ');
    }
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&json);
    Ok(out)
}

/// The order safetensors itself writes tensors in: larger elements first (so every tensor
/// starts aligned to its element size), then by name.
pub fn aligned_order(tensors: &[TensorSpec]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by(|&a, &b| {
        let (ta, tb) = (&tensors[a], &tensors[b]);
        tb.dtype
            .size()
            .cmp(&ta.dtype.size())
            .then_with(|| ta.name.cmp(&tb.name))
    });
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(json: &str, data_len: u64) -> String {
        parse(json.as_bytes(), data_len).unwrap_err().to_string()
    }

    #[test]
    fn a_valid_header_parses_in_data_order() {
        let (t, m) = parse(
            br#"{"b":{"dtype":"F32","shape":[2,3],"data_offsets":[8,32]},
                 "a":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]},
                 "s":{"dtype":"I64","shape":[],"data_offsets":[32,40]},
                 "__metadata__":{"format":"pt"}}"#,
            40,
        )
        .unwrap();
        let names: Vec<&str> = t.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "s"]);
        assert_eq!(t[1].dtype, Dtype::F32);
        assert_eq!(t[1].shape, [2, 3]);
        assert_eq!(t[2].len(), 8);
        assert_eq!(m["format"], "pt");
    }

    #[test]
    fn hostile_headers_are_refused_with_the_reason() {
        let r = reason(
            r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
            12,
        );
        assert!(r.contains("overlap"), "{r}");
        let r = reason(
            r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#,
            8,
        );
        assert!(r.contains("run past the end of the data (8 bytes"), "{r}");
        let r = reason(
            r#"{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}}"#,
            16,
        );
        assert!(r.contains("too large for an array"), "{r}");
        // No byte, but no array can have the shape: refused, not left to numpy.
        let r = reason(
            r#"{"a":{"dtype":"F32","shape":[0,18446744073709551615],"data_offsets":[0,0]}}"#,
            0,
        );
        assert!(r.contains("too large for an array"), "{r}");
        let dims = vec!["1"; 100].join(",");
        let r = reason(
            &format!(r#"{{"a":{{"dtype":"F32","shape":[{dims}],"data_offsets":[0,4]}}}}"#),
            4,
        );
        assert!(r.contains("100 dimensions, more than the 32"), "{r}");
        let dims = vec!["1"; 32].join(",");
        assert!(parse(
            format!(r#"{{"a":{{"dtype":"F32","shape":[{dims}],"data_offsets":[0,4]}}}}"#)
                .as_bytes(),
            4
        )
        .is_ok());
        let r = reason(
            r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
            8,
        );
        assert!(
            r.contains("needs 12 bytes but data_offsets [0, 8] give 8"),
            "{r}"
        );
        let r = reason(
            r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[8,0]}}"#,
            8,
        );
        assert!(r.contains("end before they begin"), "{r}");
        let r = reason(
            r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[-1,0]}}"#,
            8,
        );
        assert!(r.contains("two non-negative integers"), "{r}");
        let r = reason(
            r#"{"a":{"dtype":"Q7","shape":[3],"data_offsets":[0,3]}}"#,
            8,
        );
        assert!(r.contains("unknown dtype \"Q7\""), "{r}");
        let r = reason(
            r#"{"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,3]}}"#,
            8,
        );
        assert!(r.contains("\"shape\" must be"), "{r}");
        assert!(reason("{\"a\":", 0).contains("not valid JSON"));
        assert!(reason("[1]", 0).contains("not a JSON object"));
        assert!(reason(r#"{"__metadata__":{"k":1}}"#, 0).contains("object of strings"));
        assert!(parse(&[0xff, 0xfe], 0)
            .unwrap_err()
            .to_string()
            .contains("not UTF-8"));
    }

    #[test]
    fn encoded_headers_parse_back_aligned() {
        let specs = vec![
            TensorSpec {
                name: "h".into(),
                dtype: Dtype::F16,
                shape: vec![3],
                len: 6,
            },
            TensorSpec {
                name: "w".into(),
                dtype: Dtype::F64,
                shape: vec![2, 2],
                len: 32,
            },
        ];
        let meta = BTreeMap::from([("format".to_string(), "np".to_string())]);
        let order = aligned_order(&specs);
        assert_eq!(order, [1, 0]);
        let h = encode(&specs, &order, &meta).unwrap();
        assert_eq!(h.len() % 8, 0);
        let n = u64::from_le_bytes(h[..8].try_into().unwrap()) as usize;
        assert_eq!(n + 8, h.len());
        let (t, m) = parse(&h[8..], 38).unwrap();
        assert_eq!((t[0].name.as_str(), t[0].begin, t[0].end), ("w", 0, 32));
        assert_eq!((t[1].name.as_str(), t[1].begin, t[1].end), ("h", 32, 38));
        assert_eq!(m, meta);
        let mut bad = specs.clone();
        bad[0].len = 5;
        let e = encode(&bad, &[0], &meta).unwrap_err();
        assert!(
            matches!(
                e,
                HeaderError::LenMismatch {
                    need: 6,
                    given: 5,
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(
            e.to_string().contains("needs 6 bytes but 5 were given"),
            "{e}"
        );
    }
}
