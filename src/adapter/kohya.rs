//! kohya / musubi-tuner LoRA files: `lora_unet_<original name with . → _>` with
//! `.lora_down.weight`, `.lora_up.weight`, `.alpha` (α = r when absent), including the
//! Wan/VideoX-Fun `lora_unet__…` spelling and LyCORIS's `lycoris_…` prefix (spec
//! conventions.md §6, §7.1).
//!
//! Owns: reading them (the suffix grammar is ComfyUI's, LyCORIS modules (`hada_*`,
//! `lokr_*`, `oft_blocks`, GLoRA, (IA)³) are taken out first by `lycoris::with_modules`;
//! module names are only ever looked up in the base's alias table, never split back into
//! dots) and writing them (LoRA and alpha, which musubi's and diffusers' kohya loaders
//! accept, and LyCORIS modules with their own tensors, as LyCORIS's kohya wrapper writes).

use std::collections::BTreeMap;

use super::comfy::{alpha_rule, render_lora_alpha};
use super::grammar::{self, COMFY};
use super::kinds::Kind;
use super::lycoris::{ScalePolicy, render_module, with_modules};
use super::names::{KOHYA_PREFIX, LYCORIS_PREFIX};
use super::translate::{RenderCtx, Rendered};
use super::{AdapterError, Convention, EntryProblem, ParseInput, Parsed};

/// Reads a kohya-family file.
pub fn parse(input: &ParseInput<'_>) -> Result<Parsed, AdapterError> {
    let mut parsed = with_modules(input, &ScalePolicy::Lycoris, |keys| {
        let (groups, problems) = grammar::group(keys, &COMFY, |m| {
            (!(m.starts_with(KOHYA_PREFIX) || m.starts_with(LYCORIS_PREFIX))).then(|| {
                format!("kohya keys start with `{KOHYA_PREFIX}`, LyCORIS's with `{LYCORIS_PREFIX}`")
            })
        });
        grammar::build(input, groups, problems, &alpha_rule)
    });
    if input
        .keys
        .iter()
        .any(|k| k.name.starts_with(LYCORIS_PREFIX))
    {
        parsed.notes.push(
            "LyCORIS's own naming (`lycoris_<module>`, the trainer's module names with . → _)"
                .into(),
        );
    }
    Ok(parsed)
}

/// Renders a musubi-style file (`Convention::Kohya`: `lora_unet_<original-Wan module>`)
/// or one in LyCORIS's own naming (`Convention::Lycoris`: `lycoris_<diffusers module>`),
/// which also holds full differences (`.diff`, `.diff_b`, as LyCORIS's full module saves
/// them).
pub fn render(ctx: &RenderCtx<'_>, naming: Convention) -> Result<Rendered, Vec<EntryProblem>> {
    let mut tensors = Vec::new();
    let mut problems = Vec::new();
    for (i, e) in ctx.set.entries.iter().enumerate() {
        let name = ctx.ids[i].spell(naming);
        let r = match e.kind {
            Kind::Lora => render_lora_alpha(ctx, i, &name, &mut tensors),
            k if k.is_lycoris() => render_module(ctx, i, &name, &mut tensors),
            Kind::Diff | Kind::DiffBias if naming == Convention::Lycoris => {
                render_diff(ctx, i, &name, &mut tensors)
            }
            _ if naming == Convention::Lycoris => Err(ctx.problem(
                i,
                "LyCORIS files hold LyCORIS modules, LoRA factors and full differences only",
            )),
            _ => Err(ctx.problem(
                i,
                "kohya/musubi files hold lora_down/lora_up/alpha only (musubi's and diffusers' loaders reject anything else)",
            )),
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
        notes: Vec::new(),
    })
}

/// A full difference as LyCORIS's full module saves it: `<name>.diff` for the weight,
/// `<name>.diff_b` for the bias (unscaled).
fn render_diff(
    ctx: &RenderCtx<'_>,
    i: usize,
    name: &str,
    tensors: &mut Vec<super::translate::OutTensor>,
) -> Result<(), EntryProblem> {
    let e = &ctx.set.entries[i];
    let (role, suffix) = match e.kind {
        Kind::DiffBias => (super::ParamRole::DiffBias, "diff_b"),
        _ => (super::ParamRole::Diff, "diff"),
    };
    let shape = e.param(role).map(|p| p.shape.clone()).unwrap_or_default();
    tensors.push(ctx.param(i, role, format!("{name}.{suffix}"), shape, false)?);
    Ok(())
}
