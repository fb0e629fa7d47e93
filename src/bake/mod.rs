//! `bake`: a recipe in, a verified and checked release out, in one command.
//!
//! Owns: the order of a bake — plan everything (`plan`), then merge and restack in one
//! streaming pass with provenance stamped into every output file, run the recipe's checks
//! on the sealed output (`check`), commit, and verify the committed release against its
//! manifest. Does not own: the merge (`merge`), restacking (`layout`), the runner (`runner`),
//! atomic writing and manifests (`release`, `io`, `manifest`), showing progress (the CLI).
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
pub mod sign;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use check::CheckOutcome;
pub use error::BakeError;
pub use plan::{BakePlan, BaseHashing, HashCheck, Space, plan_bake};

use crate::io::staging::Replace;
use crate::linalg::SvdCache;
use crate::manifest::{VerifyReport, verify_committed};
use crate::merge::{
    BaseHash, Compute, MergeOptions, MergeReport, WriteSettings, prepare_merge, write_merge,
};
use crate::release::{Checked, Release};
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
/// band path, so a GPU bake is checked against an independent computation.
pub fn execute(plan: BakePlan, compute: &Compute) -> Result<BakeOutcome, BakeError> {
    if !plan.space.fits {
        return Err(BakeError::NoSpace {
            dir: plan.space.dir.clone(),
            needed: plan.space.needed,
            available: plan.space.available.unwrap_or(0),
        });
    }
    if !plan.prepared.base_hashed {
        return Err(BakeError::Internal(
            "the plan did not hash the base (a dry-run plan cannot be executed)".into(),
        ));
    }
    let BakePlan {
        recipe,
        base,
        adapters,
        options,
        prepared,
        ..
    } = plan;
    let cache = open_cache(&recipe)?;
    let signer = sign::load(&recipe)?;
    let normalised = recipe.normalised();
    let mut options_json = serde_json::json!({ "recipe": normalised });
    if let Some(s) = &signer {
        options_json["sign"] = s.record();
    }
    let sign_hook = signer.as_ref().map(|s| {
        let name = release_name(&recipe.output.dir);
        move |tmp: &Path| s.sign_staged(tmp, &name)
    });
    let settings = WriteSettings {
        command: "bake",
        options: options_json,
        file_metadata: provenance(&normalised, &prepared.inputs),
        replace: if recipe.output.overwrite {
            Replace::Overwrite
        } else {
            Replace::Never
        },
        svd_cache: cache.as_ref(),
        compute,
        before_commit: sign_hook.as_ref().map(|f| f as &crate::merge::BeforeCommit),
    };
    let reference_inputs = prepared.inputs.clone();
    // A quantized release has no config.json: its checks run with the base's.
    let run_config = options
        .quantize
        .and(base.components.first())
        .and_then(|c| c.sidecar("config.json"))
        .map(|s| s.path.clone());
    let mut outcomes = Vec::new();
    let outcome = write_merge(
        prepared,
        &base,
        &adapters,
        &options,
        &recipe.output.dir,
        settings,
        |staged| {
            let checking = crate::progress::begin("checking", 0, recipe.checks.len() as u64);
            let expected = expected_outputs(&recipe, &base, &adapters, &options, reference_inputs)?;
            for (c, want) in recipe.checks.iter().zip(&expected) {
                outcomes.push(check::run_check(
                    &recipe,
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
        },
    )?;
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
    std::fs::create_dir_all(dir).map_err(|e| crate::io::ReadError::io(dir, e))?;
    SvdCache::open(dir)
        .map(Some)
        .map_err(|e| BakeError::recipe(recipe, "merge.svd_cache", e.to_string()))
}

/// The provenance stamped into every output file's `__metadata__`.
fn provenance(
    normalised: &serde_json::Value,
    inputs: &[crate::manifest::InputRecord],
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

/// The expected tensor of every check: read from its golden file, or, for "unmerged",
/// produced by running the reference model: the same adapters merged in f32 with no
/// rounding, in the base's own layout, written beside the output and removed afterwards.
fn expected_outputs(
    recipe: &crate::recipe::Recipe,
    base: &crate::model::base_model::BaseModel,
    adapters: &[crate::merge::BoundAdapter],
    options: &MergeOptions,
    inputs: Vec<crate::manifest::InputRecord>,
) -> Result<Vec<Tensor>, BakeError> {
    let mut reference: Option<ReferenceDir> = None;
    let mut out = Vec::new();
    for c in &recipe.checks {
        if c.expected != "unmerged" {
            out.push(check::read_expected(c)?);
            continue;
        }
        if reference.is_none() {
            reference = Some(ReferenceDir::write(
                &recipe.output.dir,
                base,
                adapters,
                options,
                inputs.clone(),
            )?);
        }
        let dir = reference
            .as_ref()
            .map(|r| r.0.clone())
            .ok_or_else(|| BakeError::Internal("no reference model".into()))?;
        out.push(check::run_on(&dir, None, c)?);
    }
    Ok(out)
}

/// The f32 reference model of "unmerged" checks; removed when dropped.
struct ReferenceDir(PathBuf);

impl ReferenceDir {
    fn write(
        output: &Path,
        base: &crate::model::base_model::BaseModel,
        adapters: &[crate::merge::BoundAdapter],
        options: &MergeOptions,
        inputs: Vec<crate::manifest::InputRecord>,
    ) -> Result<ReferenceDir, BakeError> {
        let name = output
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "output".into());
        let dir = output.with_file_name(format!(".{name}.wanbake-reference"));
        let ref_options = options.f32_reference();
        let mut prepared = prepare_merge(base, adapters, &ref_options, BaseHash::Skip)?;
        prepared.inputs = inputs;
        prepared.base_hashed = true;
        let settings = WriteSettings {
            command: "bake-reference",
            options: serde_json::json!({}),
            file_metadata: BTreeMap::new(),
            replace: Replace::Overwrite,
            svd_cache: None,
            compute: &Compute::Cpu,
            before_commit: None,
        };
        let guard = ReferenceDir(dir.clone());
        write_merge(
            prepared,
            base,
            adapters,
            &ref_options,
            &dir,
            settings,
            |_| {
                Ok(Checked {
                    checks: serde_json::Value::Array(Vec::new()),
                    passed: true,
                })
            },
        )?;
        Ok(guard)
    }
}

impl Drop for ReferenceDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
