//! Which encoding each tensor of an original-Wan checkpoint gets in a quantized output, and
//! why: ComfyUI's scaled fp8 (spec quant_formats.md §1.8) and city96's ComfyUI-GGUF files
//! (§2.4, the rules of `tools/convert.py`, the patched `llama-quantize` and
//! `fix_5d_tensors.py`, applied in one step).
//!
//! Owns: the quantized output formats (`QuantFormat`), their names on the command line, the
//! GGUF `general.file_type` of each, and the per-tensor decision with its reason. Does not
//! own: the encodings (`codec`), the GGUF container (`format::gguf`) or the name mapping from
//! diffusers (`model::wan_names`).

use std::fmt;

use crate::codec::ggml::GgmlType;
use crate::io::DType;
use crate::model::transform::Transform;
use crate::model::wan_layout::Layout;
use crate::model::wan_names;

/// A quantized output format.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantFormat {
    /// ComfyUI scaled fp8 safetensors.
    Fp8Scaled,
    /// GGUF with Q8_0 weights.
    GgufQ8_0,
    /// GGUF with Q4_0 weights (Q4_1 for ffn down).
    GgufQ4_0,
    /// GGUF with Q5_0 weights (Q5_1 for ffn down).
    GgufQ5_0,
    /// GGUF, BF16 weights.
    GgufBf16,
    /// GGUF, F16 weights.
    GgufF16,
    /// GGUF, llama.cpp's Q2_K mix (v projections Q3_K).
    GgufQ2K,
    /// GGUF, llama.cpp's Q3_K_S mix (Q3_K throughout).
    GgufQ3KS,
    /// GGUF, llama.cpp's Q3_K_M mix (the first 2 v projections Q5_K, the others Q4_K; ffn
    /// down Q4_K).
    GgufQ3KM,
    /// GGUF, llama.cpp's Q4_K_S mix (the first 4 v projections Q5_K; ffn down Q5_K).
    GgufQ4KS,
    /// GGUF, llama.cpp's Q4_K_M mix (v projections and ffn down Q6_K).
    GgufQ4KM,
    /// GGUF, llama.cpp's Q5_K_S mix (Q5_K throughout).
    GgufQ5KS,
    /// GGUF, llama.cpp's Q5_K_M mix (v projections and ffn down Q6_K).
    GgufQ5KM,
    /// GGUF, Q6_K throughout.
    GgufQ6K,
    /// ComfyUI mixed precision, `float8_e4m3fn` block Linears (per-tensor scale).
    ComfyFp8,
    /// ComfyUI mixed precision, `nvfp4` block Linears.
    ComfyNvfp4,
    /// ComfyUI mixed precision, `mxfp8` block Linears.
    ComfyMxfp8,
    /// ComfyUI mixed precision, `int8_tensorwise` block Linears with a per-row scale.
    ComfyInt8,
    /// ComfyUI mixed precision, `int8_tensorwise` with ConvRot (group-256 Hadamard rotation).
    ComfyInt8ConvRot,
    /// LightX2V's converter, `--linear_type int8`.
    LightX2vInt8,
    /// LightX2V's converter, `--linear_type fp8`.
    LightX2vFp8,
}

impl QuantFormat {
    /// Every format, in the order `--help` lists them: a closed set (each GGUF block type is
    /// its own value), so `--to` is a `clap::ValueEnum` like every other enumerated flag.
    pub const ALL: [QuantFormat; 21] = [
        QuantFormat::Fp8Scaled,
        QuantFormat::GgufQ8_0,
        QuantFormat::GgufQ4_0,
        QuantFormat::GgufQ5_0,
        QuantFormat::GgufBf16,
        QuantFormat::GgufF16,
        QuantFormat::GgufQ2K,
        QuantFormat::GgufQ3KS,
        QuantFormat::GgufQ3KM,
        QuantFormat::GgufQ4KS,
        QuantFormat::GgufQ4KM,
        QuantFormat::GgufQ5KS,
        QuantFormat::GgufQ5KM,
        QuantFormat::GgufQ6K,
        QuantFormat::ComfyFp8,
        QuantFormat::ComfyNvfp4,
        QuantFormat::ComfyMxfp8,
        QuantFormat::ComfyInt8,
        QuantFormat::ComfyInt8ConvRot,
        QuantFormat::LightX2vInt8,
        QuantFormat::LightX2vFp8,
    ];

    /// The spelling of `--to` and of recipes' `output.to` (`fp8-scaled`, `gguf:q8_0`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            QuantFormat::Fp8Scaled => "fp8-scaled",
            QuantFormat::GgufQ8_0 => "gguf:q8_0",
            QuantFormat::GgufQ4_0 => "gguf:q4_0",
            QuantFormat::GgufQ5_0 => "gguf:q5_0",
            QuantFormat::GgufBf16 => "gguf:bf16",
            QuantFormat::GgufF16 => "gguf:f16",
            QuantFormat::GgufQ2K => "gguf:q2_k",
            QuantFormat::GgufQ3KS => "gguf:q3_k_s",
            QuantFormat::GgufQ3KM => "gguf:q3_k_m",
            QuantFormat::GgufQ4KS => "gguf:q4_k_s",
            QuantFormat::GgufQ4KM => "gguf:q4_k_m",
            QuantFormat::GgufQ5KS => "gguf:q5_k_s",
            QuantFormat::GgufQ5KM => "gguf:q5_k_m",
            QuantFormat::GgufQ6K => "gguf:q6_k",
            QuantFormat::ComfyFp8 => "comfy:fp8",
            QuantFormat::ComfyNvfp4 => "comfy:nvfp4",
            QuantFormat::ComfyMxfp8 => "comfy:mxfp8",
            QuantFormat::ComfyInt8 => "comfy:int8",
            QuantFormat::ComfyInt8ConvRot => "comfy:int8-convrot",
            QuantFormat::LightX2vInt8 => "lightx2v:int8",
            QuantFormat::LightX2vFp8 => "lightx2v:fp8",
        }
    }

    /// True for the GGUF formats.
    pub fn is_gguf(self) -> bool {
        self.as_str().starts_with("gguf:")
    }

    /// True for the formats that quantize only the block Linears and store each with its
    /// side tensors (`comfy:*`, `lightx2v:*`: `quant::layer_format`).
    pub fn is_per_layer(self) -> bool {
        !self.is_gguf() && self != QuantFormat::Fp8Scaled
    }

    /// True for the GGUF formats that quantize nothing (`gguf:bf16`, `gguf:f16`).
    pub fn is_plain_gguf(self) -> bool {
        matches!(self, QuantFormat::GgufBf16 | QuantFormat::GgufF16)
    }

    /// llama.cpp's `LlamaFileType` for `general.file_type` (GGUF formats only; gguf-py's
    /// `LlamaFileType`, spec quant_formats.md §2.2 and K.2).
    pub fn file_type(self) -> Option<u32> {
        match self {
            QuantFormat::Fp8Scaled
            | QuantFormat::ComfyFp8
            | QuantFormat::ComfyNvfp4
            | QuantFormat::ComfyMxfp8
            | QuantFormat::ComfyInt8
            | QuantFormat::ComfyInt8ConvRot
            | QuantFormat::LightX2vInt8
            | QuantFormat::LightX2vFp8 => None,
            QuantFormat::GgufF16 => Some(1),
            QuantFormat::GgufQ4_0 => Some(2),
            QuantFormat::GgufQ8_0 => Some(7),
            QuantFormat::GgufQ5_0 => Some(8),
            QuantFormat::GgufQ2K => Some(10),
            QuantFormat::GgufQ3KS => Some(11),
            QuantFormat::GgufQ3KM => Some(12),
            QuantFormat::GgufQ4KS => Some(14),
            QuantFormat::GgufQ4KM => Some(15),
            QuantFormat::GgufQ5KS => Some(16),
            QuantFormat::GgufQ5KM => Some(17),
            QuantFormat::GgufQ6K => Some(18),
            QuantFormat::GgufBf16 => Some(32),
        }
    }

    /// The format whose `general.file_type` is `ftype`, if wanbake writes one.
    pub fn of_file_type(ftype: u64) -> Option<QuantFormat> {
        (QuantFormat::ALL.into_iter()).find(|f| f.file_type().map(u64::from) == Some(ftype))
    }

    /// The block type the patched llama-quantize gives a tensor of this ftype that no mix
    /// rule changes (llama.cpp's ftype switch), for the quantized GGUF formats.
    fn block_type(self) -> Option<GgmlType> {
        match self {
            QuantFormat::GgufQ8_0 => Some(GgmlType::Q8_0),
            QuantFormat::GgufQ4_0 => Some(GgmlType::Q4_0),
            QuantFormat::GgufQ5_0 => Some(GgmlType::Q5_0),
            QuantFormat::GgufQ2K => Some(GgmlType::Q2_K),
            QuantFormat::GgufQ3KS | QuantFormat::GgufQ3KM => Some(GgmlType::Q3_K),
            QuantFormat::GgufQ4KS | QuantFormat::GgufQ4KM => Some(GgmlType::Q4_K),
            QuantFormat::GgufQ5KS | QuantFormat::GgufQ5KM => Some(GgmlType::Q5_K),
            QuantFormat::GgufQ6K => Some(GgmlType::Q6_K),
            _ => None,
        }
    }
}

impl fmt::Display for QuantFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for QuantFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<QuantFormat, String> {
        crate::names::find(&QuantFormat::ALL, QuantFormat::as_str, s).ok_or_else(|| {
            let all: Vec<&str> = QuantFormat::ALL.iter().map(|f| f.as_str()).collect();
            format!("unknown format `{s}` (one of: {})", all.join(", "))
        })
    }
}

crate::names::value_enum!(QuantFormat);

/// Why a tensor got its encoding (written into the quantization report).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// A block-quantized Linear weight.
    Quantized,
    /// `.ffn.2.weight` under Q4_0 / Q5_0: llama-quantize's ffn-down rule bumps it to Q4_1 / Q5_1.
    FfnDownBump,
    /// A v projection under a K mix whose v rule gives it another type (Q2_K → Q3_K; Q3_K_M:
    /// Q5_K for the first 2, Q4_K after; Q4_K_S: Q5_K for the first 4; Q4_K_M, Q5_K_M: Q6_K).
    MixV,
    /// ffn down under a K mix whose ffn rule gives it another type (Q3_K_M → Q4_K, Q4_K_S →
    /// Q5_K, Q4_K_M and Q5_K_M → Q6_K).
    MixFfnDown,
    /// A fused qkv projection under a K mix whose qkv rule gives it another type (no Wan
    /// tensor is one).
    MixQkv,
    /// One dimension: F32 (convert.py).
    OneD,
    /// At most 1024 elements: F32 (convert.py's QUANTIZATION_THRESHOLD).
    Small,
    /// A `.modulation` tensor: F32 (convert.py's `keys_hiprec`).
    Modulation,
    /// More than 4 dimensions (the Conv3d patch embedding): F32, full shape (fix_5d_tensors.py).
    FiveD,
    /// A name the patched llama-quantize never quantizes for Wan (embeddings, head, ...).
    NeverQuantized,
    /// Not a 2-D `...weight` (llama-quantize's gates).
    NotA2dWeight,
    /// Rows are not a whole number of 32-blocks: the F16 fallback.
    PartialBlocks,
    /// Rows are not a whole number of 256-element super-blocks: a K type falls back to F16.
    PartialSuperBlocks,
    /// The plain GGUF formats (`gguf:bf16`, `gguf:f16`): the format's own type.
    Plain,
    /// fp8-scaled: an nn.Linear weight as F8_E4M3 with its `scale_weight`.
    Fp8Linear,
    /// fp8-scaled: not an nn.Linear weight (bias, norm, modulation, Conv3d): high precision.
    HighPrecision,
    /// comfy:* / lightx2v:*: a block Linear weight, in the format with its side tensors.
    BlockLinear,
    /// comfy:* / lightx2v:*: not a block Linear weight: high precision (`--dtype`).
    NotBlockLinear,
}

impl Why {
    /// A short explanation for reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Why::Quantized => "quantized: 2-D Linear weight",
            Why::FfnDownBump => "quantized: ffn down (.ffn.2.weight) bumped to the _1 type",
            Why::MixV => "quantized: v projection, the mix's type for it",
            Why::MixFfnDown => "quantized: ffn down (.ffn.2.weight), the mix's type for it",
            Why::MixQkv => "quantized: fused qkv projection, the mix's type for it",
            Why::OneD => "kept: 1-D tensor (F32)",
            Why::Small => "kept: at most 1024 elements (F32)",
            Why::Modulation => "kept: modulation (F32)",
            Why::FiveD => "kept: 5-D patch embedding, full shape (F32)",
            Why::NeverQuantized => "kept: name never quantized for Wan (embedding/head/patch)",
            Why::NotA2dWeight => "kept: not a 2-D weight",
            Why::PartialBlocks => {
                "kept: rows are not whole 32-element blocks (step-1 type, F16 fallback)"
            }
            Why::PartialSuperBlocks => {
                "kept: rows are not whole 256-element super-blocks (F16 fallback)"
            }
            Why::Plain => "plain: the format's float type",
            Why::Fp8Linear => "quantized: nn.Linear weight, F8_E4M3 + scale_weight",
            Why::HighPrecision => "kept: not an nn.Linear weight (high precision)",
            Why::BlockLinear => "quantized: block Linear weight, with its side tensors",
            Why::NotBlockLinear => "kept: not a block Linear weight (high precision)",
        }
    }
}

/// The GGUF decision for one tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GgufChoice {
    /// The type written.
    pub ty: GgmlType,
    /// The type city96's step 1 (convert.py) writes; a block type quantizes this rounding of
    /// the weights when byte-compatibility with city96's files is asked for.
    pub step1: GgmlType,
    /// Why.
    pub why: Why,
}

/// Names the patched llama-quantize never quantizes for arch `wan` (spec §2.4).
const WAN_NEVER: [&str; 7] = [
    "modulation.",
    "patch_embedding.",
    "text_embedding.",
    "time_projection.",
    "time_embedding.",
    "img_emb.",
    "head.",
];

/// The GGUF type of tensor `name` (original-Wan name, torch `shape`) in `format`.
/// `high_precision` is convert.py's step-1 type of a 2-D tensor above 1024 elements (F16,
/// or BF16 when the source tensor is stored as BF16; F32 for city96's published files: see
/// [`GgufMix::new`]). `v_seen` is how many v projections llama-quantize visited before this
/// tensor (`qs.i_attention_wv`; [`GgufMix`] counts them in its order).
pub fn gguf_choice(
    format: QuantFormat,
    name: &str,
    shape: &[usize],
    high_precision: GgmlType,
    v_seen: usize,
) -> GgufChoice {
    let numel: usize = shape.iter().product();
    let f32 = |why| GgufChoice {
        ty: GgmlType::F32,
        step1: GgmlType::F32,
        why,
    };
    if shape.len() <= 1 {
        return f32(Why::OneD);
    }
    if numel <= 1024 && shape.len() <= 4 {
        // A small 2-D weight is still quantized by step 2 when its name allows (below).
        if format.block_type().is_none() || !quantizable(name, shape) {
            return f32(Why::Small);
        }
    }
    if name.contains(".modulation") {
        return f32(Why::Modulation);
    }
    if shape.len() > 4 {
        return f32(Why::FiveD);
    }
    let base = match format {
        QuantFormat::GgufBf16 => GgmlType::BF16,
        QuantFormat::GgufF16 => GgmlType::F16,
        _ => high_precision,
    };
    let step1 = if numel <= 1024 { GgmlType::F32 } else { base };
    let Some(block) = format.block_type() else {
        return GgufChoice {
            ty: base,
            step1,
            why: Why::Plain,
        };
    };
    if !quantizable(name, shape) {
        let why = if name.ends_with("weight") && shape.len() == 2 {
            Why::NeverQuantized
        } else {
            Why::NotA2dWeight
        };
        return GgufChoice {
            ty: base,
            step1,
            why,
        };
    }
    if !block.is_k_quant() && !shape[shape.len() - 1].is_multiple_of(32) {
        // "stays as step 1 wrote it": F16 (or BF16) in practice, F32 when small.
        return GgufChoice {
            ty: step1,
            step1,
            why: Why::PartialBlocks,
        };
    }
    let (ty, why) = mix_type(format, block, name, v_seen);
    if ty.is_k_quant() && !shape[shape.len() - 1].is_multiple_of(256) {
        // lcpp.patch lines 227-253: a K type on rows of partial super-blocks is F16.
        return GgufChoice {
            ty: GgmlType::F16,
            step1,
            why: Why::PartialSuperBlocks,
        };
    }
    GgufChoice { ty, step1, why }
}

/// Which group of `img_tensor_get_type`'s rules a tensor name falls in (lcpp.patch lines
/// 155-225: the first group whose substring matches).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MixGroup {
    /// "Rules for to_v attention" (155-178): counted in `qs.i_attention_wv`.
    V,
    /// "Rules for fused qkv attention" (179-192).
    Qkv,
    /// "Rules for ffn" (193-225).
    FfnDown,
    /// Everything else: the ftype's default type.
    Other,
}

fn mix_group(name: &str) -> MixGroup {
    let has = |p: &str| name.contains(p);
    const V: [&str; 6] = [
        "attn_v.weight",
        ".to_v.weight",
        ".v.weight",
        ".attn.w1v.weight",
        ".attn.w2v.weight",
        "_attn.v_proj.weight",
    ];
    const QKV: [&str; 3] = ["attn_qkv.weight", "attn.qkv.weight", "attention.qkv.weight"];
    const FFN: [&str; 6] = [
        "ffn_down",
        ".ffn.2.weight",
        ".ff.net.2.weight",
        ".mlp.layer2.weight",
        ".adaln_modulation_mlp.2.weight",
        ".feed_forward.w2.weight",
    ];
    if V.iter().any(|p| has(p)) {
        MixGroup::V
    } else if QKV.iter().any(|p| has(p)) {
        MixGroup::Qkv
    } else if FFN.iter().any(|p| has(p)) || (has("experts.") && has(".w2.weight")) {
        MixGroup::FfnDown
    } else {
        MixGroup::Other
    }
}

/// `img_tensor_get_type` (lcpp.patch lines 129-225) for a tensor that reaches it: the
/// ftype's `block` type, or the type its group's rule gives under `format`.
fn mix_type(format: QuantFormat, block: GgmlType, name: &str, v_seen: usize) -> (GgmlType, Why) {
    use GgmlType as G;
    use QuantFormat as F;
    let group = mix_group(name);
    let ruled = match (group, format) {
        (MixGroup::V, F::GgufQ2K) => G::Q3_K,
        (MixGroup::V, F::GgufQ3KM) if v_seen < 2 => G::Q5_K,
        (MixGroup::V, F::GgufQ3KM) => G::Q4_K,
        (MixGroup::V, F::GgufQ4KM | F::GgufQ5KM) => G::Q6_K,
        (MixGroup::V, F::GgufQ4KS) if v_seen < 4 => G::Q5_K,
        (MixGroup::Qkv, F::GgufQ3KM) => G::Q4_K,
        (MixGroup::Qkv, F::GgufQ4KM) => G::Q5_K,
        (MixGroup::Qkv, F::GgufQ5KM) => G::Q6_K,
        (MixGroup::FfnDown, F::GgufQ3KM) => G::Q4_K,
        (MixGroup::FfnDown, F::GgufQ4KS) => G::Q5_K,
        (MixGroup::FfnDown, F::GgufQ4KM | F::GgufQ5KM) => G::Q6_K,
        (MixGroup::FfnDown, F::GgufQ4_0) => G::Q4_1,
        (MixGroup::FfnDown, F::GgufQ5_0) => G::Q5_1,
        _ => block,
    };
    let why = match group {
        _ if ruled == block => Why::Quantized,
        MixGroup::FfnDown if !ruled.is_k_quant() => Why::FfnDownBump,
        MixGroup::FfnDown => Why::MixFfnDown,
        MixGroup::V => Why::MixV,
        MixGroup::Qkv => Why::MixQkv,
        MixGroup::Other => Why::Quantized,
    };
    (ruled, why)
}

/// The GGUF types of a whole checkpoint, tensor by tensor in the order llama-quantize visits
/// them (byte-wise name order, spec quant_formats.md K.2): counts the v projections that
/// reach the mix rules, so "the first N" are the ones llama-quantize would bump.
#[derive(Clone, Debug)]
pub struct GgufMix {
    format: QuantFormat,
    high_precision: Option<GgmlType>,
    v_seen: usize,
}

impl GgufMix {
    /// A mix of `format`, before the first tensor. `high_precision` sets convert.py's step-1
    /// type of every 2-D tensor above 1024 elements; `None` follows convert.py (F16, or BF16
    /// for a tensor stored as BF16).
    pub fn new(format: QuantFormat, high_precision: Option<GgmlType>) -> GgufMix {
        GgufMix {
            format,
            high_precision,
            v_seen: 0,
        }
    }

    /// The type of the next tensor in visiting order, stored as `source` (see
    /// [`gguf_choice`]).
    pub fn choose(&mut self, name: &str, shape: &[usize], source: DType) -> GgufChoice {
        let high_precision = self.high_precision.unwrap_or(match source {
            DType::BF16 => GgmlType::BF16,
            _ => GgmlType::F16,
        });
        let c = gguf_choice(self.format, name, shape, high_precision, self.v_seen);
        // Counted for every v projection that reaches the rules, also when it then falls
        // back to F16 (lcpp.patch line 178).
        if self.format.block_type().is_some()
            && quantizable(name, shape)
            && mix_group(name) == MixGroup::V
        {
            self.v_seen += 1;
        }
        c
    }
}

/// llama-quantize's gates with city96's Wan patch: a 2-D `...weight` whose name contains
/// none of [`WAN_NEVER`].
fn quantizable(name: &str, shape: &[usize]) -> bool {
    name.ends_with("weight") && shape.len() == 2 && !WAN_NEVER.iter().any(|p| name.contains(p))
}

/// True when `name` (an original-Wan name without prefix) is the weight of an nn.Linear,
/// which fp8-scaled stores as F8_E4M3 (spec §1.8: "every nn.Linear weight"): in the name
/// table, the rows whose NNX form is a transposed kernel. That is block attention q/k/v/o
/// (and k_img/v_img), ffn.0/ffn.2, text/time embeddings, time projection, head and
/// img_emb.proj.{1,3}; in a VACE model the same modules of every VACE block plus
/// before_proj/after_proj; in SkyReels-V2 fps_projection.{0,2}; in Wan2.2-Animate
/// `face_encoder.out_proj` and `face_adapter.fuser_blocks.N.{linear1_kv,linear1_q,linear2}`,
/// the layers comfyanonymous/ComfyUI@4cdaa373 comfy/ldm/wan/model_animate.py builds with
/// `operations.Linear` (scaled fp8 reaches only comfy-ops layers). Its motion encoder's
/// EqualLinear / EqualConv2d / Direction hold plain Parameters there (stored as-is in the NNX
/// form too, so not transposed kernels) and stay high precision.
pub fn is_fp8_linear(name: &str, shape: &[usize]) -> bool {
    shape.len() == 2
        && wan_names::parse_stored(Layout::Wan, name).is_some_and(|(row, _)| {
            row.to_nnx == Transform::Transpose && row.wan.ends_with(".weight")
        })
}

/// The tensors `comfy:*` and `lightx2v:*` quantize (the other tensors stay high precision
/// in `--dtype`): a 2-D `.weight` whose name (original-Wan, no prefix) is
/// `<blocks>.<N>.<module>.<...>.weight` with `<module>` one of `self_attn`, `cross_attn`,
/// `ffn`.
///
/// - `comfy:*`: `<blocks>` is `blocks` only: the set Comfy-Org quantizes in its own WAN file
///   (spec quant_formats_2026.md §1.5: `wan2.2_animate_14B_int8_convrot`, 480 layers = 40
///   blocks x {self,cross}_attn.{q,k,v,o}, cross_attn.{k_img,v_img}, ffn.{0,2}; no
///   embedding, head or modulation). Per variant (`model::wan::WanVariant`): T2V 1.3B / 14B,
///   TI2V-5B, each A14B expert and SkyReels-V2: `blocks.N.{self,cross}_attn.{q,k,v,o}`,
///   `ffn.{0,2}` (SkyReels-V2's `fps_projection` stays high precision); I2V / FLF2V also
///   `cross_attn.{k_img,v_img}` (`img_emb` stays); VACE and Fun: the same `blocks.N`
///   Linears, while `vace_blocks.N.*`, `before_proj` / `after_proj` and Fun's control
///   embedding stay high precision (Comfy-Org publishes no such file to say otherwise);
///   Animate: `blocks.N` as I2V, its `face_adapter`, `face_encoder` and `motion_encoder`
///   stay high precision (as in Comfy-Org's animate file). Norm weights and biases are 1-D.
/// - `lightx2v:*`: LightX2V's `quantize_model` (ModelTC/LightX2V @f8aee98
///   `tools/convert/converter.py`, `wan_dit`: `key_idx` 2, `target_keys` self_attn,
///   cross_attn, ffn; every 2-D tensor whose third dot-separated part is one of them), so
///   also `vace_blocks.N.*` of a VACE model; everything else is cast to `--dtype`
///   (its `--non_linear_dtype`). Every 2-D tensor there is a `.weight` in original-Wan
///   names, so `<L>.weight` + `_scale` is `<L>.weight_scale` (`key + "_scale"`). Its
///   `ignore_key` (`"ca"`, `"audio"`: keys containing them are deleted) matches no T2V,
///   I2V, TI2V or VACE name; `quant::encode::plan` refuses a name it matches (Animate's
///   `face_encoder.conv1_local`) instead of dropping it.
pub fn is_block_linear(format: QuantFormat, name: &str, shape: &[usize]) -> bool {
    let parts: Vec<&str> = name.split('.').collect();
    let module = parts
        .get(2)
        .is_some_and(|m| matches!(*m, "self_attn" | "cross_attn" | "ffn"));
    let weight = parts.last() == Some(&"weight");
    if matches!(format, QuantFormat::LightX2vInt8 | QuantFormat::LightX2vFp8) {
        return shape.len() == 2 && module && weight;
    }
    shape.len() == 2
        && module
        && parts[0] == "blocks"
        && parts[1].parse::<usize>().is_ok()
        && weight
}

#[cfg(test)]
mod tests {
    use super::*;
    use QuantFormat::*;

    fn ty(f: QuantFormat, name: &str, shape: &[usize]) -> (GgmlType, Why) {
        let c = gguf_choice(f, name, shape, GgmlType::F16, 0);
        (c.ty, c.why)
    }

    /// The 14B / 1.3B shapes of spec §1.4 / §2.4.
    #[test]
    fn gguf_rules_on_real_shapes() {
        use GgmlType as G;
        let d = 5120;
        assert_eq!(
            ty(GgufQ8_0, "blocks.0.self_attn.q.weight", &[d, d]),
            (G::Q8_0, Why::Quantized)
        );
        assert_eq!(
            ty(GgufQ4_0, "blocks.3.ffn.2.weight", &[d, 13824]),
            (G::Q4_1, Why::FfnDownBump)
        );
        assert_eq!(
            ty(GgufQ5_0, "blocks.3.ffn.2.weight", &[d, 13824]),
            (G::Q5_1, Why::FfnDownBump)
        );
        assert_eq!(
            ty(GgufQ8_0, "blocks.3.ffn.2.weight", &[d, 13824]),
            (G::Q8_0, Why::Quantized)
        );
        assert_eq!(
            ty(GgufQ4_0, "blocks.3.ffn.0.weight", &[13824, d]),
            (G::Q4_0, Why::Quantized)
        );
        assert_eq!(
            ty(GgufQ8_0, "blocks.0.self_attn.q.bias", &[d]),
            (G::F32, Why::OneD)
        );
        assert_eq!(
            ty(GgufQ8_0, "blocks.0.modulation", &[1, 6, d]),
            (G::F32, Why::Modulation)
        );
        assert_eq!(
            ty(GgufQ8_0, "head.modulation", &[1, 2, d]),
            (G::F32, Why::Modulation)
        );
        assert_eq!(
            ty(GgufQ8_0, "patch_embedding.weight", &[d, 16, 1, 2, 2]),
            (G::F32, Why::FiveD)
        );
        assert_eq!(
            ty(GgufQ8_0, "head.head.weight", &[64, d]),
            (G::F16, Why::NeverQuantized)
        );
        assert_eq!(
            ty(GgufQ8_0, "text_embedding.0.weight", &[d, 4096]),
            (G::F16, Why::NeverQuantized)
        );
        assert_eq!(
            ty(GgufQ8_0, "time_projection.1.weight", &[6 * d, d]),
            (G::F16, Why::NeverQuantized)
        );
        assert_eq!(
            ty(GgufBf16, "blocks.0.self_attn.q.weight", &[d, d]),
            (G::BF16, Why::Plain)
        );
        assert_eq!(
            ty(GgufF16, "blocks.0.self_attn.q.weight", &[d, d]),
            (G::F16, Why::Plain)
        );
        assert_eq!(
            ty(GgufF16, "blocks.0.self_attn.norm_q.weight", &[d]),
            (G::F32, Why::OneD)
        );
        let c = gguf_choice(GgufQ8_0, "head.head.weight", &[64, d], GgmlType::BF16, 0);
        assert_eq!(c.ty, G::BF16, "a bf16 source keeps BF16 where f32 gets F16");
    }

    /// Wan2.2-Animate-14B's own tensors (golden/variants/animate/FACTS.md §3) under city96's
    /// name/shape rules: nothing Animate-specific, so the motion encoder's EqualLinear weights
    /// quantize like any 2-D weight, its (512, 20) direction falls back to F16 (rows of 20),
    /// convolutions and the padding tokens are F16, the small 4-D biases and kernels F32.
    #[test]
    fn gguf_rules_on_animate_shapes() {
        use GgmlType as G;
        let d = 5120;
        let fa = "face_adapter.fuser_blocks.0.";
        assert_eq!(
            ty(GgufQ8_0, &format!("{fa}linear1_kv.weight"), &[2 * d, d]),
            (G::Q8_0, Why::Quantized)
        );
        assert_eq!(
            ty(GgufQ8_0, "face_encoder.out_proj.weight", &[d, 1024]),
            (G::Q8_0, Why::Quantized)
        );
        assert_eq!(
            ty(GgufQ8_0, "motion_encoder.enc.fc.0.weight", &[512, 512]),
            (G::Q8_0, Why::Quantized)
        );
        assert_eq!(
            ty(GgufQ8_0, "motion_encoder.dec.direction.weight", &[512, 20]),
            (G::F16, Why::PartialBlocks)
        );
        assert_eq!(
            ty(
                GgufQ8_0,
                "face_encoder.conv1_local.conv.weight",
                &[4096, 512, 3]
            ),
            (G::F16, Why::NotA2dWeight)
        );
        assert_eq!(
            ty(GgufQ8_0, "face_encoder.padding_tokens", &[1, 1, 1, d]),
            (G::F16, Why::NotA2dWeight)
        );
        assert_eq!(
            ty(GgufQ8_0, "pose_patch_embedding.weight", &[d, 16, 1, 2, 2]),
            (G::F32, Why::FiveD)
        );
        let bias = "motion_encoder.enc.net_app.convs.4.conv1.1.bias";
        assert_eq!(ty(GgufQ8_0, bias, &[1, 512, 1, 1]), (G::F32, Why::Small));
        let kernel = "motion_encoder.enc.net_app.convs.4.skip.0.kernel";
        assert_eq!(ty(GgufQ4KM, kernel, &[4, 4]), (G::F32, Why::Small));
        assert_eq!(
            ty(GgufQ4_0, &format!("{fa}q_norm.weight"), &[128]),
            (G::F32, Why::OneD)
        );
    }

    /// Toy shapes: small 2-D weights still quantize (step 2 ignores step 1's F32), rows that
    /// are not whole blocks fall back to F16.
    #[test]
    fn gguf_rules_on_toy_shapes() {
        use GgmlType as G;
        let c = gguf_choice(
            GgufQ8_0,
            "blocks.0.self_attn.q.weight",
            &[32, 32],
            GgmlType::F16,
            0,
        );
        assert_eq!((c.ty, c.step1, c.why), (G::Q8_0, G::F32, Why::Quantized));
        let c = gguf_choice(
            GgufQ8_0,
            "blocks.0.ffn.2.weight",
            &[32, 80],
            GgmlType::F16,
            0,
        );
        assert_eq!((c.ty, c.step1, c.why), (G::F16, G::F16, Why::PartialBlocks));
        assert_eq!(
            ty(GgufQ8_0, "head.head.weight", &[16, 32]),
            (G::F32, Why::Small)
        );
        assert_eq!(
            ty(GgufF16, "blocks.0.self_attn.q.weight", &[32, 32]),
            (G::F32, Why::Small)
        );
    }

    #[test]
    fn fp8_linears() {
        for n in [
            "blocks.0.self_attn.q.weight",
            "blocks.12.cross_attn.o.weight",
            "blocks.1.cross_attn.k_img.weight",
            "blocks.39.ffn.2.weight",
            "text_embedding.0.weight",
            "time_projection.1.weight",
            "head.head.weight",
            "img_emb.proj.3.weight",
            "face_encoder.out_proj.weight",
            "face_adapter.fuser_blocks.0.linear1_kv.weight",
            "face_adapter.fuser_blocks.7.linear1_q.weight",
            "model.diffusion_model.face_adapter.fuser_blocks.3.linear2.weight",
        ] {
            assert!(is_fp8_linear(n, &[8, 8]), "{n}");
        }
        for n in [
            "blocks.0.self_attn.q.bias",
            "blocks.0.self_attn.norm_q.weight",
            "blocks.0.norm3.weight",
            "blocks.0.modulation",
            "head.modulation",
            "patch_embedding.weight",
            "img_emb.proj.0.weight",
            "blocks.x.ffn.0.weight",
            "motion_encoder.enc.fc.0.weight",
            "motion_encoder.dec.direction.weight",
            "motion_encoder.enc.net_app.convs.1.conv2.0.kernel",
            "face_encoder.padding_tokens",
            "face_adapter.fuser_blocks.0.q_norm.weight",
        ] {
            assert!(!is_fp8_linear(n, &[8, 8]), "{n}");
        }
        assert!(!is_fp8_linear("blocks.0.ffn.0.weight", &[8]));
        for f in QuantFormat::ALL {
            assert_eq!(f.as_str().parse::<QuantFormat>(), Ok(f));
        }
    }
}
