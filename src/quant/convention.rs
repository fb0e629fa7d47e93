//! The file conventions of quantized safetensors checkpoints: which marker, side tensor and
//! scale names each format uses, and recognising which format (if any) a state dict is in.
//!
//! Sources (spec quant_formats.md §1, quant_formats_2026.md §1.2, §2.1): ComfyUI's legacy
//! scaled fp8 (`scaled_fp8` marker; `<L>.scale_weight`, `<L>.scale_input`), ComfyUI mixed
//! precision (`<L>.comfy_quant` uint8 JSON, or the `_quantization_metadata` header;
//! `<L>.weight_scale`, `weight_scale_2`, `input_scale`, `pre_quant_scale`), LightX2V
//! (`<k>.weight_scale` [out, 1] beside an I8 / F8_E4M3 weight; NVFP4's
//! `weight_global_scale`, `input_global_scale`), and the `.weight_scale` spelling
//! stable-diffusion.cpp reports in the wild.
//!
//! Owns: those names, [`Format`] and [`recognise`]. Does not own: decoding (`quant::base`),
//! the numbers (`codec`).

use std::collections::BTreeMap;

use crate::io::{DType, TensorSet};

/// The legacy scaled-fp8 marker tensor (any prefix before it).
pub const SCALED_FP8_MARKER: &str = "scaled_fp8";
/// Legacy scaled fp8's per-layer weight scale suffix.
pub const SCALE_WEIGHT: &str = ".scale_weight";
/// Legacy scaled fp8's per-layer activation scale suffix (never applied to weights).
pub const SCALE_INPUT: &str = ".scale_input";
/// Mixed precision's (and LightX2V's) weight scale suffix.
pub const WEIGHT_SCALE: &str = ".weight_scale";
/// Mixed precision NVFP4's per-tensor scale suffix.
pub const WEIGHT_SCALE_2: &str = ".weight_scale_2";
/// Mixed precision's activation scale suffix (never applied to weights).
pub const INPUT_SCALE: &str = ".input_scale";
/// Mixed precision's per-layer marker suffix (uint8 JSON).
pub const COMFY_QUANT: &str = ".comfy_quant";
/// The safetensors header key of mixed precision's per-layer formats.
pub const QUANT_METADATA: &str = "_quantization_metadata";
/// Mixed precision's `comfy_quant` format of per-tensor-scaled e4m3 (ComfyUI `QUANT_ALGOS`).
pub const COMFY_FORMAT_FP8: &str = "float8_e4m3fn";
/// Mixed precision's `comfy_quant` format of NVFP4.
pub const COMFY_FORMAT_NVFP4: &str = "nvfp4";
/// Mixed precision's `comfy_quant` format of MXFP8.
pub const COMFY_FORMAT_MXFP8: &str = "mxfp8";
/// Mixed precision's `comfy_quant` format of INT8 (scalar or per-row scale, ConvRot).
pub const COMFY_FORMAT_INT8: &str = "int8_tensorwise";

/// Side-tensor suffixes of every format wanbake knows: a tensor ending in one of these is
/// never a model parameter.
pub const SIDE_SUFFIXES: [&str; 10] = [
    SCALE_WEIGHT,
    SCALE_INPUT,
    WEIGHT_SCALE,
    WEIGHT_SCALE_2,
    INPUT_SCALE,
    COMFY_QUANT,
    ".pre_quant_scale",
    ".weight_global_scale",
    ".input_global_scale",
    ".weight_scale_inv",
];

/// The format a state dict is stored in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Floats only: nothing to decode.
    Plain,
    /// fp8 weights without scales (Kijai's `*_fp8_e4m3fn` files): decoded by a cast.
    PlainFp8,
    /// ComfyUI's legacy scaled fp8 (`scaled_fp8` marker).
    ScaledFp8,
    /// ComfyUI mixed precision (`comfy_quant` markers or the `_quantization_metadata` header).
    ComfyMixed,
    /// LightX2V's per-channel int8 / fp8 (`weight_scale` [out, 1] beside the weight).
    LightX2v,
}

impl Format {
    /// The name reports and the manifest use.
    pub fn name(self) -> &'static str {
        match self {
            Format::Plain => "plain",
            Format::PlainFp8 => "fp8 (unscaled)",
            Format::ScaledFp8 => "comfyui-scaled-fp8",
            Format::ComfyMixed => "comfyui-mixed-precision",
            Format::LightX2v => "lightx2v",
        }
    }
}

/// The legacy marker of a state dict: its name, when there is one.
pub fn scaled_fp8_marker(set: &TensorSet) -> Option<&str> {
    set.names()
        .find(|n| *n == SCALED_FP8_MARKER || n.ends_with(&format!(".{SCALED_FP8_MARKER}")))
}

/// True when `name` is a side tensor of some format (a scale or a marker), not a parameter.
pub fn is_side_tensor(name: &str) -> bool {
    name == SCALED_FP8_MARKER
        || name.ends_with(&format!(".{SCALED_FP8_MARKER}"))
        || SIDE_SUFFIXES.iter().any(|s| name.ends_with(s))
}

/// The layer a side tensor belongs to (`blocks.0.ffn.0.scale_weight` -> `blocks.0.ffn.0`).
pub fn side_layer(name: &str) -> Option<&str> {
    SIDE_SUFFIXES.iter().find_map(|s| name.strip_suffix(s))
}

/// A dtype no float reader may widen as a weight's value: integers, packed sub-byte floats,
/// E8M0 exponents and the FNUZ fp8 variants (no WAN runtime writes them).
pub fn is_coded(d: DType) -> bool {
    !matches!(
        d,
        DType::F64 | DType::F32 | DType::F16 | DType::BF16 | DType::F8_E4M3 | DType::F8_E5M2
    )
}

/// Why a state dict was not recognised as a format wanbake decodes: the tensor that gave it
/// away, and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unrecognised {
    /// The tensor (or header key).
    pub tensor: String,
    /// The format it belongs to, as far as can be told.
    pub format: &'static str,
    /// What was found.
    pub reason: String,
}

/// The format of a state dict from its names, dtypes and header metadata. Mixed precision
/// wins over a legacy marker when both are there, as ComfyUI's `convert_old_quants` lets the
/// header decide. Side tensors or coded weights that belong to no known convention are
/// [`Unrecognised`].
pub fn recognise(
    set: &TensorSet,
    metadata: &BTreeMap<String, String>,
) -> Result<Format, Unrecognised> {
    if metadata.contains_key(QUANT_METADATA) || set.names().any(|n| n.ends_with(COMFY_QUANT)) {
        return Ok(Format::ComfyMixed);
    }
    if scaled_fp8_marker(set).is_some() {
        return Ok(Format::ScaledFp8);
    }
    if set.names().any(|n| n.ends_with(WEIGHT_SCALE)) {
        return lightx2v_or_unknown(set);
    }
    if let Some(side) = set.names().find(|n| is_side_tensor(n)) {
        return Err(Unrecognised {
            tensor: side.to_string(),
            format: "unknown",
            reason: "is a quantization scale or marker, but the file has no `scaled_fp8` \
                     marker, no `.comfy_quant` markers and no `_quantization_metadata` header, \
                     so which format it belongs to (and how its weights decode) is unknown"
                .into(),
        });
    }
    let mut fp8 = false;
    for t in set.tensors() {
        if is_coded(t.view.dtype) {
            return Err(Unrecognised {
                tensor: t.view.name.to_string(),
                format: "unknown",
                reason: format!(
                    "is stored as {} codes with no format marker and no scale: its real \
                     values cannot be known",
                    t.view.dtype
                ),
            });
        }
        fp8 |= matches!(t.view.dtype, DType::F8_E4M3 | DType::F8_E5M2);
    }
    Ok(if fp8 { Format::PlainFp8 } else { Format::Plain })
}

/// LightX2V when every `weight_scale` is an F32 [out, 1] beside an I8 or F8_E4M3 weight of
/// `out` rows; otherwise the first that is not.
fn lightx2v_or_unknown(set: &TensorSet) -> Result<Format, Unrecognised> {
    let bad = |tensor: &str, reason: String| Unrecognised {
        tensor: tensor.to_string(),
        format: Format::LightX2v.name(),
        reason,
    };
    for name in set.names().filter(|n| n.ends_with(WEIGHT_SCALE)) {
        let layer = name.strip_suffix(WEIGHT_SCALE).unwrap_or(name);
        let scale = set.get(name).map(|t| t.view);
        let weight = set.get(&format!("{layer}.weight")).map(|t| t.view);
        let Some(w) = weight else {
            return Err(bad(name, format!("has no `{layer}.weight` beside it")));
        };
        let Some(s) = scale else { continue };
        if !matches!(w.dtype, DType::I8 | DType::F8_E4M3) || w.shape.len() != 2 {
            return Err(bad(
                name,
                format!(
                    "belongs to a {} {:?} weight; LightX2V's per-channel files hold I8 or \
                     F8_E4M3 [out, in] (and ComfyUI mixed precision needs `.comfy_quant` \
                     markers)",
                    w.dtype, w.shape
                ),
            ));
        }
        let float = matches!(s.dtype, DType::F32 | DType::BF16 | DType::F16);
        if !float || s.shape != [w.shape[0], 1] {
            return Err(bad(
                name,
                format!(
                    "expected an F32 / BF16 [{}, 1] per-row scale, found {} {:?}",
                    w.shape[0], s.dtype, s.shape
                ),
            ));
        }
    }
    Ok(Format::LightX2v)
}
