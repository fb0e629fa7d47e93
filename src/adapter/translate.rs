//! `translate`: write an adapter in another convention, losslessly or not at all.
//!
//! Owns: the rendered form every convention's renderer produces (`Rendered`: output
//! tensors that copy entry parameters byte for byte in their stored dtype, scalars, header
//! metadata and sidecars), the σ bookkeeping renderers share (`ScaleRule`: which α makes a
//! convention's rule reproduce σ exactly), and `translate`, which opens the adapter,
//! resolves its module names (against `--base`, or the WAN name table), renders, and writes
//! the result through the canonical writer (`release::write_release`) with a manifest.
//! Entries the target cannot express are listed with the reason and nothing is written.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde::Serialize;

use super::bind::{BaseIndex, bound_ids, kind_name, resolve_names};
use super::names::ModuleId;
use super::{AdapterError, AdapterOptions, AdapterSet, Convention, Entry, EntryProblem, ParamRole};
use crate::io::header_layout::PlannedTensor;
use crate::io::staging::{Allocation, Replace};
use crate::io::writer::{ComponentOutput, OutputPlan};
use crate::io::{Checkpoint, DType, ReadError};
use crate::manifest::record_inputs;
use crate::release::{Release, ReleaseError, ReleaseRequest, write_release};

/// Where an output tensor's bytes come from.
#[derive(Clone, Debug, PartialEq)]
pub enum OutData {
    /// An entry parameter, in its stored dtype; `transpose` swaps the two axes of its
    /// PyTorch-layout 2-D form (NNX `(in, r)` / `(r, out)`).
    Param {
        /// Entry index.
        entry: usize,
        /// Which parameter.
        role: ParamRole,
        /// Write the transpose.
        transpose: bool,
    },
    /// A scalar (`.alpha`).
    Scalar {
        /// Its value (exactly representable in the planned dtype).
        value: f64,
    },
}

/// One tensor of the output file.
#[derive(Clone, Debug, PartialEq)]
pub struct OutTensor {
    /// Key.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
    /// Source.
    pub data: OutData,
}

/// What a renderer produced: one weights file and its sidecars.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rendered {
    /// Stem of the weights file (`adapter_model`, `pytorch_lora_weights`, ...).
    pub stem: String,
    /// Its tensors.
    pub tensors: Vec<OutTensor>,
    /// Its `__metadata__`.
    pub metadata: BTreeMap<String, String>,
    /// Files written next to it (name, bytes).
    pub sidecars: Vec<(String, Vec<u8>)>,
    /// Changes of spelling a user should know about.
    pub notes: Vec<String>,
}

/// What a renderer reads.
pub struct RenderCtx<'a> {
    /// The adapter.
    pub set: &'a AdapterSet,
    /// Every entry's module identity.
    pub ids: &'a [ModuleId],
    /// Stem for conventions without a fixed file name.
    pub stem: String,
}

impl RenderCtx<'_> {
    /// A problem for entry `i`.
    pub fn problem(&self, i: usize, reason: impl Into<String>) -> EntryProblem {
        let e = &self.set.entries[i];
        EntryProblem {
            module: e.module.clone(),
            kind: kind_name(e.kind).to_string(),
            keys: e.source_keys.clone(),
            reason: reason.into(),
        }
    }

    /// An output tensor copying parameter `role` of entry `i`, written with `shape`.
    pub fn param(
        &self,
        i: usize,
        role: ParamRole,
        name: String,
        shape: Vec<usize>,
        transpose: bool,
    ) -> Result<OutTensor, EntryProblem> {
        let e = &self.set.entries[i];
        let src = e
            .param(role)
            .ok_or_else(|| self.problem(i, format!("internal: {role:?} missing")))?;
        let dtype = self
            .set
            .files
            .get(src.file)
            .and_then(|f| f.view(&src.key))
            .map(|v| v.dtype)
            .ok_or_else(|| self.problem(i, format!("internal: tensor `{}` missing", src.key)))?;
        let numel: usize = shape.iter().product();
        if numel != src.shape.iter().product::<usize>() {
            return Err(self.problem(
                i,
                format!("internal: cannot write {:?} as {shape:?}", src.shape),
            ));
        }
        Ok(OutTensor {
            name,
            dtype,
            shape,
            data: OutData::Param {
                entry: i,
                role,
                transpose,
            },
        })
    }
}

/// How an entry's σ follows from its numbers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ScaleRule {
    /// σ = α/r with the stored α.
    Linear(f64),
    /// σ = α/√r with the stored α.
    Sqrt(f64),
    /// σ given directly (no α, or an α that explains neither rule).
    Fixed(f64),
}

/// The rule an entry's σ follows, recovered from α, r and σ exactly.
pub fn scale_rule(e: &Entry) -> ScaleRule {
    match (e.alpha, e.rank) {
        (Some(a), Some(r)) if a / r as f64 == e.scale => ScaleRule::Linear(a),
        (Some(a), Some(r)) if a / (r as f64).sqrt() == e.scale => ScaleRule::Sqrt(a),
        _ => ScaleRule::Fixed(e.scale),
    }
}

/// An α with `α / div == σ` exactly in f64 (σ·div, or a neighbour of it).
fn alpha_for(scale: f64, div: f64) -> Option<f64> {
    let guess = scale * div;
    [guess, guess.next_up(), guess.next_down()]
        .into_iter()
        .find(|a| a.is_finite() && a / div == scale)
}

/// α for a convention whose rule is σ = α/r.
pub fn alpha_linear(e: &Entry) -> Option<f64> {
    let r = e.rank? as f64;
    match scale_rule(e) {
        ScaleRule::Linear(a) => Some(a),
        _ => alpha_for(e.scale, r),
    }
}

/// α for a convention whose rule is σ = α/√r.
pub fn alpha_sqrt(e: &Entry) -> Option<f64> {
    let r = e.rank? as f64;
    match scale_rule(e) {
        ScaleRule::Sqrt(a) => Some(a),
        _ => alpha_for(e.scale, r.sqrt()),
    }
}

/// The dtype that stores `v` exactly (F32 when it can, else F64).
pub fn scalar_dtype(v: f64) -> DType {
    if (v as f32) as f64 == v {
        DType::F32
    } else {
        DType::F64
    }
}

/// The conv kernel of an entry's target: from the file's factors, or from the bound base
/// tensor when the file stored them flat.
pub fn kernel_of(e: &Entry) -> Option<Vec<usize>> {
    if let Some(k) = &e.conv_kernel {
        return Some(k.clone());
    }
    e.binding
        .as_ref()
        .filter(|b| b.shape.len() > 2)
        .map(|b| b.shape[2..].to_vec())
}

/// A/B shapes as a PyTorch-style file stores them: conv factors `(r, in, *k)` /
/// `(out, r, 1, …)` when the target is a conv, else the 2-D forms.
pub fn factor_shapes(e: &Entry) -> Option<(Vec<usize>, Vec<usize>)> {
    let a = e.param(ParamRole::A)?.shape.clone();
    let b = e.param(ParamRole::B)?.shape.clone();
    match kernel_of(e) {
        Some(k) => {
            let kprod: usize = k.iter().product();
            if kprod == 0 || a[1] % kprod != 0 {
                return None;
            }
            let mut a_out = vec![a[0], a[1] / kprod];
            a_out.extend(&k);
            let mut b_out = vec![b[0], b[1]];
            b_out.extend(std::iter::repeat_n(1, k.len()));
            Some((a_out, b_out))
        }
        None => Some((a, b)),
    }
}

/// True when the entry's target is a WAN Conv3d whose kernel the adapter does not reveal.
pub fn conv_kernel_unknown(e: &Entry, id: &ModuleId) -> bool {
    kernel_of(e).is_none()
        && matches!(id, ModuleId::Wan { diffusers, .. } if diffusers == "patch_embedding")
        && !matches!(
            e.kind,
            super::Kind::Diff | super::Kind::DiffBias | super::Kind::LoraBias
        )
}

/// A request to translate one adapter.
#[derive(Clone, Debug)]
pub struct TranslateRequest {
    /// The adapter.
    pub adapter: PathBuf,
    /// Target convention.
    pub to: Convention,
    /// How to read the adapter.
    pub opts: AdapterOptions,
    /// Resolve names (and check shapes) against this base.
    pub base: Option<PathBuf>,
    /// Output directory.
    pub out: PathBuf,
    /// Replace an existing output.
    pub replace: Replace,
}

/// Why a translation failed; nothing is written in any case.
#[derive(Debug, thiserror::Error)]
pub enum TranslateError {
    /// Reading, binding or rendering the adapter.
    #[error(transparent)]
    Adapter(#[from] AdapterError),
    /// Reading the base.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// Writing the output.
    #[error(transparent)]
    Release(#[from] ReleaseError),
}

/// What was written.
#[derive(Debug, Serialize)]
pub struct TranslateOutcome {
    /// The output directory.
    pub dir: PathBuf,
    /// Source convention.
    pub from: Convention,
    /// Target convention.
    pub to: Convention,
    /// Entries written.
    pub entries: usize,
    /// Tensors written.
    pub tensors: usize,
    /// Notes (spelling changes).
    pub notes: Vec<String>,
}

/// Renders `set` in convention `to`. LyCORIS modules only go to kohya (`lora_unet_…`, the
/// same tensors); every other target is refused for them before its renderer runs, each
/// module listed with the reason (`adapter::lycoris::refusal`).
pub fn render(ctx: &RenderCtx<'_>, to: Convention) -> Result<Rendered, Vec<EntryProblem>> {
    let lycoris: Vec<EntryProblem> = ctx
        .set
        .entries
        .iter()
        .enumerate()
        .filter_map(|(i, e)| super::lycoris::refusal(e, to).map(|r| ctx.problem(i, r)))
        .collect();
    if !lycoris.is_empty() {
        return Err(lycoris);
    }
    match to {
        Convention::Peft => super::peft::render(ctx),
        Convention::Diffusers => super::diffusers::render(ctx),
        Convention::Comfy => super::comfy::render(ctx),
        Convention::Kohya => super::kohya::render(ctx),
        Convention::Sa3 => super::sa3::render(ctx),
        Convention::Nnx => super::nnx::render(ctx),
    }
}

/// Module ids of every entry: bound against the base, or from the name tables (also used by
/// `extract::resize`).
pub fn module_ids(
    set: &mut AdapterSet,
    base: Option<&Path>,
) -> Result<Vec<ModuleId>, TranslateError> {
    let Some(base) = base else {
        return Ok(resolve_names(set)?);
    };
    let ckpt = Checkpoint::open(base)?;
    let comp = ckpt.single()?;
    let ix = BaseIndex::new(base, &comp.tensors);
    let report = set.bind(&ix)?;
    let ids = bound_ids(set, &report);
    let mut out = Vec::new();
    let mut missing = Vec::new();
    for (e, id) in set.entries.iter().zip(ids) {
        match id {
            Some(id) => out.push(id),
            None => missing.push(EntryProblem {
                module: e.module.clone(),
                kind: kind_name(e.kind).into(),
                keys: e.source_keys.clone(),
                reason: "binds to nothing in the base".into(),
            }),
        }
    }
    if !missing.is_empty() {
        return Err(AdapterError::Names {
            path: set.path.clone(),
            entries: missing,
        }
        .into());
    }
    Ok(out)
}

/// Translates an adapter; on any error nothing is written.
pub fn translate(req: &TranslateRequest) -> Result<TranslateOutcome, TranslateError> {
    let mut set = AdapterSet::open(&req.adapter, &req.opts)?;
    let ids = module_ids(&mut set, req.base.as_deref())?;
    let stem = set
        .files
        .first()
        .and_then(|f| f.path().file_stem())
        .and_then(|s| s.to_str())
        .unwrap_or("adapter")
        .to_string();
    let ctx = RenderCtx {
        set: &set,
        ids: &ids,
        stem,
    };
    let rendered = render(&ctx, req.to).map_err(|entries| AdapterError::Inexpressible {
        path: set.path.clone(),
        to: req.to,
        entries,
    })?;
    let release = write(&set, &rendered, req)?;
    Ok(TranslateOutcome {
        dir: release.dir,
        from: set.convention,
        to: req.to,
        entries: set.entries.len(),
        tensors: rendered.tensors.len(),
        notes: rendered.notes,
    })
}

fn write(
    set: &AdapterSet,
    r: &Rendered,
    req: &TranslateRequest,
) -> Result<Release, TranslateError> {
    let component = ComponentOutput {
        rel_dir: PathBuf::new(),
        stem: r.stem.clone(),
        tensors: r
            .tensors
            .iter()
            .map(|t| PlannedTensor {
                name: t.name.clone(),
                dtype: t.dtype,
                shape: t.shape.clone(),
            })
            .collect(),
        metadata: r.metadata.clone(),
        sidecars: r.sidecars.clone(),
        max_shard_bytes: None,
    };
    let plan = OutputPlan::build(&[component], &[])
        .map_err(|e| ReleaseError::Produce(anyhow::anyhow!(e)))?;
    let files: Vec<(String, PathBuf, String)> = set
        .input_files()
        .into_iter()
        .map(|p| ("adapter".to_string(), p.clone(), p.display().to_string()))
        .collect();
    let inputs = record_inputs(&files)?;
    let mut input_paths = set.input_files();
    input_paths.push(set.path.clone());
    input_paths.extend(req.base.iter().cloned());
    let options = serde_json::json!({
        "from": set.convention.as_str(),
        "to": req.to.as_str(),
        "base": req.base.as_ref().map(|b| b.display().to_string()),
        "scale": req.opts.scale,
    });
    let report = serde_json::json!({
        "entries": set.entries.len(),
        "tensors": r.tensors.len(),
        "notes": r.notes,
    });
    let release = write_release(
        ReleaseRequest {
            dest: &req.out,
            plan,
            input_paths: &input_paths,
            inputs,
            hash_while_writing: Vec::new(),
            command: "translate",
            options,
            replace: req.replace,
            allocation: Allocation::Reserve,
        },
        |staging| {
            r.tensors
                .par_iter()
                .try_for_each(|t| -> anyhow::Result<()> {
                    let slot = staging
                        .plan()
                        .slot(0, &t.name)
                        .ok_or_else(|| anyhow::anyhow!("internal: no slot for `{}`", t.name))?;
                    let bytes = tensor_bytes(set, t)?;
                    staging.write(slot, 0, &bytes)?;
                    Ok(())
                })?;
            Ok(report)
        },
    )?;
    Ok(release)
}

/// The bytes of one output tensor.
pub fn tensor_bytes(set: &AdapterSet, t: &OutTensor) -> anyhow::Result<Vec<u8>> {
    match &t.data {
        OutData::Scalar { value } => Ok(match t.dtype {
            DType::F64 => value.to_le_bytes().to_vec(),
            DType::I64 => (*value as i64).to_le_bytes().to_vec(),
            _ => (*value as f32).to_le_bytes().to_vec(),
        }),
        OutData::Param {
            entry,
            role,
            transpose,
        } => {
            let e = set
                .entries
                .get(*entry)
                .ok_or_else(|| anyhow::anyhow!("internal: entry {entry}"))?;
            let src = e
                .param(*role)
                .ok_or_else(|| anyhow::anyhow!("internal: {role:?} of `{}`", e.module))?;
            let (dtype, bytes) = set.load_raw(src)?;
            if dtype != t.dtype {
                anyhow::bail!("internal: `{}` is {dtype}, planned {}", src.key, t.dtype);
            }
            if !*transpose {
                return Ok(bytes);
            }
            let [rows, cols] = src.shape[..] else {
                anyhow::bail!("internal: cannot transpose {:?}", src.shape);
            };
            let size = dtype.size().unwrap_or(1);
            Ok(super::transpose_bytes(&bytes, rows, cols, size))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapter::{Kind, ScaleSource};

    fn entry(rank: usize, alpha: Option<f64>, scale: f64) -> Entry {
        let mut e = Entry::new("m", Kind::Lora);
        e.rank = Some(rank);
        e.alpha = alpha;
        e.scale = scale;
        e.scale_source = ScaleSource::FileAlpha;
        e
    }

    #[test]
    fn scale_rules_are_recovered_exactly() {
        assert_eq!(
            scale_rule(&entry(4, Some(8.0), 2.0)),
            ScaleRule::Linear(8.0)
        );
        let s = 6.0 / 8f64.sqrt();
        assert_eq!(scale_rule(&entry(8, Some(6.0), s)), ScaleRule::Sqrt(6.0));
        // rsLoRA σ written for an α/r convention: the α found reproduces σ bit for bit.
        let a = alpha_linear(&entry(8, Some(6.0), s)).unwrap();
        assert_eq!(a / 8.0, s);
        assert_eq!(scalar_dtype(a), DType::F64);
        assert_eq!(scalar_dtype(12.0), DType::F32);
        let back = alpha_sqrt(&entry(4, Some(8.0), 2.0)).unwrap();
        assert_eq!(back / 2.0, 2.0);
    }
}
