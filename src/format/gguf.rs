//! The GGUF container (version 3) as gguf-py 0.19's `GGUFWriter` writes and `GGUFReader` reads
//! it: a header (magic, version, counts), typed key/value metadata, tensor infos, then the
//! tensor data, each tensor starting at a multiple of the alignment (32 unless
//! `general.alignment` says otherwise).
//!
//! Owns: parsing a GGUF file from `&[u8]` (every count, length and offset checked, no I/O, no
//! `unsafe`) and laying one out: [`GgufLayout::new`] turns metadata and tensor infos into the
//! header bytes plus the absolute offset of each tensor's data, so a writer can place the
//! tensors' bytes anywhere in any order. Does not own: the encodings of the data
//! (`codec::ggml`), which type a tensor gets, mapping or hashing files (`io::gguf`), or
//! writing them (`release::staging`).
//!
//! Shapes: GGUF stores `ne`, the torch shape reversed (`ne[0]` is the row length), and keeps
//! every dimension the writer gives it; [`torch_shape`] turns one into the other.

use crate::codec::dtype::DType;
use crate::codec::ggml::GgmlType;
use crate::format::header::TensorInfo;
use crate::format::header_layout::HeaderLayout;

const MAGIC: &[u8; 4] = b"GGUF";
/// The GGUF version written.
pub const VERSION: u32 = 3;
/// The default data alignment.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Largest element count accepted for one metadata array or string (hostile-input cap).
const MAX_COUNT: u64 = 1 << 32;
/// Largest number of dimensions of a tensor (gguf-py's and ggml's `GGML_MAX_DIMS` is 4; the
/// ComfyUI-GGUF Wan files hold a 5-D patch embedding, which gguf-py reads).
pub const MAX_DIMS: usize = 8;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// UINT8 (type 0).
    U8(u8),
    /// INT8 (1).
    I8(i8),
    /// UINT16 (2).
    U16(u16),
    /// INT16 (3).
    I16(i16),
    /// UINT32 (4).
    U32(u32),
    /// INT32 (5).
    I32(i32),
    /// FLOAT32 (6).
    F32(f32),
    /// BOOL (7).
    Bool(bool),
    /// STRING (8), UTF-8.
    Str(String),
    /// ARRAY (9): element type id and elements (all of that type).
    Array(u32, Vec<Value>),
    /// UINT64 (10).
    U64(u64),
    /// INT64 (11).
    I64(i64),
    /// FLOAT64 (12).
    F64(f64),
}

impl Value {
    /// The GGUF value type id.
    pub fn type_id(&self) -> u32 {
        match self {
            Value::U8(_) => 0,
            Value::I8(_) => 1,
            Value::U16(_) => 2,
            Value::I16(_) => 3,
            Value::U32(_) => 4,
            Value::I32(_) => 5,
            Value::F32(_) => 6,
            Value::Bool(_) => 7,
            Value::Str(_) => 8,
            Value::Array(..) => 9,
            Value::U64(_) => 10,
            Value::I64(_) => 11,
            Value::F64(_) => 12,
        }
    }

    /// The value as an unsigned integer, if it is one of the integer types and non-negative.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Value::U8(v) => out.push(*v),
            Value::I8(v) => out.push(*v as u8),
            Value::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
            Value::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
            Value::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
            Value::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
            Value::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
            Value::Bool(v) => out.push(*v as u8),
            Value::Str(s) => put_str(out, s),
            Value::Array(t, items) => {
                out.extend_from_slice(&t.to_le_bytes());
                out.extend_from_slice(&(items.len() as u64).to_le_bytes());
                for v in items {
                    v.write(out);
                }
            }
            Value::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
            Value::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
            Value::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        }
    }
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Str(s) => write!(f, "{s:?}"),
            Value::Array(_, items) => write!(f, "[{} items]", items.len()),
            Value::F32(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            other => write!(
                f,
                "{}",
                other
                    .as_u64()
                    .map_or(format!("{other:?}"), |v| v.to_string())
            ),
        }
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// One tensor's entry in the header.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufTensor {
    /// Name as stored.
    pub name: String,
    /// `ne`: dimensions, innermost first (the torch shape reversed).
    pub ne: Vec<u64>,
    /// The ggml type.
    pub ty: GgmlType,
    /// Offset of the data from the start of the data section.
    pub offset: u64,
}

impl GgufTensor {
    /// Element count (checked).
    pub fn numel(&self) -> Option<u64> {
        self.ne.iter().try_fold(1u64, |a, &d| a.checked_mul(d))
    }

    /// Byte length of the data (checked; `None` for partial blocks or overflow).
    pub fn n_bytes(&self) -> Option<u64> {
        let n = usize::try_from(self.numel()?).ok()?;
        self.ty.byte_len(n).map(|b| b as u64)
    }
}

/// The torch shape of a GGUF `ne` (reversed).
pub fn torch_shape(ne: &[u64]) -> Vec<usize> {
    ne.iter().rev().map(|&d| d as usize).collect()
}

/// A parsed GGUF header; tensor data lies at `data_start + offset`.
#[derive(Clone, Debug, PartialEq)]
pub struct Gguf {
    /// Format version (2 or 3).
    pub version: u32,
    /// Metadata in file order.
    pub kv: Vec<(String, Value)>,
    /// Tensor infos in file order.
    pub tensors: Vec<GgufTensor>,
    /// Data alignment.
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_start: u64,
}

impl Gguf {
    /// The value of a metadata key.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.kv.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Absolute byte range of tensor `i`'s data (validated by [`parse`]).
    pub fn range(&self, i: usize) -> std::ops::Range<usize> {
        let t = &self.tensors[i];
        let start = (self.data_start + t.offset) as usize;
        start..start + t.n_bytes().unwrap_or(0) as usize
    }
}

/// Why a GGUF file was refused. The file path is attached by the caller.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GgufError {
    /// Not a GGUF file.
    #[error("not a GGUF file: expected magic \"GGUF\", found {found:?}")]
    Magic {
        /// The first bytes.
        found: Vec<u8>,
    },
    /// A version this reader does not know.
    #[error("GGUF version {0}: expected 2 or 3")]
    Version(u32),
    /// The file ends inside the header.
    #[error("GGUF header truncated at byte {at} while reading {what}")]
    Truncated {
        /// Where.
        at: usize,
        /// What was being read.
        what: String,
    },
    /// A count or length is beyond any sane size.
    #[error("{what}: count {count} exceeds the limit {limit}")]
    TooLarge {
        /// What.
        what: String,
        /// Found.
        count: u64,
        /// Limit.
        limit: u64,
    },
    /// A string that is not UTF-8.
    #[error("{what}: not valid UTF-8")]
    Utf8 {
        /// What.
        what: String,
    },
    /// An unknown metadata value type.
    #[error("metadata {key:?}: unknown value type {ty}")]
    ValueType {
        /// Key.
        key: String,
        /// Type id found.
        ty: u32,
    },
    /// A tensor type wanbake does not read.
    #[error(
        "tensor {name:?}: ggml type {ty} is not supported (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)"
    )]
    TensorType {
        /// Tensor.
        name: String,
        /// Type id found.
        ty: u32,
    },
    /// Bad dimensions.
    #[error("tensor {name:?}: {what}")]
    Shape {
        /// Tensor.
        name: String,
        /// What is wrong.
        what: String,
    },
    /// Data that is misaligned, overlapping or past the end of the file.
    #[error(
        "tensor {name:?}: data at {offset}+{len} {what} (data section {data_start}..{file_len})"
    )]
    Data {
        /// Tensor.
        name: String,
        /// Relative offset.
        offset: u64,
        /// Byte length.
        len: u64,
        /// What is wrong.
        what: &'static str,
        /// Data section start.
        data_start: u64,
        /// File length.
        file_len: u64,
    },
    /// Two entries with the same name.
    #[error("duplicate {what} {name:?}")]
    Duplicate {
        /// "tensor" or "metadata key".
        what: &'static str,
        /// Name.
        name: String,
    },
    /// A bad `general.alignment`.
    #[error("general.alignment = {0}: expected a power of two")]
    Alignment(u64),
}

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len());
        let end = end.ok_or_else(|| GgufError::Truncated {
            at: self.at,
            what: what(),
        })?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn arr<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.arr(what)?))
    }
    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.arr(what)?))
    }
    fn count(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        let n = self.u64(what)?;
        if n > MAX_COUNT {
            return Err(GgufError::TooLarge {
                what: what(),
                count: n,
                limit: MAX_COUNT,
            });
        }
        Ok(n)
    }
    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let n = self.count(what)?;
        let s = self.take(n as usize, what)?;
        String::from_utf8(s.to_vec()).map_err(|_| GgufError::Utf8 { what: what() })
    }
    fn value(&mut self, ty: u32, key: &str, depth: u32) -> Result<Value, GgufError> {
        let what = &|| format!("metadata {key:?}");
        Ok(match ty {
            0 => Value::U8(self.arr::<1>(what)?[0]),
            1 => Value::I8(self.arr::<1>(what)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.arr(what)?)),
            3 => Value::I16(i16::from_le_bytes(self.arr(what)?)),
            4 => Value::U32(self.u32(what)?),
            5 => Value::I32(i32::from_le_bytes(self.arr(what)?)),
            6 => Value::F32(f32::from_le_bytes(self.arr(what)?)),
            7 => Value::Bool(self.arr::<1>(what)?[0] != 0),
            8 => Value::Str(self.string(what)?),
            9 if depth == 0 => {
                let et = self.u32(what)?;
                let n = self.count(what)?;
                // Every element takes at least one byte: a count past the file is truncation.
                if n as usize > self.b.len() - self.at {
                    return Err(GgufError::Truncated {
                        at: self.at,
                        what: what(),
                    });
                }
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(et, key, depth + 1)?);
                }
                Value::Array(et, items)
            }
            10 => Value::U64(self.u64(what)?),
            11 => Value::I64(i64::from_le_bytes(self.arr(what)?)),
            12 => Value::F64(f64::from_le_bytes(self.arr(what)?)),
            _ => {
                return Err(GgufError::ValueType {
                    key: key.to_string(),
                    ty,
                });
            }
        })
    }
}

/// Parses a whole GGUF file: header, metadata, tensor infos, and checks that every tensor's
/// data is aligned, inside the file and overlaps no other.
pub fn parse(bytes: &[u8]) -> Result<Gguf, GgufError> {
    let mut c = Cursor { b: bytes, at: 0 };
    let magic = c
        .take(4, &|| "magic".into())
        .map_err(|_| GgufError::Magic {
            found: bytes[..bytes.len().min(4)].to_vec(),
        })?;
    if magic != MAGIC {
        return Err(GgufError::Magic {
            found: magic.to_vec(),
        });
    }
    let version = c.u32(&|| "version".into())?;
    if version != 2 && version != 3 {
        return Err(GgufError::Version(version));
    }
    let n_tensors = c.count(&|| "tensor count".into())?;
    let n_kv = c.count(&|| "metadata count".into())?;
    let mut kv: Vec<(String, Value)> = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..n_kv {
        let key = c.string(&|| format!("metadata key {i}"))?;
        let ty = c.u32(&|| format!("metadata {key:?} type"))?;
        let v = c.value(ty, &key, 0)?;
        if !seen.insert(key.clone()) {
            return Err(GgufError::Duplicate {
                what: "metadata key",
                name: key,
            });
        }
        kv.push((key, v));
    }
    let mut tensors = Vec::new();
    let mut names = std::collections::BTreeSet::new();
    for i in 0..n_tensors {
        let name = c.string(&|| format!("tensor info {i}"))?;
        let what = || format!("tensor info {name:?}");
        let nd = c.u32(&what)? as usize;
        if nd == 0 || nd > MAX_DIMS {
            return Err(GgufError::Shape {
                name,
                what: format!("{nd} dimensions (expected 1..={MAX_DIMS})"),
            });
        }
        let mut ne = Vec::with_capacity(nd);
        for _ in 0..nd {
            ne.push(c.u64(&what)?);
        }
        let tid = c.u32(&what)?;
        let ty = GgmlType::from_id(tid).ok_or_else(|| GgufError::TensorType {
            name: name.clone(),
            ty: tid,
        })?;
        // Blocks never span rows: ggml (`gguf_init_from_file_impl`) and gguf-py
        // (`quant_shape_to_byte_shape`) refuse a row (`ne[0]`) that is not whole blocks.
        let bs = ty.block_size() as u64;
        if !ne[0].is_multiple_of(bs) {
            return Err(GgufError::Shape {
                name,
                what: format!(
                    "{} elements per row (ne[0]) are not a whole number of {bs}-element {ty} blocks",
                    ne[0]
                ),
            });
        }
        let offset = c.u64(&what)?;
        if !names.insert(name.clone()) {
            return Err(GgufError::Duplicate {
                what: "tensor",
                name,
            });
        }
        tensors.push(GgufTensor {
            name,
            ne,
            ty,
            offset,
        });
    }
    let alignment = match kv.iter().find(|(k, _)| k == "general.alignment") {
        Some((_, v)) => {
            let a = v.as_u64().unwrap_or(0);
            if a == 0 || !a.is_power_of_two() {
                return Err(GgufError::Alignment(a));
            }
            a
        }
        None => DEFAULT_ALIGNMENT,
    };
    let data_start = (c.at as u64).next_multiple_of(alignment);
    let file_len = bytes.len() as u64;
    let mut spans: Vec<(u64, u64, usize)> = Vec::new();
    for (i, t) in tensors.iter().enumerate() {
        let len = t.n_bytes().ok_or_else(|| GgufError::Shape {
            name: t.name.clone(),
            what: format!(
                "ne {:?} is not a whole number of {}-element {} blocks (or overflows)",
                t.ne,
                t.ty.block_size(),
                t.ty
            ),
        })?;
        let err = |what| GgufError::Data {
            name: t.name.clone(),
            offset: t.offset,
            len,
            what,
            data_start,
            file_len,
        };
        if t.offset % alignment != 0 {
            return Err(err("is not aligned"));
        }
        let end = data_start
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(len))
            .ok_or_else(|| err("overflows"))?;
        if end > file_len {
            return Err(err("runs past the end of the file"));
        }
        spans.push((t.offset, t.offset + len, i));
    }
    spans.sort();
    for w in spans.windows(2) {
        if w[1].0 < w[0].1 {
            let t = &tensors[w[1].2];
            return Err(GgufError::Data {
                name: t.name.clone(),
                offset: t.offset,
                len: w[1].1 - w[1].0,
                what: "overlaps another tensor",
                data_start,
                file_len,
            });
        }
    }
    Ok(Gguf {
        version,
        kv,
        tensors,
        alignment,
        data_start,
    })
}

/// Planned tensor for [`GgufLayout::new`]: name, `ne` and type.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorPlan {
    /// Name.
    pub name: String,
    /// Dimensions, innermost first.
    pub ne: Vec<u64>,
    /// Type.
    pub ty: GgmlType,
}

/// A laid-out GGUF file: the header bytes (already padded to the alignment) and where each
/// tensor's data goes. Bytes between tensors are zero padding.
#[derive(Clone, Debug)]
pub struct GgufLayout {
    /// Everything before the first tensor's data, padding included.
    pub header: Vec<u8>,
    /// Per tensor, in plan order: absolute offset in the file and byte length.
    pub spans: Vec<(u64, u64)>,
    /// Total file length.
    pub len: u64,
}

impl GgufLayout {
    /// Lays out the file as gguf-py does: tensors in the given order, each padded to
    /// [`DEFAULT_ALIGNMENT`]. Panics on a tensor whose size is not whole blocks (the caller
    /// chose the types).
    #[track_caller]
    pub fn new(kv: &[(String, Value)], tensors: &[TensorPlan]) -> GgufLayout {
        let a = DEFAULT_ALIGNMENT;
        let mut h = Vec::new();
        h.extend_from_slice(MAGIC);
        h.extend_from_slice(&VERSION.to_le_bytes());
        h.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        h.extend_from_slice(&(kv.len() as u64).to_le_bytes());
        for (k, v) in kv {
            put_str(&mut h, k);
            h.extend_from_slice(&v.type_id().to_le_bytes());
            v.write(&mut h);
        }
        let mut rel = 0u64;
        let mut sizes = Vec::with_capacity(tensors.len());
        for t in tensors {
            let numel: u64 = t.ne.iter().product();
            let len = t.ty.byte_len(numel as usize).unwrap_or_else(|| {
                panic!("{}: {numel} elements are not whole {} blocks", t.name, t.ty)
            }) as u64;
            put_str(&mut h, &t.name);
            h.extend_from_slice(&(t.ne.len() as u32).to_le_bytes());
            for &d in &t.ne {
                h.extend_from_slice(&d.to_le_bytes());
            }
            h.extend_from_slice(&t.ty.id().to_le_bytes());
            h.extend_from_slice(&rel.to_le_bytes());
            sizes.push((rel, len));
            rel = (rel + len).next_multiple_of(a);
        }
        let data_start = (h.len() as u64).next_multiple_of(a);
        h.resize(data_start as usize, 0);
        let spans = sizes.iter().map(|&(r, l)| (data_start + r, l)).collect();
        let end = sizes
            .last()
            .map_or(data_start, |&(r, l)| data_start + r + l);
        GgufLayout {
            header: h,
            spans,
            len: end,
        }
    }
}

impl GgufLayout {
    /// The layout as the release writer's file plan sees it: `header` as the prefix and one
    /// raw byte range per tensor (dtype `U8`, shape `[n_bytes]`), in plan order.
    pub fn to_header_layout(&self, tensors: &[TensorPlan]) -> HeaderLayout {
        let infos = tensors
            .iter()
            .zip(&self.spans)
            .map(|(t, &(off, len))| TensorInfo {
                name: t.name.clone(),
                dtype: DType::U8,
                shape: vec![len as usize],
                begin: off as usize,
                end: (off + len) as usize,
            })
            .collect();
        HeaderLayout {
            prefix: self.header.clone(),
            tensors: infos,
            data_len: self.len as usize - self.header.len(),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::codec::ggml;

    /// A two-tensor plan (a Q8_0 block pair, three F32s) with three metadata keys.
    pub(crate) fn tiny() -> (Vec<(String, Value)>, Vec<TensorPlan>) {
        let kv = vec![
            ("general.architecture".to_string(), Value::Str("wan".into())),
            ("general.file_type".to_string(), Value::U32(7)),
            (
                "x".to_string(),
                Value::Array(5, vec![Value::I32(1), Value::I32(-2)]),
            ),
        ];
        let t = vec![
            TensorPlan {
                name: "a".into(),
                ne: vec![32, 2],
                ty: GgmlType::Q8_0,
            },
            TensorPlan {
                name: "b".into(),
                ne: vec![3],
                ty: GgmlType::F32,
            },
        ];
        (kv, t)
    }

    fn file() -> Vec<u8> {
        let (kv, t) = tiny();
        let l = GgufLayout::new(&kv, &t);
        let mut f = l.header.clone();
        f.resize(l.len as usize, 0);
        f
    }

    #[test]
    fn layout_round_trips() {
        let (kv, t) = tiny();
        let l = GgufLayout::new(&kv, &t);
        let g = parse(&file()).unwrap();
        assert_eq!(g.kv, kv);
        assert_eq!(g.tensors.len(), 2);
        assert_eq!(g.tensors[1].offset, 96, "68 bytes padded to 96");
        assert_eq!(g.range(0).start as u64, l.spans[0].0);
        assert_eq!(
            g.range(1),
            l.spans[1].0 as usize..l.spans[1].0 as usize + 12
        );
        assert_eq!(l.header.len() % 32, 0);
    }

    #[test]
    fn every_truncation_is_an_error() {
        let f = file();
        let g = parse(&f).unwrap();
        let end = g.range(1).end;
        for n in 0..end {
            assert!(parse(&f[..n]).is_err(), "a file cut at {n} bytes parsed");
        }
    }

    /// Every single-byte corruption of a valid file (each position, a few values) parses to
    /// Ok or Err without panicking, and an Ok keeps every tensor inside the file, aligned and
    /// decodable.
    #[test]
    fn byte_mutations_never_panic() {
        let f = file();
        for i in 0..f.len() {
            for v in [0u8, 1, 0x7F, 0x80, 0xFF, f[i].wrapping_add(1)] {
                let mut b = f.clone();
                b[i] = v;
                if let Ok(g) = parse(&b) {
                    for (k, t) in g.tensors.iter().enumerate() {
                        let r = g.range(k);
                        assert!(r.end <= b.len() && (r.start as u64).is_multiple_of(g.alignment));
                        let n = t.numel().unwrap() as usize;
                        let mut out = vec![0f32; n];
                        ggml::dequantize(t.ty, &b[r], &mut out);
                    }
                }
            }
        }
    }

    #[test]
    fn hostile_headers() {
        let f = file();
        let mut bad = f.clone();
        bad[0] = b'X';
        assert!(matches!(parse(&bad), Err(GgufError::Magic { .. })));
        let mut bad = f.clone();
        bad[4] = 9;
        assert!(matches!(parse(&bad), Err(GgufError::Version(9))));
        let mut bad = f.clone();
        bad[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(parse(&bad), Err(GgufError::TooLarge { .. })));
        // the second tensor's offset moved onto the first
        let g = parse(&f).unwrap();
        let pos = f
            .windows(8)
            .rposition(|w| w == 96u64.to_le_bytes())
            .unwrap();
        let mut bad = f.clone();
        bad[pos..pos + 8].copy_from_slice(&32u64.to_le_bytes());
        let e = parse(&bad).unwrap_err();
        assert!(e.to_string().contains("overlaps"), "{e}");
        let mut bad = f.clone();
        bad[pos..pos + 8].copy_from_slice(&4u64.to_le_bytes());
        assert!(parse(&bad).unwrap_err().to_string().contains("not aligned"));
        assert_eq!(g.alignment, 32);
    }
}

/// One test per malformation of a GGUF file: each is built field by field and must come back
/// as the right `Err`, never a panic or an accepted header.
#[cfg(test)]
mod hostile {
    use super::*;

    /// A GGUF file written field by field, so a test can break exactly one field.
    #[derive(Clone, Default)]
    struct W(Vec<u8>);

    impl W {
        fn header(n_tensors: u64, n_kv: u64) -> W {
            W(Vec::new()).raw(MAGIC).u32(3).u64(n_tensors).u64(n_kv)
        }
        fn raw(mut self, b: &[u8]) -> W {
            self.0.extend_from_slice(b);
            self
        }
        fn u32(self, v: u32) -> W {
            self.raw(&v.to_le_bytes())
        }
        fn u64(self, v: u64) -> W {
            self.raw(&v.to_le_bytes())
        }
        fn str(self, s: &str) -> W {
            self.u64(s.len() as u64).raw(s.as_bytes())
        }
        /// A metadata entry of type STRING.
        fn kv_str(self, k: &str, v: &str) -> W {
            self.str(k).u32(8).str(v)
        }
        /// A tensor info.
        fn tensor(self, name: &str, ne: &[u64], ty: u32, offset: u64) -> W {
            let mut w = self.str(name).u32(ne.len() as u32);
            for &d in ne {
                w = w.u64(d);
            }
            w.u32(ty).u64(offset)
        }
        /// Pads to the 32-byte alignment and appends `n` data bytes.
        fn data(mut self, n: usize) -> Vec<u8> {
            let start = self.0.len().next_multiple_of(32);
            self.0.resize(start + n, 0);
            self.0
        }
    }

    const Q8_0: u32 = 8;
    const F32: u32 = 0;

    /// One Q8_0 tensor of 32 elements (34 bytes) and one string key.
    fn valid() -> W {
        W::header(1, 1)
            .kv_str("general.architecture", "wan")
            .tensor("t", &[32], Q8_0, 0)
    }

    fn err(b: &[u8]) -> GgufError {
        match parse(b) {
            Ok(g) => panic!("accepted: {g:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn the_valid_file_parses() {
        let g = parse(&valid().data(34)).unwrap();
        assert_eq!(g.tensors[0].n_bytes(), Some(34));
        assert_eq!(g.data_start % 32, 0);
    }

    #[test]
    fn truncated_inside_each_field() {
        let f = valid().data(34);
        let g = parse(&f).unwrap();
        let data_start = g.data_start as usize;
        // (cut, what): inside the magic, version, both counts, the key length and text, the value
        // type, the value's length and text, the tensor name, n_dims, ne, type, offset.
        let header_cuts = [2, 6, 12, 20, 26, 40, 50, 54, 60, 65, 70, 75, 82, 88, 94];
        for cut in header_cuts {
            let e = err(&f[..cut]);
            if cut < 4 {
                assert!(matches!(e, GgufError::Magic { .. }), "{cut}: {e}");
            } else {
                assert!(matches!(e, GgufError::Truncated { .. }), "{cut}: {e}");
            }
        }
        // The header is whole but the data is cut (before and inside the tensor).
        for cut in [data_start - 1, data_start, data_start + 10, data_start + 33] {
            let e = err(&f[..cut]);
            assert!(
                matches!(e, GgufError::Data { what, .. } if what.contains("past the end")),
                "{cut}: {e}"
            );
        }
    }

    #[test]
    fn tensor_data_past_the_end() {
        // One byte short.
        let e = err(&valid().data(33));
        assert!(e.to_string().contains("runs past the end"), "{e}");
        // An offset (aligned) beyond the file.
        let f = W::header(1, 0).tensor("t", &[32], Q8_0, 1 << 20).data(34);
        assert!(err(&f).to_string().contains("runs past the end"));
        // An offset so large that data_start + offset overflows.
        let f = W::header(1, 0)
            .tensor("t", &[32], Q8_0, u64::MAX - 31)
            .data(34);
        assert!(err(&f).to_string().contains("overflows"));
    }

    #[test]
    fn block_tensor_whose_element_count_is_not_whole_blocks() {
        for (ne, ty) in [(&[33u64][..], Q8_0), (&[255][..], 12), (&[31, 1][..], 2)] {
            let f = W::header(1, 0).tensor("t", ne, ty, 0).data(4096);
            let e = err(&f);
            assert!(matches!(e, GgufError::Shape { .. }), "{ne:?}: {e}");
        }
    }

    /// ggml (`gguf_init_from_file_impl`: "elements per row, not a multiple of block size") and
    /// gguf-py (`quant_shape_to_byte_shape`) refuse a block type whose ROW (`ne[0]`) is not whole
    /// blocks even when the element total is: blocks never span rows.
    #[test]
    fn block_tensor_whose_rows_are_not_whole_blocks() {
        for (ne, ty) in [
            (&[16u64, 2][..], Q8_0),
            (&[128, 2][..], 12),
            (&[1, 32][..], Q8_0),
        ] {
            let f = W::header(1, 0).tensor("t", ne, ty, 0).data(4096);
            let e = err(&f);
            assert!(matches!(e, GgufError::Shape { .. }), "{ne:?}: {e}");
        }
        // Element types (block size 1) have no such rule.
        let f = W::header(1, 0).tensor("t", &[3, 5], F32, 0).data(60);
        assert!(parse(&f).is_ok());
    }

    #[test]
    fn unknown_ggml_type_id() {
        // 99 and u32::MAX exist nowhere; 9 (Q8_1) and 16 (IQ2_XXS) are ggml types this reader
        // does not decode.
        for ty in [99, u32::MAX, 9, 16, 4, 5] {
            let f = W::header(1, 0).tensor("t", &[256], ty, 0).data(4096);
            let e = err(&f);
            assert!(
                matches!(e, GgufError::TensorType { ty: t, .. } if t == ty),
                "{ty}: {e}"
            );
        }
    }

    #[test]
    fn absurd_counts() {
        let too_large = |b: &[u8]| matches!(err(b), GgufError::TooLarge { .. });
        let truncated = |b: &[u8]| matches!(err(b), GgufError::Truncated { .. });
        // n_tensors / n_kv past the cap, and at the cap in a tiny file (no allocation up front).
        assert!(too_large(&W::header(u64::MAX, 0).0));
        assert!(too_large(&W::header(0, 1 << 40).0));
        assert!(truncated(&W::header(MAX_COUNT, 0).0));
        assert!(truncated(&W::header(0, MAX_COUNT).0));
        // A key length, a string value length.
        assert!(too_large(&W::header(0, 1).u64(1 << 40).0));
        assert!(truncated(&W::header(0, 1).u64(1 << 31).raw(b"abc").0));
        assert!(too_large(&W::header(0, 1).str("k").u32(8).u64(u64::MAX).0));
        assert!(truncated(&W::header(0, 1).str("k").u32(8).u64(1 << 31).0));
        // An array length: past the cap, and more elements than bytes left.
        let arr = |n: u64| W::header(0, 1).str("k").u32(9).u32(4).u64(n).raw(&[0; 64]);
        assert!(too_large(&arr(1 << 40).0));
        assert!(truncated(&arr(1 << 31).0));
        assert!(truncated(&arr(17).0), "17 u32 need 68 bytes, 64 are there");
        assert!(parse(&arr(16).0).is_ok());
        // A tensor name length.
        assert!(too_large(&W::header(1, 0).u64(u64::MAX).0));
        // n_dims: 0, MAX_DIMS + 1, u32::MAX.
        for nd in [0u32, MAX_DIMS as u32 + 1, u32::MAX] {
            let f = W::header(1, 0).str("t").u32(nd).raw(&[0; 128]);
            assert!(matches!(err(&f.0), GgufError::Shape { .. }), "n_dims {nd}");
        }
    }

    #[test]
    fn overlapping_and_misaligned_offsets() {
        let two = |o2: u64| {
            W::header(2, 0)
                .tensor("a", &[32], Q8_0, 0)
                .tensor("b", &[32], Q8_0, o2)
                .data(4096)
        };
        assert!(parse(&two(64)).is_ok());
        for o2 in [0, 32] {
            let e = err(&two(o2));
            assert!(e.to_string().contains("overlaps"), "{o2}: {e}");
        }
        for o2 in [1, 31, 33, 63] {
            let e = err(&two(o2));
            assert!(e.to_string().contains("not aligned"), "{o2}: {e}");
        }
        // With general.alignment = 64, offset 32 is misaligned too.
        let f = W::header(1, 1)
            .str("general.alignment")
            .u32(4)
            .u32(64)
            .tensor("a", &[32], Q8_0, 32)
            .data(4096);
        assert!(err(&f).to_string().contains("not aligned"));
    }

    #[test]
    fn overflowing_ne_product() {
        for ne in [
            &[1u64 << 32, 1 << 32, 1 << 32][..],
            &[u64::MAX, 2][..],
            &[1 << 62][..], // numel fits, 4 bytes each does not
            &[u64::MAX][..],
        ] {
            let f = W::header(1, 0).tensor("t", ne, F32, 0).data(64);
            let e = err(&f);
            assert!(matches!(e, GgufError::Shape { .. }), "{ne:?}: {e}");
        }
        // Data of 2^40 elements claimed in a small file: a size that fits, past the end.
        let f = W::header(1, 0)
            .tensor("t", &[1 << 20, 1 << 20], F32, 0)
            .data(64);
        assert!(err(&f).to_string().contains("past the end"));
    }

    #[test]
    fn bad_alignment_values() {
        let with = |ty: u32, v: &[u8]| {
            W::header(1, 1)
                .str("general.alignment")
                .u32(ty)
                .raw(v)
                .tensor("a", &[32], Q8_0, 0)
                .data(4096)
        };
        for (ty, v) in [
            (4u32, &0u32.to_le_bytes()[..]),
            (4, &48u32.to_le_bytes()[..]),
        ] {
            assert!(matches!(err(&with(ty, v)), GgufError::Alignment(_)));
        }
        // A string where a number belongs.
        let f = W::header(0, 1)
            .str("general.alignment")
            .u32(8)
            .str("32")
            .data(0);
        assert!(matches!(err(&f), GgufError::Alignment(0)));
        // The largest power of two: the data would start past the file.
        let f = with(10, &(1u64 << 63).to_le_bytes());
        assert!(err(&f).to_string().contains("past the end"));
    }

    #[test]
    fn bad_values_and_names() {
        // Unknown value type, nested array, invalid UTF-8, duplicate key, duplicate tensor.
        let f = W::header(0, 1).str("k").u32(13).raw(&[0; 8]);
        assert!(matches!(err(&f.0), GgufError::ValueType { ty: 13, .. }));
        let f = W::header(0, 1).str("k").u32(9).u32(9).u64(1).u32(4).u64(0);
        assert!(matches!(err(&f.0), GgufError::ValueType { ty: 9, .. }));
        let f = W::header(0, 1).u64(2).raw(&[0xC3, 0x28]).u32(4).u32(1);
        assert!(matches!(err(&f.0), GgufError::Utf8 { .. }));
        let f = W::header(0, 2).kv_str("k", "a").kv_str("k", "b");
        assert!(matches!(err(&f.0), GgufError::Duplicate { .. }));
        let f = W::header(2, 0)
            .tensor("a", &[32], Q8_0, 0)
            .tensor("a", &[32], Q8_0, 64)
            .data(4096);
        assert!(matches!(err(&f), GgufError::Duplicate { .. }));
    }
}
