//! `restack`: the pipeline with no adapters, from a checkpoint in any WAN layout to a release
//! in another.
//!
//! Owns: `restack_release` (open the checkpoint once, plan it with `layout::restack`, turn
//! each component's conversion into the plan's jobs, and write them through the pipeline:
//! `pipeline::write` with `CopyOnly`). Does not own: the layout planning, config handling
//! and report (`layout::restack`), the copy-or-convert kernel
//! (`layout::conversion::convert_piece`), argument parsing (`cli::restack`).

use std::path::Path;

use serde_json::Value;

use crate::layout::restack::{RestackError, RestackOptions, plan_restack, restack_report};
use crate::pipeline::output::conversion_jobs;
use crate::pipeline::{CopyOnly, ExecOptions, OutputOptions, Plan, Writing, write};
use crate::release::writer::{ComponentOutput, OutputPlan};
use crate::release::{Hooks, Release};

/// What a restack wrote.
#[derive(Debug)]
pub struct RestackOutcome {
    /// The release.
    pub release: Release,
    /// The report stored in the manifest.
    pub report: Value,
}

/// Converts the checkpoint at `input` and writes the release to `out`; `exec` tunes the run
/// (threads, band size) and never changes a byte.
pub fn restack_release(
    input: &Path,
    out: &Path,
    options: &RestackOptions,
    exec: &ExecOptions,
    hooks: Hooks<'_>,
) -> Result<RestackOutcome, RestackError> {
    let checkpoint = crate::quant::base::open(input)?;
    let plans = plan_restack(&checkpoint, options)?;
    let components: Vec<ComponentOutput> = plans.iter().map(|p| p.output.clone()).collect();
    let root = crate::release::writer::root_aux_files(&checkpoint);
    let output_err = |source: Box<dyn std::error::Error + Send + Sync>| RestackError::Output {
        path: out.to_path_buf(),
        source,
    };
    let mut output = OutputPlan::build(&components, &root).map_err(|e| output_err(Box::new(e)))?;
    output.carried = checkpoint.carried.clone();
    let jobs = plans
        .iter()
        .enumerate()
        .flat_map(|(ci, p)| conversion_jobs(ci, &p.conversion))
        .collect();
    let keep_f32: Vec<&str> = plans.iter().map(|p| p.keep_f32.as_str()).collect();
    let described = OutputOptions {
        dtype: options.dtype,
        keep_f32: options.keep_f32.clone(),
        layout: Some(options.to),
        shard_bytes: options.shard_bytes,
        quantize: None,
        container: crate::pipeline::output::Container::Safetensors,
        nonfinite: options.nonfinite,
    };
    let plan = Plan::copy_only(&checkpoint, output, jobs, keep_f32.join(", "), described)
        .map_err(|e| output_err(Box::new(e)))?
        .hash_base_while_writing("base");
    let report = restack_report(&checkpoint, &plans);
    let mut writing = Writing::new(out, options.replace, "restack", options.to_json());
    writing.exec = exec.clone();
    let manifest_report = report.clone();
    let release = write(&plan, writing, &CopyOnly, || Ok(manifest_report), hooks)?;
    Ok(RestackOutcome { release, report })
}
