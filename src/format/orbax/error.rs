//! Errors of the Orbax layer: `FormatError`, one variant per malformation that the parsers of
//! raw bytes (OCDBT objects, zarr metadata, shard indexes, JSON files) can find, with no path
//! (the parsers do no I/O); and `OrbaxError`, which every public entry point returns and
//! which always names the file, and the key where there is one.

use std::path::{Path, PathBuf};

/// What is wrong with the bytes of one object (an OCDBT manifest or node, a zarr metadata
/// document, a chunk, a shard index, an Orbax JSON file). The caller adds file and key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// Shorter than the fixed header + footer of an OCDBT object.
    #[error("{len} bytes is shorter than the {min}-byte header and checksum of an OCDBT {what}")]
    TooShort {
        /// The kind of object.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The minimum.
        min: usize,
    },
    /// The magic number is not the one this object must start with.
    #[error("expected an OCDBT {what} (magic {expected:#010x}), found magic {found:#010x}")]
    BadMagic {
        /// The kind of object.
        what: &'static str,
        /// Magic of that kind.
        expected: u32,
        /// Magic found.
        found: u32,
    },
    /// The length in the header differs from the length of the object.
    #[error(
        "the {what} header says {declared} bytes but the object is {actual} bytes (truncated?)"
    )]
    LengthMismatch {
        /// The kind of object.
        what: &'static str,
        /// Length in the header.
        declared: u64,
        /// Actual length.
        actual: usize,
    },
    /// The CRC-32C footer does not match the bytes.
    #[error(
        "CRC-32C mismatch in the {what}: stored {stored:#010x}, computed {computed:#010x} (corrupt file)"
    )]
    CrcMismatch {
        /// The kind of object.
        what: &'static str,
        /// Checksum stored in the footer.
        stored: u32,
        /// Checksum of the bytes.
        computed: u32,
    },
    /// A format version this reader does not know.
    #[error(
        "the {what} has format version {version}; wanbake reads version 0 (tensorstore's only one)"
    )]
    UnknownVersion {
        /// The kind of object.
        what: &'static str,
        /// Version found.
        version: u64,
    },
    /// A compression method other than 0 (none) or 1 (zstd).
    #[error("the {what} uses compression method {method}; OCDBT defines 0 (none) and 1 (zstd)")]
    UnknownCompression {
        /// The kind of object.
        what: &'static str,
        /// Method found.
        method: u64,
    },
    /// A zstd frame does not decode (or decodes past its size limit).
    #[error("zstd data of the {what} does not decode: {reason}")]
    Decompress {
        /// What was being decoded.
        what: &'static str,
        /// The decoder's message.
        reason: String,
    },
    /// A decoded size over its limit.
    #[error("the {what} decodes to more than {limit} bytes")]
    DecodedTooLarge {
        /// What was being decoded.
        what: &'static str,
        /// The limit.
        limit: u64,
    },
    /// The bytes end inside a field.
    #[error("the {what} ends inside field `{field}` (at byte {offset})")]
    Truncated {
        /// The kind of object.
        what: &'static str,
        /// The field being read.
        field: &'static str,
        /// Offset in the (decompressed) body.
        offset: usize,
    },
    /// A varint longer than 10 bytes or over the field's range.
    #[error("field `{field}` of the {what} is not a valid {bits}-bit varint (at byte {offset})")]
    BadVarint {
        /// The kind of object.
        what: &'static str,
        /// The field.
        field: &'static str,
        /// Width of the field.
        bits: u32,
        /// Offset in the body.
        offset: usize,
    },
    /// Bytes after the last field.
    #[error("{extra} bytes after the end of the {what}")]
    TrailingBytes {
        /// The kind of object.
        what: &'static str,
        /// How many.
        extra: usize,
    },
    /// A count or length over what the format or the remaining bytes allow.
    #[error("field `{field}` of the {what} is {value}; at most {max} fits here")]
    TooLarge {
        /// The kind of object.
        what: &'static str,
        /// The field.
        field: &'static str,
        /// Value found.
        value: u64,
        /// The bound.
        max: u64,
    },
    /// A field whose value breaks a rule of the format.
    #[error("field `{field}` of the {what}: {reason}")]
    Invalid {
        /// The kind of object.
        what: &'static str,
        /// The field.
        field: &'static str,
        /// The rule.
        reason: String,
    },
    /// Keys of a node not strictly increasing.
    #[error("key {index} of the {what} does not sort after key {prev} (corrupt node)", prev = index - 1)]
    KeyOrder {
        /// The kind of object.
        what: &'static str,
        /// Index of the offending entry (at least 1).
        index: usize,
    },
    /// A data-file index outside the node's data-file table.
    #[error("entry {index} of the {what} names data file {id}, but its table has {files}")]
    FileIdOutOfRange {
        /// The kind of object.
        what: &'static str,
        /// Entry index.
        index: usize,
        /// The id.
        id: u64,
        /// Table size.
        files: usize,
    },
    /// offset + length overflows.
    #[error("entry {index} of the {what}: offset {offset} + length {length} overflows")]
    RangeOverflow {
        /// The kind of object.
        what: &'static str,
        /// Entry index.
        index: usize,
        /// Offset.
        offset: u64,
        /// Length.
        length: u64,
    },
    /// A JSON document that does not parse, or whose fields are not what they must be.
    #[error("{what}: {reason}")]
    Json {
        /// The document kind (`.zarray`, `zarr.json`, `_METADATA`, ...).
        what: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A feature the format has that this reader does not implement.
    #[error("{what}: {feature} is not supported by wanbake's Orbax reader")]
    Unsupported {
        /// The document kind.
        what: &'static str,
        /// The feature, with its value.
        feature: String,
    },
}

/// Why an Orbax checkpoint could not be read or resolved. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum OrbaxError {
    /// The OS refused.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The bytes of a file (or of one key inside it) break the format.
    #[error("{}{}: {source}", file.display(), key.as_deref().map(|k| format!(": key `{k}`")).unwrap_or_default())]
    Format {
        /// The file.
        file: PathBuf,
        /// The key (OCDBT key or zarr chunk/metadata key), where there is one.
        key: Option<String>,
        /// The malformation.
        #[source]
        source: FormatError,
    },
    /// An out-of-line value that reaches past the end of its data file.
    #[error(
        "{}: key `{key}`: the value at bytes [{offset}, {offset}+{length}) lies outside the {file_len}-byte data file (truncated?)",
        file.display()
    )]
    OutsideFile {
        /// The data file.
        file: PathBuf,
        /// The key (or node) that refers to it.
        key: String,
        /// Offset.
        offset: u64,
        /// Length.
        length: u64,
        /// Actual length of the data file.
        file_len: u64,
    },
    /// A key that the checkpoint needs and does not have.
    #[error("{}: key `{key}` is missing{}", store.display(), hint.as_deref().map(|h| format!("; {h}")).unwrap_or_default())]
    MissingKey {
        /// The item folder (the key-value store).
        store: PathBuf,
        /// The key.
        key: String,
        /// What the key would have held.
        hint: Option<String>,
    },
    /// The path is not an Orbax item, step or CheckpointManager root.
    #[error("{}: {reason}", path.display())]
    NotACheckpoint {
        /// The path.
        path: PathBuf,
        /// What was looked for.
        reason: String,
    },
    /// A leaf asked for that the tree does not have.
    #[error("{}: no leaf `{name}` in _METADATA", item.display())]
    NoSuchLeaf {
        /// The item folder.
        item: PathBuf,
        /// The name asked for.
        name: String,
    },
}

impl OrbaxError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> OrbaxError {
        OrbaxError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    pub(crate) fn format(file: &Path, key: Option<&str>, source: FormatError) -> OrbaxError {
        OrbaxError::Format {
            file: file.to_path_buf(),
            key: key.map(str::to_string),
            source,
        }
    }

    /// The malformation, where this error is one.
    pub fn format_error(&self) -> Option<&FormatError> {
        match self {
            OrbaxError::Format { source, .. } => Some(source),
            _ => None,
        }
    }
}
