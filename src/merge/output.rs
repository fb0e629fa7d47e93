//! The output side of a merge plan: every output file and tensor, its dtype, and the job
//! that fills it.
//!
//! Owns: `plan_output` (per base component: the same names and layouts as the base, or
//! another WAN layout through the read plan (`model::read_plan`) and the layout module's
//! write plans; the keep-f32 policy and its defaults; config.json with the layout stamped;
//! sharding like the base or as asked), and a quantized output (one fp8-scaled or GGUF file
//! from `quantize`'s plan: one job per tensor carrying its encoding). Does not own: which
//! tensors change (`merge::plan`), the layouts and name tables themselves (`model`), the
//! keep-f32 rules (`layout`), the quantization rules and encodings (`quantize`), laying out
//! files (`io::writer`).

use std::collections::BTreeMap;

use super::error::MergeError;
use super::plan::{Job, MergeOptions};
use crate::io::header_layout::PlannedTensor;
use crate::io::writer::{ComponentOutput, OutputPlan};
use crate::io::{Component, DType, Slot};
use crate::layout::{Conversion, KeepF32, OutputDType};
use crate::model::base_model::{BaseModel, ComponentModel};
use crate::model::read_plan::{ReadPlan, StoredTensor};
use crate::model::transform::Transform;
use crate::model::wan::WanConfig;
use crate::model::wan_layout::Layout;
use crate::model::wan_layout::stamp_config;
use crate::quantize::{self, QuantOptions, QuantPlan};

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
}

/// One component's output before slots are known.
struct ComponentJobs {
    output: ComponentOutput,
    jobs: Vec<Job>,
    dropped: Vec<String>,
}

/// Plans every output component of `base` under `options`.
pub fn plan_output(base: &BaseModel, options: &MergeOptions) -> Result<OutputSide, MergeError> {
    if let Some(q) = options.quantize {
        return quantized(base, q);
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
    let aux = base.root_aux_files();
    let output = OutputPlan::build(&outputs, &aux)
        .map_err(|e| MergeError::Plan(format!("the output cannot be laid out: {e}")))?;
    resolve_slots(&output, &mut jobs)?;
    policies.dedup();
    Ok(OutputSide {
        output,
        jobs,
        dropped,
        keep_f32: policies.join(", "),
        quant: None,
    })
}

/// A quantized output: the one transformer of `base` as one fp8-scaled or GGUF file under
/// original-Wan names; every job reads its source tensor whole (no layer slices: the
/// diffusers and original layouts store PyTorch-layout tensors) and carries its encoding.
fn quantized(base: &BaseModel, q: QuantOptions) -> Result<OutputSide, MergeError> {
    let plan_err = |e: anyhow::Error| MergeError::Plan(format!("{e:#}"));
    let (comp, model) = quantize::single_transformer(base, q.format).map_err(plan_err)?;
    let qplan = model
        .layout
        .exact
        .clone()
        .map_err(anyhow::Error::from)
        .and_then(|layout| quantize::plan(q, layout, &quantize::source_tensors(comp)))
        .map_err(|e| plan_err(e.context(base.path.display().to_string())))?;
    let output = qplan
        .output_plan(&quantize::output_stem(q.format), BTreeMap::new())
        .map_err(|e| MergeError::Plan(format!("the output cannot be laid out: {e:#}")))?;
    let jobs = qplan
        .tensors
        .iter()
        .map(|t| {
            let slot = output
                .slot(0, &t.name)
                .ok_or_else(|| MergeError::Internal(format!("no output slot for `{}`", t.name)))?;
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
            })
        })
        .collect::<Result<Vec<_>, MergeError>>()?;
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

/// Written in another WAN layout through the read plan and the layout module's write plans.
fn converted(
    ci: usize,
    (comp, model): (&Component, &ComponentModel),
    to: Layout,
    dtype: OutputDType,
    policy: &KeepF32,
) -> Result<ComponentJobs, MergeError> {
    let layout_err = |source| MergeError::Layout {
        component: comp.name.clone(),
        source,
    };
    let config = match comp.sidecar("config.json") {
        Some(s) => Some(WanConfig::from_json(&s.text).map_err(|e| {
            MergeError::Plan(format!(
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
    Ok(ComponentJobs {
        output: component_output(comp, conv.planned_tensors(), sidecars),
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
        })
        .collect()
}

/// Points every job at its output tensor's slot in `output`.
pub fn resolve_slots(output: &OutputPlan, jobs: &mut [Job]) -> Result<(), MergeError> {
    for j in jobs {
        j.slot = output
            .slot(j.component, &j.output)
            .ok_or_else(|| MergeError::Internal(format!("no output slot for `{}`", j.output)))?;
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
