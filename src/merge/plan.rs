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
use crate::adapter::{AdapterSet, Entry, Kind, ParamRole};
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

/// A base tensor that changes.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    /// Base component index.
    pub component: usize,
    /// Base tensor name.
    pub name: String,
    /// Its stored shape.
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
    let layout = plan_layout(base, &targets, options)?;
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

/// Groups every bound entry by base tensor, checking each against it.
fn bind_targets(
    base: &Checkpoint,
    adapters: &[BoundAdapter],
    options: &MergeOptions,
) -> Result<(Vec<Target>, Vec<AdapterReport>), MergeError> {
    let mut by_name: BTreeMap<(usize, String), Target> = BTreeMap::new();
    let mut reports = Vec::with_capacity(adapters.len());
    for (ai, ad) in adapters.iter().enumerate() {
        let comp = &base.components[ad.component];
        check_unmatched(ad, comp, options.allow_unmatched)?;
        let mut report = adapter_report(ad, comp);
        let mut merged = std::collections::BTreeSet::new();
        for (ei, e) in ad.set.entries.iter().enumerate() {
            let Some(name) = &e.target else { continue };
            let view = comp
                .tensors
                .get(name)
                .ok_or_else(|| MergeError::UnknownTarget {
                    adapter: ad.set.path.clone(),
                    module: e.module.clone(),
                    target: name.clone(),
                    component: comp.name.clone(),
                })?
                .view;
            let rows = row_order(comp, &view);
            let rank = check_entry(ad, e, &view)?;
            count_entry(&mut report, e);
            merged.insert(name.clone());
            if ad.strength == 0.0 {
                continue;
            }
            let (out, inp) = matrix_view(view.shape);
            let target = by_name
                .entry((ad.component, name.clone()))
                .or_insert_with(|| Target {
                    component: ad.component,
                    name: name.clone(),
                    shape: view.shape.to_vec(),
                    out,
                    inp,
                    rows,
                    contributions: Vec::new(),
                });
            target
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

fn check_unmatched(ad: &BoundAdapter, comp: &Component, allow: bool) -> Result<(), MergeError> {
    let mut keys: Vec<String> = ad.unmatched.clone();
    // Entries binding left without a target are unmatched too (their keys, not the module).
    for e in ad.set.entries.iter().filter(|e| e.target.is_none()) {
        keys.extend(e.source_keys.iter().cloned());
    }
    keys.sort();
    keys.dedup();
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
    let mut unmatched_allowed: Vec<String> = ad.unmatched.clone();
    for e in ad.set.entries.iter().filter(|e| e.target.is_none()) {
        unmatched_allowed.extend(e.source_keys.iter().cloned());
    }
    unmatched_allowed.sort();
    unmatched_allowed.dedup();
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
        unmatched_allowed,
    }
}

fn count_entry(report: &mut AdapterReport, e: &Entry) {
    report.entries += 1;
    report.keys_consumed += e.source_keys.len();
    *report.kinds.entry(kind_label(e.kind)).or_default() += 1;
    *report
        .scale_sources
        .entry(scale_source_label(&e.scale_source))
        .or_default() += 1;
}

/// The kebab-case name of a kind (as serde writes it).
pub fn kind_label(kind: Kind) -> String {
    serde_json::to_value(kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{kind:?}"))
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

/// Checks an entry's tensors against its base tensor; returns the rank.
fn check_entry(ad: &BoundAdapter, e: &Entry, view: &TensorView<'_>) -> Result<usize, MergeError> {
    let unfit = |reason: String| MergeError::Unfit {
        adapter: ad.set.path.clone(),
        module: e.module.clone(),
        kind: e.kind,
        target: view.name.to_string(),
        target_shape: view.shape.to_vec(),
        reason,
    };
    if !view.dtype.is_float() {
        return Err(unfit(format!(
            "the base tensor is {}, not a float",
            view.dtype
        )));
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
    let low_rank = e.kind.roles().contains(&ParamRole::A) || e.kind.is_xs();
    if low_rank && view.shape.len() < 2 {
        return Err(unfit(
            "a low-rank update needs a weight of 2 or more dimensions".into(),
        ));
    }
    let (out, inp) = matrix_view(view.shape);
    let rank = entry_rank(e);
    if let Some(stated) = e.rank.filter(|&s| low_rank && s != rank) {
        return Err(unfit(format!(
            "the entry says rank {stated}, its tensors have rank {rank}"
        )));
    }
    if e.kind.is_xs() && (rank == 0 || rank > out.min(inp)) {
        return Err(unfit(format!(
            "LoRA-XS rank {rank} must be between 1 and min(out, in') = min({out}, {inp}) = {}",
            out.min(inp)
        )));
    }
    for (&role, src) in &e.params {
        let (numel, expected) = expected_size(e.kind, role, rank, out, inp, view.numel());
        let first_ok = match role {
            ParamRole::A | ParamRole::M => src.shape.first() == Some(&rank),
            ParamRole::B => src.shape.first() == Some(&out),
            _ => true,
        };
        if src.shape.iter().product::<usize>() != numel || !first_ok || rank == 0 {
            return Err(MergeError::Shape(Box::new(super::error::ShapeMismatch {
                adapter: ad.set.path.clone(),
                key: src.key.clone(),
                role,
                found: src.shape.clone(),
                target: view.name.to_string(),
                target_shape: view.shape.to_vec(),
                out,
                inp,
                expected,
                hint: super::variant::hint(&ad.set),
            })));
        }
    }
    Ok(rank)
}

/// Rank of an entry from its tensors: rows of A, of M, or 1 for full-tensor kinds.
fn entry_rank(e: &Entry) -> usize {
    let rows = |role| e.param(role).and_then(|s| s.shape.first().copied());
    rows(ParamRole::A)
        .or_else(|| rows(ParamRole::M))
        .unwrap_or(1)
}

/// Elements a role must hold, and the expectation in words.
fn expected_size(
    kind: Kind,
    role: ParamRole,
    r: usize,
    out: usize,
    inp: usize,
    numel: usize,
) -> (usize, String) {
    let rows_kind = matches!(kind, Kind::PeftDora | Kind::DoraRows | Kind::DoraRowsXs);
    match role {
        ParamRole::A => (r * inp, format!("[{r}, {inp}] (r rows, r·in' values)")),
        ParamRole::B => (out * r, format!("[{out}, {r}]")),
        ParamRole::M => (r * r, format!("[{r}, {r}]")),
        ParamRole::Magnitude if rows_kind => (out, format!("{out} values (one per row)")),
        ParamRole::Magnitude => (inp, format!("{inp} values (one per column)")),
        ParamRole::MagnitudeR => (out, format!("{out} values (one per row)")),
        ParamRole::MagnitudeC => (inp, format!("{inp} values (one per column)")),
        ParamRole::Diff | ParamRole::DiffBias | ParamRole::LoraBias => {
            (numel, format!("{numel} values (the base tensor's size)"))
        }
    }
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

fn plan_layout(
    base: &Checkpoint,
    targets: &[Target],
    options: &MergeOptions,
) -> Result<LayoutPlan, MergeError> {
    let mut outputs = Vec::new();
    let mut jobs = Vec::new();
    let mut dropped = Vec::new();
    let mut policies = Vec::new();
    for (ci, comp) in base.components.iter().enumerate() {
        let has_targets = targets.iter().any(|t| t.component == ci);
        let policy = match &options.keep_f32 {
            Some(p) => p.clone(),
            None => default_policy(comp, options.layout),
        };
        policies.push(policy.to_string());
        let c = match options.layout {
            None => same_layout(ci, comp, options.dtype, &policy),
            Some(to) => converted(ci, comp, to, options.dtype, &policy, has_targets)?,
        };
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
        .map_err(|e| MergeError::Usage(format!("the output cannot be laid out: {e}")))?;
    for j in &mut jobs {
        j.slot = output.slot(j.component, &j.output).ok_or_else(|| {
            MergeError::Usage(format!("internal: no output slot for `{}`", j.output))
        })?;
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
fn same_layout(ci: usize, comp: &Component, dtype: OutputDType, policy: &KeepF32) -> ComponentJobs {
    let layout = wan_layout(comp);
    let mut tensors = Vec::new();
    let mut jobs = Vec::new();
    for t in comp.tensors.tensors() {
        let v = t.view;
        let out = output_dtype(
            dtype,
            policy,
            v.name,
            &canonical_name(layout, v.name),
            v.dtype,
        );
        tensors.push(PlannedTensor {
            name: v.name.to_string(),
            dtype: out,
            shape: v.shape.to_vec(),
        });
        jobs.push(Job {
            component: ci,
            output: v.name.to_string(),
            slot: Slot { file: 0, tensor: 0 },
            dst_offset: 0,
            dtype: out,
            transform: Transform::Identity,
            stored: v.name.to_string(),
            layer: None,
            stored_shape: v.shape.to_vec(),
            target: None,
        });
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
    has_targets: bool,
) -> Result<ComponentJobs, MergeError> {
    let layout_err = |source| MergeError::Layout {
        component: comp.name.clone(),
        source,
    };
    let config_json = comp.sidecar("config.json").map(|s| &s.json);
    let config = match comp.sidecar("config.json") {
        Some(s) => Some(WanConfig::from_json(&s.text).map_err(|e| {
            MergeError::Usage(format!(
                "{}: not a WAN transformer config: {e}",
                s.path.display()
            ))
        })?),
        None => None,
    };
    let names: Vec<&str> = comp.tensors.names().collect();
    let from = resolve_layout(None, config_json, &names).map_err(layout_err)?;
    if has_targets && from.is_nnx() {
        return Err(MergeError::Usage(format!(
            "the base{} is in the `{from}` layout; adapters merge into PyTorch-layout weights: \
             merge into the diffusers or wan checkpoint and pass --layout {to}",
            if comp.name.is_empty() {
                String::new()
            } else {
                format!(" component `{}`", comp.name)
            }
        )));
    }
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

/// Marks the jobs that read a target, refuses targets no job reads or that are stacked,
/// and orders jobs largest first (better packing of the worker pool; bytes do not depend
/// on the order).
fn attach_targets(plan: &mut MergePlan) -> Result<(), MergeError> {
    let index: BTreeMap<(usize, &str), usize> = plan
        .targets
        .iter()
        .enumerate()
        .map(|(i, t)| ((t.component, t.name.as_str()), i))
        .collect();
    let mut read = vec![false; plan.targets.len()];
    for j in &mut plan.jobs {
        if let Some(&ti) = index.get(&(j.component, j.stored.as_str())) {
            if j.layer.is_some() || !j.dtype.is_output_float() {
                return Err(MergeError::Usage(format!(
                    "`{}` cannot be merged: it is a stacked tensor or its output dtype {} is \
                     not f32, f16 or bf16 (choose --dtype)",
                    j.stored, j.dtype
                )));
            }
            j.target = Some(ti);
            read[ti] = true;
        }
    }
    if let Some(ti) = read.iter().position(|r| !r) {
        return Err(MergeError::Usage(format!(
            "`{}` is an adapter target, but the output layout leaves it out",
            plan.targets[ti].name
        )));
    }
    plan.jobs
        .sort_by_key(|j| std::cmp::Reverse(j.stored_shape.iter().product::<usize>()));
    Ok(())
}
