//! The streaming merge engine: base + bound adapters → a verified release, in one pass.
//!
//! Owns: `merge_release` (hash the adapters, plan, hash the base, write through
//! `release::write_release`), `quantize_release` (`convert --to`: the same merge with no
//! adapters into a quantized output; `MergeOptions::quantize` makes any merge's output one
//! fp8-scaled or GGUF file, encoded in the job loop), and through its submodules the
//! `--adapter` syntax (`spec`),
//! binding specs to the base's transformers (`bind`), the plan and every refusal (`plan`,
//! `error`), the output files, dtypes and jobs (`output`), the formulas (`math`), the job
//! loop (`exec`), one merged target (`target`, reading base rows through `base_rows` and
//! -xs bases through `xs`) and the report (`report`). Does not own: parsing adapters and binding their
//! names (`adapter`), the SVD and its cache (`linalg`), layouts (`model`) and keep-f32
//! rules (`layout`), atomic output and manifests (`io`, `release`, `manifest`).
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

mod base_rows;
pub mod bind;
pub mod device;
pub mod error;
pub mod exec;
pub mod lycoris;
pub mod math;
pub mod output;
pub mod plan;
pub mod report;
pub mod restack;
pub mod spec;
mod target;
mod xs;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use bind::{BoundAdapter, BoundSet, bind_adapter, bind_specs, components_of};
pub use device::{Compute, DeviceReport};
pub use error::MergeError;
pub use plan::{BadOption, MergeChoices, MergeOptions, MergePlan, plan_merge};
pub use report::{DeviceRecord, DoraStrength, MergeReport};
pub use spec::{AdapterSpec, ComponentChoice};

use crate::io::Checkpoint;
use crate::io::staging::{Allocation, Replace};
use crate::linalg::SvdCache;
use crate::manifest::{InputFile, InputRecord, record_inputs};
use crate::model::base_model::BaseModel;
use crate::release::{Checked, Release, ReleaseError, ReleaseRequest, write_release_sealed};

/// A written merge.
#[derive(Debug)]
pub struct MergeOutcome {
    /// The release (directory and manifest).
    pub release: Release,
    /// The report, as it is in the manifest.
    pub report: MergeReport,
}

/// Why `merge_release` failed. Nothing is left at the destination.
#[derive(Debug, thiserror::Error)]
pub enum MergeFailure {
    /// Refused while planning (nothing was created).
    #[error(transparent)]
    Merge(Box<MergeError>),
    /// Failed while writing (the temporary output was removed).
    #[error(transparent)]
    Release(Box<ReleaseError>),
}

impl From<MergeError> for MergeFailure {
    fn from(e: MergeError) -> MergeFailure {
        MergeFailure::Merge(Box::new(e))
    }
}

impl From<ReleaseError> for MergeFailure {
    fn from(e: ReleaseError) -> MergeFailure {
        MergeFailure::Release(Box::new(e))
    }
}

/// Merges `adapters` into `base` and writes the result to `dest` as a release, computing
/// the targets where `compute` says.
///
/// Order of work: hash the adapters (their content orders contributions canonically), plan
/// and check everything, hash the base, then write. Every refusal of the plan comes before
/// the base is hashed and before anything exists at `dest`.
pub fn merge_release(
    base: &BaseModel,
    adapters: &[BoundAdapter],
    options: &MergeOptions,
    svd_cache: Option<&SvdCache>,
    dest: &Path,
    replace: Replace,
    compute: &Compute,
) -> Result<MergeOutcome, MergeFailure> {
    let prepared = prepare_merge(base, adapters, options, BaseHash::WhileWriting)?;
    let settings = WriteSettings {
        command: "merge",
        options: options_json(base, adapters, options, svd_cache.is_some()),
        file_metadata: BTreeMap::new(),
        replace,
        svd_cache,
        compute,
        before_commit: None,
    };
    write_merge(prepared, base, adapters, options, dest, settings, |_| {
        Ok(Checked {
            checks: serde_json::Value::Array(Vec::new()),
            passed: true,
        })
    })
}

/// `convert --to`: the merge of no adapters into a quantized output (`options.quantize`,
/// from `MergeOptions::new`), recorded as `convert` with the input's files under the role
/// `input`.
pub fn quantize_release(
    input: &Path,
    options: &MergeOptions,
    dest: &Path,
    replace: Replace,
) -> Result<Release, MergeFailure> {
    let Some(quantize) = options.quantize else {
        return Err(
            MergeError::Usage("convert --to: no quantized output was asked for".into()).into(),
        );
    };
    let base = BaseModel::open(input).map_err(MergeError::from)?;
    let mut prepared = prepare_merge(&base, &[], options, BaseHash::WhileWriting)?;
    for f in &mut prepared.hash_while_writing {
        f.0 = "input".into();
    }
    let settings = WriteSettings {
        command: "convert",
        options: serde_json::json!({
            "input": input.display().to_string(),
            "to": quantize.format.as_str(),
            "high_precision": (!quantize.format.is_gguf()).then(|| quantize.high_precision.as_str()),
            "city96_rounding": quantize.city96_rounding,
        }),
        file_metadata: BTreeMap::new(),
        replace,
        svd_cache: None,
        compute: &Compute::Cpu,
        before_commit: None,
    };
    let outcome = write_merge(prepared, &base, &[], options, dest, settings, |_| {
        Ok(Checked {
            checks: serde_json::Value::Array(Vec::new()),
            passed: true,
        })
    })?;
    Ok(outcome.release)
}

/// A merge planned and checked, its inputs hashed; nothing written yet.
#[derive(Debug)]
pub struct PreparedMerge {
    /// The plan.
    pub plan: MergePlan,
    /// Hashed inputs: every adapter file, and every base file when it was hashed now.
    pub inputs: Vec<InputRecord>,
    /// Base files to hash while the merge is written (`BaseHash::WhileWriting`).
    pub hash_while_writing: Vec<InputFile>,
    /// Is the base accounted for (hashed, or to be hashed while writing)?
    pub base_hashed: bool,
}

/// When the base files are hashed for the manifest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BaseHash {
    /// Before anything is written (`bake` stamps the hashes into every output header).
    Now,
    /// On a thread of its own while the merge runs (`merge`).
    WhileWriting,
    /// Not at all (a dry run; such a merge cannot be written).
    Skip,
}

/// Hashes the adapters, plans and checks the merge, and hashes the base (or schedules it)
/// as `hash_base` says. Every refusal of the plan comes before the base is hashed.
pub fn prepare_merge(
    base: &BaseModel,
    adapters: &[BoundAdapter],
    options: &MergeOptions,
    hash_base: BaseHash,
) -> Result<PreparedMerge, MergeError> {
    let adapter_inputs = adapter_records(adapters)?;
    let identities: Vec<String> = adapters
        .iter()
        .map(|a| identity(a, &adapter_inputs))
        .collect();
    let plan = plan_merge(base, adapters, options, &identities)?;
    let base_files: Vec<InputFile> = base
        .input_files()
        .into_iter()
        .map(|p| ("base".to_string(), p.clone(), p.display().to_string()))
        .collect();
    let (mut inputs, hash_while_writing) = match hash_base {
        BaseHash::Now => (
            record_inputs(&base_files).map_err(MergeError::Read)?,
            Vec::new(),
        ),
        BaseHash::WhileWriting => (Vec::new(), base_files),
        BaseHash::Skip => (Vec::new(), Vec::new()),
    };
    inputs.extend(adapter_inputs.into_values());
    inputs.sort();
    inputs.dedup();
    Ok(PreparedMerge {
        plan,
        inputs,
        hash_while_writing,
        base_hashed: hash_base != BaseHash::Skip,
    })
}

/// A step run on a complete staged release just before it is renamed into place.
pub type BeforeCommit<'a> = dyn Fn(&Path) -> anyhow::Result<()> + 'a;

/// How a prepared merge is recorded and watched.
pub struct WriteSettings<'a> {
    /// Subcommand named in the manifest.
    pub command: &'a str,
    /// The manifest's `options` (the normalised recipe for `bake`).
    pub options: serde_json::Value,
    /// Added to every weight file's `__metadata__` (provenance).
    pub file_metadata: BTreeMap<String, String>,
    /// Replace an existing destination?
    pub replace: Replace,
    /// The SVD basis cache, when given.
    pub svd_cache: Option<&'a SvdCache>,
    /// Where targets are computed.
    pub compute: &'a Compute,
    /// Runs on the complete temporary directory (manifest written) just before the rename
    /// (`release::write_release_sealed`); bake signs the release here.
    pub before_commit: Option<&'a BeforeCommit<'a>>,
}

/// Writes a prepared merge to `dest` as a release; `check` runs on the sealed output
/// before the manifest is written (`release::write_release_checked`).
pub fn write_merge(
    prepared: PreparedMerge,
    base: &Checkpoint,
    adapters: &[BoundAdapter],
    options: &MergeOptions,
    dest: &Path,
    settings: WriteSettings<'_>,
    check: impl FnOnce(&Path) -> anyhow::Result<Checked>,
) -> Result<MergeOutcome, MergeFailure> {
    if !prepared.base_hashed {
        return Err(MergeError::Internal(
            "a merge is written only after its base was hashed for the manifest".into(),
        )
        .into());
    }
    let mut plan = prepared.plan;
    if !settings.file_metadata.is_empty() {
        plan.output
            .stamp_metadata(&settings.file_metadata)
            .map_err(|e| MergeError::Internal(format!("output header: {e}")))?;
    }
    let input_paths: Vec<PathBuf> = base
        .input_files()
        .into_iter()
        .chain(adapters.iter().flat_map(|a| a.set.input_files()))
        .collect();
    let req = ReleaseRequest {
        dest,
        plan: plan.output.clone(),
        input_paths: &input_paths,
        inputs: prepared.inputs,
        hash_while_writing: prepared.hash_while_writing,
        command: settings.command,
        options: settings.options,
        replace: settings.replace,
        allocation: Allocation::Reserve,
    };
    let mut report = None;
    let before_commit = settings.before_commit;
    let release = write_release_sealed(
        req,
        |staging| {
            let exec = exec::Exec {
                base,
                adapters,
                plan: &plan,
                staging: Some(staging),
                svd_cache: settings.svd_cache,
                compute: settings.compute,
                quant_errors: Default::default(),
                copy_band_bytes: crate::layout::conversion::PIECE_BAND_BYTES,
            };
            let svd = exec.run()?;
            let r = build_report(&plan, options, svd, settings.compute);
            let json = match &plan.quant {
                None => serde_json::to_value(&r)?,
                Some(q) => quantized_report(q, &r, exec.quant_errors.into_inner(), adapters)?,
            };
            report = Some(r);
            Ok(json)
        },
        check,
        |tmp| before_commit.map_or(Ok(()), |f| f(tmp)),
    )?;
    let report =
        report.ok_or_else(|| MergeError::Internal("the merge finished without a report".into()))?;
    Ok(MergeOutcome { release, report })
}

/// The report of a quantized output: `tensors`, `quantization` (`quantize::report_json`)
/// and, when adapters were merged, `merge`.
fn quantized_report(
    q: &crate::quantize::QuantPlan,
    r: &MergeReport,
    errors: std::sync::LockResult<BTreeMap<String, crate::quantize::ErrorStats>>,
    adapters: &[BoundAdapter],
) -> anyhow::Result<serde_json::Value> {
    let errors = errors.map_err(|_| anyhow::anyhow!("internal: a worker panicked"))?;
    let stats = q
        .tensors
        .iter()
        .map(|t| {
            errors
                .get(&t.name)
                .copied()
                .ok_or_else(|| anyhow::anyhow!("internal: `{}` was not encoded", t.name))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut report = serde_json::Map::new();
    if !adapters.is_empty() {
        report.insert("merge".into(), serde_json::to_value(r)?);
    }
    report.insert("tensors".into(), q.tensors.len().into());
    report.insert(
        "quantization".into(),
        crate::quantize::report_json(q, &stats),
    );
    Ok(serde_json::Value::Object(report))
}

/// Hashes every adapter file once (an adapter bound to two components is one input).
fn adapter_records(
    adapters: &[BoundAdapter],
) -> Result<BTreeMap<PathBuf, InputRecord>, MergeError> {
    let mut files: Vec<(String, PathBuf, String)> = adapters
        .iter()
        .flat_map(|a| a.set.input_files())
        .map(|p| ("adapter".to_string(), p.clone(), p.display().to_string()))
        .collect();
    files.sort();
    files.dedup();
    let records = record_inputs(&files)?;
    Ok(files.into_iter().map(|(_, p, _)| p).zip(records).collect())
}

/// An adapter's content identity: the sha256 of each of its files, in path order.
fn identity(a: &BoundAdapter, records: &BTreeMap<PathBuf, InputRecord>) -> String {
    a.set
        .input_files()
        .iter()
        .filter_map(|p| records.get(p).map(|r| r.sha256.as_str()))
        .collect::<Vec<_>>()
        .join(",")
}

/// The manifest's `options` of `wanbake merge`.
pub fn options_json(
    base: &Checkpoint,
    adapters: &[BoundAdapter],
    o: &MergeOptions,
    svd_cache: bool,
) -> serde_json::Value {
    let adapters: Vec<serde_json::Value> = adapters
        .iter()
        .map(|a| {
            serde_json::json!({
                "adapter": a.shown,
                "strength": a.strength,
                "component": base.components[a.component].name,
            })
        })
        .collect();
    let mut json = serde_json::json!({
        "adapters": adapters,
        "dora_strength": o.dora_strength.as_str(),
        "allow_unmatched": o.allow_unmatched,
        "svd_cache": svd_cache,
    });
    match o.quantize {
        None => {
            json["dtype"] = o.dtype.as_str().into();
            json["keep_f32"] = o.keep_f32.as_ref().map(|p| p.to_string()).into();
            json["layout"] = o.layout.map(|l| l.as_str()).into();
            json["shard_bytes"] = o.shard_bytes.into();
        }
        Some(q) => {
            json["to"] = q.format.as_str().into();
            json["city96_rounding"] = q.city96_rounding.into();
            if !q.format.is_gguf() {
                json["high_precision"] = q.high_precision.as_str().into();
            }
        }
    }
    json
}

fn build_report(
    plan: &MergePlan,
    o: &MergeOptions,
    svd: report::SvdReport,
    compute: &Compute,
) -> MergeReport {
    MergeReport {
        adapters: plan.adapters.clone(),
        dora_strength: o.dora_strength,
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
        device: compute.record(),
    }
}
