//! The inputs file of `wanbake run`: a safetensors file holding the tensors of one forward
//! or sampling run, widened to f32.
//!
//! Owns: `RunInputs` (reading, the accepted names, refusing unknown ones) and the relabelling
//! of input errors with the file name. Does not own: the shape rules against a model
//! (`runner::forward::check_inputs`).

use std::path::Path;

use super::error::RunError;
use super::tensor::Tensor;
use super::vace::Control;
use super::weights::widen;
use crate::io::{DType, SafetensorsFile};

/// Tensor names an inputs file may hold.
pub const INPUT_NAMES: [&str; 8] = [
    "hidden_states",
    "timestep",
    "encoder_hidden_states",
    "negative_encoder_hidden_states",
    "encoder_hidden_states_image",
    "control_hidden_states",
    "control_hidden_states_scale",
    "fps",
];

/// The tensors of an inputs file.
#[derive(Clone, Debug, PartialEq)]
pub struct RunInputs {
    /// (B, C_in, F, H, W).
    pub hidden_states: Tensor,
    /// (B) or (B, S); integer dtypes are converted as `.float()` does.
    pub timestep: Tensor,
    /// (B, L, T).
    pub encoder_hidden_states: Tensor,
    /// (B, L, T), for classifier-free guidance.
    pub negative_encoder_hidden_states: Option<Tensor>,
    /// (B, n, I) or (2B, n, I).
    pub encoder_hidden_states_image: Option<Tensor>,
    /// A VACE model's control latents (B, vace_in_channels, F', H', W').
    pub control_hidden_states: Option<Tensor>,
    /// A VACE model's per-block hint scales (N); absent: ones. Only with
    /// `control_hidden_states`.
    pub control_hidden_states_scale: Option<Tensor>,
    /// SkyReels-V2's (B) `fps_embedding` indices (integer or float).
    pub fps: Option<Tensor>,
}

impl RunInputs {
    /// Reads `path`. Every tensor must be one of [`INPUT_NAMES`]; `hidden_states`,
    /// `timestep` and `encoder_hidden_states` are required.
    pub fn read(path: &Path) -> Result<RunInputs, RunError> {
        let file = SafetensorsFile::open(path)?;
        let origin = path.display().to_string();
        let err = |tensor: &str, reason: String| RunError::Input {
            origin: origin.clone(),
            tensor: tensor.to_string(),
            reason,
        };
        if let Some(unknown) = file
            .infos()
            .iter()
            .find(|t| !INPUT_NAMES.contains(&t.name.as_str()))
        {
            return Err(err(
                &unknown.name,
                format!(
                    "not an input the runner reads (expected some of {})",
                    INPUT_NAMES.join(", ")
                ),
            ));
        }
        let get = |name: &str| -> Result<Option<Tensor>, RunError> {
            let Some(view) = file.view(name) else {
                return Ok(None);
            };
            let data = match view.dtype {
                DType::I64
                | DType::I32
                | DType::I16
                | DType::I8
                | DType::U8
                | DType::U16
                | DType::U32
                | DType::U64
                    if name == "timestep" || name == "fps" =>
                {
                    integers_as_f32(view.dtype, view.bytes)
                }
                other => widen(other, view.bytes)
                    .map_err(|r| err(name, r))?
                    .into_owned(),
            };
            Ok(Some(Tensor::new(view.shape.to_vec(), data)))
        };
        let required = |name: &str| -> Result<Tensor, RunError> {
            get(name)?.ok_or_else(|| err(name, "missing from the inputs file".into()))
        };
        let inputs = RunInputs {
            hidden_states: required("hidden_states")?,
            timestep: required("timestep")?,
            encoder_hidden_states: required("encoder_hidden_states")?,
            negative_encoder_hidden_states: get("negative_encoder_hidden_states")?,
            encoder_hidden_states_image: get("encoder_hidden_states_image")?,
            control_hidden_states: get("control_hidden_states")?,
            control_hidden_states_scale: get("control_hidden_states_scale")?,
            fps: get("fps")?,
        };
        if inputs.control_hidden_states.is_none() && inputs.control_hidden_states_scale.is_some() {
            return Err(err(
                "control_hidden_states_scale",
                "given without control_hidden_states (the VACE control latents it scales)".into(),
            ));
        }
        Ok(inputs)
    }

    /// The VACE control inputs, when the file has them.
    pub fn control(&self) -> Option<Control<'_>> {
        self.control_hidden_states
            .as_ref()
            .map(|hidden_states| Control {
                hidden_states,
                scale: self.control_hidden_states_scale.as_ref(),
            })
    }
}

/// Integer timesteps, converted like `tensor.float()` (round to nearest f32).
fn integers_as_f32(dtype: DType, bytes: &[u8]) -> Vec<f32> {
    let size = dtype.element_bytes();
    bytes
        .chunks_exact(size)
        .map(|c| {
            let mut b = [0u8; 8];
            b[..size].copy_from_slice(c);
            let unsigned = u64::from_le_bytes(b);
            let shift = 64 - 8 * size as u32;
            match dtype {
                DType::I64 | DType::I32 | DType::I16 | DType::I8 => {
                    (((unsigned << shift) as i64) >> shift) as f32
                }
                _ => unsigned as f32,
            }
        })
        .collect()
}

/// Relabels an input error from the generic origin "inputs" with the inputs file.
pub fn with_origin(e: RunError, path: &Path) -> RunError {
    match e {
        RunError::Input {
            origin,
            tensor,
            reason,
        } if origin == "inputs" => RunError::Input {
            origin: path.display().to_string(),
            tensor,
            reason,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_timesteps_keep_sign_and_value() {
        let mut bytes = Vec::new();
        for v in [999i64, -3, 0] {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        assert_eq!(integers_as_f32(DType::I64, &bytes), vec![999.0, -3.0, 0.0]);
        let bytes: Vec<u8> = [500i32, -1].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(integers_as_f32(DType::I32, &bytes), vec![500.0, -1.0]);
    }
}
