//! Writing a ready plan as a release: the one call every producer of a plan makes.
//!
//! Owns: [`write`] (stamp the provenance into the output headers, hand the plan's output to
//! the release writer, run the executor as its producer, and turn what ran into the
//! manifest's report: the producer's own, for a quantized output the quantization report
//! around it, for an Orbax output its chunks' value digests beside it (`orbax`, `producer`),
//! and the values written that the output cannot hold, when allowed (`nonfinite`)) and [`Writing`], how a write is recorded. Does not own: the release writer's
//! steps (`release`), the jobs (`pipeline::exec`), what a target is (`merge`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::error::PipelineError;
use super::exec::{Exec, ExecOptions, TargetWriter};
use super::nonfinite::UnheldValues;
use super::plan::{Plan, Ready};
use crate::quant::encode::{Encoding, ErrorStats};
use crate::release::staging::{Allocation, Replace};
use crate::release::{Hooks, Release, ReleaseError, ReleaseRequest, write_release};

/// How a plan is written and recorded.
pub struct Writing<'a> {
    /// The release directory.
    pub dest: &'a Path,
    /// Replace an existing destination?
    pub replace: Replace,
    /// Subcommand named in the manifest.
    pub command: &'a str,
    /// The manifest's `options` (the normalised recipe for `bake`).
    pub options: serde_json::Value,
    /// Added to every weight file's `__metadata__` (provenance).
    pub file_metadata: BTreeMap<String, String>,
    /// Threads and band size (never a byte of the output).
    pub exec: ExecOptions,
}

impl<'a> Writing<'a> {
    /// A write to `dest` recorded as `command` with `options`, no provenance stamped, default
    /// threads and bands.
    pub fn new(
        dest: &'a Path,
        replace: Replace,
        command: &'a str,
        options: serde_json::Value,
    ) -> Writing<'a> {
        Writing {
            dest,
            replace,
            command,
            options,
            file_metadata: BTreeMap::new(),
            exec: ExecOptions::default(),
        }
    }
}

/// Writes `ready` as a release (the plan is not changed: provenance is stamped into the
/// writer's copy of the output plan). `targets` computes the jobs that read a target (`CopyOnly`
/// for a plan that changes none); `report` turns what ran into the manifest's report
/// (given each encoded tensor's dequantized error; a quantized output's report wraps it, as
/// `merge`, when the plan has adapters). `hooks` run on the sealed output (`release::Hooks`).
/// On any error nothing is left at the destination.
pub fn write<T: TargetWriter>(
    ready: &Ready<'_>,
    writing: Writing<'_>,
    targets: &T,
    report: impl FnOnce() -> Result<serde_json::Value, T::Error>,
    hooks: Hooks<'_>,
) -> Result<Release, ReleaseError>
where
    T::Error: std::error::Error + Sync + 'static,
{
    let plan: &Plan<'_> = ready;
    let mut output = plan.output.clone();
    if !writing.file_metadata.is_empty() {
        output.stamp_metadata(&writing.file_metadata).map_err(|e| {
            ReleaseError::produce(PipelineError::Internal(format!("output header: {e}")))
        })?;
    }
    // The paths as given (a folder's own path: nothing may be written inside it) and every
    // file read, for the overlap check and the inputs-unchanged check.
    let input_paths: Vec<PathBuf> = std::iter::once(plan.base.path.clone())
        .chain(plan.base.input_files())
        .chain(plan.adapters.iter().map(|a| a.set.path.clone()))
        .chain(plan.adapters.iter().flat_map(|a| a.set.input_files()))
        .collect();
    let req = ReleaseRequest {
        dest: writing.dest,
        plan: output,
        input_paths: &input_paths,
        inputs: ready.inputs.clone(),
        hash_while_writing: ready.hash_while_writing.clone(),
        command: writing.command,
        options: writing.options,
        replace: writing.replace,
        allocation: Allocation::Reserve,
    };
    let exec = writing.exec;
    write_release(
        req,
        |staging| {
            let ran = Exec::new(plan, staging, exec).run(targets)?;
            let report = report()?;
            let report = match (&plan.quant, ran.orbax) {
                (Some(_), _) => quantized_report(plan, report, &ran.quant_errors, &ran.saturated)
                    .map_err(T::Error::from)?,
                (None, Some(orbax)) => serde_json::json!({ "orbax": orbax, "producer": report }),
                (None, None) => report,
            };
            Ok::<_, T::Error>(with_unheld(with_quantized_base(plan, report), &ran.unheld))
        },
        hooks,
    )
}

/// `report` with what a quantized base was (`base_quantized`: its format, the facts
/// `quant::base` found, the tensors decoded and the side tensors consumed) and, when the
/// output is quantized again, a warning that says so. Unchanged for any other base.
fn with_quantized_base(plan: &Plan<'_>, report: serde_json::Value) -> serde_json::Value {
    let Some(q) = &plan.base.quantized else {
        return report;
    };
    let mut base = serde_json::json!({
        "format": q.format,
        "details": q.details,
        "decoded_tensors": q.decoded,
        "side_tensors_consumed": q.consumed.len(),
    });
    if plan.quant.is_some() {
        base["warning"] = format!(
            "the base was already quantized ({}); this output quantizes its decoded values \
             again, so both errors add up",
            q.format
        )
        .into();
    }
    match report {
        serde_json::Value::Object(mut m) => {
            m.insert("base_quantized".into(), base);
            serde_json::Value::Object(m)
        }
        other => serde_json::json!({ "base_quantized": base, "producer": other }),
    }
}

/// The report with `nonfinite`: every tensor written with values its output cannot hold
/// (allowed, `NonFinite::Allow`), in output order. A report without such values is
/// returned as it is, so a valid input's manifest does not change.
fn with_unheld(report: serde_json::Value, unheld: &[UnheldValues]) -> serde_json::Value {
    if unheld.is_empty() {
        return report;
    }
    let list: Vec<serde_json::Value> = unheld.iter().map(UnheldValues::to_json).collect();
    match report {
        serde_json::Value::Object(mut o) => {
            o.insert("nonfinite".into(), list.into());
            serde_json::Value::Object(o)
        }
        other => serde_json::json!({ "nonfinite": list, "producer": other }),
    }
}

/// The report of a quantized output: `tensors`, `quantization` (`quantize::report_json`,
/// with each scaled-fp8 tensor's `saturated` count and their sum in the summary) and, when
/// adapters were merged, `merge` (the producer's report).
fn quantized_report(
    plan: &Plan<'_>,
    merged: serde_json::Value,
    errors: &BTreeMap<String, ErrorStats>,
    saturated: &BTreeMap<String, usize>,
) -> Result<serde_json::Value, PipelineError> {
    let Some(q) = &plan.quant else {
        return Ok(merged);
    };
    let stats = (q.tensors.iter())
        .map(|t| {
            errors
                .get(&t.name)
                .copied()
                .ok_or_else(|| PipelineError::Internal(format!("`{}` was not encoded", t.name)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut report = serde_json::Map::new();
    if !plan.adapters.is_empty() {
        report.insert("merge".into(), merged);
    }
    report.insert("tensors".into(), q.tensors.len().into());
    let mut quantization = crate::quant::encode::report_json(q, &stats);
    let mut total = None;
    for t in q.tensors.iter().filter(|t| t.encoding == Encoding::Fp8) {
        let n = saturated.get(&t.name).copied().unwrap_or(0);
        quantization["tensors"][&t.name]["saturated"] = n.into();
        *total.get_or_insert(0) += n;
    }
    if let Some(total) = total {
        quantization["summary"][Encoding::Fp8.name()]["saturated"] = total.into();
    }
    report.insert("quantization".into(), quantization);
    Ok(serde_json::Value::Object(report))
}
