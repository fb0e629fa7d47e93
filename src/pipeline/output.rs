//! The output side of a plan: the output options, every output file and tensor, its dtype,
//! and the job that fills it.
//!
//! Owns: [`OutputOptions`] and their one builder ([`OutputOptions::new`] from typed
//! [`OutputChoices`], for the command line and recipes alike), `plan_output` (per base
//! component: the same names and layouts as the base, or another WAN layout through the read
//! plan (`model::read_plan`) and the layout module's write plans; the keep-f32 policy and its
//! defaults; config.json with the layout stamped; sharding like the base or as asked), and a
//! quantized output (one fp8-scaled, GGUF, `comfy:*` or `lightx2v:*` file from `quant::encode`'s plan: one job per tensor
//! carrying its encoding), and an Orbax output (`--to orbax`: the `nnx` / `nnx-scanned`
//! conversion of each transformer as an item of MaxDiffusion's cache, `pipeline::orbax`). Does not own: which tensors change (`pipeline::plan`), the layouts
//! and name tables themselves (`model`), the keep-f32 rules (`layout`), the quantization rules
//! and encodings (`quant::encode`), laying out files (`release::writer`).

use std::collections::BTreeMap;

use super::error::PipelineError;
use super::job::Job;
use super::nonfinite::NonFinite;
use super::orbax::{ItemInput, OrbaxPlan};
use crate::format::header_layout::PlannedTensor;
use crate::io::{Component, DType};
use crate::layout::{Conversion, KeepF32, OutputDType};
use crate::model::base_model::{BaseModel, ComponentModel};
use crate::model::read_plan::{ReadPlan, StoredTensor};
use crate::model::transform::Transform;
use crate::model::wan::WanConfig;
use crate::model::wan_layout::Layout;
use crate::model::wan_layout::stamp_config;
use crate::quant::encode::{self, QuantError, QuantOptions, QuantPlan};
use crate::quant::rules::QuantFormat;
use crate::release::writer::Slot;
use crate::release::writer::{ComponentOutput, OutputPlan};

/// How to write: the output's dtype, keep-f32 policy, layout, shards, or quantized encoding.
#[derive(Clone, Debug)]
pub struct OutputOptions {
    /// Output dtype.
    pub dtype: OutputDType,
    /// Keep-f32 policy; `None`: `diffusers` for a diffusers/wan output, `maxdiffusion` for
    /// NNX, `none` for a base that is not a WAN transformer (SA3).
    pub keep_f32: Option<KeepF32>,
    /// Output layout; `None` keeps the base's names and layouts.
    pub layout: Option<Layout>,
    /// Largest output shard in bytes; `None` shards like the base (one file for a one-file
    /// base, shards no larger than the base's largest for a sharded one).
    pub shard_bytes: Option<u64>,
    /// A quantized output (`--to`, recipe `output.to`): one fp8-scaled, GGUF, `comfy:*` or
    /// `lightx2v:*` file with original-Wan names, each tensor encoded from its f32 value
    /// (`quant::encode`); `dtype`, `keep_f32`, `layout` and `shard_bytes` are then unused
    /// (the high-precision dtype is `QuantOptions::high_precision`).
    pub quantize: Option<QuantOptions>,
    /// The container the tensors go in (`--to orbax`: MaxDiffusion's pretrained cache,
    /// `pipeline::orbax`; `layout` is then `nnx` or `nnx-scanned` and `keep_f32`
    /// MaxDiffusion's).
    pub container: Container,
    /// What to do with values the output cannot hold (NaN, ±inf, an overflow of the output
    /// dtype or format): refuse (the default) or write them and list them in the report.
    pub nonfinite: NonFinite,
}

/// The container of an output that is not quantized.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Container {
    /// safetensors files, named and sharded like the base (or as asked).
    #[default]
    Safetensors,
    /// An Orbax CheckpointManager root as MaxDiffusion's `pretrained_orbax_dir`.
    Orbax,
}

/// What `--to` (recipe `output.to`) names: a quantized file, or an Orbax cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    /// One fp8-scaled, GGUF, `comfy:*` or `lightx2v:*` file.
    Quantized(QuantFormat),
    /// MaxDiffusion's pretrained Orbax cache (`pipeline::orbax`).
    Orbax,
}

impl OutputFormat {
    /// Every format, in the order `--help` lists them.
    pub const ALL: [OutputFormat; QuantFormat::ALL.len() + 1] = {
        let mut all = [OutputFormat::Orbax; QuantFormat::ALL.len() + 1];
        let mut i = 0;
        while i < QuantFormat::ALL.len() {
            all[i] = OutputFormat::Quantized(QuantFormat::ALL[i]);
            i += 1;
        }
        all
    };

    /// Its name on the command line and in recipes.
    pub fn as_str(self) -> &'static str {
        match self {
            OutputFormat::Quantized(q) => q.as_str(),
            OutputFormat::Orbax => "orbax",
        }
    }
}

impl From<QuantFormat> for OutputFormat {
    fn from(q: QuantFormat) -> OutputFormat {
        OutputFormat::Quantized(q)
    }
}

impl std::fmt::Display for OutputFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for OutputFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<OutputFormat, String> {
        crate::names::find(&OutputFormat::ALL, OutputFormat::as_str, s).ok_or_else(|| {
            let all: Vec<&str> = OutputFormat::ALL.iter().map(|f| f.as_str()).collect();
            format!("unknown format `{s}` (one of: {})", all.join(", "))
        })
    }
}

crate::names::value_enum!(OutputFormat);

/// The output options a front end chose, typed: clap values on the command line, recipe
/// fields read with each type's `FromStr` (`Recipe::output_options`). [`OutputOptions::new`]
/// is the one place both turn into [`OutputOptions`], checking what involves several options.
#[derive(Clone, Debug, Default)]
pub struct OutputChoices {
    /// Output dtype; `Keep` (the default) keeps each tensor's stored dtype. With `to`: the
    /// high-precision dtype of fp8-scaled (`Keep`: f16), and only `Keep` for GGUF.
    pub dtype: OutputDType,
    /// Keep-f32 policy; `None`: the default for the output layout.
    pub keep_f32: Option<KeepF32>,
    /// Output layout; `None` keeps the base's.
    pub layout: Option<Layout>,
    /// Largest output shard in bytes (the front ends take "5GB" or bytes:
    /// `recipe::parse_size`).
    pub shard_bytes: Option<u64>,
    /// A quantized output format, or an Orbax cache.
    pub to: Option<OutputFormat>,
    /// With a GGUF block type: quantize the F16/BF16 rounding, as city96's pipeline does.
    pub city96_rounding: bool,
    /// Write values the output cannot hold instead of refusing them.
    pub nonfinite: NonFinite,
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

impl OutputOptions {
    /// Checks the choices together: a quantized output decides names, files and every
    /// tensor's type, so `keep_f32`, `layout` and `shard_bytes` are refused with it, and
    /// `dtype` must be one fp8-scaled can keep its high-precision tensors in.
    pub fn new(c: OutputChoices) -> Result<OutputOptions, BadOption> {
        if c.to == Some(OutputFormat::Orbax) {
            return orbax_options(c);
        }
        let quantize = quantize_options(&c)?;
        Ok(OutputOptions {
            dtype: match quantize {
                Some(_) => OutputDType::Keep,
                None => c.dtype,
            },
            keep_f32: c.keep_f32,
            layout: c.layout,
            shard_bytes: c.shard_bytes,
            quantize,
            container: Container::Safetensors,
            nonfinite: c.nonfinite,
        })
    }

    /// f32, with the base's own names, layout and shards, not quantized: how the tuned
    /// model a bake check runs on (`bake::reference`) and an extraction subtracts the base
    /// from (`extract --adapter`) are computed. Every tensor is f32, so no keep-f32 policy
    /// applies.
    pub fn f32_reference() -> OutputOptions {
        OutputOptions {
            dtype: OutputDType::F32,
            keep_f32: None,
            layout: None,
            shard_bytes: None,
            quantize: None,
            container: Container::Safetensors,
            nonfinite: NonFinite::Refuse,
        }
    }
}

/// `to = orbax`: MaxDiffusion's tree and dtype rule decide names and the keep-f32 policy,
/// Orbax the files, so `keep_f32`, `shard_size` and `city96_rounding` are refused; `layout`
/// is `nnx-scanned` (the default, `scan_layers: True`) or `nnx`; `dtype` is MaxDiffusion's
/// `weights_dtype` (bf16 by default; `f32` makes every leaf f32).
fn orbax_options(c: OutputChoices) -> Result<OutputOptions, BadOption> {
    let bad = |field: &'static str, message: String| BadOption { field, message };
    for (given, field) in [
        (c.keep_f32.is_some(), "keep_f32"),
        (c.shard_bytes.is_some(), "shard_size"),
        (c.city96_rounding, "city96_rounding"),
    ] {
        if given {
            let m = "orbax writes MaxDiffusion's cache (its tree, its f32 rule, Orbax's files); drop it";
            return Err(bad(field, m.into()));
        }
    }
    let layout = match c.layout {
        None | Some(Layout::NnxScanned) => Layout::NnxScanned,
        Some(Layout::Nnx) => Layout::Nnx,
        Some(other) => {
            let m = format!(
                "`{other}`: orbax writes MaxDiffusion's tree, nnx-scanned (default) or nnx"
            );
            return Err(bad("layout", m));
        }
    };
    let dtype = match c.dtype {
        OutputDType::Keep => OutputDType::BF16,
        d => d,
    };
    Ok(OutputOptions {
        dtype,
        keep_f32: Some(KeepF32::MaxDiffusion),
        layout: Some(layout),
        shard_bytes: None,
        quantize: None,
        container: Container::Orbax,
        nonfinite: c.nonfinite,
    })
}

/// `to` and its companions: the format decides names, files and every tensor's type, so
/// `keep_f32`, `layout` and `shard_size` are refused with it; `dtype` is the
/// high-precision dtype of fp8-scaled (f16 by default; bf16 or f32) and refused for GGUF.
fn quantize_options(c: &OutputChoices) -> Result<Option<QuantOptions>, BadOption> {
    let bad = |field: &'static str, message: String| BadOption { field, message };
    let Some(OutputFormat::Quantized(format)) = c.to else {
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
    // fp8-scaled: the dtype of what is not an nn.Linear weight; a GGUF block format:
    // convert.py's step-1 type (`QuantOptions::high_precision`); a plain GGUF format is its
    // own type.
    let high_precision = match (c.dtype.float(), format.is_plain_gguf()) {
        (Some(_), true) => {
            let m = format!(
                "`{}`: {format} decides every tensor's type; drop it",
                c.dtype
            );
            return Err(bad("dtype", m));
        }
        (d, _) => d,
    };
    Ok(Some(QuantOptions {
        format,
        high_precision,
        city96_rounding: c.city96_rounding,
    }))
}

/// The output side of the plan.
pub struct OutputSide {
    /// The output files.
    pub output: OutputPlan,
    /// One job per output tensor (or layer slice), slots resolved.
    pub jobs: Vec<Job>,
    /// Base keys the layout conversion leaves out on purpose.
    pub dropped: Vec<String>,
    /// The keep-f32 policy applied, in words.
    pub keep_f32: String,
    /// The quantized output's plan, when `options.quantize` asks for one.
    pub quant: Option<QuantPlan>,
    /// The Orbax output's items and chunks, for `Container::Orbax`.
    pub orbax: Option<OrbaxPlan>,
}

/// One component's output before slots are known.
struct ComponentJobs {
    output: ComponentOutput,
    jobs: Vec<Job>,
    dropped: Vec<String>,
}

/// Plans every output component of `base` under `options`.
pub fn plan_output(base: &BaseModel, options: &OutputOptions) -> Result<OutputSide, PipelineError> {
    // A quantized file and an Orbax cache hold transformers only: a pipeline's other
    // components are named as left out (the summary says so), never dropped unsaid.
    let left_out = || base.carried.iter().map(|f| f.rel_path.clone()).collect();
    if let Some(q) = options.quantize {
        let mut side = quantized(base, q)?;
        side.output.left_out = left_out();
        return Ok(side);
    }
    if options.container == Container::Orbax {
        let mut side = orbax_output(base, options)?;
        side.output.left_out = left_out();
        return Ok(side);
    }
    let mut outputs = Vec::new();
    let mut jobs = Vec::new();
    let mut dropped = Vec::new();
    let mut policies = Vec::new();
    for (ci, (comp, model)) in base.parts().enumerate() {
        // The layout the keys alone say, for the keep-f32 rules and names.
        let stored_layout = model.key_layout();
        let policy = match &options.keep_f32 {
            Some(p) => p.clone(),
            None => default_policy(stored_layout, options.layout),
        };
        policies.push(policy.to_string());
        let mut c = match options.layout {
            None => same_layout(ci, comp, stored_layout, options.dtype, &policy),
            Some(to) => converted(ci, (comp, model), to, options.dtype, &policy)?,
        };
        if options.shard_bytes.is_some() {
            c.output.max_shard_bytes = options.shard_bytes;
        }
        outputs.push(c.output);
        jobs.extend(c.jobs);
        dropped.extend(c.dropped);
    }
    let aux = crate::release::writer::root_aux_files(base);
    let mut output = OutputPlan::build(&outputs, &aux)
        .map_err(|e| PipelineError::Plan(format!("the output cannot be laid out: {e}")))?;
    // A pipeline in gives a pipeline out: its other components travel unchanged.
    output.carried = base.carried.clone();
    resolve_slots(&output, &mut jobs)?;
    policies.dedup();
    Ok(OutputSide {
        output,
        jobs,
        dropped,
        keep_f32: policies.join(", "),
        quant: None,
        orbax: None,
    })
}

/// MaxDiffusion's pretrained cache (`pipeline::orbax`): each transformer of `base` in the
/// `nnx` or `nnx-scanned` layout as an item, MaxDiffusion's keep-f32 rule, `wan_config` from
/// the config.json MaxDiffusion saves it from.
fn orbax_output(base: &BaseModel, options: &OutputOptions) -> Result<OutputSide, PipelineError> {
    use crate::model::maxdiffusion;
    let names: Vec<&str> = base.components.iter().map(|c| c.name.as_str()).collect();
    let (Some(items), Some(config_at)) = (
        maxdiffusion::state_items(&names),
        maxdiffusion::config_component(&names),
    ) else {
        return Err(PipelineError::Plan(format!(
            "{}: MaxDiffusion's cache holds one WAN transformer or a Wan 2.2 A14B pipeline's two (transformer/, transformer_2/); this base has {} components",
            base.path.display(),
            names.len()
        )));
    };
    let to = options.layout.unwrap_or(Layout::NnxScanned);
    let policy = KeepF32::MaxDiffusion;
    let mut comps = Vec::new();
    for (ci, part) in base.parts().enumerate() {
        comps.push(converted(ci, part, to, options.dtype, &policy)?);
    }
    let config = &base.components[config_at];
    let Some(json) = config
        .sidecar("config.json")
        .and_then(|s| s.json.as_object())
    else {
        return Err(PipelineError::Plan(format!(
            "{}: MaxDiffusion's cache needs the transformer's config.json (its wan_config)",
            base.path.join(&config.rel_dir).display()
        )));
    };
    let (wan_config, left_out) = maxdiffusion::wan_config(json, to == Layout::NnxScanned);
    let inputs: Vec<ItemInput<'_>> = (comps.iter().zip(items))
        .map(|(c, item)| ItemInput {
            item,
            tensors: &c.output.tensors,
            jobs: &c.jobs,
        })
        .collect();
    let (orbax, aux) = OrbaxPlan::new(&inputs, &wan_config)?;
    let mut output = OutputPlan::build(&[], &aux)
        .map_err(|e| PipelineError::Plan(format!("the output cannot be laid out: {e}")))?;
    output.late_bytes = orbax.array_bytes();
    let mut dropped: Vec<String> = (left_out.iter())
        .map(|k| {
            format!(
                "{}config.json: `{k}`: not an argument of MaxDiffusion's WanModel",
                prefix(config)
            )
        })
        .collect();
    let mut jobs = Vec::new();
    for c in comps {
        jobs.extend(c.jobs);
        dropped.extend(c.dropped);
    }
    Ok(OutputSide {
        output,
        jobs,
        dropped,
        keep_f32: policy.to_string(),
        quant: None,
        orbax: Some(orbax),
    })
}

/// A quantized output: the one transformer of `base` as one quantized file under
/// original-Wan names; every job reads its source tensor whole (no layer slices: the
/// diffusers and original layouts store PyTorch-layout tensors) and carries its encoding.
fn quantized(base: &BaseModel, q: QuantOptions) -> Result<OutputSide, PipelineError> {
    let refused = |source: QuantError| PipelineError::Quantize {
        path: base.path.clone(),
        source: Box::new(source),
    };
    let (comp, model) = encode::single_transformer(base, q.format).map_err(refused)?;
    let layout = model.layout.exact.clone().map_err(|e| refused(e.into()))?;
    let qplan = encode::plan(q, layout, &encode::source_tensors(comp)).map_err(refused)?;
    let output = qplan
        .output_plan(&encode::output_stem(q.format), BTreeMap::new())
        .map_err(|e| PipelineError::Plan(format!("the output cannot be laid out: {e}")))?;
    let jobs = qplan
        .tensors
        .iter()
        .map(|t| {
            let slot = output.slot(0, &t.name).ok_or_else(|| {
                PipelineError::Internal(format!("no output slot for `{}`", t.name))
            })?;
            Ok(Job {
                component: 0,
                output: t.name.clone(),
                slot,
                dst_offset: 0,
                dtype: DType::F32,
                transform: Transform::Identity,
                stored: t.source.clone(),
                layer: None,
                stored_shape: t.shape.clone(),
                target: None,
                encoding: Some(t.encoding),
                constant: None,
            })
        })
        .collect::<Result<Vec<_>, PipelineError>>()?;
    let dropped = qplan
        .skipped
        .iter()
        .map(|n| format!("{n}: no original-Wan name (no Wan forward reads it)"))
        .collect();
    Ok(OutputSide {
        output,
        jobs,
        dropped,
        keep_f32: "none".into(),
        quant: Some(qplan),
        orbax: None,
    })
}

fn default_policy(stored: Option<Layout>, to: Option<Layout>) -> KeepF32 {
    match to.or(stored) {
        Some(l) => KeepF32::default_for(l),
        None => KeepF32::None,
    }
}

/// The canonical (diffusers) name of a stored WAN tensor, for the keep-f32 rules; the name
/// itself for other bases.
fn canonical_name(layout: Option<Layout>, name: &str) -> String {
    use crate::model::wan_names::{Position, parse_stored};
    match layout.and_then(|l| parse_stored(l, name)) {
        Some((e, Position::Block(b))) => e.canonical(Some(b)),
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
fn same_layout(
    ci: usize,
    comp: &Component,
    layout: Option<Layout>,
    dtype: OutputDType,
    policy: &KeepF32,
) -> ComponentJobs {
    use crate::model::wan_names::{Position, parse_stored};
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
            encoding: None,
            constant: None,
        };
        let stacked = layout == Some(Layout::NnxScanned)
            && matches!(
                parse_stored(Layout::NnxScanned, v.name),
                Some((_, Position::Stacked))
            );
        match (stacked, v.shape.split_first()) {
            (true, Some((&layers, slice))) => {
                let bytes = slice.iter().product::<usize>() * out.element_bytes();
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

/// Written in another WAN layout through the read plan and the layout module's write plans.
fn converted(
    ci: usize,
    (comp, model): (&Component, &ComponentModel),
    to: Layout,
    dtype: OutputDType,
    policy: &KeepF32,
) -> Result<ComponentJobs, PipelineError> {
    let layout_err = |source| PipelineError::Layout {
        component: comp.name.clone(),
        source,
    };
    let config = match comp.sidecar("config.json") {
        Some(s) => Some(WanConfig::from_json(&s.text).map_err(|e| {
            PipelineError::Plan(format!(
                "{}: not a WAN transformer config: {e}",
                s.path.display()
            ))
        })?),
        None => None,
    };
    let from = model
        .stored_layout(None, comp.sidecar("config.json").map(|s| &s.json))
        .map_err(layout_err)?;
    let stored: Vec<StoredTensor> = comp
        .tensors
        .tensors()
        .map(|t| StoredTensor::from(&t.view))
        .collect();
    let read = ReadPlan::new(from, &stored, config.as_ref()).map_err(layout_err)?;
    let conv = Conversion::new(read, to, dtype, policy).map_err(layout_err)?;
    let jobs = conversion_jobs(ci, &conv);
    let dropped = conv
        .read
        .skipped
        .iter()
        .map(|s| format!("{}{}: {}", prefix(comp), s.name, s.reason))
        .collect();
    let sidecars = config_sidecar(comp, Some(to));
    let mut output = component_output(comp, conv.planned_tensors(), sidecars);
    output.stem = to.weights_stem(&comp.weights_stem);
    Ok(ComponentJobs {
        output,
        jobs,
        dropped,
    })
}

/// The jobs of a planned layout conversion of component `ci`, slots not yet resolved
/// ([`resolve_slots`]): one per stored tensor or layer, copied or converted.
pub fn conversion_jobs(ci: usize, conv: &Conversion) -> Vec<Job> {
    conv.jobs
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
            encoding: None,
            constant: j.constant,
        })
        .collect()
}

/// Points every job at its output tensor's slot in `output`.
pub fn resolve_slots(output: &OutputPlan, jobs: &mut [Job]) -> Result<(), PipelineError> {
    for j in jobs {
        j.slot = output
            .slot(j.component, &j.output)
            .ok_or_else(|| PipelineError::Internal(format!("no output slot for `{}`", j.output)))?;
    }
    Ok(())
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
