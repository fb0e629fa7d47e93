//! A release matrix's quality table: what each output costs, in bytes, in error and in CPU.
//!
//! Owns: [`QualityRow`] (one per output: its size on disk, its forward error against the
//! unrounded f32 merge on each check's inputs, the summary of its per-tensor weight error,
//! the CPU seconds its own encoding took), [`table`] and [`render`] (the text the CLI
//! prints). Does not own: running the checks or the reference (`bake`, `bake::check`,
//! `bake::reference`), the per-tensor errors (`quant::encode`, in each manifest's report).

use serde::Serialize;

use super::BakeOutcome;
use crate::human::size;
use crate::recipe::Recipe;

/// One output's row.
#[derive(Clone, Debug, Serialize)]
pub struct QualityRow {
    /// The output folder, as the recipe spells it.
    pub output: String,
    /// What it is: `to` (`gguf:q4_k_m`, `orbax`), or the dtype and layout.
    pub format: String,
    /// Bytes on disk (every file of the release, the manifest's list).
    pub bytes: u64,
    /// Per check: the output's forward run against the f32 merge's on the same inputs.
    pub forward: Vec<ForwardError>,
    /// Over the tensors a quantized output encodes (every encoding but a plain dtype):
    /// the worst and the mean relative error of the dequantized weights against the f32
    /// merge (`rel_max_err`, `rel_rms_err` of the manifest's report). `None` for an output
    /// of plain dtypes (its only error is the rounding, which `forward` measures).
    pub weight: Option<WeightError>,
    /// CPU seconds of this output's own jobs (copying, rounding, encoding, writing); the
    /// merge every output shares is no one output's.
    pub encode_cpu_seconds: f64,
}

/// One check's forward error.
#[derive(Clone, Debug, Serialize)]
pub struct ForwardError {
    /// The check.
    pub check: String,
    /// max |output − f32 merge|.
    pub max_abs: f64,
    /// mean |output − f32 merge|.
    pub mean_abs: f64,
}

/// The summary of a quantized output's per-tensor weight errors.
#[derive(Clone, Debug, Serialize)]
pub struct WeightError {
    /// Tensors encoded (not a plain dtype).
    pub tensors: usize,
    /// The largest `rel_max_err`.
    pub worst_rel_max: f64,
    /// The largest `rel_rms_err`.
    pub worst_rel_rms: f64,
    /// The mean `rel_rms_err`.
    pub mean_rel_rms: f64,
}

/// The table of a matrix's outcomes (in recipe order).
pub fn table(outcomes: &[BakeOutcome], recipe: &Recipe) -> Vec<QualityRow> {
    let outputs = recipe.outputs();
    (outcomes.iter().zip(&outputs))
        .map(|(o, r)| {
            let out = &r.output;
            let format = match &out.to {
                Some(to) => to.clone(),
                None => format!(
                    "{} {}",
                    out.dtype().unwrap_or("bf16"),
                    out.layout.as_deref().unwrap_or("(base layout)")
                ),
            };
            let forward = (recipe.checks.iter().zip(&o.forward_error))
                .map(|(c, d)| ForwardError {
                    check: c.name.clone().unwrap_or_default(),
                    max_abs: d.max_abs,
                    mean_abs: d.mean_abs,
                })
                .collect();
            QualityRow {
                output: r.relative(&out.dir),
                format,
                bytes: o.release.manifest.files.iter().map(|f| f.bytes).sum(),
                forward,
                weight: weight_error(&o.release.manifest.report),
                encode_cpu_seconds: o.encode_cpu_seconds,
            }
        })
        .collect()
}

/// The weight errors of a quantized output's report (`quantization.tensors`).
fn weight_error(report: &serde_json::Value) -> Option<WeightError> {
    let tensors = report.get("quantization")?.get("tensors")?.as_object()?;
    let plain = ["F32", "F16", "BF16"];
    let encoded: Vec<&serde_json::Value> = (tensors.values())
        .filter(|t| t["encoding"].as_str().is_some_and(|e| !plain.contains(&e)))
        .collect();
    if encoded.is_empty() {
        return None;
    }
    let field = |t: &serde_json::Value, k: &str| t[k].as_f64().unwrap_or(f64::NAN);
    let rms: Vec<f64> = encoded.iter().map(|t| field(t, "rel_rms_err")).collect();
    Some(WeightError {
        tensors: encoded.len(),
        worst_rel_max: encoded
            .iter()
            .map(|t| field(t, "rel_max_err"))
            .fold(0.0, f64::max),
        worst_rel_rms: rms.iter().copied().fold(0.0, f64::max),
        mean_rel_rms: rms.iter().sum::<f64>() / rms.len() as f64,
    })
}

/// The table as text lines: one row per output, the first check's forward error (every
/// check's is in the JSON).
pub fn render(rows: &[QualityRow]) -> Vec<String> {
    let mut lines = vec![format!(
        "  {:<28} {:>10} {:>11} {:>11} {:>12} {:>12} {:>8}",
        "quality: output", "size", "fwd max", "fwd mean", "w worst rms", "w mean rms", "enc CPU"
    )];
    let e = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3e}"));
    for r in rows {
        let first = r.forward.first();
        lines.push(format!(
            "  {:<28} {:>10} {:>11} {:>11} {:>12} {:>12} {:>7.1}s",
            r.format,
            size(r.bytes),
            e(first.map(|f| f.max_abs)),
            e(first.map(|f| f.mean_abs)),
            e(r.weight.as_ref().map(|w| w.worst_rel_rms)),
            e(r.weight.as_ref().map(|w| w.mean_rel_rms)),
            r.encode_cpu_seconds
        ));
    }
    lines
}
