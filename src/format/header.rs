//! The safetensors header: parsing and complete validation of untrusted bytes.
//!
//! Owns: `Header::parse(bytes)`, which takes the whole file as a byte slice, does no I/O and
//! no `unsafe`, and checks every rule of the format before any tensor byte is looked at
//! (length prefix, size cap, UTF-8, JSON object without duplicate keys, `__metadata__` as a
//! string map, known dtypes, shape × dtype = byte range, ranges contiguous from 0 and
//! covering the data section exactly). Does not own: file access (`io::file`) or the header
//! wanbake writes (`format::header_layout`).

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, Visitor};

use crate::codec::dtype::DType;

/// Largest header wanbake accepts, as the safetensors crate does (100 MB).
pub const MAX_HEADER_SIZE: usize = 100_000_000;

/// One tensor entry of a header, with its byte range relative to the data section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name as written in the file.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape (empty for a scalar).
    pub shape: Vec<usize>,
    /// `[begin, end)` relative to the start of the data section.
    pub begin: usize,
    /// End of the byte range (exclusive).
    pub end: usize,
}

impl TensorInfo {
    /// Number of elements (the product of the shape; 1 for a scalar).
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Byte length of the data.
    pub fn nbytes(&self) -> usize {
        self.end - self.begin
    }
}

/// A validated header: tensors in data order, metadata, and where the data section starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Tensors sorted by their position in the data section.
    pub tensors: Vec<TensorInfo>,
    /// The `__metadata__` map (empty when absent).
    pub metadata: BTreeMap<String, String>,
    /// Byte offset of the data section in the file (8 + header length).
    pub data_start: usize,
}

/// Everything that can be wrong with the bytes of a safetensors file.
///
/// Each variant names what was expected and what was found; `io::file` adds the path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// Fewer than 8 bytes: no length prefix.
    #[error("file is {len} bytes long; a safetensors file starts with an 8-byte header length")]
    TooShort {
        /// File length.
        len: usize,
    },
    /// The declared header length exceeds the cap.
    #[error(
        "header length is {declared} bytes; the limit is {MAX_HEADER_SIZE} (corrupt or hostile file)"
    )]
    HeaderTooLarge {
        /// Declared length.
        declared: u64,
    },
    /// The declared header runs past the end of the file.
    #[error(
        "header length {declared} + 8 runs past the end of the {file_len}-byte file (truncated?)"
    )]
    HeaderPastEof {
        /// Declared length.
        declared: u64,
        /// File length.
        file_len: usize,
    },
    /// The header is not UTF-8.
    #[error("header is not valid UTF-8 (invalid byte at header offset {offset})")]
    InvalidUtf8 {
        /// Offset of the first invalid byte within the header.
        offset: usize,
    },
    /// The header is not a JSON object, or not JSON at all.
    #[error("header is not a JSON object: {reason}")]
    InvalidJson {
        /// serde_json's description, with line and column.
        reason: String,
    },
    /// The same key appears twice in the header object.
    #[error("header names `{key}` twice; safetensors forbids duplicate names")]
    DuplicateKey {
        /// The repeated key.
        key: String,
    },
    /// `__metadata__` is not an object of strings.
    #[error("`__metadata__` must map strings to strings; {found}")]
    BadMetadata {
        /// What was found instead.
        found: String,
    },
    /// A tensor entry is not `{dtype, shape, data_offsets}`.
    #[error("tensor `{name}`: {reason}")]
    BadEntry {
        /// Tensor name.
        name: String,
        /// What is wrong with the entry.
        reason: String,
    },
    /// The dtype string is not one of the format's dtypes.
    #[error("tensor `{name}`: unknown dtype `{dtype}`")]
    UnknownDtype {
        /// Tensor name.
        name: String,
        /// The dtype as written.
        dtype: String,
    },
    /// shape × dtype overflows or is not a whole number of bytes.
    #[error("tensor `{name}`: shape {shape:?} of {dtype} does not have a representable byte size")]
    SizeOverflow {
        /// Tensor name.
        name: String,
        /// Its dtype.
        dtype: DType,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// The byte range does not match shape × dtype.
    #[error(
        "tensor `{name}`: {dtype} {shape:?} needs {expected} bytes but its data_offsets [{begin}, {end}) cover {found}"
    )]
    SizeMismatch {
        /// Tensor name.
        name: String,
        /// Its dtype.
        dtype: DType,
        /// Its shape.
        shape: Vec<usize>,
        /// shape × dtype in bytes.
        expected: usize,
        /// Length of the range.
        found: usize,
        /// Range start.
        begin: usize,
        /// Range end.
        end: usize,
    },
    /// `begin > end`.
    #[error("tensor `{name}`: data_offsets [{begin}, {end}) end before they begin")]
    ReversedRange {
        /// Tensor name.
        name: String,
        /// Range start.
        begin: usize,
        /// Range end.
        end: usize,
    },
    /// Two ranges overlap.
    #[error("tensors `{first}` [.., {first_end}) and `{second}` [{second_begin}, ..) overlap")]
    Overlap {
        /// Earlier tensor.
        first: String,
        /// Its end.
        first_end: usize,
        /// Later tensor.
        second: String,
        /// Its start.
        second_begin: usize,
    },
    /// Bytes between two ranges (or before the first) belong to no tensor.
    #[error("data bytes [{gap_begin}, {gap_end}) belong to no tensor (before `{next}`)")]
    Gap {
        /// Start of the hole.
        gap_begin: usize,
        /// End of the hole.
        gap_end: usize,
        /// Tensor after the hole.
        next: String,
    },
    /// The data section is longer than the tensors cover.
    #[error(
        "{extra} trailing bytes after the last tensor (data section is {data_len} bytes, tensors cover {covered})"
    )]
    TrailingBytes {
        /// Bytes not covered.
        extra: usize,
        /// Data section length.
        data_len: usize,
        /// Bytes covered by tensors.
        covered: usize,
    },
    /// A tensor range ends past the end of the file.
    #[error(
        "tensor `{name}` ends at data offset {end} but the data section is only {data_len} bytes (truncated file?)"
    )]
    PastEof {
        /// Tensor name.
        name: String,
        /// Range end.
        end: usize,
        /// Data section length.
        data_len: usize,
    },
}

/// Raw header entries in file order, so that duplicates can be seen (serde_json's own map
/// keeps the last one silently).
struct RawEntries(Vec<(String, serde_json::Value)>);

impl<'de> Deserialize<'de> for RawEntries {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawEntries;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawEntries, A::Error> {
                let mut out = Vec::with_capacity(map.size_hint().unwrap_or(0));
                while let Some((k, v)) = map.next_entry::<String, serde_json::Value>()? {
                    out.push((k, v));
                }
                Ok(RawEntries(out))
            }
        }
        d.deserialize_map(V)
    }
}

impl Header {
    /// Parses and validates the header of a whole safetensors file given as bytes.
    pub fn parse(file: &[u8]) -> Result<Header, FormatError> {
        Header::parse_prefix(file, file.len())
    }

    /// Parses and validates the header at the start of `bytes`, a file of `file_len` bytes
    /// whose first `bytes.len()` are given (at least the length prefix and the header; the
    /// data section need not be): what a writer checks of the header it planned.
    pub fn parse_prefix(bytes: &[u8], file_len: usize) -> Result<Header, FormatError> {
        let file = bytes.get(..bytes.len().min(file_len)).unwrap_or(bytes);
        let prefix: [u8; 8] = file
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .ok_or(FormatError::TooShort { len: file_len })?;
        let declared = u64::from_le_bytes(prefix);
        if declared > MAX_HEADER_SIZE as u64 {
            return Err(FormatError::HeaderTooLarge { declared });
        }
        let n = declared as usize;
        let data_start = 8usize
            .checked_add(n)
            .filter(|&end| end <= file_len)
            .ok_or(FormatError::HeaderPastEof { declared, file_len })?;
        let header_bytes = file.get(8..data_start).ok_or(FormatError::HeaderPastEof {
            declared,
            file_len: file.len(),
        })?;
        let text = std::str::from_utf8(header_bytes).map_err(|e| FormatError::InvalidUtf8 {
            offset: e.valid_up_to(),
        })?;
        let data_len = file_len - data_start;
        let (tensors, metadata) = parse_entries(text, data_len)?;
        Ok(Header {
            tensors,
            metadata,
            data_start,
        })
    }

    /// Looks a tensor up by name (linear; callers that need many lookups build a map).
    pub fn get(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

fn parse_entries(
    text: &str,
    data_len: usize,
) -> Result<(Vec<TensorInfo>, BTreeMap<String, String>), FormatError> {
    let raw: RawEntries = serde_json::from_str(text).map_err(|e| FormatError::InvalidJson {
        reason: e.to_string(),
    })?;
    let mut seen = std::collections::HashSet::with_capacity(raw.0.len());
    let mut metadata = BTreeMap::new();
    let mut tensors = Vec::with_capacity(raw.0.len());
    for (key, value) in raw.0 {
        if !seen.insert(key.clone()) {
            return Err(FormatError::DuplicateKey { key });
        }
        if key == "__metadata__" {
            metadata = parse_metadata(value)?;
        } else {
            tensors.push(parse_tensor(key, value)?);
        }
    }
    validate_ranges(&mut tensors, data_len)?;
    Ok((tensors, metadata))
}

fn parse_metadata(value: serde_json::Value) -> Result<BTreeMap<String, String>, FormatError> {
    let serde_json::Value::Object(map) = value else {
        return Err(FormatError::BadMetadata {
            found: format!("found {}", json_kind(&value)),
        });
    };
    map.into_iter()
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => Ok((k, s)),
            other => Err(FormatError::BadMetadata {
                found: format!("key `{k}` holds {}", json_kind(&other)),
            }),
        })
        .collect()
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

fn parse_tensor(name: String, value: serde_json::Value) -> Result<TensorInfo, FormatError> {
    let bad = |reason: String| FormatError::BadEntry {
        name: name.clone(),
        reason,
    };
    let serde_json::Value::Object(obj) = value else {
        return Err(bad(format!(
            "expected an object, found {}",
            json_kind(&value)
        )));
    };
    if let Some(extra) = obj
        .keys()
        .find(|k| !matches!(k.as_str(), "dtype" | "shape" | "data_offsets"))
    {
        return Err(bad(format!(
            "unexpected field `{extra}` (allowed: dtype, shape, data_offsets)"
        )));
    }
    let dtype_str = match obj.get("dtype") {
        Some(serde_json::Value::String(s)) => s.as_str(),
        Some(other) => {
            return Err(bad(format!(
                "`dtype` must be a string, found {}",
                json_kind(other)
            )));
        }
        None => return Err(bad("missing `dtype`".into())),
    };
    let dtype = DType::parse(dtype_str).ok_or_else(|| FormatError::UnknownDtype {
        name: name.clone(),
        dtype: dtype_str.to_string(),
    })?;
    let shape = usize_array(obj.get("shape"), "shape").map_err(bad)?;
    let offsets = usize_array(obj.get("data_offsets"), "data_offsets").map_err(bad)?;
    let [begin, end]: [usize; 2] =
        offsets
            .try_into()
            .map_err(|v: Vec<usize>| FormatError::BadEntry {
                name: name.clone(),
                reason: format!("`data_offsets` must have 2 entries, found {}", v.len()),
            })?;
    if begin > end {
        return Err(FormatError::ReversedRange { name, begin, end });
    }
    let expected = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .and_then(|numel| dtype.byte_len(numel))
        .ok_or_else(|| FormatError::SizeOverflow {
            name: name.clone(),
            dtype,
            shape: shape.clone(),
        })?;
    if expected != end - begin {
        return Err(FormatError::SizeMismatch {
            name,
            dtype,
            shape,
            expected,
            found: end - begin,
            begin,
            end,
        });
    }
    Ok(TensorInfo {
        name,
        dtype,
        shape,
        begin,
        end,
    })
}

fn usize_array(v: Option<&serde_json::Value>, field: &str) -> Result<Vec<usize>, String> {
    let Some(v) = v else {
        return Err(format!("missing `{field}`"));
    };
    let serde_json::Value::Array(items) = v else {
        return Err(format!(
            "`{field}` must be an array, found {}",
            json_kind(v)
        ));
    };
    items
        .iter()
        .map(|x| {
            x.as_u64()
                .and_then(|u| usize::try_from(u).ok())
                .ok_or_else(|| format!("`{field}` must hold non-negative integers, found {x}"))
        })
        .collect()
}

/// Sorts by range and checks that the ranges tile `[0, data_len)` exactly.
fn validate_ranges(tensors: &mut [TensorInfo], data_len: usize) -> Result<(), FormatError> {
    tensors.sort_by(|a, b| (a.begin, a.end, &a.name).cmp(&(b.begin, b.end, &b.name)));
    let mut cursor = 0usize;
    let mut prev: Option<&TensorInfo> = None;
    for t in tensors.iter() {
        if t.begin < cursor {
            let p = prev.expect("cursor > 0 implies a previous tensor");
            return Err(FormatError::Overlap {
                first: p.name.clone(),
                first_end: p.end,
                second: t.name.clone(),
                second_begin: t.begin,
            });
        }
        if t.begin > cursor {
            return Err(FormatError::Gap {
                gap_begin: cursor,
                gap_end: t.begin,
                next: t.name.clone(),
            });
        }
        if t.end > data_len {
            return Err(FormatError::PastEof {
                name: t.name.clone(),
                end: t.end,
                data_len,
            });
        }
        cursor = t.end;
        prev = Some(t);
    }
    if cursor != data_len {
        return Err(FormatError::TrailingBytes {
            extra: data_len - cursor,
            data_len,
            covered: cursor,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(json: &str, data: &[u8]) -> Vec<u8> {
        let mut v = (json.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(json.as_bytes());
        v.extend_from_slice(data);
        v
    }

    #[test]
    fn parses_a_minimal_file() {
        let f = file(
            r#"{"__metadata__":{"format":"pt"},"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]},"a":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}}"#,
            &[0; 6],
        );
        let h = Header::parse(&f).unwrap();
        assert_eq!(h.tensors[0].name, "a");
        assert_eq!(h.tensors[1].name, "b");
        assert_eq!(h.metadata["format"], "pt");
    }

    #[test]
    fn empty_and_scalar_tensors_are_allowed() {
        let f = file(
            r#"{"e":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]},"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]}}"#,
            &[0; 4],
        );
        let h = Header::parse(&f).unwrap();
        assert_eq!(h.tensors.len(), 2);
    }

    #[test]
    fn leading_and_trailing_spaces_are_accepted_but_nul_padding_is_not() {
        assert!(Header::parse(&file("  {}  ", &[])).is_ok());
        assert!(matches!(
            Header::parse(&file("{}\0\0", &[])),
            Err(FormatError::InvalidJson { .. })
        ));
    }

    #[test]
    fn one_test_per_error_variant() {
        use FormatError as E;
        let t = |json: &str, data: &[u8]| Header::parse(&file(json, data)).unwrap_err();
        assert!(matches!(
            Header::parse(&[1, 2, 3]),
            Err(E::TooShort { len: 3 })
        ));
        let mut huge = (200_000_000u64).to_le_bytes().to_vec();
        huge.extend_from_slice(b"{}");
        assert!(matches!(
            Header::parse(&huge),
            Err(E::HeaderTooLarge { .. })
        ));
        let mut past = (100u64).to_le_bytes().to_vec();
        past.extend_from_slice(b"{}");
        assert!(matches!(Header::parse(&past), Err(E::HeaderPastEof { .. })));
        let mut bad_utf8 = 4u64.to_le_bytes().to_vec();
        bad_utf8.extend_from_slice(&[b'{', 0xFF, 0xFE, b'}']);
        assert!(matches!(
            Header::parse(&bad_utf8),
            Err(E::InvalidUtf8 { offset: 1 })
        ));
        assert!(matches!(t("[1,2]", &[]), E::InvalidJson { .. }));
        assert!(matches!(t("{\"a\":", &[]), E::InvalidJson { .. }));
        assert!(matches!(
            t(
                r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#,
                &[0; 8]
            ),
            E::DuplicateKey { .. }
        ));
        assert!(matches!(
            t(r#"{"__metadata__":{"k":1}}"#, &[]),
            E::BadMetadata { .. }
        ));
        assert!(matches!(
            t(r#"{"__metadata__":[]}"#, &[]),
            E::BadMetadata { .. }
        ));
        assert!(matches!(t(r#"{"a":3}"#, &[]), E::BadEntry { .. }));
        assert!(matches!(
            t(
                r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}}"#,
                &[0; 4]
            ),
            E::BadEntry { .. }
        ));
        assert!(matches!(
            t(
                r#"{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#,
                &[0; 4]
            ),
            E::BadEntry { .. }
        ));
        assert!(matches!(
            t(
                r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}}"#,
                &[0; 4]
            ),
            E::BadEntry { .. }
        ));
        assert!(matches!(
            t(
                r#"{"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,4]}}"#,
                &[0; 4]
            ),
            E::UnknownDtype { .. }
        ));
        assert!(matches!(
            t(
                r#"{"a":{"dtype":"F32","shape":[18446744073709551615,2],"data_offsets":[0,4]}}"#,
                &[0; 4]
            ),
            E::SizeOverflow { .. }
        ));
        assert!(matches!(
            t(
                r#"{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}"#,
                &[0; 2]
            ),
            E::SizeOverflow { .. }
        ));
        assert!(matches!(
            t(
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#,
                &[0; 4]
            ),
            E::SizeMismatch {
                expected: 8,
                found: 4,
                ..
            }
        ));
        assert!(matches!(
            t(
                r#"{"a":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}}"#,
                &[0; 4]
            ),
            E::ReversedRange { .. }
        ));
        assert!(matches!(
            t(
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#,
                &[0; 8]
            ),
            E::Overlap { .. }
        ));
        assert!(matches!(
            t(
                r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#,
                &[0; 8]
            ),
            E::Gap {
                gap_begin: 0,
                gap_end: 4,
                ..
            }
        ));
        assert!(matches!(
            t(
                r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
                &[0; 6]
            ),
            E::TrailingBytes { extra: 2, .. }
        ));
        assert!(matches!(
            t(
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
                &[0; 4]
            ),
            E::PastEof { .. }
        ));
    }
}
