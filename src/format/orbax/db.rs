//! Key-value access to an Orbax item folder, in both layouts Orbax writes: plain files (no
//! OCDBT: a key is a path under the item folder) and an OCDBT database (`manifest.ocdbt`
//! at the item root; its B+tree may refer to per-process databases `ocdbt.process_N/`
//! through data-file base paths, which the transitive-path rule resolves).
//!
//! Owns: `Store` (open, list keys, look a key up), `Value` (where a value's bytes are:
//! inline in a node, a byte range of a data file, or a whole file), and bounded reads of
//! such ranges, checked against the file's size. Does not own: what the keys hold (`zarr`).
//!
//! Opening an OCDBT store reads the manifest, follows the latest version's root and walks
//! the whole B+tree once into a sorted index of keys (an Orbax item has a few keys per
//! array: thousands at most). Node heights must decrease by one per level, so the walk
//! ends; a key reached twice is an error, the number of node reads is capped (a hostile
//! tree could refer to one subtree many times under different prefixes), and every node's
//! crc is checked.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::{FormatError, OrbaxError};
use super::ocdbt::{self, BtreeNode, DataRef, LeafValue, Manifest};

/// Where the bytes of one value are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// In memory (an inline OCDBT value).
    Inline(Arc<[u8]>),
    /// `length` bytes at `offset` of `file` (an out-of-line OCDBT value, or a plain file
    /// with offset 0 and its length).
    Range {
        /// The file.
        file: PathBuf,
        /// Offset.
        offset: u64,
        /// Length.
        length: u64,
    },
}

impl Value {
    /// Byte length.
    pub fn len(&self) -> u64 {
        match self {
            Value::Inline(b) => b.len() as u64,
            Value::Range { length, .. } => *length,
        }
    }

    /// Whether the value is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The part `[offset, offset + length)` of this value, bounds-checked.
    pub fn slice(&self, offset: u64, length: u64, key: &str) -> Result<Value, OrbaxError> {
        let end = offset.checked_add(length);
        if end.is_none_or(|e| e > self.len()) {
            return Err(OrbaxError::OutsideFile {
                file: self.file_or_inline(),
                key: key.to_string(),
                offset,
                length,
                file_len: self.len(),
            });
        }
        Ok(match self {
            Value::Inline(b) => {
                Value::Inline(b[offset as usize..(offset + length) as usize].into())
            }
            Value::Range {
                file, offset: o, ..
            } => Value::Range {
                file: file.clone(),
                offset: o + offset,
                length,
            },
        })
    }

    fn file_or_inline(&self) -> PathBuf {
        match self {
            Value::Inline(_) => PathBuf::from("<inline value>"),
            Value::Range { file, .. } => file.clone(),
        }
    }

    /// The file that holds the value (for error messages), or `<inline value>`.
    pub fn file(&self) -> PathBuf {
        self.file_or_inline()
    }

    /// Reads the whole value into memory, refusing more than `limit` bytes.
    pub fn read_all(&self, key: &str, limit: u64) -> Result<Vec<u8>, OrbaxError> {
        if self.len() > limit {
            return Err(OrbaxError::format(
                &self.file(),
                Some(key),
                FormatError::TooLarge {
                    what: "value",
                    field: "length",
                    value: self.len(),
                    max: limit,
                },
            ));
        }
        let mut out = Vec::with_capacity(self.len() as usize);
        self.open(key)?
            .read_to_end(&mut out)
            .map_err(|e| OrbaxError::io(&self.file(), e))?;
        if out.len() as u64 != self.len() {
            return Err(OrbaxError::OutsideFile {
                file: self.file(),
                key: key.to_string(),
                offset: 0,
                length: self.len(),
                file_len: out.len() as u64,
            });
        }
        Ok(out)
    }

    /// A reader over the value's bytes. For a file range the range is checked against the
    /// file's current size first.
    pub fn open(&self, key: &str) -> Result<Box<dyn Read + Send>, OrbaxError> {
        match self {
            Value::Inline(b) => Ok(Box::new(std::io::Cursor::new(b.clone()))),
            Value::Range {
                file,
                offset,
                length,
            } => {
                let mut f = std::fs::File::open(file).map_err(|e| OrbaxError::io(file, e))?;
                let file_len = f.metadata().map_err(|e| OrbaxError::io(file, e))?.len();
                if offset.checked_add(*length).is_none_or(|e| e > file_len) {
                    return Err(OrbaxError::OutsideFile {
                        file: file.clone(),
                        key: key.to_string(),
                        offset: *offset,
                        length: *length,
                        file_len,
                    });
                }
                f.seek(SeekFrom::Start(*offset))
                    .map_err(|e| OrbaxError::io(file, e))?;
                Ok(Box::new(f.take(*length)))
            }
        }
    }
}

/// The key-value store of one item folder.
#[derive(Clone, Debug)]
pub enum Store {
    /// No OCDBT: keys are files under the folder.
    Files {
        /// The item folder.
        dir: PathBuf,
    },
    /// An OCDBT database rooted at the folder.
    Ocdbt(Arc<Ocdbt>),
}

impl Store {
    /// The folder the keys are relative to.
    pub fn dir(&self) -> &Path {
        match self {
            Store::Files { dir } => dir,
            Store::Ocdbt(db) => &db.dir,
        }
    }

    /// Looks a key up; `None` if the store has no such key.
    pub fn get(&self, key: &str) -> Result<Option<Value>, OrbaxError> {
        match self {
            Store::Files { dir } => {
                if key
                    .split('/')
                    .any(|c| c.is_empty() || c == "." || c == "..")
                {
                    return Ok(None);
                }
                let path = dir.join(key);
                match std::fs::metadata(&path) {
                    Ok(m) if m.is_file() => Ok(Some(Value::Range {
                        file: path,
                        offset: 0,
                        length: m.len(),
                    })),
                    Ok(_) => Ok(None),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(OrbaxError::io(&path, e)),
                }
            }
            Store::Ocdbt(db) => Ok(db.get(key)),
        }
    }

    /// Every key, sorted (for a plain-file store: every file under the folder, `/`-joined).
    pub fn keys(&self) -> Result<Vec<String>, OrbaxError> {
        match self {
            Store::Files { dir } => {
                let mut out = Vec::new();
                walk_files(dir, "", &mut out, 0)?;
                out.sort();
                Ok(out)
            }
            Store::Ocdbt(db) => Ok(db.index.keys().cloned().collect()),
        }
    }
}

fn walk_files(
    dir: &Path,
    prefix: &str,
    out: &mut Vec<String>,
    depth: usize,
) -> Result<(), OrbaxError> {
    if depth > 64 {
        return Ok(());
    }
    for entry in std::fs::read_dir(dir).map_err(|e| OrbaxError::io(dir, e))? {
        let entry = entry.map_err(|e| OrbaxError::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let ty = entry
            .file_type()
            .map_err(|e| OrbaxError::io(&entry.path(), e))?;
        let key = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        if ty.is_dir() {
            walk_files(&entry.path(), &key, out, depth + 1)?;
        } else if ty.is_file() {
            out.push(key);
        }
    }
    Ok(())
}

/// An opened OCDBT database: its manifest and the index of every key of the latest version.
#[derive(Clone, Debug)]
pub struct Ocdbt {
    /// The database root (the item folder).
    pub dir: PathBuf,
    /// The decoded manifest.
    pub manifest: Manifest,
    index: BTreeMap<String, Value>,
}

/// Cap on an encoded B+tree node read from disk.
const MAX_NODE_FILE_BYTES: u64 = 64 * 1024 * 1024;
/// Cap on the nodes one walk reads: a hostile tree can refer to one subtree many times
/// under different prefixes, which would otherwise multiply the work.
const MAX_NODE_READS: usize = 1 << 20;
/// Cap on the inline value bytes one walk keeps in its index.
const MAX_INLINE_TOTAL: u64 = 1 << 30;

impl Ocdbt {
    /// Opens the database whose `manifest.ocdbt` is in `dir` and indexes its latest version.
    pub fn open(dir: &Path) -> Result<Ocdbt, OrbaxError> {
        let mpath = dir.join("manifest.ocdbt");
        let bytes = std::fs::read(&mpath).map_err(|e| OrbaxError::io(&mpath, e))?;
        let mut manifest =
            ocdbt::decode_manifest(&bytes).map_err(|e| OrbaxError::format(&mpath, None, e))?;
        let mut manifest_path = mpath;
        if manifest.config.manifest_kind == 1 {
            // Numbered manifests: the newest `manifest.<16 hex digits>` holds the versions.
            let (p, m) = newest_numbered_manifest(dir)?;
            manifest_path = p;
            manifest = m;
        }
        let mut db = Ocdbt {
            dir: dir.to_path_buf(),
            manifest,
            index: BTreeMap::new(),
        };
        if let Some(v) = db.manifest.latest().cloned()
            && let Some(root) = &v.root
        {
            let mut index = BTreeMap::new();
            let mut budget = Budget::default();
            db.walk(
                root,
                v.root_height,
                Vec::new(),
                &manifest_path,
                &mut index,
                &mut budget,
            )?;
            db.index = index;
        }
        Ok(db)
    }

    /// The value of `key` in the latest version.
    pub fn get(&self, key: &str) -> Option<Value> {
        self.index.get(key).cloned()
    }

    /// Every key of the latest version, sorted, with its value.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.index.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Decodes a version-tree node the manifest (or another version node) refers to: the
    /// older generations. A reader of the latest generation never needs this (the newest
    /// versions are inline in the manifest); it is here for inspection and tests.
    pub fn read_version_node(
        &self,
        r: &ocdbt::VersionNodeRef,
    ) -> Result<ocdbt::VersionNode, OrbaxError> {
        let path = self.file_of(&r.location)?;
        let what = format!("version node of generation {}", r.generation);
        let value = Value::Range {
            file: path.clone(),
            offset: r.location.offset,
            length: r.location.length,
        };
        let bytes = value.read_all(&what, MAX_NODE_FILE_BYTES)?;
        ocdbt::decode_version_node(
            &bytes,
            &r.location.file.base_path,
            self.manifest.config.version_tree_arity_log2,
        )
        .map_err(|e| OrbaxError::format(&path, Some(&what), e))
    }

    /// The data file a reference names, inside the database folder: a path that is
    /// absolute or climbs out with `..` is refused (it would read files outside the item).
    fn file_of(&self, r: &DataRef) -> Result<PathBuf, OrbaxError> {
        let rel = r.file.path();
        let escapes = rel.starts_with('/')
            || rel.contains('\\')
            || rel.split('/').any(|c| c == ".." || c == ".");
        if escapes || rel.is_empty() {
            return Err(OrbaxError::format(
                &self.dir,
                None,
                FormatError::Invalid {
                    what: "data file table",
                    field: "path",
                    reason: format!("{rel:?} is not a relative path inside the database"),
                },
            ));
        }
        Ok(self.dir.join(rel))
    }

    fn walk(
        &self,
        node_ref: &DataRef,
        height: u8,
        prefix: Vec<u8>,
        referrer: &Path,
        index: &mut BTreeMap<String, Value>,
        budget: &mut Budget,
    ) -> Result<(), OrbaxError> {
        let path = self.file_of(node_ref)?;
        let what = format!("b-tree node at height {height}");
        budget.reads += 1;
        if budget.reads > MAX_NODE_READS {
            return Err(OrbaxError::format(
                referrer,
                Some(&what),
                FormatError::TooLarge {
                    what: "b-tree",
                    field: "nodes reached",
                    value: budget.reads as u64,
                    max: MAX_NODE_READS as u64,
                },
            ));
        }
        let value = Value::Range {
            file: path.clone(),
            offset: node_ref.offset,
            length: node_ref.length,
        };
        if node_ref.length > MAX_NODE_FILE_BYTES {
            return Err(OrbaxError::format(
                referrer,
                Some(&what),
                FormatError::TooLarge {
                    what: "b-tree node reference",
                    field: "data_file_length",
                    value: node_ref.length,
                    max: MAX_NODE_FILE_BYTES,
                },
            ));
        }
        let bytes = value.read_all(&what, MAX_NODE_FILE_BYTES)?;
        let max = u64::from(self.manifest.config.max_decoded_node_bytes);
        let node = ocdbt::decode_btree_node(&bytes, &node_ref.file.base_path, max.max(1))
            .map_err(|e| OrbaxError::format(&path, Some(&what), e))?;
        if node.height() != height {
            return Err(OrbaxError::format(
                &path,
                Some(&what),
                FormatError::Invalid {
                    what: "b-tree node",
                    field: "height",
                    reason: format!("{}, but its parent expects {height}", node.height()),
                },
            ));
        }
        match node {
            BtreeNode::Leaf(entries) => {
                for e in entries {
                    let mut full = prefix.clone();
                    full.extend_from_slice(&e.key);
                    let key = String::from_utf8(full).map_err(|e| {
                        OrbaxError::format(
                            &path,
                            None,
                            FormatError::Invalid {
                                what: "b-tree node",
                                field: "key",
                                reason: format!(
                                    "not UTF-8: {:?}",
                                    String::from_utf8_lossy(e.as_bytes())
                                ),
                            },
                        )
                    })?;
                    let v = match e.value {
                        LeafValue::Inline(b) => {
                            budget.inline_bytes += b.len() as u64;
                            if budget.inline_bytes > MAX_INLINE_TOTAL {
                                return Err(OrbaxError::format(
                                    &path,
                                    Some(&key),
                                    FormatError::TooLarge {
                                        what: "b-tree",
                                        field: "inline value bytes",
                                        value: budget.inline_bytes,
                                        max: MAX_INLINE_TOTAL,
                                    },
                                ));
                            }
                            Value::Inline(b.into())
                        }
                        LeafValue::Indirect(r) => Value::Range {
                            file: self.file_of(&r)?,
                            offset: r.offset,
                            length: r.length,
                        },
                    };
                    if index.insert(key.clone(), v).is_some() {
                        return Err(OrbaxError::format(
                            &path,
                            Some(&key),
                            FormatError::Invalid {
                                what: "b-tree",
                                field: "key",
                                reason: "reached twice through the tree".into(),
                            },
                        ));
                    }
                }
            }
            BtreeNode::Interior(h, entries) => {
                for e in entries {
                    let mut child_prefix = prefix.clone();
                    child_prefix.extend_from_slice(&e.key[..e.subtree_common_prefix_length]);
                    self.walk(&e.child, h - 1, child_prefix, &path, index, budget)?;
                }
            }
        }
        Ok(())
    }
}

/// What one walk has spent.
#[derive(Default)]
struct Budget {
    reads: usize,
    inline_bytes: u64,
}

fn newest_numbered_manifest(dir: &Path) -> Result<(PathBuf, Manifest), OrbaxError> {
    let mut best: Option<(u64, PathBuf)> = None;
    for entry in std::fs::read_dir(dir).map_err(|e| OrbaxError::io(dir, e))? {
        let entry = entry.map_err(|e| OrbaxError::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(hex) = name.strip_prefix("manifest.")
            && hex.len() == 16
            && let Ok(g) = u64::from_str_radix(hex, 16)
            && best.as_ref().is_none_or(|(b, _)| g > *b)
        {
            best = Some((g, entry.path()));
        }
    }
    let Some((_, path)) = best else {
        return Err(OrbaxError::MissingKey {
            store: dir.to_path_buf(),
            key: "manifest.<generation>".into(),
            hint: Some(
                "manifest.ocdbt is a numbered-kind config and no numbered manifest is present"
                    .into(),
            ),
        });
    };
    let bytes = std::fs::read(&path).map_err(|e| OrbaxError::io(&path, e))?;
    let m = ocdbt::decode_manifest(&bytes).map_err(|e| OrbaxError::format(&path, None, e))?;
    Ok((path, m))
}
