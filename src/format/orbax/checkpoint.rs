//! Finding an Orbax checkpoint from a path, and opening an item.
//!
//! `resolve` accepts a CheckpointManager root (integer-named step folders; the latest step
//! is taken), a step folder (item folders, each with a `_METADATA`) or an item folder (a
//! `_METADATA`), and lists the items. `Item::open` reads `_METADATA`, decides the layout
//! as Orbax does (the file's `use_ocdbt` flag, else the presence of `manifest.ocdbt`),
//! opens the store and reads `_CHECKPOINT_METADATA` where there is one. Does not own: the
//! meaning of trees or of `custom_metadata` (adapter and model code).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::db::{Ocdbt, Store};
use super::error::OrbaxError;
use super::metadata::{self, CheckpointMetadata, Leaf, TreeMetadata};
use super::zarr::ArrayReader;

/// Largest JSON file read (`_METADATA` of a big tree is a few MB).
const MAX_JSON_BYTES: u64 = 256 << 20;

/// What kind of folder a path was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// A CheckpointManager root: step folders named by integers.
    Root,
    /// A step folder: item folders.
    Step,
    /// An item folder.
    Item,
}

/// A resolved checkpoint path.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// What the given path was.
    pub level: Level,
    /// The step taken (Root: the latest; Step: its name if an integer).
    pub step: Option<u64>,
    /// The step folder (None for a bare item).
    pub step_dir: Option<PathBuf>,
    /// Items by name (for a bare item: its folder name).
    pub items: BTreeMap<String, PathBuf>,
    /// The step's `_CHECKPOINT_METADATA`, where present.
    pub step_metadata: Option<CheckpointMetadata>,
}

fn is_item(dir: &Path) -> bool {
    dir.join("_METADATA").is_file()
}

fn subdirs(dir: &Path) -> Result<Vec<(String, PathBuf)>, OrbaxError> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).map_err(|e| OrbaxError::io(dir, e))? {
        let e = e.map_err(|e| OrbaxError::io(dir, e))?;
        if e.file_type()
            .map_err(|err| OrbaxError::io(&e.path(), err))?
            .is_dir()
        {
            out.push((e.file_name().to_string_lossy().into_owned(), e.path()));
        }
    }
    out.sort();
    Ok(out)
}

fn items_of(step: &Path) -> Result<BTreeMap<String, PathBuf>, OrbaxError> {
    Ok(subdirs(step)?
        .into_iter()
        .filter(|(_, p)| is_item(p))
        .collect())
}

fn read_json_file(path: &Path) -> Result<Vec<u8>, OrbaxError> {
    let len = std::fs::metadata(path)
        .map_err(|e| OrbaxError::io(path, e))?
        .len();
    if len > MAX_JSON_BYTES {
        return Err(OrbaxError::format(
            path,
            None,
            super::FormatError::TooLarge {
                what: "JSON file",
                field: "length",
                value: len,
                max: MAX_JSON_BYTES,
            },
        ));
    }
    std::fs::read(path).map_err(|e| OrbaxError::io(path, e))
}

/// Reads `_CHECKPOINT_METADATA` in `dir`, if there is one.
pub fn read_checkpoint_metadata(dir: &Path) -> Result<Option<CheckpointMetadata>, OrbaxError> {
    let p = dir.join("_CHECKPOINT_METADATA");
    if !p.is_file() {
        return Ok(None);
    }
    let bytes = read_json_file(&p)?;
    metadata::parse_checkpoint_metadata(&bytes)
        .map(Some)
        .map_err(|e| OrbaxError::format(&p, None, e))
}

/// Resolves a root, step or item folder.
pub fn resolve(path: &Path) -> Result<Resolved, OrbaxError> {
    if !path.is_dir() {
        return Err(OrbaxError::NotACheckpoint {
            path: path.to_path_buf(),
            reason: "not a folder; an Orbax checkpoint is a CheckpointManager root, a step folder or an item folder".into(),
        });
    }
    if is_item(path) {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        return Ok(Resolved {
            level: Level::Item,
            step: None,
            step_dir: None,
            items: BTreeMap::from([(name, path.to_path_buf())]),
            step_metadata: None,
        });
    }
    let items = items_of(path)?;
    if !items.is_empty() {
        let step = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.parse::<u64>().ok());
        return Ok(Resolved {
            level: Level::Step,
            step,
            step_dir: Some(path.to_path_buf()),
            items,
            step_metadata: read_checkpoint_metadata(path)?,
        });
    }
    // A root: integer-named folders that hold items (Orbax's temporary folders have other
    // names and are skipped). The latest step wins.
    let mut best: Option<(u64, PathBuf, BTreeMap<String, PathBuf>)> = None;
    for (name, p) in subdirs(path)? {
        // All digits (Orbax may zero-pad step names to a fixed length).
        let Some(step) = name
            .bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| name.parse::<u64>().ok())
            .flatten()
        else {
            continue;
        };
        let items = items_of(&p)?;
        if !items.is_empty() && best.as_ref().is_none_or(|(b, _, _)| step > *b) {
            best = Some((step, p, items));
        }
    }
    match best {
        Some((step, dir, items)) => Ok(Resolved {
            level: Level::Root,
            step: Some(step),
            step_metadata: read_checkpoint_metadata(&dir)?,
            step_dir: Some(dir),
            items,
        }),
        None => Err(OrbaxError::NotACheckpoint {
            path: path.to_path_buf(),
            reason: "no _METADATA here, no item folder (a folder with _METADATA) below, and no integer-named step folder holding items; pass a CheckpointManager root, a step folder or an item folder".into(),
        }),
    }
}

/// One opened item: its tree, its store and its `_CHECKPOINT_METADATA`.
#[derive(Debug)]
pub struct Item {
    /// The item folder.
    pub dir: PathBuf,
    /// `_METADATA`.
    pub tree: TreeMetadata,
    /// The key-value store.
    pub store: Store,
    /// The item's own `_CHECKPOINT_METADATA`, where present.
    pub metadata: Option<CheckpointMetadata>,
}

impl Item {
    /// Opens an item folder.
    pub fn open(dir: &Path) -> Result<Item, OrbaxError> {
        let mp = dir.join("_METADATA");
        let bytes = read_json_file(&mp)?;
        let tree =
            metadata::parse_tree_metadata(&bytes).map_err(|e| OrbaxError::format(&mp, None, e))?;
        let ocdbt = tree
            .use_ocdbt
            .unwrap_or_else(|| dir.join("manifest.ocdbt").is_file());
        let store = if ocdbt {
            Store::Ocdbt(Arc::new(Ocdbt::open(dir)?))
        } else {
            Store::Files {
                dir: dir.to_path_buf(),
            }
        };
        Ok(Item {
            dir: dir.to_path_buf(),
            tree,
            store,
            metadata: read_checkpoint_metadata(dir)?,
        })
    }

    /// The leaves of the tree, in `_METADATA` order.
    pub fn leaves(&self) -> &[Leaf] {
        &self.tree.leaves
    }

    /// Opens the array of the leaf named `name` (keys joined with `.`).
    pub fn array(&self, name: &str) -> Result<ArrayReader, OrbaxError> {
        if !self.tree.leaves.iter().any(|l| l.name() == name) {
            return Err(OrbaxError::NoSuchLeaf {
                item: self.dir.clone(),
                name: name.to_string(),
            });
        }
        ArrayReader::open(&self.store, name)
    }
}
