//! Where the runner's weights come from.
//!
//! Owns: the `WeightSource` trait (a config plus f32 tensors in diffusers naming and
//! PyTorch layout, fetched one at a time when a layer runs), `CheckpointWeights` (a
//! checkpoint in any layout and float dtype, planned and validated at open time by
//! `model::read_plan::ReadPlan`, read from the memory map one tensor at a time when asked:
//! copied or widened to f32, transposed back to PyTorch layout, and its mapped pages dropped
//! again, so a run's resident set is the tensors in use, not the model) and
//! `MemoryWeights`. Does not own: finding files and folders (`io::checkpoint`), the name
//! tables and transforms (`model`), or which transformer is which (`runner::model_dir`).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use super::error::RunError;
use crate::io::DType;
use crate::io::checkpoint::{Component, TensorSet};
use crate::model::plan_error::PlanError;
use crate::model::read_plan::{CanonicalSource, ReadPlan, StoredTensor};
use crate::model::transform::{SrcTensor, Transform, convert};
use crate::model::wan::{WanConfig, WanVariant};
use crate::model::wan_layout::{Layout, resolve_layout};
use crate::model::wan_names::SKIPPED_MARKER;

/// A WAN transformer's weights in diffusers naming and PyTorch layout, as f32.
///
/// Every layout of one model (diffusers, original Wan, NNX, scanned stacks, any float
/// dtype) gives the same f32 values here, so the runner's output does not depend on the
/// layout the checkpoint was stored in.
pub trait WeightSource: Sync {
    /// The model config.
    fn config(&self) -> &WanConfig;
    /// A name for messages (usually the path).
    fn name(&self) -> &str;
    /// The parameter `name` of the diffusers table (spec wan.md §1.2), flattened, with the
    /// PyTorch-layout shape the config implies.
    fn tensor(&self, name: &str) -> Result<Cow<'_, [f32]>, RunError>;
}

/// Parameters a diffusers checkpoint may carry that diffusers ignores on load
/// (`_keys_to_ignore_on_load_unexpected = ["norm_added_q"]`).
pub fn is_ignored_on_load(name: &str) -> bool {
    name.split('.').any(|t| t == SKIPPED_MARKER)
}

/// A WAN transformer checkpoint in any layout (`model::wan_layout::Layout`: diffusers,
/// original Wan / ComfyUI, NNX, NNX-scanned), one file or the shards of an index, read through a
/// `model::read_plan::ReadPlan`: every stored key is accounted for, every shape checked against the
/// config, and each canonical parameter is widened to f32 and transformed back to the
/// PyTorch layout (a layer sliced out of a stacked tensor) when a layer asks for it.
pub struct CheckpointWeights {
    name: String,
    plan: ReadPlan,
    config_source: ConfigSource,
    tensors: TensorSet,
}

impl std::fmt::Debug for CheckpointWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckpointWeights")
            .field("name", &self.name)
            .field("layout", &self.plan.layout)
            .finish()
    }
}

/// Where a checkpoint's config came from.
#[derive(Clone, Debug, PartialEq)]
pub enum ConfigSource {
    /// A diffusers `WanTransformer3DModel` config.json at this path.
    Diffusers(PathBuf),
    /// Inferred from the shapes, with the head count of an original `WanModel` config.json.
    Original(PathBuf),
    /// Inferred from the shapes and equal to this released model's config.
    Released(WanVariant),
}

impl std::fmt::Display for ConfigSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigSource::Diffusers(p) => write!(f, "{}", p.display()),
            ConfigSource::Original(p) => {
                write!(
                    f,
                    "tensor shapes, heads from the WanModel config {}",
                    p.display()
                )
            }
            ConfigSource::Released(v) => write!(f, "tensor shapes (the {} config)", v.name()),
        }
    }
}

/// Reads and parses a diffusers `config.json`.
pub fn read_config(path: &Path) -> Result<WanConfig, RunError> {
    let text = fs_err::read_to_string(path).map_err(|e| RunError::Config {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    parse_config(&text, path)
}

/// Parses the text of a diffusers `config.json` read from `path`.
pub fn parse_config(text: &str, path: &Path) -> Result<WanConfig, RunError> {
    WanConfig::from_json(text).map_err(|e| RunError::Config {
        path: path.to_path_buf(),
        reason: format!("not a WanTransformer3DModel config: {e}"),
    })
}

/// A parsed config.json: a diffusers config, or the head count of an original one.
enum ConfigFile {
    Diffusers(Box<WanConfig>),
    Original(Option<usize>),
}

fn classify_config(path: &Path, text: &str) -> Result<ConfigFile, RunError> {
    let bad = |reason: String| RunError::Config {
        path: path.to_path_buf(),
        reason,
    };
    let json: serde_json::Value =
        serde_json::from_str(text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    // SkyReels-V2's causal block attention (diffusion forcing with blocks of frames) is not
    // implemented; 1 (every released config) is plain attention.
    if let Some(n) = json
        .get("num_frame_per_block")
        .and_then(serde_json::Value::as_u64)
        && n > 1
    {
        return Err(bad(format!(
            "num_frame_per_block = {n}: the runner has no causal block attention (only 1)"
        )));
    }
    match json.get("_class_name").and_then(serde_json::Value::as_str) {
        class if WanConfig::is_class(class) => {
            parse_config(text, path).map(|c| ConfigFile::Diffusers(Box::new(c)))
        }
        Some("WanModel") => Ok(ConfigFile::Original(
            json.get("num_heads")
                .and_then(serde_json::Value::as_u64)
                .map(|n| n as usize),
        )),
        other => Err(bad(format!(
            "describes a `{}`, not a WAN transformer ({} or WanModel)",
            other.unwrap_or_default(),
            WanConfig::CLASS_NAMES.join(", ")
        ))),
    }
}

impl CheckpointWeights {
    /// Plans reading `tensors` (named `name` in messages). `config` is the config.json to
    /// use (path and text), if any; `layout` forces the layout, else config.json's
    /// `_wanbake_layout` or the keys decide. Without a diffusers config.json the config is
    /// inferred from the shapes and accepted only when the head count is known: from an
    /// original `WanModel` config.json, or because the shapes are a released model's.
    pub fn new(
        name: String,
        tensors: TensorSet,
        config: Option<(&Path, &str)>,
        layout: Option<Layout>,
    ) -> Result<CheckpointWeights, RunError> {
        let plan_error = |source: PlanError| RunError::Plan {
            source_name: name.clone(),
            source,
        };
        let stored: Vec<StoredTensor> = tensors
            .tensors()
            .map(|t| StoredTensor::from(&t.view))
            .collect();
        let names: Vec<&str> = stored.iter().map(|t| t.name.as_str()).collect();
        let (file, json) = match config {
            Some((path, text)) => {
                let json: Option<serde_json::Value> = serde_json::from_str(text).ok();
                (Some((path, classify_config(path, text)?)), json)
            }
            None => (None, None),
        };
        let layout = resolve_layout(layout, json.as_ref(), &names).map_err(plan_error)?;
        let given = match &file {
            Some((_, ConfigFile::Diffusers(c))) => Some(c.as_ref()),
            _ => None,
        };
        let mut plan = ReadPlan::new(layout, &stored, given).map_err(plan_error)?;
        let config_source = match file {
            Some((path, ConfigFile::Diffusers(_))) => ConfigSource::Diffusers(path.to_path_buf()),
            Some((path, ConfigFile::Original(heads))) => {
                let d = plan.config.inner_dim();
                match heads.filter(|&h| h > 0 && d % h == 0) {
                    Some(h) => {
                        plan.config.num_attention_heads = h;
                        plan.config.attention_head_dim = d / h;
                        ConfigSource::Original(path.to_path_buf())
                    }
                    None => {
                        return Err(RunError::Config {
                            path: path.to_path_buf(),
                            reason: format!(
                                "WanModel config without a num_heads that divides dim {d}"
                            ),
                        });
                    }
                }
            }
            None => match WanVariant::ALL.iter().find(|v| v.config() == plan.config) {
                Some(v) => ConfigSource::Released(*v),
                None => {
                    return Err(RunError::UnknownConfig {
                        path: PathBuf::from(&name),
                        quantized: false,
                    });
                }
            },
        };
        Ok(CheckpointWeights {
            name,
            plan,
            config_source,
            tensors,
        })
    }

    /// Opens a transformer checkpoint (model folder, file or shard index); see
    /// [`CheckpointWeights::from_component`].
    pub fn open_path(path: &Path, config: Option<&Path>) -> Result<CheckpointWeights, RunError> {
        let mut ckpt = crate::quant::base::open_checkpoint(path)?;
        if ckpt.components.len() != 1 {
            return Err(RunError::ModelLayout {
                path: path.to_path_buf(),
                reason: format!(
                    "holds {} transformers; open it with ModelSet::open",
                    ckpt.components.len()
                ),
            });
        }
        let component = ckpt.components.remove(0);
        Self::from_component(path, component, config)
    }

    /// Wraps one component of an opened checkpoint at `path`. Its config is `config` when
    /// given, else its config.json sidecar, else (a bare file) a config.json beside the
    /// file, else inferred (see [`CheckpointWeights::new`]).
    pub fn from_component(
        path: &Path,
        component: Component,
        config: Option<&Path>,
    ) -> Result<CheckpointWeights, RunError> {
        let folder = component.dir(path);
        let name = folder.display().to_string();
        let read = |p: &Path| {
            fs_err::read_to_string(p).map_err(|e| RunError::Config {
                path: p.to_path_buf(),
                reason: e.to_string(),
            })
        };
        let found: Option<(PathBuf, String)> = match (config, component.sidecar("config.json")) {
            (Some(p), _) => Some((p.to_path_buf(), read(p)?)),
            (None, Some(s)) => Some((s.path.clone(), s.text.clone())),
            (None, None) => {
                let beside = match path.parent() {
                    Some(dir) if !path.is_dir() && !dir.as_os_str().is_empty() => {
                        dir.join("config.json")
                    }
                    _ if !path.is_dir() => PathBuf::from("config.json"),
                    _ => folder.join("config.json"),
                };
                if beside.is_file() {
                    Some((beside.clone(), read(&beside)?))
                } else {
                    None
                }
            }
        };
        CheckpointWeights::new(
            name,
            component.tensors,
            found.as_ref().map(|(p, t)| (p.as_path(), t.as_str())),
            None,
        )
    }

    /// The layout the weights are stored in.
    pub fn layout(&self) -> Layout {
        self.plan.layout
    }

    /// Where the config came from.
    pub fn config_source(&self) -> &ConfigSource {
        &self.config_source
    }

    /// Where the canonical parameter `name` is stored (tensor, layer, dtype, transform).
    pub fn source(&self, name: &str) -> Result<&CanonicalSource, RunError> {
        self.plan
            .get(name)
            .ok_or_else(|| self.weight_error(name, "not a parameter of this model"))
    }

    /// The f32 values, in PyTorch layout, of the parameter `src` from its stored bytes
    /// (`dtype`: the dtype of `bytes`, its stored one or F32 for values computed in the
    /// stored layout): widened, and transformed when the layout is not PyTorch's.
    pub fn canonical(
        &self,
        src: &CanonicalSource,
        dtype: DType,
        bytes: &[u8],
    ) -> Result<Vec<f32>, RunError> {
        if src.to_canonical == Transform::Identity {
            return widen(dtype, bytes)
                .map(Cow::into_owned)
                .map_err(|r| self.weight_error(&src.stored, r));
        }
        let numel: usize = src.shape.iter().product();
        let mut out = vec![0f32; numel];
        let source = SrcTensor {
            dtype,
            shape: &src.stored_shape,
            bytes,
        };
        convert(
            src.to_canonical,
            source,
            DType::F32,
            bytemuck::cast_slice_mut(&mut out),
        )
        .map_err(|e| self.weight_error(&src.stored, e.to_string()))?;
        Ok(out)
    }

    fn weight_error(&self, tensor: &str, reason: impl Into<String>) -> RunError {
        RunError::Weight {
            source_name: self.name.clone(),
            tensor: tensor.to_string(),
            reason: reason.into(),
        }
    }
}

/// The dtypes the runner widens to f32.
pub fn check_float(dtype: DType) -> Result<(), String> {
    match dtype {
        DType::F64 | DType::F32 | DType::F16 | DType::BF16 | DType::F8_E4M3 | DType::F8_E5M2 => {
            Ok(())
        }
        other => Err(format!(
            "dtype {other} is not a float type the runner reads (F64, F32, F16, BF16, F8_E4M3, F8_E5M2)"
        )),
    }
}

/// Elements widened per parallel task.
const WIDEN_CHUNK: usize = 1 << 16;

/// The f32 values of a tensor's raw bytes: borrowed when they already are aligned f32,
/// else widened in parallel (elementwise, so the result does not depend on threads).
pub fn widen(dtype: DType, bytes: &[u8]) -> Result<Cow<'_, [f32]>, String> {
    check_float(dtype)?;
    if dtype == DType::F32
        && let Ok(s) = bytemuck::try_cast_slice::<u8, f32>(bytes)
    {
        return Ok(Cow::Borrowed(s));
    }
    let size = dtype
        .size()
        .ok_or_else(|| format!("dtype {dtype} has no element size"))?;
    let numel = bytes.len() / size;
    let mut out = vec![0f32; numel];
    out.par_chunks_mut(WIDEN_CHUNK)
        .zip(bytes.par_chunks(WIDEN_CHUNK * size))
        .try_for_each(|(dst, src)| crate::codec::dtype::widen_to_f32(dtype, src, dst))
        .map_err(|e| e.to_string())?;
    Ok(Cow::Owned(out))
}

impl WeightSource for CheckpointWeights {
    fn config(&self) -> &WanConfig {
        &self.plan.config
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn tensor(&self, name: &str) -> Result<Cow<'_, [f32]>, RunError> {
        let src = self.source(name)?;
        let found = self
            .tensors
            .get(&src.stored)
            .ok_or_else(|| self.weight_error(&src.stored, "missing from the checkpoint"))?;
        let view = found.view;
        let bytes = match src.layer {
            None => view.bytes,
            Some(l) => {
                let per = view.bytes.len() / view.shape.first().copied().unwrap_or(1).max(1);
                view.bytes.get(l * per..(l + 1) * per).ok_or_else(|| {
                    self.weight_error(&src.stored, format!("layer {l} is out of range"))
                })?
            }
        };
        let values = self.canonical(src, src.dtype, bytes);
        // The values are a copy now: drop the mapped pages they were read from, so a run
        // holds the weights of the layer it is in, not every page of the model it has read.
        let start = bytes.as_ptr() as usize - found.file.bytes().as_ptr() as usize;
        found.file.release_bytes(start, start + bytes.len());
        values.map(Cow::Owned)
    }
}

/// Weights held in memory (diffusers names, PyTorch layout, f32): for callers that compute
/// weights themselves (a merge checked before it is written) and for tests.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryWeights {
    name: String,
    config: WanConfig,
    tensors: BTreeMap<String, Vec<f32>>,
}

impl MemoryWeights {
    /// Checks that `tensors` are exactly the parameters of `config` (names and element
    /// counts; `norm_added_q` entries are ignored, as diffusers ignores them).
    pub fn new(
        name: impl Into<String>,
        config: WanConfig,
        tensors: BTreeMap<String, Vec<f32>>,
    ) -> Result<MemoryWeights, RunError> {
        let name = name.into();
        let err = |tensor: &str, reason: String| RunError::Weight {
            source_name: name.clone(),
            tensor: tensor.to_string(),
            reason,
        };
        let mut tensors = tensors;
        tensors.retain(|k, _| !is_ignored_on_load(k));
        let params = config.diffusers_params();
        for p in &params {
            let numel = p.numel() as usize;
            match tensors.get(&p.name) {
                Some(v) if v.len() == numel => {}
                Some(v) => {
                    return Err(err(
                        &p.name,
                        format!(
                            "expected {numel} values for shape {:?}, found {}",
                            p.shape,
                            v.len()
                        ),
                    ));
                }
                None => {
                    return Err(err(
                        &p.name,
                        format!("missing (expected shape {:?})", p.shape),
                    ));
                }
            }
        }
        if tensors.len() != params.len()
            && let Some(extra) = tensors
                .keys()
                .find(|k| !params.iter().any(|p| &p.name == *k))
        {
            return Err(err(
                extra,
                "not a parameter of WanTransformer3DModel for this config".into(),
            ));
        }
        Ok(MemoryWeights {
            name,
            config,
            tensors,
        })
    }
}

impl WeightSource for MemoryWeights {
    fn config(&self) -> &WanConfig {
        &self.config
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn tensor(&self, name: &str) -> Result<Cow<'_, [f32]>, RunError> {
        self.tensors
            .get(name)
            .map(|v| Cow::Borrowed(v.as_slice()))
            .ok_or_else(|| RunError::Weight {
                source_name: self.name.clone(),
                tensor: name.to_string(),
                reason: "missing".into(),
            })
    }
}
