//! The OCDBT binary format: decoding of manifests, B+tree nodes, version-tree nodes and
//! data-file tables from untrusted bytes (no I/O, no `unsafe`), following tensorstore
//! `bc4fbc11` (`kvstore/ocdbt/format/`: `codec_util.cc`, `data_file_id_codec.cc`,
//! `btree.cc`, `btree_codec.h`, `manifest.cc`, `version_tree*.{h,cc}`, `config_codec.cc`).
//!
//! Where the published format page (`index.rst`) and the code differ, the code wins, and is
//! what this file follows: `manifest_kind`, `value_kind`, heights and the arity are single
//! bytes (the page says varint for some; for the values allowed the bytes are the same),
//! the CRC-32C covers everything before the footer, and a node's length field must equal
//! the object's length. The crc is checked before any field after the header is decoded.
//!
//! Does not own: finding files or following references between objects (`db`), writing
//! (`encode`).

use std::io::Read;

use super::error::FormatError;

/// Magic of a manifest (`manifest.ocdbt`).
pub const MANIFEST_MAGIC: u32 = 0x0cdb_3a2a;
/// Magic of a version-tree node.
pub const VERSION_NODE_MAGIC: u32 = 0x0cdb_1234;
/// Magic of a B+tree node.
pub const BTREE_NODE_MAGIC: u32 = 0x0cdb_20de;
/// Longest key and longest data-file path (tensorstore's `kMaxKeyLength`, `kMaxPathLength`).
pub const MAX_KEY_LEN: usize = 65535;
/// Longest data-file path.
pub const MAX_PATH_LEN: usize = 65535;
/// Most entries in one B+tree node (tensorstore's `kMaxNodeArity`).
pub const MAX_NODE_ARITY: u64 = 1024 * 1024;
/// Longest inline value (tensorstore's `kMaxInlineValueLength`).
pub const MAX_INLINE_VALUE_LEN: u64 = 1024 * 1024;
/// Largest decoded (decompressed) object wanbake accepts: a manifest, or a node whose
/// config allows more than this, is refused rather than decoded into memory.
pub const MAX_DECODED_OBJECT: u64 = 256 * 1024 * 1024;
/// Header (magic, length) + footer (crc) bytes of every object.
const MIN_OBJECT_LEN: usize = 4 + 8 + 4;

/// A cursor over a decoded body that turns every short read into `FormatError::Truncated`.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8], what: &'static str) -> Self {
        Reader { buf, pos: 0, what }
    }

    fn truncated(&self, field: &'static str) -> FormatError {
        FormatError::Truncated {
            what: self.what,
            field,
            offset: self.pos,
        }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn bytes(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], FormatError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| self.truncated(field))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, FormatError> {
        Ok(self.bytes(1, field)?[0])
    }

    pub(crate) fn u32_le(&mut self, field: &'static str) -> Result<u32, FormatError> {
        let b = self.bytes(4, field)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(crate) fn u64_le(&mut self, field: &'static str) -> Result<u64, FormatError> {
        let b = self.bytes(8, field)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    /// An unsigned LEB128 of at most `bits` bits (riegeli's `ReadVarint64`/`32` rules: at
    /// most 10 / 5 bytes, no bits beyond the width).
    pub(crate) fn varint_bits(
        &mut self,
        field: &'static str,
        bits: u32,
    ) -> Result<u64, FormatError> {
        let start = self.pos;
        let mut value: u64 = 0;
        let mut shift = 0u32;
        loop {
            let byte = self.u8(field)?;
            let low = u64::from(byte & 0x7f);
            if shift >= 64 || (shift > 0 && low >> (64 - shift) != 0) {
                return Err(FormatError::BadVarint {
                    what: self.what,
                    field,
                    bits,
                    offset: start,
                });
            }
            value |= low << shift;
            if byte & 0x80 == 0 {
                break;
            }
            shift += 7;
        }
        if bits < 64 && value >> bits != 0 {
            return Err(FormatError::BadVarint {
                what: self.what,
                field,
                bits,
                offset: start,
            });
        }
        Ok(value)
    }

    pub(crate) fn varint(&mut self, field: &'static str) -> Result<u64, FormatError> {
        self.varint_bits(field, 64)
    }

    /// A count of items that each take at least `min_bytes` of what remains: refused before
    /// anything is allocated for them if the remaining bytes cannot hold that many.
    pub(crate) fn count(
        &mut self,
        field: &'static str,
        min_bytes: usize,
        max: u64,
    ) -> Result<usize, FormatError> {
        let n = self.varint(field)?;
        let by_len = (self.remaining() / min_bytes.max(1)) as u64;
        let bound = max.min(by_len);
        if n > bound {
            return Err(FormatError::TooLarge {
                what: self.what,
                field,
                value: n,
                max: bound,
            });
        }
        Ok(n as usize)
    }

    pub(crate) fn finish(&self) -> Result<(), FormatError> {
        match self.remaining() {
            0 => Ok(()),
            extra => Err(FormatError::TrailingBytes {
                what: self.what,
                extra,
            }),
        }
    }
}

/// The body of one OCDBT object after its header, checksum and compression are checked
/// and undone.
pub fn decode_envelope(
    bytes: &[u8],
    magic: u32,
    what: &'static str,
    max_decoded: u64,
) -> Result<Vec<u8>, FormatError> {
    if bytes.len() < MIN_OBJECT_LEN {
        return Err(FormatError::TooShort {
            what,
            len: bytes.len(),
            min: MIN_OBJECT_LEN,
        });
    }
    let found = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    if found != magic {
        return Err(FormatError::BadMagic {
            what,
            expected: magic,
            found,
        });
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&bytes[4..12]);
    let declared = u64::from_le_bytes(len);
    if declared != bytes.len() as u64 {
        return Err(FormatError::LengthMismatch {
            what,
            declared,
            actual: bytes.len(),
        });
    }
    let (covered, footer) = bytes.split_at(bytes.len() - 4);
    let stored = u32::from_le_bytes([footer[0], footer[1], footer[2], footer[3]]);
    let computed = crc32c::crc32c(covered);
    if stored != computed {
        return Err(FormatError::CrcMismatch {
            what,
            stored,
            computed,
        });
    }
    let mut r = Reader::new(&covered[12..], what);
    let version = r.varint_bits("version", 32)?;
    if version != 0 {
        return Err(FormatError::UnknownVersion { what, version });
    }
    let method = r.varint_bits("compression_format", 32)?;
    let rest = r.bytes(r.remaining(), "body")?;
    match method {
        0 => Ok(rest.to_vec()),
        1 => zstd_decode_bounded(rest, what, max_decoded),
        _ => Err(FormatError::UnknownCompression { what, method }),
    }
}

/// Decodes zstd data (one or more frames) into memory, refusing more than `limit` bytes.
pub(crate) fn zstd_decode_bounded(
    data: &[u8],
    what: &'static str,
    limit: u64,
) -> Result<Vec<u8>, FormatError> {
    let bad = |e: std::io::Error| FormatError::Decompress {
        what,
        reason: e.to_string(),
    };
    let dec = zstd::stream::read::Decoder::new(data).map_err(bad)?;
    let mut out = Vec::new();
    dec.take(limit.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(bad)?;
    if out.len() as u64 > limit {
        return Err(FormatError::DecodedTooLarge { what, limit });
    }
    Ok(out)
}

/// One entry of a data-file table: the file is `base_path + relative_path`, relative to the
/// database root; `base_path` already includes the transitive path of the referring node.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DataFileId {
    /// Transitive + base path (what a node read from this file passes to its children).
    pub base_path: Vec<u8>,
    /// The rest of the path.
    pub relative_path: Vec<u8>,
}

impl DataFileId {
    /// The full path relative to the database root, as text (lossy for non-UTF-8 bytes).
    pub fn path(&self) -> String {
        let mut p = self.base_path.clone();
        p.extend_from_slice(&self.relative_path);
        String::from_utf8_lossy(&p).into_owned()
    }
}

/// Reads a data-file table (`ReadDataFileTable`): prefix-compressed paths with base paths.
pub(crate) fn read_data_file_table(
    r: &mut Reader,
    transitive: &[u8],
) -> Result<Vec<DataFileId>, FormatError> {
    let what = r.what;
    let max_path = MAX_PATH_LEN.saturating_sub(transitive.len());
    // Every file costs at least two bytes (its suffix and base-path lengths).
    let n = r.count("num_files", 2, u64::MAX)?;
    let mut prefix = vec![0usize; n];
    for p in prefix.iter_mut().skip(1) {
        *p = r.varint_bits("path_prefix_length", 16)? as usize;
    }
    let mut suffix = vec![0usize; n];
    for s in suffix.iter_mut() {
        *s = r.varint_bits("path_suffix_length", 16)? as usize;
    }
    let mut base = vec![0usize; n];
    let mut prev_base = 0usize;
    for i in 0..n {
        base[i] = r.varint_bits("base_path_length", 16)? as usize;
        let path_len = prefix[i] + suffix[i];
        if path_len > max_path {
            return Err(FormatError::TooLarge {
                what,
                field: "path_length",
                value: path_len as u64,
                max: max_path as u64,
            });
        }
        if base[i] > path_len {
            return Err(FormatError::Invalid {
                what,
                field: "base_path_length",
                reason: format!(
                    "file {i}: base path of {} bytes in a {path_len}-byte path",
                    base[i]
                ),
            });
        }
        if prefix[i] > prev_base.min(base[i]) && base[i] != prev_base {
            return Err(FormatError::Invalid {
                what,
                field: "path_prefix_length",
                reason: format!(
                    "file {i}: a common prefix of {} bytes crosses a base path that changes length",
                    prefix[i]
                ),
            });
        }
        prev_base = base[i];
    }
    let mut out = Vec::with_capacity(n);
    let mut prev: Vec<u8> = Vec::new();
    for i in 0..n {
        if prefix[i] > prev.len() {
            return Err(FormatError::Invalid {
                what,
                field: "path_prefix_length",
                reason: format!(
                    "file {i}: prefix of {} bytes is longer than the previous path ({} bytes)",
                    prefix[i],
                    prev.len()
                ),
            });
        }
        let mut path = prev[..prefix[i]].to_vec();
        path.extend_from_slice(r.bytes(suffix[i], "path_suffix")?);
        let mut base_path = transitive.to_vec();
        base_path.extend_from_slice(&path[..base[i]]);
        out.push(DataFileId {
            base_path,
            relative_path: path[base[i]..].to_vec(),
        });
        prev = path;
    }
    Ok(out)
}

/// Compression of newly written objects, from a manifest's config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// Method 0.
    None,
    /// Method 1, with the level new objects are written at.
    Zstd {
        /// zstd level.
        level: i32,
    },
}

/// A database's configuration (the start of every manifest).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Database id.
    pub uuid: [u8; 16],
    /// 0 single (the manifest holds the version tree), 1 numbered.
    pub manifest_kind: u8,
    /// Values up to this many bytes are stored in the leaf.
    pub max_inline_value_bytes: u32,
    /// Largest decoded B+tree node.
    pub max_decoded_node_bytes: u32,
    /// log2 of the version tree's arity.
    pub version_tree_arity_log2: u8,
    /// How new objects are compressed.
    pub compression: Compression,
}

/// Where an encoded object (a node or a value) lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataRef {
    /// The data file.
    pub file: DataFileId,
    /// Byte offset in it.
    pub offset: u64,
    /// Byte length.
    pub length: u64,
}

/// Statistics carried with a reference to a B+tree node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Statistics {
    /// Keys in the subtree.
    pub num_keys: u64,
    /// Encoded bytes of the subtree's nodes.
    pub num_tree_bytes: u64,
    /// Bytes of the subtree's out-of-line values.
    pub num_indirect_value_bytes: u64,
}

/// One B+tree version (generation) referenced from a manifest or version-tree leaf.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    /// Generation number (from 1).
    pub generation: u64,
    /// Height of the root node.
    pub root_height: u8,
    /// The root node; `None` for an empty tree.
    pub root: Option<DataRef>,
    /// Statistics of the whole tree.
    pub statistics: Statistics,
    /// Commit time, ns since the Unix epoch.
    pub commit_time: u64,
}

/// A reference to a version-tree node (older generations).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VersionNodeRef {
    /// Latest generation in the subtree.
    pub generation: u64,
    /// Where the node is.
    pub location: DataRef,
    /// Generations in the subtree.
    pub num_generations: u64,
    /// Earliest commit time in the subtree.
    pub commit_time: u64,
    /// Height of the node.
    pub height: u8,
}

/// A decoded manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// The configuration.
    pub config: Config,
    /// The newest versions, oldest first (empty for a numbered config-only manifest).
    pub versions: Vec<Version>,
    /// Version-tree nodes for older generations.
    pub version_nodes: Vec<VersionNodeRef>,
}

impl Manifest {
    /// The latest version, whose root is what a reader follows.
    pub fn latest(&self) -> Option<&Version> {
        self.versions.last()
    }
}

fn read_config(r: &mut Reader) -> Result<Config, FormatError> {
    let what = r.what;
    let mut uuid = [0u8; 16];
    uuid.copy_from_slice(r.bytes(16, "uuid")?);
    let manifest_kind = r.u8("manifest_kind")?;
    if manifest_kind > 1 {
        return Err(FormatError::Invalid {
            what,
            field: "manifest_kind",
            reason: format!("{manifest_kind} (0 single, 1 numbered)"),
        });
    }
    let max_inline_value_bytes = r.varint_bits("max_inline_value_bytes", 32)? as u32;
    let max_decoded_node_bytes = r.varint_bits("max_decoded_node_bytes", 32)? as u32;
    let version_tree_arity_log2 = r.u8("version_tree_arity_log2")?;
    if !(1..=16).contains(&version_tree_arity_log2) {
        return Err(FormatError::Invalid {
            what,
            field: "version_tree_arity_log2",
            reason: format!("{version_tree_arity_log2} (tensorstore allows 1 to 16)"),
        });
    }
    let compression = match r.varint_bits("compression_method", 32)? {
        0 => Compression::None,
        1 => {
            let level = r.u32_le("zstd_level")? as i32;
            if !(-131072..=22).contains(&level) {
                return Err(FormatError::Invalid {
                    what,
                    field: "zstd_level",
                    reason: format!("{level} is outside zstd's range"),
                });
            }
            Compression::Zstd { level }
        }
        method => return Err(FormatError::UnknownCompression { what, method }),
    };
    Ok(Config {
        uuid,
        manifest_kind,
        max_inline_value_bytes,
        max_decoded_node_bytes,
        version_tree_arity_log2,
        compression,
    })
}

/// Reads the columns `data_file_id[n]`, `offset[n]`, `length[n]` of an
/// `IndirectDataReferenceArrayCodec`; `allow_missing` accepts (offset, length) = (MAX, MAX)
/// and returns `None` for it.
fn read_refs(
    r: &mut Reader,
    table: &[DataFileId],
    n: usize,
    allow_missing: bool,
) -> Result<Vec<Option<DataRef>>, FormatError> {
    let what = r.what;
    let mut ids = Vec::with_capacity(n);
    for index in 0..n {
        let id = r.varint("data_file_id")?;
        if id >= table.len() as u64 {
            return Err(FormatError::FileIdOutOfRange {
                what,
                index,
                id,
                files: table.len(),
            });
        }
        ids.push(id as usize);
    }
    let mut offsets = Vec::with_capacity(n);
    for _ in 0..n {
        offsets.push(r.varint("data_file_offset")?);
    }
    let mut out = Vec::with_capacity(n);
    for (index, (&id, &offset)) in ids.iter().zip(&offsets).enumerate() {
        let length = r.varint("data_file_length")?;
        if allow_missing && offset == u64::MAX && length == u64::MAX {
            out.push(None);
            continue;
        }
        check_range(what, index, offset, length)?;
        out.push(Some(DataRef {
            file: table[id].clone(),
            offset,
            length,
        }));
    }
    Ok(out)
}

/// `read_refs` where no reference may be missing.
fn read_required_refs(
    r: &mut Reader,
    table: &[DataFileId],
    n: usize,
) -> Result<Vec<DataRef>, FormatError> {
    Ok(read_refs(r, table, n, false)?
        .into_iter()
        .flatten()
        .collect())
}

/// tensorstore's `IndirectDataReference::Validate`: offset + length fits in an `i64`.
fn check_range(
    what: &'static str,
    index: usize,
    offset: u64,
    length: u64,
) -> Result<(), FormatError> {
    match offset.checked_add(length) {
        Some(end) if end <= i64::MAX as u64 => Ok(()),
        _ => Err(FormatError::RangeOverflow {
            what,
            index,
            offset,
            length,
        }),
    }
}

fn read_statistics(r: &mut Reader, n: usize) -> Result<Vec<Statistics>, FormatError> {
    let mut s = vec![Statistics::default(); n];
    for x in s.iter_mut() {
        x.num_keys = r.varint("num_keys")?;
    }
    for x in s.iter_mut() {
        x.num_tree_bytes = r.varint("num_tree_bytes")?;
    }
    for x in s.iter_mut() {
        x.num_indirect_value_bytes = r.varint("num_indirect_value_bytes")?;
    }
    Ok(s)
}

/// Version-tree leaf entries (the manifest's inline versions use the same encoding).
fn read_version_leaf_entries(
    r: &mut Reader,
    table: &[DataFileId],
    arity_log2: u8,
) -> Result<Vec<Version>, FormatError> {
    let what = r.what;
    // generation (>=1 byte), height (1), id, offset, length (>=1 each), 3 stats, time (8).
    let n = r.count("num_versions", 15, 1u64 << arity_log2)?;
    let mut gens = Vec::with_capacity(n);
    for _ in 0..n {
        gens.push(r.varint("generation_number")?);
    }
    let mut heights = Vec::with_capacity(n);
    for _ in 0..n {
        heights.push(r.u8("root_height")?);
    }
    let roots = read_refs(r, table, n, true)?;
    let stats = read_statistics(r, n)?;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let commit_time = r.u64_le("commit_time")?;
        out.push(Version {
            generation: gens[i],
            root_height: heights[i],
            root: roots[i].clone(),
            statistics: stats[i],
            commit_time,
        });
    }
    // ValidateVersionTreeLeafNodeEntries: generations non-zero, increasing, and all in the
    // leaf that holds the last one.
    for (i, v) in out.iter().enumerate() {
        if v.generation == 0 || (i > 0 && v.generation <= out[i - 1].generation) {
            return Err(FormatError::Invalid {
                what,
                field: "generation_number",
                reason: format!("entry {i}: generations must be non-zero and increasing"),
            });
        }
    }
    if let Some(last) = out.last() {
        let max = (last.generation - 1) % (1u64 << arity_log2) + 1;
        if n as u64 > max {
            return Err(FormatError::TooLarge {
                what,
                field: "num_versions",
                value: n as u64,
                max,
            });
        }
    }
    Ok(out)
}

fn read_version_interior_entries(
    r: &mut Reader,
    table: &[DataFileId],
    max: u64,
    with_height: Option<u8>,
) -> Result<Vec<VersionNodeRef>, FormatError> {
    let n = r.count("num_children", 13, max)?;
    let mut gens = Vec::with_capacity(n);
    for _ in 0..n {
        gens.push(r.varint("generation_number")?);
    }
    let locs = read_required_refs(r, table, n)?;
    let mut num_gen = Vec::with_capacity(n);
    for _ in 0..n {
        num_gen.push(r.varint("num_generations")?);
    }
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        times.push(r.u64_le("commit_time")?);
    }
    let mut out = Vec::with_capacity(n);
    for (i, loc) in locs.into_iter().enumerate() {
        let height = match with_height {
            Some(h) => h,
            None => r.u8("entry_height")?,
        };
        out.push(VersionNodeRef {
            generation: gens[i],
            location: loc,
            num_generations: num_gen[i],
            commit_time: times[i],
            height,
        });
    }
    Ok(out)
}

/// Decodes `manifest.ocdbt` (or a numbered manifest).
pub fn decode_manifest(bytes: &[u8]) -> Result<Manifest, FormatError> {
    const WHAT: &str = "manifest";
    let body = decode_envelope(bytes, MANIFEST_MAGIC, WHAT, MAX_DECODED_OBJECT)?;
    let mut r = Reader::new(&body, WHAT);
    let config = read_config(&mut r)?;
    if config.manifest_kind != 0 {
        r.finish()?;
        return Ok(Manifest {
            config,
            versions: Vec::new(),
            version_nodes: Vec::new(),
        });
    }
    let table = read_data_file_table(&mut r, &[])?;
    let versions = read_version_leaf_entries(&mut r, &table, config.version_tree_arity_log2)?;
    if versions.is_empty() {
        return Err(FormatError::Invalid {
            what: WHAT,
            field: "num_versions",
            reason: "a single-file manifest holds at least one version".into(),
        });
    }
    let max_height = 63 / u64::from(config.version_tree_arity_log2);
    let version_nodes = read_version_interior_entries(&mut r, &table, max_height, None)?;
    for (i, v) in version_nodes.iter().enumerate() {
        if v.height == 0 || u64::from(v.height) > max_height {
            return Err(FormatError::Invalid {
                what: WHAT,
                field: "entry_height",
                reason: format!("entry {i}: {} is outside [1, {max_height}]", v.height),
            });
        }
        if i > 0
            && (v.generation <= version_nodes[i - 1].generation
                || v.height >= version_nodes[i - 1].height)
        {
            return Err(FormatError::Invalid {
                what: WHAT,
                field: "version_nodes",
                reason: format!("entry {i}: generations must increase and heights decrease"),
            });
        }
    }
    r.finish()?;
    Ok(Manifest {
        config,
        versions,
        version_nodes,
    })
}

/// A decoded version-tree node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VersionNode {
    /// Height 0: versions.
    Leaf(Vec<Version>),
    /// Height > 0: child nodes, with the node's height.
    Interior(u8, Vec<VersionNodeRef>),
}

/// Decodes a version-tree node read through a reference whose transitive path is given.
pub fn decode_version_node(
    bytes: &[u8],
    transitive: &[u8],
    arity_log2: u8,
) -> Result<VersionNode, FormatError> {
    const WHAT: &str = "version tree node";
    let body = decode_envelope(bytes, VERSION_NODE_MAGIC, WHAT, MAX_DECODED_OBJECT)?;
    let mut r = Reader::new(&body, WHAT);
    let a = r.u8("version_tree_arity_log2")?;
    if a != arity_log2 {
        return Err(FormatError::Invalid {
            what: WHAT,
            field: "version_tree_arity_log2",
            reason: format!("{a}, but the manifest says {arity_log2}"),
        });
    }
    let height = r.u8("height")?;
    let table = read_data_file_table(&mut r, transitive)?;
    let node = if height == 0 {
        VersionNode::Leaf(read_version_leaf_entries(&mut r, &table, a)?)
    } else {
        if u64::from(height) > 63 / u64::from(a) {
            return Err(FormatError::Invalid {
                what: WHAT,
                field: "height",
                reason: format!("{height} is too high for arity 2^{a}"),
            });
        }
        VersionNode::Interior(
            height,
            read_version_interior_entries(&mut r, &table, 1u64 << a, Some(height - 1))?,
        )
    };
    r.finish()?;
    Ok(node)
}

/// The value of a leaf entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeafValue {
    /// Stored in the node.
    Inline(Vec<u8>),
    /// Stored in a data file.
    Indirect(DataRef),
}

/// One key/value of a leaf node; `key` is relative to the prefix of the path to the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeafEntry {
    /// Relative key.
    pub key: Vec<u8>,
    /// The value or where it is.
    pub value: LeafValue,
}

/// One child of an interior node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InteriorEntry {
    /// Inclusive lower bound of the child's keys (relative).
    pub key: Vec<u8>,
    /// Bytes of `key` common to every key of the subtree: the child's keys are relative to
    /// the parent's prefix + `key[..subtree_common_prefix_length]`.
    pub subtree_common_prefix_length: usize,
    /// The child node.
    pub child: DataRef,
    /// Its statistics.
    pub statistics: Statistics,
}

/// A decoded B+tree node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BtreeNode {
    /// Height 0.
    Leaf(Vec<LeafEntry>),
    /// Height > 0, with its height.
    Interior(u8, Vec<InteriorEntry>),
}

impl BtreeNode {
    /// The node's height.
    pub fn height(&self) -> u8 {
        match self {
            BtreeNode::Leaf(_) => 0,
            BtreeNode::Interior(h, _) => *h,
        }
    }
}

/// Reads the key columns shared by leaf and interior nodes (`ReadKeys`).
fn read_keys(
    r: &mut Reader,
    n: usize,
    interior: bool,
) -> Result<(Vec<Vec<u8>>, Vec<usize>), FormatError> {
    let what = r.what;
    let mut prefix = vec![0usize; n];
    for p in prefix.iter_mut().skip(1) {
        *p = r.varint_bits("key_prefix_length", 16)? as usize;
    }
    let mut suffix = vec![0usize; n];
    for s in suffix.iter_mut() {
        *s = r.varint_bits("key_suffix_length", 16)? as usize;
    }
    let mut common = vec![0usize; if interior { n } else { 0 }];
    for c in common.iter_mut() {
        *c = r.varint_bits("subtree_common_prefix_length", 16)? as usize;
    }
    let mut keys: Vec<Vec<u8>> = Vec::with_capacity(n);
    for i in 0..n {
        let prev_len = if i == 0 { 0 } else { keys[i - 1].len() };
        if prefix[i] > prev_len {
            return Err(FormatError::Invalid {
                what,
                field: "key_prefix_length",
                reason: format!(
                    "entry {i}: prefix of {} bytes exceeds the previous key's {prev_len}",
                    prefix[i]
                ),
            });
        }
        let len = prefix[i] + suffix[i];
        if len > MAX_KEY_LEN {
            return Err(FormatError::TooLarge {
                what,
                field: "key_length",
                value: len as u64,
                max: MAX_KEY_LEN as u64,
            });
        }
        if interior && common[i] > len {
            return Err(FormatError::Invalid {
                what,
                field: "subtree_common_prefix_length",
                reason: format!("entry {i}: {} exceeds the key length {len}", common[i]),
            });
        }
        let mut key = if i == 0 {
            Vec::with_capacity(len)
        } else {
            keys[i - 1][..prefix[i]].to_vec()
        };
        key.extend_from_slice(r.bytes(suffix[i], "key_suffix")?);
        if i > 0 && key <= keys[i - 1] {
            return Err(FormatError::KeyOrder { what, index: i });
        }
        keys.push(key);
    }
    Ok((keys, common))
}

/// Decodes a B+tree node read through a reference whose transitive path is given.
pub fn decode_btree_node(
    bytes: &[u8],
    transitive: &[u8],
    max_decoded: u64,
) -> Result<BtreeNode, FormatError> {
    const WHAT: &str = "b-tree node";
    let body = decode_envelope(
        bytes,
        BTREE_NODE_MAGIC,
        WHAT,
        max_decoded.min(MAX_DECODED_OBJECT),
    )?;
    let mut r = Reader::new(&body, WHAT);
    let height = r.u8("height")?;
    let table = read_data_file_table(&mut r, transitive)?;
    // Each entry needs at least: a suffix length, a value length and a value kind (leaf), or
    // a suffix length, a common prefix length, id, offset, length, three statistics (interior).
    let min_entry = if height == 0 { 3 } else { 8 };
    let n = r.count("num_entries", min_entry, MAX_NODE_ARITY)?;
    if n == 0 {
        return Err(FormatError::Invalid {
            what: WHAT,
            field: "num_entries",
            reason: "a node has at least one entry".into(),
        });
    }
    let (keys, common) = read_keys(&mut r, n, height > 0)?;
    let node = if height == 0 {
        let mut lengths = Vec::with_capacity(n);
        for _ in 0..n {
            lengths.push(r.varint("value_length")?);
        }
        let mut kinds = Vec::with_capacity(n);
        for (i, &len) in lengths.iter().enumerate() {
            let kind = r.u8("value_kind")?;
            match kind {
                0 if len > MAX_INLINE_VALUE_LEN => {
                    return Err(FormatError::TooLarge {
                        what: WHAT,
                        field: "value_length",
                        value: len,
                        max: MAX_INLINE_VALUE_LEN,
                    });
                }
                0 | 1 => kinds.push(kind),
                _ => {
                    return Err(FormatError::Invalid {
                        what: WHAT,
                        field: "value_kind",
                        reason: format!("entry {i}: {kind} (0 inline, 1 out of line)"),
                    });
                }
            }
        }
        let indirect: Vec<usize> = (0..n).filter(|&i| kinds[i] == 1).collect();
        let mut ids = Vec::with_capacity(indirect.len());
        for &i in &indirect {
            let id = r.varint("data_file_id")?;
            if id >= table.len() as u64 {
                return Err(FormatError::FileIdOutOfRange {
                    what: WHAT,
                    index: i,
                    id,
                    files: table.len(),
                });
            }
            ids.push(id as usize);
        }
        let mut refs = std::collections::HashMap::with_capacity(indirect.len());
        for (k, &i) in indirect.iter().enumerate() {
            let offset = r.varint("data_file_offset")?;
            check_range(WHAT, i, offset, lengths[i])?;
            refs.insert(
                i,
                DataRef {
                    file: table[ids[k]].clone(),
                    offset,
                    length: lengths[i],
                },
            );
        }
        let mut entries = Vec::with_capacity(n);
        for (i, key) in keys.into_iter().enumerate() {
            let value = match refs.remove(&i) {
                Some(d) => LeafValue::Indirect(d),
                // Inline lengths were bounded by MAX_INLINE_VALUE_LEN above.
                None => LeafValue::Inline(r.bytes(lengths[i] as usize, "value")?.to_vec()),
            };
            entries.push(LeafEntry { key, value });
        }
        BtreeNode::Leaf(entries)
    } else {
        let refs = read_required_refs(&mut r, &table, n)?;
        let stats = read_statistics(&mut r, n)?;
        let entries = keys
            .into_iter()
            .zip(common)
            .zip(refs)
            .zip(stats)
            .map(|(((key, c), child), statistics)| InteriorEntry {
                key,
                subtree_common_prefix_length: c,
                child,
                statistics,
            })
            .collect();
        BtreeNode::Interior(height, entries)
    };
    r.finish()?;
    Ok(node)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_follow_riegeli() {
        let v = |b: &[u8], bits| Reader::new(b, "t").varint_bits("f", bits);
        assert_eq!(v(&[0x00], 64), Ok(0));
        assert_eq!(v(&[0x96, 0x01], 64), Ok(150));
        let mut max = vec![0xff; 9];
        max.push(0x01);
        assert_eq!(v(&max, 64), Ok(u64::MAX));
        // A tenth byte with bits past 64, an eleventh byte, a 32-bit field over 2^32-1.
        max[9] = 0x02;
        assert!(matches!(v(&max, 64), Err(FormatError::BadVarint { .. })));
        let mut long = vec![0x80; 10];
        long.push(0);
        assert!(matches!(v(&long, 64), Err(FormatError::BadVarint { .. })));
        assert!(matches!(
            v(&[0x80, 0x80, 0x80, 0x80, 0x10], 32),
            Err(FormatError::BadVarint { .. })
        ));
        assert_eq!(
            v(&[0xff, 0xff, 0xff, 0xff, 0x0f], 32),
            Ok(u64::from(u32::MAX))
        );
        assert!(matches!(v(&[0x80], 64), Err(FormatError::Truncated { .. })));
    }

    #[test]
    fn data_file_table_with_shared_base_paths() {
        // Two files "base/" + "d/a", "base/" + "d/b": the second shares 7 bytes.
        let mut b = vec![2u8, 7, 8, 1, 5, 5];
        b.extend_from_slice(b"base/d/ab");
        let mut r = Reader::new(&b, "t");
        let t = read_data_file_table(&mut r, b"p/").unwrap();
        r.finish().unwrap();
        assert_eq!(t[0].path(), "p/base/d/a");
        assert_eq!(t[1].path(), "p/base/d/b");
        assert_eq!(t[1].base_path, b"p/base/");
        // A prefix longer than the previous path.
        let mut b = vec![2u8, 9, 7, 1, 5, 5];
        b.extend_from_slice(b"base/d/ab");
        assert!(read_data_file_table(&mut Reader::new(&b, "t"), b"").is_err());
    }
}
