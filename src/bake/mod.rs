//! `bake`: a recipe in, a verified and checked release out, in one command.
//!
//! Owns: the order of a bake — plan everything (`plan`), then merge and restack in one
//! streaming pass with provenance stamped into every output file, run the recipe's checks
//! on the sealed output (`check`, against golden files or the unmerged reference model,
//! computed tensor by tensor and never written: `reference`), commit, and verify the
//! committed release against its manifest. Does not own: the merge (`merge`), restacking
//! (`layout`), the runner (`runner`), atomic writing and manifests (`release`, `io`,
//! `manifest`), showing progress (the CLI).
//!
//! Provenance: the manifest's `options` is `{"recipe": <normalised recipe>}` and its
//! `inputs` carry every input file's sha256 (paths as the recipe spells them); every weight
//! file's `__metadata__` carries the same as `wanbake.recipe` and `wanbake.inputs`, plus
//! `wanbake.version`. With `[sign]`, the manifest's `options.sign` records the public key's
//! hint and the release is signed (`sign`) before it is committed. Nothing depends on time, host or the directory the bake ran from, so
//! the same recipe and inputs give byte-identical outputs and manifest.

pub mod check;
pub mod error;
pub mod plan;
pub mod reference;
pub mod sign;

use std::collections::BTreeMap;
use std::path::Path;

pub use check::CheckOutcome;
pub use error::BakeError;
pub use plan::{BakeInputs, BakePlan, DryRun, HashCheck, Planned, Space, open_bake};

use crate::linalg::SvdCache;
use crate::merge::{MergeReport, Merging, write_merge};
use crate::pipeline::{Compute, OutputOptions, Plan, Writing};
use crate::release::manifest::{VerifyReport, verify_committed};
use crate::release::staging::Replace;
use crate::release::{Checked, DirHook, HookError, Hooks, Release};
use crate::runner::Tensor;

/// A finished bake (checks may have failed: see `passed`).
#[derive(Debug)]
pub struct BakeOutcome {
    /// The committed release.
    pub release: Release,
    /// The merge report.
    pub report: MergeReport,
    /// Every check's result.
    pub checks: Vec<CheckOutcome>,
    /// `wanbake verify` of the committed output.
    pub verify: VerifyReport,
    /// Did every check pass?
    pub passed: bool,
}

/// Writes, checks, commits and verifies a planned bake, computing merged targets where
/// `compute` says. The f32 reference model of "unmerged" checks is always merged on the CPU
/// band path, so a GPU bake is checked against an independent computation (`reference`).
pub fn execute(plan: BakePlan<'_>, compute: &Compute) -> Result<BakeOutcome, BakeError> {
    if !plan.space.fits {
        return Err(BakeError::NoSpace {
            dir: plan.space.dir.clone(),
            needed: plan.space.needed,
            available: plan.space.available.unwrap_or(0),
        });
    }
    let Planned { inputs, ready, .. } = plan.into_inner();
    let recipe = &inputs.recipe;
    let cache = open_cache(recipe)?;
    let signer = sign::load(recipe)?;
    let normalised = recipe.normalised();
    let mut options_json = serde_json::json!({ "recipe": normalised });
    if let Some(s) = &signer {
        options_json["sign"] = s.record();
    }
    let replace = if recipe.output.overwrite {
        Replace::Overwrite
    } else {
        Replace::Never
    };
    let mut writing = Writing::new(&recipe.output.dir, replace, "bake", options_json);
    writing.file_metadata = provenance(&normalised, &ready.inputs);
    let merging = Merging {
        options: inputs.merge,
        compute,
        svd_cache: cache.as_ref(),
    };
    // A quantized release has no config.json: its checks run with the base's.
    let run_config = inputs
        .output
        .quantize
        .and(inputs.base.components.first())
        .and_then(|c| c.sidecar("config.json"))
        .map(|s| s.path.clone());
    let mut outcomes = Vec::new();
    let check = |staged: &Path| -> Result<Checked, HookError> {
        let checking = crate::progress::begin("checking", 0, recipe.checks.len() as u64);
        let expected = expected_outputs(inputs)?;
        for (c, want) in recipe.checks.iter().zip(&expected) {
            outcomes.push(check::run_check(
                recipe,
                staged,
                run_config.as_deref(),
                c,
                want,
            )?);
            checking.add_item();
        }
        Ok(Checked {
            checks: serde_json::to_value(&outcomes)?,
            passed: outcomes.iter().all(|o| o.passed),
        })
    };
    let name = release_name(&recipe.output.dir);
    let hooks = Hooks {
        check: Some(Box::new(check)),
        before_commit: signer.as_ref().map(|s| {
            Box::new(move |tmp: &Path| s.sign_staged(tmp, &name).map_err(HookError::from))
                as DirHook<'_, ()>
        }),
        gate: None,
    };
    let outcome = write_merge(&ready, &merging, writing, hooks)?;
    let dir = outcome.release.dir.clone();
    let written = outcome.release.manifest.to_canonical_bytes();
    let verify = verify_committed(&dir, &written)?;
    if !verify.ok() {
        let what: Vec<String> = verify
            .mismatches
            .iter()
            .take(5)
            .map(|m| format!("{}: {}", m.path, m.what))
            .collect();
        return Err(BakeError::Verify {
            dir: dir.display().to_string(),
            what: what.join("; "),
        });
    }
    let passed = outcomes.iter().all(|o| o.passed);
    Ok(BakeOutcome {
        release: outcome.release,
        report: outcome.report,
        checks: outcomes,
        verify,
        passed,
    })
}

/// The release folder's own name (the signature's subject name), not the temporary one.
fn release_name(dir: &Path) -> String {
    dir.file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("")
        .to_string()
}

/// The SVD basis cache of `[merge]`, created when missing.
fn open_cache(recipe: &crate::recipe::Recipe) -> Result<Option<SvdCache>, BakeError> {
    let Some(dir) = &recipe.merge.svd_cache else {
        return Ok(None);
    };
    SvdCache::create(dir)
        .map(Some)
        .map_err(|e| BakeError::unusable(recipe, "merge.svd_cache", e))
}

/// The provenance stamped into every output file's `__metadata__`.
fn provenance(
    normalised: &serde_json::Value,
    inputs: &[crate::release::manifest::InputRecord],
) -> BTreeMap<String, String> {
    let inputs: Vec<serde_json::Value> = inputs
        .iter()
        .map(|r| serde_json::json!({"role": r.role, "path": r.path, "bytes": r.bytes, "sha256": r.sha256}))
        .collect();
    BTreeMap::from([
        ("wanbake.recipe".to_string(), normalised.to_string()),
        (
            "wanbake.inputs".to_string(),
            serde_json::Value::Array(inputs).to_string(),
        ),
        (
            "wanbake.version".to_string(),
            env!("CARGO_PKG_VERSION").to_string(),
        ),
    ])
}

/// The expected tensor of every check: read from its golden file, or, for "unmerged", the
/// output of the reference model (`reference`): the same adapters merged in f32 with no
/// rounding, in the base's own layout, computed tensor by tensor as the runner asks (on the
/// CPU band path, whatever `compute` the bake used) and never written.
fn expected_outputs(inputs: &BakeInputs) -> Result<Vec<Tensor>, BakeError> {
    let recipe = &inputs.recipe;
    let plan = match recipe.checks.iter().any(|c| c.expected == "unmerged") {
        true => Some(Plan::new(
            &inputs.base,
            &inputs.adapters,
            &OutputOptions::f32_reference(),
        )?),
        false => None,
    };
    let models = match &plan {
        Some(plan) => Some(
            reference::reference_models(plan, &inputs.merge)
                .map_err(|e| BakeError::check_input(&Some("unmerged".into()), None, e))?,
        ),
        None => None,
    };
    let mut out = Vec::new();
    for c in &recipe.checks {
        match (&models, c.expected == "unmerged") {
            (Some(models), true) => out.push(check::run_set(models, c)?),
            (None, true) => return Err(BakeError::Internal("no reference model".into())),
            (_, false) => out.push(check::read_expected(c)?),
        }
    }
    Ok(out)
}
