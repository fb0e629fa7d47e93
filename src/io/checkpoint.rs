//! Multi-file checkpoints: everything a user may point wanbake at.
//!
//! Owns: `TensorSet` (one logical state dict spread over one or more validated files, with
//! the sharded-index cross-checks) and `Checkpoint` (what a path on disk is: a single file, a
//! `*.safetensors.index.json`, a diffusers model folder, a pipeline folder with
//! `transformer/` and `transformer_2/` (Wan 2.2 A14B), a PEFT adapter folder, or a folder
//! with one weights file, or an Orbax checkpoint, decoded by `io::orbax`), and which files
//! of a pipeline folder an output carries over unchanged (`Checkpoint::carried`: every file
//! but the transformers' and wanbake's own release files, symlinks followed). Does not own:
//! what the tensors mean (`model`, `adapter`).

use std::collections::BTreeMap;
use std::path::{Component as PathComponent, Path, PathBuf};

use super::file::{ReadError, SafetensorsFile, TensorView, refuse_by_name};
use super::orbax::{self, OrbaxInput};

/// Suffix of HF shard index files.
pub const INDEX_SUFFIX: &str = ".safetensors.index.json";

/// Pipeline subfolders that hold transformers wanbake bakes, in output order.
pub const TRANSFORMER_COMPONENTS: &[&str] = &[
    "transformer",
    "transformer_2",
    "high_noise_model",
    "low_noise_model",
];

/// A tensor found in a `TensorSet`: the file it lives in, its position there, and a view.
#[derive(Clone, Copy, Debug)]
pub struct TensorRef<'a> {
    /// The file holding it.
    pub file: &'a SafetensorsFile,
    /// Its index in `file.infos()`.
    pub position: usize,
    /// The borrowed data.
    pub view: TensorView<'a>,
}

/// One logical state dict: one file, or the shards of an index.
#[derive(Debug, Default)]
pub struct TensorSet {
    files: Vec<SafetensorsFile>,
    index_path: Option<PathBuf>,
    by_name: BTreeMap<String, (usize, usize)>,
    ignored: Vec<PathBuf>,
}

impl TensorSet {
    /// A set holding one file.
    pub fn from_file(path: &Path) -> Result<TensorSet, ReadError> {
        SafetensorsFile::open(path).map(TensorSet::from_opened)
    }

    /// A set described by an HF `*.safetensors.index.json`: every shard is opened and
    /// validated, and the map and the shards must agree exactly.
    pub fn from_index(index_path: &Path) -> Result<TensorSet, ReadError> {
        let dir = index_path.parent().unwrap_or(Path::new("."));
        let weight_map = read_weight_map(index_path)?;
        let bad = |reason: String| ReadError::Index {
            path: index_path.to_path_buf(),
            reason,
        };
        // Shards in first-mention order of the sorted map (deterministic).
        let mut shard_names: Vec<&str> = Vec::new();
        for shard in weight_map.values() {
            if !shard_names.contains(&shard.as_str()) {
                shard_names.push(shard);
            }
        }
        shard_names.sort();
        let mut files = Vec::with_capacity(shard_names.len());
        for shard in &shard_names {
            check_relative(shard).map_err(|r| bad(format!("weight_map names `{shard}`: {r}")))?;
            let p = dir.join(shard);
            if !p.is_file() {
                return Err(bad(format!(
                    "weight_map names shard `{shard}`, which does not exist in {}",
                    dir.display()
                )));
            }
            files.push(SafetensorsFile::open(&p)?);
        }
        let mut by_name = BTreeMap::new();
        for (fi, f) in files.iter().enumerate() {
            for (ti, t) in f.infos().iter().enumerate() {
                if let Some(&(other, _)) = by_name.get(&t.name) {
                    return Err(bad(format!(
                        "tensor `{}` is stored in two shards: `{}` and `{}`",
                        t.name, shard_names[other], shard_names[fi]
                    )));
                }
                match weight_map.get(&t.name) {
                    None => {
                        return Err(bad(format!(
                            "shard `{}` holds tensor `{}`, which weight_map does not list",
                            shard_names[fi], t.name
                        )));
                    }
                    Some(s) if s != shard_names[fi] => {
                        return Err(bad(format!(
                            "weight_map puts `{}` in `{s}` but it is stored in `{}`",
                            t.name, shard_names[fi]
                        )));
                    }
                    Some(_) => {}
                }
                by_name.insert(t.name.clone(), (fi, ti));
            }
        }
        if let Some((name, shard)) = weight_map.iter().find(|(n, _)| !by_name.contains_key(*n)) {
            return Err(bad(format!(
                "weight_map lists `{name}` in `{shard}`, but that shard does not contain it"
            )));
        }
        let referenced: Vec<PathBuf> = shard_names.iter().map(|s| dir.join(s)).collect();
        let ignored = stray_safetensors(dir, &referenced);
        Ok(TensorSet {
            files,
            index_path: Some(index_path.to_path_buf()),
            by_name,
            ignored,
        })
    }

    /// A set over one opened file (a decoded Orbax item's scratch file, `io::orbax`).
    pub fn from_opened(file: SafetensorsFile) -> TensorSet {
        let by_name = file
            .infos()
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), (0, i)))
            .collect();
        TensorSet {
            files: vec![file],
            index_path: None,
            by_name,
            ignored: Vec::new(),
        }
    }

    /// The files, owned (an adapter keeps them after its checkpoint is gone).
    pub fn into_files(self) -> Vec<SafetensorsFile> {
        self.files
    }

    /// Looks a tensor up.
    pub fn get(&self, name: &str) -> Option<TensorRef<'_>> {
        let &(fi, ti) = self.by_name.get(name)?;
        let file = &self.files[fi];
        Some(TensorRef {
            file,
            position: ti,
            view: file.view_at(ti),
        })
    }

    /// True if the set has this tensor.
    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// Tensor names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }

    /// Every tensor, sorted by name.
    pub fn tensors(&self) -> impl Iterator<Item = TensorRef<'_>> {
        self.by_name.values().map(|&(fi, ti)| {
            let file = &self.files[fi];
            TensorRef {
                file,
                position: ti,
                view: file.view_at(ti),
            }
        })
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// True when there are no tensors.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// The files, in shard order.
    pub fn files(&self) -> &[SafetensorsFile] {
        &self.files
    }

    /// The index file, when sharded.
    pub fn index_path(&self) -> Option<&Path> {
        self.index_path.as_deref()
    }

    /// `.safetensors` files next to an index that the index does not reference (reported,
    /// never read: the index is the source of truth).
    pub fn ignored_files(&self) -> &[PathBuf] {
        &self.ignored
    }

    /// `__metadata__` of the first file (adapters and single-file models keep their
    /// metadata there).
    pub fn metadata(&self) -> BTreeMap<String, String> {
        self.files
            .first()
            .map(|f| f.metadata().clone())
            .unwrap_or_default()
    }

    /// Total bytes of tensor data.
    pub fn data_bytes(&self) -> u64 {
        self.tensors().map(|t| t.view.bytes.len() as u64).sum()
    }
}

fn read_weight_map(index_path: &Path) -> Result<BTreeMap<String, String>, ReadError> {
    let text = std::fs::read_to_string(index_path).map_err(|e| ReadError::io(index_path, e))?;
    let bad = |reason: String| ReadError::Index {
        path: index_path.to_path_buf(),
        reason,
    };
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    let Some(map) = v.get("weight_map").and_then(|m| m.as_object()) else {
        return Err(bad("missing `weight_map` object".into()));
    };
    if map.is_empty() {
        return Err(bad("`weight_map` is empty".into()));
    }
    map.iter()
        .map(|(k, v)| match v.as_str() {
            Some(s) => Ok((k.clone(), s.to_string())),
            None => Err(bad(format!(
                "weight_map entry `{k}` is not a file name string"
            ))),
        })
        .collect()
}

/// A shard name must be a plain relative path inside the checkpoint folder.
fn check_relative(name: &str) -> Result<(), &'static str> {
    let p = Path::new(name);
    if name.is_empty() || p.is_absolute() {
        return Err("must be a relative file name");
    }
    if p.components()
        .any(|c| !matches!(c, PathComponent::Normal(_)))
    {
        return Err("must not leave the checkpoint folder");
    }
    Ok(())
}

fn stray_safetensors(dir: &Path, referenced: &[PathBuf]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = list_dir(dir)
        .into_iter()
        .filter(|p| has_ext(p, "safetensors") && !referenced.contains(p))
        .collect();
    out.sort();
    out
}

fn list_dir(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    v.sort();
    v
}

fn has_ext(p: &Path, ext: &str) -> bool {
    p.extension().and_then(|e| e.to_str()) == Some(ext)
}

/// What kind of thing a checkpoint path is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    /// One `.safetensors` file.
    File,
    /// An index file and its shards.
    Sharded,
    /// A folder with config.json and weights (diffusers model folder).
    ModelFolder,
    /// A folder with transformer components (diffusers pipeline, Wan 2.2 A14B).
    Pipeline,
    /// A PEFT adapter folder (adapter_config.json + adapter_model.safetensors).
    PeftFolder,
    /// A folder with exactly one weights file and no config.
    Folder,
    /// An Orbax checkpoint (CheckpointManager root, step or item folder).
    Orbax,
    /// A GGUF file (ComfyUI-GGUF), decoded by `quant::base`.
    Gguf,
}

impl SourceKind {
    /// What it is, in words (`inspect`'s text; the JSON has the snake_case name).
    pub fn describe(self) -> &'static str {
        match self {
            SourceKind::File => "safetensors file",
            SourceKind::Sharded => "sharded safetensors (index and shards)",
            SourceKind::ModelFolder => "model folder: config.json and weights",
            SourceKind::Pipeline => "pipeline folder",
            SourceKind::PeftFolder => "PEFT adapter folder",
            SourceKind::Folder => "folder with one weights file",
            SourceKind::Orbax => "Orbax checkpoint",
            SourceKind::Gguf => "GGUF file",
        }
    }
}

/// A small JSON sidecar read along with the weights (config.json, adapter_config.json).
#[derive(Clone, Debug)]
pub struct Sidecar {
    /// File name inside the component folder.
    pub name: String,
    /// Its path.
    pub path: PathBuf,
    /// Raw text.
    pub text: String,
    /// Parsed JSON.
    pub json: serde_json::Value,
}

/// One state dict of a checkpoint with where it sits and how its files were named.
#[derive(Debug)]
pub struct Component {
    /// `""` for a plain model, `transformer` / `transformer_2` in a pipeline.
    pub name: String,
    /// Folder of the component relative to the checkpoint root (empty for the root).
    pub rel_dir: PathBuf,
    /// Stem the weight files share (`diffusion_pytorch_model`, `model`, or a single file's
    /// stem), so outputs can mirror the input's naming.
    pub weights_stem: String,
    /// The tensors.
    pub tensors: TensorSet,
    /// JSON sidecars next to the weights.
    pub sidecars: Vec<Sidecar>,
}

impl Component {
    /// The component's folder under the checkpoint's `root`, spelled as `root` for the root
    /// itself (no trailing separator in messages).
    pub fn dir(&self, root: &Path) -> PathBuf {
        match self.rel_dir.as_os_str().is_empty() {
            true => root.to_path_buf(),
            false => root.join(&self.rel_dir),
        }
    }

    /// A sidecar by file name.
    pub fn sidecar(&self, name: &str) -> Option<&Sidecar> {
        self.sidecars.iter().find(|s| s.name == name)
    }
}

/// A checkpoint or adapter as found on disk.
#[derive(Debug)]
pub struct Checkpoint {
    /// The path the user gave.
    pub path: PathBuf,
    /// What it is.
    pub kind: SourceKind,
    /// Its state dicts (one, or one per pipeline transformer).
    pub components: Vec<Component>,
    /// Other files at the root that travel with a pipeline (model_index.json).
    pub root_files: Vec<Sidecar>,
    /// Things present but neither read nor carried (stray shards, hidden folders), for
    /// reports.
    pub ignored: Vec<PathBuf>,
    /// A pipeline folder's files an output holds unchanged: every component but the
    /// transformers (VAE, text encoders, tokenizers, scheduler, image encoder, ...) and every
    /// file at the root (a model card, `.gitattributes`) but `model_index.json` (a root file
    /// above) and a release's own manifest and signature. Sorted by path; empty for anything
    /// but a pipeline folder.
    pub carried: Vec<CarriedFile>,
    /// For an Orbax input: its step, items and files (the tensors are decoded copies).
    pub orbax: Option<OrbaxInput>,
    /// For a quantized input (`quant::base`): what it was and the files read (the tensors
    /// are decoded copies).
    pub quantized: Option<QuantizedInput>,
}

/// What a quantized input was, for reports and the manifest; filled by `quant::base`, which
/// owns the formats (this layer only carries the words).
#[derive(Clone, Debug)]
pub struct QuantizedInput {
    /// The format's name (`comfyui-scaled-fp8`, `gguf`, ...).
    pub format: String,
    /// One line per fact worth reporting (types per tensor group, markers, flags).
    pub details: Vec<String>,
    /// Tensors decoded to f32.
    pub decoded: usize,
    /// Side tensors (scales, markers) consumed by the decoding and not passed on.
    pub consumed: Vec<String>,
    /// Every file of the input as given, sorted (hashed into the manifest).
    pub files: Vec<PathBuf>,
}

impl Checkpoint {
    /// Opens whatever `path` is, as stored; see the module doc for the recognised shapes.
    /// A quantized file's side tensors and codes come through as they are: a base is opened
    /// with `quant::base::open`, which decodes them or refuses; this is for adapters and for
    /// that decoder.
    pub fn open_stored(path: &Path) -> Result<Checkpoint, ReadError> {
        let meta = std::fs::metadata(path).map_err(|e| ReadError::io(path, e))?;
        if meta.is_dir() {
            return open_dir(path);
        }
        refuse_by_name(path)?;
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.ends_with(INDEX_SUFFIX) {
            let tensors = TensorSet::from_index(path)?;
            let stem = name.trim_end_matches(INDEX_SUFFIX).to_string();
            let dir = path.parent().unwrap_or(Path::new("."));
            let ignored = tensors.ignored_files().to_vec();
            return Ok(Checkpoint {
                path: path.to_path_buf(),
                kind: SourceKind::Sharded,
                components: vec![Component {
                    name: String::new(),
                    rel_dir: PathBuf::new(),
                    weights_stem: stem,
                    tensors,
                    sidecars: read_sidecars(dir)?,
                }],
                root_files: Vec::new(),
                ignored,
                carried: Vec::new(),
                orbax: None,
                quantized: None,
            });
        }
        if !has_ext(path, "safetensors") {
            return Err(ReadError::Unsupported {
                path: path.to_path_buf(),
                reason: "expected a .safetensors file, a *.safetensors.index.json, or a folder"
                    .into(),
            });
        }
        let tensors = TensorSet::from_file(path)?;
        Ok(Checkpoint {
            path: path.to_path_buf(),
            kind: SourceKind::File,
            components: vec![Component {
                name: String::new(),
                rel_dir: PathBuf::new(),
                weights_stem: file_stem(path),
                tensors,
                sidecars: Vec::new(),
            }],
            root_files: Vec::new(),
            ignored: Vec::new(),
            carried: Vec::new(),
            orbax: None,
            quantized: None,
        })
    }

    /// The single component, or an error if this is a multi-transformer pipeline.
    pub fn single(&self) -> Result<&Component, ReadError> {
        match self.components.as_slice() {
            [c] => Ok(c),
            many => Err(ReadError::Unsupported {
                path: self.path.clone(),
                reason: format!(
                    "holds {} transformers ({}); name the one you mean",
                    many.len(),
                    many.iter()
                        .map(|c| c.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }),
        }
    }

    /// A component by name.
    pub fn component(&self, name: &str) -> Option<&Component> {
        self.components.iter().find(|c| c.name == name)
    }

    /// True for a folder of several transformers (a pipeline, an Orbax A14B pair).
    pub fn is_pipeline(&self) -> bool {
        match self.kind {
            SourceKind::Pipeline => true,
            SourceKind::Orbax => self.components.len() > 1,
            _ => false,
        }
    }

    /// Every file this checkpoint reads (weights, indexes, sidecars; for Orbax, every file
    /// of the step or item folder, not the decoded copies), sorted.
    pub fn input_files(&self) -> Vec<PathBuf> {
        if let Some(o) = &self.orbax {
            return o.files.clone();
        }
        if let Some(q) = &self.quantized {
            return q.files.clone();
        }
        let mut v = Vec::new();
        for c in &self.components {
            v.extend(c.tensors.files().iter().map(|f| f.path().to_path_buf()));
            v.extend(c.tensors.index_path().map(Path::to_path_buf));
            v.extend(c.sidecars.iter().map(|s| s.path.clone()));
        }
        v.extend(self.root_files.iter().map(|s| s.path.clone()));
        v.sort();
        v.dedup();
        v
    }
}

fn file_stem(path: &Path) -> String {
    path.file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("model")
        .to_string()
}

fn read_sidecars(dir: &Path) -> Result<Vec<Sidecar>, ReadError> {
    let mut out = Vec::new();
    for name in ["config.json", "adapter_config.json"] {
        let p = dir.join(name);
        if p.is_file() {
            out.push(read_sidecar(&p, name)?);
        }
    }
    Ok(out)
}

fn read_sidecar(p: &Path, name: &str) -> Result<Sidecar, ReadError> {
    let text = std::fs::read_to_string(p).map_err(|e| ReadError::io(p, e))?;
    let json = serde_json::from_str(&text).map_err(|e| ReadError::Unsupported {
        path: p.to_path_buf(),
        reason: format!("not valid JSON: {e}"),
    })?;
    Ok(Sidecar {
        name: name.to_string(),
        path: p.to_path_buf(),
        text,
        json,
    })
}

/// The weights of one folder: an index, or exactly one `.safetensors` file.
fn folder_weights(dir: &Path) -> Result<Option<(TensorSet, String)>, ReadError> {
    let entries = list_dir(dir);
    let indexes: Vec<&PathBuf> = entries
        .iter()
        .filter(|p| p.to_str().is_some_and(|s| s.ends_with(INDEX_SUFFIX)))
        .collect();
    match indexes.as_slice() {
        [one] => {
            let stem = one
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("")
                .trim_end_matches(INDEX_SUFFIX)
                .to_string();
            return Ok(Some((TensorSet::from_index(one)?, stem)));
        }
        [] => {}
        many => {
            return Err(ReadError::Unsupported {
                path: dir.to_path_buf(),
                reason: format!(
                    "has {} shard indexes ({}); point at the one you mean",
                    many.len(),
                    names_of(many)
                ),
            });
        }
    }
    let weights: Vec<&PathBuf> = entries
        .iter()
        .filter(|p| has_ext(p, "safetensors"))
        .collect();
    match weights.as_slice() {
        [one] => Ok(Some((TensorSet::from_file(one)?, file_stem(one)))),
        [] => {
            if let Some(p) = entries.iter().find(|p| refuse_by_name(p).is_err()) {
                refuse_by_name(p)?;
            }
            Ok(None)
        }
        many => Err(ReadError::Unsupported {
            path: dir.to_path_buf(),
            reason: format!(
                "has {} .safetensors files ({}) and no index; point at the one you mean",
                many.len(),
                names_of(many)
            ),
        }),
    }
}

fn names_of(paths: &[&PathBuf]) -> String {
    paths
        .iter()
        .filter_map(|p| p.file_name().and_then(|n| n.to_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn open_dir(dir: &Path) -> Result<Checkpoint, ReadError> {
    if orbax::looks_like_orbax(dir) {
        return open_orbax(dir);
    }
    // A PEFT adapter folder: adapter_config.json + adapter_model.safetensors.
    let peft_cfg = dir.join("adapter_config.json");
    if peft_cfg.is_file() {
        let weights = dir.join("adapter_model.safetensors");
        if !weights.is_file() {
            let legacy = dir.join("adapter_model.bin");
            if legacy.is_file() {
                refuse_by_name(&legacy)?;
            }
            return Err(ReadError::Unsupported {
                path: dir.to_path_buf(),
                reason: "has adapter_config.json but no adapter_model.safetensors".into(),
            });
        }
        let tensors = TensorSet::from_file(&weights)?;
        return Ok(Checkpoint {
            path: dir.to_path_buf(),
            kind: SourceKind::PeftFolder,
            components: vec![Component {
                name: String::new(),
                rel_dir: PathBuf::new(),
                weights_stem: "adapter_model".into(),
                tensors,
                sidecars: read_sidecars(dir)?,
            }],
            root_files: Vec::new(),
            ignored: Vec::new(),
            carried: Vec::new(),
            orbax: None,
            quantized: None,
        });
    }
    if let Some((tensors, stem)) = folder_weights(dir)? {
        let sidecars = read_sidecars(dir)?;
        let kind = match (tensors.index_path().is_some(), sidecars.is_empty()) {
            (_, false) => SourceKind::ModelFolder,
            (true, true) => SourceKind::Sharded,
            (false, true) => SourceKind::Folder,
        };
        let ignored = tensors.ignored_files().to_vec();
        return Ok(Checkpoint {
            path: dir.to_path_buf(),
            kind,
            components: vec![Component {
                name: String::new(),
                rel_dir: PathBuf::new(),
                weights_stem: stem,
                tensors,
                sidecars,
            }],
            root_files: Vec::new(),
            ignored,
            carried: Vec::new(),
            orbax: None,
            quantized: None,
        });
    }
    open_pipeline(dir)
}

fn open_pipeline(dir: &Path) -> Result<Checkpoint, ReadError> {
    let mut components = Vec::new();
    let mut ignored = Vec::new();
    for sub in list_dir(dir).into_iter().filter(|p| p.is_dir()) {
        let name = sub
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("")
            .to_string();
        if !TRANSFORMER_COMPONENTS.contains(&name.as_str()) {
            continue;
        }
        let Some((tensors, stem)) = folder_weights(&sub)? else {
            return Err(ReadError::Unsupported {
                path: sub,
                reason: "pipeline component folder holds no .safetensors weights".into(),
            });
        };
        ignored.extend(tensors.ignored_files().iter().cloned());
        components.push(Component {
            sidecars: read_sidecars(&sub)?,
            name: name.clone(),
            rel_dir: PathBuf::from(&name),
            weights_stem: stem,
            tensors,
        });
    }
    if components.is_empty() {
        return Err(ReadError::Unsupported {
            path: dir.to_path_buf(),
            reason: "no weights found: expected a .safetensors file, a shard index, \
                     adapter_config.json + adapter_model.safetensors, or transformer/ subfolders"
                .into(),
        });
    }
    components.sort_by_key(|c| {
        TRANSFORMER_COMPONENTS
            .iter()
            .position(|n| *n == c.name)
            .unwrap_or(usize::MAX)
    });
    let mut root_files = Vec::new();
    let mi = dir.join("model_index.json");
    if mi.is_file() {
        root_files.push(read_sidecar(&mi, "model_index.json")?);
    }
    let read: Vec<&Path> = components.iter().map(|c| c.rel_dir.as_path()).collect();
    let mut carried = Vec::new();
    carried_files(dir, Path::new(""), &read, &mut carried, &mut ignored)?;
    carried.sort_by(|a, b| a.rel_path.cmp(&b.rel_path));
    Ok(Checkpoint {
        path: dir.to_path_buf(),
        kind: SourceKind::Pipeline,
        components,
        root_files,
        ignored,
        carried,
        orbax: None,
        quantized: None,
    })
}

/// Name of the manifest every release folder carries (written by `release`).
pub const MANIFEST_NAME: &str = "wanbake.manifest.json";

/// The default name of a release's model signature (`signing`): it signs the release and is
/// not one of its outputs, so `verify` does not report it as unlisted.
pub const SIGNATURE_NAME: &str = "model.sig";

/// Files at a pipeline folder's root that an output does not carry: `model_index.json` travels
/// as a root file, and a release's manifest and signature describe that release, not the
/// output made from it.
pub const NOT_CARRIED_AT_ROOT: [&str; 3] = ["model_index.json", MANIFEST_NAME, SIGNATURE_NAME];

/// A file of the input that the output holds unchanged, byte for byte (a pipeline's
/// components other than the transformers wanbake writes). `release::staging`
/// hard-links it into the output where the file system allows, and copies it otherwise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CarriedFile {
    /// Path relative to the output root (the same as relative to the input root).
    pub rel_path: PathBuf,
    /// The file read: the input's path with every symlink resolved (a Hugging Face cache
    /// snapshot's links lead to its blobs).
    pub source: PathBuf,
    /// Its size when the input was opened.
    pub bytes: u64,
}

/// How deep a pipeline folder's components may nest (a symlink loop ends here).
const MAX_CARRIED_DEPTH: usize = 16;

/// Collects the files under `root/rel` an output carries (`Checkpoint::carried`), following
/// symlinks: every file but those of the folders in `read` (the transformers, rewritten) and
/// [`NOT_CARRIED_AT_ROOT`]. A hidden folder (`.cache/` of a Hugging Face download, `.git/`)
/// is a tool's state, not part of the model: skipped and reported in `ignored`. An entry that
/// cannot be read (a dangling link: a cache snapshot whose blob is missing) is an error, not
/// a component quietly left out.
fn carried_files(
    root: &Path,
    rel: &Path,
    read: &[&Path],
    out: &mut Vec<CarriedFile>,
    ignored: &mut Vec<PathBuf>,
) -> Result<(), ReadError> {
    let dir = root.join(rel);
    if rel.components().count() > MAX_CARRIED_DEPTH {
        return Err(ReadError::Unsupported {
            path: dir,
            reason: format!("nested more than {MAX_CARRIED_DEPTH} folders deep (a symlink loop?)"),
        });
    }
    for path in list_dir(&dir) {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let rel_path = rel.join(name);
        if read.contains(&rel_path.as_path())
            || (rel.as_os_str().is_empty() && NOT_CARRIED_AT_ROOT.contains(&name))
        {
            continue;
        }
        let meta = std::fs::metadata(&path).map_err(|e| ReadError::io(&path, e))?;
        if meta.is_dir() {
            match name.starts_with('.') {
                true => ignored.push(path),
                false => carried_files(root, &rel_path, read, out, ignored)?,
            }
            continue;
        }
        if !meta.is_file() {
            return Err(ReadError::Unsupported {
                path,
                reason: "is neither a file nor a folder; a pipeline folder's components hold files"
                    .into(),
            });
        }
        let source = std::fs::canonicalize(&path).map_err(|e| ReadError::io(&path, e))?;
        out.push(CarriedFile {
            rel_path,
            source,
            bytes: meta.len(),
        });
    }
    Ok(())
}

/// An Orbax checkpoint: each chosen item decoded once (`io::orbax`); a Wan 2.2 A14B pair
/// becomes `transformer/` and `transformer_2/`, named like a diffusers pipeline's.
fn open_orbax(dir: &Path) -> Result<Checkpoint, ReadError> {
    let (input, decoded) = orbax::open(dir)?;
    let components = decoded
        .into_iter()
        .map(|d| Component {
            rel_dir: PathBuf::from(&d.component),
            name: d.component,
            weights_stem: "diffusion_pytorch_model".into(),
            tensors: TensorSet::from_opened(d.file),
            sidecars: Vec::new(),
        })
        .collect();
    Ok(Checkpoint {
        path: dir.to_path_buf(),
        kind: SourceKind::Orbax,
        components,
        root_files: Vec::new(),
        ignored: Vec::new(),
        carried: Vec::new(),
        orbax: Some(input),
        quantized: None,
    })
}
