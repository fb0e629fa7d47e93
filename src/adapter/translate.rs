//! Rendering an adapter in another convention, losslessly or not at all.
//!
//! Owns: the rendered form every convention's renderer produces (`Rendered`: output
//! tensors that copy entry parameters byte for byte in their stored dtype, scalars, header
//! metadata and sidecars), the σ bookkeeping renderers share (`ScaleRule`: which α makes a
//! convention's rule reproduce σ exactly), [`render`] (entries the target cannot express
//! are listed with the reason), [`module_ids`] (names resolved against a base or the WAN
//! name table) and [`tensor_bytes`]. Does not own: writing the result as a release (the
//! `translation` module, above `adapter`).

use std::collections::BTreeMap;
use std::path::Path;

use super::bind::{BaseIndex, bound_ids, resolve_names};
use super::names::ModuleId;
use super::{AdapterError, AdapterSet, Convention, Entry, EntryProblem, ParamRole};
use crate::io::{DType, ReadError};

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
            kind: e.kind.as_str().to_string(),
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
/// The α closest to `scale · div` that gives `α / div == scale` exactly.
pub fn alpha_for(scale: f64, div: f64) -> Option<f64> {
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

/// Renders `set` in convention `to`. LyCORIS modules only go to kohya (`lora_unet_…`) and
/// LyCORIS's own naming (`lycoris_…`), the same tensors; every other target is refused for them before its renderer runs, each
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
        Convention::Peft
            if ctx
                .set
                .entries
                .iter()
                .any(|e| matches!(e.kind, super::Kind::Loha | super::Kind::Lokr)) =>
        {
            super::peft_lycoris::render(ctx)
        }
        Convention::Peft => super::peft::render(ctx),
        Convention::Diffusers => super::diffusers::render(ctx),
        Convention::Comfy => super::comfy::render(ctx),
        Convention::Kohya | Convention::Lycoris => super::kohya::render(ctx, to),
        Convention::Sa3 => super::sa3::render(ctx),
        Convention::Nnx => super::nnx::render(ctx),
    }
}

/// Renders `set` (module ids `ids`) in convention `to` as one file named after the set's
/// first file; entries the target cannot express are one `AdapterError::Inexpressible`
/// listing each with the reason.
pub fn render_set(
    set: &AdapterSet,
    ids: &[ModuleId],
    to: Convention,
) -> Result<Rendered, AdapterError> {
    let stem = set
        .files
        .first()
        .and_then(|f| f.path().file_stem())
        .and_then(|s| s.to_str())
        .unwrap_or("adapter")
        .to_string();
    let ctx = RenderCtx { set, ids, stem };
    render(&ctx, to).map_err(|entries| AdapterError::Inexpressible {
        path: set.path.clone(),
        to,
        entries,
    })
}

/// Module ids of every entry: bound against the base, or from the name tables (also used by
/// `extract::resize`).
pub fn module_ids(
    set: &mut AdapterSet,
    base: Option<&Path>,
) -> Result<Vec<ModuleId>, AdapterError> {
    let Some(base) = base else {
        return resolve_names(set);
    };
    let ckpt = crate::quant::base::open(base)?;
    let (comp, model) = ckpt.single_part()?;
    let ix = BaseIndex::new(base, &comp.tensors, model);
    // A translated or resized adapter must hold every entry: unmatched ones are refused.
    let report = set.bind(&ix, false)?;
    let ids = bound_ids(set, &report);
    let mut out = Vec::new();
    let mut missing = Vec::new();
    for (e, id) in set.entries.iter().zip(ids) {
        match id {
            Some(id) => out.push(id),
            None => missing.push(EntryProblem {
                module: e.module.clone(),
                kind: e.kind.as_str().into(),
                keys: e.source_keys.clone(),
                reason: "binds to nothing in the base".into(),
            }),
        }
    }
    if !missing.is_empty() {
        return Err(AdapterError::Names {
            path: set.path.clone(),
            entries: missing,
        });
    }
    Ok(out)
}

/// The bytes of one output tensor.
pub fn tensor_bytes(set: &AdapterSet, t: &OutTensor) -> Result<Vec<u8>, ReadError> {
    let internal = |tensor: &str, reason: String| ReadError::Tensor {
        path: set.path.clone(),
        tensor: tensor.to_string(),
        reason: format!("internal: {reason}"),
    };
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
            let e = (set.entries.get(*entry))
                .ok_or_else(|| internal(&t.name, format!("no entry {entry}")))?;
            let src = e
                .param(*role)
                .ok_or_else(|| internal(&t.name, format!("{role:?} of `{}`", e.module)))?;
            let (dtype, bytes) = set.load_raw(src)?;
            if dtype != t.dtype {
                return Err(internal(&src.key, format!("{dtype}, planned {}", t.dtype)));
            }
            if !*transpose {
                return Ok(bytes);
            }
            let [rows, cols] = src.shape[..] else {
                return Err(internal(
                    &src.key,
                    format!("cannot transpose {:?}", src.shape),
                ));
            };
            let size = dtype.element_bytes();
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
