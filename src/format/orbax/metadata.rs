//! Orbax's JSON files: the item's `_METADATA` (the tree: one entry per leaf with its path as
//! a key list, plus `use_ocdbt` / `use_zarr3`) and `_CHECKPOINT_METADATA` (at a step or an
//! item: handlers, timestamps and `custom_metadata`, where MaxText puts `lora` rank and
//! alpha). Parsing only: what a `custom_metadata` entry means is the caller's business.
//!
//! Follows orbax `3ff7b24a` (`_src/metadata/tree.py`, `checkpoint.py`) and the files orbax
//! 0.12.8 writes (golden/orbax/). Does not own: writing these files (`encode`).

use serde_json::{Map, Value as Json};

use super::error::FormatError;

/// How a path component indexes its parent (orbax `KeyType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyType {
    /// 1: a list/tuple index.
    Sequence,
    /// 2: a dict key.
    Dict,
    /// Another code (kept as read).
    Other(i64),
}

impl KeyType {
    /// The number Orbax writes.
    pub fn code(self) -> i64 {
        match self {
            KeyType::Sequence => 1,
            KeyType::Dict => 2,
            KeyType::Other(c) => c,
        }
    }
}

/// One component of a leaf's path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathKey {
    /// The key as text (a sequence index is its decimal string).
    pub key: String,
    /// What kind of container it indexes.
    pub key_type: KeyType,
}

/// One leaf of the tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leaf {
    /// Its path from the root.
    pub keys: Vec<PathKey>,
    /// Orbax's value type (`jax.Array`, `np.ndarray`, `scalar`, `string`, ...).
    pub value_type: String,
    /// Whether Orbax skips it on restore.
    pub skip_deserialize: bool,
    /// The per-device write shape, where recorded (jax.Array leaves).
    pub write_shape: Option<Vec<u64>>,
}

impl Leaf {
    /// The array's name in the store: the keys joined with `.` (Orbax's parameter name).
    pub fn name(&self) -> String {
        self.keys
            .iter()
            .map(|k| k.key.as_str())
            .collect::<Vec<_>>()
            .join(".")
    }

    /// Whether the LAST component is `value` (the suffix an `nnx.State` save leaves; a
    /// `value` anywhere else is a module name and is not this).
    pub fn has_value_suffix(&self) -> bool {
        self.keys.len() > 1 && self.keys.last().is_some_and(|k| k.key == "value")
    }

    /// The path without the `nnx.State` `.value` suffix (unchanged when there is none).
    pub fn path_without_value(&self) -> Vec<&str> {
        let n = self.keys.len() - usize::from(self.has_value_suffix());
        self.keys[..n].iter().map(|k| k.key.as_str()).collect()
    }
}

/// A parsed `_METADATA`.
#[derive(Clone, Debug, PartialEq)]
pub struct TreeMetadata {
    /// Leaves in file order.
    pub leaves: Vec<Leaf>,
    /// `use_ocdbt`, where present.
    pub use_ocdbt: Option<bool>,
    /// `use_zarr3`, where present.
    pub use_zarr3: Option<bool>,
    /// `store_array_data_equal_to_fill_value`, where present.
    pub store_array_data_equal_to_fill_value: Option<bool>,
    /// `custom_metadata` (null when absent).
    pub custom_metadata: Json,
}

fn err(what: &'static str, reason: impl Into<String>) -> FormatError {
    FormatError::Json {
        what,
        reason: reason.into(),
    }
}

fn opt_bool(
    o: &Map<String, Json>,
    k: &str,
    what: &'static str,
) -> Result<Option<bool>, FormatError> {
    match o.get(k) {
        None | Some(Json::Null) => Ok(None),
        Some(Json::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(err(what, format!("`{k}` must be a boolean, found {v}"))),
    }
}

/// Parses `_METADATA`.
pub fn parse_tree_metadata(bytes: &[u8]) -> Result<TreeMetadata, FormatError> {
    const W: &str = "_METADATA";
    let v: Json = serde_json::from_slice(bytes).map_err(|e| err(W, e.to_string()))?;
    let Json::Object(o) = v else {
        return Err(err(W, "not a JSON object"));
    };
    let Some(Json::Object(tree)) = o.get("tree_metadata") else {
        return Err(FormatError::Unsupported {
            what: W,
            feature: "a file without `tree_metadata` (written by Orbax before 0.5?)".into(),
        });
    };
    let mut leaves = Vec::with_capacity(tree.len());
    let mut names = std::collections::BTreeSet::new();
    for (tuple, entry) in tree {
        let bad = |r: String| err(W, format!("leaf {tuple}: {r}"));
        let Some(Json::Array(km)) = entry.get("key_metadata") else {
            return Err(bad("`key_metadata` must be an array".into()));
        };
        if km.is_empty() {
            return Err(bad("empty path".into()));
        }
        let mut keys = Vec::with_capacity(km.len());
        for k in km {
            let key = match k.get("key") {
                Some(Json::String(s)) => s.clone(),
                Some(Json::Number(n)) => n.to_string(),
                other => return Err(bad(format!("key {other:?} is not a string or an integer"))),
            };
            let key_type = match k.get("key_type").and_then(Json::as_i64) {
                Some(1) => KeyType::Sequence,
                Some(2) => KeyType::Dict,
                Some(c) => KeyType::Other(c),
                None => return Err(bad("`key_type` must be an integer".into())),
            };
            keys.push(PathKey { key, key_type });
        }
        let vm = entry
            .get("value_metadata")
            .and_then(Json::as_object)
            .ok_or_else(|| bad("`value_metadata` must be an object".into()))?;
        let value_type = vm
            .get("value_type")
            .and_then(Json::as_str)
            .ok_or_else(|| bad("`value_type` must be a string".into()))?
            .to_string();
        let skip_deserialize = vm
            .get("skip_deserialize")
            .and_then(Json::as_bool)
            .unwrap_or(false);
        let write_shape = match vm.get("write_shape") {
            None | Some(Json::Null) => None,
            Some(Json::Array(a)) => Some(
                a.iter()
                    .map(|x| {
                        x.as_u64()
                            .ok_or_else(|| bad(format!("write_shape holds {x}")))
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            Some(x) => return Err(bad(format!("write_shape is {x}"))),
        };
        let leaf = Leaf {
            keys,
            value_type,
            skip_deserialize,
            write_shape,
        };
        if !names.insert(leaf.name()) {
            return Err(err(
                W,
                format!("two leaves share the array name `{}`", leaf.name()),
            ));
        }
        leaves.push(leaf);
    }
    Ok(TreeMetadata {
        leaves,
        use_ocdbt: opt_bool(&o, "use_ocdbt", W)?,
        use_zarr3: opt_bool(&o, "use_zarr3", W)?,
        store_array_data_equal_to_fill_value: opt_bool(
            &o,
            "store_array_data_equal_to_fill_value",
            W,
        )?,
        custom_metadata: o.get("custom_metadata").cloned().unwrap_or(Json::Null),
    })
}

/// A parsed `_CHECKPOINT_METADATA`.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointMetadata {
    /// `item_handlers` as written (a string for an item, an object of item → handler for a step).
    pub item_handlers: Json,
    /// `init_timestamp_nsecs`.
    pub init_timestamp_nsecs: Option<u64>,
    /// `commit_timestamp_nsecs`.
    pub commit_timestamp_nsecs: Option<u64>,
    /// `custom_metadata` (empty when absent or null).
    pub custom_metadata: Map<String, Json>,
}

impl CheckpointMetadata {
    /// One entry of `custom_metadata` (e.g. MaxText's `lora`), as written.
    pub fn custom(&self, key: &str) -> Option<&Json> {
        self.custom_metadata.get(key)
    }
}

/// Parses `_CHECKPOINT_METADATA`.
pub fn parse_checkpoint_metadata(bytes: &[u8]) -> Result<CheckpointMetadata, FormatError> {
    const W: &str = "_CHECKPOINT_METADATA";
    let v: Json = serde_json::from_slice(bytes).map_err(|e| err(W, e.to_string()))?;
    let Json::Object(o) = v else {
        return Err(err(W, "not a JSON object"));
    };
    let custom_metadata = match o.get("custom_metadata") {
        None | Some(Json::Null) => Map::new(),
        Some(Json::Object(m)) => m.clone(),
        Some(x) => {
            return Err(err(
                W,
                format!("`custom_metadata` must be an object, found {x}"),
            ));
        }
    };
    let ts = |k: &str| -> Result<Option<u64>, FormatError> {
        match o.get(k) {
            None | Some(Json::Null) => Ok(None),
            Some(x) => x.as_u64().map(Some).ok_or_else(|| {
                err(
                    W,
                    format!("`{k}` must be a non-negative integer, found {x}"),
                )
            }),
        }
    };
    Ok(CheckpointMetadata {
        item_handlers: o.get("item_handlers").cloned().unwrap_or(Json::Null),
        init_timestamp_nsecs: ts("init_timestamp_nsecs")?,
        commit_timestamp_nsecs: ts("commit_timestamp_nsecs")?,
        custom_metadata,
    })
}
