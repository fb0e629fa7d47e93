//! `convert`: dtype conversion of any safetensors checkpoint, mirroring its naming (single
//! file, shards + index, model folder, pipeline folder), or a WAN transformer quantized for
//! ComfyUI (`--to`), as a release with a manifest.
//!
//! Owns: `ConvertSpec` and `convert_release` (the output plan mirrors the
//! input, one job per tensor), and `encoded_release` (the pipeline's own output plan of a
//! quantized output or of MaxDiffusion's pretrained Orbax cache, with no adapters). All run through the pipeline with no targets
//! (`pipeline::write` with `CopyOnly`, whose copy-or-convert loop every producing command
//! uses: a tensor whose dtype does not change is copied byte for byte, otherwise it is
//! widened to f32 and rounded once with round-to-nearest-even). Does not own: the executor
//! (`pipeline::exec`), the atomic writer (`release`, `release::staging`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::format::header_layout::PlannedTensor;
use crate::io::checkpoint::Checkpoint;
use crate::layout::{KeepF32, OutputDType};
use crate::model::transform::Transform;
use crate::pipeline::{CopyOnly, Job, OutputOptions, PipelineError, Plan, Writing, write};
use crate::release::staging::Replace;
use crate::release::writer::{ComponentOutput, OutputPlan, Slot};
use crate::release::{Hooks, Release, ReleaseError};

/// A conversion request.
#[derive(Clone, Debug)]
pub struct ConvertSpec {
    /// Input checkpoint.
    pub input: PathBuf,
    /// Output directory.
    pub out: PathBuf,
    /// The dtype of every float tensor (`Keep`: each tensor's own); no tensor is kept in
    /// f32 by name (a generic checkpoint has no keep-f32 policy).
    pub dtype: OutputDType,
    /// Shard size (None: mirror nothing, one file per component).
    pub shard_bytes: Option<u64>,
    /// Replace an existing output.
    pub replace: Replace,
    /// What to do with values the output dtype cannot hold (NaN, ±inf, an f16 overflow).
    pub nonfinite: crate::pipeline::NonFinite,
}

/// Converts a whole checkpoint into a new release.
pub fn convert_release(spec: &ConvertSpec, hooks: Hooks<'_>) -> Result<Release, ReleaseError> {
    let ck = crate::quant::base::open_checkpoint(&spec.input).map_err(ReleaseError::Input)?;
    let components: Vec<ComponentOutput> = ck
        .components
        .iter()
        .map(|c| ComponentOutput {
            rel_dir: c.rel_dir.clone(),
            stem: c.weights_stem.clone(),
            tensors: c
                .tensors
                .tensors()
                .map(|t| PlannedTensor {
                    name: t.view.name.to_string(),
                    dtype: match spec.dtype.float() {
                        Some(d) if t.view.dtype.is_float() => d,
                        _ => t.view.dtype,
                    },
                    shape: t.view.shape.to_vec(),
                })
                .collect(),
            metadata: c.tensors.metadata(),
            sidecars: c
                .sidecars
                .iter()
                .map(|s| (s.name.clone(), s.text.clone().into_bytes()))
                .collect(),
            max_shard_bytes: spec.shard_bytes,
        })
        .collect();
    let root = crate::release::writer::root_aux_files(&ck);
    let jobs = mirror_jobs(&ck, &components);
    let mut output = OutputPlan::build(&components, &root).map_err(|e| {
        ReleaseError::produce(PipelineError::Plan(format!(
            "the output cannot be laid out: {e}"
        )))
    })?;
    output.carried = ck.carried.clone();
    let described = OutputOptions {
        dtype: spec.dtype,
        keep_f32: Some(KeepF32::None),
        layout: None,
        shard_bytes: spec.shard_bytes,
        quantize: None,
        container: crate::pipeline::output::Container::Safetensors,
        nonfinite: spec.nonfinite,
    };
    let plan = Plan::copy_only(&ck, output, jobs, "none".into(), described)
        .map_err(ReleaseError::produce)?
        .hash_base_while_writing("input");
    let mut options = serde_json::json!({
        "input": spec.input.display().to_string(),
        "dtype": spec.dtype.float().map(|d| d.as_str()),
        "shard_bytes": spec.shard_bytes,
    });
    spec.nonfinite.record(&mut options);
    let writing = Writing::new(&spec.out, spec.replace, "convert", options);
    let report = converted_report(&plan);
    write(&plan, writing, &CopyOnly, || Ok(report), hooks)
}

/// The report of a dtype conversion: tensors, and how many went from which dtype to which.
fn converted_report(plan: &Plan<'_>) -> serde_json::Value {
    let mut converted = BTreeMap::<String, usize>::new();
    for job in &plan.jobs {
        let from = plan.base.components[job.component]
            .tensors
            .get(&job.stored)
            .map(|t| t.view.dtype);
        if from != Some(job.dtype) {
            *converted
                .entry(format!(
                    "{}->{}",
                    from.map_or("?", |d| d.as_str()),
                    job.dtype
                ))
                .or_default() += 1;
        }
    }
    serde_json::json!({ "tensors": plan.jobs.len(), "converted": converted })
}

/// `convert --to`: the WAN transformer (or Wan 2.2 A14B pipeline, for Orbax) at `input` as
/// `options` encode it (from `OutputOptions::new`: one fp8-scaled or GGUF file, or
/// MaxDiffusion's pretrained Orbax cache, `pipeline::orbax`), with no adapters, recorded as
/// `convert` with the input's files under the role `input`.
pub fn encoded_release(
    input: &Path,
    options: &OutputOptions,
    dest: &Path,
    replace: Replace,
    hooks: Hooks<'_>,
) -> Result<Release, ReleaseError> {
    let orbax = options.container == crate::pipeline::Container::Orbax;
    if options.quantize.is_none() && !orbax {
        return Err(ReleaseError::produce(PipelineError::Internal(
            "convert --to: neither a quantized nor an Orbax output was asked for".into(),
        )));
    }
    let base = crate::quant::base::open(input)?;
    let plan = Plan::new(&base, &[], options)
        .map_err(ReleaseError::produce)?
        .hash_base_while_writing("input");
    let (mut described, report) = match options.quantize {
        Some(quantize) => (
            serde_json::json!({
                "input": input.display().to_string(),
                "to": quantize.format.as_str(),
                "high_precision": quantize.high_precision_label(),
                "city96_rounding": quantize.city96_rounding,
            }),
            serde_json::Value::Null,
        ),
        None => (
            serde_json::json!({
                "input": input.display().to_string(),
                "to": "orbax",
                "dtype": options.dtype.as_str(),
                "layout": options.layout.map(|l| l.as_str()),
            }),
            serde_json::json!({
                "arrays": plan.orbax.as_ref().map_or(0, |o| o.array_count()),
                "jobs": plan.jobs.len(),
                "keep_f32": plan.keep_f32,
                "dropped": plan.dropped_by_layout,
            }),
        ),
    };
    options.nonfinite.record(&mut described);
    let writing = Writing::new(dest, replace, "convert", described);
    write(&plan, writing, &CopyOnly, || Ok(report), hooks)
}

/// One job per stored tensor: copied, or converted to the dtype the output plan gives it.
fn mirror_jobs(ck: &Checkpoint, output: &[ComponentOutput]) -> Vec<Job> {
    let mut jobs = Vec::new();
    for (ci, (c, out)) in ck.components.iter().zip(output).enumerate() {
        for (t, planned) in c.tensors.tensors().zip(&out.tensors) {
            jobs.push(Job {
                component: ci,
                output: planned.name.clone(),
                slot: Slot { file: 0, tensor: 0 },
                dst_offset: 0,
                dtype: planned.dtype,
                transform: Transform::Identity,
                stored: t.view.name.to_string(),
                layer: None,
                stored_shape: t.view.shape.to_vec(),
                target: None,
                encoding: None,
                constant: None,
            });
        }
    }
    jobs
}
