//! The per-layer formats of `comfy:*` (ComfyUI mixed precision) and `lightx2v:*` outputs:
//! what one quantized block Linear `<L>` is stored as (its `<L>.weight`, the side tensors
//! and, for ComfyUI, the `<L>.comfy_quant` marker and the `_quantization_metadata` header
//! entry), and encoding a band of its whole rows into those tensors.
//!
//! Owns: [`LayerFormat`] (one per format), the stored dtypes and shapes of each layer, the
//! marker bytes (`json.dumps(conf)` spelling) and where each band's bytes go in each tensor.
//! Does not own: the numbers (`codec::{fp8, nvfp4, mxfp8, int8}`, each byte-identical to
//! comfy-kitchen 0.2.40 / LightX2V @f8aee98), the names of markers and scales
//! (`quant::convention`), which tensors are block Linears (`quant::rules::is_block_linear`),
//! or the file (`quant::encode`, `pipeline`).
//!
//! What each stores for a logical `[n, k]` weight (comfy-kitchen's `state_dict_tensors()` as
//! ComfyUI's `_quantized_weight_state_dict` writes them; LightX2V's `quantize_model`):
//!
//! | codec | `weight` | `weight_scale` | other |
//! |---|---|---|---|
//! | comfy fp8 | F8_E4M3 [n, k] | F32 [] = max\|W\|/448 | `comfy_quant` `{"format": "float8_e4m3fn"}` |
//! | comfy nvfp4 | U8 [pad16(n), pad16(k)/2] | F8_E4M3 swizzled [128⌈·⌉, 4⌈·⌉] | `weight_scale_2` F32 [], `comfy_quant` `{"format": "nvfp4"}` |
//! | comfy mxfp8 | F8_E4M3 [pad32(n), pad32(k)] | U8 (E8M0 bytes) swizzled | `comfy_quant` `{"format": "mxfp8"}` |
//! | comfy int8 | I8 [n, k] | F32 [n, 1] per row | `comfy_quant` `{"format": "int8_tensorwise"}` |
//! | comfy int8 ConvRot | I8 [n, k] (rotated) | F32 [n, 1] per row | `comfy_quant` `{"format": "int8_tensorwise", "convrot": true, "convrot_groupsize": 256}` |
//! | lightx2v int8 / fp8 | I8 / F8_E4M3 [n, k] | F32 [n, 1] per row | none |
//!
//! Shapes: NVFP4 and MXFP8 pad a dimension that is not a multiple of their block with zeros
//! (comfy-kitchen's `TensorCoreNVFP4Layout` / `TensorCoreMXFP8Layout` `quantize` with
//! `pad_16x` / `pad_32x`, and ComfyUI loads the padded storage against the module's shape),
//! so no shape is refused; fp8, int8 and LightX2V have no block. ConvRot refuses
//! `in_features` not a multiple of 256, as comfy-kitchen's `_rotate_weight` raises. Refused,
//! with the reason:
//! an all-zero weight under comfy fp8 or nvfp4 (comfy-kitchen's per-tensor scale is 0 and it
//! writes NaN codes) and an MXFP8 block below 448·2^-127 (`codec::mxfp8::encode`).
//!
//! Bands: the per-row formats (int8, LightX2V) encode any run of whole rows on its own. The
//! swizzled scales of NVFP4 and MXFP8 are laid out in tiles of 128 rows, so a band must start
//! on a multiple of [`LayerFormat::row_align`] rows; comfy fp8 and NVFP4 need the whole
//! tensor's `max|W|` first ([`LayerFormat::tensor_scale`], passed to every band).

use crate::codec::blocked::blocked_shape;
use crate::codec::{CodecError, fp8, int8, mxfp8, nvfp4};
use crate::io::DType;
use crate::quant::convention::{COMFY_QUANT, WEIGHT_SCALE, WEIGHT_SCALE_2};
use crate::quant::rules::QuantFormat;

/// The per-layer format of a block Linear in a `comfy:*` or `lightx2v:*` output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerFormat {
    /// comfy-kitchen `TensorCoreFP8Layout` (`float8_e4m3fn`), per-tensor scale.
    ComfyFp8,
    /// comfy-kitchen `TensorCoreNVFP4Layout` (`nvfp4`).
    ComfyNvfp4,
    /// comfy-kitchen `TensorCoreMXFP8Layout` (`mxfp8`).
    ComfyMxfp8,
    /// comfy-kitchen `TensorWiseINT8Layout` (`int8_tensorwise`), `per_channel=True`.
    ComfyInt8,
    /// comfy-kitchen `TensorWiseINT8Layout` with `convrot=True, convrot_groupsize=256`, the
    /// rotation done exactly (`codec::int8::encode_convrot`).
    ComfyInt8ConvRot,
    /// LightX2V `QuantWeightINT8`.
    LightX2vInt8,
    /// LightX2V `QuantWeightFP8` (qtorch rounding).
    LightX2vFp8,
}

/// ConvRot's Hadamard group (comfy-kitchen's default `convrot_groupsize`, what Comfy-Org's
/// WAN file uses); `in_features` must be a multiple of it.
pub const CONVROT_GROUP: usize = 256;

/// The `.weight` suffix of a layer's stored weight.
const WEIGHT: &str = ".weight";

/// One tensor of a quantized layer: its suffix after the layer name, dtype and shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerTensor {
    /// `.weight`, `.weight_scale`, `.weight_scale_2` or `.comfy_quant`.
    pub suffix: &'static str,
    /// Stored dtype.
    pub dtype: DType,
    /// Stored shape.
    pub shape: Vec<usize>,
}

/// Bytes of one band for one tensor of the layer, at `offset` bytes into that tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerPart {
    /// Which tensor (see [`LayerTensor::suffix`]).
    pub suffix: &'static str,
    /// Byte offset in the tensor.
    pub offset: usize,
    /// The bytes.
    pub bytes: Vec<u8>,
}

impl LayerFormat {
    /// The codec of a per-layer format (`QuantFormat::is_per_layer`).
    pub fn of(format: QuantFormat) -> Option<LayerFormat> {
        Some(match format {
            QuantFormat::ComfyFp8 => LayerFormat::ComfyFp8,
            QuantFormat::ComfyNvfp4 => LayerFormat::ComfyNvfp4,
            QuantFormat::ComfyMxfp8 => LayerFormat::ComfyMxfp8,
            QuantFormat::ComfyInt8 => LayerFormat::ComfyInt8,
            QuantFormat::ComfyInt8ConvRot => LayerFormat::ComfyInt8ConvRot,
            QuantFormat::LightX2vInt8 => LayerFormat::LightX2vInt8,
            QuantFormat::LightX2vFp8 => LayerFormat::LightX2vFp8,
            _ => return None,
        })
    }

    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            LayerFormat::ComfyFp8 => "comfy float8_e4m3fn",
            LayerFormat::ComfyNvfp4 => "comfy nvfp4",
            LayerFormat::ComfyMxfp8 => "comfy mxfp8",
            LayerFormat::ComfyInt8 => "comfy int8_tensorwise",
            LayerFormat::ComfyInt8ConvRot => "comfy int8_tensorwise convrot",
            LayerFormat::LightX2vInt8 => "lightx2v int8",
            LayerFormat::LightX2vFp8 => "lightx2v fp8",
        }
    }

    /// The layer's `comfy_quant` JSON as ComfyUI's `_quantized_weight_state_dict` writes it
    /// (`json.dumps(quant_conf)`: `{"format": ...}`, ConvRot then `"convrot": true,
    /// "convrot_groupsize": 256`, Python's `", "` / `": "` separators); `None` for LightX2V,
    /// whose files carry no marker.
    pub fn comfy_quant(self) -> Option<String> {
        use crate::quant::convention as c;
        let format = match self {
            LayerFormat::ComfyFp8 => c::COMFY_FORMAT_FP8,
            LayerFormat::ComfyNvfp4 => c::COMFY_FORMAT_NVFP4,
            LayerFormat::ComfyMxfp8 => c::COMFY_FORMAT_MXFP8,
            LayerFormat::ComfyInt8 | LayerFormat::ComfyInt8ConvRot => c::COMFY_FORMAT_INT8,
            LayerFormat::LightX2vInt8 | LayerFormat::LightX2vFp8 => return None,
        };
        let convrot = match self {
            LayerFormat::ComfyInt8ConvRot => {
                format!(", \"convrot\": true, \"convrot_groupsize\": {CONVROT_GROUP}")
            }
            _ => String::new(),
        };
        Some(format!("{{\"format\": {}{convrot}}}", json_str(format)))
    }

    /// True when the whole tensor's `max|W|` is needed before any band is encoded.
    pub fn needs_amax(self) -> bool {
        matches!(self, LayerFormat::ComfyFp8 | LayerFormat::ComfyNvfp4)
    }

    /// A band must start on a multiple of this many rows (the 128-row tiles of the swizzled
    /// block scales).
    pub fn row_align(self) -> usize {
        match self {
            LayerFormat::ComfyNvfp4 | LayerFormat::ComfyMxfp8 => 128,
            _ => 1,
        }
    }

    /// True when any run of whole rows can be encoded on its own.
    pub fn streams(self) -> bool {
        !self.needs_amax() && self.row_align() == 1
    }

    /// The per-tensor scale of a weight whose `max|W|` is `amax` (comfy fp8: `amax / 448`,
    /// NVFP4: `amax / 2688`, both one f32 division as comfy-kitchen computes them); `None`
    /// for the codecs without one. An all-zero weight is refused.
    pub fn tensor_scale(self, amax: f32) -> Result<Option<f32>, CodecError> {
        let scale = match self {
            LayerFormat::ComfyFp8 => amax / fp8::E4M3_MAX,
            LayerFormat::ComfyNvfp4 => nvfp4::tensor_scale_for(amax),
            _ => return Ok(None),
        };
        if !(scale.is_finite() && scale > 0.0) {
            return Err(CodecError::Unrepresentable(format!(
                "{} of a weight whose max |W| is {amax}: comfy-kitchen's per-tensor scale is \
                 {scale} and its codes NaN",
                self.name()
            )));
        }
        Ok(Some(scale))
    }

    /// The stored tensors of a layer whose logical weight is `[n, k]`, weight first.
    pub fn tensors(self, n: usize, k: usize) -> Result<Vec<LayerTensor>, CodecError> {
        let t = |suffix, dtype, shape: &[usize]| LayerTensor {
            suffix,
            dtype,
            shape: shape.to_vec(),
        };
        let mut v = match self {
            LayerFormat::ComfyFp8 => vec![
                t(WEIGHT, DType::F8_E4M3, &[n, k]),
                t(WEIGHT_SCALE, DType::F32, &[]),
            ],
            LayerFormat::ComfyNvfp4 => {
                let [rows, cols] = nvfp4::stored_shape(n, k)?;
                vec![
                    t(WEIGHT, DType::U8, &[rows, cols / 2]),
                    t(
                        WEIGHT_SCALE,
                        DType::F8_E4M3,
                        &blocked_shape(rows, cols / nvfp4::BLOCK)?,
                    ),
                    t(WEIGHT_SCALE_2, DType::F32, &[]),
                ]
            }
            LayerFormat::ComfyMxfp8 => {
                let [rows, cols] = mxfp8::stored_shape(n, k)?;
                vec![
                    t(WEIGHT, DType::F8_E4M3, &[rows, cols]),
                    t(
                        WEIGHT_SCALE,
                        DType::U8,
                        &blocked_shape(rows, cols / mxfp8::BLOCK)?,
                    ),
                ]
            }
            LayerFormat::ComfyInt8 | LayerFormat::ComfyInt8ConvRot | LayerFormat::LightX2vInt8 => {
                vec![
                    t(WEIGHT, DType::I8, &[n, k]),
                    t(WEIGHT_SCALE, DType::F32, &[n, 1]),
                ]
            }
            LayerFormat::LightX2vFp8 => vec![
                t(WEIGHT, DType::F8_E4M3, &[n, k]),
                t(WEIGHT_SCALE, DType::F32, &[n, 1]),
            ],
        };
        if let Some(marker) = self.comfy_quant() {
            v.push(t(COMFY_QUANT, DType::U8, &[marker.len()]));
        }
        Ok(v)
    }

    /// Encodes rows `r0 ..` of a layer (`w`: whole rows of `k` values, `r0` a multiple of
    /// [`LayerFormat::row_align`]) and writes the values a loader dequantizes into `y`.
    /// `tensor_scale` is [`LayerFormat::tensor_scale`] of the whole tensor where the codec
    /// has one (`None`: taken from `w`, which must then be the whole tensor). Returns the
    /// bytes of each tensor the band covers; the per-tensor ones (scalar scales, the marker)
    /// with the band at row 0.
    pub fn encode_rows(
        self,
        w: &[f32],
        r0: usize,
        k: usize,
        tensor_scale: Option<f32>,
        y: &mut [f32],
    ) -> Result<Vec<LayerPart>, CodecError> {
        let rows = w.len().checked_div(k).unwrap_or(0);
        crate::codec::check_len("layer band", rows * k, w.len())?;
        crate::codec::check_multiple("band's first row", r0, self.row_align())?;
        // Refused whatever `--nonfinite` says: no codec here has a code for it.
        crate::codec::check_finite(w).map_err(|e| match e {
            CodecError::NonFinite { index, value } => CodecError::NonFinite {
                index: index + r0 * k,
                value,
            },
            e => e,
        })?;
        let scale = match (tensor_scale, self.needs_amax()) {
            (Some(s), true) => Some(s),
            (None, true) => self.tensor_scale(fp8::amax(w))?,
            (_, false) => None,
        };
        let part = |suffix, offset, bytes| LayerPart {
            suffix,
            offset,
            bytes,
        };
        let f32_bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let mut parts = Vec::new();
        match self {
            LayerFormat::ComfyFp8 => {
                let s = scale.unwrap_or(1.0);
                let mut q = vec![0u8; w.len()];
                fp8::encode_comfy(w, s, &mut q);
                fp8::decode_scaled(&q, s, y);
                parts.push(part(WEIGHT, r0 * k, q));
                if r0 == 0 {
                    parts.push(part(WEIGHT_SCALE, 0, s.to_le_bytes().to_vec()));
                }
            }
            LayerFormat::ComfyNvfp4 => {
                let s = scale.unwrap_or(1.0);
                let e = nvfp4::encode_with_scale(w, rows, k, s)?;
                nvfp4::decode_into(&e.weight, &e.block_scales, s, e.stored, [rows, k], y)?;
                parts.push(part(WEIGHT, r0 * e.stored[1] / 2, e.weight));
                parts.push(part(WEIGHT_SCALE, r0 * e.scale_shape[1], e.block_scales));
                if r0 == 0 {
                    parts.push(part(WEIGHT_SCALE_2, 0, s.to_le_bytes().to_vec()));
                }
            }
            LayerFormat::ComfyMxfp8 => {
                let e = mxfp8::encode(w, rows, k)?;
                mxfp8::decode_into(&e.codes, &e.scales, e.stored, [rows, k], y)?;
                parts.push(part(WEIGHT, r0 * e.stored[1], e.codes));
                parts.push(part(WEIGHT_SCALE, r0 * e.scale_shape[1], e.scales));
            }
            _ => {
                let (q, s) = match self {
                    LayerFormat::ComfyInt8 => int8::encode_rowwise(w, rows, k)?,
                    LayerFormat::ComfyInt8ConvRot => {
                        int8::encode_convrot(w, rows, k, CONVROT_GROUP)?
                    }
                    LayerFormat::LightX2vInt8 => int8::encode_rowwise_lightx2v(w, rows, k)?,
                    _ => mxfp8::encode_fp8_rowwise_lightx2v(w, rows, k)?,
                };
                match self {
                    LayerFormat::LightX2vFp8 => mxfp8::decode_fp8_rowwise_into(&q, &s, rows, k, y)?,
                    LayerFormat::ComfyInt8ConvRot => {
                        let s = int8::Scale::Rows(&s);
                        int8::decode_convrot_into(&q, s, rows, k, CONVROT_GROUP, y)?
                    }
                    _ => int8::decode_into(&q, int8::Scale::Rows(&s), rows, k, y)?,
                }
                parts.push(part(WEIGHT, r0 * k, q));
                parts.push(part(WEIGHT_SCALE, r0 * 4, f32_bytes(&s)));
            }
        }
        if let (Some(marker), 0) = (self.comfy_quant(), r0) {
            parts.push(part(COMFY_QUANT, 0, marker.into_bytes()));
        }
        Ok(parts)
    }
}

/// The `_quantization_metadata` header value of a file whose quantized layers are
/// `layers` (`(layer, comfy_quant JSON)`), as `convert_old_quants` reads it and as
/// convert_to_quant's `--save-quant-metadata` writes it beside the markers:
/// `json.dumps({"format_version": "1.0", "layers": {<L>: conf, ...}})`, layers in the order
/// given.
pub fn quantization_metadata<'a>(layers: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    let entries: Vec<String> = layers
        .map(|(l, conf)| format!("{}: {conf}", json_str(l)))
        .collect();
    format!(
        "{{\"format_version\": \"1.0\", \"layers\": {{{}}}}}",
        entries.join(", ")
    )
}

/// A JSON string literal (ASCII names: Python's `json.dumps` spells them the same).
fn json_str(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_are_spelled_as_python_json_dumps() {
        let nv = LayerFormat::ComfyNvfp4.comfy_quant().unwrap();
        assert_eq!(nv, r#"{"format": "nvfp4"}"#);
        assert_eq!(
            LayerFormat::ComfyInt8ConvRot.comfy_quant().unwrap(),
            r#"{"format": "int8_tensorwise", "convrot": true, "convrot_groupsize": 256}"#
        );
        assert_eq!(LayerFormat::LightX2vFp8.comfy_quant(), None);
        let h = quantization_metadata(
            [("blocks.0.ffn.0", &nv[..]), ("blocks.0.ffn.2", &nv)].into_iter(),
        );
        assert_eq!(
            h,
            r#"{"format_version": "1.0", "layers": {"blocks.0.ffn.0": {"format": "nvfp4"}, "blocks.0.ffn.2": {"format": "nvfp4"}}}"#
        );
        let v: serde_json::Value = serde_json::from_str(&h).unwrap();
        assert_eq!(v["layers"]["blocks.0.ffn.2"]["format"], "nvfp4");
    }

    /// Bands of 128 rows (the swizzle's tiles) give the whole tensor's bytes, for every
    /// codec, with a ragged last band and padded shapes.
    #[test]
    fn bands_give_the_whole_tensors_bytes() {
        let (n, k) = (300, 256);
        let mut rng = crate::rng::SplitMix64::new(41);
        let w: Vec<f32> = (0..n * k).map(|_| rng.signed_f32()).collect();
        for codec in [
            LayerFormat::ComfyFp8,
            LayerFormat::ComfyNvfp4,
            LayerFormat::ComfyMxfp8,
            LayerFormat::ComfyInt8,
            LayerFormat::ComfyInt8ConvRot,
            LayerFormat::LightX2vInt8,
            LayerFormat::LightX2vFp8,
        ] {
            let tensors = codec.tensors(n, k).unwrap();
            let mut whole_y = vec![0f32; w.len()];
            let whole = codec.encode_rows(&w, 0, k, None, &mut whole_y).unwrap();
            let s = codec.tensor_scale(fp8::amax(&w)).unwrap();
            let mut banded: Vec<Vec<u8>> = tensors.iter().map(|_| Vec::new()).collect();
            for (i, band) in w.chunks(128 * k).enumerate() {
                let mut y = vec![0f32; band.len()];
                for p in codec.encode_rows(band, i * 128, k, s, &mut y).unwrap() {
                    let t = tensors.iter().position(|t| t.suffix == p.suffix).unwrap();
                    assert_eq!(p.offset, banded[t].len(), "{codec:?} {}", p.suffix);
                    banded[t].extend(p.bytes);
                }
                assert_eq!(y[..], whole_y[i * 128 * k..][..band.len()], "{codec:?}");
            }
            for (t, bytes) in tensors.iter().zip(&banded) {
                let want = whole.iter().find(|p| p.suffix == t.suffix).unwrap();
                assert_eq!(bytes, &want.bytes, "{codec:?} {}", t.suffix);
                let size: usize = t.shape.iter().product::<usize>() * t.dtype.size().unwrap();
                assert_eq!(bytes.len(), size, "{codec:?} {} size", t.suffix);
            }
        }
    }
}
