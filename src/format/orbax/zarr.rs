//! zarr arrays as tensorstore writes them for Orbax: metadata (`.zarray` for zarr v2,
//! `zarr.json` for zarr v3), chunk keys, fill values, chunk decoding, and the array reader
//! that reassembles a multi-chunk array exactly, whole or one outer index (row of the first
//! dimension) at a time.
//!
//! Supported subset (what Orbax 0.12.8 / tensorstore 0.1.86 write; anything else is refused
//! with `FormatError::Unsupported` naming the field): zarr v2 with `order` "C", `filters`
//! null, `compressor` zstd or null, `dimension_separator` "." or "/", little-endian numpy
//! dtypes (`<f2 <f4 <f8 <i2 <i4 <i8 <u2 <u4 <u8 |i1 |u1 |b1`) and Orbax's `bfloat16`; zarr v3
//! with a `regular` chunk grid, `default` or `v2` chunk-key encoding, and codecs either
//! `bytes` (little endian) [+ `zstd`] [+ `crc32c`], or one `sharding_indexed` whose inner
//! codecs are those and whose index codecs are `bytes` [+ `crc32c`], index at the end or
//! start. Chunks at the edge are full-size on disk and cropped when read. A missing chunk
//! (or a shard entry marked missing) reads as the fill value; where the fill value is null
//! (zarr v2's default in Orbax files) it is an error.
//!
//! Memory: `ArrayReader::rows` streams. When one chunk spans every dimension after the first
//! (Orbax's default: the chunk is the whole array, or MaxText-style splits along the first
//! axis only) the chunk is decompressed as a stream and each row is handed out as soon as it
//! is decoded, so a 5.7 GB stacked tensor is never held whole. Otherwise one chunk-row (the
//! chunks that share a first-axis index: at most `chunk_shape[0]` rows) is assembled at a time.

use std::collections::HashMap;
use std::io::Read;
use std::ops::Range;

use half::{bf16, f16};
use serde_json::Value as Json;

use super::db::{Store, Value};
use super::error::{FormatError, OrbaxError};
use crate::codec::dtype::DType;

/// Most dimensions an array may have.
pub const MAX_RANK: usize = 32;
/// Largest decoded chunk `read_all`-style paths hold in memory at once (8 GiB).
pub const MAX_CHUNK_BYTES: u64 = 8 << 30;
/// Largest metadata document read.
pub const MAX_METADATA_BYTES: u64 = 1 << 20;

/// Which zarr version an array is stored as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZarrVersion {
    /// `.zarray`.
    V2,
    /// `zarr.json`.
    V3,
}

/// How a chunk's bytes are compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compressor {
    /// Raw little-endian C-order bytes.
    None,
    /// One (or more) zstd frames.
    Zstd,
}

/// How chunk grid coordinates become keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyEncoding {
    /// zarr v2 (and v3's `v2` encoding): `i.j.k`, a scalar `0`.
    V2 {
        /// Separator.
        separator: char,
    },
    /// zarr v3 `default`: `c/i/j/k`, a scalar `c`.
    Default {
        /// Separator.
        separator: char,
    },
}

impl KeyEncoding {
    /// The key of the chunk at `coords`, relative to the array.
    pub fn key(&self, coords: &[u64]) -> String {
        let join = |sep: char| {
            coords
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(&sep.to_string())
        };
        match self {
            KeyEncoding::V2 { separator } => {
                if coords.is_empty() {
                    "0".into()
                } else {
                    join(*separator)
                }
            }
            KeyEncoding::Default { separator } => {
                if coords.is_empty() {
                    "c".into()
                } else {
                    format!("c{separator}{}", join(*separator))
                }
            }
        }
    }
}

/// Where a shard's index is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexLocation {
    /// At the end (the default).
    End,
    /// At the start.
    Start,
}

/// zarr v3 sharding: the stored objects are shards of `shard_shape`, each holding a grid of
/// inner chunks of `ArrayMeta::chunk_shape`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sharding {
    /// Shape of one shard (the array's chunk grid).
    pub shard_shape: Vec<u64>,
    /// Whether the index ends with a CRC-32C.
    pub index_crc32c: bool,
    /// Where the index is.
    pub index_location: IndexLocation,
}

/// The parsed metadata of one array.
#[derive(Clone, Debug, PartialEq)]
pub struct ArrayMeta {
    /// zarr version.
    pub version: ZarrVersion,
    /// Array shape (empty for a scalar).
    pub shape: Vec<u64>,
    /// Element type.
    pub dtype: DType,
    /// Shape of the unit that is compressed (a chunk, or an inner chunk of a shard).
    pub chunk_shape: Vec<u64>,
    /// Chunk compression.
    pub compressor: Compressor,
    /// Whether each chunk ends with a CRC-32C (zarr v3 `crc32c` codec).
    pub chunk_crc32c: bool,
    /// One element of the fill value, little endian; `None` when there is none (null).
    pub fill_value: Option<Vec<u8>>,
    /// Chunk keys.
    pub key_encoding: KeyEncoding,
    /// zarr v3 sharding, if used.
    pub sharding: Option<Sharding>,
}

impl ArrayMeta {
    /// Bytes of one element.
    pub fn item_size(&self) -> usize {
        self.dtype.element_bytes()
    }

    /// Number of elements of the array.
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Byte length of the whole array (checked when the metadata was parsed).
    pub fn nbytes(&self) -> u64 {
        self.numel() * self.item_size() as u64
    }

    /// Bytes of one decoded chunk.
    pub fn chunk_nbytes(&self) -> u64 {
        self.chunk_shape.iter().product::<u64>() * self.item_size() as u64
    }

    /// Chunks along each dimension.
    pub fn grid(&self) -> Vec<u64> {
        self.shape
            .iter()
            .zip(&self.chunk_shape)
            .map(|(&s, &c)| s.div_ceil(c))
            .collect()
    }
}

fn json_err(what: &'static str, reason: impl Into<String>) -> FormatError {
    FormatError::Json {
        what,
        reason: reason.into(),
    }
}

fn unsupported(what: &'static str, feature: impl Into<String>) -> FormatError {
    FormatError::Unsupported {
        what,
        feature: feature.into(),
    }
}

fn u64_list(v: Option<&Json>, what: &'static str, field: &str) -> Result<Vec<u64>, FormatError> {
    let Some(Json::Array(items)) = v else {
        return Err(json_err(
            what,
            format!("`{field}` must be an array of integers"),
        ));
    };
    if items.len() > MAX_RANK {
        return Err(json_err(
            what,
            format!(
                "`{field}` has {} dimensions; at most {MAX_RANK}",
                items.len()
            ),
        ));
    }
    items
        .iter()
        .map(|x| {
            x.as_u64().ok_or_else(|| {
                json_err(
                    what,
                    format!("`{field}` holds {x}, not a non-negative integer"),
                )
            })
        })
        .collect()
}

/// Element type of a numpy dtype string (zarr v2) or of Orbax's `bfloat16`.
pub fn dtype_from_v2(s: &str) -> Option<DType> {
    Some(match s {
        "bfloat16" => DType::BF16,
        "<f2" => DType::F16,
        "<f4" => DType::F32,
        "<f8" => DType::F64,
        "|i1" | "<i1" => DType::I8,
        "<i2" => DType::I16,
        "<i4" => DType::I32,
        "<i8" => DType::I64,
        "|u1" | "<u1" => DType::U8,
        "<u2" => DType::U16,
        "<u4" => DType::U32,
        "<u8" => DType::U64,
        "|b1" => DType::BOOL,
        _ => return None,
    })
}

/// The numpy dtype string tensorstore writes in `.zarray` for an element type.
pub fn dtype_to_v2(d: DType) -> Option<&'static str> {
    Some(match d {
        DType::BF16 => "bfloat16",
        DType::F16 => "<f2",
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        DType::I8 => "|i1",
        DType::I16 => "<i2",
        DType::I32 => "<i4",
        DType::I64 => "<i8",
        DType::U8 => "|u1",
        DType::U16 => "<u2",
        DType::U32 => "<u4",
        DType::U64 => "<u8",
        DType::BOOL => "|b1",
        _ => return None,
    })
}

/// Element type of a zarr v3 `data_type`.
pub fn dtype_from_v3(s: &str) -> Option<DType> {
    Some(match s {
        "bfloat16" => DType::BF16,
        "float16" => DType::F16,
        "float32" => DType::F32,
        "float64" => DType::F64,
        "int8" => DType::I8,
        "int16" => DType::I16,
        "int32" => DType::I32,
        "int64" => DType::I64,
        "uint8" => DType::U8,
        "uint16" => DType::U16,
        "uint32" => DType::U32,
        "uint64" => DType::U64,
        "bool" => DType::BOOL,
        _ => return None,
    })
}

/// One element of `dtype` holding the JSON fill value; `Ok(None)` for null.
pub fn fill_bytes(
    v: &Json,
    dtype: DType,
    what: &'static str,
) -> Result<Option<Vec<u8>>, FormatError> {
    let size = dtype.element_bytes();
    let bad = || json_err(what, format!("fill_value {v} does not fit {dtype:?}"));
    if v.is_null() {
        return Ok(None);
    }
    if let Some(hex) = v.as_str().and_then(|s| s.strip_prefix("0x")) {
        // zarr v3: the raw bits, big-endian hex.
        let bits = u64::from_str_radix(hex, 16).map_err(|_| bad())?;
        if size < 8 && bits >> (8 * size) != 0 {
            return Err(bad());
        }
        return Ok(Some(bits.to_le_bytes()[..size].to_vec()));
    }
    let float = |v: &Json| -> Option<f64> {
        match v {
            Json::Number(n) => n.as_f64(),
            Json::String(s) => match s.as_str() {
                "NaN" => Some(f64::NAN),
                "Infinity" => Some(f64::INFINITY),
                "-Infinity" => Some(f64::NEG_INFINITY),
                _ => None,
            },
            _ => None,
        }
    };
    let out = match dtype {
        DType::BOOL => match v {
            Json::Bool(b) => vec![u8::from(*b)],
            Json::Number(n) if n.as_u64() == Some(0) || n.as_u64() == Some(1) => {
                vec![n.as_u64().unwrap_or(0) as u8]
            }
            _ => return Err(bad()),
        },
        DType::F64 => float(v).ok_or_else(bad)?.to_le_bytes().to_vec(),
        DType::F32 => (float(v).ok_or_else(bad)? as f32).to_le_bytes().to_vec(),
        DType::F16 => f16::from_f64(float(v).ok_or_else(bad)?)
            .to_le_bytes()
            .to_vec(),
        DType::BF16 => bf16::from_f64(float(v).ok_or_else(bad)?)
            .to_le_bytes()
            .to_vec(),
        DType::I8 | DType::I16 | DType::I32 | DType::I64 => {
            let x = v.as_i64().ok_or_else(bad)?;
            let bits = size * 8;
            if bits < 64 && (x < -(1i64 << (bits - 1)) || x >= (1i64 << (bits - 1))) {
                return Err(bad());
            }
            x.to_le_bytes()[..size].to_vec()
        }
        DType::U8 | DType::U16 | DType::U32 | DType::U64 => {
            let x = v.as_u64().ok_or_else(bad)?;
            if size < 8 && x >> (8 * size) != 0 {
                return Err(bad());
            }
            x.to_le_bytes()[..size].to_vec()
        }
        _ => return Err(bad()),
    };
    Ok(Some(out))
}

/// Checks shape × chunk shape: same rank, chunks non-zero, sizes representable.
fn check_sizes(meta: &ArrayMeta, what: &'static str) -> Result<(), FormatError> {
    if meta.chunk_shape.len() != meta.shape.len() {
        return Err(json_err(
            what,
            format!(
                "chunk shape {:?} and shape {:?} differ in rank",
                meta.chunk_shape, meta.shape
            ),
        ));
    }
    if meta.chunk_shape.contains(&0) {
        return Err(json_err(
            what,
            format!("chunk shape {:?} has a zero", meta.chunk_shape),
        ));
    }
    let item = meta.item_size() as u64;
    let prod = |s: &[u64]| s.iter().try_fold(item, |a, &d| a.checked_mul(d));
    let too_big = |field: &'static str| FormatError::TooLarge {
        what,
        field,
        value: u64::MAX,
        max: i64::MAX as u64,
    };
    prod(&meta.shape)
        .filter(|&b| b <= i64::MAX as u64)
        .ok_or_else(|| too_big("shape"))?;
    let chunk = prod(&meta.chunk_shape).ok_or_else(|| too_big("chunks"))?;
    if chunk > MAX_CHUNK_BYTES {
        return Err(FormatError::TooLarge {
            what,
            field: "chunks",
            value: chunk,
            max: MAX_CHUNK_BYTES,
        });
    }
    if let Some(s) = &meta.sharding {
        if s.shard_shape.len() != meta.shape.len() {
            return Err(json_err(what, "shard shape and shape differ in rank"));
        }
        for (&outer, &inner) in s.shard_shape.iter().zip(&meta.chunk_shape) {
            if outer == 0 || outer % inner != 0 {
                return Err(json_err(
                    what,
                    format!(
                        "shard shape {:?} is not a multiple of the inner chunk shape {:?}",
                        s.shard_shape, meta.chunk_shape
                    ),
                ));
            }
        }
        let per_shard = s
            .shard_shape
            .iter()
            .zip(&meta.chunk_shape)
            .try_fold(1u64, |a, (&o, &i)| a.checked_mul(o / i))
            .filter(|&n| n <= 1 << 24)
            .ok_or_else(|| too_big("inner chunks per shard"))?;
        let _ = per_shard;
    }
    Ok(())
}

/// Parses a zarr v2 `.zarray`.
pub fn parse_zarray(bytes: &[u8]) -> Result<ArrayMeta, FormatError> {
    const W: &str = ".zarray";
    let v: Json = serde_json::from_slice(bytes).map_err(|e| json_err(W, e.to_string()))?;
    let Json::Object(o) = &v else {
        return Err(json_err(W, "not a JSON object"));
    };
    if o.get("zarr_format").and_then(Json::as_u64) != Some(2) {
        return Err(json_err(W, "`zarr_format` must be 2"));
    }
    let shape = u64_list(o.get("shape"), W, "shape")?;
    let chunk_shape = u64_list(o.get("chunks"), W, "chunks")?;
    let dtype_str = o.get("dtype").and_then(Json::as_str).ok_or_else(|| {
        json_err(
            W,
            "`dtype` must be a string (structured dtypes are not supported)",
        )
    })?;
    let dtype =
        dtype_from_v2(dtype_str).ok_or_else(|| unsupported(W, format!("dtype `{dtype_str}`")))?;
    match o.get("order").and_then(Json::as_str) {
        Some("C") => {}
        other => return Err(unsupported(W, format!("order {other:?} (only \"C\")"))),
    }
    match o.get("filters") {
        None | Some(Json::Null) => {}
        Some(Json::Array(a)) if a.is_empty() => {}
        Some(f) => return Err(unsupported(W, format!("filters {f}"))),
    }
    let compressor = match o.get("compressor") {
        None | Some(Json::Null) => Compressor::None,
        Some(Json::Object(c)) => match c.get("id").and_then(Json::as_str) {
            Some("zstd") => Compressor::Zstd,
            other => {
                return Err(unsupported(
                    W,
                    format!("compressor {other:?} (only zstd or null)"),
                ));
            }
        },
        Some(c) => {
            return Err(json_err(
                W,
                format!("`compressor` must be an object or null, found {c}"),
            ));
        }
    };
    let separator = match o.get("dimension_separator") {
        None | Some(Json::Null) => '.',
        Some(Json::String(s)) if s == "." => '.',
        Some(Json::String(s)) if s == "/" => '/',
        Some(s) => return Err(unsupported(W, format!("dimension_separator {s}"))),
    };
    let fill_value = fill_bytes(o.get("fill_value").unwrap_or(&Json::Null), dtype, W)?;
    let meta = ArrayMeta {
        version: ZarrVersion::V2,
        shape,
        dtype,
        chunk_shape,
        compressor,
        chunk_crc32c: false,
        fill_value,
        key_encoding: KeyEncoding::V2 { separator },
        sharding: None,
    };
    check_sizes(&meta, W)?;
    Ok(meta)
}

fn codec_name(c: &Json) -> Option<&str> {
    c.get("name").and_then(Json::as_str)
}

/// `bytes` [+ `zstd`] [+ `crc32c`]: returns (compressor, crc).
fn parse_chain(codecs: &[Json], what: &'static str) -> Result<(Compressor, bool), FormatError> {
    let mut it = codecs.iter().peekable();
    match it.next() {
        Some(c) if codec_name(c) == Some("bytes") => {
            let endian = c
                .get("configuration")
                .and_then(|x| x.get("endian"))
                .and_then(Json::as_str);
            if !matches!(endian, Some("little") | None) {
                return Err(unsupported(what, format!("bytes codec endian {endian:?}")));
            }
        }
        Some(c) => {
            return Err(unsupported(
                what,
                format!("codec {c} (the chain must start with `bytes`)"),
            ));
        }
        None => return Err(json_err(what, "empty codec list")),
    }
    let mut compressor = Compressor::None;
    if it.peek().and_then(|c| codec_name(c)) == Some("zstd") {
        it.next();
        compressor = Compressor::Zstd;
    }
    let mut crc = false;
    if it.peek().and_then(|c| codec_name(c)) == Some("crc32c") {
        it.next();
        crc = true;
    }
    if let Some(c) = it.next() {
        return Err(unsupported(what, format!("codec {c}")));
    }
    Ok((compressor, crc))
}

/// Parses a zarr v3 `zarr.json`.
pub fn parse_zarr_json(bytes: &[u8]) -> Result<ArrayMeta, FormatError> {
    const W: &str = "zarr.json";
    let v: Json = serde_json::from_slice(bytes).map_err(|e| json_err(W, e.to_string()))?;
    let Json::Object(o) = &v else {
        return Err(json_err(W, "not a JSON object"));
    };
    if o.get("zarr_format").and_then(Json::as_u64) != Some(3) {
        return Err(json_err(W, "`zarr_format` must be 3"));
    }
    if o.get("node_type").and_then(Json::as_str) != Some("array") {
        return Err(json_err(W, "`node_type` must be \"array\""));
    }
    let shape = u64_list(o.get("shape"), W, "shape")?;
    let dt = o
        .get("data_type")
        .and_then(Json::as_str)
        .ok_or_else(|| json_err(W, "`data_type` must be a string"))?;
    let dtype = dtype_from_v3(dt).ok_or_else(|| unsupported(W, format!("data_type `{dt}`")))?;
    let grid = o
        .get("chunk_grid")
        .ok_or_else(|| json_err(W, "missing `chunk_grid`"))?;
    if codec_name(grid) != Some("regular") {
        return Err(unsupported(W, format!("chunk_grid {grid}")));
    }
    let grid_shape = u64_list(
        grid.get("configuration").and_then(|c| c.get("chunk_shape")),
        W,
        "chunk_grid.configuration.chunk_shape",
    )?;
    let key_encoding = {
        let k = o.get("chunk_key_encoding");
        let sep_of = |default: char| -> Result<char, FormatError> {
            match k
                .and_then(|k| k.get("configuration"))
                .and_then(|c| c.get("separator"))
            {
                None => Ok(default),
                Some(Json::String(s)) if s == "/" => Ok('/'),
                Some(Json::String(s)) if s == "." => Ok('.'),
                Some(s) => Err(unsupported(W, format!("chunk key separator {s}"))),
            }
        };
        match k.and_then(codec_name) {
            None | Some("default") => KeyEncoding::Default {
                separator: sep_of('/')?,
            },
            Some("v2") => KeyEncoding::V2 {
                separator: sep_of('.')?,
            },
            Some(other) => return Err(unsupported(W, format!("chunk_key_encoding `{other}`"))),
        }
    };
    let Some(Json::Array(codecs)) = o.get("codecs") else {
        return Err(json_err(W, "`codecs` must be an array"));
    };
    let (chunk_shape, compressor, chunk_crc32c, sharding) = match codecs.as_slice() {
        [c] if codec_name(c) == Some("sharding_indexed") => {
            let cfg = c
                .get("configuration")
                .ok_or_else(|| json_err(W, "sharding_indexed without configuration"))?;
            let inner = u64_list(cfg.get("chunk_shape"), W, "sharding_indexed.chunk_shape")?;
            let Some(Json::Array(inner_codecs)) = cfg.get("codecs") else {
                return Err(json_err(W, "sharding_indexed.codecs must be an array"));
            };
            let (compressor, crc) = parse_chain(inner_codecs, W)?;
            let Some(Json::Array(index_codecs)) = cfg.get("index_codecs") else {
                return Err(json_err(
                    W,
                    "sharding_indexed.index_codecs must be an array",
                ));
            };
            let (index_comp, index_crc32c) = parse_chain(index_codecs, W)?;
            if index_comp != Compressor::None {
                return Err(unsupported(W, "a compressed shard index"));
            }
            let index_location = match cfg.get("index_location").and_then(Json::as_str) {
                None | Some("end") => IndexLocation::End,
                Some("start") => IndexLocation::Start,
                Some(other) => return Err(unsupported(W, format!("index_location `{other}`"))),
            };
            (
                inner,
                compressor,
                crc,
                Some(Sharding {
                    shard_shape: grid_shape,
                    index_crc32c,
                    index_location,
                }),
            )
        }
        chain => {
            let (compressor, crc) = parse_chain(chain, W)?;
            (grid_shape, compressor, crc, None)
        }
    };
    let fill = o.get("fill_value").unwrap_or(&Json::Null);
    let fill_value = fill_bytes(fill, dtype, W)?;
    if fill_value.is_none() {
        return Err(json_err(W, "`fill_value` may not be null in zarr v3"));
    }
    let meta = ArrayMeta {
        version: ZarrVersion::V3,
        shape,
        dtype,
        chunk_shape,
        compressor,
        chunk_crc32c,
        fill_value,
        key_encoding,
        sharding,
    };
    check_sizes(&meta, W)?;
    Ok(meta)
}

/// Decodes one stored chunk into its C-order bytes (`expected` long).
pub fn decode_chunk(
    stored: &[u8],
    compressor: Compressor,
    crc32c: bool,
    expected: u64,
) -> Result<Vec<u8>, FormatError> {
    const W: &str = "chunk";
    let data = if crc32c {
        strip_crc(stored, W)?
    } else {
        stored
    };
    let out = match compressor {
        Compressor::None => data.to_vec(),
        Compressor::Zstd => super::ocdbt::zstd_decode_bounded(data, W, expected)?,
    };
    if out.len() as u64 != expected {
        return Err(FormatError::Invalid {
            what: W,
            field: "decoded length",
            reason: format!("{} bytes, but the chunk shape needs {expected}", out.len()),
        });
    }
    Ok(out)
}

fn strip_crc<'a>(data: &'a [u8], what: &'static str) -> Result<&'a [u8], FormatError> {
    let split = data.len().checked_sub(4).ok_or(FormatError::TooShort {
        what,
        len: data.len(),
        min: 4,
    })?;
    let (body, c) = data.split_at(split);
    let stored = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    let computed = crc32c::crc32c(body);
    if stored != computed {
        return Err(FormatError::CrcMismatch {
            what,
            stored,
            computed,
        });
    }
    Ok(body)
}

/// Parses a shard index of `n` entries: `(offset, nbytes)` per inner chunk, `None` where
/// the chunk is missing (both all-ones); every present range must lie in the shard's
/// `shard_len` bytes.
pub fn parse_shard_index(
    bytes: &[u8],
    n: usize,
    crc: bool,
    shard_len: u64,
) -> Result<Vec<Option<(u64, u64)>>, FormatError> {
    const W: &str = "shard index";
    let body = if crc { strip_crc(bytes, W)? } else { bytes };
    if body.len() as u64 != n as u64 * 16 {
        return Err(FormatError::Invalid {
            what: W,
            field: "length",
            reason: format!(
                "{} bytes for {n} inner chunks (needs {})",
                body.len(),
                n as u64 * 16
            ),
        });
    }
    let mut out = Vec::with_capacity(n);
    for (index, e) in body.chunks_exact(16).enumerate() {
        let mut a = [0u8; 8];
        a.copy_from_slice(&e[..8]);
        let offset = u64::from_le_bytes(a);
        a.copy_from_slice(&e[8..]);
        let nbytes = u64::from_le_bytes(a);
        if offset == u64::MAX && nbytes == u64::MAX {
            out.push(None);
            continue;
        }
        match offset.checked_add(nbytes) {
            Some(end) if end <= shard_len => out.push(Some((offset, nbytes))),
            Some(_) => {
                return Err(FormatError::Invalid {
                    what: W,
                    field: "offset",
                    reason: format!(
                        "inner chunk {index} at [{offset}, {offset}+{nbytes}) lies outside the {shard_len}-byte shard"
                    ),
                });
            }
            None => {
                return Err(FormatError::RangeOverflow {
                    what: W,
                    index,
                    offset,
                    length: nbytes,
                });
            }
        }
    }
    Ok(out)
}

/// Copies the intersection of a source box and a destination box (both C-order, in global
/// coordinates given by their origins) from `src` to `dst`.
#[track_caller]
pub fn copy_intersection(
    src: &[u8],
    src_origin: &[u64],
    src_shape: &[u64],
    dst: &mut [u8],
    dst_origin: &[u64],
    dst_shape: &[u64],
    item: usize,
) {
    let rank = src_shape.len();
    assert_eq!(rank, dst_shape.len(), "copy_intersection: ranks differ");
    assert_eq!(
        src.len() as u64,
        src_shape.iter().product::<u64>() * item as u64
    );
    assert_eq!(
        dst.len() as u64,
        dst_shape.iter().product::<u64>() * item as u64
    );
    if rank == 0 {
        dst.copy_from_slice(src);
        return;
    }
    let lo: Vec<u64> = (0..rank)
        .map(|d| src_origin[d].max(dst_origin[d]))
        .collect();
    let hi: Vec<u64> = (0..rank)
        .map(|d| (src_origin[d] + src_shape[d]).min(dst_origin[d] + dst_shape[d]))
        .collect();
    if (0..rank).any(|d| lo[d] >= hi[d]) {
        return;
    }
    let strides = |shape: &[u64]| {
        let mut s = vec![item as u64; rank];
        for d in (0..rank - 1).rev() {
            s[d] = s[d + 1] * shape[d + 1];
        }
        s
    };
    let (ss, ds) = (strides(src_shape), strides(dst_shape));
    let run = ((hi[rank - 1] - lo[rank - 1]) * item as u64) as usize;
    let mut idx = lo.clone();
    loop {
        let so: u64 = (0..rank).map(|d| (idx[d] - src_origin[d]) * ss[d]).sum();
        let dof: u64 = (0..rank).map(|d| (idx[d] - dst_origin[d]) * ds[d]).sum();
        let (so, dof) = (so as usize, dof as usize);
        dst[dof..dof + run].copy_from_slice(&src[so..so + run]);
        // Next index over all dimensions but the last.
        let mut d = rank - 1;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < hi[d] {
                break;
            }
            idx[d] = lo[d];
        }
    }
}

/// Reads one array of an item: its metadata, its chunks, whole or row by row.
#[derive(Debug)]
pub struct ArrayReader {
    store: Store,
    name: String,
    meta: ArrayMeta,
}

impl ArrayReader {
    /// Opens array `name` (its `.zarray` or `zarr.json` key) in `store`.
    pub fn open(store: &Store, name: &str) -> Result<ArrayReader, OrbaxError> {
        let (key, v3) = {
            let k3 = format!("{name}/zarr.json");
            match store.get(&k3)? {
                Some(v) => ((k3, v), true),
                None => {
                    let k2 = format!("{name}/.zarray");
                    match store.get(&k2)? {
                        Some(v) => ((k2, v), false),
                        None => {
                            return Err(OrbaxError::MissingKey {
                                store: store.dir().to_path_buf(),
                                key: k2,
                                hint: Some(format!(
                                    "array `{name}` has neither .zarray nor zarr.json"
                                )),
                            });
                        }
                    }
                }
            }
        };
        let (k, value) = key;
        let bytes = value.read_all(&k, MAX_METADATA_BYTES)?;
        let meta = if v3 {
            parse_zarr_json(&bytes)
        } else {
            parse_zarray(&bytes)
        }
        .map_err(|e| OrbaxError::format(&value.file(), Some(&k), e))?;
        Ok(ArrayReader {
            store: store.clone(),
            name: name.to_string(),
            meta,
        })
    }

    /// The array's metadata.
    pub fn meta(&self) -> &ArrayMeta {
        &self.meta
    }

    /// The array's name (its key prefix).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Bytes of one row (one index of the first dimension).
    pub fn row_bytes(&self) -> u64 {
        self.meta.shape.iter().skip(1).product::<u64>() * self.meta.item_size() as u64
    }

    /// The whole array, C-order little-endian, refusing arrays over `limit` bytes.
    pub fn read_all(&self, limit: u64) -> Result<Vec<u8>, OrbaxError> {
        let n = self.meta.nbytes();
        if n > limit {
            return Err(OrbaxError::format(
                self.store.dir(),
                Some(&self.name),
                FormatError::TooLarge {
                    what: "array",
                    field: "bytes",
                    value: n,
                    max: limit,
                },
            ));
        }
        if self.meta.shape.is_empty() {
            let chunk = self.chunk(&[], &mut ShardCache::default())?;
            return Ok(chunk);
        }
        let mut out = Vec::with_capacity(n as usize);
        for row in self.rows(0..self.meta.shape[0])? {
            out.extend_from_slice(&row?.1);
        }
        Ok(out)
    }

    /// Decoded chunk (inner chunk for a sharded array) at grid `coords`, full chunk size;
    /// the fill value where it is missing.
    fn chunk(&self, coords: &[u64], cache: &mut ShardCache) -> Result<Vec<u8>, OrbaxError> {
        match self.locate(coords, cache)? {
            Some((key, value)) => {
                let stored = value.read_all(&key, MAX_CHUNK_BYTES.saturating_mul(2))?;
                decode_chunk(
                    &stored,
                    self.meta.compressor,
                    self.meta.chunk_crc32c,
                    self.meta.chunk_nbytes(),
                )
                .map_err(|e| OrbaxError::format(&value.file(), Some(&key), e))
            }
            None => self.fill_chunk(coords),
        }
    }

    fn fill_chunk(&self, coords: &[u64]) -> Result<Vec<u8>, OrbaxError> {
        match &self.meta.fill_value {
            Some(f) => Ok(f.repeat((self.meta.chunk_nbytes() / f.len().max(1) as u64) as usize)),
            None => Err(OrbaxError::MissingKey {
                store: self.store.dir().to_path_buf(),
                key: format!("{}/{}", self.name, self.meta.key_encoding.key(coords)),
                hint: Some(format!(
                    "a chunk of array `{}`, whose fill_value is null, so a missing chunk has no value",
                    self.name
                )),
            }),
        }
    }

    /// The stored bytes of the chunk at `coords`: key and value, `None` if missing.
    fn locate(
        &self,
        coords: &[u64],
        cache: &mut ShardCache,
    ) -> Result<Option<(String, Value)>, OrbaxError> {
        let Some(sh) = &self.meta.sharding else {
            let key = format!("{}/{}", self.name, self.meta.key_encoding.key(coords));
            return Ok(self.store.get(&key)?.map(|v| (key, v)));
        };
        let per: Vec<u64> = sh
            .shard_shape
            .iter()
            .zip(&self.meta.chunk_shape)
            .map(|(&s, &c)| s / c)
            .collect();
        let shard: Vec<u64> = coords.iter().zip(&per).map(|(&c, &p)| c / p).collect();
        let local = coords
            .iter()
            .zip(&per)
            .fold(0u64, |acc, (&c, &p)| acc * p + c % p);
        let key = format!("{}/{}", self.name, self.meta.key_encoding.key(&shard));
        if !cache.map.contains_key(&shard) {
            let entry = match self.store.get(&key)? {
                None => None,
                Some(value) => {
                    let n = per.iter().product::<u64>() as usize;
                    let idx_len = n as u64 * 16 + if sh.index_crc32c { 4 } else { 0 };
                    let at = match sh.index_location {
                        IndexLocation::End => value.len().checked_sub(idx_len),
                        IndexLocation::Start => Some(0).filter(|_| value.len() >= idx_len),
                    };
                    let Some(at) = at else {
                        return Err(OrbaxError::format(
                            &value.file(),
                            Some(&key),
                            FormatError::TooShort {
                                what: "shard",
                                len: value.len() as usize,
                                min: idx_len as usize,
                            },
                        ));
                    };
                    let idx = value.slice(at, idx_len, &key)?.read_all(&key, idx_len)?;
                    let entries = parse_shard_index(&idx, n, sh.index_crc32c, value.len())
                        .map_err(|e| OrbaxError::format(&value.file(), Some(&key), e))?;
                    Some((value, entries))
                }
            };
            cache.map.clear();
            cache.map.insert(shard.clone(), entry);
        }
        let Some(Some((value, entries))) = cache.map.get(&shard) else {
            return Ok(None);
        };
        match entries.get(local as usize).copied().flatten() {
            None => Ok(None),
            Some((off, len)) => Ok(Some((key.clone(), value.slice(off, len, &key)?))),
        }
    }

    /// The rows `range` of the first dimension, in order, each as C-order bytes
    /// (`row_bytes()` long). See the module doc for what is held in memory.
    pub fn rows(&self, range: Range<u64>) -> Result<Rows<'_>, OrbaxError> {
        let Some(&n0) = self.meta.shape.first() else {
            return Err(OrbaxError::format(
                self.store.dir(),
                Some(&self.name),
                FormatError::Invalid {
                    what: "array",
                    field: "shape",
                    reason: "a scalar has no rows; use read_all".into(),
                },
            ));
        };
        if range.start > range.end || range.end > n0 {
            return Err(OrbaxError::format(
                self.store.dir(),
                Some(&self.name),
                FormatError::Invalid {
                    what: "array",
                    field: "rows",
                    reason: format!("rows {range:?} of an array with {n0}"),
                },
            ));
        }
        let grid = self.meta.grid();
        let streaming = grid.iter().skip(1).all(|&g| g <= 1);
        Ok(Rows {
            reader: self,
            next: range.start,
            end: range.end,
            streaming,
            current: None,
            cache: ShardCache::default(),
        })
    }
}

/// A shard's stored value and its parsed index (`None` per missing inner chunk).
type ShardEntry = (Value, Vec<Option<(u64, u64)>>);

/// The index of the last shard read (`None` for a missing shard).
#[derive(Default)]
struct ShardCache {
    map: HashMap<Vec<u64>, Option<ShardEntry>>,
}

/// What `Rows` is reading from.
enum Current {
    /// A decoding stream over chunk-row `c0`: its next row is `row`.
    Stream {
        c0: u64,
        row: u64,
        key: String,
        file: std::path::PathBuf,
        src: Box<dyn Read + Send>,
    },
    /// An assembled slab of the rows of chunk-row `c0`.
    Slab { c0: u64, data: Vec<u8> },
}

/// Iterator over rows of an array (see `ArrayReader::rows`): `(row index, bytes)`.
pub struct Rows<'a> {
    reader: &'a ArrayReader,
    next: u64,
    end: u64,
    streaming: bool,
    current: Option<Current>,
    cache: ShardCache,
}

impl Rows<'_> {
    fn next_row(&mut self) -> Result<Vec<u8>, OrbaxError> {
        let r = self.reader;
        let m = &r.meta;
        let c = m.chunk_shape[0];
        let c0 = self.next / c;
        let row = self.next;
        let item = m.item_size();
        let row_shape: Vec<u64> = std::iter::once(1)
            .chain(m.shape.iter().skip(1).copied())
            .collect();
        let chunk_row_shape: Vec<u64> = std::iter::once(1)
            .chain(m.chunk_shape.iter().skip(1).copied())
            .collect();
        let chunk_row_bytes = chunk_row_shape.iter().product::<u64>() * item as u64;
        let same = matches!(&self.current, Some(Current::Stream { c0: x, .. }) | Some(Current::Slab { c0: x, .. }) if *x == c0);
        if !same {
            self.current = Some(self.start_chunk_row(c0)?);
        }
        match self.current.as_mut() {
            Some(Current::Stream {
                row: next,
                key,
                file,
                src,
                ..
            }) => {
                // Skip rows before `row` within the chunk (only on the first call).
                let first = c0 * c;
                let mut buf = vec![0u8; chunk_row_bytes as usize];
                while *next <= row {
                    src.read_exact(&mut buf)
                        .map_err(|e| stream_error(file, key, e))?;
                    *next += 1;
                }
                let last_in_chunk = (first + c).min(m.shape[0]) - 1 == row;
                if last_in_chunk && first + c <= m.shape[0] {
                    // The whole chunk was consumed: it must end here.
                    let mut probe = [0u8; 1];
                    match src.read(&mut probe) {
                        Ok(0) => {}
                        Ok(_) => {
                            return Err(OrbaxError::format(
                                file,
                                Some(key),
                                FormatError::Invalid {
                                    what: "chunk",
                                    field: "decoded length",
                                    reason: format!(
                                        "longer than the chunk shape's {} bytes",
                                        m.chunk_nbytes()
                                    ),
                                },
                            ));
                        }
                        Err(e) => return Err(stream_error(file, key, e)),
                    }
                }
                if chunk_row_shape == row_shape {
                    return Ok(buf);
                }
                let mut out = vec![0u8; (row_shape.iter().product::<u64>() * item as u64) as usize];
                let zero = vec![0u64; row_shape.len()];
                copy_intersection(
                    &buf,
                    &zero,
                    &chunk_row_shape,
                    &mut out,
                    &zero,
                    &row_shape,
                    item,
                );
                Ok(out)
            }
            Some(Current::Slab { data, .. }) => {
                let rb = r.row_bytes() as usize;
                let i = (row - c0 * c) as usize;
                Ok(data[i * rb..(i + 1) * rb].to_vec())
            }
            None => unreachable!("start_chunk_row always sets current"),
        }
    }

    fn start_chunk_row(&mut self, c0: u64) -> Result<Current, OrbaxError> {
        let r = self.reader;
        let m = &r.meta;
        let rank = m.shape.len();
        let c = m.chunk_shape[0];
        if self.streaming {
            let coords: Vec<u64> = std::iter::once(c0)
                .chain(std::iter::repeat_n(0, rank - 1))
                .collect();
            return match r.locate(&coords, &mut self.cache)? {
                Some((key, value)) => {
                    let raw = value.open(&key)?;
                    let file = value.file();
                    let src: Box<dyn Read + Send> = match (m.compressor, m.chunk_crc32c) {
                        (Compressor::None, false) => raw,
                        (Compressor::Zstd, false) => Box::new(
                            zstd::stream::read::Decoder::new(raw)
                                .map_err(|e| OrbaxError::io(&file, e))?,
                        ),
                        // A chunk with a trailing crc is checked whole, then streamed from memory.
                        (comp, true) => {
                            let stored = value.read_all(&key, MAX_CHUNK_BYTES.saturating_mul(2))?;
                            let d = decode_chunk(&stored, comp, true, m.chunk_nbytes())
                                .map_err(|e| OrbaxError::format(&file, Some(&key), e))?;
                            Box::new(std::io::Cursor::new(d))
                        }
                    };
                    Ok(Current::Stream {
                        c0,
                        row: c0 * c,
                        key,
                        file,
                        src,
                    })
                }
                None => {
                    let fill = r.fill_chunk(&coords)?;
                    Ok(Current::Stream {
                        c0,
                        row: c0 * c,
                        key: String::new(),
                        file: r.store.dir().to_path_buf(),
                        src: Box::new(std::io::Cursor::new(fill)),
                    })
                }
            };
        }
        // General case: assemble the slab of rows [c0*c, min((c0+1)*c, n0)).
        let n0 = m.shape[0];
        let rows = (c0 * c + c).min(n0) - c0 * c;
        let slab_shape: Vec<u64> = std::iter::once(rows)
            .chain(m.shape.iter().skip(1).copied())
            .collect();
        let slab_origin: Vec<u64> = std::iter::once(c0 * c)
            .chain(std::iter::repeat_n(0, rank - 1))
            .collect();
        let mut data = vec![0u8; (rows * r.row_bytes()) as usize];
        let grid = m.grid();
        let mut coords: Vec<u64> = std::iter::once(c0)
            .chain(std::iter::repeat_n(0, rank - 1))
            .collect();
        loop {
            let chunk = r.chunk(&coords, &mut self.cache)?;
            let origin: Vec<u64> = coords
                .iter()
                .zip(&m.chunk_shape)
                .map(|(&i, &s)| i * s)
                .collect();
            copy_intersection(
                &chunk,
                &origin,
                &m.chunk_shape,
                &mut data,
                &slab_origin,
                &slab_shape,
                m.item_size(),
            );
            let mut d = rank;
            loop {
                d -= 1;
                if d == 0 {
                    return Ok(Current::Slab { c0, data });
                }
                coords[d] += 1;
                if coords[d] < grid[d] {
                    break;
                }
                coords[d] = 0;
            }
        }
    }
}

fn stream_error(file: &std::path::Path, key: &str, e: std::io::Error) -> OrbaxError {
    let source = if e.kind() == std::io::ErrorKind::UnexpectedEof {
        FormatError::Invalid {
            what: "chunk",
            field: "decoded length",
            reason: "shorter than its chunk shape".into(),
        }
    } else {
        FormatError::Decompress {
            what: "chunk",
            reason: e.to_string(),
        }
    };
    OrbaxError::format(file, Some(key), source)
}

impl Iterator for Rows<'_> {
    type Item = Result<(u64, Vec<u8>), OrbaxError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.end {
            return None;
        }
        let row = self.next;
        let r = self.next_row();
        match r {
            Ok(b) => {
                self.next += 1;
                Some(Ok((row, b)))
            }
            Err(e) => {
                self.next = self.end;
                Some(Err(e))
            }
        }
    }
}
