//! Encoders for a deterministic Orbax writer: pure functions (and one builder) that return
//! bytes; no file I/O. A later step composes them into an item folder written through the
//! release writer.
//!
//! What an item is made of, and who makes it:
//! - `_METADATA`: `tree_metadata` (jax.Array leaves), as orbax 0.12.8 writes it, byte for
//!   byte (Python `json.dumps` spacing, leaves in JAX's sorted-key order);
//! - `<name>/.zarray`: tensorstore's compact, sorted zarr v2 JSON (zstd level 1, fill null);
//! - `<name>/0.0…`: one zstd frame of the C-order bytes (`encode_chunk`, or
//!   `ChunkEncoder` to stream it), level 1 as Orbax's zarr v2 compressor, no checksum,
//!   content size written;
//! - `manifest.ocdbt` + `ocdbt.process_0/d/<name>`: `OcdbtBuilder`. Values up to 1024
//!   bytes go inline in the leaf (Orbax's `max_inline_value_bytes`); larger ones are
//!   appended to the data file as the caller produces them (the builder records offset and
//!   length), and `finish` returns the B+tree nodes to append last and the manifest;
//! - `_CHECKPOINT_METADATA` with timestamps 0; `commit_success.txt` without a path.
//!
//! Settings matched with Orbax 0.12.8: zarr v2, zstd level 1 chunks, one chunk per array
//! (the write shape of a single-device save), `max_inline_value_bytes` 1024,
//! `max_decoded_node_bytes` 100000000, version-tree arity 2^4, manifest kind single, one
//! generation. Chosen differently, and why: the database uuid and the data file's name are
//! derived from a sha256 of the keys and values (Orbax draws them at random); the commit
//! time and the `_CHECKPOINT_METADATA` timestamps are 0 (Orbax writes the clock); B+tree
//! nodes and the manifest are written uncompressed and the config says so (tensorstore's
//! spec allows both; Orbax compresses them with zstd level 0): node bytes then depend on
//! nothing but the keys and offsets, not on a zstd version, and nodes are a tiny fraction
//! of a checkpoint; the root manifest refers to the per-process data file directly
//! (`ocdbt.process_0/d/<name>`) instead of through a second, per-process manifest, as there
//! is one process; no `_sharding` or `array_metadatas/` (Orbax restores without them).
//! Chunk bytes do depend on libzstd (`zstd-sys` pins 1.5.x); a test holds them to the
//! bytes Orbax restored, so a change is caught.

use std::collections::BTreeMap;
use std::io::Write;

use sha2::{Digest, Sha256};

use super::ocdbt::{BTREE_NODE_MAGIC, MANIFEST_MAGIC, MAX_KEY_LEN};
use crate::codec::dtype::DType;

/// zstd level of chunks (Orbax's zarr v2 compressor: `{"id": "zstd", "level": 1}`).
pub const CHUNK_ZSTD_LEVEL: i32 = 1;
/// Largest value stored inline in a leaf (Orbax's setting).
pub const MAX_INLINE_VALUE_BYTES: usize = 1024;
/// `max_decoded_node_bytes` written in the config (Orbax's setting).
pub const MAX_DECODED_NODE_BYTES: u32 = 100_000_000;
/// Encoded-size budget of one B+tree node this builder writes.
pub const DEFAULT_NODE_BUDGET: usize = 4 << 20;
/// Folder of the data file, relative to the item (Orbax's process 0 database).
pub const DATA_DIR: &str = "ocdbt.process_0/d/";
/// Orbax's handler name for a `StandardCheckpointHandler` item.
pub const STANDARD_HANDLER: &str =
    "orbax.checkpoint._src.handlers.standard_checkpoint_handler.StandardCheckpointHandler";

/// What an encoder refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// A key given twice.
    #[error("OCDBT key `{key}` given twice")]
    DuplicateKey {
        /// The key.
        key: String,
    },
    /// A key over 65535 bytes.
    #[error("OCDBT key of {len} bytes; keys are at most {MAX_KEY_LEN}")]
    KeyTooLong {
        /// Its length.
        len: usize,
    },
    /// The data file would pass 2^63 bytes.
    #[error("the data file would pass 2^63 bytes")]
    DataFileTooLarge,
    /// libzstd refused (it does not, for in-memory output of the pledged size).
    #[error("zstd: {reason}")]
    Zstd {
        /// libzstd's message.
        reason: String,
    },
    /// An inline value over the limit.
    #[error(
        "OCDBT value `{key}` of {len} bytes cannot be inline (at most {MAX_INLINE_VALUE_BYTES})"
    )]
    InlineTooLong {
        /// The key.
        key: String,
        /// Its length.
        len: usize,
    },
    /// A dtype zarr v2 (as Orbax writes it) has no string for.
    #[error("{dtype:?} has no zarr v2 dtype in Orbax")]
    Dtype {
        /// The dtype.
        dtype: DType,
    },
    /// An array whose byte length disagrees with its shape.
    #[error("array `{name}`: {dtype:?} {shape:?} needs {expected} bytes, {found} given")]
    Size {
        /// Array name.
        name: String,
        /// Dtype.
        dtype: DType,
        /// Shape.
        shape: Vec<u64>,
        /// Bytes needed.
        expected: u64,
        /// Bytes given.
        found: u64,
    },
}

// ---------------------------------------------------------------------------------------
// JSON as Python's json.dumps writes it (ensure_ascii, ", " and ": ").

fn py_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for u in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr` of a string (the quotes Orbax's tuple keys use).
fn py_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::new();
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// `json.dumps(value)` for a JSON value with keys in the map's (sorted) order; a float is
/// spelt as Python's `repr` spells it (`1e-06`, `8.0`).
pub fn py_json(v: &serde_json::Value) -> String {
    let mut out = String::new();
    py_json_into(&mut out, v);
    out
}

fn py_json_into(out: &mut String, v: &serde_json::Value) {
    use serde_json::Value as J;
    match v {
        J::Null => out.push_str("null"),
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::Number(n) => match n.as_f64().filter(|_| n.is_f64()) {
            Some(x) => out.push_str(&py_float(x)),
            None => out.push_str(&n.to_string()),
        },
        J::String(s) => py_str(out, s),
        J::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_json_into(out, x);
            }
            out.push(']');
        }
        J::Object(o) => {
            out.push('{');
            for (i, (k, x)) in o.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_str(out, k);
                out.push_str(": ");
                py_json_into(out, x);
            }
            out.push('}');
        }
    }
}

/// Python's `repr` of a float, as `json.dumps` writes it: the shortest digits that round
/// trip, fixed notation for decimal exponents -4 ..= 15 (with `.0` on an integer),
/// scientific otherwise with a signed two-digit exponent (`1e-06`, `1.5e+16`).
fn py_float(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..16).contains(&exp) {
        let fixed = format!("{x}");
        if fixed.contains('.') {
            fixed
        } else {
            format!("{fixed}.0")
        }
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    }
}

fn list(xs: &[u64]) -> String {
    let items: Vec<String> = xs.iter().map(u64::to_string).collect();
    format!("[{}]", items.join(", "))
}

/// One leaf of `_METADATA`: a jax.Array at the dict path `keys`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetadataLeaf {
    /// Dict keys from the root.
    pub keys: Vec<String>,
    /// The array's (write) shape.
    pub shape: Vec<u64>,
}

/// `_METADATA` for a tree of jax.Array leaves under dict keys, as orbax 0.12.8 writes it
/// (compare golden/orbax/jax_arrays/_METADATA). Leaves are sorted by path, as JAX flattens
/// dicts.
pub fn encode_tree_metadata(leaves: &[MetadataLeaf]) -> Vec<u8> {
    let mut sorted: Vec<&MetadataLeaf> = leaves.iter().collect();
    sorted.sort_by(|a, b| a.keys.cmp(&b.keys));
    let mut out = String::from("{\"tree_metadata\": {");
    for (i, l) in sorted.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let reprs: Vec<String> = l.keys.iter().map(|k| py_repr(k)).collect();
        let tuple = if reprs.len() == 1 {
            format!("({},)", reprs[0])
        } else {
            format!("({})", reprs.join(", "))
        };
        py_str(&mut out, &tuple);
        out.push_str(": {\"key_metadata\": [");
        for (j, k) in l.keys.iter().enumerate() {
            if j > 0 {
                out.push_str(", ");
            }
            out.push_str("{\"key\": ");
            py_str(&mut out, k);
            out.push_str(", \"key_type\": 2}");
        }
        out.push_str("], \"value_metadata\": {\"value_type\": \"jax.Array\", \"skip_deserialize\": false, \"write_shape\": ");
        out.push_str(&list(&l.shape));
        out.push_str("}}");
    }
    out.push_str("}, \"use_ocdbt\": true, \"use_zarr3\": false, \"store_array_data_equal_to_fill_value\": true, \"custom_metadata\": null}");
    out.into_bytes()
}

/// `_CHECKPOINT_METADATA` with fixed (zero) timestamps. `custom_metadata` is written with
/// sorted keys and Python's number spelling (`py_json`). `item_handlers` is the handler name
/// (an item folder) or an object of item name → handler (a step folder).
pub fn encode_checkpoint_metadata(
    item_handlers: &serde_json::Value,
    custom_metadata: &serde_json::Map<String, serde_json::Value>,
) -> Vec<u8> {
    format!(
        "{{\"item_handlers\": {}, \"metrics\": {{}}, \"performance_metrics\": {{}}, \"init_timestamp_nsecs\": 0, \"commit_timestamp_nsecs\": 0, \"custom_metadata\": {}}}",
        py_json(item_handlers),
        py_json(&serde_json::Value::Object(custom_metadata.clone()))
    )
    .into_bytes()
}

/// `commit_success.txt` (Orbax adds the folder's path; wanbake's bytes do not depend on it).
pub fn encode_commit_success() -> Vec<u8> {
    b"Checkpoint commit was successful".to_vec()
}

/// `.zarray` of a zarr v2 array with one chunk per `chunks`, as tensorstore writes it.
pub fn encode_zarray(shape: &[u64], dtype: DType, chunks: &[u64]) -> Result<Vec<u8>, EncodeError> {
    let d = super::zarr::dtype_to_v2(dtype).ok_or(EncodeError::Dtype { dtype })?;
    let l = |xs: &[u64]| {
        let v: Vec<String> = xs.iter().map(u64::to_string).collect();
        format!("[{}]", v.join(","))
    };
    Ok(format!(
        "{{\"chunks\":{},\"compressor\":{{\"id\":\"zstd\",\"level\":{CHUNK_ZSTD_LEVEL}}},\"dimension_separator\":\".\",\"dtype\":\"{d}\",\"fill_value\":null,\"filters\":null,\"order\":\"C\",\"shape\":{},\"zarr_format\":2}}",
        l(chunks),
        l(shape)
    )
    .into_bytes())
}

/// The chunk key of the single chunk of an array of rank `rank` (`0.0…`, `0` for a scalar).
pub fn single_chunk_key(rank: usize) -> String {
    if rank == 0 {
        "0".into()
    } else {
        vec!["0"; rank].join(".")
    }
}

/// Streams one zstd frame of a chunk whose decoded length is known in advance: write the
/// C-order bytes in any pieces, then `finish`. The frame is the same however the bytes are
/// split (one-shot `encode_chunk` is this with one write; a test checks it).
pub struct ChunkEncoder<W: Write> {
    enc: zstd::stream::write::Encoder<'static, W>,
}

impl<W: Write> ChunkEncoder<W> {
    /// A frame of `len` decoded bytes written to `sink`.
    pub fn new(sink: W, len: u64) -> std::io::Result<Self> {
        let mut enc = zstd::stream::write::Encoder::new(sink, CHUNK_ZSTD_LEVEL)?;
        enc.include_checksum(false)?;
        enc.include_contentsize(true)?;
        enc.set_pledged_src_size(Some(len))?;
        Ok(ChunkEncoder { enc })
    }

    /// Feeds decoded bytes.
    pub fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.enc.write_all(bytes)
    }

    /// Ends the frame and returns the sink.
    pub fn finish(self) -> std::io::Result<W> {
        self.enc.finish()
    }
}

/// One zstd frame of a chunk's C-order bytes.
pub fn encode_chunk(bytes: &[u8]) -> Result<Vec<u8>, EncodeError> {
    let run = || -> std::io::Result<Vec<u8>> {
        let mut e = ChunkEncoder::new(Vec::new(), bytes.len() as u64)?;
        e.write_all(bytes)?;
        e.finish()
    };
    run().map_err(|e| EncodeError::Zstd {
        reason: e.to_string(),
    })
}

// ---------------------------------------------------------------------------------------
// OCDBT.

fn varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

/// Wraps a body as an uncompressed OCDBT object: magic, length, version 0, compression 0,
/// body, CRC-32C.
pub fn encode_object(magic: u32, body: &[u8]) -> Vec<u8> {
    let len = 12 + 2 + body.len() + 4;
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&magic.to_be_bytes());
    out.extend_from_slice(&(len as u64).to_le_bytes());
    out.push(0); // version
    out.push(0); // compression: none
    out.extend_from_slice(body);
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// A data-file table of at most one file (`path` relative to the referring object's
/// transitive path, with an empty base path).
pub fn encode_data_file_table(out: &mut Vec<u8>, file: Option<&str>) {
    encode_data_file_table_of(out, file.as_slice());
}

fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Key columns: prefix lengths (n-1), suffix lengths, [subtree common prefix lengths, all
/// 0], suffixes.
fn encode_keys(out: &mut Vec<u8>, keys: &[&[u8]], interior: bool) {
    let prefixes: Vec<usize> = (0..keys.len())
        .map(|i| {
            if i == 0 {
                0
            } else {
                common_prefix(keys[i - 1], keys[i])
            }
        })
        .collect();
    for &p in &prefixes[1..] {
        varint(out, p as u64);
    }
    for (k, &p) in keys.iter().zip(&prefixes) {
        varint(out, (k.len() - p) as u64);
    }
    if interior {
        for _ in keys {
            varint(out, 0);
        }
    }
    for (k, &p) in keys.iter().zip(&prefixes) {
        out.extend_from_slice(&k[p..]);
    }
}

/// A value as placed in the database.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stored {
    /// In the leaf.
    Inline(Vec<u8>),
    /// `length` bytes at `offset` of the data file.
    OutOfLine {
        /// Offset.
        offset: u64,
        /// Length.
        length: u64,
    },
}

impl Stored {
    /// The value as [`Located`], an out-of-line one in `data_file`.
    fn located_in(&self, data_file: &str) -> Located {
        match self {
            Stored::Inline(x) => Located::Inline(x.clone()),
            Stored::OutOfLine { offset, length } => Located::InFile {
                file: data_file.to_string(),
                offset: *offset,
                length: *length,
            },
        }
    }
}

/// An encoded B+tree leaf node (height 0) with keys relative to the empty prefix. The
/// data-file table holds `data_file` when any value is out of line ([`encode_leaf_node_files`]
/// with every out-of-line value in that one file).
pub fn encode_leaf_node(entries: &[(&[u8], &Stored)], data_file: &str) -> Vec<u8> {
    let located: Vec<Located> = entries
        .iter()
        .map(|(_, v)| v.located_in(data_file))
        .collect();
    let entries: Vec<(&[u8], &Located)> = (entries.iter().zip(&located))
        .map(|((k, _), v)| (*k, v))
        .collect();
    encode_leaf_node_files(&entries)
}

/// A child of an interior node: its first key, where its encoded node is, its statistics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChildRef {
    /// Smallest key of the child's subtree.
    pub first_key: Vec<u8>,
    /// Offset of the encoded child in the data file.
    pub offset: u64,
    /// Its encoded length.
    pub length: u64,
    /// Keys in the subtree.
    pub num_keys: u64,
    /// Encoded bytes of the subtree's nodes.
    pub num_tree_bytes: u64,
    /// Out-of-line value bytes in the subtree.
    pub num_indirect_value_bytes: u64,
}

/// An encoded interior B+tree node of `height` (≥ 1) whose children are all in `data_file`.
pub fn encode_interior_node(height: u8, children: &[ChildRef], data_file: &str) -> Vec<u8> {
    let mut b = vec![height];
    encode_data_file_table(&mut b, Some(data_file));
    varint(&mut b, children.len() as u64);
    let keys: Vec<&[u8]> = children.iter().map(|c| c.first_key.as_slice()).collect();
    encode_keys(&mut b, &keys, true);
    for _ in children {
        varint(&mut b, 0);
    }
    for c in children {
        varint(&mut b, c.offset);
    }
    for c in children {
        varint(&mut b, c.length);
    }
    for c in children {
        varint(&mut b, c.num_keys);
    }
    for c in children {
        varint(&mut b, c.num_tree_bytes);
    }
    for c in children {
        varint(&mut b, c.num_indirect_value_bytes);
    }
    encode_object(BTREE_NODE_MAGIC, &b)
}

/// A single-file manifest with one generation (1, commit time 0) whose root is `root`
/// (`None`: an empty database), uncompressed, config as Orbax's but with no compression.
pub fn encode_manifest(
    uuid: [u8; 16],
    root_height: u8,
    root: Option<&ChildRef>,
    data_file: &str,
) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&uuid);
    b.push(0); // manifest kind: single
    varint(&mut b, MAX_INLINE_VALUE_BYTES as u64);
    varint(&mut b, u64::from(MAX_DECODED_NODE_BYTES));
    b.push(4); // version tree arity log2
    varint(&mut b, 0); // compression: none
    encode_data_file_table(&mut b, Some(data_file));
    varint(&mut b, 1); // num_versions
    varint(&mut b, 1); // generation
    b.push(root_height);
    varint(&mut b, 0); // data file id
    let (offset, length, keys, tree, indirect) = match root {
        Some(r) => (
            r.offset,
            r.length,
            r.num_keys,
            r.num_tree_bytes,
            r.num_indirect_value_bytes,
        ),
        None => (u64::MAX, u64::MAX, 0, 0, 0),
    };
    varint(&mut b, offset);
    varint(&mut b, length);
    varint(&mut b, keys);
    varint(&mut b, tree);
    varint(&mut b, indirect);
    b.extend_from_slice(&0u64.to_le_bytes()); // commit time
    varint(&mut b, 0); // no version-tree nodes
    encode_object(MANIFEST_MAGIC, &b)
}

/// Where `OcdbtBuilder::put` placed a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Kept in the leaf; nothing to write.
    Inline,
    /// The caller must append the value to the data file; it starts at `offset`.
    Append {
        /// Where it starts (the data file's length before it).
        offset: u64,
    },
}

/// What `OcdbtBuilder::finish` returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OcdbtTail {
    /// The data file's path relative to the item (`ocdbt.process_0/d/<32 hex>`), derived
    /// from the content: write the data file under a temporary name, then give it this one.
    pub data_file: String,
    /// Encoded B+tree nodes, to append to the data file after the values.
    pub nodes: Vec<u8>,
    /// `manifest.ocdbt`.
    pub manifest: Vec<u8>,
    /// The database uuid written in the manifest.
    pub uuid: [u8; 16],
}

/// Builds one OCDBT database generation from keys and values given in any order, with the
/// values over `MAX_INLINE_VALUE_BYTES` streamed into one data file by the caller.
#[derive(Clone, Debug)]
pub struct OcdbtBuilder {
    entries: BTreeMap<Vec<u8>, Stored>,
    data_len: u64,
    hasher: Sha256,
    node_budget: usize,
}

impl Default for OcdbtBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl OcdbtBuilder {
    /// An empty database.
    pub fn new() -> Self {
        Self::with_node_budget(DEFAULT_NODE_BUDGET)
    }

    /// An empty database whose nodes are split at about `bytes` encoded bytes (small values
    /// force interior nodes, for tests).
    pub fn with_node_budget(bytes: usize) -> Self {
        OcdbtBuilder {
            entries: BTreeMap::new(),
            data_len: 0,
            hasher: Sha256::new(),
            node_budget: bytes.max(1),
        }
    }

    /// Bytes of the data file so far.
    pub fn data_len(&self) -> u64 {
        self.data_len
    }

    fn check_key(&self, key: &str) -> Result<(), EncodeError> {
        if key.len() > MAX_KEY_LEN {
            return Err(EncodeError::KeyTooLong { len: key.len() });
        }
        if self.entries.contains_key(key.as_bytes()) {
            return Err(EncodeError::DuplicateKey { key: key.into() });
        }
        Ok(())
    }

    fn record(&mut self, key: &str, length: u64, sha256: &[u8; 32]) {
        self.hasher.update((key.len() as u64).to_le_bytes());
        self.hasher.update(key.as_bytes());
        self.hasher.update(length.to_le_bytes());
        self.hasher.update(sha256);
    }

    /// Adds a value held in memory: inline if small, else the caller appends it.
    pub fn put(&mut self, key: &str, value: &[u8]) -> Result<Placement, EncodeError> {
        if value.len() > MAX_INLINE_VALUE_BYTES {
            let sha: [u8; 32] = Sha256::digest(value).into();
            let offset = self.put_appended(key, value.len() as u64, &sha)?;
            return Ok(Placement::Append { offset });
        }
        self.check_key(key)?;
        let sha: [u8; 32] = Sha256::digest(value).into();
        self.record(key, value.len() as u64, &sha);
        self.entries
            .insert(key.as_bytes().to_vec(), Stored::Inline(value.to_vec()));
        Ok(Placement::Inline)
    }

    /// Records a value of `length` bytes (sha256 given) that the caller has appended (or
    /// will append) to the data file at the returned offset (`data_len()` before the call).
    /// Used for values produced as a stream, whatever their size.
    pub fn put_appended(
        &mut self,
        key: &str,
        length: u64,
        sha256: &[u8; 32],
    ) -> Result<u64, EncodeError> {
        self.check_key(key)?;
        let offset = self.data_len;
        self.data_len = offset
            .checked_add(length)
            .filter(|&e| e <= i64::MAX as u64)
            .ok_or(EncodeError::DataFileTooLarge)?;
        self.record(key, length, sha256);
        self.entries.insert(
            key.as_bytes().to_vec(),
            Stored::OutOfLine { offset, length },
        );
        Ok(offset)
    }

    /// Encodes the B+tree (leaves, then interior levels, root last) to append at
    /// `data_len()`, and the manifest.
    pub fn finish(self) -> OcdbtTail {
        let digest: [u8; 32] = self.hasher.finalize().into();
        let name: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        let data_file = format!("{DATA_DIR}{name}");
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(
            &Sha256::digest([b"wanbake ocdbt uuid".as_slice(), &digest].concat())[..16],
        );
        let mut nodes = Vec::new();
        let base = self.data_len;
        let located: Vec<(&[u8], Located)> = (self.entries.iter())
            .map(|(k, v)| (k.as_slice(), v.located_in(&data_file)))
            .collect();
        let entries: Vec<(&[u8], &Located)> = located.iter().map(|(k, v)| (*k, v)).collect();
        // The file's name is not in a one-file leaf's estimate: its table holds it once.
        let cost = |v: &Located| match v {
            Located::Inline(x) => x.len(),
            Located::InFile { .. } => 20,
        };
        let level = leaf_level(&entries, base, self.node_budget, cost, &mut nodes);
        let (height, root) = interior_levels(level, &mut nodes, base, &data_file, self.node_budget);
        let manifest = encode_manifest(uuid, height, root.as_ref(), &data_file);
        OcdbtTail {
            data_file,
            nodes,
            manifest,
            uuid,
        }
    }
}

/// The leaves of a B+tree over sorted `entries`, split greedily where the estimated encoded
/// size (`64` per node, `key + 24 + cost(value)` per entry) would pass `budget`, appended to
/// `nodes` (which start at `base` of their file); returns the level's references.
fn leaf_level(
    entries: &[(&[u8], &Located)],
    base: u64,
    budget: usize,
    cost: impl Fn(&Located) -> usize,
    nodes: &mut Vec<u8>,
) -> Vec<ChildRef> {
    let mut level = Vec::new();
    let mut start = 0;
    while start < entries.len() {
        let mut end = start;
        let mut size = 64usize;
        while end < entries.len() {
            let (k, v) = entries[end];
            let c = k.len() + 24 + cost(v);
            if end > start && size + c > budget {
                break;
            }
            size += c;
            end += 1;
        }
        let group = &entries[start..end];
        let enc = encode_leaf_node_files(group);
        let indirect: u64 = group
            .iter()
            .map(|(_, v)| match v {
                Located::InFile { length, .. } => *length,
                Located::Inline(_) => 0,
            })
            .sum();
        level.push(ChildRef {
            first_key: group[0].0.to_vec(),
            offset: base + nodes.len() as u64,
            length: enc.len() as u64,
            num_keys: group.len() as u64,
            num_tree_bytes: enc.len() as u64,
            num_indirect_value_bytes: indirect,
        });
        nodes.extend_from_slice(&enc);
        start = end;
    }
    level
}

/// Encodes the interior levels above `level` (children whose nodes are at `base +` their
/// place in `nodes`), appending each node to `nodes`: the root's height and reference
/// (`None`: an empty database).
fn interior_levels(
    mut level: Vec<ChildRef>,
    nodes: &mut Vec<u8>,
    base: u64,
    data_file: &str,
    node_budget: usize,
) -> (u8, Option<ChildRef>) {
    let mut height = 0u8;
    while level.len() > 1 {
        height += 1;
        let mut next = Vec::new();
        let mut start = 0;
        while start < level.len() {
            let mut end = start;
            let mut size = 64usize;
            while end < level.len() {
                let cost = level[end].first_key.len() + 60;
                if end - start >= 2 && size + cost > node_budget {
                    break;
                }
                size += cost;
                end += 1;
            }
            // Never leave a lone child for the next node.
            if level.len() - end == 1 {
                end += 1;
            }
            let group = &level[start..end];
            let enc = encode_interior_node(height, group, data_file);
            next.push(ChildRef {
                first_key: group[0].first_key.clone(),
                offset: base + nodes.len() as u64,
                length: enc.len() as u64,
                num_keys: group.iter().map(|c| c.num_keys).sum(),
                num_tree_bytes: enc.len() as u64
                    + group.iter().map(|c| c.num_tree_bytes).sum::<u64>(),
                num_indirect_value_bytes: group.iter().map(|c| c.num_indirect_value_bytes).sum(),
            });
            nodes.extend_from_slice(&enc);
            start = end;
        }
        level = next;
    }
    (height, level.into_iter().next())
}

/// One array of an item to encode in memory (`encode_item`).
#[derive(Clone, Debug)]
pub struct ArrayIn<'a> {
    /// Dict keys from the root.
    pub keys: Vec<String>,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<u64>,
    /// C-order little-endian bytes.
    pub data: &'a [u8],
}

/// Every file of an item folder holding `arrays` (OCDBT + zarr v2, one chunk per array), as
/// (path relative to the item, bytes), sorted by path. The reference composition of the
/// encoders, in the order a streaming writer follows: per array its `.zarray` and its
/// chunk (appended to the data file when over the inline limit), then nodes and manifest.
pub fn encode_item(
    arrays: &[ArrayIn],
    node_budget: usize,
) -> Result<Vec<(String, Vec<u8>)>, EncodeError> {
    let mut b = OcdbtBuilder::with_node_budget(node_budget);
    let mut data = Vec::new();
    let mut leaves = Vec::new();
    let mut sorted: Vec<&ArrayIn> = arrays.iter().collect();
    sorted.sort_by(|a, b| a.keys.cmp(&b.keys));
    for a in sorted {
        let name = a.keys.join(".");
        let expected = a.dtype.size().and_then(|s| {
            a.shape
                .iter()
                .try_fold(s as u64, |acc, &d| acc.checked_mul(d))
        });
        if expected != Some(a.data.len() as u64) {
            return Err(EncodeError::Size {
                name,
                dtype: a.dtype,
                shape: a.shape.clone(),
                expected: expected.unwrap_or(u64::MAX),
                found: a.data.len() as u64,
            });
        }
        b.put(
            &format!("{name}/.zarray"),
            &encode_zarray(&a.shape, a.dtype, &a.shape)?,
        )?;
        let chunk = encode_chunk(a.data)?;
        if let Placement::Append { offset } = b.put(
            &format!("{name}/{}", single_chunk_key(a.shape.len())),
            &chunk,
        )? {
            debug_assert_eq!(offset, data.len() as u64);
            data.extend_from_slice(&chunk);
        }
        leaves.push(MetadataLeaf {
            keys: a.keys.clone(),
            shape: a.shape.clone(),
        });
    }
    let tail = b.finish();
    data.extend_from_slice(&tail.nodes);
    let mut files = vec![
        ("_METADATA".to_string(), encode_tree_metadata(&leaves)),
        (
            "_CHECKPOINT_METADATA".to_string(),
            encode_checkpoint_metadata(
                &serde_json::Value::String(STANDARD_HANDLER.into()),
                &serde_json::Map::new(),
            ),
        ),
        ("commit_success.txt".to_string(), encode_commit_success()),
        ("manifest.ocdbt".to_string(), tail.manifest),
        (tail.data_file, data),
    ];
    files.sort();
    Ok(files)
}

// ---------------------------------------------------------------------------------------
// A database whose large values each live in a file of their own.

/// A value of an [`ItemDb`]: in the leaf, or `length` bytes at `offset` of a data file
/// (path relative to the item).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Located {
    /// In the leaf (at most `MAX_INLINE_VALUE_BYTES`).
    Inline(Vec<u8>),
    /// In a data file.
    InFile {
        /// Path relative to the item (`ocdbt.process_0/d/<name>`).
        file: String,
        /// Offset in it.
        offset: u64,
        /// Length.
        length: u64,
    },
}

/// A data-file table of `files` (sorted, distinct; each relative to the referring object's
/// path, with an empty base path), prefix-compressed.
fn encode_data_file_table_of(out: &mut Vec<u8>, files: &[&str]) {
    varint(out, files.len() as u64);
    let prefixes: Vec<usize> = (0..files.len())
        .map(|i| match i {
            0 => 0,
            _ => common_prefix(files[i - 1].as_bytes(), files[i].as_bytes()),
        })
        .collect();
    for &p in &prefixes[1.min(prefixes.len())..] {
        varint(out, p as u64);
    }
    for (f, &p) in files.iter().zip(&prefixes) {
        varint(out, (f.len() - p) as u64);
    }
    for _ in files {
        varint(out, 0); // base path length
    }
    for (f, &p) in files.iter().zip(&prefixes) {
        out.extend_from_slice(&f.as_bytes()[p..]);
    }
}

/// An encoded leaf node (height 0, keys relative to the empty prefix) whose out-of-line
/// values may lie in many data files: its table lists each file its entries refer to once.
pub fn encode_leaf_node_files(entries: &[(&[u8], &Located)]) -> Vec<u8> {
    let mut files: Vec<&str> = entries
        .iter()
        .filter_map(|(_, v)| match v {
            Located::InFile { file, .. } => Some(file.as_str()),
            Located::Inline(_) => None,
        })
        .collect();
    files.sort_unstable();
    files.dedup();
    let mut b = vec![0u8]; // height
    encode_data_file_table_of(&mut b, &files);
    varint(&mut b, entries.len() as u64);
    let keys: Vec<&[u8]> = entries.iter().map(|(k, _)| *k).collect();
    encode_keys(&mut b, &keys, false);
    for (_, v) in entries {
        let len = match v {
            Located::Inline(x) => x.len() as u64,
            Located::InFile { length, .. } => *length,
        };
        varint(&mut b, len);
    }
    for (_, v) in entries {
        b.push(u8::from(matches!(v, Located::InFile { .. })));
    }
    for (_, v) in entries {
        if let Located::InFile { file, .. } = v {
            let id = files.binary_search(&file.as_str()).unwrap_or(0);
            varint(&mut b, id as u64);
        }
    }
    for (_, v) in entries {
        if let Located::InFile { offset, .. } = v {
            varint(&mut b, *offset);
        }
    }
    for (_, v) in entries {
        if let Located::Inline(x) = v {
            b.extend_from_slice(x);
        }
    }
    encode_object(BTREE_NODE_MAGIC, &b)
}

/// What [`ItemDb::finish`] returns: the node file to write and the manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ItemDbTail {
    /// The node file's path relative to the item (`ocdbt.process_0/d/<32 hex>`), named
    /// from the database's keys and value locations.
    pub node_file: String,
    /// Its bytes: every B+tree node, root last.
    pub nodes: Vec<u8>,
    /// `manifest.ocdbt`.
    pub manifest: Vec<u8>,
}

/// Builds one OCDBT database generation whose values are inline or already written to
/// data files of their own (a chunk per file, named by its content): the writer streams
/// every chunk into its own file as it is produced, in any order, and writes the nodes and
/// the manifest last. Same settings as [`OcdbtBuilder`] (its module doc).
#[derive(Clone, Debug)]
pub struct ItemDb {
    entries: BTreeMap<Vec<u8>, Located>,
    node_budget: usize,
}

impl Default for ItemDb {
    fn default() -> Self {
        Self::with_node_budget(DEFAULT_NODE_BUDGET)
    }
}

impl ItemDb {
    /// An empty database whose nodes are split at about `bytes` encoded bytes.
    pub fn with_node_budget(bytes: usize) -> Self {
        ItemDb {
            entries: BTreeMap::new(),
            node_budget: bytes.max(1),
        }
    }

    /// Adds `key` with its value (an inline value over `MAX_INLINE_VALUE_BYTES` is refused
    /// as too long for a leaf).
    pub fn put(&mut self, key: &str, value: Located) -> Result<(), EncodeError> {
        if key.len() > MAX_KEY_LEN {
            return Err(EncodeError::KeyTooLong { len: key.len() });
        }
        if let Located::Inline(x) = &value
            && x.len() > MAX_INLINE_VALUE_BYTES
        {
            return Err(EncodeError::InlineTooLong {
                key: key.into(),
                len: x.len(),
            });
        }
        if self
            .entries
            .insert(key.as_bytes().to_vec(), value)
            .is_some()
        {
            return Err(EncodeError::DuplicateKey { key: key.into() });
        }
        Ok(())
    }

    /// Keys added so far.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// No key yet?
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The node file (named from a sha256 of every key and value location: content, as
    /// the chunk files are named by theirs) and the manifest.
    pub fn finish(self) -> ItemDbTail {
        let mut h = Sha256::new();
        for (k, v) in &self.entries {
            h.update((k.len() as u64).to_le_bytes());
            h.update(k);
            match v {
                Located::Inline(x) => {
                    h.update([0u8]);
                    h.update((x.len() as u64).to_le_bytes());
                    h.update(x);
                }
                Located::InFile {
                    file,
                    offset,
                    length,
                } => {
                    h.update([1u8]);
                    h.update((file.len() as u64).to_le_bytes());
                    h.update(file.as_bytes());
                    h.update(offset.to_le_bytes());
                    h.update(length.to_le_bytes());
                }
            }
        }
        let digest: [u8; 32] = h.finalize().into();
        let name: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        let node_file = format!("{DATA_DIR}{name}");
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(
            &Sha256::digest([b"wanbake ocdbt uuid".as_slice(), &digest].concat())[..16],
        );
        let entries: Vec<(&[u8], &Located)> = (self.entries.iter())
            .map(|(k, v)| (k.as_slice(), v))
            .collect();
        let mut nodes = Vec::new();
        let cost = |v: &Located| match v {
            Located::Inline(x) => x.len(),
            Located::InFile { file, .. } => 20 + file.len(),
        };
        let level = leaf_level(&entries, 0, self.node_budget, cost, &mut nodes);
        let (height, root) = interior_levels(level, &mut nodes, 0, &node_file, self.node_budget);
        let manifest = encode_manifest(uuid, height, root.as_ref(), &node_file);
        ItemDbTail {
            node_file,
            nodes,
            manifest,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_are_spelt_as_python_repr() {
        for (x, py) in [
            (1e-6, "1e-06"),
            (8.0, "8.0"),
            (0.0, "0.0"),
            (0.0001, "0.0001"),
            (1e-5, "1e-05"),
            (1.5e16, "1.5e+16"),
            (123456789012345.0, "123456789012345.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
        ] {
            assert_eq!(py_float(x), py, "{x}");
        }
        let v: serde_json::Value = serde_json::from_str(r#"{"eps": 1e-06, "n": 3}"#).unwrap();
        assert_eq!(py_json(&v), r#"{"eps": 1e-06, "n": 3}"#);
    }
}
