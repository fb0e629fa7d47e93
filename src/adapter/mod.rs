//! LoRA-family adapters in every convention people ship, read into one canonical form.
//!
//! Owns: `AdapterSet` (the files of one adapter, its convention, and its canonical entries),
//! `AdapterOptions`, opening an adapter from any path (`open`: detect the convention, run
//! its parser, account for every key), and the lazy loading of entry tensors as f32 in
//! PyTorch layout (`load`) or as raw bytes in their stored dtype (`load_raw`, for lossless
//! translation). The canonical types are in `kinds`; one module per convention parses into
//! them and renders from them (`peft`, `diffusers`, `comfy`, `kohya`, `sa3`, `nnx`, with
//! the shared suffix grammar in `grammar` and PEFT config semantics in `peft_config`);
//! `names` and `bind` resolve module names against a base; `variant` says which base an
//! adapter was made for; `translate` writes another convention; `report` describes an
//! adapter for `inspect`. Does not own: the merge math (`merge`).

pub mod bind;
pub mod bound;
pub mod comfy;
pub mod detect;
pub mod diffusers;
pub mod error;
pub mod grammar;
pub mod kinds;
pub mod kohya;
pub mod lycoris;
pub mod names;
pub mod nnx;
pub mod peft;
pub mod peft_config;
pub mod peft_lycoris;
pub mod report;
pub mod sa3;
pub mod spec;
pub mod translate;
pub mod variant;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::io::{Checkpoint, DType, ReadError, SafetensorsFile, dtype};
pub use bind::{BaseIndex, BindReport};
pub use bound::{BoundAdapter, BoundSet, bind_adapter, bind_specs, components_of};
pub use error::{AdapterError, EntryProblem, KeyProblem};
pub use kinds::{Binding, Entry, Kind, ParamRole, ScaleSource, TensorSource, view_2d};
pub use spec::{AdapterSpec, ComponentChoice};

/// The naming/packaging convention an adapter file follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Convention {
    /// HF PEFT: `base_model.model.…lora_A.weight` + adapter_config.json.
    Peft,
    /// diffusers: `transformer.…lora_A.weight`, optional `lora_adapter_metadata`.
    Diffusers,
    /// ComfyUI / original Wan: `diffusion_model.…lora_down.weight`, `.alpha`, `.diff`.
    Comfy,
    /// kohya / musubi: `lora_unet_…` (original-Wan module names).
    Kohya,
    /// LyCORIS's own naming: `lycoris_…` (the trainer's module names, diffusers on WAN).
    Lycoris,
    /// Stable Audio 3 native parametrizations.
    Sa3,
    /// Flax NNX / Qwix `…kernel_lora_a`.
    Nnx,
}

impl Convention {
    /// Every convention.
    pub const ALL: [Convention; 7] = [
        Convention::Peft,
        Convention::Diffusers,
        Convention::Comfy,
        Convention::Kohya,
        Convention::Lycoris,
        Convention::Sa3,
        Convention::Nnx,
    ];

    /// Command-line spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Convention::Peft => "peft",
            Convention::Diffusers => "diffusers",
            Convention::Comfy => "comfy",
            Convention::Kohya => "kohya",
            Convention::Lycoris => "lycoris",
            Convention::Sa3 => "sa3",
            Convention::Nnx => "nnx",
        }
    }
}

impl std::fmt::Display for Convention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A convention name that is not one of the seven.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown adapter convention `{0}` (expected {expected})",
    expected = crate::names::either(Convention::ALL.map(Convention::as_str))
)]
pub struct UnknownConvention(pub String);

impl FromStr for Convention {
    type Err = UnknownConvention;

    fn from_str(s: &str) -> Result<Convention, UnknownConvention> {
        crate::names::find(&Convention::ALL, Convention::as_str, s)
            .ok_or_else(|| UnknownConvention(s.to_string()))
    }
}

crate::names::value_enum!(Convention);

/// How to read an adapter.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AdapterOptions {
    /// Read it as this convention instead of detecting one.
    pub from: Option<Convention>,
    /// σ for every low-rank entry, replacing what the file implies (`ScaleSource::User`).
    /// Required for files that carry no scale at all (Qwix without metadata).
    pub scale: Option<f64>,
    /// Keep going when keys are not consumed (they are reported, never applied). Off by
    /// default: such keys are errors. Entries that bind to nothing are the binding's
    /// question (`AdapterSet::bind`), asked with the same user choice.
    pub allow_unmatched: bool,
}

/// One adapter: its files, convention, and canonical entries.
#[derive(Debug)]
pub struct AdapterSet {
    /// The path the user gave.
    pub path: PathBuf,
    /// Its convention.
    pub convention: Convention,
    /// Its weight files (one, except for sharded adapters).
    pub files: Vec<SafetensorsFile>,
    /// Canonical entries (targets filled in once bound to a base).
    pub entries: Vec<Entry>,
    /// Keys no entry consumed (empty unless `allow_unmatched`; otherwise opening fails).
    pub unparsed: Vec<KeyProblem>,
    /// `__metadata__` of the first file.
    pub metadata: BTreeMap<String, String>,
    /// Sidecar files read with the weights (adapter_config.json).
    pub sidecars: Vec<PathBuf>,
    /// What the parser decided that a reader should know (legacy type names resolved, ...).
    pub notes: Vec<String>,
    /// For an Orbax adapter, the checkpoint's files (`files` are then decoded copies).
    pub decoded_from: Option<Vec<PathBuf>>,
}

/// One tensor of an adapter file as its header describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRef {
    /// Index of the file in the set.
    pub file: usize,
    /// Tensor name.
    pub name: String,
    /// Stored dtype.
    pub dtype: DType,
    /// Stored shape.
    pub shape: Vec<usize>,
}

impl KeyRef {
    /// A source for this whole tensor, seen with `shape` (same element count, PyTorch
    /// layout).
    pub fn source(&self, shape: Vec<usize>) -> TensorSource {
        TensorSource {
            file: self.file,
            key: self.name.clone(),
            layer: None,
            transpose: false,
            shape,
        }
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// What a parser reads: the files, their keys, metadata and config sidecar.
pub struct ParseInput<'a> {
    /// The adapter path (for messages).
    pub path: &'a Path,
    /// Its files.
    pub files: &'a [SafetensorsFile],
    /// Every key of every file, sorted by name.
    pub keys: Vec<KeyRef>,
    /// `__metadata__` of the first file.
    pub metadata: &'a BTreeMap<String, String>,
    /// adapter_config.json (path, text), when the folder has one.
    pub config: Option<(PathBuf, String)>,
    /// The options.
    pub opts: &'a AdapterOptions,
    /// Whether the adapter is an Orbax checkpoint (its file is a decoded copy whose
    /// metadata came from `_CHECKPOINT_METADATA`, `io::orbax`).
    pub orbax: bool,
}

impl ParseInput<'_> {
    /// The value of a one-element tensor (an `.alpha`), widened to f64 exactly.
    pub fn scalar(&self, k: &KeyRef) -> Result<f64, AdapterError> {
        let bad = |reason: String| AdapterError::Refused {
            path: self.path.to_path_buf(),
            reason: format!("tensor `{}`: {reason}", k.name),
        };
        if k.numel() != 1 {
            return Err(bad(format!(
                "expected a single value, found shape {:?}",
                k.shape
            )));
        }
        let file = &self.files[k.file];
        let view = file
            .view(&k.name)
            .ok_or_else(|| bad("no such tensor".into()))?;
        let v = match view.dtype {
            DType::F64 => {
                let b: [u8; 8] = view
                    .bytes
                    .try_into()
                    .map_err(|_| bad("F64 scalar is not 8 bytes".into()))?;
                f64::from_le_bytes(b)
            }
            _ => {
                let vals = view.to_f32().map_err(|e| bad(e.to_string()))?;
                vals.first().copied().map(f64::from).unwrap_or(f64::NAN)
            }
        };
        if !v.is_finite() {
            return Err(bad(format!("value {v} is not finite")));
        }
        Ok(v)
    }
}

/// What a parser produced.
#[derive(Debug, Default)]
pub struct Parsed {
    /// Canonical entries.
    pub entries: Vec<Entry>,
    /// Keys no entry consumed.
    pub unparsed: Vec<KeyProblem>,
    /// Notes for reports.
    pub notes: Vec<String>,
}

impl AdapterSet {
    /// Opens an adapter of any convention (detected from its keys and sidecars, or
    /// `opts.from`): a `.safetensors` file, a PEFT folder, or a folder holding one weights
    /// file. Pickle formats are refused. Every key must be consumed by an entry unless
    /// `opts.allow_unmatched`.
    pub fn open(path: &Path, opts: &AdapterOptions) -> Result<AdapterSet, AdapterError> {
        let mut ckpt = Checkpoint::open_stored(path)?;
        ckpt.single()?;
        let decoded_from = ckpt.orbax.as_ref().map(|o| o.files.clone());
        let comp = ckpt.components.remove(0);
        let config = comp
            .sidecar("adapter_config.json")
            .map(|s| (s.path.clone(), s.text.clone()));
        let files = comp.tensors.into_files();
        let metadata = files
            .first()
            .map(|f| f.metadata().clone())
            .unwrap_or_default();
        let mut keys: Vec<KeyRef> = files
            .iter()
            .enumerate()
            .flat_map(|(fi, f)| {
                f.infos().iter().map(move |t| KeyRef {
                    file: fi,
                    name: t.name.clone(),
                    dtype: t.dtype,
                    shape: t.shape.clone(),
                })
            })
            .collect();
        keys.sort_by(|a, b| a.name.cmp(&b.name));
        let convention = match opts.from {
            Some(c) => c,
            None => detect::detect(path, &keys, config.is_some())?,
        };
        let input = ParseInput {
            path,
            files: &files,
            keys,
            metadata: &metadata,
            config: config.clone(),
            opts,
            orbax: decoded_from.is_some(),
        };
        let mut parsed = match convention {
            Convention::Peft => peft::parse(&input)?,
            Convention::Diffusers => diffusers::parse(&input)?,
            Convention::Comfy => comfy::parse(&input)?,
            Convention::Kohya | Convention::Lycoris => kohya::parse(&input)?,
            Convention::Sa3 => sa3::parse(&input)?,
            Convention::Nnx => nnx::parse(&input)?,
        };
        apply_user_scale(&mut parsed, opts.scale, path)?;
        parsed.unparsed.sort();
        if !parsed.unparsed.is_empty() && !opts.allow_unmatched {
            return Err(AdapterError::Keys {
                path: path.to_path_buf(),
                problems: parsed.unparsed,
            });
        }
        if parsed.entries.is_empty() {
            return Err(AdapterError::Refused {
                path: path.to_path_buf(),
                reason: format!(
                    "no adapter entries found when read as {convention} ({} not consumed)",
                    crate::human::plural(parsed.unparsed.len(), "key", "keys")
                ),
            });
        }
        parsed
            .entries
            .sort_by(|a, b| (a.module.as_str(), a.kind).cmp(&(b.module.as_str(), b.kind)));
        Ok(AdapterSet {
            path: path.to_path_buf(),
            convention,
            files,
            entries: parsed.entries,
            unparsed: parsed.unparsed,
            metadata,
            sidecars: config.map(|(p, _)| vec![p]).unwrap_or_default(),
            notes: parsed.notes,
            decoded_from,
        })
    }

    /// Every file this adapter read (weights and sidecars), sorted.
    pub fn input_files(&self) -> Vec<PathBuf> {
        let weights: Vec<PathBuf> = match &self.decoded_from {
            Some(orbax) => orbax.clone(),
            None => self.files.iter().map(|f| f.path().to_path_buf()).collect(),
        };
        let mut v: Vec<PathBuf> = weights
            .into_iter()
            .chain(self.sidecars.iter().cloned())
            .collect();
        v.sort();
        v
    }

    /// Produces one entry parameter in its stored dtype, as raw little-endian bytes in
    /// PyTorch layout (sliced and transposed like `load`, but never converted), for
    /// lossless translation.
    pub fn load_raw(&self, src: &TensorSource) -> Result<(DType, Vec<u8>), ReadError> {
        let (file, view) = self.view_of(src)?;
        let err = |reason: String| ReadError::Tensor {
            path: file.path().to_path_buf(),
            tensor: src.key.clone(),
            reason,
        };
        let size = view
            .dtype
            .size()
            .ok_or_else(|| err(format!("dtype {} has no byte size", view.dtype)))?;
        let (bytes, shape) = slice_layer(view.bytes, view.shape, src.layer, size).map_err(err)?;
        let out = if src.transpose {
            let [.., rows, cols] = shape else {
                return Err(err(format!("cannot transpose a tensor of shape {shape:?}")));
            };
            transpose_bytes(bytes, *rows, *cols, size)
        } else {
            bytes.to_vec()
        };
        let expected: usize = src.shape.iter().product::<usize>() * size;
        if out.len() != expected {
            return Err(err(format!(
                "holds {} bytes, the entry expects shape {:?}",
                out.len(),
                src.shape
            )));
        }
        Ok((view.dtype, out))
    }

    fn view_of(
        &self,
        src: &TensorSource,
    ) -> Result<(&SafetensorsFile, crate::io::TensorView<'_>), ReadError> {
        let file = self.files.get(src.file).ok_or_else(|| ReadError::Tensor {
            path: self.path.clone(),
            tensor: src.key.clone(),
            reason: format!("internal: file index {} out of range", src.file),
        })?;
        let view = file.view(&src.key).ok_or_else(|| ReadError::Tensor {
            path: file.path().to_path_buf(),
            tensor: src.key.clone(),
            reason: "no such tensor".into(),
        })?;
        Ok((file, view))
    }

    /// [`AdapterSet::load`], then drops the tensor's mapped pages: what a merge does with
    /// every adapter tensor, so the resident set does not grow with the adapters.
    pub fn load_released(&self, src: &TensorSource) -> Result<Vec<f32>, ReadError> {
        let v = self.load(src)?;
        if let Some((f, i)) = self
            .files
            .get(src.file)
            .and_then(|f| f.position(&src.key).map(|i| (f, i)))
        {
            f.release(i);
        }
        Ok(v)
    }

    /// Produces one entry parameter as f32 in PyTorch layout: widened from the stored dtype,
    /// sliced out of a stacked tensor if needed, transposed if needed.
    pub fn load(&self, src: &TensorSource) -> Result<Vec<f32>, ReadError> {
        let file = self.files.get(src.file).ok_or_else(|| ReadError::Tensor {
            path: self.path.clone(),
            tensor: src.key.clone(),
            reason: format!("internal: file index {} out of range", src.file),
        })?;
        let err = |reason: String| ReadError::Tensor {
            path: file.path().to_path_buf(),
            tensor: src.key.clone(),
            reason,
        };
        let view = file
            .view(&src.key)
            .ok_or_else(|| err("no such tensor".into()))?;
        let size = view
            .dtype
            .size()
            .filter(|_| view.dtype.is_float())
            .ok_or_else(|| {
                err(format!(
                    "dtype {} is not a float type an adapter can use",
                    view.dtype
                ))
            })?;
        let (bytes, shape): (&[u8], &[usize]) = match src.layer {
            None => (view.bytes, view.shape),
            Some(l) => {
                let (&layers, rest) = view.shape.split_first().ok_or_else(|| {
                    err("expected a stacked (L, …) tensor, found a scalar".into())
                })?;
                if l >= layers {
                    return Err(err(format!("layer {l} requested from a stack of {layers}")));
                }
                let per: usize = rest.iter().product::<usize>() * size;
                (&view.bytes[l * per..(l + 1) * per], rest)
            }
        };
        let mut vals = dtype::to_f32_vec(view.dtype, bytes).map_err(|e| err(e.to_string()))?;
        if src.transpose {
            let [.., rows, cols] = shape else {
                return Err(err(format!("cannot transpose a tensor of shape {shape:?}")));
            };
            vals = transpose(&vals, *rows, *cols);
        }
        let expected: usize = src.shape.iter().product();
        if vals.len() != expected {
            return Err(err(format!(
                "holds {} values, the entry expects shape {:?} ({expected})",
                vals.len(),
                src.shape
            )));
        }
        Ok(vals)
    }
}

/// Replaces σ of every low-rank entry by the user's value.
fn apply_user_scale(
    parsed: &mut Parsed,
    scale: Option<f64>,
    path: &Path,
) -> Result<(), AdapterError> {
    let Some(s) = scale else { return Ok(()) };
    if !s.is_finite() {
        return Err(AdapterError::Refused {
            path: path.to_path_buf(),
            reason: format!("--scale {s} is not a finite number"),
        });
    }
    // A LyCORIS module's σ comes from its own alpha and dimension by its algorithm's rule
    // (`lycoris`); overriding it for the LoRA modules only would merge the rest at another
    // scale than the user asked, silently.
    if let Some(e) = parsed.entries.iter().find(|e| e.kind.is_lycoris()) {
        return Err(AdapterError::Refused {
            path: path.to_path_buf(),
            reason: format!(
                "`scale` sets σ for LoRA-family entries; `{}` is a LyCORIS {} module, whose σ \
                 comes from its own alpha (remove `scale`, or use `strength` for the whole \
                 adapter)",
                e.module,
                e.kind.as_str()
            ),
        });
    }
    for e in &mut parsed.entries {
        if !matches!(e.kind, Kind::Diff | Kind::DiffBias) {
            e.scale = s;
            e.alpha = None;
            e.scale_source = ScaleSource::User;
        }
    }
    Ok(())
}

/// The bytes and shape of one layer of a stacked tensor (or the whole tensor).
fn slice_layer<'a>(
    bytes: &'a [u8],
    shape: &'a [usize],
    layer: Option<usize>,
    size: usize,
) -> Result<(&'a [u8], &'a [usize]), String> {
    let Some(l) = layer else {
        return Ok((bytes, shape));
    };
    let (&layers, rest) = shape
        .split_first()
        .ok_or_else(|| "expected a stacked (L, …) tensor, found a scalar".to_string())?;
    if l >= layers {
        return Err(format!("layer {l} requested from a stack of {layers}"));
    }
    let per: usize = rest.iter().product::<usize>() * size;
    Ok((&bytes[l * per..(l + 1) * per], rest))
}

/// Row-major (rows, cols) → (cols, rows) on elements of `size` bytes.
pub(crate) fn transpose_bytes(v: &[u8], rows: usize, cols: usize, size: usize) -> Vec<u8> {
    let mut out = vec![0u8; v.len()];
    for r in 0..rows {
        for c in 0..cols {
            let src = (r * cols + c) * size;
            let dst = (c * rows + r) * size;
            out[dst..dst + size].copy_from_slice(&v[src..src + size]);
        }
    }
    out
}

/// Row-major (rows, cols) → (cols, rows). Batched leading axes are not expected here.
fn transpose(v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; v.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = v[r * cols + c];
        }
    }
    out
}
