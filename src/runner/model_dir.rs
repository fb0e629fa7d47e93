//! Opening what `wanbake run --model` names: a diffusers transformer (folder or
//! .safetensors file beside its config.json) or a diffusers pipeline folder with
//! `transformer/`, optional `transformer_2/` and `model_index.json` (whose
//! `boundary_ratio` is the default expert switch of Wan2.2 A14B).
//!
//! Owns: `ModelSet` (the opened weight sources and the boundary found on disk). Does not
//! own: the weights' validation (`runner::weights`) or the switch rule (`runner::sampler`).

use std::path::{Path, PathBuf};

use super::error::RunError;
use super::weights::{DiffusersCheckpoint, WeightSource};

/// The transformers of one model path.
pub struct ModelSet {
    /// The path given.
    pub path: PathBuf,
    /// `transformer` (or the only transformer).
    pub transformer: Box<dyn WeightSource>,
    /// `transformer_2`, when the pipeline folder has one.
    pub transformer_2: Option<Box<dyn WeightSource>>,
    /// `boundary_ratio` from model_index.json (None when absent or null).
    pub boundary_ratio: Option<f64>,
}

impl std::fmt::Debug for ModelSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelSet")
            .field("path", &self.path)
            .field("transformer", &self.transformer.name())
            .field(
                "transformer_2",
                &self.transformer_2.as_ref().map(|t| t.name().to_string()),
            )
            .field("boundary_ratio", &self.boundary_ratio)
            .finish()
    }
}

impl ModelSet {
    /// Opens `path` (see the module doc).
    pub fn open(path: &Path) -> Result<ModelSet, RunError> {
        let sub = path.join("transformer");
        if path.is_dir() && sub.is_dir() {
            let transformer: Box<dyn WeightSource> =
                Box::new(DiffusersCheckpoint::open_path(&sub)?);
            let sub2 = path.join("transformer_2");
            let transformer_2: Option<Box<dyn WeightSource>> = if sub2.is_dir() {
                Some(Box::new(DiffusersCheckpoint::open_path(&sub2)?))
            } else {
                None
            };
            let boundary_ratio = read_boundary_ratio(&path.join("model_index.json"))?;
            return Ok(ModelSet {
                path: path.to_path_buf(),
                transformer,
                transformer_2,
                boundary_ratio,
            });
        }
        Ok(ModelSet {
            path: path.to_path_buf(),
            transformer: Box::new(DiffusersCheckpoint::open_path(path)?),
            transformer_2: None,
            boundary_ratio: None,
        })
    }
}

/// `boundary_ratio` of a pipeline's model_index.json; None when the file is absent or the
/// field is absent or null.
pub fn read_boundary_ratio(path: &Path) -> Result<Option<f64>, RunError> {
    if !path.is_file() {
        return Ok(None);
    }
    let bad = |reason: String| RunError::Config {
        path: path.to_path_buf(),
        reason,
    };
    let text = fs_err::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    match json.get("boundary_ratio") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| {
            bad(format!(
                "boundary_ratio must be a number or null, found {v}"
            ))
        }),
    }
}
