//! Where the runner's weights come from.
//!
//! Owns: the `WeightSource` trait (a config plus f32 tensors in diffusers naming and
//! PyTorch layout, fetched one at a time when a layer runs) and `DiffusersCheckpoint`, a
//! diffusers-layout model (one file or shards, plus its config.json), any float dtype,
//! validated against the complete parameter table of its config at open time and read
//! straight from the memory map (f32 weights are borrowed, others widened per tensor when
//! asked). Does not own: finding files and folders (`io::checkpoint`), other naming
//! conventions (`layout`), or which transformer is which (`runner::model_dir`).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

use rayon::prelude::*;

use super::error::RunError;
use crate::io::DType;
use crate::io::checkpoint::{Checkpoint, Component, TensorSet};
use crate::model::wan::WanConfig;

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
    name.split('.').any(|t| t == "norm_added_q")
}

/// A diffusers-layout `WanTransformer3DModel`: one file or the shards of an index
/// (`io::checkpoint::TensorSet`), with its config.json.
pub struct DiffusersCheckpoint {
    name: String,
    config: WanConfig,
    tensors: TensorSet,
}

impl std::fmt::Debug for DiffusersCheckpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiffusersCheckpoint")
            .field("name", &self.name)
            .finish()
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

impl DiffusersCheckpoint {
    /// Wraps `tensors` (named `name` in messages) with `config`, checking that they hold
    /// exactly the parameters of that config, with their shapes and float dtypes.
    pub fn new(
        name: String,
        config: WanConfig,
        tensors: TensorSet,
    ) -> Result<DiffusersCheckpoint, RunError> {
        let ckpt = DiffusersCheckpoint {
            name,
            config,
            tensors,
        };
        ckpt.validate()?;
        Ok(ckpt)
    }

    /// Opens a diffusers transformer: a model folder (config.json + one file or a shard
    /// index), or a .safetensors / index file whose folder holds config.json.
    pub fn open_path(path: &Path) -> Result<DiffusersCheckpoint, RunError> {
        let mut ckpt = Checkpoint::open(path)?;
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
        Self::from_component(path, component)
    }

    /// Wraps one component of an opened checkpoint; its config comes from its config.json
    /// sidecar, or, for a bare file, from config.json beside `path`.
    pub fn from_component(
        path: &Path,
        component: Component,
    ) -> Result<DiffusersCheckpoint, RunError> {
        let folder = path.join(&component.rel_dir);
        let config = match component.sidecar("config.json") {
            Some(s) => parse_config(&s.text, &s.path)?,
            None => {
                let dir = if folder.is_dir() {
                    folder.as_path()
                } else {
                    path.parent().unwrap_or(Path::new("."))
                };
                let beside = if dir.as_os_str().is_empty() {
                    Path::new("config.json").to_path_buf()
                } else {
                    dir.join("config.json")
                };
                if !beside.is_file() {
                    return Err(RunError::ModelLayout {
                        path: path.to_path_buf(),
                        reason: format!(
                            "no config.json for this transformer (looked for {})",
                            beside.display()
                        ),
                    });
                }
                read_config(&beside)?
            }
        };
        let name = if component.rel_dir.as_os_str().is_empty() {
            path.display().to_string()
        } else {
            folder.display().to_string()
        };
        DiffusersCheckpoint::new(name, config, component.tensors)
    }

    fn weight_error(&self, tensor: &str, reason: impl Into<String>) -> RunError {
        RunError::Weight {
            source_name: self.name.clone(),
            tensor: tensor.to_string(),
            reason: reason.into(),
        }
    }

    fn validate(&self) -> Result<(), RunError> {
        let expected = self.config.diffusers_params();
        let mut wanted: BTreeMap<&str, &[usize]> = BTreeMap::new();
        for p in &expected {
            wanted.insert(&p.name, &p.shape);
        }
        for t in self.tensors.tensors() {
            let view = t.view;
            match wanted.remove(view.name) {
                Some(shape) => {
                    if view.shape != shape {
                        return Err(self.weight_error(
                            view.name,
                            format!(
                                "expected shape {shape:?} from config.json, found {:?}",
                                view.shape
                            ),
                        ));
                    }
                    check_float(view.dtype).map_err(|r| self.weight_error(view.name, r))?;
                }
                None if is_ignored_on_load(view.name) => {}
                None => {
                    return Err(self.weight_error(
                        view.name,
                        "not a parameter of WanTransformer3DModel for this config.json \
                         (wrong config, or not a diffusers-layout checkpoint?)",
                    ));
                }
            }
        }
        if let Some((missing, shape)) = wanted.into_iter().next() {
            return Err(self.weight_error(
                missing,
                format!("missing from the checkpoint (expected shape {shape:?})"),
            ));
        }
        Ok(())
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
        .try_for_each(|(dst, src)| crate::io::dtype::widen_to_f32(dtype, src, dst))
        .map_err(|e| e.to_string())?;
    Ok(Cow::Owned(out))
}

impl WeightSource for DiffusersCheckpoint {
    fn config(&self) -> &WanConfig {
        &self.config
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn tensor(&self, name: &str) -> Result<Cow<'_, [f32]>, RunError> {
        let view = self
            .tensors
            .get(name)
            .ok_or_else(|| self.weight_error(name, "missing from the checkpoint"))?
            .view;
        widen(view.dtype, view.bytes).map_err(|r| self.weight_error(name, r))
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
