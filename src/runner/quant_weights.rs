//! Quantized checkpoints as runner weights: ComfyUI scaled-fp8 safetensors and GGUF files
//! (spec quant_formats.md), dequantized per tensor when a layer asks, as their loaders do,
//! the tensor's mapped bytes dropped once decoded.
//!
//! Owns: `QuantWeights` (a `WeightSource` over either format, original-Wan names mapped to
//! the diffusers table through `model::read_plan::ReadPlan`) and `open_quantized`, which
//! says whether a `--model` path is one of them. Dequantization: scaled fp8 `W = q.to(f32) * scale_weight`
//! (ComfyUI's legacy ops, f32 compute), GGUF as gguf-py's dequantizers (`d·q`, `d·q + m`,
//! F16/BF16 widened). Does not own: the encodings (`codec`), the GGUF parser
//! (`io::gguf`), or the layouts (`model`).

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use super::error::RunError;
use super::weights::{WeightSource, read_config, widen};
use crate::codec::fp8;
use crate::io::checkpoint::{Checkpoint, TensorSet};
use crate::io::gguf::{GgufFile, single_gguf_in, torch_shape};
use crate::io::{DType, ReadError};
use crate::model::read_plan::{ReadPlan, StoredTensor};
use crate::model::wan::{WanConfig, WanVariant};
use crate::model::wan_layout::Layout;
use crate::quant::convention;

enum Source {
    Gguf {
        file: GgufFile,
        index: HashMap<String, usize>,
    },
    Fp8(TensorSet),
}

/// A scaled-fp8 or GGUF WAN transformer, dequantized per tensor.
pub struct QuantWeights {
    name: String,
    plan: ReadPlan,
    source: Source,
}

impl std::fmt::Debug for QuantWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuantWeights")
            .field("name", &self.name)
            .finish()
    }
}

/// Opens `path` as a quantized checkpoint when it is one (a `.gguf` file, a folder with one
/// `.gguf`, or a checkpoint with the `scaled_fp8` marker); `Ok(None)` otherwise. The config
/// is `config` (a diffusers config.json) when given, else the released model whose shapes
/// these are; a GGUF or fp8 file carries no config of its own.
pub fn open_quantized(
    path: &Path,
    config: Option<&Path>,
) -> Result<Option<QuantWeights>, RunError> {
    let (name, stored, source) = if let Some(g) = single_gguf_in(path) {
        let file = GgufFile::open(&g)?;
        let stored: Vec<StoredTensor> = file
            .header()
            .tensors
            .iter()
            .map(|t| StoredTensor {
                name: t.name.clone(),
                dtype: DType::F32,
                shape: torch_shape(&t.ne),
            })
            .collect();
        let index = file
            .header()
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        (
            g.display().to_string(),
            stored,
            Source::Gguf { file, index },
        )
    } else {
        let ck = match Checkpoint::open_stored(path) {
            Ok(c) => c,
            Err(_) => return Ok(None),
        };
        let [c] = ck.components.as_slice() else {
            return Ok(None);
        };
        if convention::scaled_fp8_marker(&c.tensors).is_none() {
            return Ok(None);
        }
        let stored: Vec<StoredTensor> = c
            .tensors
            .tensors()
            .filter(|t| !convention::is_side_tensor(t.view.name))
            .map(|t| StoredTensor::from(&t.view))
            .collect();
        let set = ck.components.into_iter().next().map(|c| c.tensors);
        let set = set.ok_or_else(|| ReadError::Unsupported {
            path: path.to_path_buf(),
            reason: "no state dict".into(),
        })?;
        (path.display().to_string(), stored, Source::Fp8(set))
    };
    let given = config.map(read_config).transpose()?;
    let plan =
        ReadPlan::new(Layout::Wan, &stored, given.as_ref()).map_err(|source| RunError::Plan {
            source_name: name.clone(),
            source,
        })?;
    if given.is_none() && !WanVariant::ALL.iter().any(|v| v.config() == plan.config) {
        return Err(RunError::UnknownConfig {
            path: path.to_path_buf(),
            quantized: true,
        });
    }
    Ok(Some(QuantWeights { name, plan, source }))
}

impl QuantWeights {
    fn err(&self, tensor: &str, reason: impl Into<String>) -> RunError {
        RunError::Weight {
            source_name: self.name.clone(),
            tensor: tensor.to_string(),
            reason: reason.into(),
        }
    }
}

impl WeightSource for QuantWeights {
    fn config(&self) -> &WanConfig {
        &self.plan.config
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn tensor(&self, name: &str) -> Result<Cow<'_, [f32]>, RunError> {
        let src = self
            .plan
            .get(name)
            .ok_or_else(|| self.err(name, "not a parameter of this model"))?;
        match &self.source {
            Source::Gguf { file, index } => {
                let i = *index
                    .get(&src.stored)
                    .ok_or_else(|| self.err(&src.stored, "missing from the GGUF file"))?;
                let values = file.read_f32(i);
                // Dequantized: the run holds this copy, not the mapped blocks.
                file.release(i);
                Ok(Cow::Owned(values))
            }
            Source::Fp8(set) => {
                let found = set
                    .get(&src.stored)
                    .ok_or_else(|| self.err(&src.stored, "missing"))?;
                let values = self.fp8_values(set, &src.stored, found.view);
                // Decoded or copied: the run holds these values, not the mapped bytes.
                found.file.release(found.position);
                values.map(Cow::Owned)
            }
        }
    }
}

impl QuantWeights {
    /// The f32 values of `stored` (an fp8 weight with its scale, or a float tensor) in a
    /// scaled-fp8 checkpoint.
    fn fp8_values(
        &self,
        set: &TensorSet,
        stored: &str,
        view: crate::io::TensorView<'_>,
    ) -> Result<Vec<f32>, RunError> {
        let layer = stored.strip_suffix(".weight").unwrap_or(stored);
        let scale = set.get(&format!("{layer}{}", convention::SCALE_WEIGHT));
        match (view.dtype, scale) {
            (DType::F8_E4M3, Some(s)) => {
                let s = s
                    .view
                    .to_f32()
                    .map_err(|e| self.err(stored, e.to_string()))?;
                let [s] = s.as_slice() else {
                    return Err(self.err(stored, "scale_weight is not one value"));
                };
                let mut out = vec![0f32; view.bytes.len()];
                fp8::decode_scaled(view.bytes, *s, &mut out);
                Ok(out)
            }
            (DType::F8_E4M3, None) => {
                Err(self.err(stored, "F8_E4M3 weight without a scale_weight"))
            }
            (dt, _) => widen(dt, view.bytes)
                .map(Cow::into_owned)
                .map_err(|r| self.err(stored, r)),
        }
    }
}
