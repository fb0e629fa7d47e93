//! ComfyUI / original-Wan LoRA files: `diffusion_model.<original name>` (or
//! `model.diffusion_model.`, or no prefix as DiffSynth writes) with every suffix ComfyUI's
//! `load_lora` accepts (`lora_down`/`lora_up`, `lora_A`/`lora_B`, `.default.` infix, ...),
//! `.alpha`, and the full deltas `.diff`, `.diff_b`, lightx2v's `.diff_m` (the block's
//! modulation) and LyCORIS norm `w_norm`/`b_norm` (spec conventions.md §5, §6).
//!
//! Owns: reading (LyCORIS modules in ComfyUI names, as its `load_lora` accepts them, through
//! `lycoris::with_modules`; σ = α/r with the file's `.alpha`, σ = 1 without one, as ComfyUI and
//! musubi do) and writing (`lora_down`/`lora_up`/`.alpha`/`.diff`/`.diff_b`), plus the
//! LoRA-with-alpha writer kohya shares.

use std::collections::{BTreeMap, BTreeSet};

use super::grammar::{self, COMFY, ScaleInfo};
use super::kinds::{Kind, ScaleSource};
use super::lycoris::{ScalePolicy, with_modules};
use super::translate::{
    OutData, OutTensor, RenderCtx, Rendered, ScaleRule, alpha_linear, factor_shapes, scalar_dtype,
    scale_rule,
};
use super::{AdapterError, Convention, EntryProblem, ParamRole, ParseInput, Parsed};

/// σ = α/r when the module has an `.alpha`, else σ = 1 (ComfyUI: multiplier 1 without
/// alpha; kohya/musubi: α defaults to r).
pub fn alpha_rule(_module: &str, rank: usize, alpha: Option<f64>) -> Result<ScaleInfo, String> {
    Ok(match alpha {
        Some(a) => ScaleInfo {
            scale: a / rank as f64,
            alpha: Some(a),
            source: ScaleSource::FileAlpha,
        },
        None => ScaleInfo {
            scale: 1.0,
            alpha: None,
            source: ScaleSource::DefaultAlphaIsRank,
        },
    })
}

/// Reads a ComfyUI / original-Wan file.
pub fn parse(input: &ParseInput<'_>) -> Result<Parsed, AdapterError> {
    Ok(with_modules(input, &ScalePolicy::Lycoris, |keys| {
        let (groups, problems) = grammar::group(keys, &COMFY, |_| None);
        grammar::build(input, groups, problems, &alpha_rule)
    }))
}

/// Writes entry `i` (a plain LoRA) as `<name>.lora_down.weight`, `<name>.lora_up.weight`
/// and, when σ ≠ 1 or the entry carried one, `<name>.alpha` with σ = α/r exactly.
pub fn render_lora_alpha(
    ctx: &RenderCtx<'_>,
    i: usize,
    name: &str,
    tensors: &mut Vec<OutTensor>,
) -> Result<(), EntryProblem> {
    let e = &ctx.set.entries[i];
    let (a_shape, b_shape) = factor_shapes(e)
        .ok_or_else(|| ctx.problem(i, "factor shapes do not fit the conv kernel"))?;
    tensors.push(ctx.param(
        i,
        ParamRole::A,
        format!("{name}.lora_down.weight"),
        a_shape,
        false,
    )?);
    tensors.push(ctx.param(
        i,
        ParamRole::B,
        format!("{name}.lora_up.weight"),
        b_shape,
        false,
    )?);
    let alpha = match scale_rule(e) {
        ScaleRule::Fixed(s) if s == 1.0 && e.alpha.is_none() => None,
        _ => Some(alpha_linear(e).ok_or_else(|| {
            ctx.problem(
                i,
                format!("no .alpha reproduces σ = {} exactly as α/r", e.scale),
            )
        })?),
    };
    if let Some(a) = alpha {
        tensors.push(OutTensor {
            name: format!("{name}.alpha"),
            dtype: scalar_dtype(a),
            shape: Vec::new(),
            data: OutData::Scalar { value: a },
        });
    }
    Ok(())
}

/// Renders a ComfyUI-format file.
pub fn render(ctx: &RenderCtx<'_>) -> Result<Rendered, Vec<EntryProblem>> {
    let mut tensors = Vec::new();
    let mut problems = Vec::new();
    let mut notes = BTreeSet::new();
    let mut bias_names: BTreeMap<String, usize> = BTreeMap::new();
    for (i, e) in ctx.set.entries.iter().enumerate() {
        let name = ctx.ids[i].spell(Convention::Comfy);
        let r = match e.kind {
            Kind::Lora => render_lora_alpha(ctx, i, &name, &mut tensors),
            Kind::Diff => ctx
                .param(i, ParamRole::Diff, format!("{name}.diff"), shape(e, ParamRole::Diff), false)
                .map(|t| tensors.push(t)),
            Kind::DiffBias | Kind::LoraBias => {
                let role = if e.kind == Kind::DiffBias { ParamRole::DiffBias } else { ParamRole::LoraBias };
                if e.kind == Kind::LoraBias && e.scale != 1.0 {
                    Err(ctx.problem(i, format!("lora_B.bias is scaled by σ = {}; ComfyUI's diff_b is unscaled", e.scale)))
                } else if let Some(prev) = bias_names.insert(name.clone(), i) {
                    Err(ctx.problem(i, format!("the module already has a bias delta from `{}`", ctx.set.entries[prev].source_keys.join(", "))))
                } else {
                    if e.kind == Kind::LoraBias {
                        notes.insert("lora_B.bias of σ = 1 modules written as diff_b".to_string());
                    }
                    ctx.param(i, role, format!("{name}.diff_b"), shape(e, role), false)
                        .map(|t| tensors.push(t))
                }
            }
            Kind::PeftDora | Kind::DoraRows | Kind::DoraCols | Kind::Bora => Err(ctx.problem(
                i,
                "ComfyUI's dora_scale uses a different DoRA formula (norm of the base weight, strength interpolation); no exact spelling",
            )),
            _ => Err(ctx.problem(i, "SA3 -xs types have no ComfyUI spelling")),
        };
        if let Err(p) = r {
            problems.push(p);
        }
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(Rendered {
        stem: ctx.stem.clone(),
        tensors,
        metadata: BTreeMap::new(),
        sidecars: Vec::new(),
        notes: notes.into_iter().collect(),
    })
}

fn shape(e: &super::Entry, role: ParamRole) -> Vec<usize> {
    e.param(role).map(|s| s.shape.clone()).unwrap_or_default()
}
