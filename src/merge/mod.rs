//! How a merged target is computed: the merge engine the pipeline's executor plugs in.
//!
//! Owns: [`MergeOptions`] (how to merge), [`Merger`] (the `pipeline::TargetWriter` and
//! `pipeline::TargetValues` of a plan with adapters: each target on the route
//! `pipeline::Compute` names), [`write_merge`] (a ready plan written through
//! `pipeline::write` with a `Merger`, and its report), [`write_merges`] (a release matrix: the
//! `Merger`s of several plans sharing each target, `pipeline::write_matrix`),
//! [`merge_release`] and [`merge_releases`] (`wanbake merge`, one `--to` or several: plan,
//! then write), and through its submodules the
//! formulas (`math`), one merged target in bands or whole (`target`), the whole-tensor program
//! of the device routes (`device`), LyCORIS deltas (`lycoris`), -xs bases (`xs`), the report
//! (`report`) and the errors (`error`). Does not own: binding (`adapter`), the plan, the job
//! loop, base rows and compute lanes (`pipeline`), the SVD and its cache (`linalg`), atomic
//! output and manifests (`release`, `io`, `manifest`).
//!
//! Numerical contract (DESIGN.md): `W' = round_once(W0 + Σ_i a_i·(f_i(W0) − W0))` in f32,
//! with `W0` the original weight for every adapter, `f_i` the adapter's effective weight at
//! full strength, one round-to-nearest-even to the output dtype. `a_i = 0` skips adapter i
//! entirely (the output is bit-identical to the input). The strength also scales
//! full-tensor diffs (`diff`, `diff_b`, `diff_m`), as ComfyUI and diffusers `fuse_lora` do;
//! MaxDiffusion adds diffs unscaled. With `DoraStrength::Peft` the strength of DoRA/BoRA
//! kinds moves inside the norm (`W' = m ⊙ (W + a·σ·B·A)/‖W + a·σ·B·A‖`, what PEFT and
//! diffusers `fuse_lora(lora_scale=a)` compute); the two modes agree at `a = 1` and for
//! every non-normalised kind.

pub mod device;
pub mod error;
pub mod lycoris;
pub mod math;
pub mod options;
pub mod report;
mod target;
mod xs;

pub use error::MergeError;
pub use options::{DoraStrength, MergeOptions};
pub use report::{MergeReport, SvdReport};
pub use target::{MergedTarget, Merger, TargetScratch};

use std::path::Path;

use crate::adapter::BoundAdapter;
use crate::linalg::SvdCache;
use crate::model::base_model::BaseModel;
use crate::pipeline::{Compute, OutputOptions, PipelineError, Plan, Ready, Writing};
use crate::release::staging::Replace;
use crate::release::{Hooks, Release, ReleaseError};

/// How a merge is computed and recorded besides its plan.
pub struct Merging<'a> {
    /// How to merge.
    pub options: MergeOptions,
    /// Where targets are computed.
    pub compute: &'a Compute,
    /// The SVD basis cache, when given.
    pub svd_cache: Option<&'a SvdCache>,
}

impl Merging<'_> {
    /// The manifest's `options` of `wanbake merge` for `plan`.
    pub fn options_json(&self, plan: &Plan<'_>) -> serde_json::Value {
        let adapters: Vec<serde_json::Value> = (plan.adapters.iter())
            .map(|a| {
                serde_json::json!({
                    "adapter": a.shown,
                    "strength": a.strength,
                    "component": plan.base.components[a.component].name,
                })
            })
            .collect();
        let mut json = serde_json::json!({
            "adapters": adapters,
            "dora_strength": self.options.dora_strength.as_str(),
            "allow_unmatched": self.options.allow_unmatched,
            "svd_cache": self.svd_cache.is_some(),
        });
        let o = &plan.options;
        match o.quantize {
            None => {
                json["dtype"] = o.dtype.as_str().into();
                json["keep_f32"] = o.keep_f32.as_ref().map(|p| p.to_string()).into();
                json["layout"] = o.layout.map(|l| l.as_str()).into();
                json["shard_bytes"] = o.shard_bytes.into();
                if o.container == crate::pipeline::Container::Orbax {
                    json["to"] = "orbax".into();
                }
            }
            Some(q) => {
                json["to"] = q.format.as_str().into();
                json["city96_rounding"] = q.city96_rounding.into();
                if let Some(hp) = q.high_precision_label() {
                    json["high_precision"] = hp.into();
                }
            }
        }
        o.nonfinite.record(&mut json);
        json
    }

    /// The report of a merge of `plan` whose -xs bases cost `svd`.
    fn report(&self, plan: &Plan<'_>, svd: SvdReport) -> MergeReport {
        let o = &plan.options;
        MergeReport {
            adapters: plan.adapter_reports.clone(),
            dora_strength: self.options.dora_strength,
            strength_semantics: report::STRENGTH_SEMANTICS.to_string(),
            targets_merged: plan.targets.len(),
            tensors: plan.output.tensor_count(),
            layout: o
                .layout
                .map_or("same".to_string(), |l| l.as_str().to_string()),
            dtype: o.dtype.as_str().to_string(),
            keep_f32: plan.keep_f32.clone(),
            dropped_by_layout: plan.dropped_by_layout.clone(),
            svd,
            device: self.compute.record(),
        }
    }
}

/// A written merge.
#[derive(Debug)]
pub struct MergeOutcome {
    /// The release (directory and manifest).
    pub release: Release,
    /// The report, as it is in the manifest.
    pub report: MergeReport,
}

/// Writes a ready plan of a merge as a release (`pipeline::write` with a [`Merger`]);
/// `hooks` run on the sealed output. On any error nothing is left at the destination.
pub fn write_merge(
    ready: &Ready<'_>,
    merging: &Merging<'_>,
    writing: Writing<'_>,
    hooks: Hooks<'_>,
) -> Result<MergeOutcome, ReleaseError> {
    let mut outcomes = write_merges(vec![(ready, writing, hooks)], merging)?;
    outcomes.pop().ok_or_else(|| {
        ReleaseError::produce(PipelineError::Internal("a merge wrote no release".into()))
    })
}

/// Writes several ready plans of the same merge (a release matrix: the same base and
/// adapters, any outputs) in one pass, each target merged once (`pipeline::write_matrix`),
/// all or none; each release and report as [`write_merge`] writes it alone.
pub fn write_merges(
    outputs: Vec<(&Ready<'_>, Writing<'_>, Hooks<'_>)>,
    merging: &Merging<'_>,
) -> Result<Vec<MergeOutcome>, ReleaseError> {
    let plans: Vec<&Plan<'_>> = outputs.iter().map(|(r, _, _)| &***r).collect();
    let Some(first) = plans.first() else {
        return Ok(Vec::new());
    };
    let lead = Merger::new(first, &merging.options, merging.compute, merging.svd_cache);
    let mut mergers = vec![];
    for plan in &plans[1..] {
        mergers.push(lead.alongside(plan, &merging.options));
    }
    mergers.insert(0, lead);
    let mut reports: Vec<Option<MergeReport>> = vec![None; plans.len()];
    let mut matrix = Vec::with_capacity(plans.len());
    let each = outputs.into_iter().zip(&mergers).zip(reports.iter_mut());
    for (((ready, writing, hooks), merger), slot) in each {
        let plan: &Plan<'_> = ready;
        let report = move || {
            let r = merging.report(plan, merger.svd_report());
            let json = serde_json::to_value(&r).map_err(|e| {
                MergeError::from(PipelineError::Internal(format!("the report: {e}")))
            })?;
            *slot = Some(r);
            Ok(json)
        };
        matrix.push(crate::pipeline::MatrixOutput {
            ready,
            writing,
            targets: merger,
            report: Box::new(report),
            hooks,
        });
    }
    let releases = crate::pipeline::write_matrix(matrix)?;
    releases
        .into_iter()
        .zip(reports)
        .map(|(release, report)| {
            let report = report.ok_or_else(|| {
                ReleaseError::produce(PipelineError::Internal(
                    "the merge finished without a report".into(),
                ))
            })?;
            Ok(MergeOutcome { release, report })
        })
        .collect()
}

/// Why [`merge_release`] failed. Nothing is left at the destination.
#[derive(Debug, thiserror::Error)]
pub enum MergeFailure {
    /// Refused while planning (nothing was created).
    #[error(transparent)]
    Plan(Box<PipelineError>),
    /// Failed while writing (the temporary output was removed).
    #[error(transparent)]
    Write(Box<ReleaseError>),
}

/// `wanbake merge`: plans merging `adapters` into `base`, written as `output` says (every
/// refusal before anything exists at `dest`), then writes it to `dest`, the base hashed
/// while it is written, recorded as `merge`.
pub fn merge_release(
    base: &BaseModel,
    adapters: &[BoundAdapter],
    output: &OutputOptions,
    merging: &Merging<'_>,
    dest: &Path,
    replace: Replace,
) -> Result<MergeOutcome, MergeFailure> {
    let mut outcomes = merge_releases(base, adapters, &[(output, dest)], merging, replace)?;
    outcomes.pop().ok_or_else(|| {
        let e = PipelineError::Internal("a merge wrote no release".into());
        MergeFailure::Write(Box::new(ReleaseError::produce(e)))
    })
}

/// `wanbake merge --to A --to B …`: as [`merge_release`] for every (output, destination)
/// of a release matrix, planned first (every refusal before anything exists), then written
/// in one pass over the base, all or none (`write_merges`).
pub fn merge_releases(
    base: &BaseModel,
    adapters: &[BoundAdapter],
    outputs: &[(&OutputOptions, &Path)],
    merging: &Merging<'_>,
    replace: Replace,
) -> Result<Vec<MergeOutcome>, MergeFailure> {
    let mut ready: Vec<Ready<'_>> = Vec::with_capacity(outputs.len());
    for (output, _) in outputs {
        let plan =
            Plan::new(base, adapters, output).map_err(|e| MergeFailure::Plan(Box::new(e)))?;
        ready.push(match ready.first() {
            Some(first) => plan.ready_as(first),
            None => plan.hash_base_while_writing("base"),
        });
    }
    let writes = (ready.iter().zip(outputs))
        .map(|(r, (_, dest))| {
            let writing = Writing::new(dest, replace, "merge", merging.options_json(r));
            (r, writing, Hooks::default())
        })
        .collect();
    write_merges(writes, merging).map_err(|e| MergeFailure::Write(Box::new(e)))
}
