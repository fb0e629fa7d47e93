//! Quantized deployment outputs of a WAN transformer: ComfyUI scaled fp8 safetensors and
//! city96 ComfyUI-GGUF files (spec quant_formats.md), written through the one release writer.
//!
//! Owns: `QuantPlan` (every output tensor under its original-Wan name with its encoding and
//! the reason, from `model::quant_rules`), the output file plan of each format (one
//! `.safetensors` with the `scaled_fp8` marker and `scale_weight` tensors, or one `.gguf`
//! laid out by `io::gguf`), [`encode_into`] (one f32 tensor → its bytes in the staged file,
//! plus the dequantized error), the quantization report, and `quantize_release` (the
//! `convert --to` path). Does not own: the encodings (`io::quant`), the rules
//! (`model::quant_rules`), name tables (`model::wan_names`) or the atomic writer (`release`).
//!
//! Every tensor is computed on its exact f32 value (the widened source, or the merged f32
//! weight) and rounded once to its encoding. A non-finite weight is an error naming the
//! file and key; nothing is written then.

use std::collections::BTreeMap;
use std::path::PathBuf;

use rayon::prelude::*;
use serde_json::json;

use crate::io::checkpoint::{Checkpoint, Component};
use crate::io::gguf::{self, GgufLayout, TensorPlan};
use crate::io::header_layout::PlannedTensor;
use crate::io::quant::fp8;
use crate::io::quant::ggml::{self, GgmlType};
use crate::io::staging::{Allocation, Replace, Staging};
use crate::io::writer::{ComponentOutput, OutputPlan};
use crate::io::{DType, dtype};
use crate::manifest::{InputRecord, record_inputs};
use crate::merge::MergeOptions;
use crate::model::quant_rules::{self, QuantFormat, Why};
use crate::model::wan_layout::Layout;
use crate::model::wan_names::{self, Position};
use crate::release::{Release, ReleaseError, ReleaseRequest, write_release};

/// The name of the fp8 marker tensor.
pub const FP8_MARKER: &str = "scaled_fp8";

/// How one output tensor is encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// A safetensors float dtype (fp8-scaled's high-precision tensors).
    Plain(DType),
    /// F8_E4M3 codes plus a 0-d F32 `scale_weight`.
    Fp8,
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
    /// fp8-scaled: the dtype of the tensors that are not nn.Linear weights (F16, BF16, F32).
    pub high_precision: DType,
    /// GGUF block types: quantize convert.py's step-1 rounding (F16/BF16) of each weight
    /// instead of the f32 weight, for byte-compatibility with city96's two-step files.
    pub city96_rounding: bool,
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

/// Maps a WAN transformer's tensor names (diffusers or original layout) to original-Wan
/// names and decides each tensor's encoding. `source` is (name, dtype, shape) per tensor.
pub fn plan(
    options: QuantOptions,
    source: &[(String, DType, Vec<usize>)],
) -> anyhow::Result<QuantPlan> {
    let names: Vec<&str> = source.iter().map(|(n, _, _)| n.as_str()).collect();
    let layout = crate::model::wan_layout::detect_layout(&names)?;
    if !matches!(layout, Layout::Diffusers | Layout::Wan) {
        anyhow::bail!(
            "--to {}: the input is in the {layout} layout; quantized outputs read the diffusers or \
             original-Wan layout.\nhint: `wanbake restack IN --to wan --out DIR` first",
            options.format
        );
    }
    let mut tensors = Vec::new();
    let mut skipped = Vec::new();
    for (name, dt, shape) in source {
        if name.contains(wan_names::SKIPPED_MARKER) {
            skipped.push(name.clone());
            continue;
        }
        let Some((entry, pos)) = wan_names::parse_stored(layout, name) else {
            anyhow::bail!("{name}: not a WAN transformer parameter of the {layout} layout");
        };
        if !dt.is_float() {
            anyhow::bail!("{name}: dtype {dt} is not a float type; cannot quantize it");
        }
        let block = match pos {
            Position::Block(b) => b,
            _ => 0,
        };
        let (wan, _) = entry.stored_name(Layout::Wan, block);
        let (encoding, why) = decide(&options, &wan, shape, *dt);
        tensors.push(QuantTensor {
            name: wan,
            source: name.clone(),
            shape: shape.clone(),
            encoding,
            why,
        });
    }
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(t) = tensors.iter().find(|t| t.name.len() > 127) {
        // convert.py's limit (spec §2.3); original-Wan names are far shorter.
        anyhow::bail!(
            "{}: output name {} is longer than GGUF's 127 characters",
            t.source,
            t.name
        );
    }
    if let Some(w) = tensors.windows(2).find(|w| w[0].name == w[1].name) {
        anyhow::bail!(
            "{} and {} map to the same name {}",
            w[0].source,
            w[1].source,
            w[0].name
        );
    }
    let clash = tensors
        .iter()
        .find(|t| t.name == FP8_MARKER || t.name.ends_with(".scale_weight"));
    if let (QuantFormat::Fp8Scaled, Some(t)) = (options.format, clash) {
        anyhow::bail!(
            "{}: the input already holds a scaled-fp8 tensor name",
            t.source
        );
    }
    Ok(QuantPlan {
        options,
        tensors,
        skipped,
    })
}

fn decide(o: &QuantOptions, name: &str, shape: &[usize], src: DType) -> (Encoding, Why) {
    if o.format == QuantFormat::Fp8Scaled {
        return if quant_rules::is_fp8_linear(name, shape) {
            (Encoding::Fp8, Why::Fp8Linear)
        } else {
            (Encoding::Plain(o.high_precision), Why::HighPrecision)
        };
    }
    let c = quant_rules::gguf_choice(o.format, name, shape, src == DType::BF16);
    (
        Encoding::Ggml {
            ty: c.ty,
            step1: c.step1,
        },
        c.why,
    )
}

impl QuantPlan {
    /// The output file plan: one fp8-scaled `.safetensors` named `{stem}.safetensors`, or
    /// one GGUF file `{stem}.gguf`, at the root of the release.
    pub fn output_plan(
        &self,
        stem: &str,
        metadata: BTreeMap<String, String>,
    ) -> anyhow::Result<OutputPlan> {
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
                    Encoding::Ggml { .. } => unreachable!("fp8 plans hold no ggml tensors"),
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
            return Ok(OutputPlan::build(&[c], &[])?);
        }
        let (kv, plans) = self.gguf_parts();
        let layout = GgufLayout::new(&kv, &plans);
        let mut out = OutputPlan::build(&[], &[])?;
        out.add_laid_out_file(
            0,
            PathBuf::from(format!("{stem}.gguf")),
            layout.to_header_layout(&plans),
        );
        Ok(out)
    }

    /// GGUF metadata (spec §2.2) and tensor infos (`ne` = torch shape reversed, every
    /// dimension kept).
    fn gguf_parts(&self) -> (Vec<(String, gguf::Value)>, Vec<TensorPlan>) {
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
        let plans = self
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
        (kv, plans)
    }
}

/// `L.weight` → `L.scale_weight`.
pub fn scale_name(weight: &str) -> String {
    format!(
        "{}.scale_weight",
        weight.strip_suffix(".weight").unwrap_or(weight)
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

impl ErrorStats {
    fn measure(w: &[f32], y: &[f32]) -> ErrorStats {
        let (mut max_abs, mut se, mut amax, mut sw) = (0f64, 0f64, 0f64, 0f64);
        for (&a, &b) in w.iter().zip(y) {
            let (a, b) = (a as f64, b as f64);
            let e = (a - b).abs();
            max_abs = max_abs.max(e);
            se += e * e;
            amax = amax.max(a.abs());
            sw += a * a;
        }
        let n = w.len().max(1) as f64;
        ErrorStats {
            max_abs,
            rms: (se / n).sqrt(),
            amax,
            rms_w: (sw / n).sqrt(),
        }
    }

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

/// Encodes tensor `t` from its f32 values `w` into its slot(s) of `staging` and returns the
/// dequantized error. `file` names the source in errors.
pub fn encode_into(
    staging: &Staging,
    options: &QuantOptions,
    t: &QuantTensor,
    w: &[f32],
    file: &str,
) -> anyhow::Result<ErrorStats> {
    if let Some(i) = w.iter().position(|x| !x.is_finite()) {
        anyhow::bail!(
            "{file}: {}: element {i} is {}; a quantized output needs finite weights",
            t.source,
            w[i]
        );
    }
    let slot = |name: &str| {
        staging
            .plan()
            .slot(0, name)
            .ok_or_else(|| anyhow::anyhow!("internal: no slot for {name}"))
    };
    let mut y = vec![0f32; w.len()];
    match t.encoding {
        Encoding::Plain(d) => {
            let bytes = dtype::from_f32_vec(d, w)?;
            dtype::widen_to_f32(d, &bytes, &mut y)?;
            staging.write(slot(&t.name)?, 0, &bytes)?;
        }
        Encoding::Fp8 => {
            let q = fp8::quantize_scaled(w);
            fp8::decode_scaled(&q.codes, q.scale, &mut y);
            staging.write(slot(&t.name)?, 0, &q.codes)?;
            staging.write(slot(&scale_name(&t.name))?, 0, &q.scale.to_le_bytes())?;
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
            let bytes = ggml::quantize_vec(ty, src)
                .ok_or_else(|| anyhow::anyhow!("internal: {} is not whole {ty} blocks", t.name))?;
            ggml::dequantize(ty, &bytes, &mut y);
            staging.write(slot(&t.name)?, 0, &bytes)?;
        }
    }
    Ok(ErrorStats::measure(w, &y))
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
        "high_precision": (plan.options.format == QuantFormat::Fp8Scaled)
            .then(|| plan.options.high_precision.as_str()),
        "city96_rounding": plan.options.city96_rounding,
        "skipped": plan.skipped,
        "summary": summary,
        "tensors": tensors,
        "note": "errors are of the dequantized value against the f32 weight; rel_max_err = \
                 max_abs_err / max|W|, rel_rms_err = rms_err / rms(W)",
    })
}

/// A `convert --to` request.
#[derive(Clone, Debug)]
pub struct QuantizeSpec {
    /// Input WAN transformer (diffusers folder, original single file, ...).
    pub input: PathBuf,
    /// Output release directory.
    pub out: PathBuf,
    /// Options.
    pub options: QuantOptions,
    /// Replace an existing output.
    pub replace: Replace,
}

/// The stem of the output weight file of `format`.
pub fn output_stem(format: QuantFormat) -> String {
    match format {
        QuantFormat::Fp8Scaled => "model_fp8_scaled".into(),
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

/// Where a quantized release comes from, for its manifest, when it is not a plain
/// `convert` of `QuantizeSpec::input` (the merge path).
#[derive(Clone, Debug)]
pub struct Provenance {
    /// Subcommand named in the manifest.
    pub command: String,
    /// Hashed inputs.
    pub inputs: Vec<InputRecord>,
    /// The manifest's `options`.
    pub options: serde_json::Value,
    /// Added to the report (e.g. `merge`: the merge report).
    pub report: serde_json::Map<String, serde_json::Value>,
    /// Paths the destination must not overlap (besides the input).
    pub input_paths: Vec<PathBuf>,
}

/// Converts a WAN transformer checkpoint into a quantized release (`convert --to`).
pub fn quantize_release(spec: &QuantizeSpec) -> Result<Release, ReleaseError> {
    quantize_release_from(spec, None)
}

/// [`quantize_release`], with the manifest's provenance given by the caller.
pub fn quantize_release_from(
    spec: &QuantizeSpec,
    provenance: Option<Provenance>,
) -> Result<Release, ReleaseError> {
    let produce_err = |e: anyhow::Error| ReleaseError::Produce(e);
    let ck = Checkpoint::open(&spec.input).map_err(|e| produce_err(e.into()))?;
    let comp = single_transformer(&ck, spec.options.format).map_err(produce_err)?;
    let qplan = plan(spec.options, &source_tensors(comp))
        .map_err(|e| produce_err(e.context(spec.input.display().to_string())))?;
    let out_plan = qplan
        .output_plan(&output_stem(spec.options.format), BTreeMap::new())
        .map_err(produce_err)?;
    let mut input_paths = vec![spec.input.clone()];
    let (command, inputs, options, mut report) = match provenance {
        Some(p) => {
            input_paths.extend(p.input_paths);
            (p.command, p.inputs, p.options, p.report)
        }
        None => {
            let input_files = ck.input_files();
            let inputs = record_inputs(
                &input_files
                    .iter()
                    .map(|p| ("input".to_string(), p.clone(), p.display().to_string()))
                    .collect::<Vec<_>>(),
            )
            .map_err(|e| produce_err(e.into()))?;
            let options = json!({
                "input": spec.input.display().to_string(),
                "to": spec.options.format.as_str(),
                "high_precision": (spec.options.format == QuantFormat::Fp8Scaled)
                    .then(|| spec.options.high_precision.as_str()),
                "city96_rounding": spec.options.city96_rounding,
            });
            (
                "convert".to_string(),
                inputs,
                options,
                serde_json::Map::new(),
            )
        }
    };
    let req = ReleaseRequest {
        dest: &spec.out,
        plan: out_plan,
        input_paths: &input_paths,
        inputs,
        hash_while_writing: Vec::new(),
        command: &command,
        options,
        replace: spec.replace,
        allocation: Allocation::Reserve,
    };
    write_release(req, |staging| {
        let stats: Vec<ErrorStats> = qplan
            .tensors
            .par_iter()
            .map(|t| -> anyhow::Result<ErrorStats> {
                let src = comp
                    .tensors
                    .get(&t.source)
                    .ok_or_else(|| anyhow::anyhow!("internal: {} vanished", t.source))?;
                let w = src.view.to_f32()?;
                let file = src.file.path().display().to_string();
                let s = encode_into(staging, &qplan.options, t, &w, &file)?;
                src.file.release(src.position);
                Ok(s)
            })
            .collect::<anyhow::Result<_>>()?;
        report.insert("tensors".into(), json!(qplan.tensors.len()));
        report.insert("quantization".into(), report_json(&qplan, &stats));
        Ok(serde_json::Value::Object(report))
    })
}

/// The one transformer of `ck`: a quantized output is one file, so a pipeline with two
/// experts is refused with the way out.
fn single_transformer(ck: &Checkpoint, format: QuantFormat) -> anyhow::Result<&Component> {
    match ck.components.as_slice() {
        [c] => Ok(c),
        many => anyhow::bail!(
            "{}: holds {} transformers ({}); --to {format} writes one file per transformer.\n\
             hint: pass one transformer folder, e.g. {}",
            ck.path.display(),
            many.len(),
            many.iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            ck.path
                .join(many.first().map_or("transformer", |c| c.name.as_str()))
                .display()
        ),
    }
}

/// A merge whose output is quantized (`merge --to`).
pub struct MergeQuantized<'a> {
    /// The base.
    pub base: &'a Checkpoint,
    /// Bound adapters.
    pub adapters: &'a [crate::merge::BoundAdapter],
    /// Merge options (dtype, layout, keep-f32 and shards are overridden: f32, wan, none,
    /// one file).
    pub merge: MergeOptions,
    /// The SVD cache.
    pub svd_cache: Option<&'a crate::linalg::SvdCache>,
    /// Where merged targets are computed.
    pub compute: &'a crate::merge::Compute,
    /// The quantized output.
    pub spec: QuantizeSpec,
}

/// Merges in f32 (original-Wan layout, nothing rounded) into a temporary release beside the
/// destination, then quantizes that release into the destination; the temporary release
/// is removed whatever happens. The manifest names the base and adapters as inputs and
/// carries the merge report beside the quantization report.
///
/// Two passes through the disk: the f32 intermediate needs the model's f32 size in free
/// space (not a one-pass merge-and-quantize).
pub fn merge_quantized(
    m: MergeQuantized<'_>,
) -> Result<(Release, crate::merge::MergeReport), anyhow::Error> {
    let dest = &m.spec.out;
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out".into());
    let tmp = dest.with_file_name(format!(".{name}.wanbake-f32-merge"));
    struct Remove<'p>(&'p std::path::Path);
    impl Drop for Remove<'_> {
        fn drop(&mut self) {
            let _ = fs_err::remove_dir_all(self.0);
        }
    }
    if m.spec.replace == Replace::Never && dest.symlink_metadata().is_ok() {
        return Err(crate::io::WriteError::Exists { path: dest.clone() }.into());
    }
    // Everything the quantizer would refuse is refused before the merge runs: one
    // transformer, a WAN layout it reads, float tensors.
    let comp = single_transformer(m.base, m.spec.options.format)?;
    plan(m.spec.options, &source_tensors(comp))
        .map_err(|e| e.context(m.base.path.display().to_string()))?;
    let merge_options = MergeOptions {
        dtype: crate::layout::OutputDType::F32,
        keep_f32: Some(crate::layout::KeepF32::None),
        layout: Some(Layout::Wan),
        shard_bytes: None,
        ..m.merge.clone()
    };
    let _cleanup = Remove(&tmp);
    let outcome = crate::merge::merge_release(
        m.base,
        m.adapters,
        &merge_options,
        m.svd_cache,
        &tmp,
        Replace::Overwrite,
        m.compute,
    )?;
    let mut options =
        crate::merge::options_json(m.base, m.adapters, &m.merge, m.svd_cache.is_some());
    if let Some(o) = options.as_object_mut() {
        o.remove("dtype");
        o.remove("keep_f32");
        o.remove("layout");
        o.remove("shard_bytes");
        o.insert("to".into(), json!(m.spec.options.format.as_str()));
        o.insert(
            "city96_rounding".into(),
            json!(m.spec.options.city96_rounding),
        );
        if m.spec.options.format == QuantFormat::Fp8Scaled {
            o.insert(
                "high_precision".into(),
                json!(m.spec.options.high_precision.as_str()),
            );
        }
    }
    let mut report = serde_json::Map::new();
    report.insert("merge".into(), serde_json::to_value(&outcome.report)?);
    let input_paths = m
        .base
        .input_files()
        .into_iter()
        .chain(m.adapters.iter().flat_map(|a| a.set.input_files()))
        .collect();
    let prov = Provenance {
        command: "merge".into(),
        inputs: outcome.release.manifest.inputs.clone(),
        options,
        report,
        input_paths,
    };
    let mut spec = m.spec.clone();
    spec.input = tmp.clone();
    let release = quantize_release_from(&spec, Some(prov)).map_err(|e| {
        anyhow::Error::from(e).context(format!(
            "quantizing the merge of {} (its f32 intermediate {} is removed)",
            m.base.path.display(),
            tmp.display()
        ))
    })?;
    Ok((release, outcome.report))
}
