//! Planning a merge: every bound entry placed on its base tensor, every output tensor laid
//! out, every job decided, before the first byte is written.
//!
//! Owns: `MergeOptions` and their one builder (`MergeOptions::new` from typed
//! `MergeChoices`, for the command line and recipes alike), `MergePlan` with its `Target`s
//! (base tensors that change, each with its sorted contributions) and `Job`s (one per output
//! tensor piece: copy, convert, or merge), and the checks binding cannot make: non-finite
//! adapter values, targets the output layout leaves out, integer outputs of merged tensors.
//! Does not own: parsing option names (each type's `FromStr` / `clap::ValueEnum`), binding and
//! its checks (unmatched keys, nothing bound, missing parameters, shapes: `adapter::bind`,
//! run once through `merge::bind`; a `BoundAdapter` is never re-checked here), the
//! formulas (`merge::math`), running the jobs (`merge::exec`), layouts (`model`) and
//! keep-f32 rules (`layout`).

use std::collections::BTreeMap;

use rayon::prelude::*;

use super::bind::BoundAdapter;
use super::error::MergeError;
use super::report::{AdapterReport, DoraStrength};
use crate::adapter::{Entry, Kind, view_2d};
use crate::io::writer::OutputPlan;
use crate::io::{Checkpoint, Component, DType, Slot, TensorView};
use crate::layout::{KeepF32, OutputDType};
use crate::model::base_model::BaseModel;
use crate::model::quant_rules::QuantFormat;
use crate::model::sa3;
use crate::model::transform::Transform;
use crate::model::wan_layout::Layout;
use crate::quantize::{Encoding, QuantOptions, QuantPlan};

/// How to merge and write.
#[derive(Clone, Debug)]
pub struct MergeOptions {
    /// Output dtype.
    pub dtype: OutputDType,
    /// Keep-f32 policy; `None`: `diffusers` for a diffusers/wan output, `maxdiffusion` for
    /// NNX, `none` for a base that is not a WAN transformer (SA3).
    pub keep_f32: Option<KeepF32>,
    /// Output layout; `None` keeps the base's names and layouts.
    pub layout: Option<Layout>,
    /// Where strength enters DoRA/BoRA.
    pub dora_strength: DoraStrength,
    /// Merge around unmatched adapter keys instead of refusing.
    pub allow_unmatched: bool,
    /// Largest output shard in bytes; `None` shards like the base (one file for a one-file
    /// base, shards no larger than the base's largest for a sharded one).
    pub shard_bytes: Option<u64>,
    /// A quantized output (`--to`, recipe `output.to`): one fp8-scaled or GGUF file with
    /// original-Wan names, each tensor encoded from its f32 value (`quantize`); `dtype`,
    /// `keep_f32`, `layout` and `shard_bytes` are then unused.
    pub quantize: Option<QuantOptions>,
}

/// The merge options a front end chose, typed: clap values on the command line, recipe fields
/// read with each type's `FromStr` (`Recipe::merge_options`). [`MergeOptions::new`] is the
/// one place both turn into [`MergeOptions`], checking what involves several options.
#[derive(Clone, Debug, Default)]
pub struct MergeChoices {
    /// Output dtype; `Keep` (the default) keeps each tensor's stored dtype. With `to`: the
    /// high-precision dtype of fp8-scaled (`Keep`: f16), and only `Keep` for GGUF.
    pub dtype: OutputDType,
    /// Keep-f32 policy; `None`: the default for the output layout.
    pub keep_f32: Option<KeepF32>,
    /// Output layout; `None` keeps the base's.
    pub layout: Option<Layout>,
    /// Where strength enters DoRA/BoRA (default `merge`).
    pub dora_strength: DoraStrength,
    /// Merge around unmatched adapter keys.
    pub allow_unmatched: bool,
    /// Largest output shard in bytes (the front ends take "5GB" or bytes:
    /// `recipe::parse_size`).
    pub shard_bytes: Option<u64>,
    /// A quantized output format.
    pub to: Option<QuantFormat>,
    /// With a GGUF block type: quantize the F16/BF16 rounding, as city96's pipeline does.
    pub city96_rounding: bool,
}

/// Options that cannot go together: which (`dtype`, `keep_f32`, `layout`, `shard_size`,
/// `city96_rounding`, named as in recipes) and why. Each front end names it its own way
/// (`--keep-f32`, `output.keep_f32`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadOption {
    /// The option.
    pub field: &'static str,
    /// What is wrong.
    pub message: String,
}

impl MergeOptions {
    /// Checks the choices together: a quantized output decides names, files and every
    /// tensor's type, so `keep_f32`, `layout` and `shard_bytes` are refused with it, and
    /// `dtype` must be one fp8-scaled can keep its high-precision tensors in.
    pub fn new(c: MergeChoices) -> Result<MergeOptions, BadOption> {
        let quantize = quantize_options(&c)?;
        Ok(MergeOptions {
            dtype: match quantize {
                Some(_) => OutputDType::Keep,
                None => c.dtype,
            },
            keep_f32: c.keep_f32,
            layout: c.layout,
            dora_strength: c.dora_strength,
            allow_unmatched: c.allow_unmatched,
            shard_bytes: c.shard_bytes,
            quantize,
        })
    }

    /// The same merge computed in f32, with the base's own names, layout and shards, not
    /// quantized: the tuned model a bake check runs on (`bake`'s reference folder) and an
    /// extraction subtracts the base from (`extract --adapter`). Every tensor is f32, so no
    /// keep-f32 policy applies.
    pub fn f32_reference(&self) -> MergeOptions {
        MergeOptions {
            dtype: OutputDType::F32,
            keep_f32: None,
            layout: None,
            shard_bytes: None,
            quantize: None,
            ..self.clone()
        }
    }
}

/// `to` and its companions: the format decides names, files and every tensor's type, so
/// `keep_f32`, `layout` and `shard_size` are refused with it; `dtype` is the
/// high-precision dtype of fp8-scaled (f16 by default; bf16 or f32) and refused for GGUF.
fn quantize_options(c: &MergeChoices) -> Result<Option<QuantOptions>, BadOption> {
    let bad = |field: &'static str, message: String| BadOption { field, message };
    let Some(format) = c.to else {
        if c.city96_rounding {
            return Err(bad("city96_rounding", "needs to = gguf:<type>".into()));
        }
        return Ok(None);
    };
    for (given, field) in [
        (c.keep_f32.is_some(), "keep_f32"),
        (c.layout.is_some(), "layout"),
        (c.shard_bytes.is_some(), "shard_size"),
    ] {
        if given {
            let m = format!("{format} decides the output (one file, original-Wan names); drop it");
            return Err(bad(field, m));
        }
    }
    if c.city96_rounding && !format.is_gguf() {
        return Err(bad("city96_rounding", "applies to gguf:<type> only".into()));
    }
    let high_precision = match (c.dtype.float(), format.is_gguf()) {
        (None, _) => DType::F16,
        (Some(d), false) => d,
        (Some(_), true) => {
            let m = format!(
                "`{}`: {format} decides every tensor's type; drop it",
                c.dtype
            );
            return Err(bad("dtype", m));
        }
    };
    Ok(Some(QuantOptions {
        format,
        high_precision,
        city96_rounding: c.city96_rounding,
    }))
}

/// How a row of a target's 2-D (out, in') view is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowOrder {
    /// Row-major PyTorch layout: (out, in) or (out, in, k…) flattened.
    Torch,
    /// MLX Conv1d (out, k, in): each row is (k, in) and must be permuted to (in, k).
    MlxConv {
        /// Kernel size.
        k: usize,
        /// Input channels.
        cin: usize,
    },
}

/// One adapter entry's contribution to a target.
#[derive(Clone, Debug, PartialEq)]
pub struct Contribution {
    /// Index into the adapters.
    pub adapter: usize,
    /// Index into that adapter's entries.
    pub entry: usize,
    /// The entry's kind.
    pub kind: Kind,
    /// `w` in `w·(f(W0) − W0)`.
    pub weight: f64,
    /// σ used inside `f` (times the strength in the PEFT DoRA mode).
    pub sigma: f64,
    /// Rank (1 for full-tensor kinds).
    pub rank: usize,
}

/// A base tensor (or one layer of a stacked one) that changes.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    /// Base component index.
    pub component: usize,
    /// Base tensor name.
    pub name: String,
    /// Layer of a stacked base tensor (NNX scanned).
    pub layer: Option<usize>,
    /// Stored layout → PyTorch layout (`Identity` except for NNX bases).
    pub to_canonical: Transform,
    /// Its shape in PyTorch layout (the MLX Conv1d as (out, in, k)).
    pub shape: Vec<usize>,
    /// Rows of the 2-D view.
    pub out: usize,
    /// Columns of the 2-D view.
    pub inp: usize,
    /// How rows are stored.
    pub rows: RowOrder,
    /// Contributions in canonical order (adapters with `a = 0` left out).
    pub contributions: Vec<Contribution>,
}

/// One output tensor (or one layer slice of a stacked one) and where it comes from.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    /// Base component index.
    pub component: usize,
    /// Output tensor name.
    pub output: String,
    /// Where it is written.
    pub slot: Slot,
    /// Byte offset inside the output tensor.
    pub dst_offset: usize,
    /// Output dtype.
    pub dtype: DType,
    /// Stored layout → output layout.
    pub transform: Transform,
    /// Base tensor read.
    pub stored: String,
    /// Layer of a stacked base tensor.
    pub layer: Option<usize>,
    /// Shape of the stored data read (the layer's slice when stacked).
    pub stored_shape: Vec<usize>,
    /// Index into `MergePlan::targets` when merged; `None`: copied or converted.
    pub target: Option<usize>,
    /// A quantized output's encoding of the tensor (`dtype` is then F32, the values the
    /// encoder reads); `None`: `dtype` is the output.
    pub encoding: Option<Encoding>,
}

/// Everything a merge will do.
#[derive(Debug)]
pub struct MergePlan {
    /// The output files.
    pub output: OutputPlan,
    /// The jobs, largest first.
    pub jobs: Vec<Job>,
    /// Base tensors that change.
    pub targets: Vec<Target>,
    /// Per-adapter reports (plan-time facts).
    pub adapters: Vec<AdapterReport>,
    /// Base keys the layout conversion leaves out on purpose.
    pub dropped_by_layout: Vec<String>,
    /// Keep-f32 policy applied, in words.
    pub keep_f32: String,
    /// The quantized output's tensors, encodings and reasons, when the output is quantized.
    pub quant: Option<QuantPlan>,
}

/// Checks everything and plans the merge. `identities[i]` is adapter i's content identity
/// (the sha256 of its files), used only to order contributions canonically. Reads adapter
/// tensors (to refuse non-finite values) but writes nothing.
pub fn plan_merge(
    base: &BaseModel,
    adapters: &[BoundAdapter],
    options: &MergeOptions,
    identities: &[String],
) -> Result<MergePlan, MergeError> {
    let (mut targets, reports) = bind_targets(base, adapters, options)?;
    check_finite(adapters)?;
    for t in &mut targets {
        t.contributions.sort_by(|a, b| {
            contribution_key(adapters, identities, a)
                .cmp(&contribution_key(adapters, identities, b))
        });
    }
    let layout = super::output::plan_output(base, options)?;
    let mut plan = MergePlan {
        output: layout.output,
        jobs: layout.jobs,
        targets,
        adapters: reports,
        dropped_by_layout: layout.dropped,
        keep_f32: layout.keep_f32,
        quant: layout.quant,
    };
    attach_targets(&mut plan)?;
    Ok(plan)
}

/// (stored tensor, layer) → (job, target) of each merged target: where to find the values
/// of a stored tensor an adapter touches ([`MergePlan::merged_targets`]).
pub type MergedTargets = std::collections::HashMap<(String, Option<usize>), (usize, usize)>;

impl MergePlan {
    /// Every merged target of component `component` (every component: `None`), by the
    /// stored tensor and layer it is computed for.
    pub fn merged_targets(&self, component: Option<usize>) -> MergedTargets {
        (self.jobs.iter().enumerate())
            .filter(|(_, job)| component.is_none_or(|c| job.component == c))
            .filter_map(|(j, job)| {
                job.target
                    .map(|t| ((job.stored.clone(), job.layer), (j, t)))
            })
            .collect()
    }

    /// A plan that merges nothing (`restack`, `convert`): `jobs` copy or convert base
    /// tensors into `output`; their slots are resolved here.
    pub fn untouched(
        output: OutputPlan,
        mut jobs: Vec<Job>,
        dropped_by_layout: Vec<String>,
        keep_f32: String,
    ) -> Result<MergePlan, MergeError> {
        super::output::resolve_slots(&output, &mut jobs)?;
        Ok(MergePlan {
            output,
            jobs,
            targets: Vec::new(),
            adapters: Vec::new(),
            dropped_by_layout,
            keep_f32,
            quant: None,
        })
    }
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
    options: &MergeOptions,
) -> Result<(Vec<Target>, Vec<AdapterReport>), MergeError> {
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
                .push(contribution(ai, ei, e, ad.strength, rank, options));
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
) -> Result<Target, MergeError> {
    let view = comp
        .tensors
        .get(name)
        .ok_or_else(|| {
            MergeError::Internal(format!(
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

fn contribution(
    adapter: usize,
    entry: usize,
    e: &Entry,
    a: f64,
    rank: usize,
    options: &MergeOptions,
) -> Contribution {
    // PEFT mode moves the strength inside the norm of the normalised kinds; for every other
    // kind the two modes are the same formula.
    let inside = options.dora_strength == DoraStrength::Peft && e.kind.is_normalised();
    let (weight, sigma) = if inside {
        (1.0, a * e.scale)
    } else {
        (a, e.scale)
    };
    Contribution {
        adapter,
        entry,
        kind: e.kind,
        weight,
        sigma,
        rank,
    }
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
/// refuses NaN/±inf. Runs in parallel; the error reported is the first in adapter, entry,
/// role order, whatever the thread count.
fn check_finite(adapters: &[BoundAdapter]) -> Result<(), MergeError> {
    let mut work = Vec::new();
    for ad in adapters.iter().filter(|a| a.strength != 0.0) {
        for e in ad.set.entries.iter().filter(|e| e.target.is_some()) {
            work.extend(e.params.values().map(|src| (ad, src)));
        }
    }
    let found: Vec<Option<MergeError>> = work
        .par_iter()
        .map(|&(ad, src)| match super::exec::load_param(&ad.set, src) {
            Err(e) => Some(MergeError::Read(e)),
            Ok(v) => v
                .iter()
                .position(|x| !x.is_finite())
                .map(|index| MergeError::NonFinite {
                    adapter: ad.set.path.clone(),
                    key: src.key.clone(),
                    index,
                    value: v[index],
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
fn attach_targets(plan: &mut MergePlan) -> Result<(), MergeError> {
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
                return Err(MergeError::Usage(format!(
                    "`{}` cannot be merged into {} output: choose --dtype bf16, f16 or f32",
                    j.stored, j.dtype
                )));
            }
            j.target = Some(ti);
            read[ti] = true;
        }
    }
    if let Some(ti) = read.iter().position(|r| !r) {
        return Err(MergeError::Plan(format!(
            "`{}` is an adapter target, but the output layout leaves it out",
            plan.targets[ti].name
        )));
    }
    plan.jobs
        .sort_by_key(|j| std::cmp::Reverse(j.stored_shape.iter().product::<usize>()));
    Ok(())
}
