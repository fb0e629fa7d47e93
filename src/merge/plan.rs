//! Planning a merge: every adapter entry checked against its base tensor, every output
//! tensor laid out, every job decided, before the first byte is written.
//!
//! Owns: `BoundAdapter` (an adapter bound to one transformer of the base, with its
//! strength), `MergeOptions`, `MergePlan` with its `Target`s (base tensors that change, each
//! with its sorted contributions) and `Job`s (one per output tensor piece: copy, convert,
//! or merge), and the checks: unmatched keys, nothing bound, missing parameters, shapes
//! (with the base variant the adapter seems made for), ranks, non-finite adapter values.
//! Does not own: binding names (`adapter`), the formulas (`merge::math`), running the jobs
//! (`merge::exec`), layouts and keep-f32 rules (`layout`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use rayon::prelude::*;

use super::error::MergeError;
use super::report::{AdapterReport, DoraStrength, scale_source_label};
use crate::adapter::bind::{check_fit, kind_name};
use crate::adapter::variant::mismatch_line;
use crate::adapter::{AdapterSet, BaseIndex, Entry, Kind};
use crate::io::header::PlannedTensor;
use crate::io::writer::{AuxFile, ComponentOutput, OutputPlan};
use crate::io::{Checkpoint, Component, DType, Slot, TensorView};
use crate::layout::{
    Conversion, KeepF32, Layout, OutputDType, ReadPlan, StoredTensor, Transform, detect_layout,
    resolve_layout, stamp_config,
};
use crate::model::wan::WanConfig;

/// An adapter bound to one transformer of the base.
#[derive(Debug)]
pub struct BoundAdapter {
    /// The adapter; `Entry::target` holds the base tensor name of every bound entry.
    pub set: AdapterSet,
    /// Index of the base component (`Checkpoint::components`) it was bound to.
    pub component: usize,
    /// Application weight `a` (finite; 0 skips the adapter).
    pub strength: f64,
    /// The `--adapter` argument as given.
    pub shown: String,
    /// Adapter keys binding matched to nothing.
    pub unmatched: Vec<String>,
}

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
}

/// Checks everything and plans the merge. `identities[i]` is adapter i's content identity
/// (the sha256 of its files), used only to order contributions canonically. Reads adapter
/// tensors (to refuse non-finite values) but writes nothing.
pub fn plan_merge(
    base: &Checkpoint,
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
    let layout = plan_layout(base, options)?;
    let mut plan = MergePlan {
        output: layout.output,
        jobs: layout.jobs,
        targets,
        adapters: reports,
        dropped_by_layout: layout.dropped,
        keep_f32: layout.keep_f32,
    };
    attach_targets(&mut plan)?;
    Ok(plan)
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
        check_unmatched(ad, comp, options.allow_unmatched)?;
        let mut report = adapter_report(ad, comp);
        let mut merged = std::collections::BTreeSet::new();
        for (ei, e) in ad.set.entries.iter().enumerate() {
            let Some(name) = &e.target else { continue };
            let target = target_of(ad, e, comp, name)?;
            let rank = check_entry(ad, e, comp, &target)?;
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
        if report.entries == 0 {
            return Err(nothing_bound(ad, comp));
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
        .ok_or_else(|| MergeError::UnknownTarget {
            adapter: ad.set.path.clone(),
            module: e.module.clone(),
            target: name.to_string(),
            component: comp.name.clone(),
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

/// Keys binding matched to nothing: the binder's unmatched keys and the keys of entries it
/// left without a target, sorted.
fn unmatched_keys(ad: &BoundAdapter) -> Vec<String> {
    let mut keys: Vec<String> = ad.unmatched.clone();
    for e in ad.set.entries.iter().filter(|e| e.target.is_none()) {
        keys.extend(e.source_keys.iter().cloned());
    }
    keys.sort();
    keys.dedup();
    keys
}

fn check_unmatched(ad: &BoundAdapter, comp: &Component, allow: bool) -> Result<(), MergeError> {
    let keys = unmatched_keys(ad);
    if keys.is_empty() || allow {
        return Ok(());
    }
    Err(MergeError::Unmatched {
        adapter: ad.set.path.clone(),
        component: comp.name.clone(),
        keys,
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
        unmatched_allowed: unmatched_keys(ad),
    }
}

fn count_entry(report: &mut AdapterReport, e: &Entry) {
    report.entries += 1;
    report.keys_consumed += e.source_keys.len();
    *report
        .kinds
        .entry(kind_name(e.kind).to_string())
        .or_default() += 1;
    *report
        .scale_sources
        .entry(scale_source_label(&e.scale_source))
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

/// (out, in') of a stored shape: rows are the first axis, everything else is flattened.
pub fn matrix_view(shape: &[usize]) -> (usize, usize) {
    match shape.split_first() {
        Some((&out, rest)) => (out, rest.iter().product()),
        None => (1, 1),
    }
}

/// MLX-converted SA3 DiTs (spec sa3_lora.md §4.4–§4.5) store Conv1d weights (out, k, in).
/// They are recognised by the keys only the MLX conversion writes (`cond.*`,
/// `to_local_embed.seq.*`) and the absence of the PyTorch `model.model.` prefix.
fn row_order(comp: &Component, view: &TensorView<'_>) -> RowOrder {
    let [_, k, cin] = view.shape else {
        return RowOrder::Torch;
    };
    let mut mlx_marker = false;
    for n in comp.tensors.names() {
        if n.starts_with("model.model.") {
            return RowOrder::Torch;
        }
        mlx_marker |= n.starts_with("cond.") || n.contains(".to_local_embed.seq.");
    }
    if mlx_marker {
        RowOrder::MlxConv { k: *k, cin: *cin }
    } else {
        RowOrder::Torch
    }
}

/// Checks an entry against its base tensor with the binder's own fit rules
/// (`adapter::bind::check_fit`, on the PyTorch-layout shape); returns the rank.
fn check_entry(
    ad: &BoundAdapter,
    e: &Entry,
    comp: &Component,
    t: &Target,
) -> Result<usize, MergeError> {
    let dtype = comp.tensors.get(&t.name).map(|r| r.view.dtype);
    if let Some(d) = dtype.filter(|d| !d.is_float()) {
        return Err(MergeError::Unfit {
            adapter: ad.set.path.clone(),
            module: e.module.clone(),
            kind: e.kind,
            target: t.name.clone(),
            target_shape: t.shape.clone(),
            reason: format!("the base tensor is {d}, not a float"),
        });
    }
    let missing = e.missing_roles();
    if !missing.is_empty() {
        return Err(MergeError::MissingParams {
            adapter: ad.set.path.clone(),
            module: e.module.clone(),
            kind: e.kind,
            missing,
        });
    }
    check_fit(e, &t.shape).map_err(|reason| {
        let index = BaseIndex::new(&comp.rel_dir, &comp.tensors);
        MergeError::Shape(Box::new(super::error::ShapeMismatch {
            adapter: ad.set.path.clone(),
            module: e.module.clone(),
            kind: kind_name(e.kind).to_string(),
            target: t.name.clone(),
            target_shape: t.shape.clone(),
            reason,
            hint: mismatch_line(&ad.set, &index),
        }))
    })?;
    Ok(e.rank.unwrap_or(1))
}

fn nothing_bound(ad: &BoundAdapter, comp: &Component) -> MergeError {
    let first_module = ad.set.entries.first().map(|e| e.module.as_str());
    let first_base = comp.tensors.names().next();
    let hint = match (first_module, first_base) {
        (Some(m), Some(b)) => {
            format!(" (its first module is `{m}`; base tensors are named like `{b}`)")
        }
        _ => String::new(),
    };
    MergeError::NothingBound {
        adapter: ad.set.path.clone(),
        component: comp.name.clone(),
        entries: ad.set.entries.len(),
        hint,
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

/// The output side of the plan.
struct LayoutPlan {
    output: OutputPlan,
    jobs: Vec<Job>,
    dropped: Vec<String>,
    keep_f32: String,
}

/// One component's output before slots are known.
struct ComponentJobs {
    output: ComponentOutput,
    jobs: Vec<Job>,
    dropped: Vec<String>,
}

fn plan_layout(base: &Checkpoint, options: &MergeOptions) -> Result<LayoutPlan, MergeError> {
    let mut outputs = Vec::new();
    let mut jobs = Vec::new();
    let mut dropped = Vec::new();
    let mut policies = Vec::new();
    for (ci, comp) in base.components.iter().enumerate() {
        let policy = match &options.keep_f32 {
            Some(p) => p.clone(),
            None => default_policy(comp, options.layout),
        };
        policies.push(policy.to_string());
        let mut c = match options.layout {
            None => same_layout(ci, comp, options.dtype, &policy),
            Some(to) => converted(ci, comp, to, options.dtype, &policy)?,
        };
        if options.shard_bytes.is_some() {
            c.output.max_shard_bytes = options.shard_bytes;
        }
        outputs.push(c.output);
        jobs.extend(c.jobs);
        dropped.extend(c.dropped);
    }
    let aux: Vec<AuxFile> = base
        .root_files
        .iter()
        .map(|s| AuxFile {
            rel_path: PathBuf::from(&s.name),
            bytes: s.text.clone().into_bytes(),
        })
        .collect();
    let output = OutputPlan::build(&outputs, &aux)
        .map_err(|e| MergeError::Plan(format!("the output cannot be laid out: {e}")))?;
    for j in &mut jobs {
        j.slot = output
            .slot(j.component, &j.output)
            .ok_or_else(|| MergeError::Internal(format!("no output slot for `{}`", j.output)))?;
    }
    policies.dedup();
    Ok(LayoutPlan {
        output,
        jobs,
        dropped,
        keep_f32: policies.join(", "),
    })
}

/// The WAN layout the component's keys are in, if they are a WAN transformer's.
fn wan_layout(comp: &Component) -> Option<Layout> {
    let names: Vec<&str> = comp.tensors.names().collect();
    detect_layout(&names).ok()
}

fn default_policy(comp: &Component, to: Option<Layout>) -> KeepF32 {
    match to.or_else(|| wan_layout(comp)) {
        Some(l) => KeepF32::default_for(l),
        None => KeepF32::None,
    }
}

/// The canonical (diffusers) name of a stored WAN tensor, for the keep-f32 rules; the name
/// itself for other bases.
fn canonical_name(layout: Option<Layout>, name: &str) -> String {
    use crate::layout::table::{Position, parse_stored};
    match layout.and_then(|l| parse_stored(l, name)) {
        Some((e, Position::Block(b))) => format!("blocks.{b}.{}", e.diffusers),
        Some((e, _)) => e.diffusers.to_string(),
        None => name.to_string(),
    }
}

fn output_dtype(
    target: OutputDType,
    policy: &KeepF32,
    name: &str,
    canonical: &str,
    stored: DType,
) -> DType {
    if !stored.is_float() {
        return stored;
    }
    let narrow = match target {
        OutputDType::Keep => return stored,
        OutputDType::F32 => return DType::F32,
        OutputDType::BF16 => DType::BF16,
        OutputDType::F16 => DType::F16,
    };
    if policy.keeps(name, canonical) {
        DType::F32
    } else {
        narrow
    }
}

/// Same names and layouts as the base: every tensor copied, converted or merged in place.
/// A stacked (`nnx-scanned`) tensor gets one job per layer, so adapters can change single
/// layers of it.
fn same_layout(ci: usize, comp: &Component, dtype: OutputDType, policy: &KeepF32) -> ComponentJobs {
    use crate::layout::table::{Position, parse_stored};
    let layout = wan_layout(comp);
    let mut tensors = Vec::new();
    let mut jobs = Vec::new();
    for t in comp.tensors.tensors() {
        let v = t.view;
        let canonical = canonical_name(layout, v.name);
        let out = output_dtype(dtype, policy, v.name, &canonical, v.dtype);
        tensors.push(PlannedTensor {
            name: v.name.to_string(),
            dtype: out,
            shape: v.shape.to_vec(),
        });
        let job = |layer: Option<usize>, stored_shape: &[usize], dst_offset: usize| Job {
            component: ci,
            output: v.name.to_string(),
            slot: Slot { file: 0, tensor: 0 },
            dst_offset,
            dtype: out,
            transform: Transform::Identity,
            stored: v.name.to_string(),
            layer,
            stored_shape: stored_shape.to_vec(),
            target: None,
        };
        let stacked = layout == Some(Layout::NnxScanned)
            && matches!(
                parse_stored(Layout::NnxScanned, v.name),
                Some((_, Position::Stacked))
            );
        match (stacked, v.shape.split_first()) {
            (true, Some((&layers, slice))) => {
                let bytes = slice.iter().product::<usize>() * out.size().unwrap_or(0);
                jobs.extend((0..layers).map(|l| job(Some(l), slice, l * bytes)));
            }
            _ => jobs.push(job(None, v.shape, 0)),
        }
    }
    let sidecars = config_sidecar(comp, None);
    ComponentJobs {
        output: component_output(comp, tensors, sidecars),
        jobs,
        dropped: Vec::new(),
    }
}

/// Written in another WAN layout through the layout module's read and write plans.
fn converted(
    ci: usize,
    comp: &Component,
    to: Layout,
    dtype: OutputDType,
    policy: &KeepF32,
) -> Result<ComponentJobs, MergeError> {
    let layout_err = |source| MergeError::Layout {
        component: comp.name.clone(),
        source,
    };
    let config_json = comp.sidecar("config.json").map(|s| &s.json);
    let config = match comp.sidecar("config.json") {
        Some(s) => Some(WanConfig::from_json(&s.text).map_err(|e| {
            MergeError::Plan(format!(
                "{}: not a WAN transformer config: {e}",
                s.path.display()
            ))
        })?),
        None => None,
    };
    let names: Vec<&str> = comp.tensors.names().collect();
    let from = resolve_layout(None, config_json, &names).map_err(layout_err)?;
    let stored: Vec<StoredTensor> = comp
        .tensors
        .tensors()
        .map(|t| StoredTensor {
            name: t.view.name.to_string(),
            dtype: t.view.dtype,
            shape: t.view.shape.to_vec(),
        })
        .collect();
    let read = ReadPlan::new(from, &stored, config.as_ref()).map_err(layout_err)?;
    let conv = Conversion::new(read, to, dtype, policy).map_err(layout_err)?;
    let jobs = conv
        .jobs
        .iter()
        .map(|j| Job {
            component: ci,
            output: conv.write.tensors[j.output].name.clone(),
            slot: Slot { file: 0, tensor: 0 },
            dst_offset: j.dst_offset,
            dtype: conv.dtypes[j.output],
            transform: j.transform,
            stored: j.stored.clone(),
            layer: j.layer,
            stored_shape: j.stored_shape.clone(),
            target: None,
        })
        .collect();
    let dropped = conv
        .read
        .skipped
        .iter()
        .map(|s| format!("{}{}: {}", prefix(comp), s.name, s.reason))
        .collect();
    let sidecars = config_sidecar(comp, Some(to));
    Ok(ComponentJobs {
        output: component_output(comp, conv.planned_tensors(), sidecars),
        jobs,
        dropped,
    })
}

fn prefix(comp: &Component) -> String {
    if comp.name.is_empty() {
        String::new()
    } else {
        format!("{}/", comp.name)
    }
}

/// config.json as the base has it, with the layout field stamped when it changes.
fn config_sidecar(comp: &Component, layout: Option<Layout>) -> Vec<(String, Vec<u8>)> {
    let Some(s) = comp.sidecar("config.json") else {
        return Vec::new();
    };
    let bytes = match (layout, s.json.as_object()) {
        (Some(l), Some(obj)) => {
            let mut obj = obj.clone();
            stamp_config(&mut obj, l);
            let mut b = serde_json::to_vec_pretty(&serde_json::Value::Object(obj))
                .expect("JSON values always serialise");
            b.push(b'\n');
            b
        }
        _ => s.text.clone().into_bytes(),
    };
    vec![("config.json".to_string(), bytes)]
}

fn component_output(
    comp: &Component,
    tensors: Vec<PlannedTensor>,
    sidecars: Vec<(String, Vec<u8>)>,
) -> ComponentOutput {
    let files = comp.tensors.files();
    // A sharded base gives a sharded output with shards no larger than its largest one.
    let max_shard_bytes = (files.len() > 1).then(|| {
        files
            .iter()
            .map(|f| (f.len() - f.header().data_start) as u64)
            .max()
            .unwrap_or(0)
    });
    ComponentOutput {
        rel_dir: comp.rel_dir.clone(),
        stem: comp.weights_stem.clone(),
        tensors,
        metadata: comp.tensors.metadata(),
        sidecars,
        max_shard_bytes,
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
