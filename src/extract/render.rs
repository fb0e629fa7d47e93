//! The files `extract` and `resize` write, and the one call into the release writer.
//!
//! Owns: [`Extracted`] (a low-rank module or a full difference, with its numbers), its keys
//! in the ComfyUI / original-Wan convention (`diffusion_model.<name>.lora_down.weight`,
//! `.lora_up.weight`, `.alpha`, `.diff`, `.diff_b`; the modulation tables as
//! `diffusion_model.blocks.N.modulation.diff`, the key ComfyUI maps to the parameter) and in
//! PEFT (`base_model.model.<diffusers name>.lora_A.weight` / `.lora_B.weight` +
//! adapter_config.json, α = r so σ = 1), and [`write_output`] (through the adapter-file
//! release writer `translation::write_adapter_file`, with the report in the manifest). Does
//! not own: the renderers of existing adapters (`adapter::translate`, used by `resize`).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

use super::ExtractError;
use super::factor::LowRankFactors;
use crate::adapter::Convention;
use crate::adapter::names::{ModuleId, Role};
use crate::adapter::peft_config::ConfigPlan;
use crate::codec::dtype::{Unheld, all_held, held_limit};
use crate::format::header_layout::PlannedTensor;
use crate::io::DType;
use crate::pipeline::{NonFinite, Origin, UnheldValues};
use crate::release::Release;
use crate::release::staging::Replace;

use crate::translation::{AdapterFile, Provenance, write_adapter_file};

/// One entry of an extracted adapter.
#[derive(Clone, Debug)]
pub enum Extracted {
    /// A Linear weight as LoRA factors (α = rank).
    Lora {
        /// The module.
        id: ModuleId,
        /// Its factors.
        factors: LowRankFactors,
    },
    /// A full difference, f32, PyTorch layout.
    Diff {
        /// The module.
        id: ModuleId,
        /// Weight/parameter (`.diff`) or bias (`.diff_b`).
        role: Role,
        /// Shape.
        shape: Vec<usize>,
        /// Values.
        data: Vec<f32>,
    },
}

/// One tensor to write, with its bytes.
#[derive(Clone, Debug)]
pub struct OwnedTensor {
    /// Key.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
    /// Little-endian bytes.
    pub bytes: Vec<u8>,
}

/// One weights file and its sidecars.
#[derive(Clone, Debug, Default)]
pub struct OwnedOutput {
    /// File stem.
    pub stem: String,
    /// Tensors.
    pub tensors: Vec<OwnedTensor>,
    /// `__metadata__`.
    pub metadata: BTreeMap<String, String>,
    /// Files next to it.
    pub sidecars: Vec<(String, Vec<u8>)>,
}

impl OwnedOutput {
    /// Rounds every F32/F16/BF16 tensor of more than a scalar to `to` (one round to nearest
    /// even, exact when `to` is at least as wide; `--dtype`). Scalars (`.alpha`) stay as
    /// they are: an integer rank is exact in any of them, and the budget counts 4 bytes.
    pub fn convert_floats(&mut self, to: DType) -> Result<(), ExtractError> {
        for t in &mut self.tensors {
            if t.shape.is_empty() || t.dtype == to || !t.dtype.is_output_float() {
                continue;
            }
            t.bytes = crate::codec::dtype::convert_bytes(t.dtype, to, &t.bytes)
                .map_err(|e| ExtractError::Usage(format!("--dtype {to}: `{}`: {e}", t.name)))?;
            t.dtype = to;
        }
        Ok(())
    }
}

impl OwnedOutput {
    /// Checks every float tensor against what it will be written as (`to` for those
    /// [`OwnedOutput::convert_floats`] rounds, its own dtype for the others): NaN, ±inf, or a
    /// finite value `to` cannot hold (an f16 overflow). Refused unless `nonfinite` allows
    /// them (`ExtractError::Unheld`, naming `file`, the key and `origin`); allowed ones are
    /// returned as the report records them. Run before rounding, so a value is named as it
    /// was computed.
    pub fn check_values(
        &self,
        to: Option<DType>,
        file: &Path,
        origin: &Origin,
        nonfinite: NonFinite,
    ) -> Result<Vec<serde_json::Value>, ExtractError> {
        let mut allowed = Vec::new();
        for t in self.tensors.iter().filter(|t| t.dtype.is_float()) {
            let into = match to {
                Some(d) if !t.shape.is_empty() && t.dtype.is_output_float() => d,
                _ => t.dtype,
            };
            let v = crate::codec::dtype::to_f32_vec(t.dtype, &t.bytes)
                .map_err(|e| ExtractError::Usage(format!("internal: `{}`: {e}", t.name)))?;
            if all_held(&v, held_limit(into)) {
                continue;
            }
            let Some(found) = Unheld::scan(&v, held_limit(into), 0) else {
                continue;
            };
            let u = UnheldValues {
                file: file.to_path_buf(),
                tensor: t.name.clone(),
                output: None,
                into: into.to_string(),
                dtype: Some(into),
                found,
                at: None,
                origin: origin.clone(),
            };
            if !nonfinite.allows() {
                return Err(ExtractError::Unheld(Box::new(u)));
            }
            allowed.push(u.to_json());
        }
        Ok(allowed)
    }
}

fn f32_tensor(name: String, shape: Vec<usize>, v: &[f32]) -> OwnedTensor {
    OwnedTensor {
        name,
        dtype: DType::F32,
        shape,
        bytes: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

/// The name a report and PEFT config use: original Wan for ComfyUI, diffusers for PEFT.
pub fn short_name(id: &ModuleId, to: Convention) -> String {
    match (id, to) {
        (ModuleId::Wan { wan, .. }, Convention::Comfy | Convention::Kohya) => wan.clone(),
        (ModuleId::Wan { diffusers, .. }, _) => diffusers.clone(),
        (ModuleId::Generic { path }, _) => path.clone(),
    }
}

/// ComfyUI / original-Wan keys.
pub fn render_comfy(items: &[Extracted]) -> OwnedOutput {
    let mut tensors = Vec::new();
    for it in items {
        match it {
            Extracted::Lora { id, factors: f } => {
                let name = id.spell(Convention::Comfy);
                tensors.push(f32_tensor(
                    format!("{name}.lora_down.weight"),
                    vec![f.rank, f.inp],
                    &f.A,
                ));
                tensors.push(f32_tensor(
                    format!("{name}.lora_up.weight"),
                    vec![f.out, f.rank],
                    &f.B,
                ));
                tensors.push(f32_tensor(
                    format!("{name}.alpha"),
                    Vec::new(),
                    &[f.rank as f32],
                ));
            }
            Extracted::Diff {
                id,
                role,
                shape,
                data,
            } => {
                let suffix = if *role == Role::Bias {
                    "diff_b"
                } else {
                    "diff"
                };
                let name = format!("{}.{suffix}", id.spell(Convention::Comfy));
                tensors.push(f32_tensor(name, shape.clone(), data));
            }
        }
    }
    OwnedOutput {
        stem: "lora".into(),
        tensors,
        ..OwnedOutput::default()
    }
}

/// PEFT keys and adapter_config.json (LoRA only; the caller refuses diffs first).
pub fn render_peft(items: &[Extracted]) -> Result<OwnedOutput, ExtractError> {
    let mut tensors = Vec::new();
    let mut modules = Vec::new();
    for it in items {
        let Extracted::Lora { id, factors: f } = it else {
            return Err(ExtractError::Usage(
                "internal: a full difference reached the PEFT renderer".into(),
            ));
        };
        let name = id.spell(Convention::Peft);
        tensors.push(f32_tensor(
            format!("{name}.lora_A.weight"),
            vec![f.rank, f.inp],
            &f.A,
        ));
        tensors.push(f32_tensor(
            format!("{name}.lora_B.weight"),
            vec![f.out, f.rank],
            &f.B,
        ));
        modules.push((short_name(id, Convention::Peft), f.rank, f.rank as f64));
    }
    let mut cfg = ConfigPlan::new(&modules, false, false, false).to_json();
    cfg.insert("base_model_name_or_path".into(), serde_json::Value::Null);
    let mut bytes = serde_json::to_vec_pretty(&serde_json::Value::Object(cfg))
        .map_err(|e| ExtractError::Usage(format!("internal: adapter_config.json: {e}")))?;
    bytes.push(b'\n');
    Ok(OwnedOutput {
        stem: "adapter_model".into(),
        tensors,
        metadata: BTreeMap::from([("format".to_string(), "pt".to_string())]),
        sidecars: vec![("adapter_config.json".into(), bytes)],
    })
}

/// Writes `out` as a release at `dest` (`translation::write_adapter_file`); nothing is
/// left there on error.
pub fn write_output(
    out: &OwnedOutput,
    dest: &Path,
    replace: Replace,
    prov: Provenance<'_>,
) -> Result<Release, ExtractError> {
    let file = AdapterFile {
        stem: &out.stem,
        tensors: out
            .tensors
            .iter()
            .map(|t| PlannedTensor {
                name: t.name.clone(),
                dtype: t.dtype,
                shape: t.shape.clone(),
            })
            .collect(),
        metadata: &out.metadata,
        sidecars: &out.sidecars,
    };
    let bytes = |i: usize| Ok(Cow::Borrowed(out.tensors[i].bytes.as_slice()));
    Ok(write_adapter_file(file, dest, replace, prov, bytes)?)
}
