//! LoRA-family adapters in every convention people ship, read into one canonical form.
//!
//! Owns: `AdapterSet` (the files of one adapter, its convention, and its canonical entries)
//! and the lazy loading of entry tensors as f32 in PyTorch layout. The canonical types are
//! in `kinds`. Does not own: the merge math (`merge`).

pub mod kinds;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::io::{ReadError, SafetensorsFile, dtype};
pub use kinds::{Entry, Kind, ParamRole, ScaleSource, TensorSource};

/// The naming/packaging convention an adapter file follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Convention {
    /// HF PEFT: `base_model.model.…lora_A.weight` + adapter_config.json.
    Peft,
    /// diffusers: `transformer.…lora_A.weight`, optional `lora_adapter_metadata`.
    Diffusers,
    /// ComfyUI / original Wan: `diffusion_model.…lora_down.weight`, `.alpha`, `.diff`.
    Comfy,
    /// kohya / musubi: `lora_unet_…`.
    Kohya,
    /// Stable Audio 3 native parametrizations.
    Sa3,
    /// Flax NNX / Qwix `…kernel_lora_a`.
    Nnx,
}

impl Convention {
    /// Command-line spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Convention::Peft => "peft",
            Convention::Diffusers => "diffusers",
            Convention::Comfy => "comfy",
            Convention::Kohya => "kohya",
            Convention::Sa3 => "sa3",
            Convention::Nnx => "nnx",
        }
    }
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
}

impl AdapterSet {
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
