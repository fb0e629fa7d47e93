//! Quantized checkpoints as runner weights: every format `quant::decode` reads (GGUF,
//! ComfyUI scaled fp8 and mixed precision, LightX2V), decoded per tensor when a layer asks,
//! the tensor's mapped bytes dropped once decoded, with no scratch file.
//!
//! Owns: `QuantWeights` (a `WeightSource` over a [`QuantSource`], its names mapped to the
//! diffusers table through `model::read_plan::ReadPlan`) and `open_quantized`, which says
//! whether a `--model` path is one of them. Does not own: the formats and their decoding
//! (`quant`), or the layouts (`model`).

use std::borrow::Cow;
use std::path::Path;

use super::error::RunError;
use super::weights::{WeightSource, read_config};
use crate::io::DType;
use crate::model::read_plan::{ReadPlan, StoredTensor};
use crate::model::transform::Transform;
use crate::model::wan::{WanConfig, WanVariant};
use crate::model::wan_layout::resolve_layout;
use crate::quant::decode::QuantSource;

/// A quantized WAN transformer, decoded per tensor.
pub struct QuantWeights {
    name: String,
    plan: ReadPlan,
    source: QuantSource,
}

impl std::fmt::Debug for QuantWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuantWeights")
            .field("name", &self.name)
            .finish()
    }
}

/// Opens `path` as a quantized checkpoint when it is one (a `.gguf` file, a folder with one
/// `.gguf`, or one state dict whose layers a format quantizes); `Ok(None)` otherwise. The
/// config is `config` (a diffusers config.json) when given, else the released model whose
/// shapes these are; a quantized file carries no config of its own.
pub fn open_quantized(
    path: &Path,
    config: Option<&Path>,
) -> Result<Option<QuantWeights>, RunError> {
    let Some(source) = QuantSource::open(path)? else {
        return Ok(None);
    };
    let name = source.path().display().to_string();
    let stored: Vec<StoredTensor> = source
        .planned()
        .into_iter()
        .map(|t| StoredTensor {
            name: t.name,
            dtype: DType::F32,
            shape: t.shape,
        })
        .collect();
    let plan_error = |source| RunError::Plan {
        source_name: name.clone(),
        source,
    };
    let names: Vec<&str> = stored.iter().map(|t| t.name.as_str()).collect();
    let layout = resolve_layout(None, None, &names).map_err(plan_error)?;
    let given = config.map(read_config).transpose()?;
    let plan = ReadPlan::new(layout, &stored, given.as_ref()).map_err(plan_error)?;
    if given.is_none() && !WanVariant::ALL.iter().any(|v| v.config() == plan.config) {
        return Err(RunError::UnknownConfig {
            path: path.to_path_buf(),
            quantized: true,
        });
    }
    Ok(Some(QuantWeights { name, plan, source }))
}

impl WeightSource for QuantWeights {
    fn config(&self) -> &WanConfig {
        &self.plan.config
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn tensor(&self, name: &str) -> Result<Cow<'_, [f32]>, RunError> {
        let err = |tensor: &str, reason: &str| RunError::Weight {
            source_name: self.name.clone(),
            tensor: tensor.to_string(),
            reason: reason.into(),
        };
        let src = self
            .plan
            .get(name)
            .ok_or_else(|| err(name, "not a parameter of this model"))?;
        // The formats store PyTorch-layout tensors, one per parameter.
        if src.layer.is_some() || src.to_canonical != Transform::Identity {
            return Err(err(
                &src.stored,
                "a quantized file is read in PyTorch layout only",
            ));
        }
        Ok(Cow::Owned(self.source.decode(&src.stored)?))
    }
}
