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
use super::exec::{Exec, ExecOptions, ExecOutcome, TargetWriter};
use super::matrix::run_matrix;
use super::nonfinite::UnheldValues;
use super::plan::{Plan, Ready};
use crate::quant::encode::{Encoding, ErrorStats};
use crate::release::staging::{Allocation, Replace};
use crate::release::{Hooks, Release, ReleaseError, ReleaseRequest, write_releases};

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
    /// Where the CPU seconds the output's own jobs took go (`ExecOutcome::cpu_seconds`), for
    /// a release matrix's quality table; never a byte of the output.
    pub cpu_seconds: Option<&'a std::sync::Mutex<f64>>,
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
            cpu_seconds: None,
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
    let output = MatrixOutput {
        ready,
        writing,
        targets,
        report: Box::new(report),
        hooks,
    };
    let mut releases = write_matrix(vec![output])?;
    releases
        .pop()
        .ok_or_else(|| ReleaseError::produce(PipelineError::Internal("no release".into())))
}

/// The report of one output of a matrix, made once every output has run.
pub type Report<'a, E> = Box<dyn FnOnce() -> Result<serde_json::Value, E> + 'a>;

/// One output of [`write_matrix`]: as the arguments of [`write`].
pub struct MatrixOutput<'a, 'p, T: TargetWriter> {
    /// Its ready plan (every output's of the same base, adapters and inputs).
    pub ready: &'a Ready<'p>,
    /// How it is written and recorded.
    pub writing: Writing<'a>,
    /// Its target writer.
    pub targets: &'a T,
    /// Its producer's report.
    pub report: Report<'a, T::Error>,
    /// Its hooks.
    pub hooks: Hooks<'a>,
}

/// Writes several plans of the same base and adapters as releases in one pass
/// (`pipeline::matrix`: each stored tensor read once, each target computed once), all or
/// none (`release::write_releases`). Each release is byte-identical to the same plan written
/// alone by [`write`]. On any error nothing is left at any destination.
pub fn write_matrix<T: TargetWriter>(
    outputs: Vec<MatrixOutput<'_, '_, T>>,
) -> Result<Vec<Release>, ReleaseError>
where
    T::Error: std::error::Error + Sync + 'static,
{
    let mut paths = Vec::with_capacity(outputs.len());
    let mut plans = Vec::with_capacity(outputs.len());
    for o in &outputs {
        let plan: &Plan<'_> = o.ready;
        let mut output = plan.output.clone();
        if !o.writing.file_metadata.is_empty() {
            output
                .stamp_metadata(&o.writing.file_metadata)
                .map_err(|e| {
                    ReleaseError::produce(PipelineError::Internal(format!("output header: {e}")))
                })?;
        }
        plans.push(output);
        // The paths as given (a folder's own path: nothing may be written inside it) and
        // every file read, for the overlap check and the inputs-unchanged check.
        let input_paths: Vec<PathBuf> = std::iter::once(plan.base.path.clone())
            .chain(plan.base.input_files())
            .chain(plan.adapters.iter().map(|a| a.set.path.clone()))
            .chain(plan.adapters.iter().flat_map(|a| a.set.input_files()))
            .collect();
        paths.push(input_paths);
    }
    let mut reqs = Vec::with_capacity(outputs.len());
    let mut runs = Vec::with_capacity(outputs.len());
    let mut hooks = Vec::with_capacity(outputs.len());
    for ((o, output), input_paths) in outputs.into_iter().zip(plans).zip(&paths) {
        reqs.push(ReleaseRequest {
            dest: o.writing.dest,
            plan: output,
            input_paths,
            inputs: o.ready.inputs.clone(),
            hash_while_writing: o.ready.hash_while_writing.clone(),
            command: o.writing.command,
            options: o.writing.options,
            replace: o.writing.replace,
            allocation: Allocation::Reserve,
        });
        runs.push((
            o.ready,
            o.writing.exec,
            o.targets,
            o.report,
            o.writing.cpu_seconds,
        ));
        hooks.push(o.hooks);
    }
    write_releases(
        reqs,
        |stagings| {
            let execs = (runs.iter().zip(stagings))
                .map(|((ready, exec, ..), staging)| Exec::new(ready, staging, exec.clone()))
                .collect();
            let targets: Vec<&T> = runs.iter().map(|r| r.2).collect();
            let ran = run_matrix(execs, &targets)?;
            let mut reports = Vec::with_capacity(ran.len());
            for ((ready, _, _, report, cpu), ran) in runs.into_iter().zip(ran) {
                if let Some(Ok(mut c)) = cpu.map(|c| c.lock()) {
                    *c = ran.cpu_seconds;
                }
                reports.push(full_report(ready, report()?, ran)?);
            }
            Ok::<_, T::Error>(reports)
        },
        hooks,
    )
}

/// The manifest's report of `ready` from its producer's `report` and what its run found.
fn full_report<E: From<PipelineError>>(
    ready: &Ready<'_>,
    report: serde_json::Value,
    ran: ExecOutcome,
) -> Result<serde_json::Value, E> {
    let plan: &Plan<'_> = ready;
    let report = match (&plan.quant, ran.orbax) {
        (Some(_), _) => quantized_report(plan, report, &ran.quant_errors, &ran.saturated)?,
        (None, Some(orbax)) => serde_json::json!({ "orbax": orbax, "producer": report }),
        (None, None) => report,
    };
    Ok(with_unheld(with_quantized_base(plan, report), &ran.unheld))
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
