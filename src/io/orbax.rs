//! Orbax checkpoints as inputs: what `Checkpoint::open_stored` hands the rest of wanbake when it is
//! pointed at a CheckpointManager root (its latest step), a step folder or an item folder.
//!
//! Owns: choosing a step's items (MaxDiffusion's `wan_state`; the Wan 2.2 A14B pair, mapped as
//! MaxDiffusion's 2.2 checkpointer does: `high_noise_transformer_state` → `transformer`,
//! `low_noise_transformer_state` → `transformer_2`; otherwise a step's only item, such as
//! MaxText's `items`), turning tree paths into tensor names (keys joined with `.`; the
//! `nnx.State` `.value` suffix stripped, as the last component only; MaxText's
//! `params/params` prefix stripped, and leaves outside it left out), MaxText's LoRA rank and
//! alpha (`custom_metadata["lora"]`, carried as the `lora_rank` / `lora_alpha` metadata the
//! Qwix reader already takes), the list of every file of the input (hashed into the manifest
//! like the shards of a sharded safetensors input), and decoding each item once.
//!
//! Decoding: the pipeline reads bytes through borrowed `TensorView`s, and an Orbax array is
//! compressed zarr chunks, so each item is decoded once into a scratch safetensors file (the
//! canonical `HeaderLayout`), streamed one row of the first axis at a time (`zarr::Rows`:
//! never a whole large array in memory), then mapped like any base. The scratch file is
//! unnamed (`O_TMPFILE` in `$TMPDIR`, or created and unlinked at once where that is not
//! available), so nothing is left behind even when the process is killed; its pages belong to
//! the map and go away with it. Cost: disk space in `$TMPDIR` equal to the decoded arrays (a
//! 1.3B bf16 transformer about 2.8 GB, a 14B one about 28 GB), written once per process (a
//! second `Checkpoint::open_stored` of the same item maps the same file), at the speed of zstd
//! decoding plus a sequential write (measured on the shared 2-core dev VM: 541 MB of bf16 in
//! 1.6–2.2 s, peak RSS 19 MB; README "Orbax input").
//!
//! Does not own: the container formats (`format::orbax`: `db`, `zarr`, `metadata`,
//! `checkpoint`), what the names mean (`model`, `adapter`).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::Value as Json;

use crate::format::header_layout::{HeaderLayout, PlannedTensor};
use crate::format::orbax::checkpoint::{Item, Level, Resolved, resolve};
use crate::format::orbax::metadata::{Leaf, TreeMetadata};
use crate::format::orbax::zarr::{ArrayReader, MAX_CHUNK_BYTES};
use crate::io::file::{ReadError, SafetensorsFile};
use crate::io::scratch;

/// MaxDiffusion's item of a single WAN transformer.
pub const WAN_STATE: &str = "wan_state";
/// MaxDiffusion's Wan 2.2 A14B items and the components wanbake names them.
pub const A14B_ITEMS: [(&str, &str); 2] = [
    ("high_noise_transformer_state", "transformer"),
    ("low_noise_transformer_state", "transformer_2"),
];
/// The `custom_metadata` entry MaxText records its LoRA config under.
pub const LORA_ENTRY: &str = "lora";
/// Value types whose leaves are arrays.
const ARRAY_VALUE_TYPES: [&str; 3] = ["jax.Array", "np.ndarray", "scalar"];

/// One item read as a component.
#[derive(Clone, Debug)]
pub struct ItemSource {
    /// The component it becomes (`""` for a single transformer).
    pub component: String,
    /// The item's name.
    pub name: String,
    /// The item folder.
    pub dir: PathBuf,
    /// Leaves not read (outside MaxText's `params/params`, or not arrays), by array name.
    pub left_out: Vec<String>,
}

/// What an Orbax input was, for reports and the manifest.
#[derive(Clone, Debug)]
pub struct OrbaxInput {
    /// What the given path was.
    pub level: Level,
    /// The step read (a root's latest).
    pub step: Option<u64>,
    /// The items read, in component order.
    pub items: Vec<ItemSource>,
    /// Every file of the input (the step folder's, or the item folder's), sorted.
    pub files: Vec<PathBuf>,
}

/// One decoded item: its component name and the scratch file holding its tensors.
#[derive(Debug)]
pub struct Decoded {
    /// The component (`""`, `transformer`, `transformer_2`).
    pub component: String,
    /// The scratch file, mapped.
    pub file: SafetensorsFile,
}

/// Whether `dir` looks like an Orbax checkpoint: a `_METADATA` in it, in a folder below it,
/// or in a folder below an integer-named one.
pub fn looks_like_orbax(dir: &Path) -> bool {
    let has = |d: &Path| d.join("_METADATA").is_file();
    let subdirs = |d: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(d)
            .map(|rd| {
                rd.filter_map(|e| e.ok().map(|e| e.path()))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
            .into_iter()
            .filter(|p: &PathBuf| p.is_dir())
            .collect()
    };
    has(dir)
        || subdirs(dir).iter().any(|s| {
            has(s)
                || (s
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                    && subdirs(s).iter().any(|i| has(i)))
        })
}

/// Resolves `path`, picks its items and decodes each into a scratch file.
pub fn open(path: &Path) -> Result<(OrbaxInput, Vec<Decoded>), ReadError> {
    let resolved = resolve(path)?;
    let chosen = choose_items(path, &resolved)?;
    let mut items = Vec::with_capacity(chosen.len());
    let mut decoded = Vec::with_capacity(chosen.len());
    for (component, name, dir) in chosen {
        let item = Item::open(&dir)?;
        let lora = lora_metadata(&resolved, &item);
        let (file, left_out) = decoded_once(&item, lora.as_ref())?;
        decoded.push(Decoded {
            component: component.clone(),
            file,
        });
        items.push(ItemSource {
            component,
            name,
            dir,
            left_out,
        });
    }
    let top = resolved
        .step_dir
        .clone()
        .unwrap_or_else(|| path.to_path_buf());
    let mut files = Vec::new();
    list_files(&top, &mut files)?;
    files.sort();
    Ok((
        OrbaxInput {
            level: resolved.level,
            step: resolved.step,
            items,
            files,
        },
        decoded,
    ))
}

/// The items of a resolved path, as (component, item name, folder).
fn choose_items(path: &Path, r: &Resolved) -> Result<Vec<(String, String, PathBuf)>, ReadError> {
    let pick = |name: &str, component: &str| {
        r.items
            .get(name)
            .map(|d| (component.to_string(), name.to_string(), d.clone()))
    };
    if r.level == Level::Item {
        return Ok(r
            .items
            .iter()
            .map(|(n, d)| (String::new(), n.clone(), d.clone()))
            .collect());
    }
    let pair: Vec<_> = A14B_ITEMS.iter().filter_map(|(n, c)| pick(n, c)).collect();
    if pair.len() == A14B_ITEMS.len() {
        return Ok(pair);
    }
    if let Some(one) = pick(WAN_STATE, "") {
        return Ok(vec![one]);
    }
    if pair.is_empty()
        && let [(n, d)] = r.items.iter().collect::<Vec<_>>().as_slice()
    {
        return Ok(vec![(String::new(), n.to_string(), d.to_path_buf())]);
    }
    Err(ReadError::Unsupported {
        path: r.step_dir.clone().unwrap_or_else(|| path.to_path_buf()),
        reason: format!(
            "an Orbax step whose items ({}) wanbake does not know: expected `{WAN_STATE}` \
             (a WAN transformer), `{}` and `{}` together (a Wan 2.2 A14B pair), or a single \
             item; point at the item folder you mean",
            r.items.keys().cloned().collect::<Vec<_>>().join(", "),
            A14B_ITEMS[0].0,
            A14B_ITEMS[1].0,
        ),
    })
}

/// MaxText's LoRA config: the step's `_CHECKPOINT_METADATA` for a root or a step (the
/// item's where the step has none), the item's own for an item folder.
fn lora_metadata(r: &Resolved, item: &Item) -> Option<Json> {
    let step = r.step_metadata.as_ref().and_then(|m| m.custom(LORA_ENTRY));
    let own = item.metadata.as_ref().and_then(|m| m.custom(LORA_ENTRY));
    match r.level {
        Level::Item => own.cloned(),
        Level::Root | Level::Step => step.or(own).cloned(),
    }
}

/// The tensors a tree becomes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TreeNames {
    /// (tensor name, Orbax array name) per leaf read, in `_METADATA` order.
    pub tensors: Vec<(String, String)>,
    /// Array names of the leaves left out.
    pub left_out: Vec<String>,
}

/// Tensor names of a tree (module doc), and the leaves left out.
pub fn tensor_names(tree: &TreeMetadata, dir: &Path) -> Result<TreeNames, ReadError> {
    let under_params =
        |l: &Leaf| l.keys.len() > 2 && l.keys[0].key == "params" && l.keys[1].key == "params";
    let maxtext = tree.leaves.iter().any(under_params);
    let mut names = Vec::new();
    let mut left_out = Vec::new();
    let mut seen = BTreeSet::new();
    for leaf in &tree.leaves {
        let array = leaf.name();
        if leaf.skip_deserialize
            || !ARRAY_VALUE_TYPES.contains(&leaf.value_type.as_str())
            || (maxtext && !under_params(leaf))
        {
            left_out.push(array);
            continue;
        }
        let path = leaf.path_without_value();
        let name = path
            .get(if maxtext { 2 } else { 0 }..)
            .unwrap_or(&[])
            .join(".");
        if name.is_empty() {
            left_out.push(array);
            continue;
        }
        if !seen.insert(name.clone()) {
            return Err(ReadError::Unsupported {
                path: dir.join("_METADATA"),
                reason: format!(
                    "two leaves become the tensor `{name}` (one with and one without the \
                     nnx.State `.value` suffix); the tree is ambiguous"
                ),
            });
        }
        names.push((name, array));
    }
    Ok(TreeNames {
        tensors: names,
        left_out,
    })
}

/// `lora_rank` / `lora_alpha` from MaxText's LoRA config, as the Qwix reader's metadata.
fn lora_file_metadata(lora: Option<&Json>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Some(Json::Object(o)) = lora else {
        return out;
    };
    for key in ["lora_rank", "lora_alpha"] {
        match o.get(key) {
            Some(Json::String(s)) => out.insert(key.to_string(), s.clone()),
            Some(Json::Number(n)) => out.insert(key.to_string(), n.to_string()),
            _ => None,
        };
    }
    out
}

/// The item decoded into a scratch file, once per process (`io::scratch`: a second
/// `Checkpoint::open_stored` of the same input, as `bake` makes for its checks, maps the same file),
/// and mapped. The key is the item's `_METADATA` identity (a rewritten checkpoint is decoded
/// again) and the LoRA metadata carried into the file.
fn decoded_once(
    item: &Item,
    lora: Option<&Json>,
) -> Result<(SafetensorsFile, Vec<String>), ReadError> {
    let mut key = scratch::key_of(&item.dir.join("_METADATA"), "")?;
    key.0 = std::path::absolute(&item.dir).unwrap_or_else(|_| item.dir.clone());
    key.2 = lora.map(Json::to_string).unwrap_or_default();
    let label = scratch::label("orbax", &item.dir);
    let TreeNames {
        tensors: names,
        left_out,
    } = tensor_names(&item.tree, &item.dir)?;
    let file = scratch::decoded_once(key, || decode_item(item, &names, lora, &label))?;
    Ok((SafetensorsFile::from_file(&file, &label)?, left_out))
}

/// Decodes one item into a scratch safetensors file (module doc).
fn decode_item(
    item: &Item,
    names: &[(String, String)],
    lora: Option<&Json>,
    label: &Path,
) -> Result<std::fs::File, ReadError> {
    let mut readers = BTreeMap::new();
    let mut planned = Vec::with_capacity(names.len());
    for (name, array) in names {
        let reader = ArrayReader::open(&item.store, array)?;
        let shape = reader
            .meta()
            .shape
            .iter()
            .map(|&d| usize::try_from(d))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| ReadError::Unsupported {
                path: item.dir.clone(),
                reason: format!("array `{array}`: shape {:?} too large", reader.meta().shape),
            })?;
        planned.push(PlannedTensor {
            name: name.clone(),
            dtype: reader.meta().dtype,
            shape,
        });
        readers.insert(name.clone(), reader);
    }
    let is_lora = names
        .iter()
        .any(|(n, _)| n.ends_with("_lora_a") || n.ends_with("_lora_b"));
    let metadata = match is_lora {
        true => lora_file_metadata(lora),
        false => BTreeMap::new(),
    };
    let layout = HeaderLayout::build(&planned, &metadata).map_err(|e| ReadError::Unsupported {
        path: item.dir.clone(),
        reason: format!("cannot lay the tree out as tensors: {e}"),
    })?;
    scratch::write(&layout, label, |info, w| match readers.get(&info.name) {
        Some(reader) => write_array(reader, w, label),
        None => Ok(0),
    })
}

/// Streams one array (one row of its first axis at a time); returns the bytes written.
fn write_array(reader: &ArrayReader, w: &mut dyn Write, label: &Path) -> Result<u64, ReadError> {
    let io = |e| ReadError::io(label, e);
    let shape = &reader.meta().shape;
    let Some(&rows) = shape.first() else {
        let bytes = reader.read_all(MAX_CHUNK_BYTES)?;
        w.write_all(&bytes).map_err(io)?;
        return Ok(bytes.len() as u64);
    };
    let mut n = 0u64;
    for row in reader.rows(0..rows)? {
        let (_, bytes) = row?;
        w.write_all(&bytes).map_err(io)?;
        n += bytes.len() as u64;
    }
    Ok(n)
}

fn list_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), ReadError> {
    let rd = std::fs::read_dir(dir).map_err(|e| ReadError::io(dir, e))?;
    for e in rd {
        let e = e.map_err(|e| ReadError::io(dir, e))?;
        let p = e.path();
        let ft = e.file_type().map_err(|err| ReadError::io(&p, err))?;
        if ft.is_dir() {
            list_files(&p, out)?;
        } else if ft.is_file() {
            out.push(p);
        }
    }
    Ok(())
}
