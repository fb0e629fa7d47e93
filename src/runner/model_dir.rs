//! Opening what `wanbake run --model` names, through `io::checkpoint`: a transformer in any
//! layout (model folder, .safetensors file or shard index, with or beside its config.json)
//! or a pipeline folder with `transformer/` (or Wan 2.2's `high_noise_model/`), optional
//! `transformer_2/` (`low_noise_model/`) and `model_index.json` (whose `boundary_ratio` is
//! the default expert switch of Wan2.2 A14B).
//!
//! Owns: `ModelSet` (the opened weight sources and the boundary found on disk;
//! `ModelSet::from_checkpoint` lets a caller wrap each transformer's weights, as a bake's
//! `unmerged` reference does). Does not own: the weights' validation (`runner::weights`) or
//! the switch rule (`runner::sampler`).

use std::path::{Path, PathBuf};

use super::error::RunError;
use super::weights::{CheckpointWeights, WeightSource};
use crate::io::checkpoint::Checkpoint;

/// The transformers of one model path (`'w`: what their weight sources borrow).
pub struct ModelSet<'w> {
    /// The path given.
    pub path: PathBuf,
    /// `transformer` (or the only transformer).
    pub transformer: Box<dyn WeightSource + 'w>,
    /// `transformer_2`, when the pipeline folder has one.
    pub transformer_2: Option<Box<dyn WeightSource + 'w>>,
    /// `boundary_ratio` from model_index.json (None when absent or null).
    pub boundary_ratio: Option<f64>,
}

impl std::fmt::Debug for ModelSet<'_> {
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

/// Makes the weight source a [`ModelSet`] holds from a component's name and its weights.
pub type WrapWeights<'f, 'w> =
    dyn FnMut(&str, CheckpointWeights) -> Result<Box<dyn WeightSource + 'w>, RunError> + 'f;

impl ModelSet<'static> {
    /// Opens `path` (see the module doc); `config` replaces every transformer's
    /// config.json.
    pub fn open(path: &Path, config: Option<&Path>) -> Result<ModelSet<'static>, RunError> {
        // A quantized transformer of one state dict (`runner::quant_weights`).
        if let Some(q) = super::quant_weights::open_quantized(path, config)? {
            return Ok(ModelSet {
                path: path.to_path_buf(),
                transformer: Box::new(q),
                transformer_2: None,
                boundary_ratio: None,
            });
        }
        let mut plain = |_: &str,
                         w: CheckpointWeights|
         -> Result<Box<dyn WeightSource>, RunError> { Ok(Box::new(w)) };
        ModelSet::from_checkpoint(
            path,
            crate::quant::base::open_checkpoint(path)?,
            config,
            &mut plain,
        )
    }
}

impl<'w> ModelSet<'w> {
    /// The transformers of `ckpt`, opened from `path` (a checkpoint in any layout or a
    /// pipeline folder, not a quantized file): each component's weights are read as
    /// [`CheckpointWeights`] (with `config` replacing its config.json) and handed to `wrap`
    /// with the component's name (`""` for a plain model); the set holds what it returns.
    pub fn from_checkpoint(
        path: &Path,
        ckpt: Checkpoint,
        config: Option<&Path>,
        wrap: &mut WrapWeights<'_, 'w>,
    ) -> Result<ModelSet<'w>, RunError> {
        if !ckpt.is_pipeline() {
            let mut components = ckpt.components;
            if components.is_empty() {
                return Err(RunError::ModelLayout {
                    path: path.to_path_buf(),
                    reason: "holds no transformer".into(),
                });
            }
            let only = components.remove(0);
            let name = only.name.clone();
            return Ok(ModelSet {
                path: path.to_path_buf(),
                transformer: wrap(
                    &name,
                    CheckpointWeights::from_component(path, only, config)?,
                )?,
                transformer_2: None,
                boundary_ratio: None,
            });
        }
        let boundary_ratio = match ckpt
            .root_files
            .iter()
            .find(|f| f.name == "model_index.json")
        {
            Some(f) => boundary_ratio_of(&f.json, &f.path)?,
            None => None,
        };
        let mut transformer = None;
        let mut transformer_2 = None;
        for c in ckpt.components {
            // Wan 2.2 original folders name the experts high_noise_model / low_noise_model.
            let slot = match c.name.as_str() {
                "transformer" | "high_noise_model" => &mut transformer,
                _ => &mut transformer_2,
            };
            if slot.is_some() {
                return Err(RunError::ModelLayout {
                    path: path.to_path_buf(),
                    reason: format!(
                        "`{}/` is a second copy of an expert (transformer/ and \
                         high_noise_model/, or transformer_2/ and low_noise_model/)",
                        c.name
                    ),
                });
            }
            let name = c.name.clone();
            *slot = Some(wrap(
                &name,
                CheckpointWeights::from_component(path, c, config)?,
            )?);
        }
        let transformer = transformer.ok_or_else(|| RunError::ModelLayout {
            path: path.to_path_buf(),
            reason: "pipeline folder has a low-noise expert but no transformer/ (or \
                     high_noise_model/)"
                .into(),
        })?;
        Ok(ModelSet {
            path: path.to_path_buf(),
            transformer,
            transformer_2,
            boundary_ratio,
        })
    }
}

/// `boundary_ratio` of a pipeline's parsed model_index.json (at `path`); None when the
/// field is absent or null.
pub fn boundary_ratio_of(json: &serde_json::Value, path: &Path) -> Result<Option<f64>, RunError> {
    match json.get("boundary_ratio") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| RunError::Config {
            path: path.to_path_buf(),
            reason: format!("boundary_ratio must be a number or null, found {v}"),
        }),
    }
}
