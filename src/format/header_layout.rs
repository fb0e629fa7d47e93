//! The header wanbake writes: the canonical layout of an output safetensors file, decided
//! before any byte is written.
//!
//! Owns: `PlannedTensor` (what the writer will lay out), `HeaderLayout` (the canonical,
//! deterministic header bytes and every tensor's byte range: names sorted, offsets from 0,
//! the JSON padded with spaces to 8 bytes) and `LayoutError`. Does not own: parsing
//! untrusted headers (`format::header`), or files (`release::writer`, `release::staging`).

use std::collections::BTreeMap;

use super::header::{MAX_HEADER_SIZE, TensorInfo};
use crate::codec::dtype::DType;

/// A tensor as the writer will lay it out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedTensor {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
}

impl PlannedTensor {
    /// Byte length, or `None` if it overflows.
    pub fn nbytes(&self) -> Option<usize> {
        let numel = self
            .shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))?;
        self.dtype.byte_len(numel)
    }
}

/// The canonical header of a file wanbake writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderLayout {
    /// The complete bytes before the data section: 8-byte length + JSON padded with spaces
    /// to a multiple of 8.
    pub prefix: Vec<u8>,
    /// Tensors in data order with absolute file offsets.
    pub tensors: Vec<TensorInfo>,
    /// Length of the data section.
    pub data_len: usize,
}

impl HeaderLayout {
    /// Lays out `tensors` canonically: data ordered by (alignment descending, name), so every
    /// tensor starts at a multiple of its element size when the header is 8-aligned; header
    /// JSON with tensor names and metadata keys sorted; padded with spaces to 8 bytes.
    ///
    /// The result depends only on the arguments, never on their order.
    pub fn build(
        tensors: &[PlannedTensor],
        metadata: &BTreeMap<String, String>,
    ) -> Result<HeaderLayout, LayoutError> {
        let mut order: Vec<&PlannedTensor> = tensors.iter().collect();
        order.sort_by(|a, b| {
            b.dtype
                .alignment()
                .cmp(&a.dtype.alignment())
                .then_with(|| a.name.cmp(&b.name))
        });
        let mut names = std::collections::BTreeSet::new();
        let mut infos = Vec::with_capacity(order.len());
        let mut cursor = 0usize;
        for t in order {
            if t.name == "__metadata__" {
                return Err(LayoutError::ReservedName);
            }
            if !names.insert(t.name.as_str()) {
                return Err(LayoutError::Duplicate {
                    name: t.name.clone(),
                });
            }
            let n = t.nbytes().ok_or_else(|| LayoutError::Overflow {
                name: t.name.clone(),
            })?;
            let end = cursor.checked_add(n).ok_or_else(|| LayoutError::Overflow {
                name: t.name.clone(),
            })?;
            infos.push(TensorInfo {
                name: t.name.clone(),
                dtype: t.dtype,
                shape: t.shape.clone(),
                begin: cursor,
                end,
            });
            cursor = end;
        }
        let json = header_json(&infos, metadata);
        let mut body = json.into_bytes();
        while !body.len().is_multiple_of(8) {
            body.push(b' ');
        }
        if body.len() > MAX_HEADER_SIZE {
            return Err(LayoutError::HeaderTooLarge { len: body.len() });
        }
        let mut prefix = Vec::with_capacity(8 + body.len());
        prefix.extend_from_slice(&(body.len() as u64).to_le_bytes());
        prefix.extend_from_slice(&body);
        let data_start = prefix.len();
        for t in &mut infos {
            t.begin += data_start;
            t.end += data_start;
        }
        Ok(HeaderLayout {
            prefix,
            tensors: infos,
            data_len: cursor,
        })
    }

    /// Total file size.
    pub fn file_len(&self) -> usize {
        self.prefix.len() + self.data_len
    }

    /// Index of a tensor in `tensors`.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.tensors.iter().position(|t| t.name == name)
    }
}

/// Why a header could not be laid out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// A tensor was planned twice.
    #[error("tensor `{name}` planned twice for one file")]
    Duplicate {
        /// The name.
        name: String,
    },
    /// `__metadata__` used as a tensor name.
    #[error("`__metadata__` cannot be a tensor name")]
    ReservedName,
    /// Size arithmetic overflowed.
    #[error("tensor `{name}`: size overflows")]
    Overflow {
        /// The name.
        name: String,
    },
    /// Header would exceed the format's cap.
    #[error("header would be {len} bytes, over the {MAX_HEADER_SIZE}-byte limit")]
    HeaderTooLarge {
        /// Header length.
        len: usize,
    },
}

/// Canonical header JSON: keys sorted (metadata first as `__metadata__` sorts before
/// lowercase names only by accident, so it is placed explicitly first), compact.
fn header_json(infos: &[TensorInfo], metadata: &BTreeMap<String, String>) -> String {
    use serde_json::Value;
    let mut sorted: Vec<&TensorInfo> = infos.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let mut out = String::from("{");
    let mut first = true;
    let mut push = |out: &mut String, k: &str, v: String| {
        if !first {
            out.push(',');
        }
        first = false;
        out.push_str(&Value::String(k.to_string()).to_string());
        out.push(':');
        out.push_str(&v);
    };
    if !metadata.is_empty() {
        let m: serde_json::Map<String, Value> = metadata
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        push(&mut out, "__metadata__", Value::Object(m).to_string());
    }
    for t in sorted {
        let v = format!(
            "{{\"dtype\":\"{}\",\"shape\":{},\"data_offsets\":[{},{}]}}",
            t.dtype,
            serde_json::to_string(&t.shape).expect("a Vec<usize> always serialises"),
            t.begin,
            t.end
        );
        push(&mut out, &t.name, v);
    }
    out.push('}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::header::Header;

    #[test]
    fn layout_is_canonical_and_round_trips() {
        let ts = vec![
            PlannedTensor {
                name: "z".into(),
                dtype: DType::BF16,
                shape: vec![3],
            },
            PlannedTensor {
                name: "a".into(),
                dtype: DType::F32,
                shape: vec![2, 2],
            },
            PlannedTensor {
                name: "m".into(),
                dtype: DType::F32,
                shape: vec![],
            },
        ];
        let mut md = BTreeMap::new();
        md.insert("zz".to_string(), "1".to_string());
        md.insert("aa".to_string(), "\"quoted\"".to_string());
        let l1 = HeaderLayout::build(&ts, &md).unwrap();
        let mut rev = ts.clone();
        rev.reverse();
        let l2 = HeaderLayout::build(&rev, &md).unwrap();
        assert_eq!(l1, l2);
        assert_eq!(l1.prefix.len() % 8, 0);
        // f32 first (alignment 4), then bf16.
        let order: Vec<&str> = l1.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(order, ["a", "m", "z"]);
        let mut f = l1.prefix.clone();
        f.resize(l1.file_len(), 0);
        let h = Header::parse(&f).unwrap();
        assert_eq!(h.metadata, md);
        assert_eq!(h.tensors.len(), 3);
        let json = std::str::from_utf8(&l1.prefix[8..]).unwrap();
        assert!(json.starts_with("{\"__metadata__\":{\"aa\""), "{json}");
        assert!(HeaderLayout::build(&[ts[0].clone(), ts[0].clone()], &BTreeMap::new()).is_err());
    }
}
