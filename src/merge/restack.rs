//! Running a `restack`: the merge pipeline with no adapters, from a checkpoint in any WAN
//! layout to a release in another.
//!
//! Owns: `restack_release` (open the checkpoint once, plan it with `layout::restack`, turn
//! each component's conversion into the merge plan's jobs, and write them through the one
//! executor, `merge::exec`, into the one release writer, `release` over `io::staging`).
//! Does not own: the layout planning, config handling and report (`layout::restack`), the
//! copy-or-convert kernel (`layout::conversion::convert_piece`), argument parsing (`cli::restack`).

use std::path::Path;

use serde_json::Value;

use super::exec::{ExecOptions, copy_plan};
use super::output::conversion_jobs;
use super::plan::MergePlan;
use crate::io::staging::Allocation;
use crate::io::writer::{ComponentOutput, OutputPlan};
use crate::layout::restack::{RestackError, RestackOptions, plan_restack, restack_report};
use crate::model::base_model::BaseModel;
use crate::release::{Release, ReleaseRequest, write_release};

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
) -> Result<RestackOutcome, RestackError> {
    let checkpoint = BaseModel::open(input)?;
    let plans = plan_restack(&checkpoint, options)?;
    let components: Vec<ComponentOutput> = plans.iter().map(|p| p.output.clone()).collect();
    let root = checkpoint.root_aux_files();
    let output_err = |reason: String| RestackError::Output {
        path: out.to_path_buf(),
        reason,
    };
    let output = OutputPlan::build(&components, &root).map_err(|e| output_err(e.to_string()))?;
    let jobs = plans
        .iter()
        .enumerate()
        .flat_map(|(ci, p)| conversion_jobs(ci, &p.conversion))
        .collect();
    let keep_f32: Vec<&str> = plans.iter().map(|p| p.keep_f32.as_str()).collect();
    let plan = MergePlan::untouched(output, jobs, Vec::new(), keep_f32.join(", "))
        .map_err(|e| output_err(e.to_string()))?;
    let input_paths = checkpoint.input_files();
    let hash_while_writing = input_paths
        .iter()
        .map(|p| ("base".to_string(), p.clone(), p.display().to_string()))
        .collect();
    let report = restack_report(&checkpoint, &plans);
    let request = ReleaseRequest {
        dest: out,
        plan: plan.output.clone(),
        input_paths: &input_paths,
        inputs: Vec::new(),
        hash_while_writing,
        command: "restack",
        options: options.to_json(),
        replace: options.replace,
        allocation: Allocation::Reserve,
    };
    let report_for_manifest = report.clone();
    let release = write_release(request, |staging| {
        copy_plan(&checkpoint, &plan, staging, exec)?;
        Ok(report_for_manifest)
    })?;
    Ok(RestackOutcome { release, report })
}
