//! Where the runner's weights come from.
//!
//! Owns: the `WeightSource` trait (a config plus f32 tensors in diffusers naming and
//! PyTorch layout, fetched one at a time when a layer runs) and `DiffusersCheckpoint`, a
//! diffusers-layout model: one safetensors file plus its config.json, any float dtype,
//! validated against the complete parameter table of its config at open time and read
//! straight from the memory map (f32 weights are borrowed, others widened per tensor when
//! asked). Does not own: other naming conventions (`layout`), multi-file checkpoints and
//! pipeline folders (`io::checkpoint`, see `runner::model_dir`).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use super::error::RunError;
use crate::io::{DType, SafetensorsFile};
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

/// A diffusers-layout `WanTransformer3DModel` in one safetensors file with its config.json.
pub struct DiffusersCheckpoint {
    name: String,
    config: WanConfig,
    file: SafetensorsFile,
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
    WanConfig::from_json(&text).map_err(|e| RunError::Config {
        path: path.to_path_buf(),
        reason: format!("not a WanTransformer3DModel config: {e}"),
    })
}

impl DiffusersCheckpoint {
    /// Opens `weights` (a .safetensors file) with the config at `config_path`, and checks
    /// that the file holds exactly the parameters of that config, with their shapes and
    /// float dtypes.
    pub fn open(weights: &Path, config_path: &Path) -> Result<DiffusersCheckpoint, RunError> {
        let config = read_config(config_path)?;
        let file = SafetensorsFile::open(weights)?;
        let ckpt = DiffusersCheckpoint {
            name: weights.display().to_string(),
            config,
            file,
        };
        ckpt.validate()?;
        Ok(ckpt)
    }

    /// Opens a transformer folder (config.json + one .safetensors file) or a .safetensors
    /// file whose folder holds config.json.
    pub fn open_path(path: &Path) -> Result<DiffusersCheckpoint, RunError> {
        let (weights, config) = locate_single_file(path)?;
        DiffusersCheckpoint::open(&weights, &config)
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
        for info in self.file.infos() {
            match wanted.remove(info.name.as_str()) {
                Some(shape) => {
                    if info.shape != shape {
                        return Err(self.weight_error(
                            &info.name,
                            format!(
                                "expected shape {shape:?} from config.json, found {:?}",
                                info.shape
                            ),
                        ));
                    }
                    check_float(info.dtype).map_err(|r| self.weight_error(&info.name, r))?;
                }
                None if is_ignored_on_load(&info.name) => {}
                None => {
                    return Err(self.weight_error(
                        &info.name,
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
            .file
            .view(name)
            .ok_or_else(|| self.weight_error(name, "missing from the checkpoint"))?;
        widen(view.dtype, view.bytes).map_err(|r| self.weight_error(name, r))
    }
}

/// Finds (weights file, config.json) for a single-file diffusers transformer given as a
/// folder or as its .safetensors file.
pub fn locate_single_file(path: &Path) -> Result<(PathBuf, PathBuf), RunError> {
    let layout_error = |reason: String| RunError::ModelLayout {
        path: path.to_path_buf(),
        reason,
    };
    if path.is_dir() {
        let config = path.join("config.json");
        if !config.is_file() {
            return Err(layout_error(
                "folder has no config.json (expected a diffusers transformer folder, or a \
                 pipeline folder with transformer/)"
                    .into(),
            ));
        }
        let mut files: Vec<PathBuf> = fs_err::read_dir(path)
            .map_err(|e| layout_error(e.to_string()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
            .collect();
        files.sort();
        match files.len() {
            1 => Ok((files.remove(0), config)),
            0 => Err(layout_error("folder has no .safetensors file".into())),
            n => Err(layout_error(format!(
                "folder has {n} .safetensors files; sharded checkpoints are read through \
                 io::checkpoint, which this build does not have yet"
            ))),
        }
    } else {
        let dir = path.parent().unwrap_or(Path::new("."));
        let config = dir.join("config.json");
        if !config.is_file() {
            return Err(layout_error(format!(
                "no config.json beside the weights (looked for {})",
                config.display()
            )));
        }
        Ok((path.to_path_buf(), config))
    }
}
