//! The plan of every producing command: every bound entry placed on its base tensor, every
//! output tensor laid out, every job decided, before the first byte is written.
//!
//! Owns: [`Plan`] (borrowing its base and bound adapters): its targets (bound entries
//! grouped by base tensor, contributions in canonical order) attached to its jobs, the
//! per-adapter facts of the report ([`AdapterReport`]), the checks binding cannot make
//! (non-finite adapter values, targets the output layout leaves out, integer outputs of
//! merged tensors), and when the base is hashed ([`Plan::hash_base`] or
//! [`Plan::hash_base_while_writing`], which give the [`Ready`] plan the writer takes). Does not own: binding and its checks
//! (`adapter::bound`; a `BoundAdapter` is never re-checked here), the output side
//! (`pipeline::output`), how a contribution is computed (`merge`), running the jobs
//! (`pipeline::exec`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use rayon::prelude::*;
use serde::Serialize;

use super::error::PipelineError;
use super::job::{Contribution, Job, RowOrder, Target};
use super::nonfinite::{Origin, UnheldValues};
use super::output::{OutputOptions, OutputSide, plan_output, resolve_slots};
use crate::adapter::{BoundAdapter, Entry, view_2d};
use crate::codec::dtype::Unheld;
use crate::io::{Checkpoint, Component, ReadError, TensorView};
use crate::model::base_model::BaseModel;
use crate::model::sa3;
use crate::model::transform::Transform;
use crate::quant::encode::QuantPlan;
use crate::release::manifest::{InputFile, InputRecord, record_inputs};
use crate::release::writer::OutputPlan;

/// Everything a producing command will write, and from what.
#[derive(Debug)]
pub struct Plan<'a> {
    /// The base read.
    pub base: &'a Checkpoint,
    /// The adapters bound to it (none for `convert` and `restack`).
    pub adapters: &'a [BoundAdapter],
    /// The output files.
    pub output: OutputPlan,
    /// The jobs, largest first.
    pub jobs: Vec<Job>,
    /// Base tensors that change.
    pub targets: Vec<Target>,
    /// Per-adapter facts of the report, in adapter order.
    pub adapter_reports: Vec<AdapterReport>,
    /// Base keys the layout conversion leaves out on purpose.
    pub dropped_by_layout: Vec<String>,
    /// Keep-f32 policy applied, in words.
    pub keep_f32: String,
    /// How it writes: the options it was planned with (a copy-only plan's, as its command
    /// describes them).
    pub options: OutputOptions,
    /// The quantized output's tensors, encodings and reasons, when the output is quantized.
    pub quant: Option<QuantPlan>,
    /// The Orbax output's items and chunks (`--to orbax`).
    pub orbax: Option<super::orbax::OrbaxPlan>,
    /// Every adapter file, hashed (their content orders contributions).
    pub adapter_inputs: Vec<InputRecord>,
}

/// (stored tensor, layer) → (job, target) of each target: where to find the values of a
/// stored tensor an adapter touches ([`Plan::targets_by_stored`]).
pub type TargetIndex = std::collections::HashMap<(String, Option<usize>), (usize, usize)>;

impl<'a> Plan<'a> {
    /// Checks everything and plans merging `adapters` into `base`, written as `options`
    /// say. Hashes the adapters (their content orders contributions canonically) and reads
    /// their tensors (to refuse non-finite values), but not the base, and writes nothing.
    pub fn new(
        base: &'a BaseModel,
        adapters: &'a [BoundAdapter],
        options: &OutputOptions,
    ) -> Result<Plan<'a>, PipelineError> {
        let adapter_inputs = adapter_records(adapters)?;
        let identities: Vec<String> = adapters
            .iter()
            .map(|a| identity(a, &adapter_inputs))
            .collect();
        let (mut targets, adapter_reports) = bind_targets(base, adapters)?;
        if !options.nonfinite.allows() {
            check_finite(adapters)?;
        }
        for t in &mut targets {
            t.contributions.sort_by(|a, b| {
                contribution_key(adapters, &identities, a).cmp(&contribution_key(
                    adapters,
                    &identities,
                    b,
                ))
            });
        }
        let OutputSide {
            output,
            jobs,
            dropped,
            keep_f32,
            quant,
            orbax,
        } = plan_output(base, options)?;
        let mut plan = Plan {
            base,
            adapters,
            output,
            jobs,
            targets,
            adapter_reports,
            dropped_by_layout: dropped,
            keep_f32,
            options: options.clone(),
            quant,
            orbax,
            adapter_inputs: adapter_inputs.into_values().collect(),
        };
        attach_targets(&mut plan)?;
        Ok(plan)
    }

    /// A plan that changes no tensor (`restack`, `convert`): `jobs` copy or convert base
    /// tensors into `output`, as `options` describe; their slots are resolved here.
    pub fn copy_only(
        base: &'a Checkpoint,
        output: OutputPlan,
        mut jobs: Vec<Job>,
        keep_f32: String,
        options: OutputOptions,
    ) -> Result<Plan<'a>, PipelineError> {
        resolve_slots(&output, &mut jobs)?;
        Ok(Plan {
            base,
            adapters: &[],
            output,
            jobs,
            targets: Vec::new(),
            adapter_reports: Vec::new(),
            dropped_by_layout: Vec::new(),
            keep_f32,
            options,
            quant: None,
            orbax: None,
            adapter_inputs: Vec::new(),
        })
    }

    /// Every target of component `component` (every component: `None`), by the stored
    /// tensor and layer it is computed for.
    pub fn targets_by_stored(&self, component: Option<usize>) -> TargetIndex {
        (self.jobs.iter().enumerate())
            .filter(|(_, job)| component.is_none_or(|c| job.component == c))
            .filter_map(|(j, job)| {
                job.target
                    .map(|t| ((job.stored.clone(), job.layer), (j, t)))
            })
            .collect()
    }

    /// The base's files under `role` in the manifest.
    fn base_files(&self, role: &str) -> Vec<InputFile> {
        (self.base.input_files().into_iter())
            .map(|p| (role.to_string(), p.clone(), p.display().to_string()))
            .collect()
    }

    /// Hashes the base now, recording its files under `role` (`bake` stamps every input's
    /// hash into the output headers, so it needs them before writing).
    pub fn hash_base(self, role: &str) -> Result<Ready<'a>, ReadError> {
        let mut inputs = record_inputs(&self.base_files(role))?;
        inputs.extend(self.adapter_inputs.iter().cloned());
        Ok(Ready::new(self, inputs, Vec::new()))
    }

    /// Accounts for this plan's inputs as `other`'s are (another output of the same base
    /// and adapters in a release matrix: hashed once, recorded in every manifest).
    pub fn ready_as(self, other: &Ready<'_>) -> Ready<'a> {
        let inputs = other.inputs.clone();
        Ready::new(self, inputs, other.hash_while_writing.clone())
    }

    /// Schedules the base's files to be hashed, under `role`, on a thread of their own while
    /// the plan is written (the base is read once either way).
    pub fn hash_base_while_writing(self, role: &str) -> Ready<'a> {
        let files = self.base_files(role);
        let inputs = self.adapter_inputs.clone();
        Ready::new(self, inputs, files)
    }
}

/// A plan whose inputs are accounted for: hashed, or to be hashed while it is written. Only
/// [`Plan::hash_base`] and [`Plan::hash_base_while_writing`] make one, and only a `Ready`
/// plan can be written (`pipeline::write`). Derefs to the plan.
#[derive(Debug)]
pub struct Ready<'a> {
    plan: Plan<'a>,
    /// Inputs hashed, sorted, for the manifest.
    pub inputs: Vec<InputRecord>,
    /// Inputs hashed while the plan is written.
    pub(super) hash_while_writing: Vec<InputFile>,
}

impl<'a> Ready<'a> {
    fn new(plan: Plan<'a>, mut inputs: Vec<InputRecord>, files: Vec<InputFile>) -> Ready<'a> {
        inputs.sort();
        inputs.dedup();
        Ready {
            plan,
            inputs,
            hash_while_writing: files,
        }
    }
}

impl<'a> std::ops::Deref for Ready<'a> {
    type Target = Plan<'a>;
    fn deref(&self) -> &Plan<'a> {
        &self.plan
    }
}

/// Hashes every adapter file once (an adapter bound to two components is one input).
fn adapter_records(adapters: &[BoundAdapter]) -> Result<BTreeMap<PathBuf, InputRecord>, ReadError> {
    let mut files: Vec<InputFile> = adapters
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

/// Canonical order of contributions to one target: by adapter content, strength, module,
/// entry index. Floating-point sums are commutative for two terms only; sorting makes any
/// number of adapters give the same bytes in any command-line order.
fn contribution_key<'a>(
    adapters: &'a [BoundAdapter],
    identities: &'a [String],
    c: &Contribution,
) -> (&'a str, u64, &'a str, usize) {
    let a = &adapters[c.adapter];
    (
        identities.get(c.adapter).map_or("", String::as_str),
        a.strength.to_bits(),
        a.set.entries[c.entry].module.as_str(),
        c.entry,
    )
}

/// Groups every bound entry by base tensor (and layer), checking each against it.
fn bind_targets(
    base: &Checkpoint,
    adapters: &[BoundAdapter],
) -> Result<(Vec<Target>, Vec<AdapterReport>), PipelineError> {
    let mut by_name: BTreeMap<(usize, String, Option<usize>), Target> = BTreeMap::new();
    let mut reports = Vec::with_capacity(adapters.len());
    for (ai, ad) in adapters.iter().enumerate() {
        let comp = &base.components[ad.component];
        let mut report = adapter_report(ad, comp);
        let mut merged = std::collections::BTreeSet::new();
        for (ei, e) in ad.set.entries.iter().enumerate() {
            let Some(name) = &e.target else { continue };
            let target = target_of(ad, e, comp, name)?;
            let rank = e.rank.unwrap_or(1);
            count_entry(&mut report, e);
            merged.insert((name.to_string(), target.layer));
            if ad.strength == 0.0 {
                continue;
            }
            by_name
                .entry((ad.component, name.to_string(), target.layer))
                .or_insert(target)
                .contributions
                .push(Contribution {
                    adapter: ai,
                    entry: ei,
                    kind: e.kind,
                    strength: ad.strength,
                    scale: e.scale,
                    rank,
                });
        }
        report.targets_merged = if ad.strength == 0.0 { 0 } else { merged.len() };
        reports.push(report);
    }
    Ok((by_name.into_values().collect(), reports))
}

/// The base tensor an entry names, as a target without contributions: where it is stored
/// (the binding's layer and transform for NNX bases, the MLX Conv1d row order), its
/// PyTorch-layout shape and 2-D view.
fn target_of(
    ad: &BoundAdapter,
    e: &Entry,
    comp: &Component,
    name: &str,
) -> Result<Target, PipelineError> {
    let view = comp
        .tensors
        .get(name)
        .ok_or_else(|| {
            PipelineError::Internal(format!(
                "`{}`: entry `{}` was bound to `{name}`, which component `{}` lacks",
                ad.set.path.display(),
                e.module,
                comp.name
            ))
        })?
        .view;
    let rows = row_order(comp, &view);
    let (layer, to_canonical, shape) = match (&e.binding, rows) {
        (_, RowOrder::MlxConv { k, cin }) => {
            (None, Transform::Identity, vec![view.shape[0], cin, k])
        }
        (Some(b), RowOrder::Torch) => (b.layer, b.to_canonical, b.shape.clone()),
        (None, RowOrder::Torch) => (None, Transform::Identity, view.shape.to_vec()),
    };
    let (out, inp) = matrix_view(&shape);
    Ok(Target {
        component: ad.component,
        name: name.to_string(),
        layer,
        to_canonical,
        shape,
        out,
        inp,
        rows,
        contributions: Vec::new(),
    })
}

fn adapter_report(ad: &BoundAdapter, comp: &Component) -> AdapterReport {
    AdapterReport {
        adapter: ad.shown.clone(),
        path: ad.set.path.display().to_string(),
        convention: ad.set.convention.as_str().to_string(),
        component: comp.name.clone(),
        strength: ad.strength,
        skipped: ad.strength == 0.0,
        targets_merged: 0,
        entries: 0,
        keys_consumed: 0,
        kinds: BTreeMap::new(),
        scale_sources: BTreeMap::new(),
        unmatched_allowed: ad.unmatched.clone(),
    }
}

fn count_entry(report: &mut AdapterReport, e: &Entry) {
    report.entries += 1;
    report.keys_consumed += e.source_keys.len();
    *report.kinds.entry(e.kind.as_str().to_string()).or_default() += 1;
    *report
        .scale_sources
        .entry(e.scale_source.label())
        .or_default() += 1;
}

/// (out, in') of a PyTorch-layout shape (`adapter::view_2d`); a 1-D tensor (a bias, a norm
/// scale) is a column (n, 1), a scalar (1, 1).
fn matrix_view(shape: &[usize]) -> (usize, usize) {
    view_2d(shape).unwrap_or_else(|| (shape.first().copied().unwrap_or(1), 1))
}

/// MLX-converted SA3 DiTs (spec sa3_lora.md §4.4–§4.5, `model::sa3::is_mlx_dit`) store
/// Conv1d weights (out, k, in).
fn row_order(comp: &Component, view: &TensorView<'_>) -> RowOrder {
    match view.shape {
        [_, k, cin] if sa3::is_mlx_dit(comp.tensors.names()) => {
            RowOrder::MlxConv { k: *k, cin: *cin }
        }
        _ => RowOrder::Torch,
    }
}

/// Reads every tensor of every bound entry of the adapters that will be applied and
/// refuses NaN/±inf, naming the adapter's own key (unless the output allows them: the
/// merge then finds what they make of the merged values, `merge::Merger`). Runs in
/// parallel; the error reported is the first in adapter, entry, role order, whatever the
/// thread count.
fn check_finite(adapters: &[BoundAdapter]) -> Result<(), PipelineError> {
    let mut work = Vec::new();
    for ad in adapters.iter().filter(|a| a.strength != 0.0) {
        for e in ad.set.entries.iter().filter(|e| e.target.is_some()) {
            work.extend(e.params.values().map(|src| (ad, src)));
        }
    }
    let found: Vec<Option<PipelineError>> = work
        .par_iter()
        .map(|&(ad, src)| match ad.set.load_released(src) {
            Err(e) => Some(PipelineError::Read(e)),
            Ok(v) => Unheld::scan(&v, f32::INFINITY, 0).map(|found| {
                PipelineError::from(UnheldValues {
                    file: ad.set.path.clone(),
                    tensor: src.key.clone(),
                    output: None,
                    into: "F32".into(),
                    dtype: None,
                    found,
                    at: None,
                    origin: Origin::Adapter,
                })
            }),
        })
        .collect();
    match found.into_iter().flatten().next() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Marks the jobs that read a target, refuses targets no job reads or whose output dtype
/// cannot hold a merged value, and orders jobs largest first (better packing of the worker
/// pool; bytes do not depend on the order).
fn attach_targets(plan: &mut Plan<'_>) -> Result<(), PipelineError> {
    let index: BTreeMap<(usize, &str, Option<usize>), usize> = plan
        .targets
        .iter()
        .enumerate()
        .map(|(i, t)| ((t.component, t.name.as_str(), t.layer), i))
        .collect();
    let mut read = vec![false; plan.targets.len()];
    for j in &mut plan.jobs {
        if let Some(&ti) = index.get(&(j.component, j.stored.as_str(), j.layer)) {
            if !j.dtype.is_output_float() {
                return Err(PipelineError::IntegerTarget {
                    tensor: j.stored.clone(),
                    dtype: j.dtype,
                });
            }
            j.target = Some(ti);
            read[ti] = true;
        }
    }
    if let Some(ti) = read.iter().position(|r| !r) {
        return Err(PipelineError::Plan(format!(
            "`{}` is an adapter target, but the output layout leaves it out",
            plan.targets[ti].name
        )));
    }
    plan.jobs
        .sort_by_key(|j| std::cmp::Reverse(j.stored_shape.iter().product::<usize>()));
    Ok(())
}

/// One adapter's part of the plan, as the report shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AdapterReport {
    /// The `--adapter` argument as given.
    pub adapter: String,
    /// The adapter path.
    pub path: String,
    /// Its convention.
    pub convention: String,
    /// The base component it was merged into (`""` for a single model).
    pub component: String,
    /// Application weight `a`.
    pub strength: f64,
    /// True when `a = 0`: the adapter was checked and then skipped entirely.
    pub skipped: bool,
    /// Base tensors it changed.
    pub targets_merged: usize,
    /// Its entries bound to the base.
    pub entries: usize,
    /// Adapter keys those entries consumed.
    pub keys_consumed: usize,
    /// Entries per kind.
    pub kinds: BTreeMap<String, usize>,
    /// Entries per scale source.
    pub scale_sources: BTreeMap<String, usize>,
    /// Keys that matched nothing, merged around because `--allow-unmatched` was given.
    pub unmatched_allowed: Vec<String>,
}
