//! `bake`: a recipe in, a verified and checked release out, in one command.
//!
//! Owns: the order of a bake — plan everything (`plan`), then merge and restack in one
//! streaming pass with provenance stamped into every output file, run the recipe's checks
//! on the sealed output (`check`, against golden files or the unmerged reference model,
//! computed tensor by tensor and never written: `reference`), commit, and verify the
//! committed release against its manifest. A recipe with several `[[output]]` tables is a
//! release matrix: every output is written in the same pass (`merge::write_merges`), each
//! recording the recipe with it alone, checked against expected tensors computed once, and
//! committed with the others or not at all; its quality table is `quality`. Does not own:
//! the merge (`merge`), restacking (`layout`), the runner (`runner`), atomic writing and
//! manifests (`release`, `io`, `manifest`), showing progress (the CLI).
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
pub mod quality;
pub mod reference;
pub mod sign;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::Path;

pub use check::CheckOutcome;
pub use error::BakeError;
pub use plan::{BakeInputs, BakeOutput, BakePlan, DryRun, HashCheck, Planned, Space, open_bake};

use crate::linalg::SvdCache;
use crate::merge::{MergeReport, Merging, write_merges};
use crate::pipeline::{Compute, OutputOptions, Plan, Writing};
use crate::release::manifest::{VerifyReport, verify_committed};
use crate::release::staging::Replace;
use crate::release::{Checked, HookError, Hooks, Release};
use crate::runner::Tensor;

/// A finished bake of one output (checks may have failed: see `passed`).
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
    /// CPU seconds this output's own jobs took (its copying, rounding and encoding: a
    /// release matrix's shared merge is no one output's); 0 for a bake of one output.
    pub encode_cpu_seconds: f64,
    /// Per check: this output's forward output against the unrounded f32 merge's on the
    /// check's inputs (a release matrix's quality table; empty for one output).
    pub forward_error: Vec<check::Diff>,
}

/// Writes, checks, commits and verifies a planned bake, computing merged targets where
/// `compute` says: every output of a release matrix in one pass (each base tensor read and
/// each target merged once, `merge::write_merges`), committed all or none. The f32
/// reference model of "unmerged" checks (and of a matrix's quality table) is always merged
/// on the CPU band path, so a GPU bake is checked against an independent computation
/// (`reference`), and computed once for every output. Returns each output's outcome, in
/// order.
pub fn execute(plan: BakePlan<'_>, compute: &Compute) -> Result<Vec<BakeOutcome>, BakeError> {
    if let Some(s) = plan.space.iter().find(|s| !s.fits) {
        return Err(BakeError::NoSpace {
            dir: s.dir.clone(),
            needed: plan.space.iter().map(|s| s.needed).sum(),
            available: s.available.unwrap_or(0),
        });
    }
    let Planned { inputs, ready, .. } = plan.into_inner();
    let recipe = &inputs.recipe;
    let cache = open_cache(recipe)?;
    let signer = sign::load(recipe)?;
    let merging = Merging {
        options: inputs.merge,
        compute,
        svd_cache: cache.as_ref(),
    };
    let matrix = recipe.is_matrix();
    let expected = Expected::new(matrix);
    let n = inputs.outputs.len();
    let outcomes: Vec<RefCell<Vec<(CheckOutcome, Tensor)>>> =
        (0..n).map(|_| RefCell::default()).collect();
    let cpu: Vec<std::sync::Mutex<f64>> = (0..n).map(|_| Default::default()).collect();
    let names: Vec<String> = (inputs.outputs.iter())
        .map(|o| release_name(&o.recipe.output.dir))
        .collect();
    let verified: Vec<RefCell<Option<VerifyReport>>> = (0..n).map(|_| RefCell::default()).collect();
    let mut writes = Vec::with_capacity(n);
    for (i, (o, r)) in inputs.outputs.iter().zip(&ready).enumerate() {
        let normalised = o.recipe.normalised();
        let mut options_json = serde_json::json!({ "recipe": normalised });
        if let Some(s) = &signer {
            options_json["sign"] = s.record();
        }
        let replace = match o.recipe.output.overwrite {
            true => Replace::Overwrite,
            false => Replace::Never,
        };
        let dir = &o.recipe.output.dir;
        let mut writing = Writing::new(dir, replace, "bake", options_json);
        writing.file_metadata = provenance(&normalised, &r.inputs);
        if matrix {
            writing.cpu_seconds = Some(&cpu[i]);
        }
        let (expected, outcomes) = (&expected, &outcomes[i]);
        let check = move |staged: &Path| -> Result<Checked, HookError> {
            let checks = run_checks(inputs, &o.recipe, staged, expected)?;
            let json: Vec<&CheckOutcome> = checks.iter().map(|(c, _)| c).collect();
            let checked = Checked {
                checks: serde_json::to_value(&json)?,
                passed: checks.iter().all(|(c, _)| c.passed),
            };
            if matrix && !checked.passed {
                return Err(matrix_check_failed(&o.recipe, &checks).into());
            }
            *outcomes.borrow_mut() = checks;
            Ok(checked)
        };
        let (name, verified, signer) = (&names[i], &verified[i], signer.as_ref());
        // Signed, then (a matrix, which commits all or none) verified before the commit.
        let before_commit = move |tmp: &Path| -> Result<(), HookError> {
            if let Some(s) = signer {
                s.sign_staged(tmp, name)?;
            }
            if matrix {
                let manifest = std::fs::read(tmp.join(crate::io::checkpoint::MANIFEST_NAME))?;
                let report = verify_committed(tmp, &manifest)?;
                verified_ok(&o.recipe.output.dir, &report)?;
                *verified.borrow_mut() = Some(report);
            }
            Ok(())
        };
        let hooks = Hooks {
            check: Some(Box::new(check)),
            before_commit: Some(Box::new(before_commit)),
            gate: None,
        };
        writes.push((r, writing, hooks));
    }
    let written = write_merges(writes, &merging)?;
    let mut done = Vec::with_capacity(n);
    let each = written.into_iter().zip(outcomes).zip(cpu).zip(verified);
    for (((outcome, checks), cpu), verified) in each {
        let dir = outcome.release.dir.clone();
        let verify = match verified.into_inner() {
            Some(before_commit) => before_commit,
            None => {
                let manifest = outcome.release.manifest.to_canonical_bytes();
                let verify = verify_committed(&dir, &manifest)?;
                verified_ok(&dir, &verify)?;
                verify
            }
        };
        let checks = checks.into_inner();
        let forward_error = match matrix {
            true => expected.forward_errors(&checks),
            false => Vec::new(),
        };
        let checks: Vec<CheckOutcome> = checks.into_iter().map(|(c, _)| c).collect();
        done.push(BakeOutcome {
            release: outcome.release,
            report: outcome.report,
            passed: checks.iter().all(|c| c.passed),
            checks,
            verify,
            encode_cpu_seconds: cpu.into_inner().unwrap_or_default(),
            forward_error,
        });
    }
    Ok(done)
}

/// A verification that found differences, as the error of the bake.
fn verified_ok(dir: &Path, verify: &VerifyReport) -> Result<(), BakeError> {
    if verify.ok() {
        return Ok(());
    }
    let what: Vec<String> = (verify.mismatches.iter().take(5))
        .map(|m| format!("{}: {}", m.path, m.what))
        .collect();
    Err(BakeError::Verify {
        dir: dir.display().to_string(),
        what: what.join("; "),
    })
}

/// The error of a matrix output whose checks did not all pass.
fn matrix_check_failed(
    recipe: &crate::recipe::Recipe,
    checks: &[(CheckOutcome, Tensor)],
) -> BakeError {
    let failed: Vec<String> = (checks.iter().filter(|(c, _)| !c.passed))
        .map(|(c, _)| {
            format!(
                "check `{}` failed (max |diff| {:.3e}, tolerance {:.3e})",
                c.name, c.max_abs_diff, c.tolerance
            )
        })
        .collect();
    BakeError::MatrixCheckFailed {
        output: recipe.relative(&recipe.output.dir),
        what: failed.join("; "),
    }
}

/// Runs `recipe`'s checks (one output's) on the staged output at `staged`: each outcome with
/// the tensor the run produced.
fn run_checks(
    inputs: &BakeInputs,
    recipe: &crate::recipe::Recipe,
    staged: &Path,
    expected: &Expected,
) -> Result<Vec<(CheckOutcome, Tensor)>, BakeError> {
    if recipe.checks.is_empty() {
        return Ok(Vec::new());
    }
    let checking = crate::progress::begin("checking", 0, recipe.checks.len() as u64);
    // A quantized release has no config.json: its checks run with the base's.
    let run_config = inputs
        .outputs
        .iter()
        .find(|o| o.recipe.output.dir == recipe.output.dir)
        .and_then(|o| o.options.quantize)
        .and(inputs.base.components.first())
        .and_then(|c| c.sidecar("config.json"))
        .map(|s| s.path.clone());
    let mut out = Vec::with_capacity(recipe.checks.len());
    for (i, c) in recipe.checks.iter().enumerate() {
        let want = expected.expected(inputs, i)?;
        out.push(check::run_check(
            recipe,
            staged,
            run_config.as_deref(),
            c,
            &want,
        )?);
        checking.add_item();
    }
    Ok(out)
}

/// The expected tensors of the checks, computed once for every output of a bake: a golden
/// file's, or for "unmerged" the reference model's output (`reference`). A release matrix
/// also runs the reference on every check's inputs, for its quality table.
struct Expected {
    matrix: bool,
    tensors: RefCell<Option<Vec<Tensor>>>,
    reference: RefCell<Option<Vec<Tensor>>>,
}

impl Expected {
    fn new(matrix: bool) -> Expected {
        Expected {
            matrix,
            tensors: RefCell::default(),
            reference: RefCell::default(),
        }
    }

    /// Check `i`'s expected tensor.
    fn expected(&self, inputs: &BakeInputs, i: usize) -> Result<Tensor, BakeError> {
        if self.tensors.borrow().is_none() {
            let t = expected_outputs(inputs, self.matrix)?;
            *self.reference.borrow_mut() = t.1;
            *self.tensors.borrow_mut() = Some(t.0);
        }
        let t = self.tensors.borrow();
        (t.as_ref().and_then(|t| t.get(i)).cloned())
            .ok_or_else(|| BakeError::Internal(format!("no expected tensor for check {i}")))
    }

    /// Each check's run against the unrounded f32 merge's output on the same inputs.
    fn forward_errors(&self, checks: &[(CheckOutcome, Tensor)]) -> Vec<check::Diff> {
        let reference = self.reference.borrow();
        let Some(reference) = reference.as_ref() else {
            return Vec::new();
        };
        (checks.iter().zip(reference))
            .map(|((_, got), want)| check::compare(&got.data, &want.data))
            .collect()
    }
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
/// CPU band path, whatever `compute` the bake used) and never written. With `all`, also the
/// reference model's output on every check's inputs (a release matrix's quality table).
fn expected_outputs(
    inputs: &BakeInputs,
    all: bool,
) -> Result<(Vec<Tensor>, Option<Vec<Tensor>>), BakeError> {
    let recipe = &inputs.recipe;
    let unmerged = recipe.checks.iter().any(|c| c.expected == "unmerged");
    let plan = match unmerged || (all && !recipe.checks.is_empty()) {
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
    let mut reference = Vec::new();
    for c in &recipe.checks {
        let run = match &models {
            Some(models) if c.expected == "unmerged" || all => Some(check::run_set(models, c)?),
            _ => None,
        };
        match (run, c.expected == "unmerged") {
            (Some(t), true) => {
                reference.push(t.clone());
                out.push(t);
            }
            (None, true) => return Err(BakeError::Internal("no reference model".into())),
            (run, false) => {
                reference.extend(run);
                out.push(check::read_expected(c)?);
            }
        }
    }
    Ok((out, all.then_some(reference)))
}
