//! Quantized deployment outputs of a WAN transformer: ComfyUI scaled fp8 safetensors,
//! city96 ComfyUI-GGUF files (spec quant_formats.md), ComfyUI mixed-precision and LightX2V
//! safetensors (quant_formats_2026.md), as output encodings of the merge's one writer and
//! job loop.
//!
//! Owns: `QuantPlan` (every output tensor under its original-Wan name with its encoding and
//! the reason, from `quant::rules`), the output file plan of each format (one
//! `.safetensors` with the `scaled_fp8` marker and `scale_weight` tensors, one
//! `.safetensors` whose block Linears carry the tensors of `quant::layer_format` (and, for
//! `comfy:*`, the `_quantization_metadata` header), or one `.gguf` laid out by
//! `format::gguf`), [`encode`] (f32 values of a tensor, or of a band of its whole
//! rows, to the bytes of its encoding, plus the values a loader dequantizes), the error
//! sums and the quantization report. Does not own: the encodings themselves (`codec`),
//! the rules (`quant::rules`), name tables (`model::wan_names`), the jobs that feed
//! [`encode`] (`pipeline::output`, `pipeline::exec`: `convert --to` is that pipeline with no
//! adapters) or the atomic writer (`release`).
//!
//! Every tensor is computed on its exact f32 value (the widened source, or the merged f32
//! weight) and rounded once to its encoding. A non-finite weight is an error naming the
//! file and key; nothing is written then.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::json;

use crate::codec::CodecError;
use crate::codec::fp8;
use crate::codec::ggml::{self, GgmlType};
use crate::format::gguf::{self, TensorPlan};
use crate::format::header_layout::LayoutError;
use crate::format::header_layout::PlannedTensor;
use crate::io::checkpoint::Component;
use crate::io::{DType, ReadError, dtype};
use crate::model::animate::{is_animate_module, is_blur_kernel};
use crate::model::base_model::{BaseModel, ComponentModel};
use crate::model::plan_error::{ANIMATE_NOT_QUANTIZED, ANIMATE_UNKNOWN, PlanError};
use crate::model::wan_layout::Layout;
use crate::model::wan_names::{self, Position};
use crate::quant::layer_format::{LayerFormat, LayerPart};
use crate::quant::rules::{self, GgufMix, QuantFormat, Why};
use crate::release::writer::{ComponentOutput, GgufParts, OutputPlan};

/// The name of the fp8 marker tensor.
pub const FP8_MARKER: &str = crate::quant::convention::SCALED_FP8_MARKER;

/// Why a quantized output cannot be made of a base, or a tensor cannot be encoded. Planning
/// refusals name the key (the caller adds the base's path); encoding errors name the file
/// and key (`what`). Nothing is written when one is returned.
#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    /// The base holds several transformers; a quantized output is one file of one.
    #[error(
        "holds {} transformers ({}); {format} writes one file per transformer",
        components.len(),
        components.join(", ")
    )]
    Transformers {
        /// The format asked for.
        format: QuantFormat,
        /// The base's transformers.
        components: Vec<String>,
    },
    /// The base cannot be read.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// The base's layout cannot be told (keys that fit no layout, or several).
    #[error(transparent)]
    Layout(#[from] PlanError),
    /// The base is in a layout the quantized formats do not read.
    #[error(
        "the input is in the {layout} layout; {format} reads the diffusers or original-Wan layout"
    )]
    UnreadLayout {
        /// The format asked for.
        format: QuantFormat,
        /// The base's layout.
        layout: Layout,
    },
    /// A key that is not a WAN transformer parameter.
    #[error("{key}: not a WAN transformer parameter of the {layout} layout{}", if is_animate_module(key) { ANIMATE_UNKNOWN } else { "" })]
    UnknownKey {
        /// The stored key.
        key: String,
        /// The layout it was read in.
        layout: Layout,
    },
    /// A Wan2.2-Animate module stored under diffusers names (a fused or reshaped tensor in
    /// the original names that a quantized output, read tensor by tensor, cannot build).
    #[error("{key}: not quantized from the diffusers layout{ANIMATE_NOT_QUANTIZED}")]
    Animate {
        /// The stored key.
        key: String,
    },
    /// A high-precision type a GGUF file cannot hold unquantized.
    #[error("{dtype} is not a type GGUF keeps unquantized tensors in (f32, f16 or bf16)")]
    HighPrecision {
        /// The type asked for.
        dtype: DType,
    },
    /// A tensor whose dtype is not floating point.
    #[error("{key}: dtype {dtype} is not a float type; cannot quantize it")]
    NonFloat {
        /// The stored key.
        key: String,
        /// Its dtype.
        dtype: DType,
    },
    /// An output name longer than GGUF allows.
    #[error("{key}: output name {name} is longer than GGUF's 127 characters")]
    LongName {
        /// The stored key.
        key: String,
        /// Its original-Wan name.
        name: String,
    },
    /// Two keys with the same original-Wan name.
    #[error("{first} and {second} map to the same name {name}")]
    SameName {
        /// One stored key.
        first: String,
        /// The other.
        second: String,
        /// The name both map to.
        name: String,
    },
    /// A key whose original-Wan name is a scaled-fp8 output name.
    #[error("{key}: the input already holds a scaled-fp8 tensor name")]
    Fp8Name {
        /// The stored key.
        key: String,
    },
    /// A dtype the values cannot be converted to or from.
    #[error(transparent)]
    Dtype(#[from] dtype::UnsupportedDType),
    /// A key whose name LightX2V's `wan_dit` converter deletes (`ignore_key`).
    #[error(
        "{key}: LightX2V's wan_dit converter deletes every key containing \"ca\" or \"audio\" \
         (its ignore_key); {format} cannot hold this model's tensors"
    )]
    LightX2vIgnored {
        /// The stored key.
        key: String,
        /// The format asked for.
        format: QuantFormat,
    },
    /// A weight a per-layer format cannot encode (`quant::layer_format`).
    #[error("{what}: {reason}")]
    Codec {
        /// The file and key.
        what: String,
        /// Why (not a `source`: the message already says it).
        reason: CodecError,
    },
    /// A bug: values that are not whole blocks of their ggml type.
    #[error("internal: {what} is not whole {ty} blocks")]
    Blocks {
        /// The file and key.
        what: String,
        /// The ggml type.
        ty: GgmlType,
    },
}

/// How one output tensor is encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// A safetensors float dtype (fp8-scaled's high-precision tensors).
    Plain(DType),
    /// F8_E4M3 codes plus a 0-d F32 `scale_weight`.
    Fp8,
    /// A block Linear of a `comfy:*` / `lightx2v:*` output, `k` values a row: its weight
    /// and side tensors (`quant::layer_format`).
    Layer {
        /// The layer's format.
        codec: LayerFormat,
        /// Row length (in_features).
        k: usize,
    },
    /// A ggml type in a GGUF file; `step1` is city96's step-1 type of the tensor.
    Ggml {
        /// The type written.
        ty: GgmlType,
        /// convert.py's type, quantized instead of f32 with `city96_rounding`.
        step1: GgmlType,
    },
}

impl Encoding {
    /// The name in reports (`F16`, `F8_E4M3`, `Q8_0`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Encoding::Plain(d) => d.as_str(),
            Encoding::Fp8 => "F8_E4M3",
            Encoding::Layer { codec, .. } => codec.name(),
            Encoding::Ggml { ty, .. } => ty.name(),
        }
    }
}

/// One output tensor.
#[derive(Clone, Debug)]
pub struct QuantTensor {
    /// Original-Wan name in the output.
    pub name: String,
    /// Name in the source (the key the f32 values come from).
    pub source: String,
    /// Torch shape.
    pub shape: Vec<usize>,
    /// The encoding.
    pub encoding: Encoding,
    /// Why.
    pub why: Why,
}

/// Options of a quantized output.
#[derive(Clone, Copy, Debug)]
pub struct QuantOptions {
    /// The format.
    pub format: QuantFormat,
    /// The high-precision type (`--dtype`, recipe `output.dtype`). fp8-scaled: the dtype of
    /// the tensors that are not nn.Linear weights (F16 when `None`; or BF16, F32). A GGUF
    /// block format: convert.py's step-1 type of every 2-D tensor above 1024 elements (when
    /// `None`, convert.py's own rule: F16, or BF16 from a bf16 source), which the tensors
    /// llama-quantize leaves unquantized keep and `city96_rounding` quantizes: F32 gives the
    /// unquantized 2-D tensors of city96's published Wan 2.1 files (spec quant_formats.md
    /// K.5). Unused by the plain GGUF formats. `comfy:*` / `lightx2v:*`: the dtype of
    /// every tensor that is not a block Linear weight (`QuantOptions::plain_dtype`).
    pub high_precision: Option<DType>,
    /// GGUF block types: quantize convert.py's step-1 rounding (F16/BF16) of each weight
    /// instead of the f32 weight, for byte-compatibility with city96's two-step files.
    pub city96_rounding: bool,
}

impl QuantOptions {
    /// The dtype of the tensors fp8-scaled, `comfy:*` and `lightx2v:*` keep in high
    /// precision: `--dtype`, else F16 (fp8-scaled), BF16 (`comfy:*`, as Comfy-Org's files)
    /// or F32 (`lightx2v:*`, its converter's default `--non_linear_dtype torch.float`).
    pub fn plain_dtype(&self) -> DType {
        let default = match self.format {
            QuantFormat::LightX2vInt8 | QuantFormat::LightX2vFp8 => DType::F32,
            f if f.is_per_layer() => DType::BF16,
            _ => DType::F16,
        };
        self.high_precision.unwrap_or(default)
    }

    /// The high-precision type as reports and manifests record it: fp8-scaled's, `comfy:*`'s
    /// and `lightx2v:*`'s always, a GGUF format's when one was asked for.
    pub fn high_precision_label(&self) -> Option<&'static str> {
        match self.format {
            f if !f.is_gguf() => Some(self.plain_dtype().as_str()),
            _ => self.high_precision.map(DType::as_str),
        }
    }
}

/// Every output tensor of a quantized output, in output-name order.
#[derive(Clone, Debug)]
pub struct QuantPlan {
    /// Options.
    pub options: QuantOptions,
    /// The tensors.
    pub tensors: Vec<QuantTensor>,
    /// Source keys left out (`norm_added_q`, which no Wan forward uses).
    pub skipped: Vec<String>,
}

/// Maps a WAN transformer's tensor names (diffusers or original layout, as `layout`, the
/// one its keys were found in, says) to original-Wan names and decides each tensor's
/// encoding. `source` is (name, dtype, shape) per tensor.
pub fn plan(
    options: QuantOptions,
    layout: Layout,
    source: &[(String, DType, Vec<usize>)],
) -> Result<QuantPlan, QuantError> {
    if !matches!(layout, Layout::Diffusers | Layout::Wan) {
        return Err(QuantError::UnreadLayout {
            format: options.format,
            layout,
        });
    }
    let mut tensors = Vec::new();
    let mut skipped = Vec::new();
    for (name, dt, shape) in source {
        if name.contains(wan_names::SKIPPED_MARKER) {
            skipped.push(name.clone());
            continue;
        }
        if is_animate_module(name) && layout != Layout::Wan {
            return Err(QuantError::Animate { key: name.clone() });
        }
        if layout == Layout::Wan && is_blur_kernel(name) {
            // ComfyUI's persistent Blur buffer: kept under its own name, as stored.
            let wan = wan_names::strip_wan_prefix(name).to_string();
            tensors.push((wan, name, shape, *dt));
            continue;
        }
        let Some((entry, pos)) = wan_names::parse_stored(layout, name) else {
            return Err(QuantError::UnknownKey {
                key: name.clone(),
                layout,
            });
        };
        if !dt.is_float() {
            return Err(QuantError::NonFloat {
                key: name.clone(),
                dtype: *dt,
            });
        }
        let block = match pos {
            Position::Block(b) => b,
            _ => 0,
        };
        let (wan, _) = entry.stored_name(Layout::Wan, block);
        tensors.push((wan, name, shape, *dt));
    }
    // LightX2V's converter deletes these original-Wan names: refused, not dropped.
    let lightx2v = matches!(
        options.format,
        QuantFormat::LightX2vInt8 | QuantFormat::LightX2vFp8
    );
    let ignored = |wan: &str| wan.contains("ca") || wan.contains("audio");
    if let Some((_, key, _, _)) = tensors.iter().find(|t| lightx2v && ignored(&t.0)) {
        return Err(QuantError::LightX2vIgnored {
            key: key.to_string(),
            format: options.format,
        });
    }
    // llama-quantize visits tensors in byte-wise name order, and a K mix's "first N" v
    // projections are counted in that order (spec quant_formats.md K.2).
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let step1 = match options.high_precision {
        None => None,
        Some(dtype) => Some(GgmlType::of_float(dtype).ok_or(QuantError::HighPrecision { dtype })?),
    };
    let mut mix = GgufMix::new(options.format, step1);
    let tensors: Vec<QuantTensor> = (tensors.into_iter())
        .map(|(wan, name, shape, dt)| {
            let (encoding, why) = decide(&options, &mut mix, &wan, shape, dt);
            QuantTensor {
                name: wan,
                source: name.clone(),
                shape: shape.clone(),
                encoding,
                why,
            }
        })
        .collect();
    if let Some(t) = tensors.iter().find(|t| t.name.len() > 127) {
        // convert.py's limit (spec §2.3); original-Wan names are far shorter.
        return Err(QuantError::LongName {
            key: t.source.clone(),
            name: t.name.clone(),
        });
    }
    if let Some(w) = tensors.windows(2).find(|w| w[0].name == w[1].name) {
        return Err(QuantError::SameName {
            first: w[0].source.clone(),
            second: w[1].source.clone(),
            name: w[0].name.clone(),
        });
    }
    let clash = tensors
        .iter()
        .find(|t| crate::quant::convention::is_side_tensor(&t.name));
    if let (false, Some(t)) = (options.format.is_gguf(), clash) {
        return Err(QuantError::Fp8Name {
            key: t.source.clone(),
        });
    }
    Ok(QuantPlan {
        options,
        tensors,
        skipped,
    })
}

fn decide(
    o: &QuantOptions,
    mix: &mut GgufMix,
    name: &str,
    shape: &[usize],
    src: DType,
) -> (Encoding, Why) {
    if o.format == QuantFormat::Fp8Scaled {
        return if rules::is_fp8_linear(name, shape) {
            (Encoding::Fp8, Why::Fp8Linear)
        } else {
            (Encoding::Plain(o.plain_dtype()), Why::HighPrecision)
        };
    }
    if let Some(codec) = LayerFormat::of(o.format) {
        return if rules::is_block_linear(o.format, name, shape) {
            let k = shape[1];
            (Encoding::Layer { codec, k }, Why::BlockLinear)
        } else {
            (Encoding::Plain(o.plain_dtype()), Why::NotBlockLinear)
        };
    }
    let c = mix.choose(name, shape, src);
    (
        Encoding::Ggml {
            ty: c.ty,
            step1: c.step1,
        },
        c.why,
    )
}

impl QuantPlan {
    /// The output file plan: one fp8-scaled, `comfy:*` or `lightx2v:*` `.safetensors`
    /// named `{stem}.safetensors`, or one GGUF file `{stem}.gguf`, at the root of the
    /// release.
    pub fn output_plan(
        &self,
        stem: &str,
        metadata: BTreeMap<String, String>,
    ) -> Result<OutputPlan, LayoutError> {
        if self.options.format.is_per_layer() {
            return self.per_layer_plan(stem, metadata);
        }
        if self.options.format == QuantFormat::Fp8Scaled {
            let mut planned = vec![PlannedTensor {
                name: FP8_MARKER.into(),
                dtype: DType::F8_E4M3,
                shape: vec![0],
            }];
            for t in &self.tensors {
                match t.encoding {
                    Encoding::Fp8 => {
                        planned.push(PlannedTensor {
                            name: t.name.clone(),
                            dtype: DType::F8_E4M3,
                            shape: t.shape.clone(),
                        });
                        planned.push(PlannedTensor {
                            name: scale_name(&t.name),
                            dtype: DType::F32,
                            shape: vec![],
                        });
                    }
                    Encoding::Plain(d) => planned.push(PlannedTensor {
                        name: t.name.clone(),
                        dtype: d,
                        shape: t.shape.clone(),
                    }),
                    Encoding::Ggml { .. } | Encoding::Layer { .. } => {
                        unreachable!("fp8 plans hold no ggml or per-layer tensors")
                    }
                }
            }
            let c = ComponentOutput {
                rel_dir: PathBuf::new(),
                stem: stem.to_string(),
                tensors: planned,
                metadata,
                sidecars: Vec::new(),
                max_shard_bytes: None,
            };
            return OutputPlan::build(&[c], &[]);
        }
        let mut out = OutputPlan::build(&[], &[])?;
        out.add_gguf_file(0, PathBuf::from(format!("{stem}.gguf")), self.gguf_parts());
        Ok(out)
    }

    /// A `comfy:*` / `lightx2v:*` file: each block Linear's tensors (`LayerFormat::tensors`)
    /// and every other tensor in its plain dtype; a `comfy:*` file also gets the
    /// `_quantization_metadata` header, naming the same layers and formats as the markers.
    fn per_layer_plan(
        &self,
        stem: &str,
        mut metadata: BTreeMap<String, String>,
    ) -> Result<OutputPlan, LayoutError> {
        let mut planned = Vec::new();
        let mut layers = Vec::new();
        for t in &self.tensors {
            match t.encoding {
                Encoding::Layer { codec, k } => {
                    let layer = layer_name(&t.name);
                    let n = t.shape.first().copied().unwrap_or(0);
                    let tensors = codec.tensors(n, k).map_err(|_| LayoutError::Overflow {
                        name: t.name.clone(),
                    })?;
                    for lt in tensors {
                        planned.push(PlannedTensor {
                            name: format!("{layer}{}", lt.suffix),
                            dtype: lt.dtype,
                            shape: lt.shape,
                        });
                    }
                    if let Some(conf) = codec.comfy_quant() {
                        layers.push((layer, conf));
                    }
                }
                Encoding::Plain(d) => planned.push(PlannedTensor {
                    name: t.name.clone(),
                    dtype: d,
                    shape: t.shape.clone(),
                }),
                Encoding::Fp8 | Encoding::Ggml { .. } => {
                    unreachable!("per-layer plans hold no fp8-scaled or ggml tensors")
                }
            }
        }
        if !layers.is_empty() {
            let header = crate::quant::layer_format::quantization_metadata(
                layers.iter().map(|(l, c)| (*l, c.as_str())),
            );
            metadata.insert(crate::quant::convention::QUANT_METADATA.into(), header);
        }
        let c = ComponentOutput {
            rel_dir: PathBuf::new(),
            stem: stem.to_string(),
            tensors: planned,
            metadata,
            sidecars: Vec::new(),
            max_shard_bytes: None,
        };
        OutputPlan::build(&[c], &[])
    }

    /// GGUF metadata (spec §2.2) and tensor infos (`ne` = torch shape reversed, every
    /// dimension kept).
    fn gguf_parts(&self) -> GgufParts {
        let kv = vec![
            (
                "general.architecture".to_string(),
                gguf::Value::Str("wan".into()),
            ),
            (
                "general.quantization_version".to_string(),
                gguf::Value::U32(2),
            ),
            (
                "general.file_type".to_string(),
                gguf::Value::U32(self.options.format.file_type().unwrap_or(0)),
            ),
        ];
        let tensors = self
            .tensors
            .iter()
            .map(|t| TensorPlan {
                name: t.name.clone(),
                ne: t.shape.iter().rev().map(|&d| d as u64).collect(),
                ty: match t.encoding {
                    Encoding::Ggml { ty, .. } => ty,
                    _ => GgmlType::F32,
                },
            })
            .collect();
        GgufParts { kv, tensors }
    }
}

/// `L.weight` → `L` (a per-layer format's layer name).
pub fn layer_name(weight: &str) -> &str {
    weight.strip_suffix(".weight").unwrap_or(weight)
}

/// `L.weight` → `L.scale_weight`.
pub fn scale_name(weight: &str) -> String {
    format!(
        "{}{}",
        layer_name(weight),
        crate::quant::convention::SCALE_WEIGHT
    )
}

/// The dequantized error of one tensor.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ErrorStats {
    /// max |W − deq(W)|.
    pub max_abs: f64,
    /// sqrt(mean (W − deq(W))²).
    pub rms: f64,
    /// max |W|.
    pub amax: f64,
    /// sqrt(mean W²).
    pub rms_w: f64,
}

/// The first of an encoding's two passes when its bands share the whole tensor's scale
/// ([`Encoding::needs_amax`]): `max|W|` over the bands as they come, then the scale. Used by
/// every producer that encodes such a tensor in bands (an untouched tensor, a merged one).
#[derive(Clone, Copy, Debug, Default)]
pub struct AmaxPass(f32);

impl AmaxPass {
    /// Takes the next band into the maximum.
    pub fn add(&mut self, band: &[f32]) {
        self.0 = self.0.max(fp8::amax(band));
    }

    /// The per-tensor scale every band is encoded with; `None` when the maximum is not
    /// finite (the weight holds ±inf: the encoding pass finds and names it) or the encoding
    /// has no such scale. `what` names the tensor in the error of an unusable scale.
    pub fn scale(self, enc: Encoding, what: &str) -> Result<Option<f32>, QuantError> {
        match self.0.is_finite() {
            true => enc.tensor_scale(self.0, what),
            false => Ok(None),
        }
    }
}

/// Lanes of [`ErrorSum`]'s sums: element `i` of a tensor goes into lane `i % SUM_LANES`.
const SUM_LANES: usize = 8;

/// [`ErrorStats`] summed over the parts of one tensor, so a tensor encoded in bands gives the
/// same sums (and bits) as one encoded whole. Element `i` of the tensor is added into lane
/// `i % 8` of each sum (in f64), and the lanes are added in lane order at the end: a fixed
/// order that depends on neither the bands nor the threads, and eight independent chains
/// that vectorise instead of one serial chain of f64 additions (four cycles of latency per
/// element). The maxima are exact in any order.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ErrorSum {
    max_abs: f64,
    se: [f64; SUM_LANES],
    amax: f64,
    sw: [f64; SUM_LANES],
    n: usize,
}

impl ErrorSum {
    /// Adds the next part: `w` the f32 weights, `y` their dequantized values.
    pub fn add(&mut self, w: &[f32], y: &[f32]) {
        let len = w.len().min(y.len());
        let (w, y) = (&w[..len], &y[..len]);
        // Up to the next element whose index is a multiple of the lane count, one at a time.
        let head = ((SUM_LANES - self.n % SUM_LANES) % SUM_LANES).min(len);
        for i in 0..head {
            self.add_one(self.n % SUM_LANES + i, w[i], y[i]);
        }
        let (w, y) = (&w[head..], &y[head..]);
        let whole = w.len() / SUM_LANES * SUM_LANES;
        crate::codec::dtype::vectorized(
            #[inline(always)]
            || self.add_lanes(&w[..whole], &y[..whole]),
        );
        for i in whole..w.len() {
            self.add_one(i - whole, w[i], y[i]);
        }
        self.n += len;
    }

    /// Adds the pair `(a, b)` into lane `lane`.
    #[inline]
    fn add_one(&mut self, lane: usize, a: f32, b: f32) {
        let (a, b) = (a as f64, b as f64);
        let e = (a - b).abs();
        self.max_abs = self.max_abs.max(e);
        self.se[lane] += e * e;
        self.amax = self.amax.max(a.abs());
        self.sw[lane] += a * a;
    }

    /// Adds runs of `SUM_LANES` pairs whose first is in lane 0.
    #[inline(always)]
    fn add_lanes(&mut self, w: &[f32], y: &[f32]) {
        let (mut max_abs, mut amax) = ([self.max_abs; SUM_LANES], [self.amax; SUM_LANES]);
        let (mut se, mut sw) = (self.se, self.sw);
        for (w, y) in w.chunks_exact(SUM_LANES).zip(y.chunks_exact(SUM_LANES)) {
            for l in 0..SUM_LANES {
                let (a, b) = (w[l] as f64, y[l] as f64);
                let e = (a - b).abs();
                // `f64::max` without its NaN case (a compare and a blend more per lane):
                // the maxima start at 0 and take only larger values, so a NaN is skipped
                // either way.
                max_abs[l] = if e > max_abs[l] { e } else { max_abs[l] };
                se[l] += e * e;
                amax[l] = if a.abs() > amax[l] { a.abs() } else { amax[l] };
                sw[l] += a * a;
            }
        }
        self.max_abs = max_abs.iter().fold(self.max_abs, |m, &x| m.max(x));
        self.amax = amax.iter().fold(self.amax, |m, &x| m.max(x));
        (self.se, self.sw) = (se, sw);
    }

    /// The statistics of everything added.
    pub fn stats(&self) -> ErrorStats {
        let n = self.n.max(1) as f64;
        let sum = |lanes: &[f64; SUM_LANES]| lanes.iter().fold(0.0, |s, &x| s + x);
        ErrorStats {
            max_abs: self.max_abs,
            rms: (sum(&self.se) / n).sqrt(),
            amax: self.amax,
            rms_w: (sum(&self.sw) / n).sqrt(),
        }
    }
}

impl ErrorStats {
    /// `max_abs / amax` (0 for an all-zero tensor).
    pub fn rel_max(&self) -> f64 {
        if self.amax > 0.0 {
            self.max_abs / self.amax
        } else {
            0.0
        }
    }

    /// `rms / rms(W)` (0 for an all-zero tensor).
    pub fn rel_rms(&self) -> f64 {
        if self.rms_w > 0.0 {
            self.rms / self.rms_w
        } else {
            0.0
        }
    }
}

/// One output tensor encoded: its bytes (codes for fp8) and, for fp8, its `scale_weight`;
/// for a per-layer format, the bytes of each of the layer's tensors.
#[derive(Clone, Debug, PartialEq)]
pub struct Encoded {
    /// The bytes of the tensor's own slot (or of the part encoded).
    pub bytes: Vec<u8>,
    /// `scale_weight` of an fp8 weight.
    pub scale: Option<f32>,
    /// A per-layer format's tensors (`.weight` included; `bytes` is then empty), each at
    /// its byte offset in its tensor.
    pub layer: Vec<LayerPart>,
}

impl Encoding {
    /// True when a run of whole rows can be encoded on its own (every encoding but fp8,
    /// whose scale is the whole tensor's `max|W|`, and the per-layer codecs that need it or
    /// 128-row bands: `LayerFormat::streams`).
    pub fn streams(&self) -> bool {
        match self {
            Encoding::Fp8 => false,
            Encoding::Layer { codec, .. } => codec.streams(),
            _ => true,
        }
    }

    /// True when the whole tensor's `max|W|` is taken before it is encoded in bands.
    pub fn needs_amax(&self) -> bool {
        match self {
            Encoding::Fp8 => true,
            Encoding::Layer { codec, .. } => codec.needs_amax(),
            _ => false,
        }
    }

    /// The per-tensor scale every band is encoded with, from the tensor's `max|W|` (see
    /// [`Encoding::needs_amax`]); `what` names the tensor in the error.
    pub fn tensor_scale(&self, amax: f32, what: &str) -> Result<Option<f32>, QuantError> {
        match self {
            Encoding::Fp8 => Ok(Some(fp8::scale_for(amax))),
            Encoding::Layer { codec, .. } => {
                codec
                    .tensor_scale(amax)
                    .map_err(|reason| QuantError::Codec {
                        what: what.to_string(),
                        reason,
                    })
            }
            _ => Ok(None),
        }
    }

    /// A band of rows must start on a multiple of this many rows.
    pub fn row_align(&self) -> usize {
        match self {
            Encoding::Layer { codec, .. } => codec.row_align(),
            _ => 1,
        }
    }

    /// Byte offset in the encoded tensor of flat element `elems` (a band's first element);
    /// `None` when it is not on a block boundary, and for a per-layer format (whose parts
    /// carry their own offsets).
    pub fn byte_offset(&self, elems: usize) -> Option<usize> {
        match self {
            Encoding::Plain(d) => d.byte_len(elems),
            Encoding::Fp8 => Some(elems),
            Encoding::Layer { .. } => None,
            Encoding::Ggml { ty, .. } => ty.byte_len(elems),
        }
    }
}

/// Encodes `w` (f32: a whole tensor, or a run of whole rows starting at flat element
/// `first`) and decodes the result into `y` (same length), as the loaders dequantize it.
/// For fp8 and the per-layer codecs with a per-tensor scale, `tensor_scale` is the whole
/// tensor's ([`Encoding::tensor_scale`] of its `max|W|`) when `w` is a part of it; `None`
/// takes it from `w`. `what` names the tensor (file and key) in errors. A non-finite value
/// is encoded as the format's rounding gives (fp8: a NaN code, ±448; ggml: whatever its
/// block arithmetic makes of it): the caller checks `w` and `y` (`pipeline::Exec::encode_part`)
/// and refuses them unless the output allows them.
pub fn encode(
    options: &QuantOptions,
    encoding: Encoding,
    (w, first): (&[f32], usize),
    y: &mut [f32],
    tensor_scale: Option<f32>,
    what: &str,
) -> Result<Encoded, QuantError> {
    let plain = |bytes, scale| Encoded {
        bytes,
        scale,
        layer: Vec::new(),
    };
    match encoding {
        Encoding::Plain(d) => {
            let bytes = dtype::from_f32_vec(d, w)?;
            dtype::widen_to_f32(d, &bytes, y)?;
            Ok(plain(bytes, None))
        }
        Encoding::Fp8 => {
            let scale = tensor_scale.unwrap_or_else(|| fp8::scale_for(fp8::amax(w)));
            let mut codes = vec![0u8; w.len()];
            fp8::encode_scaled(w, scale, &mut codes);
            fp8::decode_scaled(&codes, scale, y);
            Ok(plain(codes, Some(scale)))
        }
        Encoding::Layer { codec, k } => {
            let r0 = first.checked_div(k).unwrap_or(0);
            let layer = (codec.encode_rows(w, r0, k, tensor_scale, y)).map_err(|reason| {
                QuantError::Codec {
                    what: what.to_string(),
                    reason,
                }
            })?;
            Ok(Encoded {
                bytes: Vec::new(),
                scale: None,
                layer,
            })
        }
        Encoding::Ggml { ty, step1 } => {
            let rounded;
            let src = if options.city96_rounding
                && ty.is_block()
                && matches!(step1, GgmlType::F16 | GgmlType::BF16)
            {
                let d = if step1 == GgmlType::F16 {
                    DType::F16
                } else {
                    DType::BF16
                };
                rounded = dtype::to_f32_vec(d, &dtype::from_f32_vec(d, w)?)?;
                &rounded[..]
            } else {
                w
            };
            let bytes = ggml::quantize_vec(ty, src).ok_or_else(|| QuantError::Blocks {
                what: what.to_string(),
                ty,
            })?;
            ggml::dequantize(ty, &bytes, y);
            Ok(plain(bytes, None))
        }
    }
}

/// The quantization report: options, per-tensor encoding, reason and error, and a summary
/// per encoding (count, worst relative max and RMS error).
pub fn report_json(plan: &QuantPlan, stats: &[ErrorStats]) -> serde_json::Value {
    let mut tensors = serde_json::Map::new();
    let mut summary: BTreeMap<&str, (usize, f64, f64)> = BTreeMap::new();
    for (t, s) in plan.tensors.iter().zip(stats) {
        tensors.insert(
            t.name.clone(),
            json!({
                "source": t.source,
                "shape": t.shape,
                "encoding": t.encoding.name(),
                "why": t.why.as_str(),
                "max_abs_err": s.max_abs,
                "rms_err": s.rms,
                "rel_max_err": s.rel_max(),
                "rel_rms_err": s.rel_rms(),
            }),
        );
        let e = summary.entry(t.encoding.name()).or_default();
        e.0 += 1;
        e.1 = e.1.max(s.rel_max());
        e.2 = e.2.max(s.rel_rms());
    }
    let summary: serde_json::Map<String, serde_json::Value> = summary
        .into_iter()
        .map(|(k, (n, m, r))| {
            (
                k.to_string(),
                json!({"tensors": n, "worst_rel_max_err": m, "worst_rel_rms_err": r}),
            )
        })
        .collect();
    json!({
        "format": plan.options.format.as_str(),
        "high_precision": plan.options.high_precision_label(),
        "city96_rounding": plan.options.city96_rounding,
        "skipped": plan.skipped,
        "summary": summary,
        "tensors": tensors,
        "note": "errors are of the dequantized value against the f32 weight; rel_max_err = \
                 max_abs_err / max|W|, rel_rms_err = rms_err / rms(W)",
    })
}

/// The stem of the output weight file of `format`.
pub fn output_stem(format: QuantFormat) -> String {
    match format {
        QuantFormat::Fp8Scaled => "model_fp8_scaled".into(),
        f if f.is_per_layer() => format!("model_{}", f.as_str().replace([':', '-'], "_")),
        f => format!("model-{}", f.as_str().trim_start_matches("gguf:")),
    }
}

/// The `(name, dtype, shape)` list of a component.
pub fn source_tensors(c: &Component) -> Vec<(String, DType, Vec<usize>)> {
    c.tensors
        .tensors()
        .map(|t| (t.view.name.to_string(), t.view.dtype, t.view.shape.to_vec()))
        .collect()
}

/// The one transformer of `ck` and its model facts: a quantized output is one file, so a
/// pipeline with two experts is refused (the front end says the way out: one transformer
/// folder).
pub fn single_transformer(
    ck: &BaseModel,
    format: QuantFormat,
) -> Result<(&Component, &ComponentModel), QuantError> {
    match ck.components.as_slice() {
        [_] => Ok(ck.single_part()?),
        many => Err(QuantError::Transformers {
            format,
            components: many.iter().map(|c| c.name.clone()).collect(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    /// The error sums of parts split anywhere (not only on a lane boundary) are the sums of
    /// the whole, bit for bit, and follow the documented order: element i's square in lane
    /// i % 8, the lanes added in order; the maxima are the plain ones, NaN skipped.
    #[test]
    fn error_sums_in_lanes_do_not_depend_on_the_parts() {
        let mut rng = SplitMix64::new(7);
        let n = 1000;
        let w: Vec<f32> = (0..n).map(|_| rng.signed_f32()).collect();
        let mut y: Vec<f32> = w.iter().map(|x| x * 1.001 + 1e-4).collect();
        y[17] = f32::NAN;
        let mut whole = ErrorSum::default();
        whole.add(&w, &y);
        for cuts in [
            vec![1, 3, 7],
            vec![8, 16],
            vec![5, 500, 999],
            vec![0, 0, 13],
        ] {
            let mut parts = ErrorSum::default();
            let mut at = 0;
            for c in cuts.into_iter().chain([n]) {
                parts.add(&w[at..c.max(at)], &y[at..c.max(at)]);
                at = c.max(at);
            }
            assert_eq!(
                format!("{:?}", parts.stats()),
                format!("{:?}", whole.stats())
            );
        }
        let (mut se, mut sw, mut max_abs, mut amax) = ([0f64; 8], [0f64; 8], 0f64, 0f64);
        for (i, (&a, &b)) in w.iter().zip(&y).enumerate() {
            let (a, b) = (a as f64, b as f64);
            max_abs = max_abs.max((a - b).abs());
            amax = amax.max(a.abs());
            se[i % 8] += (a - b) * (a - b);
            sw[i % 8] += a * a;
        }
        let total = |l: [f64; 8]| l.iter().fold(0f64, |s, &x| s + x);
        let s = whole.stats();
        assert!(s.rms.is_nan(), "a NaN value makes the squares' sum NaN");
        assert_eq!(s.rms_w.to_bits(), (total(sw) / n as f64).sqrt().to_bits());
        assert_eq!((s.max_abs, s.amax), (max_abs, amax));
        y[17] = w[17];
        let mut finite = ErrorSum::default();
        finite.add(&w, &y);
        let mut se = [0f64; 8];
        for (i, (&a, &b)) in w.iter().zip(&y).enumerate() {
            se[i % 8] += (a as f64 - b as f64) * (a as f64 - b as f64);
        }
        let want = (total(se) / n as f64).sqrt();
        assert_eq!(finite.stats().rms.to_bits(), want.to_bits());
    }

    /// What the job loop relies on: a tensor encoded in bands of whole rows (fp8 with the
    /// whole tensor's scale) gives the bytes and error statistics of the tensor encoded whole.
    #[test]
    fn bands_of_whole_rows_encode_as_the_whole_tensor() {
        let (rows, cols) = (7, 64);
        let mut rng = SplitMix64::new(0x9E37_79B9_7F4A_7C15);
        let w: Vec<f32> = (0..rows * cols).map(|_| rng.signed_f32()).collect();
        let gg = |ty, step1| Encoding::Ggml { ty, step1 };
        let encodings = [
            gg(GgmlType::Q8_0, GgmlType::F16),
            gg(GgmlType::Q4_1, GgmlType::F16),
            gg(GgmlType::Q5_0, GgmlType::F16),
            gg(GgmlType::F16, GgmlType::F16),
            Encoding::Plain(DType::BF16),
            Encoding::Fp8,
        ];
        for city96_rounding in [false, true] {
            let o = QuantOptions {
                format: QuantFormat::GgufQ8_0,
                high_precision: None,
                city96_rounding,
            };
            for enc in encodings {
                let mut y = vec![0f32; w.len()];
                let whole = encode(&o, enc, (&w, 0), &mut y, None, "t").unwrap();
                let mut sum = ErrorSum::default();
                sum.add(&w, &y);
                let scale = whole.scale;
                let mut bytes = Vec::new();
                let mut banded = ErrorSum::default();
                for band in w.chunks(3 * cols) {
                    let mut y = vec![0f32; band.len()];
                    let first = (band.as_ptr() as usize - w.as_ptr() as usize) / 4;
                    let part = encode(&o, enc, (band, first), &mut y, scale, "t").unwrap();
                    assert_eq!(enc.byte_offset(first), Some(bytes.len()), "{enc:?}");
                    bytes.extend(part.bytes);
                    banded.add(band, &y);
                }
                assert_eq!(bytes, whole.bytes, "{enc:?} city96 {city96_rounding}");
                assert_eq!(banded.stats(), sum.stats(), "{enc:?}");
            }
        }
    }

    /// The plan of every GGUF format on Wan2.1-T2V-14B's shapes (diffusers names, as the
    /// published diffusers folder has them, stored f32): the types the K mixes give the v
    /// projections and ffn down (lcpp.patch's rules, "the first N" in byte-wise name order),
    /// and the file sizes city96 publishes for `city96/Wan2.1-t2v-14b-gguf` (Hugging Face's
    /// decimal GB, two or three significant digits).
    #[test]
    fn gguf_mixes_on_the_14b_shapes_give_city96s_types_and_sizes() {
        use crate::model::wan::WanVariant;
        let source: Vec<(String, DType, Vec<usize>)> = (WanVariant::T2V14B.config())
            .diffusers_params()
            .into_iter()
            .map(|p| (p.name, DType::F32, p.shape))
            .collect();
        // city96's published files hold the 2-D tensors llama-quantize leaves unquantized as
        // F32 (`--dtype f32`; convert.py today writes F16 there, and the sizes then come out
        // 0.46 GB smaller).
        let plan_of = |format| {
            let o = QuantOptions {
                format,
                high_precision: Some(DType::F32),
                city96_rounding: false,
            };
            plan(o, Layout::Diffusers, &source).unwrap()
        };
        let ty = |p: &QuantPlan, name: &str| {
            let t = p.tensors.iter().find(|t| t.name == name).unwrap();
            match t.encoding {
                Encoding::Ggml { ty, .. } => ty,
                other => panic!("{name}: {other:?}"),
            }
        };
        use GgmlType as G;
        use QuantFormat as F;
        // (format, v of blocks.0 cross/self, blocks.1 cross/self, blocks.2 self, ffn down,
        // q, published size in GB with its precision)
        let cases = [
            (F::GgufQ2K, [G::Q3_K; 5], G::Q2_K, G::Q2_K, None),
            (
                F::GgufQ3KS,
                [G::Q3_K; 5],
                G::Q3_K,
                G::Q3_K,
                Some((6.99, 0.005)),
            ),
            (
                F::GgufQ3KM,
                [G::Q5_K, G::Q5_K, G::Q4_K, G::Q4_K, G::Q4_K],
                G::Q4_K,
                G::Q3_K,
                Some((7.65, 0.005)),
            ),
            (
                F::GgufQ4KS,
                [G::Q5_K, G::Q5_K, G::Q5_K, G::Q5_K, G::Q4_K],
                G::Q5_K,
                G::Q4_K,
                Some((9.22, 0.005)),
            ),
            (
                F::GgufQ4KM,
                [G::Q6_K; 5],
                G::Q6_K,
                G::Q4_K,
                Some((10.1, 0.05)),
            ),
            (F::GgufQ5KS, [G::Q5_K; 5], G::Q5_K, G::Q5_K, None),
            (F::GgufQ5KM, [G::Q6_K; 5], G::Q6_K, G::Q5_K, None),
            (F::GgufQ6K, [G::Q6_K; 5], G::Q6_K, G::Q6_K, None),
            (
                F::GgufQ4_0,
                [G::Q4_0; 5],
                G::Q4_1,
                G::Q4_0,
                Some((9.03, 0.005)),
            ),
        ];
        for (format, v, ffn_down, q, size) in cases {
            let p = plan_of(format);
            let vs = [
                "blocks.0.cross_attn.v.weight",
                "blocks.0.self_attn.v.weight",
                "blocks.1.cross_attn.v.weight",
                "blocks.1.self_attn.v.weight",
                "blocks.2.self_attn.v.weight",
            ];
            for (name, want) in vs.iter().zip(v) {
                assert_eq!(ty(&p, name), want, "{format} {name}");
            }
            // byte-wise order: blocks.10 comes before blocks.2, so it is among the first N
            // only where N covers four whole blocks (none here).
            assert_eq!(ty(&p, "blocks.39.self_attn.v.weight"), v[4], "{format}");
            assert_eq!(ty(&p, "blocks.7.ffn.2.weight"), ffn_down, "{format}");
            assert_eq!(ty(&p, "blocks.7.self_attn.q.weight"), q, "{format}");
            for name in [
                "patch_embedding.weight",
                "text_embedding.0.weight",
                "head.head.weight",
            ] {
                let t = p.tensors.iter().find(|t| t.name == name).unwrap();
                assert!(
                    matches!(t.encoding, Encoding::Ggml { ty, .. } if !ty.is_block()),
                    "{format} {name}: {:?}",
                    t.encoding
                );
            }
            let bytes = p.output_plan("m", BTreeMap::new()).unwrap().total_bytes();
            let gb = bytes as f64 / 1e9;
            eprintln!("{format}: {bytes} bytes = {gb:.3} GB");
            if let Some((published, within)) = size {
                assert!(
                    (gb - published).abs() <= within,
                    "{format}: {gb:.3} GB, city96 publishes {published} GB"
                );
            }
        }
    }

    #[test]
    fn non_finite_values_are_encoded_as_the_format_rounds_them() {
        let o = QuantOptions {
            format: QuantFormat::Fp8Scaled,
            high_precision: None,
            city96_rounding: false,
        };
        let mut y = [0f32; 3];
        let e = encode(
            &o,
            Encoding::Fp8,
            (&[1.0, f32::NAN, 2.0], 0),
            &mut y,
            None,
            "f: k",
        )
        .unwrap();
        assert_eq!(e.scale, Some(2.0 / 448.0));
        assert_eq!(e.bytes[1], 0x7F, "a NaN code");
        assert!(y[1].is_nan() && y[0] == 1.0 && y[2] == 2.0);
        for ty in [GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::F16] {
            let w: Vec<f32> = (0..256)
                .map(|i| if i == 3 { f32::INFINITY } else { 0.5 })
                .collect();
            let mut y = vec![0f32; 256];
            let ggml = Encoding::Ggml { ty, step1: ty };
            assert!(
                encode(&o, ggml, (&w, 0), &mut y, None, "f: k").is_ok(),
                "{ty:?}"
            );
        }
    }
}
